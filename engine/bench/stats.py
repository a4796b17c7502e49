"""Timing statistics: robust summaries, a bootstrap CI for the speedup, the adaptive stopping rule.

Everything works on per-call times in microseconds. Medians, not means: GPU timings have a long right
tail (preemption, clock changes, a stray host interrupt), and the median is the typical call, so slow
outliers need no removal. Nothing here drops samples: throttled samples are only *marked*; the caller
decides and reports what it excluded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

_Z95 = 1.959963984540054  # standard normal 97.5% quantile


@dataclass(frozen=True)
class TimingStats:
    """Summary of one series of timings (microseconds)."""

    n: int
    median: float
    iqr: float
    q1: float
    q3: float
    min: float
    max: float
    mean: float
    rel_err_median: float  # estimated standard error of the median / median (inf when n < 3)


@dataclass(frozen=True)
class SpeedupEstimate:
    """median(eager) / median(candidate) and its bootstrap confidence interval."""

    speedup: float
    low: float
    high: float


def _as_array(samples: Sequence[float], what: str = "samples") -> np.ndarray:
    x = np.asarray(samples, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError(f"no {what}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{what} contain NaN or inf")
    return x


def median_rel_err(samples_us: Sequence[float]) -> float:
    """Relative standard error of the median from order statistics (distribution-free).

    The order statistics at ranks n/2 -+ 1.96*sqrt(n)/2 bound a 95% confidence interval for the median
    (binomial argument); half its width over 1.96 estimates the standard error. On skewed timing data
    it agrees with a bootstrap estimate and is steadier, at the cost of one sort, so it is cheap enough
    to re-evaluate after every sample.
    """
    x = _as_array(samples_us)
    n = x.size
    if n < 3:
        return math.inf
    med = float(np.median(x))
    if med <= 0:
        return math.inf
    p = 0.5 * _Z95 / math.sqrt(n)
    lo, hi = np.quantile(x, [max(0.0, 0.5 - p), min(1.0, 0.5 + p)])
    return float(hi - lo) / (2 * _Z95) / med


def summarize(samples_us: Sequence[float]) -> TimingStats:
    """Median, quartiles (linear interpolation), extremes, mean and the median's relative error."""
    x = _as_array(samples_us)
    q1, med, q3 = (float(v) for v in np.quantile(x, [0.25, 0.5, 0.75]))
    return TimingStats(n=int(x.size), median=med, iqr=q3 - q1, q1=q1, q3=q3, min=float(x.min()),
                       max=float(x.max()), mean=float(x.mean()), rel_err_median=median_rel_err(x))


def _median_ranks(n: int) -> tuple[int, int]:
    """1-based ranks of the two middle order statistics (equal when n is odd)."""
    return (n + 1) // 2, n // 2 + 1


def _boot_medians_weighted(x: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Median of each bootstrap resample given as a row of multiplicities `counts` (n_boot, n).

    The resample's k-th smallest value is sorted(x)[j] for the first j where the counts, cumulated in
    sorted order, reach k. The middle ranks almost surely lie within a few sqrt(n) of n/2, so only that
    window is cumulated (the mass below it is one matrix-vector product); rows whose median falls
    outside the window are redone over the full range, so the result is exact.
    """
    n = x.size
    order = np.argsort(x, kind="stable")
    xs = x[order]
    k1, k2 = _median_ranks(n)
    half = int(math.ceil(3.5 * math.sqrt(n))) + 2  # P(outside) ~ 1e-12 per row
    lo_w, hi_w = max(0, k1 - 1 - half), min(n, k2 + half)
    below_mask = np.zeros(n, dtype=counts.dtype)
    below_mask[order[:lo_w]] = 1
    below = counts @ below_mask
    cum = below[:, None] + np.cumsum(counts[:, order[lo_w:hi_w]], axis=1)
    j1 = lo_w + (cum < k1).sum(axis=1)
    j2 = lo_w + (cum < k2).sum(axis=1)
    miss = (below >= k1) | (cum[:, -1] < k2)
    if miss.any():  # practically never; exact fallback over all positions
        full = np.cumsum(counts[miss][:, order], axis=1)
        j1[miss] = (full < k1).sum(axis=1)
        j2[miss] = (full < k2).sum(axis=1)
    return 0.5 * (xs[j1] + xs[j2])


def _boot_medians_independent(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Medians of `n_boot` independent resamples of x, drawn in O(n_boot) from order statistics.

    A resample is n uniform draws of sorted positions; its k-th smallest position is
    floor(n * U_(k)) with U_(k) ~ Beta(k, n - k + 1), and the next order statistic is
    U_(k) + (1 - U_(k)) * Beta(1, n - k). Same distribution as resampling, without the n x n_boot work.
    """
    n = x.size
    xs = np.sort(x)
    k1, k2 = _median_ranks(n)
    u1 = rng.beta(k1, n - k1 + 1, size=n_boot)
    u2 = u1 if k2 == k1 else u1 + (1.0 - u1) * rng.beta(1, n - k1, size=n_boot)
    j1 = np.minimum((u1 * n).astype(np.int64), n - 1)
    j2 = np.minimum((u2 * n).astype(np.int64), n - 1)
    return 0.5 * (xs[j1] + xs[j2])


def balanced_orders(n: int) -> list[list[int]]:
    """Orders for timing `n` arms in turn (a Williams design): over all of them, each arm comes right after
    every other arm equally often (once for even n, twice for odd n), so what one arm leaves behind (a cast
    installed and removed, a cache warmed) weighs on every other arm alike. Rotating one order by one each
    round does not: every arm keeps its predecessor, and on the H200 one arm timed against itself so read
    1.017x (1.012-1.019)."""
    if n < 1:
        raise ValueError(f"balanced_orders: n must be at least 1, got {n}")
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(a + r) % n for a in first] for r in range(n)]
    return rows + [row[::-1] for row in rows] if n % 2 and n > 1 else rows


def speedup_ci(eager_us: Sequence[float], cand_us: Sequence[float], *, paired: bool = True,
               confidence: float = 0.95, n_boot: int = 2000, seed: int = 0) -> SpeedupEstimate:
    """Speedup median(eager)/median(candidate) with a percentile-bootstrap confidence interval.

    Paired (the default) resamples *pair indices*: the timings are collected A/B-alternated call by
    call, so eager sample i and candidate sample i share whatever the GPU was doing at that moment
    (clock drift, thermal state, a neighbour's traffic). That shared component cancels in the ratio;
    resampling pairs keeps the two samples of a pair together, so the bootstrap sees the ratio's real
    variability. Resampling each arm independently treats the shared drift as independent noise in
    both arms and gives an interval that is too wide (never too narrow) for alternated data; use
    paired=False only for series that were not collected interleaved (it allows unequal lengths).
    Deterministic for a given seed.
    """
    a = _as_array(eager_us, "eager samples")
    b = _as_array(cand_us, "candidate samples")
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    if np.any(a <= 0) or np.any(b <= 0):
        raise ValueError("timings must be positive")
    point = float(np.median(a) / np.median(b))
    rng = np.random.default_rng(seed)
    if paired:
        if a.size != b.size:
            raise ValueError(f"paired bootstrap needs equal lengths, got {a.size} and {b.size}")
        n = a.size
        # Multiplicity of each pair in each resample: n_boot rows of n uniform draws, counted.
        idx = rng.integers(0, n, size=(n_boot, n))
        idx += (np.arange(n_boot) * n)[:, None]
        counts = np.bincount(idx.ravel(), minlength=n_boot * n).reshape(n_boot, n).astype(np.float32)
        ratios = _boot_medians_weighted(a, counts) / _boot_medians_weighted(b, counts)
    else:
        ratios = _boot_medians_independent(a, n_boot, rng) / _boot_medians_independent(b, n_boot, rng)
    alpha = (1.0 - confidence) / 2
    low, high = np.quantile(ratios, [alpha, 1.0 - alpha])
    return SpeedupEstimate(speedup=point, low=float(low), high=float(high))


# Two-sided 95 % quantiles of Student's t by degrees of freedom (beyond 30: the normal's 1.96 is within 2 %).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def pooled_speedup(estimates: Sequence[SpeedupEstimate]) -> SpeedupEstimate:
    """One speedup from the estimates of K independent processes (each its own compile of both arms, its
    own memory layout and clocks): their geometric mean, with a 95 % t-interval (K - 1 degrees of freedom)
    over the K log speedups. Its standard error is the larger of the spread between the processes and their
    own CIs' (a log-normal reading of each 95 % CI), so K processes that agree closely by chance still carry
    their timing noise.

    A single process's CI says how well that process's two compiled models were told apart; whether a cast
    makes *compiled* code slower needs the spread between compiles too, which only other processes show
    (two compiles in one process share Triton's tuning of the same generated source; on the H200 the same
    arm moved ±5 % between processes, 2026-12-04b, and Whisper's reduce-overhead pair read 0.963x in one
    process and 1.002x in the next, 2026-12-04c)."""
    if not estimates:
        raise ValueError("pooled_speedup needs at least one estimate")
    if len(estimates) == 1:
        return estimates[0]
    for e in estimates:
        if not 0 < e.low <= e.speedup <= e.high:
            raise ValueError(f"not an estimate with its CI around it: {e}")
    logs = np.log([e.speedup for e in estimates])
    k = len(estimates)
    within = np.array([(math.log(e.high) - math.log(e.low)) / (2 * 1.96) for e in estimates])
    se = max(float(np.std(logs, ddof=1)) / math.sqrt(k), math.sqrt(float(np.mean(within ** 2)) / k))
    t = _T975[k - 2] if k - 1 <= len(_T975) else 1.96
    mid = float(np.mean(logs))
    return SpeedupEstimate(speedup=math.exp(mid), low=math.exp(mid - t * se), high=math.exp(mid + t * se))


def should_stop(samples_us: Sequence[float], *, target_rel_err: float = 0.01, min_samples: int = 10,
                max_samples: int = 10_000, max_seconds: float = 30.0, elapsed_s: float = 0.0) -> bool:
    """True when enough repetitions were timed.

    Stop at `max_samples` or once `elapsed_s` reaches `max_seconds` (budget caps, whatever the noise);
    never before `min_samples`; otherwise stop as soon as the median's relative standard error is at
    most `target_rel_err`. For an A/B series call it on both arms and stop when both say so.
    """
    n = len(samples_us)
    if n >= max_samples or elapsed_s >= max_seconds:
        return True
    if n < max(min_samples, 3):
        return False
    return median_rel_err(samples_us) <= target_rel_err


def flag_throttled(samples: Sequence[float], clocks_mhz: Sequence[float], max_clock_mhz: float, *,
                   tolerance: float = 0.95) -> np.ndarray:
    """Boolean mask: True where the SM clock read with that sample was below tolerance * max clock.

    A clock reading that is missing (NaN) is flagged too: an unproven clock is not a trusted one.
    """
    clocks = np.asarray(clocks_mhz, dtype=np.float64).ravel()
    if clocks.size != len(samples):
        raise ValueError(f"{len(samples)} samples but {clocks.size} clock readings")
    if not max_clock_mhz > 0:
        raise ValueError("max_clock_mhz must be positive")
    with np.errstate(invalid="ignore"):
        return ~(clocks >= tolerance * max_clock_mhz)


def paired_rounds(base: Callable[[], float], other: Callable[[], float], precision: float, max_s: float,
                  per_round: int = 10) -> tuple[list[float], list[float], SpeedupEstimate]:
    """Time two arms alternating (base first in even pairs, other first in odd ones), `per_round` pairs a round,
    in rounds until the paired CI of base/other is `precision` wide or `max_s` seconds have passed. Each arm is
    a call returning one time. Returns both arms' times and the estimate."""
    import time

    a: list[float] = []
    b: list[float] = []
    t0 = time.perf_counter()
    while True:
        for i in range(per_round):
            if i % 2 == 0:
                a.append(base())
                b.append(other())
            else:
                b.append(other())
                a.append(base())
        est = speedup_ci(a, b, paired=True)
        if est.high - est.low <= precision or time.perf_counter() - t0 >= max_s:
            return a, b, est
