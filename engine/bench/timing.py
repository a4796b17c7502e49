"""The timing protocol of DESIGN.md: A/B alternation with eager, per-call CUDA events, L2 flush
before every call, warm-up, adaptive repetitions, median/IQR and a bootstrap CI of the speedup.

Both sides run in the same process, on the same stream. Eager goes through the public op. Arms may
carry untimed `prepare`/`finish` steps and the loop untimed per-round and per-batch hooks: that is how
`engine.verify.timed` gives each side its own rotating, regenerated inputs and audits timed calls. The flush runs before each call's start event, so it is never timed but keeps the GPU busy
while the host enqueues the call: the events measure device time, not launch latency.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import torch

from engine.bench.stats import TimingStats, flag_throttled, should_stop, speedup_ci, summarize


@dataclass(frozen=True)
class TimingConfig:
    warmup_s: float = 0.25          # GPU-busy warm-up so clocks ramp and caches (cuBLAS, allocator) settle
    min_reps: int = 20
    max_reps: int = 2000
    max_seconds: float = 4.0
    target_rel_err: float = 0.01
    batch: int = 10                 # calls per arm between host syncs
    throttle_tolerance: float = 0.95
    slots: int = 4                  # input sets the timed calls rotate over, each in its own buffers
    audit_every: int = 8            # on average one timed call in this many has its outputs checked
    min_audits: int = 3             # audited calls at least (extra rounds after the timed ones)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> TimingConfig:
        """The defaults overridden by the keys of `d` that name a field (a request's 'timing'; others ignored)."""
        return cls(**{k: v for k, v in (d or {}).items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class ABResult:
    eager: TimingStats
    candidate: TimingStats
    speedup: float
    speedup_low: float
    speedup_high: float
    reps: int
    throttled: int                  # pairs taken while the SM clock was below tolerance
    seconds: float
    eager_us: list[float]
    candidate_us: list[float]
    starved: int = 0                # rounds dropped (or, at the cap, kept) because the lead was too short
    lead_us: float = 0.0            # the lead the last rounds ran with

    def to_json(self, keep_samples: bool = False) -> dict[str, Any]:
        d = {"eager": asdict(self.eager), "candidate": asdict(self.candidate), "speedup": self.speedup,
             "speedup_ci": [self.speedup_low, self.speedup_high], "reps": self.reps,
             "throttled": self.throttled, "seconds": self.seconds, "starved": self.starved,
             "lead_us": self.lead_us}
        if keep_samples:
            d["eager_us"], d["candidate_us"] = self.eager_us, self.candidate_us
        return d


class L2Flusher:
    """Before each timed call: evict the L2 (write a buffer twice its size), then keep the GPU busy
    for `lead_us` so the host has enqueued the timed call before its start event runs.

    Without the lead, a call whose host side (argument packing, launch) outlasts the flush is timed
    from an idle GPU, and the events measure launch latency instead of the kernel. `time_calls`
    checks that the lead was long enough for every timed call and lengthens it where it was not.
    """

    def __init__(self, device: torch.device, lead_us: float = 80.0):
        props = torch.cuda.get_device_properties(device)
        l2 = props.L2_cache_size or (64 << 20)
        self.buf = torch.empty(2 * l2 // 4, dtype=torch.int32, device=device)
        self.clock_khz = getattr(props, "clock_rate", 0) or 2_000_000
        self.lead_us = lead_us

    def __call__(self, lead_us: float | None = None) -> None:
        self.buf.fill_(0x5A5A)
        us = self.lead_us if lead_us is None else lead_us
        if us > 0:
            torch.cuda._sleep(int(us * self.clock_khz / 1e3))


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, reps: int = 5) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read plus bytes written), timed with CUDA events."""
    a = torch.empty(nbytes // 4, dtype=torch.int32, device=device)
    b = torch.empty_like(a)
    b.copy_(a)  # warm-up: allocation and first-touch are not timed
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        b.copy_(a)
    e.record()
    torch.cuda.synchronize()
    bw = reps * 2 * a.numel() * 4 / (s.elapsed_time(e) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return bw


def sm_clock_mhz(device: torch.device) -> float:
    """Current SM clock through NVML, or NaN when it cannot be read."""
    try:
        return float(torch.cuda.clock_rate(device))
    except Exception:
        return float("nan")


def max_sm_clock_mhz(device: torch.device) -> float:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        return float(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM))
    except Exception:
        return float("nan")


@dataclass
class Arm:
    """One side of a timed comparison: `call` is timed; `prepare` runs before the call's L2 flush and
    `finish` after its end event (given the call's result), both untimed."""

    call: Callable[[], Any]
    prepare: Callable[[], None] | None = None
    finish: Callable[[Any], None] | None = None


Hooks = Callable[[int], None]  # before_round(round index)


def _as_arm(c: Callable[[], Any] | Arm) -> Arm:
    return c if isinstance(c, Arm) else Arm(c)


def _one_call(arm: Arm, flush: L2Flusher, events: list | None, i: int, lead_us: float | None = None) -> float:
    """One call (timed into `events` when given); returns the host µs from the end of the lead's
    enqueue to the end event's: over the lead, the GPU may have idled inside the timed window."""
    if arm.prepare is not None:
        arm.prepare()
    flush(lead_us)
    h0 = time.perf_counter()
    if events is None:
        result = arm.call()
    else:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        result = arm.call()
        e.record()
        events.append((i, s, e))
    host_us = (time.perf_counter() - h0) * 1e6
    if arm.finish is not None:
        arm.finish(result)
    return host_us


def _warm_up(arms: list[Arm], flush: L2Flusher, seconds: float, before_round: Hooks | None) -> int:
    t0 = time.perf_counter()
    n = 0
    while n < 3 or time.perf_counter() - t0 < seconds:
        if before_round is not None:
            before_round(-1 - n)  # warm-up rounds are numbered below zero
        for a in arms:
            _one_call(a, flush, None, 0)
        n += 1
        if n % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return n


class CallTimes(NamedTuple):
    times: list[list[float]]  # per-call µs for each callable, round by round (rounds dropped as a whole)
    throttled: int            # kept rounds taken while the SM clock was below tolerance
    seconds: float
    starved: int              # rounds dropped because a call's host side outlasted the lead
    lead_us: float            # the lead the last rounds ran with


# A round in which a call's host side outlasted the lead is dropped and, where that happens in more
# than STARVED_BATCH_FRACTION of a batch, the lead doubles, up to MAX_LEAD_US. At the cap rounds are
# kept: a call that waits on the device itself (a host sync inside the op) outlasts any lead.
STARVED_BATCH_FRACTION = 0.25
MAX_LEAD_US = 1000.0


def time_calls(calls: list[Callable[[], Any] | Arm], flush: L2Flusher, cfg: TimingConfig = TimingConfig(), *,
               before_round: Hooks | None = None, after_batch: Callable[[], bool] | None = None) -> CallTimes:
    """Alternate the calls call by call (rotating which goes first), each timed with its own events.

    `before_round(r)` runs before round r (one call of each arm); `after_batch()` after each batch's
    host sync, and ends the timing early when it returns True. A round where any call's host side
    (from the lead's end to the end event) took longer than the lead is not kept: the GPU may have
    waited for the host inside that call's events, which would then time the host, not the kernel.
    Intermittent host stalls (an allocator call, a collection) made eager read 2-5x slower that way.
    """
    arms = [_as_arm(c) for c in calls]
    device = torch.device("cuda", torch.cuda.current_device())
    _warm_up(arms, flush, cfg.warmup_s, before_round)
    times: list[list[float]] = [[] for _ in arms]
    clocks: list[float] = []
    max_clock = max_sm_clock_mhz(device)
    lead = float(flush.lead_us)
    starved = 0
    t0 = time.perf_counter()
    rnd = 0
    while True:
        events: list = []
        late: set[int] = set()  # rounds (within the batch) where the lead was too short
        for b in range(cfg.batch):
            if before_round is not None:
                before_round(rnd)
            order = list(range(len(arms)))
            k = rnd % len(arms)
            order = order[k:] + order[:k]  # no arm always runs right after the flush of the other
            for i in order:
                if _one_call(arms[i], flush, events, i, lead) > lead:
                    late.add(b)
            rnd += 1
        torch.cuda.synchronize()
        # At the cap, or where every round so far was late and timing is about to end, late rounds are
        # the only measurement there is: keep them (they still count as starved).
        ending = time.perf_counter() - t0 >= cfg.max_seconds and not times[0]
        keep_late = lead >= MAX_LEAD_US or ending
        clock = sm_clock_mhz(device)
        for j, (i, s, e) in enumerate(events):
            if keep_late or j // len(arms) not in late:
                times[i].append(s.elapsed_time(e) * 1e3)
        kept = cfg.batch - (0 if keep_late else len(late))
        clocks += [clock] * kept
        starved += len(late)
        if not keep_late:
            if len(late) > STARVED_BATCH_FRACTION * cfg.batch:
                lead = min(MAX_LEAD_US, 2 * lead)
        elapsed = time.perf_counter() - t0
        if after_batch is not None and after_batch():
            break
        if times[0] and all(should_stop(t, target_rel_err=cfg.target_rel_err, min_samples=cfg.min_reps,
                           max_samples=cfg.max_reps, max_seconds=cfg.max_seconds, elapsed_s=elapsed)
               for t in times):
            break
    throttled = 0
    if max_clock == max_clock and times[0]:  # not NaN
        throttled = int(flag_throttled(times[0], clocks, max_clock, tolerance=cfg.throttle_tolerance).sum())
    return CallTimes(times, throttled, time.perf_counter() - t0, starved, lead)


def ab_time(eager: Callable[[], Any] | Arm, candidate: Callable[[], Any] | Arm, flush: L2Flusher,
            cfg: TimingConfig = TimingConfig(), *, before_round: Hooks | None = None,
            after_batch: Callable[[], bool] | None = None) -> ABResult:
    """Time eager against the candidate, alternated, and estimate the speedup with a paired CI."""
    run = time_calls([eager, candidate], flush, cfg, before_round=before_round, after_batch=after_batch)
    e_us, c_us = run.times
    if not e_us or not c_us:  # `after_batch` stopped the timing before a round was kept: no estimate
        nan = float("nan")
        empty = TimingStats(n=0, median=nan, iqr=nan, q1=nan, q3=nan, min=nan, max=nan, mean=nan,
                            rel_err_median=nan)
        return ABResult(empty, empty, nan, nan, nan, 0, run.throttled, run.seconds, e_us, c_us, run.starved,
                        run.lead_us)
    est = speedup_ci(e_us, c_us, paired=True)
    return ABResult(summarize(e_us), summarize(c_us), est.speedup, est.low, est.high, len(e_us),
                    run.throttled, run.seconds, e_us, c_us, run.starved, run.lead_us)


def time_one(fn: Callable[[], Any] | Arm, flush: L2Flusher, cfg: TimingConfig = TimingConfig(), *,
             before_round: Hooks | None = None) -> tuple[TimingStats, int]:
    """Time a single callable with the same protocol (eager latency of a card)."""
    run = time_calls([fn], flush, cfg, before_round=before_round)
    return summarize(run.times[0]), run.throttled


def time_copy(nbytes: int, device: torch.device, flush: L2Flusher, cfg: TimingConfig = TimingConfig(), *,
              max_bytes: int | None = None) -> tuple[TimingStats, int]:
    """The device's own copy (`Tensor.copy_`) of `nbytes` of traffic, half read and half written, timed
    like eager alone: L2 flushed, rotating over `cfg.slots` source/destination pairs (fewer where
    `max_bytes`, the memory they may take, does not hold them all). What a kernel that must move
    `nbytes` could at best take on this GPU, measured rather than taken from a bandwidth figure."""
    half = max(1, (int(nbytes) // 2 + 15) // 16)  # int4 words: 16 bytes each (read and write sizes equal)
    pair = 2 * 16 * half
    slots = max(1, min(cfg.slots, (max_bytes // pair) if max_bytes else cfg.slots))
    bufs = [(torch.empty(half, 4, dtype=torch.int32, device=device),
             torch.empty(half, 4, dtype=torch.int32, device=device)) for _ in range(slots)]
    for src, _ in bufs:
        src.fill_(7)  # first touch outside the timing
    k = [0]

    def before_round(r: int) -> None:
        k[0] = abs(r) % len(bufs)

    def call() -> None:
        dst, src = bufs[k[0]][1], bufs[k[0]][0]
        dst.copy_(src)

    run = time_calls([call], flush, cfg, before_round=before_round)
    return summarize(run.times[0]), run.throttled
