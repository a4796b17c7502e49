"""A model's example inputs, varied from forward to forward while whole forwards are timed.

The whole-model check and the end-to-end benchmarks call one forward closure over the user's example inputs,
forward after forward. Where every forward is the same, a kernel that memoises its answer (keyed by a hash of
all its inputs, so every answer is right) returns it at the cost of reading its inputs, and on a compute-bound
op (a GEMM reads O(n²) for O(n³) work) the model reads as much faster than any user of it would find, who
never calls it twice on the same values. The lane gives every timed call new values, so such a kernel gains
nothing there; the model-level figures had no such defence.

`Varied.record(module, forward)` finds the tensors the forward passes to the root module (a forward pre-hook,
two forwards: the same tensor objects both times, else nothing can be varied in place). `before()` copies the
next variant of them in, in place, outside the timed window (`time_steady(run, before=...)`); variant j is drawn
afresh from the example inputs and a seed of j's own, so no two forwards of a check see the same inputs (a memo
of every answer, however large, never hits) and `seek(new_pair())` before each arm of a pair gives both arms
the same ones. A floating tensor is rolled along its largest dimension and moved by 2 % of its spread with
noise (every element new, the distribution kept); integer ids are drawn afresh over the example's [min, max]
(every id there is one a table the example indexes has; among the example's own values where one is negative);
masks (0/1, or floating ones of two values: an additive mask) are rolled over all their elements; one-element tensors (a timestep, a decode step's token),
booleans, expanded views, inference tensors, the model's own parameters and sorted rows (offsets) are left
alone. `restore()` puts the example inputs back. A forward that raises, or whose output turns degenerate, on
a variant leaves the inputs as they were (`why` says so), as do a TorchScript root and a forward that builds
its inputs anew each call.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

NOISE = 0.02          # of a floating input's standard deviation


class Varied:
    def __init__(self, tensors: list[Any], seed: int = 0, why: str | None = None, held: frozenset[int] = frozenset(),
                 tables: tuple[int, ...] = (), names: list[str] | None = None):
        """`held`: the storages (data pointers) of the model's parameters and buffers: an input that is one of
        them (or a view of one) stays as it is. `tables`: the sizes of the model's embedding tables: integer ids
        below one are drawn over it (a decode step's one token too)."""
        import torch

        self.tensors = tensors            # the forward's own input tensors, varied in place
        # per tensor: how it varies (None: it stays), the example's values, and an integer tensor's distinct ones
        names = names or [""] * len(tensors)
        self.kinds = [_kind(t, held, tables, name) for t, name in zip(tensors, names)]
        self.originals = [t.clone() if k is not None else None for t, k in zip(tensors, self.kinds)]
        self.values = [torch.unique(t) if k == "ids" else _table(t, tables) if k == "token" else
                       _spread(t) if k == "float" else None for t, k in zip(tensors, self.kinds)]
        self.seed = seed
        self.why = why if why is not None else None if any(self.kinds) else (
            "every input tensor is a mask, a boolean, a single element or an expanded view: nothing to vary")
        self.next = 0
        self.high = 0   # variants drawn so far (the next pair starts here)

    @classmethod
    def none(cls, why: str) -> Varied:
        return cls([], why=why)

    @classmethod
    def record(cls, module: Any, forward: Callable[[], Any], seed: int | None = None,
               judge: Callable[[Any], str | None] | None = None) -> Varied:
        """Find the forward's input tensors; `judge(output)` (None: any output stands) says why a variant's
        output cannot stand (degenerate where the example's is not)."""
        import torch
        from torch.utils._pytree import tree_flatten

        seen: list[list[Any]] = []

        names: dict[int, str] = {}

        def hook(m: Any, args: Any, kwargs: Any) -> None:
            found = []
            for i, a in enumerate(args):
                found += [(f"arg{i}", t) for t in tree_flatten(a)[0] if isinstance(t, torch.Tensor)]
            for k, v in kwargs.items():
                found += [(k, t) for t in tree_flatten(v)[0] if isinstance(t, torch.Tensor)]
            names.update((id(t), n) for n, t in found)
            seen.append([t for _, t in found])

        try:
            handle = module.register_forward_pre_hook(hook, with_kwargs=True)
        except RuntimeError:   # a TorchScript root refuses Python hooks
            return cls.none("the model's root module takes no Python hooks (TorchScript)")
        try:
            with torch.no_grad():
                forward()
                forward()
        finally:
            handle.remove()
        if len(seen) < 2 or not seen[0]:
            return cls.none("the forward passes no tensor to the model's root module")
        first, again = seen[0], seen[-1]
        # (a tensor made anew each call, a decode step's fresh cache, cannot be varied in place: the rest can)
        first = [a for a, b in zip(first, again) if a is b] if len(first) == len(again) else []
        if not first:
            return cls.none("the forward makes its inputs anew each call: nothing to vary in place")
        held = frozenset(t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()])
        tables = tuple(sorted({m.num_embeddings for m in module.modules() if isinstance(m, torch.nn.Embedding)}))
        varied = cls(first, seed if seed is not None else random.SystemRandom().getrandbits(40), held=held,
                     tables=tables, names=[names.get(id(t), "") for t in first])
        if varied.why:
            return varied
        bad = varied._trial(forward, judge)
        if bad and sum(k is not None for k in varied.kinds) > 1:
            # one input the model cannot take varied (a mask of its own kind) need not hold the others back: each
            # is tried alone, and those that pass are varied together
            kinds = list(varied.kinds)
            for i, k in enumerate(kinds):
                if k is not None:
                    varied.kinds = [k if j == i else None for j in range(len(kinds))]
                    if varied._trial(forward, judge):
                        kinds[i] = None
            varied.kinds = kinds
            if any(kinds):
                bad = varied._trial(forward, judge)
        return cls.none(bad) if bad else varied

    def describe(self) -> str:
        if self.why:
            return f"the same inputs every forward ({self.why})"
        k = sum(kind is not None for kind in self.kinds)
        return f"new variants of the example inputs every forward ({k} of {len(self.tensors)} tensors varied)"

    def new_pair(self, calls: int = 2) -> int:
        """The first variant of a new pair of arms, each making `calls` forwards: `seek` it before each arm."""
        first, self.high = self.high, self.high + calls
        return first

    def seek(self, j: int) -> None:
        self.next = j

    def before(self) -> None:
        """Copy the next variant in (nothing where nothing varies)."""
        if self.why:
            return
        import torch

        j, self.next = self.next, self.next + 1
        self.high = max(self.high, self.next)
        with torch.no_grad():
            for i, (t, o, kind, values) in enumerate(zip(self.tensors, self.originals, self.kinds, self.values)):
                if kind is not None:   # (each tensor a draw of its own: two alike drew the same values)
                    t.copy_(_vary(o, kind, values, (self.seed * 1_000_003 + j) * 101 + i))

    def restore(self) -> None:
        import torch

        with torch.no_grad():
            for t, o, kind in zip(self.tensors, self.originals, self.kinds):
                if kind is not None:   # (only what `before` writes: an inference tensor refuses any write)
                    t.copy_(o)

    def _trial(self, forward: Callable[[], Any], judge: Callable[[Any], str | None] | None) -> str | None:
        """Why the forward cannot run on the variants (None: it can): two of them tried."""
        import torch

        try:
            for _ in range(2):
                self.before()
                with torch.no_grad():
                    out = forward()
                why = judge(out) if judge else None
                if why:
                    return f"on varied inputs the model's output is {why}"
        except Exception as e:  # noqa: BLE001 - any failure only means the inputs stay as they are
            first = (str(e).strip().splitlines() or [""])[0][:160]
            return f"the forward fails on varied inputs ({type(e).__name__}: {first})"
        finally:
            try:
                self.restore()
            except Exception:  # noqa: BLE001 - a tensor that refused the variant refuses its example too,
                pass           # and was never written: the message above says why
        return None


def _table(t: Any, tables: tuple[int, ...]) -> int | None:
    """The smallest embedding table of the model that integer tensor `t`'s ids all index (None: none)."""
    top = int(t.max())
    return next((n for n in tables if n > top), None) if int(t.min()) >= 0 else None


def _token_name(name: str) -> bool:
    """An argument that carries token ids (`input_ids`, `decoder_input_ids`, the first positional one), not
    positions (`position_ids`, `cache_position`)."""
    low = name.lower()
    return name == "arg0" or ("ids" in low and "position" not in low and "cache" not in low) or low == "tokens"


def _kind(t: Any, held: frozenset[int] = frozenset(), tables: tuple[int, ...] = (), name: str = "") -> str | None:
    """How input tensor `t` varies: 'float', 'token' (integer ids an embedding table of the model indexes: drawn
    over it, one element too: a decode step's token), 'ids', 'mask' (0/1 values: rolled only), or None (it
    stays: one element otherwise, a boolean, complex, expanded, an inference tensor (no in-place writes outside
    inference mode), a parameter or buffer of the model, or sorted rows: offsets and cumulative lengths)."""
    import torch

    if t.numel() == 1 and not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool) and \
            not t.is_inference() and t.untyped_storage().data_ptr() not in held and _token_name(name) and \
            _table(t, tables) is not None:
        return "token"   # (a one-element position drawn over the vocabulary ran past the model's positions)
    if t.numel() <= 1 or t.dtype == torch.bool or t.is_complex():
        return None
    if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):   # expanded: one element seen many times
        return None
    if t.is_inference() or t.untyped_storage().data_ptr() in held or _offsets(t):
        return None
    values = torch.unique(t)
    if t.is_floating_point():
        # an additive mask (0 and finfo.min, or -inf): noise would make it inf and NaN; rolled only
        return "float" if values.numel() > 2 else "mask" if values.numel() == 2 else None
    if values.numel() < 2:
        return None
    if bool(((values == 0) | (values == 1)).all()):
        return "mask"
    return "token" if _table(t, tables) is not None and _token_name(name) else "ids"


def _offsets(t: Any) -> bool:
    """Sorted rows that are offsets or boundaries, not ids that happen to rise (two tokens in order): rows (last
    dim) that never decrease, floating ones of three values or more, integer ones of three or more or starting at
    0 (cumulative lengths)."""
    if t.dim() == 0 or t.shape[-1] < 2 or not bool((t[..., 1:] >= t[..., :-1]).all()):
        return False
    if t.is_floating_point():
        return t.shape[-1] >= 3 and bool(t.isfinite().all())
    return t.shape[-1] >= 3 or bool((t[..., 0] == 0).all())


def _vary(t: Any, kind: str, values: Any, seed: int) -> Any:
    """Variant `seed` of example input `t`: floats rolled along their largest dimension and moved by noise;
    ids drawn afresh (uniform over the example's [min, max] where it holds no negative value, every integer there
    an id a table indexed by the example's largest has; else among the example's own values); masks rolled over
    all their elements."""
    import torch

    rng = random.Random(seed)
    gen = torch.Generator(device=t.device).manual_seed(rng.getrandbits(62))
    if kind == "mask":   # (0/1 integers, or a floating mask of two values)
        flat = t.reshape(-1)
        return torch.roll(flat, rng.randrange(1, flat.numel())).reshape(t.shape)
    if kind == "token":   # (values: the table's size)
        return torch.randint(0, values, t.shape, generator=gen, device=t.device, dtype=t.dtype)
    if kind == "ids":
        lo, hi = int(values[0]), int(values[-1])
        if lo >= 0:
            return torch.randint(lo, hi + 1, t.shape, generator=gen, device=t.device, dtype=t.dtype)
        pick = torch.randint(0, values.numel(), t.shape, generator=gen, device=t.device)
        return values[pick]
    dim = max(range(t.dim()), key=lambda d: t.shape[d])
    out = torch.roll(t, rng.randrange(1, t.shape[dim]), dim) if t.shape[dim] > 1 else t.clone()
    if values:   # (values: the example's spread, taken once; 0 where it takes no noise)
        noise = torch.randn(t.shape, generator=gen, device=t.device, dtype=torch.float32)
        out = (out.float() + noise * (NOISE * values)).to(t.dtype)
    return out


def _spread(t: Any) -> float:
    """The standard deviation a floating input's noise is scaled by: 0 where it holds a non-finite value or its
    spread overflows (no noise then)."""
    import torch

    if not bool(torch.isfinite(t).all()):
        return 0.0
    spread = float(t.float().std())
    return spread if 0 < spread < float("inf") else 0.0
