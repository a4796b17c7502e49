"""Compare a candidate kernel's outputs with eager's: metadata exactly, values within a Tolerance.

Values are compared in float64 on the tensors' own device (a CUDA result is never copied to the host);
only a handful of scalars per chunk cross to the host for the report. Outputs larger than
`CHUNK_NUMEL` elements are walked in row-major chunks of views so the float64 temporaries stay bounded.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .tolerance import Tolerance

# 64M elements: each float64 temporary of a chunk is 512 MiB, about 3 GiB at peak; every tensor over
# 256M elements is therefore chunked, and smaller ones that would need >3 GiB of temporaries too.
CHUNK_NUMEL = 1 << 26

@dataclass(frozen=True)
class CompareReport:
    """The verdict for one output.

    `category` is None when ok, else "mismatch", "nan", "shape", "stride" or "dtype". Max errors are over
    all elements (NaN pairs excluded; an inf disagreement makes max_abs_err inf); max_rel_err skips
    expected zeros. `first_bad_*` is the first bad element in row-major order (the first NaN when the
    category is "nan").
    """

    ok: bool
    category: str | None
    max_abs_err: float
    max_rel_err: float
    mismatches: int
    numel: int
    first_bad_index: tuple[int, ...] | None
    first_bad_actual: Any
    first_bad_expected: Any
    message: str
    name: str = "out0"
    worst_index: tuple[int, ...] | None = None  # where max_abs_err occurs
    nan_count: int = 0  # NaNs in actual not matched by NaN in expected


def _meaningful_strides(t: torch.Tensor) -> tuple[tuple[int, int], ...]:
    """(dim, stride) of dims of size > 1: a size-1 dim's stride never addresses a second element."""
    if t.numel() == 0:
        return ()
    return tuple((d, s) for d, (n, s) in enumerate(zip(t.shape, t.stride())) if n > 1)


def _metadata_report(actual: torch.Tensor, expected: torch.Tensor, name: str) -> CompareReport | None:
    problems: list[tuple[str, str]] = []
    if tuple(actual.shape) != tuple(expected.shape):
        # Never broadcast: a (1, n) result for an (n, 1) expected is wrong even if values "match".
        problems.append(("shape", f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"))
    if actual.dtype != expected.dtype:
        # Never cast: an fp16 result for an fp32 op has lost precision whatever its values look like.
        problems.append(("dtype", f"dtype {_dt(actual.dtype)} != expected {_dt(expected.dtype)}"))
    if not problems and _meaningful_strides(actual) != _meaningful_strides(expected):
        problems.append(("stride", f"strides {tuple(actual.stride())} != expected {tuple(expected.stride())} "
                                   f"for shape {tuple(expected.shape)}"))
    if not problems:
        return None
    numel = expected.numel()
    return CompareReport(ok=False, category=problems[0][0], max_abs_err=math.nan, max_rel_err=math.nan,
                         mismatches=numel, numel=numel, first_bad_index=None, first_bad_actual=None,
                         first_bad_expected=None, name=name,
                         message=f"{name}: " + "; ".join(text for _, text in problems))


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _chunks(a: torch.Tensor, e: torch.Tensor, limit: int
            ) -> Iterator[tuple[tuple[int, ...], torch.Tensor, torch.Tensor]]:
    """Row-major (offset, actual view, expected view) pieces of at most `limit` elements (no copies)."""
    todo = [((0,) * a.dim(), a, e)]
    while todo:
        off, x, y = todo.pop()
        if x.numel() <= limit:
            yield off, x, y
            continue
        d = next(i for i, n in enumerate(x.shape) if n > 1)
        inner = x.numel() // x.shape[d]
        step = max(1, limit // inner)
        pieces = []
        for s in range(0, x.shape[d], step):
            n = min(step, x.shape[d] - s)
            o = off[:d] + (off[d] + s,) + off[d + 1:]
            pieces.append((o, x.narrow(d, s, n), y.narrow(d, s, n)))
        todo.extend(reversed(pieces))  # a stack: push in reverse to pop in row-major order


def _as_f64(t: torch.Tensor) -> torch.Tensor:
    """Float64 values (complex: a trailing (real, imag) dim); no copy for float64 input."""
    if t.is_complex():
        return torch.view_as_real(t.to(torch.complex128).resolve_conj())
    return t.to(torch.float64)


def _unravel(flat: int, shape: Sequence[int], off: Sequence[int]) -> tuple[int, ...]:
    idx = []
    for n in reversed(shape):
        flat, r = divmod(flat, n)
        idx.append(r)
    return tuple(o + i for o, i in zip(off, reversed(idx)))


def _rms(e: torch.Tensor, device: torch.device, limit: int) -> float:
    """Root-mean-square of the finite values (a pass over expected only)."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = torch.zeros((), dtype=torch.float64, device=device)
    for _, y, _ in _chunks(e, e, limit):
        y64 = _as_f64(y.to(device))
        fin = torch.isfinite(y64)
        total += torch.where(fin, y64, 0.0).square().sum()
        count += fin.sum()
    t, c = torch.stack([total, count]).tolist()
    return math.sqrt(t / c) if c else 0.0


def _chunk_stats(a: torch.Tensor, e: torch.Tensor, tol: Tolerance, slack: float) -> list[float]:
    """One chunk, one host sync: [bad, nan_bad, max_abs, argmax_abs, max_rel, first_bad, first_nan]."""
    cplx = a.is_complex()
    a64, e64 = _as_f64(a), _as_f64(e)
    if not (a.is_floating_point() or cplx):
        # Integers and bools: compare natively (int64 above 2**53 is not exact in float64).
        ok = a == e
        a_nan = torch.zeros_like(ok)
        diff = (a64 - e64).abs()
        rel = torch.where(e64 != 0, diff / e64.abs(), 0.0)
    else:
        a_nan, e_nan = torch.isnan(a64), torch.isnan(e64)
        finite = torch.isfinite(a64) & torch.isfinite(e64)
        raw = (a64 - e64).abs()
        bound = slack + tol.rtol * e64.abs() if not tol.exact else torch.zeros_like(e64)
        # Non-finite pairs are equal only when identical (inf == inf of the same sign).
        ok = torch.where(finite, raw <= bound, a64 == e64)
        if tol.nan_equal:
            ok |= a_nan & e_nan
        if not tol.nonfinite_kind:
            ok |= ~torch.isfinite(a64) & ~torch.isfinite(e64)
        # Max abs err: finite pairs as is, inf disagreements as inf, NaNs counted apart (0 here).
        diff = torch.where(finite, raw, torch.where((a64 == e64) | a_nan | e_nan, 0.0, math.inf))
        rel = torch.where(finite & (e64 != 0), raw / e64.abs(), 0.0)
        if cplx:  # an element is bad if either component is; report the worse component
            ok, a_nan = ok.all(dim=-1), a_nan.any(dim=-1)
            diff, rel = diff.amax(dim=-1), rel.amax(dim=-1)
    bad = ~ok
    nan_bad = a_nan & bad
    bad_f, nan_f, diff_f, rel_f = bad.reshape(-1), nan_bad.reshape(-1), diff.reshape(-1), rel.reshape(-1)
    stats = torch.stack([
        bad_f.sum(dtype=torch.float64), nan_f.sum(dtype=torch.float64), diff_f.max(),
        diff_f.argmax().to(torch.float64), rel_f.max(),
        bad_f.to(torch.uint8).argmax().to(torch.float64),  # argmax returns the first maximum
        nan_f.to(torch.uint8).argmax().to(torch.float64),
    ])
    return stats.tolist()


def _value(t: torch.Tensor, index: tuple[int, ...]) -> Any:
    """One element as a Python number, exactly (float8 goes through float64)."""
    v = t[index]
    if v.is_floating_point() and v.dtype not in (torch.float64, torch.float32, torch.float16):
        v = v.to(torch.float64)
    return v.item()


def _fmt_pair(a: Any, e: Any) -> tuple[str, str]:
    """Shortest formatting that tells the two values apart."""
    for digits in (5, 7, 9, 12, 17):
        sa, se = _fmt(a, digits), _fmt(e, digits)
        if sa != se:
            return sa, se
    return sa, se


def _fmt(v: Any, digits: int = 5) -> str:
    if isinstance(v, complex):
        return f"({v.real:.{digits}g}{v.imag:+.{digits}g}j)"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def _pct(bad: int, numel: int) -> str:
    return f"{100.0 * bad / numel:.3g}%" if numel else "0%"


@torch.no_grad()
def compare(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance, *, name: str = "out0",
            chunk_numel: int = CHUNK_NUMEL) -> CompareReport:
    """Compare one output: shape, dtype and strides exactly, then values in float64 within `tol`."""
    for what, t in (("actual", actual), ("expected", expected)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {what} is {type(t).__name__}, not a Tensor (use compare_outputs)")
        if t.layout != torch.strided:
            raise TypeError(f"{name}: {what} has layout {t.layout}; only strided tensors are compared")
    meta = _metadata_report(actual, expected, name)
    if meta is not None:
        return meta
    numel = expected.numel()
    tdesc = tol.describe()
    if numel == 0:
        return CompareReport(True, None, 0.0, 0.0, 0, 0, None, None, None,
                             f"{name}: ok (empty, {tdesc})", name=name)
    # Compute where the data is; a reference kept on the host is moved over one chunk at a time.
    device = actual.device if actual.device.type != "cpu" else expected.device
    rms = _rms(expected, device, chunk_numel) if tol.rms_rtol and not tol.exact else 0.0
    slack = tol.atol + tol.rms_rtol * rms
    bad_total = nan_total = 0
    max_abs, max_rel = 0.0, 0.0
    first_bad: tuple[int, ...] | None = None
    first_nan: tuple[int, ...] | None = None
    worst: tuple[int, ...] | None = None
    for off, x, y in _chunks(actual, expected, chunk_numel):
        stats = _chunk_stats(x.to(device), y.to(device), tol, slack)
        n_bad, n_nan, c_abs, c_arg, c_rel, c_first, c_first_nan = stats
        if c_abs > max_abs:
            max_abs, worst = c_abs, _unravel(int(c_arg), x.shape, off)
        max_rel = max(max_rel, c_rel)
        if n_bad and first_bad is None:
            first_bad = _unravel(int(c_first), x.shape, off)
        if n_nan and first_nan is None:
            first_nan = _unravel(int(c_first_nan), x.shape, off)
        bad_total += int(n_bad)
        nan_total += int(n_nan)
    if bad_total == 0:
        return CompareReport(True, None, max_abs, max_rel, 0, numel, None, None, None,
                             f"{name}: ok ({numel} elements; max abs err {max_abs:.3g}, max rel err "
                             f"{max_rel:.3g}; tol {tdesc})", name=name, worst_index=worst)
    # NaN and inf disagreements are never excused by max_mismatch_fraction; finite ones may be.
    nonfinite_bad = nan_total > 0 or math.isinf(max_abs)
    within = not nonfinite_bad and bad_total <= tol.max_mismatch_fraction * numel
    category = None if within else ("nan" if nan_total else "mismatch")
    shown = first_nan if nan_total else first_bad
    assert shown is not None
    got, exp = _value(actual, shown), _value(expected, shown)
    g, x_ = _fmt_pair(got, exp)
    if nan_total:
        line = (f"{name}: {nan_total} of {numel} elements are NaN where eager is not "
                f"({_pct(nan_total, numel)}); first at {shown}: got {g}, expected {x_}")
        if bad_total > nan_total:
            line += f"; {bad_total - nan_total} more differ, max abs err {max_abs:.3g}"
        line += f" (tol {tdesc})"
    else:
        line = f"{name}: {bad_total} of {numel} elements differ ({_pct(bad_total, numel)}); "
        if worst is not None and worst != first_bad:
            wg, wx = _fmt_pair(_value(actual, worst), _value(expected, worst))
            line += (f"max abs err {max_abs:.3g} at {worst}: got {wg}, expected {wx}; max rel err "
                     f"{max_rel:.3g} (tol {tdesc})\n  first bad at {first_bad}: got {g}, expected {x_}")
        else:
            line += (f"max abs err {max_abs:.3g} at {first_bad}: got {g}, expected {x_}; max rel err "
                     f"{max_rel:.3g} (tol {tdesc})")
        if within:
            line += f"; within the allowed {tol.max_mismatch_fraction:.3g} fraction"
    return CompareReport(ok=within, category=category, max_abs_err=max_abs, max_rel_err=max_rel,
                         mismatches=bad_total, numel=numel, first_bad_index=shown, first_bad_actual=got,
                         first_bad_expected=exp, message=line, name=name, worst_index=worst,
                         nan_count=nan_total)


def compare_outputs(actual_list: Any, expected_list: Any, tol_for_each: Tolerance | Sequence[Tolerance],
                    *, chunk_numel: int = CHUNK_NUMEL) -> list[CompareReport]:
    """Compare every output of an op (a tensor, or a tuple/list possibly holding lists of tensors).

    `tol_for_each` is one Tolerance for all, or one per top-level output (a list output shares its
    entry). Non-tensor outputs (ints, None) must be equal. All ok <=> `all(r.ok for r in reports)`.
    """
    exp_top = expected_list if isinstance(expected_list, (list, tuple)) else [expected_list]
    act_top = actual_list if isinstance(actual_list, (list, tuple)) else [actual_list]
    if isinstance(tol_for_each, Tolerance):
        tols = [tol_for_each] * len(exp_top)
    else:
        tols = list(tol_for_each)
        if len(tols) != len(exp_top):
            raise ValueError(f"{len(tols)} tolerances for {len(exp_top)} outputs")
    if len(act_top) != len(exp_top):
        return [_structure_report("outputs", f"{len(act_top)} outputs, expected {len(exp_top)}")]
    reports = []
    for i, (a, e, tol) in enumerate(zip(act_top, exp_top, tols)):
        if isinstance(e, (list, tuple)):
            if not isinstance(a, (list, tuple)) or len(a) != len(e):
                n = len(a) if isinstance(a, (list, tuple)) else type(a).__name__
                reports.append(_structure_report(f"out{i}", f"got {n}, expected a list of {len(e)}"))
                continue
            reports.extend(_compare_leaf(x, y, tol, f"out{i}[{j}]", chunk_numel)
                           for j, (x, y) in enumerate(zip(a, e)))
        else:
            reports.append(_compare_leaf(a, e, tol, f"out{i}", chunk_numel))
    return reports


def _structure_report(name: str, text: str) -> CompareReport:
    return CompareReport(False, "shape", math.nan, math.nan, 0, 0, None, None, None, f"{name}: {text}",
                         name=name)


def _compare_leaf(a: Any, e: Any, tol: Tolerance, name: str, chunk_numel: int) -> CompareReport:
    if isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor):
        return compare(a, e, tol, name=name, chunk_numel=chunk_numel)
    if isinstance(e, torch.Tensor) or isinstance(a, torch.Tensor):
        return CompareReport(False, "dtype", math.nan, math.nan, 0, 0, None, a, e,
                             f"{name}: got {type(a).__name__}, expected {type(e).__name__}", name=name)
    same = a == e or (isinstance(a, float) and isinstance(e, float) and math.isnan(a) and math.isnan(e))
    return CompareReport(bool(same), None if same else "mismatch", 0.0 if same else math.nan, 0.0, int(not same),
                         1, None if same else (), None if same else a, None if same else e,
                         f"{name}: " + ("ok" if same else f"got {a!r}, expected {e!r}"), name=name)


@torch.no_grad()
def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and element bytes (NaN payloads and signed zeros included); strides ignored."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    b = b.to(a.device)
    return torch.equal(_as_bits(a), _as_bits(b))


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _as_bits(t: torch.Tensor) -> torch.Tensor:
    """Reinterpret elements as same-width integers (works on any strides when the width is kept)."""
    t = t.resolve_conj().resolve_neg()  # lazy conj/neg bits are not in the bytes yet
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    width = t.element_size()
    return t if not t.is_floating_point() and width != 1 else t.view(_BITS[width])


# The rounding-bias check (`rounding_bias`): 16-bit float outputs, whose table rows allow one or two ulp per element,
# so a kernel that rounds toward zero (a float -> bfloat16 conversion that drops the low 16 bits, the common hand-rolled
# `__float_as_uint(f) >> 16`) or toward -inf instead of to nearest passes them on every set: it errs by at most one ulp.
# Its errors all point one way, though: half an ulp on average, where eager and any kernel that rounds to nearest from
# a value of float32 precision err by a small, unbiased fraction of an ulp (two roundings to nearest of nearby values
# differ either way alike). A bias of half an ulp adds up wherever the outputs are summed (a bfloat16 residual stream,
# a softmax row summing to 0.998). Eager is the reference, so the mean error is taken against it, in ulps of eager's
# value: BIAS_ULPS at least, and BIAS_SIGMAS standard errors of that mean, over BIAS_MIN finite elements or more.
_BIAS_PRECISION = {torch.float16: (11, 2.0**-24), torch.bfloat16: (8, 2.0**-133)}   # (significand bits, least spacing)
BIAS_ULPS = 0.25
BIAS_SIGMAS = 6.0
BIAS_MIN = 64


@torch.no_grad()
def rounding_bias(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    """Why `actual` (a float16 or bfloat16 output within tolerance of `expected`) rounds with a bias against eager,
    or None: its mean error, in ulps of eager's values, toward zero or toward -inf."""
    if expected.dtype not in _BIAS_PRECISION or actual.dtype != expected.dtype or actual.shape != expected.shape:
        return None
    bits, least = _BIAS_PRECISION[expected.dtype]
    a = actual.reshape(-1).to(torch.float64)
    e = expected.reshape(-1).to(a.device).to(torch.float64)   # a reference kept on the host comes over
    fin = torch.isfinite(a) & torch.isfinite(e) & (e != 0)
    n = int(fin.sum())
    if n < BIAS_MIN:
        return None
    e, a = e[fin], a[fin]
    _, exp = torch.frexp(e)
    ulp = torch.ldexp(torch.ones_like(e), (exp - bits).to(torch.int32)).clamp_min(least)
    err = (a - e) / ulp
    for how, d in (("toward zero", err * torch.sign(e)), ("toward -inf", err)):
        mean = float(d.mean())
        stderr = float(d.std()) / n ** 0.5 if n > 1 else 0.0
        if abs(mean) >= BIAS_ULPS and abs(mean) >= BIAS_SIGMAS * stderr:
            direction = how if mean < 0 else how.replace("zero", "infinity").replace("-inf", "+inf")
            return (f"its errors against eager lean {direction}: {mean:+.2f} ulp on average over {n} elements "
                    f"(±{stderr:.2f}), where rounding to nearest leans neither way; it truncates or rounds in one "
                    "direction instead of to nearest even")
    return None
