"""Conv-bias fold cards under torch.compile (engine.cast.patterns: `_is_fold`, `_split_conv_biases`,
`_restore_splits`), on the CPU.

A fold card is the chain `add.Tensor(in0, in1[1,C,1,1])` → GroupNorm → SiLU: a convolution's bias folded into
the GroupNorm kernel after it. The post-grad graph holds `convolution(x, w, b)` with no add to match, so the
pattern pass splits the bias off into one first (as Inductor's CUDA lowering does), matches, and puts back
every split no pattern took. Inductor keeps a CPU convolution's bias, so the split is CUDA-only unless
`PatternSet.split_on_cpu` (a switch for these tests) is set."""

from __future__ import annotations

import copy

import torch
from test_cast_compile import CpuCast
from test_cast_modules import ENV
from test_cast_pattern_cards import Counting, _cast, _variant
from test_chain_twins import _chain_sigs, _model

import engine.cast
from engine.capture.chains import chain_output_strides
from engine.capture.signature import contiguous_strides
from engine.capture.twins import channels_last_strides
from engine.cast import compose, patterns
from engine.export.e2e import ran_in_forward
from engine.verify.compare import compare
from engine.verify.tolerance import tolerance_for

CONV = torch.ops.aten.convolution.default
ADD = torch.ops.aten.add.Tensor


def _fold_signature(chain: dict) -> dict:
    """The GroupNorm → SiLU chain signature `chain` (inputs x, weight, bias) as a conv-bias fold card: in0 the
    convolution's output without its bias, in1 that bias as [1, C, 1, 1], in2/in3 the GroupNorm's weight and
    bias, nodes add → GroupNorm → SiLU (engine/capture's folded cards are built so; no `folded_from` here)."""
    x, w, b = chain["args"]
    c = x["shape"][1]
    bias = {**w, "name": "in1", "shape": [1, c, 1, 1], "stride": contiguous_strides([1, c, 1, 1])}
    gn, silu = copy.deepcopy(chain["chain"]["nodes"])
    where = {"input": ["node", 0, 0], "weight": ["in", 2], "bias": ["in", 3]}
    for a in gn["args"]:
        if a["name"] in where:
            a["tensor"] = where[a["name"]]
    silu["args"][0]["tensor"] = ["node", 1, 0]
    add = {"op": "aten::add.Tensor", "results": 1,
           "args": [{"name": "self", "tensor": ["in", 0]}, {"name": "other", "tensor": ["in", 1]},
                    {"name": "alpha", "value": 1}]}
    return {**chain, "args": [x, bias, {**w, "name": "in2"}, {**b, "name": "in3"}],
            "chain": {"nodes": [add, gn, silu], "outputs": [[j + 1, k] for j, k in chain["chain"]["outputs"]]}}


def _twin(sig: dict) -> tuple[dict, tuple]:
    """The channels-last twin of a fold signature (its first input channels-last), and its outputs' strides by
    the members' meta kernels, as engine.capture.twins would make it."""
    args = [dict(a) for a in sig["args"]]
    args[0]["stride"] = channels_last_strides(args[0]["shape"])
    twin = {**sig, "args": args, "twin_of": "fold"}
    ins = [torch.empty_strided(a["shape"], a["stride"], dtype=getattr(torch, a["dtype"]), device=a["device"])
           for a in args]
    return twin, tuple(chain_output_strides(twin, ins))


class _Residual(torch.nn.Module):
    """conv → GroupNorm → SiLU → conv, plus the first conv's output: a reader outside the chain."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1)
        self.norm = torch.nn.GroupNorm(4, 8)

    def forward(self, x):
        h = self.conv1(x)
        return self.conv2(torch.nn.functional.silu(self.norm(h))) + h


class _NoSilu(torch.nn.Module):
    """conv → GroupNorm → ReLU: the fold card's chain stops short (no SiLU)."""

    def __init__(self):
        super().__init__()
        self.conv, self.norm = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.GroupNorm(4, 8)

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x)))


def _compile(model, x, owner, cards=None, split_on_cpu=True, layout_opt=False):
    """`model(x)` compiled through the cast's backend with pattern cards `cards` (none: no pattern pass);
    (backend, the post-grad graph as a user pass after ours saw it, the compiled output, eager's output)."""
    graphs: list[str] = []
    pset = None
    if cards:
        pset = patterns.build(owner, cards)
        pset.split_on_cpu = split_on_cpu
    backend = compose.backend(owner, options={"post_grad_custom_post_pass": lambda g: graphs.append(str(g))},
                              patterns=pset)
    torch._dynamo.reset()
    try:
        with torch.no_grad(), torch._inductor.config.patch(force_layout_optimization=layout_opt):
            want = model(x)
            got = torch.compile(model, backend=backend)(x)
    finally:
        torch._dynamo.reset()
    (graph,) = graphs
    return backend, graph, got, want


def _close(got, want):
    report = compare(got.contiguous(), want.contiguous(), tolerance_for("aten::native_group_norm", want.dtype))
    assert report.ok, report.message


def _calls(graph: str, target: str) -> list[str]:
    return [line for line in graph.splitlines() if f"target={target}]" in line]


def test_a_fold_card_takes_the_convolution_and_the_groupnorm_after_it(tmp_path, monkeypatch):
    """conv → GroupNorm → SiLU → conv: the first convolution loses its bias, the fold card's op adds it; the
    second convolution's bias is split too (its output has the card's sizes) and put back, since no pattern
    took it. A plain GroupNorm → SiLU card for the same GroupNorm is tried after the larger fold and matches
    nothing. Without `split_on_cpu` nothing is split on the CPU and the graph is Inductor's."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model, x = _model(), torch.randn(2, 8, 4, 4)
    plain = _chain_sigs(model, x)
    fold = _fold_signature(plain)
    owner = CpuCast("none")
    _, bare, _, _ = _compile(model, x, owner)

    fold_plan, plain_plan = Counting(fold), Counting(plain)
    backend, graph, got, want = _compile(model, x, owner, [(plain, plain_plan), (fold, fold_plan)])
    _close(got, want)
    op = next(bp.op.name for bp in backend.patterns.built if patterns._is_fold(bp.op.signature))
    assert backend.pattern_matches[0][op] == 1 and sum(backend.pattern_matches[0].values()) == 1
    assert (fold_plan.calls, plain_plan.calls) == (1, 0)
    assert backend.patterns.folds == {"split": 2, "reverted": 1}
    first, second = _calls(graph, "torch.ops.aten.convolution.default")
    assert ", None, [1, 1]," in first and ", None," not in second
    assert _calls(graph, "torch.ops.aten.add.Tensor") == []  # the bias add went into the card's op
    (call,) = _calls(graph, f"torch.ops.kforge.{op}.default")
    assert "args = (%convolution, %reshape_default," in call

    backend, graph, got, _ = _compile(model, x, owner, [(fold, Counting(fold))], split_on_cpu=False)
    assert backend.patterns.folds == {"split": 0, "reverted": 0} and graph == bare
    _close(got, want)


def test_a_bfloat16_fold_card_matches(tmp_path, monkeypatch):
    """In bfloat16 (the VAE's dtype on the GPU) the graph's GroupNorm converts its input to float32 first; the
    fold's pattern, traced the same way, still matches. The output moves by about a bf16 ulp: the convolution's
    output is rounded before the bias is added (as in Inductor's own split on CUDA), eager rounds once."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model, x = _model().to(torch.bfloat16), torch.randn(2, 8, 4, 4, dtype=torch.bfloat16)
    fold = _fold_signature(_chain_sigs(model, x))
    assert fold["args"][0]["dtype"] == "bfloat16"
    plan = Counting(fold)
    backend, _, got, want = _compile(model, x, CpuCast("none"), [(fold, plan)])
    assert sum(backend.pattern_matches[0].values()) == 1 and plan.calls == 1
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 1e-2


def test_a_split_no_pattern_takes_is_put_back_exactly(tmp_path, monkeypatch):
    """A convolution whose output is also read outside the chain (a residual) and one whose GroupNorm no SiLU
    follows: the fold card matches neither, and the graph is the one compiled without it."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    x = torch.randn(2, 8, 4, 4)
    fold = _fold_signature(_chain_sigs(_model(), x))
    owner = CpuCast("none")
    for model, split in ((_Residual().eval(), 2), (_NoSilu().eval(), 1)):
        _, bare, _, _ = _compile(model, x, owner)
        plan = Counting(fold)
        backend, graph, got, want = _compile(model, x, owner, [(fold, plan)])
        _close(got, want)
        assert backend.patterns.folds == {"split": split, "reverted": split}
        assert sum(backend.pattern_matches[0].values()) == 0 and plan.calls == 0
        assert graph == bare


def test_under_a_groupnorm_veto_the_fold_card_still_matches(tmp_path, monkeypatch):
    """A cast with a group_norm op variant at the fold's size keeps native_group_norm whole in the graph; the
    fold's pattern is traced again under that veto and still takes the convolution's output."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model, x = _model(), torch.randn(2, 8, 4, 4)
    fold = _fold_signature(_chain_sigs(model, x))
    norm = model[1].norm
    owner = CpuCast("gn").install([torch.randn(2, 8, 4, 4), norm.weight.detach(), norm.bias.detach(),
                                   2, 8, 16, 4, 1e-5])
    plan = Counting(fold)
    try:
        backend, graph, got, want = _compile(model, x, owner, [(fold, plan)])
    finally:
        owner.remove()
    _close(got, want)
    assert backend.vetoed == [(("aten.native_group_norm.default", (("cpu", "torch.float32"),)),)]
    assert sum(backend.pattern_matches[0].values()) == 1 and plan.calls == 1
    assert backend.patterns.folds == {"split": 2, "reverted": 1}
    assert _calls(graph, "torch.ops.aten.native_group_norm.default") == []


def test_a_twin_fold_variant_is_passed_the_convolutions_output_as_held(tmp_path, monkeypatch):
    """Under Inductor's layout optimization the convolution's output is channels-last and stored: the fold
    card's twin (channels-last in0) is handed it as it is, with no copy and no pointwise computed for it (the
    split-off bias add Inductor would otherwise write channels-last before the op is gone)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model, x = _model(), torch.randn(2, 8, 4, 4)
    fold = _fold_signature(_chain_sigs(model, x))
    twin, strides = _twin(fold)
    plan, twin_plan = Counting(fold), Counting(twin)
    twin_plan.output_strides = strides
    backend, _, got, want = _compile(model, x, CpuCast("none"), [(fold, plan), (twin, twin_plan)], layout_opt=True)
    _close(got, want)
    (row,) = [v for k, v in backend.layout_copies.items() if "kforge" in k]
    assert (row["calls"], row["inputs_copied"], row.get("inputs_as_held")) == (1, 0, 1), row
    assert not row.get("inputs_computed") and not row.get("inputs_computed_as_held"), row
    assert (plan.calls, twin_plan.calls) == (0, 1)


def test_a_casts_stats_and_the_export_record_say_how_many_splits_were_put_back(tmp_path, monkeypatch):
    """A fold card from a .cast file: `cast.stats()` counts the biases split off and those put back (the second
    convolution's), and the export's record of what ran in a forward carries the latter beside the matches."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model, x = _model(), torch.randn(2, 8, 4, 4)
    fold = _fold_signature(_chain_sigs(model, x))
    plan = Counting(fold)
    cast = engine.cast.load(_cast(tmp_path, _variant(fold, id="fold", pattern={})), env=ENV, plans={"fold": plan})
    cast.pattern_set().split_on_cpu = True
    torch._dynamo.reset()
    try:
        with torch.no_grad(), cast.enabled():
            want = model(x)
            got = cast.compile(model)(x)
    finally:
        torch._dynamo.reset()
    _close(got, want)
    st = cast.stats()
    assert (st["folds_split"], st["folds_reverted"]) == (2, 1) and list(st["pattern_matches"].values()) == [1]
    ran = ran_in_forward(st, ["fold"])
    assert ran["folds_reverted"] == 1 and ran["hits_per_forward"] == {"fold": 1} and ran["never_ran"] == []
    assert "folds_reverted" not in ran_in_forward({**st, "folds_reverted": 0}, ["fold"])
    cast.remove()


def test_is_fold_reads_the_chains_structure():
    """A fold card by its nodes and shapes, with or without a capture's `folded_from`; its twin too."""
    fold = _fold_signature(_chain_sigs(_model(), torch.randn(2, 8, 4, 4)))
    plain = _chain_sigs(_model(), torch.randn(2, 8, 4, 4))
    assert patterns._is_fold(fold) and patterns._is_fold({**fold, "folded_from": {"card": "c"}})
    assert patterns._is_fold(_twin(fold)[0])
    assert not patterns._is_fold(plain)
    alpha = copy.deepcopy(fold)
    alpha["chain"]["nodes"][0]["args"][2]["value"] = 2
    full = copy.deepcopy(fold)
    full["args"][1] = {**full["args"][0], "name": "in1"}   # a residual add, not a per-channel one
    swapped = copy.deepcopy(fold)
    swapped["chain"]["nodes"][0]["args"][:2] = [{"name": "self", "tensor": ["in", 1]},
                                                {"name": "other", "tensor": ["in", 0]}]
    assert not any(patterns._is_fold(s) for s in (alpha, full, swapped))


def _graph(fn, *shapes):
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*[torch.randn(s) for s in shapes]).graph


def test_the_split_and_its_restore_leave_a_graph_as_it_was():
    """`_split_conv_biases` on a traced graph: a 3x3 convolution of the fold's size is split (its readers read
    the add), the restore gives back the same code; 1x1 convolutions that Inductor may lower as a GEMM with the
    bias in its epilogue (conv_1x1_as_mm, max-autotune) and transposed ones are left whole; so is a convolution
    on the CPU without `on_cpu`, and one of another size."""
    from torch._inductor import config

    def conv(k, transposed=False):
        def f(x, w, b):
            y = torch.ops.aten.convolution.default(x, w, b, [1, 1], [k // 2] * 2, [1, 1], transposed, [0, 0], 1)
            return y * 2, y.sum()
        return f

    sizes = {("cpu", torch.float32, (2, 8, 4, 4))}
    g3 = _graph(conv(3), (2, 8, 4, 4), (8, 8, 3, 3), (8,))
    before = g3.python_code("self").src
    splits = patterns._split_conv_biases(g3, sizes, on_cpu=True)
    assert len(splits) == 1
    s = splits[0]
    assert s.conv.args[2] is None and set(s.conv.users) == {s.add}
    assert {u.target for u in s.add.users} == {torch.ops.aten.mul.Tensor, torch.ops.aten.sum.default}
    assert tuple(s.add.meta["val"].shape) == (2, 8, 4, 4) and tuple(s.reshape.meta["val"].shape) == (1, 8, 1, 1)
    assert patterns._restore_splits(g3, splits) == 1
    assert g3.python_code("self").src == before

    assert patterns._split_conv_biases(g3, sizes) == []                                     # CPU, not asked
    assert patterns._split_conv_biases(g3, {("cpu", torch.float32, (2, 8, 6, 6))}, True) == []  # no fold of its size
    assert patterns._split_conv_biases(g3, {("cpu", torch.bfloat16, (2, 8, 4, 4))}, True) == []
    g1 = _graph(conv(1), (2, 8, 4, 4), (8, 8, 1, 1), (8,))
    for patch, split in (({}, 1), ({"conv_1x1_as_mm": True}, 0), ({"max_autotune": True}, 0),
                         ({"max_autotune_gemm": True}, 0)):
        with config.patch(patch):
            got = patterns._split_conv_biases(g1, sizes, on_cpu=True)
            assert len(got) == split, patch
            patterns._restore_splits(g1, got)
            with config.patch(max_autotune=True):   # a 3x3 convolution is never a GEMM
                got3 = patterns._split_conv_biases(g3, sizes, on_cpu=True)
                assert len(got3) == 1
                patterns._restore_splits(g3, got3)
    gt = _graph(conv(3, transposed=True), (2, 8, 4, 4), (8, 8, 3, 3), (8,))
    assert patterns._split_conv_biases(gt, sizes, on_cpu=True) == []


def test_a_split_whose_add_lost_every_reader_to_a_match_keeps_the_bias_off():
    """A match rewires the add's readers to the card's op, which adds the bias itself. Where the matcher leaves
    the dead add in the graph (to dead-code elimination) rather than erasing it, the restore must not put the bias
    back on the convolution: it would be added twice."""
    def f(x, w, b):
        y = torch.ops.aten.convolution.default(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        return y * 2

    g = _graph(f, (2, 8, 4, 4), (8, 8, 3, 3), (8,))
    (s,) = patterns._split_conv_biases(g, {("cpu", torch.float32, (2, 8, 4, 4))}, on_cpu=True)
    for user in list(s.add.users):   # what a replacement does: the readers read the new op's result instead
        user.replace_input_with(s.add, s.conv)
    assert not s.add.users and not getattr(s.add, "_erased", False)
    assert patterns._restore_splits(g, [s]) == 0
    assert s.conv.args[2] is None


def test_the_pattern_sets_cache_key_names_the_split_rule():
    """PATTERN_TRACE 8 (biases split for fold cards) is in the key, and so is the test-only CPU split: a graph
    rewritten with it is never served to a compile without it."""
    fold = _fold_signature(_chain_sigs(_model(), torch.randn(2, 8, 4, 4)))
    pset = patterns.build(CpuCast("none"), [(fold, Counting(fold))])
    assert pset.uuid()[:2] == ("kforge-patterns", 8)
    before = pset.uuid()
    pset.split_on_cpu = True
    assert pset.uuid() != before and pset.uuid()[:len(before)] == before
    assert pset._fold_sizes(None) == {("cpu", torch.float32, (2, 8, 4, 4))}
    assert pset._fold_sizes("compile") == pset._fold_sizes(None)
