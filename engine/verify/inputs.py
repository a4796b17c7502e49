"""Input sets for verification: layout-preserving clones, fresh draws matching captured statistics,
and edge cases (negated, ties, large magnitudes) — all with the captured shapes, strides, alignment
modulo 16 bytes and aliasing between arguments."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from engine.capture.signature import storage_extent

Bound = list[tuple[str, Any]]
_ALIGN = 16


def _tensors(bound: Bound):
    for _name, v in bound:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (x for x in v if isinstance(x, torch.Tensor))


def _key(t: torch.Tensor) -> tuple:
    return (t.device.type, t.device.index, t.untyped_storage().data_ptr())


Alloc = Callable[[int, str], torch.Tensor]  # (bytes, argument name) -> uint8 tensor (e.g. Canaries.buffer)


def clone_bound(bound: Bound, device: torch.device | None = None, alloc: Alloc | None = None) -> Bound:
    """Deep copy of the arguments into fresh storage, keeping layout, alignment and aliasing.

    `alloc` makes the new storage (one buffer per storage the arguments share); by default plain memory.
    """
    spans: dict[tuple, list] = {}
    names: dict[tuple, str] = {}
    for name, t in tensors_of(bound):
        lo, hi = storage_extent(t)
        s = spans.setdefault(_key(t), [lo, hi, t])
        names.setdefault(_key(t), name)
        s[0], s[1] = min(s[0], lo), max(s[1], hi)
    new_storage: dict[tuple, tuple[torch.UntypedStorage, int]] = {}
    for key, (lo, hi, t) in spans.items():
        start = lo - lo % _ALIGN
        raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
        if alloc is None:
            copy = raw[start:hi].to(device or t.device, copy=True)
        else:
            copy = alloc(hi - start, names[key])
            copy.copy_(raw[start:hi])
        # The copy may start inside its storage (a guarded buffer): offsets are relative to it.
        new_storage[key] = (copy.untyped_storage(), start - copy.storage_offset())

    def rebuild(t: torch.Tensor) -> torch.Tensor:
        storage, start = new_storage[_key(t)]
        isz = t.element_size()
        return torch.empty(0, dtype=t.dtype, device=device or t.device).set_(
            storage, (t.storage_offset() * isz - start) // isz, t.shape, t.stride())

    out: Bound = []
    for name, v in bound:
        if isinstance(v, torch.Tensor):
            out.append((name, rebuild(v)))
        elif isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            out.append((name, [rebuild(x) if isinstance(x, torch.Tensor) else x for x in v]))
        else:
            out.append((name, v))
    return out


def cover(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view over every storage element the tensor touches (so broadcast tensors can be refilled)."""
    lo, hi = storage_extent(t)
    n = (hi - lo) // t.element_size()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), t.storage_offset(), (n,), (1,))


def _stats(t: torch.Tensor) -> tuple[float, float, float, float]:
    x = t.detach().double() if t.numel() else torch.zeros(1, dtype=torch.float64)
    ok = torch.isfinite(x)
    finite = x if bool(ok.all()) else x[ok]   # the mask once; no copy where every value is finite
    if finite.numel() == 0:
        return 0.0, 1.0, -1.0, 1.0
    return (float(finite.mean()), float(finite.std()) if finite.numel() > 1 else 0.0,
            float(finite.min()), float(finite.max()))


def on_device(gen: torch.Generator, device: torch.device) -> torch.Generator:
    """The generator to draw with on `device`: `gen` where it draws there, else a generator of that device seeded
    from `gen` (which moves on by one draw), so the values stay as reproducible as `gen`'s. A draw made on the host
    for a GPU tensor takes seconds for one large activation (a float64 normal of 268 M elements, then a 2 GB copy; 13 s
    for one card's sets on a 2-core host): the likely cause of the 148 s the SD3.5 VAE's 27 cards took to load on an
    H100 (2026-12-05g), not yet measured again."""
    if gen.device == device or (gen.device.type == device.type == "cpu"):
        return gen
    try:
        made = torch.Generator(device=device)
    except RuntimeError:   # a device without generators of its own (meta): drawn with `gen`, then moved
        return gen
    return made.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))


def toward_zero(v: int) -> int:
    """One step from a nonzero integer toward zero: the other value a constant integer tensor is drawn with (a mask
    of ones also gets zeros; an index stays within the range its value was in)."""
    return v - 1 if v > 0 else v + 1


def refill_like_(t: torch.Tensor, reference: torch.Tensor, gen: torch.Generator) -> None:
    """Overwrite `t` in place with random values matching `reference`'s mean, std and range, drawn where `t` lives
    (`on_device`): on the host in float64, on a GPU in float64 for a float64 tensor and float32 otherwise (the
    draw is rounded to `t`'s dtype either way)."""
    c = cover(t)
    if c.numel() == 0:
        return
    mean, std, lo, hi = _stats(reference)
    gen = on_device(gen, c.device)
    at = gen.device   # where the values are drawn: c's device, or the host (then copied over)
    work = torch.float64 if at.type == "cpu" or c.dtype == torch.float64 else torch.float32
    if t.dtype == torch.bool:
        p = float(reference.float().mean()) if reference.numel() else 0.5
        if p in (0.0, 1.0):
            # A constant mask (a padding mask of a batch without padding, a condition that held everywhere) must
            # not stay constant, as a constant float does not: a masked_fill that ignored its mask, a where that
            # returned `self`, passed every set. Half of each, and one element the other way at least.
            c.copy_((torch.rand(c.shape, generator=gen, device=at) < 0.5).to(c.device))
            c[int(torch.randint(c.numel(), (), generator=gen, device=at))] = p == 0.0
            return
        c.copy_((torch.rand(c.shape, generator=gen, device=at) < p).to(c.device))
    elif t.is_floating_point():
        if std > 0.0:
            vals = (torch.randn(c.shape, generator=gen, dtype=work, device=at) * std + mean).clamp_(lo, hi)
        else:
            # A constant (a freshly initialised norm weight of ones, a zero bias) must not stay constant:
            # real weights are not, and a kernel specialised to the constant would pass otherwise.
            # ±10 % keeps the sign, so domains such as a positive variance still hold.
            spread = max(abs(mean) * 0.1, 1e-3)
            vals = torch.randn(c.shape, generator=gen, dtype=work, device=at) * spread + mean
        c.copy_(vals.to(c.device))
        if monotone(reference):
            keep_monotone_(t, reference)
    elif t.is_complex():
        c.copy_(torch.randn(c.shape, generator=gen, dtype=t.dtype, device=at).to(c.device))
    else:
        ilo, ihi = int(lo), int(hi)
        if t.dim() == 0:
            # A 0-dim integer (a scalar tensor: an exponent, a bound) is one value, and a cast's guard does not key
            # on it: a kernel that baked the sampled value in must meet another. One step up or down, sign kept
            # (an op that refuses it has its integers kept, as for any refused draw).
            info = torch.iinfo(t.dtype)
            steps = [v for v in (ilo - 1, ilo + 1) if info.min <= v <= info.max and (v >= 0) == (ilo >= 0)]
            pick = int(torch.randint(len(steps), (), generator=gen, device=at)) if len(steps) > 1 else 0
            c.fill_(steps[pick] if steps else ilo)
            return
        if ilo == ihi != 0:
            # A constant integer tensor (an attention mask of ones in a batch without padding) must not stay
            # constant either: a cumsum of it that returned arange + 1 (position ids) passed every set. Each element
            # its value or one step toward zero (a mask's 0; an index stays within the range its value was in), one
            # of them the step at least. A constant 0 is left as it is (a step away from it may index past a size).
            step = toward_zero(ilo)
            vals = torch.where(torch.rand(c.shape, generator=gen, device=at) < 0.5, ilo, step).to(torch.int64)
            vals[int(torch.randint(c.numel(), (), generator=gen, device=at))] = step
            c.copy_(vals.to(c.device))
            return   # not sorted as a rising one: from its first value up, a constant row stays constant
        c.copy_(torch.randint(ilo, ihi + 1, c.shape, generator=gen, dtype=torch.int64, device=at).to(c.device))
        if monotone(reference):
            keep_monotone_(t, reference)


def monotone(t: torch.Tensor) -> bool:
    """A real tensor whose rows (last dim, two or more values) never decrease: offsets, cumulative lengths,
    sorted boundaries. Ops that take one (`embedding_bag`'s offsets must start at 0 and rise) refuse uniform
    random values, so fresh ones are drawn sorted, with each integer row's first value kept (`keep_monotone_`).
    Floating ones too (`searchsorted`'s sorted_sequence, `bucketize`'s boundaries, three values a row or more,
    finite): eager does not refuse an unsorted one, its binary search returns an answer its implementation
    chose, and a correct kernel that searches another way (a count of the values below) was rejected there."""
    if t.dtype == torch.bool or t.is_complex() or t.dim() == 0 or t.shape[-1] < 2:
        return False
    if t.is_floating_point() and (t.shape[-1] < 3 or not bool(torch.isfinite(t).all())):
        return False
    return bool((t[..., 1:] >= t[..., :-1]).all())


def keep_monotone_(t: torch.Tensor, reference: torch.Tensor) -> None:
    """`t`'s rows sorted in place, each integer row starting at `reference`'s first value of that row (a tensor
    whose elements share memory, a broadcast one, is left as drawn). A floating row is sorted, NaN made +inf (a
    NaN inside a sorted sequence leaves a search's answer to its implementation)."""
    if 0 in t.stride() and t.numel() > 1:
        return
    if t.is_floating_point():
        t.copy_(torch.sort(torch.nan_to_num(t, nan=float("inf"), posinf=float("inf"), neginf=float("-inf")),
                           dim=-1).values)
        return
    t.copy_(torch.sort(t, dim=-1).values)
    t[..., :1] = reference[..., :1].to(t.device)
    t.copy_(torch.maximum(t, t[..., :1]))   # nothing below the first value: the rows still rise


def fresh_inputs(sample: Bound, seed: int, *, keep_ints: bool = False,
                 distinct: dict[str, int | None] | None = None) -> Bound:
    """New values for every tensor, drawn to match the sample's statistics; same layout and aliasing. With
    `keep_ints`, integer tensors keep the sample's values (an op that refused random ones: indices that must
    be unique, lengths that must add up). `distinct` (`distinct_indices`): index tensors drawn without repeats."""
    gen = torch.Generator().manual_seed(seed)
    fresh = clone_bound(sample)
    for (_, new), (_, old) in zip(fresh, sample):
        news = new if isinstance(new, (list, tuple)) else [new]
        olds = old if isinstance(old, (list, tuple)) else [old]
        for n, o in zip(news, olds):
            if isinstance(n, torch.Tensor) and not (keep_ints and _is_int(n)):
                refill_like_(n, o, gen)
    if distinct and not keep_ints:
        olds = dict(tensors_of(sample))
        for path, t in tensors_of(fresh):
            if path in distinct:
                distinct_(t, distinct[path], int(olds[path].min()), int(olds[path].max()), gen)
    return fresh


# Ops whose writes through repeated indices leave which write lands to the implementation: (index argument, the dim
# its values must not repeat along, None: the whole tensor). Where the samples' index repeats nothing there, drawn
# ones repeat nothing either (`distinct_indices`): a fresh draw of a KV cache's positions repeated some, eager's
# answer was then its own choice of winner, and a correct kernel that chose another was rejected. Not with
# `accumulate=True` or a `reduce` (their answer does not depend on an order of writes).
UNIQUE_WRITES: dict[str, tuple[str, str | None]] = {
    "index_copy": ("index", None),
    "index_put": ("indices", None),
    "_index_put_impl": ("indices", None),
    "put": ("index", None),
    "scatter": ("index", "dim"),
}


def distinct_indices(op_name: str, sample: Bound) -> dict[str, int | None]:
    """{path (as `tensors_of` names it): dim (None: the whole tensor)} of the index tensor that drawn sets keep
    free of repeats (UNIQUE_WRITES); empty where the op has none, or the sample's index repeats a value there (the
    model writes through repeats itself), or holds negative ones (-1 and size - 1 are one position)."""
    base = op_name.split("::", 1)[-1].split(".", 1)[0].rstrip("_")
    entry = UNIQUE_WRITES.get(base)
    args = dict(sample)
    if entry is None or args.get("accumulate") is True or args.get("reduce") is not None:
        return {}
    name, dim_arg = entry
    v = args.get(name)
    if isinstance(v, (list, tuple)):   # index_put's indices: one index tensor, the other dims taken whole
        found = [(f"{name}[{j}]", x) for j, x in enumerate(v) if isinstance(x, torch.Tensor)]
        if len(found) != 1:
            return {}
        path, t = found[0]
    else:
        path, t = name, v
    if not isinstance(t, torch.Tensor) or not _is_int(t) or t.numel() < 2 or (0 in t.stride()):
        return {}
    d = None
    if dim_arg is not None:
        d = args.get(dim_arg)
        if not isinstance(d, int) or t.dim() == 0:
            return {}
        d %= t.dim()
    if int(t.min()) < 0:
        return {}
    lines = t.reshape(-1) if d is None else t.movedim(d, -1)
    s = lines.sort(dim=-1).values
    if bool((s[..., 1:] == s[..., :-1]).any()):
        return {}
    return {path: d}


def distinct_(t: torch.Tensor, dim: int | None, lo: int, hi: int, gen: torch.Generator) -> None:
    """`t`'s lines along `dim` (None: the whole tensor) drawn again in place from [lo, hi] without repeats (random
    keys on `gen`'s device, sorted: no sync). Left as drawn where the range is shorter than a line, or the keys
    would take more than 64 MB."""
    if t.numel() < 2 or (dim is not None and not 0 <= dim < t.dim()):
        return
    view = t.reshape(1, -1) if dim is None else t.movedim(dim, -1)   # (whole: only its shape is used)
    n = view.shape[-1]
    lines, span = view.numel() // n, hi - lo + 1
    if span < n or lines * span > 1 << 24:
        return
    keys = torch.rand((lines, span), generator=gen, device=gen.device)
    pick = keys.argsort(dim=-1)[:, :n].to(device=t.device, dtype=t.dtype) + lo
    if dim is None:
        t.copy_(pick.view(t.shape))
    else:
        view.copy_(pick.view(view.shape))


def _is_int(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def _plant_nonfinite_(c: torch.Tensor) -> None:
    """NaN, +inf and -inf at a few spread positions of a 1-D view (one NaN for a single element)."""
    n = c.numel()
    spots = [(n // 7, float("nan")), (3 * n // 7, float("inf")), (5 * n // 7, float("-inf")),
             (n - 1, float("nan"))]
    for i, v in spots:
        c[i] = v


# The 'shifted' edge set: every floating input moved by SHIFT[dtype] times its RMS (its spread barely changes). A
# statistic computed in a form that loses digits under an offset (a one-pass variance E[x^2] - E[x]^2, a sum of
# squares before the mean) errs by about u32 * SHIFT^2 of the value there, where eager's (Welford, two-pass) and
# any correct kernel's err by about u32 * SHIFT. Per dtype, the shift where the two sit on either side of the
# tolerance table's row (float32: one-pass 6e-4, a two-pass 3e-5 at 16; float16/bfloat16 rows are looser, and
# their inputs round the offset away above ~1/ulp). Scaling ('large') keeps the offset-to-spread ratio of the
# sample, and fresh draws keep its mean and std: a sample centred near zero never exposed the one-pass form.
SHIFT = {torch.float64: 1e5, torch.float32: 16.0, torch.float16: 512.0, torch.bfloat16: 1024.0}


def _shift_(c: torch.Tensor) -> None:
    """Add SHIFT[dtype] times the RMS of the finite values (1 where it is 0) to every element, within 1 % of the
    format's largest value."""
    # no float64 copy of the tensor: the norm accumulates in float64 inside one reduction (a 1 GB input costs
    # two passes and no temporary); a sample holding non-finite values takes the masked way
    rms = float(torch.linalg.vector_norm(c, dtype=torch.float64)) / math.sqrt(c.numel())
    amax = float(c.abs().max())
    if not (math.isfinite(rms) and math.isfinite(amax)):
        fin = c[torch.isfinite(c)].double()
        rms = float(fin.square().mean().sqrt()) if fin.numel() else 1.0
        amax = float(fin.abs().max()) if fin.numel() else 0.0
    offset = min(SHIFT[c.dtype] * (rms or 1.0), max(0.0, 0.01 * torch.finfo(c.dtype).max - amax))
    c.add_(offset)


# The 'wide' edge set scales every floating input by WIDE: values a few times past the samples' range, where 'large'
# (x1000) overshoots into saturation. A kernel that cut a corner just past what it was shown (a softmax that skips
# exp(z) below z = -9, a tanh that returns +-1 past |x| = 5) erred ~1e-4 there and passed: the samples (std-1
# logits span ~7) and fresh draws (clamped to the samples' range) never reach the cut, and at x1000 the answer is
# the saturated one it returns.
WIDE = 8.0

# The 'small' edge set scales every floating input to an RMS of SMALL_RMS (by a power of two: no rounding), and 'zeros'
# fills every one with 0. A normalization's eps (1e-5, 1e-6) is negligible beside the samples' variance (about 1): a
# kernel that left it out (rsqrt(var) instead of rsqrt(var + eps)) or misplaced it (1 / (std + eps)) erred ~5e-6, within
# every row of the table, and returned NaN or inf on a row of zeros (a padded position, a group of channels a ReLU left
# dead, a batch norm channel whose running variance is 0). At an RMS of 2^-10 the variance (1e-6) is of eps's order and
# eps moves the answer by tens of percent; with every input 0 the answer is eager's finite one (the bias) for any eps.
SMALL_RMS = 2.0**-10


def edge_inputs(sample: Bound, kinds: Sequence[str]) -> list[tuple[str, Bound]]:
    """Edge variants of the floating inputs: 'negated', 'ties' (values rounded to halves), 'large', 'shifted'
    (moved by a large offset, `SHIFT`; float64/32/16 and bfloat16 inputs only), 'wide' (scaled by `WIDE`), 'small' (scaled
    to an RMS of `SMALL_RMS`; a tensor that is all zero or holds non-finite values is left as it is), 'zeros' (every
    element 0), 'nonfinite' (NaN, +inf and
    -inf planted at a few positions of every floating input) and 'signs' (every element of every floating and
    signed integer input negated with probability 1/2, each tensor apart: operands of both signs side by side,
    where 'negated' flips every sign together and leaves integers alone)."""
    out = []
    for kind in kinds:
        b = clone_bound(sample)
        touched = ints = 0
        gen = torch.Generator().manual_seed(len(out))
        for t, _orig in zip(_tensors(b), _tensors(sample)):
            signed_int = kind == "signs" and _is_int(t) and t.dtype.is_signed
            if not (t.is_floating_point() or signed_int) or t.numel() == 0 or (
                    kind == "shifted" and t.dtype not in SHIFT):
                continue
            c = cover(t)
            if kind == "signs":
                g = on_device(gen, c.device)
                flip = torch.rand(c.shape, generator=g, device=g.device) < 0.5
                c.copy_(torch.where(flip.to(c.device), -c, c))
            elif kind == "negated":
                c.neg_()
            elif kind == "ties":
                c.copy_((c.double() * 2).round_() / 2)
            elif kind == "nonfinite":
                _plant_nonfinite_(c)
            elif kind == "shifted":
                _shift_(c)
            elif kind == "zeros":
                c.zero_()
            elif kind == "small":
                rms = float(torch.linalg.vector_norm(c, dtype=torch.float64)) / math.sqrt(c.numel())
                if not (math.isfinite(rms) and rms > 0):
                    continue
                c.mul_(2.0 ** round(math.log2(SMALL_RMS / rms)))
            elif kind in ("large", "wide"):
                amax = float(c.double().abs().max()) or 1.0
                target = min((1e3 if kind == "large" else WIDE) * amax, 0.01 * torch.finfo(t.dtype).max)
                c.copy_(c.double() * (target / amax))
            if t.is_floating_point() and monotone(_orig):
                keep_monotone_(t, _orig)   # a sorted sequence stays one (negated, signs, nonfinite broke it)
            touched += 1
            ints += signed_int
        # 'signs' on one floating tensor alone adds little to 'negated' (each element against a fixed scalar's sign)
        if touched and (kind != "signs" or touched > 1 or ints):
            out.append((kind, b))
    return out


def tensors_of(bound: Bound) -> list[tuple[str, torch.Tensor]]:
    """(argument path, tensor) for every tensor argument."""
    out = []
    for name, v in bound:
        if isinstance(v, torch.Tensor):
            out.append((name, v))
        elif isinstance(v, (list, tuple)):
            out += [(f"{name}[{j}]", x) for j, x in enumerate(v) if isinstance(x, torch.Tensor)]
    return out


class Regenerator:
    """Fresh random values for timed calls, drawn on the tensors' own device with a sample's statistics.

    `refill_(bound)` overwrites every tensor of a bound laid out like the sample: floats from a normal
    distribution with the sample's mean and std clamped to its range, integers uniform over its range,
    booleans with its frequency of True, complex values from a unit complex normal (the distributions of
    `fresh_inputs`, whose sets the candidate already passed; a constant mask or integer tensor is drawn as they
    draw it, not constant). No value repeats from call to call, so a result cannot be memoised (integers kept with
    `keep_ints`, and a constant 0, excepted).
    """

    def __init__(self, sample: Bound, seed: int, *, keep_ints: bool = False,
                 distinct: dict[str, int | None] | None = None):
        self.stats = []
        devices = set()
        for path, t in tensors_of(sample):
            devices.add(t.device)
            if keep_ints and _is_int(t):
                self.stats.append(("keep", None))
            elif t.dtype == torch.bool:
                p = float(t.float().mean()) if t.numel() else 0.5
                # A constant mask (all True, all False) drawn with its own frequency stayed constant in every timed
                # call, and a memo of the answer paid (red team 2026-12-06g: 64 of 64 timed calls of a sum of an
                # all-True mask). Half and half, as `refill_like_` draws the fresh sets the candidate passed.
                self.stats.append(("bool", 0.5 if p in (0.0, 1.0) else p))
            elif t.is_complex():
                # Drawn as fresh sets draw them (unit complex normal). Kept as the slot's base held them, every timed
                # call of a complex card was a set verification had run, and a memo of its answers paid.
                self.stats.append(("complex", None))
            elif t.is_floating_point():
                mean, std, lo, hi = _stats(t)
                if std <= 0.0:
                    std = max(abs(mean) * 0.1, 1e-3)
                    lo, hi = -math.inf, math.inf
                self.stats.append(("float", (mean, std, lo, hi, t.clone() if monotone(t) else None)))
            else:
                _, _, lo, hi = _stats(t)
                if int(lo) == int(hi) != 0 and t.dim() > 0 and (distinct or {}).get(path, -1) == -1:
                    # A constant integer tensor (an attention mask of ones) likewise: each element its value or one
                    # step toward zero, as `refill_like_` draws it (64 of 64 timed calls of a cumsum of ones were
                    # answered from a memo). A constant 0 stays: a step away from it may index past a size.
                    lo = int(lo)
                    self.stats.append(("int pair", (lo, toward_zero(lo))))
                    continue
                # (lo, hi, the rising rows to keep, the dim whose lines repeat nothing: -1 none, None the whole)
                self.stats.append(("int", (int(lo), int(hi), t.clone() if monotone(t) else None,
                                           (distinct or {}).get(path, -1))))
        device = next(iter(devices)) if devices else torch.device("cpu")
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def state(self) -> torch.Tensor:
        """The generator's state (host memory, no sync): `redraw_` with it draws what the next `refill_` draws."""
        return self.gen.get_state()

    def redraw_(self, bound: Bound, state: torch.Tensor) -> None:
        """Draw again, into `bound`, the values the `refill_` that followed `state()` drew (the generator's own
        position is kept). Tensors kept as they were (`keep`) are left alone."""
        now = self.gen.get_state()
        self.gen.set_state(state)
        try:
            self.refill_(bound)
        finally:
            self.gen.set_state(now)

    def kept(self, bound: Bound) -> list[torch.Tensor]:
        """The tensors of `bound` that `refill_` leaves as they are (integers kept with `keep_ints`)."""
        return [t for _, t in self.kept_named(bound)]

    def kept_named(self, bound: Bound) -> list[tuple[str, torch.Tensor]]:
        """`kept`, each with its path in `bound` (as `tensors_of` names it)."""
        return [(path, t) for (path, t), (kind, _) in zip(tensors_of(bound), self.stats) if kind == "keep"]

    def refill_(self, bound: Bound) -> None:
        for (_, t), (kind, p) in zip(tensors_of(bound), self.stats):
            c = cover(t)
            if c.numel() == 0 or kind == "keep":
                continue
            if kind == "bool":
                c.copy_(torch.rand(c.shape, device=c.device, generator=self.gen) < p)
            elif kind == "complex":
                if c.dtype in (torch.complex64, torch.complex128):
                    torch.view_as_real(c).normal_(0.0, math.sqrt(0.5), generator=self.gen)
                else:  # complex32: draw in complex64
                    tmp = torch.empty(c.shape, dtype=torch.complex64, device=c.device)
                    torch.view_as_real(tmp).normal_(0.0, math.sqrt(0.5), generator=self.gen)
                    c.copy_(tmp)
            elif kind == "int pair":
                value, step = p
                c.copy_(torch.where(torch.rand(c.shape, device=c.device, generator=self.gen) < 0.5, value, step))
            elif kind == "int":
                lo, hi, rising, unique_dim = p
                c.random_(lo, hi + 1 if hi < torch.iinfo(c.dtype).max else hi, generator=self.gen)
                if rising is not None:
                    keep_monotone_(t, rising)
                if unique_dim != -1:
                    distinct_(t, unique_dim, lo, hi, self.gen)
            else:
                mean, std, lo, hi, rising = p
                if c.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
                    c.normal_(mean, std, generator=self.gen).clamp_(lo, hi)
                else:  # float8 and friends: draw in float32
                    tmp = torch.empty(c.shape, dtype=torch.float32, device=c.device)
                    c.copy_(tmp.normal_(mean, std, generator=self.gen).clamp_(lo, hi))
                if rising is not None:
                    keep_monotone_(t, rising)


# Integer arguments that hold values (operands of arithmetic), by name: `wide_int_inputs` moves these and no other. An
# index, an offset, a length or a class target is not one: past its range eager refuses it, on the GPU with a
# device-side assert. Nor is an integer exponent: a correct kernel that multiplies in a loop would run 2^32 times.
INT_VALUE_ARGS = frozenset({"self", "other", "input", "tensor1", "tensor2", "x1", "x2"})


def wide_int_inputs(sample: Bound) -> Bound | None:
    """`sample` with every integer tensor of an argument that holds values (`INT_VALUE_ARGS`, one dim or more) moved
    away from zero (int64: by 2^32, past int32; int32: 2^30, whose sums leave int32; int16: 2^14; int8 and uint8: 2^6;
    within the dtype's range), sign kept; None where it has none. Samples of small integers (ids, counts, masks) never
    showed a kernel that narrowed its arithmetic: one that added int64 operands in 32-bit `int`, or summed int32
    values (eager sums them in int64) in an int32 accumulator, matched eager on every set."""
    out = clone_bound(sample)
    moved = False
    for name, v in out:
        if name not in INT_VALUE_ARGS:
            continue
        for t in (v if isinstance(v, (list, tuple)) else [v]):
            if not isinstance(t, torch.Tensor) or not _is_int(t) or t.dim() == 0 or t.numel() == 0:
                continue
            info = torch.iinfo(t.dtype)
            step = 2 ** (32 if info.bits == 64 else info.bits - 2)
            c = cover(t)
            w = c.to(torch.int64)
            c.copy_(torch.where(w < 0, w - step, w + step).clamp_(info.min, info.max))
            moved = True
    return out if moved else None


HOT_LOGIT = 40.0   # the largest attention logit (q·k times the softmax scale) of the 'hot logits' edge set


def hot_logits_inputs(sample: Bound, target: float = HOT_LOGIT) -> Bound | None:
    """`sample` with `query` scaled so that its largest logit (q·k times the softmax scale, estimated on the first
    256 query rows) is about `target`; None where it has no floating `query` and `key` or their logits are all 0.
    Samples of random-init or small models have logits of about 1, where a kernel that skips the softmax's max
    subtraction (exp(s) rounded to float16 overflows past 11.09) matches eager; real attention meets logits of
    20-50 (attention sinks, massive activations). The output stays a convex combination of `value`: nothing
    overflows in eager (red team 2026-12-06g)."""
    args = dict(sample)
    q, k = args.get("query"), args.get("key")
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.is_floating_point()
            and k.is_floating_point() and q.dim() >= 2 and q.shape[-1] == k.shape[-1] and q.numel() and k.numel()):
        return None
    scale = args.get("scale")
    scale = float(scale) if isinstance(scale, (int, float)) else 1.0 / math.sqrt(q.shape[-1])
    qs, kk = q[..., :256, :].float(), k.float()
    if qs.dim() == kk.dim() and qs.shape[:-2] != kk.shape[:-2]:   # grouped heads: q's heads over k's
        try:
            kk = kk.expand(*qs.shape[:-2], *kk.shape[-2:]) if kk.shape[-3] == 1 else \
                kk.repeat_interleave(qs.shape[-3] // kk.shape[-3], dim=-3)
        except (RuntimeError, ZeroDivisionError, IndexError):
            return None
    try:
        top = float((qs @ kk.transpose(-1, -2)).abs().amax()) * abs(scale)
    except RuntimeError:
        return None
    if not (math.isfinite(top) and top > 0):
        return None
    out = clone_bound(sample)
    qq = dict(out)["query"]
    cover(qq).mul_(target / top)
    return out


def unaliased_inputs(samples: Sequence[Bound], seed: int) -> Bound | None:
    """The first sample whose tensor arguments share storage (`mul(x, x)`, `cat([x, x])`, two views of one buffer),
    with every tensor after the first on a storage given storage of its own (same layout) and fresh values drawn
    like its own; None where no sample has such arguments. A cast's guard keys aliasing only for ops that write an
    argument, so the kernel of an aliased card also runs `mul(a, b)` of the same layouts: one that read `self`
    twice passed every set, each drawn with the sample's aliasing."""
    for sample in samples:
        seen: set[tuple] = set()
        moved = False
        gen = torch.Generator().manual_seed(seed)
        out: Bound = []
        for (name, v), (_, old) in zip(clone_bound(sample), sample):
            items = v if isinstance(v, (list, tuple)) else [v]
            olds = old if isinstance(old, (list, tuple)) else [old]
            new = []
            for x, o in zip(items, olds):
                if isinstance(x, torch.Tensor) and x.numel():
                    if _key(x) in seen:
                        (_, x), = clone_bound([(name, x)])
                        refill_like_(x, o, gen)
                        moved = True
                    seen.add(_key(x))
                new.append(x)
            out.append((name, new if isinstance(v, (list, tuple)) else new[0]))
        if moved:
            return out
    return None


# Index arguments whose legal range is a size of another argument, not what the samples held: (op base name) ->
# (index argument, the argument whose size bounds it, the dim of that size: an int, the name of the `dim`
# argument, or None for the bounding tensor's element count, as where a `dim` argument is None). A kernel that
# mishandles ids past the samples' largest (16-bit index arithmetic, an assumed vocabulary) passed every set drawn
# within the samples' range. Ops whose repeated indices leave eager's answer undefined (scatter, index_copy,
# index_put) are not here: a full-range draw repeats indices.
INDEX_BOUNDS: dict[str, tuple[str, str, int | str | None]] = {
    "embedding": ("indices", "weight", 0),
    "_embedding_bag": ("indices", "weight", 0),
    "embedding_bag": ("indices", "weight", 0),
    "index_select": ("index", "self", "dim"),
    "gather": ("index", "self", "dim"),
    "index_add": ("index", "self", "dim"),
    "index_fill": ("index", "self", "dim"),
    "scatter_add": ("index", "self", "dim"),
    "scatter_reduce": ("index", "self", "dim"),
    "index_reduce": ("index", "self", "dim"),
    "take_along_dim": ("indices", "self", "dim"),
    "take": ("index", "self", None),
}


def index_range_inputs(op_name: str, sample: Bound, seed: int) -> Bound | None:
    """Sample `sample` with its index argument drawn over the op's whole legal range [0, size) (INDEX_BOUNDS),
    or None where the op has no such argument or the range adds nothing the sample did not reach."""
    base = op_name.split("::", 1)[-1].split(".", 1)[0]
    entry = INDEX_BOUNDS.get(base)
    if entry is None:
        return None
    idx_name, of, dim = entry
    args = dict(sample)
    index, bounded = args.get(idx_name), args.get(of)
    d = args.get(dim) if isinstance(dim, str) else dim
    if not (isinstance(index, torch.Tensor) and isinstance(bounded, torch.Tensor) and _is_int(index)
            and index.numel()):
        return None
    if d is None:
        size = bounded.numel()
    elif isinstance(d, int) and bounded.dim():
        size = int(bounded.shape[d])
    else:
        return None
    if size <= 1 or int(index.max()) >= size - 1:
        return None
    out = clone_bound(sample)
    gen = torch.Generator().manual_seed(seed)
    new = dict(out)[idx_name]
    vals = torch.randint(0, size, new.shape, generator=gen, dtype=torch.int64)
    vals.view(-1)[0] = size - 1   # the last legal id, always
    new.copy_(vals.to(new.device))
    return out
