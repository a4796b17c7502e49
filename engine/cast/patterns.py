"""Pattern cards under `torch.compile`: a chain card that is not one module's forward (SiLU(gate) * up,
GroupNorm → SiLU, a residual add and the norm after it, AdaLN's `x * (1 + scale) + shift`) becomes one
registered op inside the graphs Inductor compiles.

From a chain signature (`engine.capture.chains.chain_signature`) this module builds:

- the **pattern**: the chain's members as Inductor's post-grad graph spells them. The chain is run
  (`run_chain`) under `make_fx` with Inductor's decomposition table, then put through the graph passes
  the installed torch's Inductor runs before ours (joint-graph and post-grad passes: no-op removal, dead
  code, `view` → `reshape`, dtype round trips some versions drop), so `_to_copy` appears as `prims.convert_element_type`,
  `native_group_norm` as its `var_mean`/`rsqrt`/… decomposition, `silu` as `x / (1 + exp(-x))`. Every
  non-tensor argument is literal (sizes included) and matches only a constant of its own type and bits (Inductor's
  matcher alone takes 3 for 3.0 and -0.0 for 0.0: `_Exact`): a match computes exactly what the card computes. One
  pattern per non-empty subset of the chain's outputs, most outputs first, because the compiled graph
  drops outputs nothing reads (GroupNorm's mean and rstd).
- the **replacement**: a call to `kforge::chain_<digest>` (an op defined with `torch.library`; its fake
  implementation runs the chain on fake tensors). Its real implementation looks up the exact signature of
  its inputs (`engine.cast.guard.tensor_key`: dtype, shape, strides, alignment, device) in the table of
  the cast's variants for that pattern: a hit runs the variant, a miss runs `run_chain` (eager for the
  card) when the inputs have the card's shapes, else the pattern's own traced graph (exactly what the
  compiled graph would have computed). The guard runs per call; a hit's outputs are laid out as the fake
  implementation promised the compiled code (copied where eager's strides differ from the meta kernels').
- the **check at compile time** (`extra_check`): no matched call passes a keyword argument its pattern lacks
  other than at its default (Inductor's matcher ignores those: `x.sum(-1)` matched `x.sum(-1, dtype=torch.float64)`),
  the matched inputs' devices and dtypes are the card's, and some variant that may run under the compile's
  target was proven for sizes they can have (equal at every concrete size; a symbolic one is left to the
  runtime guard). A chain's op graph recurs at other sizes
  (Gemma's RMSNorm: one structure for the q/k norms and the hidden-state norms); a match no variant can
  serve would run the chain eagerly on every call, in place of Inductor's fused code (Gemma under
  torch.compile: 0.24x with one variant covering 2 of 28 matches). Such a match keeps Inductor's code and
  is counted (`PatternOp.size_declines`).

A conv-bias fold card (a chain `add.Tensor(in0, in1[1,C,1,1])` → `native_group_norm` → …, `_is_fold`: the
per-channel add a convolution's bias is, folded into the GroupNorm's kernel) has nothing to match in a post-grad
graph as it comes: there the bias is an argument of `aten.convolution`, and Inductor splits it off into an add
only while lowering (on CUDA; its CPU convolution keeps it). So before matching, the bias of each convolution
whose output could be such a card's first input is split off into that add (`_split_conv_biases`), and after
matching every split no pattern took is put back (`_restore_splits`): the graph then is what it was, and a
match leaves the convolution without its bias and the card's op adding it.

A chain that cannot become a pattern (an in-place member, a random op, a trace that fails) is reported
in `PatternSet.problems`, and each compile records how many times each pattern matched.
Inference only: `PatternSet.apply` is not called for a graph traced with grad enabled (see compose.py).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.capture.chains import CHAIN_OP, chain_card_id, run_chain
from engine.capture.twins import untwinned
from engine.cast.guard import descriptor_key, tensor_key
from engine.cast.runtime import allowed
from engine.ops import may_have_sizes, resolve_op

_OPS: dict[str, Any] = {}          # op name -> the registered op (once per process)
_LIB: Any = None                   # the torch.library.Library fragment they are defined in
_TABLES: dict[str, PatternOp] = {}
_LOCK = threading.Lock()
# While `PatternSet._apply` rewrites a graph: .sizes, per pattern op, the input sizes its set's variants for the
# compile's target were proven for; .declined, the places a match was left to Inductor for its sizes.
_APPLYING = threading.local()
# How patterns are traced and matched; part of Inductor's cache keys, so a graph rewritten by an older rule is
# never served again (2: chains holding an op the cast keeps out of the decompositions are traced with it kept;
# 3: kept only at the sizes the veto keeps it, those of the cast's op variants; 4: a match is replaced only
# where its sizes can be a variant's; 5: a literal matches only one of its own type and bits, `_Exact`;
# 6: a matched call's keyword arguments the pattern lacks must be at their defaults; 7: the op is a torch.library
# definition, no longer a custom_op; 8: convolution biases split off where a conv-bias fold card may match,
# restored where none did).
PATTERN_TRACE = 8
MISS_KEYS = 4                      # distinct inputs of missed calls kept per pattern op, to explain misses
MAX_OUTPUT_SUBSETS = 8             # a chain with more outputs gets patterns for its full set and singles only
_RANDOM_OPS = ("rand", "dropout", "bernoulli", "normal", "multinomial", "uniform", "exponential")


@dataclass
class PatternCard:
    """One chain card and the variant that serves it: `plan(inputs) -> outputs` (every chain output, in
    the signature's order), with a `hits` counter (an `engine.cast.runtime.Plan` fits)."""

    signature: dict[str, Any]
    plan: Callable[[list[torch.Tensor]], Sequence[torch.Tensor]]

    @property
    def card_id(self) -> str:
        return chain_card_id(self.signature)


class PatternOp:
    """The registered op of one pattern structure: its guard table (exact input keys → plans) and the
    fallbacks. Shared by every cast whose cards have this structure; a cast's entries are its own."""

    def __init__(self, name: str, signature: dict[str, Any], graph: torch.fx.GraphModule):
        self.name, self.signature, self.graph = name, signature, graph
        self.layouts = tuple((tuple(a["shape"]), tuple(a["stride"])) for a in signature["args"])
        first = untwinned(signature)["args"][0] if signature["args"] else None
        self._traced_contiguous = first is not None and torch.empty_strided(
            first["shape"], first["stride"], device="meta").is_contiguous()
        self.table: dict[tuple, Any] = {}
        self.owners: dict[tuple, object] = {}
        self.hits = self.misses = self.target_declines = self.determinism_declines = 0
        self.size_declines = 0  # matches left to Inductor at compile time: no variant has their sizes
        self._strides: dict[tuple, list[tuple[int, ...]]] = {}  # input layouts -> the fake's output strides
        self.miss_keys: list[str] = []  # the first distinct inputs a matched call brought that no variant fits

    def why_missed(self) -> dict[str, Any]:
        """What the compiled graph's calls brought against what the variants were proven for (a pattern that
        matches but never hits: Inductor laid the inputs out otherwise than eager, say)."""
        return {"misses": self.misses, "target_declines": self.target_declines, "calls_brought": list(self.miss_keys),
                "proven_for": [describe_key(k) for k in self.table], "size_declines": self.size_declines}


    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        key = tuple(tensor_key(t) for t in inputs)
        plan = self.table.get(key)
        targets = getattr(plan, "targets", None)
        if targets is not None and not allowed(targets):
            plan = None  # proven, but not under this compile mode: what the graph would have computed
            self.target_declines += 1
        elif getattr(plan, "reorders", False) and torch.are_deterministic_algorithms_enabled():
            plan = None  # its kernels may round otherwise from run to run; deterministic algorithms are on
            self.determinism_declines += 1
        if plan is not None and not (torch.is_grad_enabled() and any(t.requires_grad for t in inputs)):
            self.hits += 1
            plan.hits = getattr(plan, "hits", 0) + 1
            # Eager's strides, as proven, can differ from those the fake implementation promised the compiled code
            # (the meta kernel of CPU native_group_norm gives a channels-last input a contiguous output; eager
            # keeps it channels-last): laid out as promised, or the graph raises, or without its size asserts
            # reads the output with the wrong strides.
            return self._as_promised(_unaliased(list(plan(list(inputs))), inputs), inputs, key)
        self.misses += 1
        if len(self.miss_keys) < MISS_KEYS:
            seen = describe_key(key)
            if seen not in self.miss_keys:
                self.miss_keys.append(seen)
        return self._as_promised(_unaliased(self.fallback(inputs), inputs), inputs, key)

    def _as_promised(self, outs: list[torch.Tensor], inputs: Sequence[torch.Tensor], key: tuple) -> list[torch.Tensor]:
        """The outputs with the strides the fake implementation gave the compiled code for these inputs.
        Inductor lays out the op's inputs by the graph's fake strides, which need not be eager's; the traced
        graph a miss runs then returns other strides than the fake did (the graph asserts them), and a hit's
        variant returns eager's, which some meta kernels do not give (a copy, only where they differ).
        `key`: the inputs' guard key (`tensor_key` each), which with their exact strides (the key normalises
        a size-1 dimension's) names what the fake gave; worked out once per such layout."""
        strides = tuple(t.stride() for t in inputs)
        meta = bool(inputs) and inputs[0].is_meta  # (the key has a device's index, -1 for the CPU and meta)
        want = self._strides.get((key, strides, meta))
        if want is None:
            if any(t.device.type == "meta" or torch._subclasses.fake_tensor.is_fake(t) for t in inputs):
                return outs
            from torch._subclasses.fake_tensor import FakeTensorMode

            with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                fakes = [mode.from_tensor(t) for t in inputs]
                want = [tuple(o.stride()) for o in _unaliased(run_chain(self.signature, fakes), fakes)]
            self._strides[(key, strides, meta)] = want
        return [o if o.stride() == w or o.numel() == 0 else
                torch.empty_strided(o.shape, w, dtype=o.dtype, device=o.device).copy_(o)
                for o, w in zip(outs, want)]

    def fallback(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Eager for the card where the inputs are laid out as captured (its views are valid there), else
        the pattern's traced graph: the very ops the compiled graph held, whose views are reshapes. A first
        input passed as held (channels-last, for a twin's variant) is made contiguous for the graph, which
        was traced with it so (CUDA native_group_norm rejects any other); `_as_promised` lays the outputs out
        as the compiled code asserts."""
        if tuple((tuple(t.shape), tuple(t.stride())) for t in inputs) == self.layouts:
            return list(run_chain(self.signature, list(inputs)))
        ins = list(inputs)
        if ins and isinstance(ins[0], torch.Tensor) and not ins[0].is_contiguous() and self._traced_contiguous:
            ins[0] = ins[0].contiguous()
        return list(self.graph(*ins))


def describe_key(key: tuple) -> str:
    """One line per call: each input's dtype, shape, strides (`*`: a size-1 dim's, which the guard does not
    compare), pointer alignment and device index."""
    parts = []
    for k in key:
        dtype, shape, stride, align, dev = k[0], tuple(k[1]), tuple(k[2]), k[3], k[4]
        strides = ", ".join("*" if n == 1 else str(x) for n, x in zip(shape, stride))
        parts.append(f"{str(dtype).replace('torch.', '')}{list(shape)} s=[{strides}] a={align} d={dev}")
    return "; ".join(parts)


def _unaliased(outs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """A custom op's outputs may alias neither its inputs nor each other: copy any that do."""
    seen = {t.untyped_storage()._cdata for t in inputs if not t.is_meta}  # (is_meta: 0.07 µs, .device 0.3)
    got = []
    for t in outs:
        meta = t.is_meta
        if t._base is not None or (not meta and t.untyped_storage()._cdata in seen):
            t = t.clone()
        if not meta:
            seen.add(t.untyped_storage()._cdata)
        got.append(t)
    return got


@dataclass
class BuiltPattern:
    op: PatternOp
    outputs: tuple[int, ...]           # which of the chain's outputs this pattern's anchors are
    expr: Any                          # the PatternExpr
    devices: tuple[tuple[str, torch.dtype], ...]
    key: tuple = ()                    # the variant's entry in the op's guard table, and its plan
    plan: Any = None
    first: tuple = ()                  # (shape, strides) of the card's first input, as captured


@dataclass
class PatternSet:
    """A cast's pattern cards, ready to apply to post-grad graphs (`apply`), with what could not be
    made a pattern (`problems`: card id → reason) and a `uuid()` for Inductor's cache keys."""

    owner: object
    built: list[BuiltPattern] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)
    digest: str = ""
    matched: dict[str, int] = field(default_factory=dict)  # pattern op → matches over every graph rewritten
    seconds: float = 0.0  # spent in `apply`, over every graph rewritten (its share of compile time)
    # Convolution biases split off for conv-bias fold cards, over every graph rewritten: "split", and of those
    # "reverted" (no pattern took the add, the bias was put back). A fold card that never matches shows as
    # splits all reverted.
    folds: dict[str, int] = field(default_factory=lambda: {"split": 0, "reverted": 0})
    # Split biases off convolutions on the CPU too. For tests only: Inductor keeps a CPU convolution's bias
    # (mkldnn's convolution adds it), so there a split is not what lowering would do anyway.
    split_on_cpu: bool = False
    cards: list[PatternCard] = field(default_factory=list, repr=False)
    _passes: dict[int, Any] = field(default_factory=dict, repr=False)  # id(BuiltPattern) → its matcher pass
    # Per set of ops the cast's backend keeps out of Inductor's decompositions (compose.inductor_state): the
    # patterns of the chains holding one of them, traced with that op kept, as the compiled graph then holds it.
    _under_vetoes: dict[tuple, PatternSet] = field(default_factory=dict, repr=False)

    def prepare(self, vetoed: tuple, kept_ops: Sequence[Any]) -> PatternSet:
        """The patterns to apply while the ops `kept_ops` are kept whole in the graph (the cast serves them as
        op variants; `vetoed` is compose's record of them and of the sizes they are kept at). The trace runs
        the veto itself, so a pattern holds the op at the sizes the graph keeps it and its decomposition at
        the others. A chain holding such an op is traced again, now,
        inside compose.inductor_state, whose decomposition table keeps the op: the pattern then holds the op
        itself where the default trace holds its decomposition, which a graph with the op kept never matches
        (a cast with group_norm op variants and GroupNorm → SiLU pattern cards matched none on the CPU).
        Chains without such an op keep their patterns. Built once per `vetoed` (it must name the sizes: the
        same ops kept at other sizes trace differently); returns this set when none
        is affected."""
        kept = {str(op) for op in kept_ops}
        if not kept or not any(str(resolve_op(n["op"])) in kept for c in self.cards
                               for n in c.signature["chain"]["nodes"]):
            return self
        got = self._under_vetoes.get(vetoed)
        if got is None:
            got = build(self.owner, self.cards)
            got.matched = self.matched  # one count per pattern op, whichever trace it came from
            got.folds = self.folds
            for card_id, why in got.problems.items():  # a chain that cannot be traced with the op kept
                self.problems.setdefault(card_id, f"{why} (traced with {', '.join(sorted(kept))} kept whole)")
            self._under_vetoes[vetoed] = got
        return got

    def everything_built(self) -> list[BuiltPattern]:
        """Its patterns and those of its traces under vetoes (`prepare`)."""
        return [*self.built, *(bp for v in self._under_vetoes.values() for bp in v.built)]

    def apply(self, graph: torch.fx.Graph, target: str | None = None, vetoed: tuple = ()) -> dict[str, int]:
        """Replace every match in `graph`; returns matches per op name (0 for a pattern that found none).
        `target` (the compile mode's, runtime.compile_target): only the patterns whose variant was proven
        for it (or records no targets); the others keep Inductor's own code, which their op would only
        have run more slowly (each call declined, the chain run eagerly). `vetoed`: what the backend kept
        out of the decompositions for this graph; the patterns `prepare` traced for it are applied. Where a
        conv-bias fold card may match, convolution biases are split off first and put back where none did."""
        import time

        t0 = time.perf_counter()
        counts = self._under_vetoes.get(vetoed, self)._apply(graph, target, self.split_on_cpu)
        self.seconds += time.perf_counter() - t0
        return counts

    def _apply(self, graph: torch.fx.Graph, target: str | None, split_on_cpu: bool = False) -> dict[str, int]:
        from torch._inductor.pattern_matcher import PatternMatcherPass

        counts: dict[str, int] = {}
        _APPLYING.sizes, _APPLYING.declined = self._sizes(target), set()
        applied: set[tuple] = set()
        folds = self._fold_sizes(target)
        splits = _split_conv_biases(graph, folds, split_on_cpu) if folds else []
        try:
            # Larger chains first (`build`): a fold card's add → GroupNorm → SiLU is tried before a plain
            # GroupNorm → SiLU card could take the same GroupNorm, with the split-off add as its input.
            for bp in self.built:
                targets = getattr(bp.plan, "targets", None)
                if target is not None and targets is not None and target not in targets:
                    continue
                counts.setdefault(bp.op.name, 0)
                if (bp.op.name, bp.outputs) in applied:
                    continue  # the same pattern and op (a chain's twin, another variant of it): matched once
                applied.add((bp.op.name, bp.outputs))
                pm = self._passes.get(id(bp))
                if pm is None:  # registered once, applied to every graph compiled with the set
                    pm = self._passes[id(bp)] = PatternMatcherPass(pass_name=f"kforge-{bp.op.name}")
                    _register(bp, pm)
                counts[bp.op.name] += pm.apply(graph)
        finally:
            reverted = _restore_splits(graph, splits)
        self.folds["split"] += len(splits)
        self.folds["reverted"] += reverted
        if counts:
            graph.eliminate_dead_code()
        for name, n in counts.items():
            self.matched[name] = self.matched.get(name, 0) + n
        for name, _ in _APPLYING.declined:
            _TABLES[name].size_declines += 1
        _APPLYING.sizes = _APPLYING.declined = None
        return counts

    def _sizes(self, target: str | None) -> dict[str, set[tuple]]:
        """Per pattern op: the input sizes of this set's variants that may run under `target`. This set's own,
        not the op's shared table (which other casts fill): what a graph gets is what its cache key names."""
        out: dict[str, set[tuple]] = {}
        for bp in self.built:
            targets = getattr(bp.plan, "targets", None)
            if bp.plan is None or (target is not None and targets is not None and target not in targets):
                continue
            out.setdefault(bp.op.name, set()).add(tuple(tuple(k[1]) for k in bp.key))
        return out

    def _fold_sizes(self, target: str | None) -> set[tuple[str, torch.dtype, tuple[int, ...]]]:
        """(device type, dtype, first input's shape) of this set's conv-bias fold variants that may run under
        `target` (`_is_fold`): the convolution outputs whose bias `_split_conv_biases` splits off."""
        out = set()
        for bp in self.built:
            targets = getattr(bp.plan, "targets", None)
            if bp.plan is None or not bp.key or (target is not None and targets is not None and target not in targets):
                continue
            if _is_fold(bp.op.signature):
                out.add((bp.devices[0][0], bp.devices[0][1], tuple(bp.key[0][1])))
        return out

    def first_layouts(self, target: str | None = None) -> dict[Any, dict]:
        """Per registered op: for the (device type, dtype, shape, strides) of each first input its variants were
        proven for (those that may run under `target`), their outputs' strides, as compose.covered_layouts."""
        out: dict[Any, dict] = {}
        for bp in self.everything_built():
            targets = getattr(bp.plan, "targets", None)
            if bp.plan is None or not bp.key or not bp.first or \
                    (target is not None and targets is not None and target not in targets):
                continue
            dtype, index = bp.key[0][0], bp.key[0][4]   # the key's strides leave a size-1 dim's out
            shape, stride = bp.first
            out.setdefault(chain_op(bp.op.name), {})[("cpu" if index < 0 else "cuda", dtype, shape, stride)] = \
                getattr(bp.plan, "output_strides", None)
        return out

    def ops(self) -> list[Any]:
        """The registered ops its matches become, once each."""
        return list(dict.fromkeys(chain_op(bp.op.name) for bp in self.built))

    def uuid(self, vetoed: tuple = ()) -> tuple:
        """For Inductor's cache keys: the set, how its patterns are traced, and the trace under `vetoed`."""
        return ("kforge-patterns", PATTERN_TRACE, self.digest, self._under_vetoes.get(vetoed, self).digest,
                *(("split-on-cpu",) if self.split_on_cpu else ()))

    def remove(self) -> None:
        """Drop this owner's variants (the ops stay registered; compiled graphs calling them then miss)."""
        remove_owner(self.owner)

    def enter(self) -> None:
        """Put this owner's variants (back) in their ops' guard tables: graphs compiled with the cast call
        its kernels again once it is installed again."""
        with _LOCK:
            for bp in self.everything_built():
                if bp.plan is not None:
                    bp.op.table[bp.key] = bp.plan
                    bp.op.owners[bp.key] = self.owner


def remove_owner(owner: object) -> int:
    """Drop every pattern variant `owner` entered; returns how many."""
    n = 0
    with _LOCK:
        for pop in _TABLES.values():
            for k in [k for k, who in pop.owners.items() if who is owner]:
                pop.table.pop(k, None)
                pop.owners.pop(k, None)
                n += 1
    return n


def variants(owner: object | None = None) -> dict[str, int]:
    """Per pattern op: how many variants its guard table holds (of `owner`, or of anyone)."""
    with _LOCK:
        return {name: sum(1 for who in pop.owners.values() if owner is None or who is owner)
                for name, pop in _TABLES.items()}


def build(owner: object, cards: Sequence[PatternCard | tuple[dict[str, Any], Any]]) -> PatternSet:
    """The patterns of `cards` (each a PatternCard or a (signature, plan) pair), their ops registered and
    their variants entered in the ops' guard tables under `owner`."""
    out = PatternSet(owner)
    parts = []
    for card in cards:
        if not isinstance(card, PatternCard):
            card = PatternCard(*card)
        out.cards.append(card)
        try:
            made = _build_one(card)
        except PatternError as e:
            out.problems[card.card_id] = str(e)
            parts.append(("problem", card.card_id))
            continue
        out.built.extend(made)
        parts.append((card.card_id, made[0].op.name if made else None))
    # Larger chains first (a module card's chain can lie inside a pattern card's: an RMSNorm inside
    # add + RMSNorm; the inner one must not take the nodes the outer one needs), then most outputs first.
    out.built.sort(key=lambda bp: (-len(bp.op.signature["chain"]["nodes"]), -len(bp.outputs)))
    out.digest = hashlib.sha256(repr(sorted(map(str, parts))).encode()).hexdigest()[:20]
    out.enter()
    return out


def _is_fold(signature: dict[str, Any]) -> bool:
    """Whether a chain is a conv-bias fold card: `add.Tensor(in0, in1)` (alpha 1) with `in1` of shape
    [1, C, 1, 1] for a 4-D `in0` of C channels, then `native_group_norm` reading that add. By structure, not by
    a capture's `folded_from` marker: the chain means the same for any per-channel add, marked or not."""
    if signature.get("op") != CHAIN_OP or "chain" not in signature:
        return False
    nodes, args = untwinned(signature)["chain"]["nodes"], signature["args"]
    if len(nodes) < 2 or len(args) < 2 or nodes[0]["op"] != "aten::add.Tensor" \
            or nodes[1]["op"] != "aten::native_group_norm":
        return False
    add = {a["name"]: a for a in nodes[0]["args"]}
    if list(add.get("self", {}).get("tensor") or ()) != ["in", 0] or \
            list(add.get("other", {}).get("tensor") or ()) != ["in", 1] or add.get("alpha", {}).get("value", 1) != 1:
        return False
    gn = {a["name"]: a for a in nodes[1]["args"]}
    if list(gn.get("input", {}).get("tensor") or ()) != ["node", 0, 0]:
        return False
    shape, bias = list(args[0].get("shape") or ()), list(args[1].get("shape") or ())
    return len(shape) == 4 and bias == [1, shape[1], 1, 1]


@dataclass
class _Split:
    """A convolution whose bias `_split_conv_biases` moved into `add(conv, reshape(bias, [1, C, 1, 1]))`."""

    conv: torch.fx.Node
    bias: torch.fx.Node
    reshape: torch.fx.Node
    add: torch.fx.Node


def _splits_bias(conv: torch.fx.Node, sizes: set[tuple], on_cpu: bool) -> bool:
    """Whether `_split_conv_biases` splits this call of `aten.convolution.default`: a bias that is a node, not
    transposed, a 4-D output with the bias's dtype on CUDA (or on the CPU with `on_cpu`), of a size a fold
    variant may have, and not a 1x1 convolution that Inductor may lower as a GEMM with the bias in its epilogue.
    Its readers are not counted: a decomposed GroupNorm reads its input twice (its statistics and its apply),
    and one reader outside a fold card's chain (a residual) is left to the matcher, which then finds the add
    read outside the pattern and does not match (the split is put back)."""
    from torch._inductor import config

    if conv.kwargs or len(conv.args) != 9:
        return False
    _x, weight, bias, stride, padding, dilation, transposed, output_padding, groups = conv.args
    if not isinstance(bias, torch.fx.Node) or transposed is not False:
        return False
    val, bval = conv.meta.get("val"), bias.meta.get("val")
    if not isinstance(val, torch.Tensor) or not isinstance(bval, torch.Tensor) or val.dim() != 4 \
            or bval.dim() != 1 or bval.dtype != val.dtype or type(bval.shape[0]) is not int:
        return False
    if val.device.type != "cuda" and not (on_cpu and val.device.type == "cpu"):
        return False   # Inductor's CPU convolution keeps its bias (mkldnn adds it): a split is not neutral there
    if not any(d == val.device.type and t == val.dtype and may_have_sizes(tuple(val.shape), s) for d, t, s in sizes):
        return False
    # torch/_inductor/kernel/conv.py `convolution`: with conv_1x1_as_mm, or max_autotune(_gemm) and a
    # channels-last convolution, a 1x1 stride-1 unpadded ungrouped convolution becomes addmm(bias, x, w). Left
    # whole wherever that may happen (whether the layout is channels-last is decided after this pass).
    if config.conv_1x1_as_mm or config.max_autotune or config.max_autotune_gemm:
        wval = weight.meta.get("val") if isinstance(weight, torch.fx.Node) else None
        kernel = tuple(wval.shape[2:]) if isinstance(wval, torch.Tensor) else None
        if kernel is None or (all(k == 1 for k in kernel) and all(s == 1 for s in stride)
                              and all(p == 0 for p in padding) and all(d == 1 for d in dilation)
                              and all(p == 0 for p in output_padding) and groups == 1):
            return False
    return True


def _split_conv_biases(graph: torch.fx.Graph, sizes: set[tuple], on_cpu: bool = False) -> list[_Split]:
    """Split the bias off each convolution whose output may be a conv-bias fold card's first input (`sizes`:
    `PatternSet._fold_sizes`; `_splits_bias`): `convolution(x, w, None, …)` then `add.Tensor(conv,
    reshape(b, [1, C, 1, 1]))`, what Inductor's CUDA lowering makes of it anyway ("peel off the bias, cudnn is
    slower with it"), so the fold card's pattern has its add to match. The convolution keeps its node and meta
    (its output's sizes and strides are the same without the bias): a match hands the card's op that stored
    output. Returns the splits, for `_restore_splits`."""
    from torch._guards import detect_fake_mode

    conv_op, reshape, add = torch.ops.aten.convolution.default, torch.ops.aten.reshape.default, torch.ops.aten.add.Tensor
    out = []
    for conv in list(graph.nodes):
        if conv.op != "call_function" or conv.target is not conv_op or not _splits_bias(conv, sizes, on_cpu):
            continue
        bias = conv.args[2]
        val, bval = conv.meta["val"], bias.meta["val"]
        mode = detect_fake_mode([val, bval])
        if mode is None:
            continue
        shape = [1, int(bval.shape[0]), 1, 1]
        with mode:   # the new nodes' meta, as the pattern's check and the replacement's trace read it
            rval = reshape(bval, shape)
            aval = add(val, rval)
        with graph.inserting_after(conv):
            r = graph.call_function(reshape, (bias, shape))
        with graph.inserting_after(r):
            a = graph.call_function(add, (conv, r))
        r.meta["val"], a.meta["val"] = rval, aval
        for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
            if key in conv.meta:
                a.meta[key] = conv.meta[key]
        conv.replace_all_uses_with(a, delete_user_cb=lambda user, a=a: user is not a)
        conv.update_arg(2, None)
        out.append(_Split(conv, bias, r, a))
    return out


def _restore_splits(graph: torch.fx.Graph, splits: Sequence[_Split]) -> int:
    """Put back the bias of every split whose add no pattern took (still in the graph): the add's readers read
    the convolution again, which adds its bias itself, and the add and reshape are gone, so the graph is the
    one before the split. A split whose add a match replaced stays split. Returns how many were put back."""
    n = 0
    for s in splits:
        # taken: the matcher erased the add, or (should a torch release leave matched nodes to dead-code
        # elimination) rewired every reader of it to the card's op, which adds the bias itself: putting the bias
        # back on the convolution then would add it twice
        if getattr(s.add, "_erased", False) or not s.add.users:
            continue
        s.add.replace_all_uses_with(s.conv)
        graph.erase_node(s.add)
        if not s.reshape.users:
            graph.erase_node(s.reshape)
        s.conv.update_arg(2, s.bias)
        n += 1
    return n


class PatternError(ValueError):
    """A chain that cannot be matched in a post-grad graph; the message says why."""


def _why_not(signature: dict[str, Any]) -> str | None:
    if signature.get("op") != CHAIN_OP or "chain" not in signature:
        return f"not a chain signature (op {signature.get('op')})"
    for node in signature["chain"]["nodes"]:
        o = resolve_op(node["op"])
        if any(a.alias_info is not None and a.alias_info.is_write for a in o._schema.arguments):
            return f"{node['op']} writes an input in place (post-grad graphs are functional)"
        base = node["op"].split("::")[-1].split(".")[0]
        if any(r in base for r in _RANDOM_OPS):
            return f"{node['op']} is random (its replacement could not draw the same numbers)"
    for a in signature["args"]:
        if a.get("kind") != "tensor" or a.get("absent"):
            return f"input {a.get('name')} is not a tensor"
    return None


def _example(desc: dict[str, Any], device: str) -> torch.Tensor:
    dtype = getattr(torch, desc["dtype"])
    t = torch.empty_strided(desc["shape"], desc["stride"], dtype=dtype, device=device)
    if device != "meta":  # values never reach the pattern; finite ones keep the trace's ops well-behaved
        t.normal_() if dtype.is_floating_point or dtype.is_complex else t.zero_()
    return t


def _trace_device(signature: dict[str, Any]) -> str:
    devices = {a.get("device", "cpu") for a in signature["args"]}
    if devices == {"cpu"}:
        return "cpu"
    if devices == {"cuda"} and torch.cuda.is_available():
        return "cuda"
    return "meta"


def _trace(signature: dict[str, Any], outputs: tuple[int, ...]) -> torch.fx.GraphModule:
    """The chain (the chosen outputs) as Inductor's post-grad graphs spell it.

    Traced on fake tensors of the card's device (no memory, no kernels: the trace of a GroupNorm over 1 GB
    took 5 s on a CPU and 0.13 s fake, with the same graph), else, for a chain some op of which has no fake
    implementation, on real tensors."""
    from torch._inductor.fx_passes.post_grad import view_to_reshape
    from torch._inductor.pattern_matcher import fwd_only
    from torch._subclasses.fake_tensor import FakeTensorMode

    n = len(signature["args"])

    def chain(*ins: torch.Tensor) -> tuple:
        outs = run_chain(signature, list(ins[:n]))
        return tuple(outs[k] for k in outputs)

    try:
        with FakeTensorMode():
            args = [torch.empty_strided(a["shape"], a["stride"], dtype=getattr(torch, a["dtype"]),
                                        device=a.get("device", "cpu")) for a in signature["args"]]
        with torch.no_grad():
            gm = fwd_only(chain, args)
    except Exception:  # an op without a fake implementation: trace it for real
        device = _trace_device(signature)
        args = [_example(a, device) for a in signature["args"]]
        with torch.no_grad():
            gm = fwd_only(chain, args)
    view_to_reshape(gm)
    return _as_inductor_spells_it(gm)  # which ends with dead-code removal and a recompile


def _as_inductor_spells_it(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The traced chain after the graph passes Inductor runs on an inference graph before the cast's pass
    (`joint_graph_passes`, then `post_grad_passes` up to its custom post pass), of the installed torch and
    with the user's own custom passes: what the compiled graph holds where the chain sits. A pass can
    rewrite the chain's own ops (torch 2.11 drops a bf16 round trip `convert(convert(x, bf16), f32)`
    that later versions keep; GroupNorm → SiLU in bf16 then never matched a pattern traced without it)."""
    import inspect

    from torch._inductor import config
    from torch._inductor.fx_passes.joint_graph import joint_graph_passes
    from torch._inductor.fx_passes.post_grad import post_grad_passes

    with config.patch(post_grad_custom_post_pass=None):
        if "input_device" in inspect.signature(joint_graph_passes).parameters:
            gm = joint_graph_passes(gm, input_device=None) or gm
        else:
            gm = joint_graph_passes(gm) or gm
        post_grad_passes(gm, is_inference=True)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _subset(full: torch.fx.GraphModule, outputs: tuple[int, ...]) -> torch.fx.GraphModule:
    """The full trace with only `outputs` returned and what no longer feeds them removed: what a trace of
    those outputs alone gives (fwd_only's own last step is this dead-code elimination), without tracing."""
    gm = copy.deepcopy(full)
    out = next(node for node in gm.graph.nodes if node.op == "output")
    every = out.args[0]
    out.args = (tuple(every[k] for k in outputs),)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _reads_all(gm: torch.fx.GraphModule, n: int) -> bool:
    return sum(1 for p in gm.graph.nodes if p.op == "placeholder" and p.users) == n


class _Exact:
    """A literal of a pattern that a graph's argument matches only with its type and bits: Inductor's matcher
    compares constants with `!=`, for which 3 == 3.0, True == 1 and -0.0 == 0.0. On integer tensors `x * 3.0`
    is a float tensor and `x * 3` an integer one; `1 / (x * -0.0)` is -inf where `1 / (x * 0.0)` is inf."""

    __slots__ = ("value",)

    def __init__(self, value: bool | int | float):
        self.value = value

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Exact):
            other = other.value
        if type(other) is not type(self.value):
            return False
        if isinstance(other, float):
            return repr(other) == repr(self.value)  # -0.0 and 0.0 apart, nan equal to itself
        return other == self.value

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash((type(self.value), repr(self.value)))

    def __repr__(self) -> str:
        return repr(self.value)


def _exact(v: Any) -> Any:
    from torch.fx.immutable_collections import immutable_dict, immutable_list

    if type(v) in (bool, int, float):
        return _Exact(v)
    if type(v) in (list, tuple, immutable_list):  # not torch.Size and kin, which hold ints only
        return type(v)(_exact(x) for x in v)
    if type(v) in (dict, immutable_dict):
        return {k: _exact(x) for k, x in v.items()}
    return v


def _pattern_of(gm: torch.fx.GraphModule, n: int) -> Any:
    from torch._inductor.pattern_matcher import fx_to_pattern

    names = [f"in{i}" for i in range(n)]
    # Literal sizes and scalars, each of its own type and bits (`_Exact`): a match is exactly the card's
    # computation; only the device may differ (the trace may run on the meta device).
    gm = copy.deepcopy(gm)
    for node in gm.graph.nodes:
        if node.op == "call_function":
            node.args, node.kwargs = _exact(node.args), _exact(dict(node.kwargs))
    return fx_to_pattern(gm, ignore_types=(torch.device,), argnames=names, exclusive_arg_names=names)


def _op_name(signature: dict[str, Any], exprs: list[str]) -> str:
    blob = repr(exprs) + repr([(a["dtype"], a["device"]) for a in signature["args"]])
    return "chain_" + hashlib.sha256(blob.encode()).hexdigest()[:16]


def _build_one(card: PatternCard) -> list[BuiltPattern]:
    sig = card.signature
    why = _why_not(sig)
    if why:
        raise PatternError(why)
    n_out = len(sig["chain"]["outputs"])
    n_in = len(sig["args"])
    subsets: list[tuple[int, ...]] = []
    for size in range(n_out, 0, -1):
        if n_out > 3 and size not in (n_out, 1):
            continue
        subsets.extend(itertools.combinations(range(n_out), size))
    subsets = subsets[:MAX_OUTPUT_SUBSETS]
    try:
        # A channels-last twin's pattern is its original's: the compiled graph traced the chain with a
        # contiguous input and hands the twin's variant the held one (compose, `inputs_as_held`), so both
        # share one registered op, the twin's variant an entry of its own in the op's table.
        full = _trace(untwinned(sig), tuple(range(n_out)))
        traced = [(s, full if len(s) == n_out else _subset(full, s)) for s in subsets]
    except Exception as e:  # the decomposition or tracing refuses the chain: say so
        raise PatternError(f"cannot trace the chain as Inductor would ({type(e).__name__}: {e})") from e
    if not _reads_all(full, n_in):
        raise PatternError("the traced chain does not read all its inputs (one reaches it only through "
                           "its shape)")
    # A subset whose members do not read every input (GroupNorm's mean alone) is not a pattern.
    exprs = [(s, gm, _pattern_of(gm, n_in)) for s, gm in traced if _reads_all(gm, n_in)]
    name = _op_name(sig, [repr(x) for _, _, x in exprs])
    with _LOCK:
        pop = _TABLES.get(name)
        if pop is None:
            pop = _TABLES[name] = PatternOp(name, sig, full)
            _register_op(name, pop, n_in, n_out)
    key = tuple(descriptor_key(a, 0) for a in sig["args"])
    devices = tuple((a["device"], getattr(torch, a["dtype"])) for a in sig["args"])
    first = (tuple(sig["args"][0]["shape"]), tuple(sig["args"][0]["stride"])) if sig["args"] else ()
    return [BuiltPattern(pop, s, x, devices, key, card.plan, first) for s, _, x in exprs]


def _register_op(name: str, pop: PatternOp, n_in: int, n_out: int) -> None:
    if name in _OPS:
        return
    params = ", ".join(f"Tensor in{i}" for i in range(n_in))
    rets = "Tensor" if n_out == 1 else "(" + ", ".join("Tensor" for _ in range(n_out)) + ")"

    def real(*inputs: torch.Tensor) -> Any:
        outs = _TABLES[name](inputs)
        return outs[0] if n_out == 1 else tuple(outs)

    def fake(*inputs: torch.Tensor) -> Any:
        outs = _unaliased(run_chain(pop.signature, list(inputs)), inputs)
        return outs[0] if n_out == 1 else tuple(outs)

    # Defined through torch.library.Library, not torch.library.custom_op: custom_op's own Python wrappers (its
    # autograd kernel, its check of the outputs' aliasing, which `_unaliased` makes here) cost about 3 µs a call
    # on a CI core, once per chain per forward of the compiled model (scripts/probe_pattern_call.py).
    global _LIB
    if _LIB is None:
        _LIB = torch.library.Library("kforge", "FRAGMENT")
    _LIB.define(f"{name}({params}) -> {rets}")
    _LIB.impl(name, real, "CompositeExplicitAutograd")
    torch.library.register_fake(f"kforge::{name}", fake, lib=_LIB)
    _OPS[name] = chain_op(name)


def chain_op(name: str) -> Any:
    """The registered op (`torch.ops.kforge.<name>.default`)."""
    return getattr(torch.ops.kforge, name).default


def _could_be(shapes: Sequence[tuple], proven: tuple) -> bool:
    """Whether inputs of `shapes` can have the sizes `proven`, input by input (engine.ops.may_have_sizes)."""
    return len(shapes) == len(proven) and all(may_have_sizes(s, p) for s, p in zip(shapes, proven))


def _no_other_keywords(match: Any) -> bool:
    """Whether every matched call passes no keyword argument its pattern lacks, other than at its default.
    Inductor's matcher compares only the keywords the pattern has: a card traced from `x.sum(-1)` matched
    `x.sum(-1, dtype=torch.float64)` and `cumsum(x, -1, dtype=torch.float64)`, and the compiled model returned
    float32 where eager returns float64."""
    for pat, node in match.ctx.pattern_to_node.items():
        pat_kwargs = getattr(pat, "kwargs", None)
        if not isinstance(node, torch.fx.Node) or node.op != "call_function" or not isinstance(pat_kwargs, dict):
            continue
        extra = [k for k in node.kwargs if k not in pat_kwargs]
        if not extra:
            continue
        schema = getattr(node.target, "_schema", None)
        defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()} \
            if schema is not None else {}
        if not all(k in defaults and _exact(defaults[k]) == node.kwargs[k] for k in extra):
            return False
    return True


def _register(bp: BuiltPattern, pm: Any) -> None:
    from torch._inductor.pattern_matcher import register_graph_pattern

    n_in = len(bp.op.signature["args"])
    op = chain_op(bp.op.name)
    outputs = bp.outputs

    def check(match: Any) -> bool:
        if not _no_other_keywords(match):
            return False
        shapes = []
        for i, (device, dtype) in enumerate(bp.devices):
            v = match.kwargs[f"in{i}"].meta.get("val")
            if not isinstance(v, torch.Tensor) or v.device.type != device or v.dtype != dtype:
                return False
            shapes.append(tuple(v.shape))
        sizes = getattr(_APPLYING, "sizes", None)
        if sizes is not None and not any(_could_be(shapes, proven) for proven in sizes.get(bp.op.name, ())):
            # once per place in the graph, whichever output subset tried it
            _APPLYING.declined.add((bp.op.name, tuple(id(match.kwargs[f"in{i}"]) for i in range(n_in))))
            return False
        return True

    @register_graph_pattern(bp.expr, extra_check=check, pass_dict=pm)
    def replace(match: Any, **kwargs: Any) -> None:
        def repl(*ins: torch.Tensor) -> tuple:
            outs = op(*ins)
            outs = (outs,) if isinstance(outs, torch.Tensor) else outs
            return tuple(outs[k] for k in outputs)

        match.replace_by_example(repl, [kwargs[f"in{i}"] for i in range(n_in)])
