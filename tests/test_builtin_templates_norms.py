"""CPU tests of the normalisation templates (engine/propose/builtin/{group_norm,row_norms,batch_norm}.py).

Cards are real: the H200 captures in docs/results/capture-h200, and signatures captured here on CPU
tensors (marked cuda, with the outputs CUDA eager gives: fp32 layer_norm statistics, [C] batch_norm
saves). Every instance renders and resolves; a deterministic sample of the default + seeded mutations
compiles with NVRTC for sm_90, as do samples of the group norm's stream, persist and cluster instances (every
card, kernel and parameter value at least once; all of them under `-m sweep`); the plan follows the GPU it is
rendered for (SM count, shared memory per block, clusters only where the arch has them); and a few
instances per template RUN on the CPU (tests/cuda_emulator.py), compared with float64 references of
eager CUDA's arithmetic under the lane's own tolerance.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import random
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cuda_emulator as emu
import pytest
import torch
import torch.nn.functional as F
from card_helpers import GB10, brief, captured, check_intent_directed_children, covering, h200_cards

from engine.capture.signature import bind_arguments, describe_tensor, signature_of, signature_text
from engine.cards import OperatorCard
from engine.launch import parse_spec, resolve
from engine.launch.expr import Env
from engine.propose.base import Attempt, Hardware, ProposalRequest
from engine.propose.builtin.batch_norm import TEMPLATES as BN
from engine.propose.builtin.group_norm import TEMPLATES as GN
from engine.propose.builtin.proposer import BuiltinProposer
from engine.propose.builtin.row_norms import TEMPLATES as ROWS
from engine.propose.builtin.template import H200

TEMPLATES = [*GN, *ROWS, *BN]
ROOT = Path(__file__).resolve().parent.parent
BY_NAME = {t.name: t for t in TEMPLATES}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# ------------------------------------------------------------------------------------------ cards


_brief = brief


def _capture(fn: Callable[[], Any]) -> Any:
    return captured(fn, lambda op: "norm" in op)


def _desc(shape: list[int], dtype: torch.dtype) -> dict:
    return describe_tensor(torch.empty(shape, dtype=dtype))


def _stat_shape(shape: list[int], k: int) -> list[int]:
    return list(shape[: len(shape) - k]) + [1] * k


def _h200_cards() -> list[OperatorCard]:
    return h200_cards(lambda op: "norm" in op)


def group_norm_card(shape: list[int], groups: int, dtype: torch.dtype, affine: bool = True) -> OperatorCard:
    """Captured on CPU; CUDA eager returns the same outputs (mean/rstd in the input dtype, [N, group]). The card
    holds the call's shapes, strides and dtypes only: zeros in, not random values (filling the SD3.5 VAE's
    tensors with randn took a second or more per card)."""
    x = torch.zeros(shape, dtype=dtype)
    w = torch.ones(shape[1], dtype=dtype) if affine else None
    t = _capture(lambda: F.group_norm(x, groups, w, w, 1e-6))
    assert [o["dtype"] for o in t.outputs] == [str(dtype).removeprefix("torch.")] * 3
    return _brief(t.op, t.signature, t.outputs)


def layer_norm_card(shape: list[int], ns: list[int], dtype: torch.dtype, affine: bool = True) -> OperatorCard:
    """Captured on CPU (which returns statistics in the input dtype); outputs as CUDA gives them (fp32)."""
    x = torch.randn(shape, dtype=dtype)
    w = torch.ones(ns, dtype=dtype) if affine else None
    t = _capture(lambda: F.layer_norm(x, ns, w, w, 1e-5))
    st = _stat_shape(shape, len(ns))
    return _brief(t.op, t.signature, [t.outputs[0], _desc(st, torch.float32), _desc(st, torch.float32)])


def rms_norm_card(shape: list[int], ns: list[int], dtype: torch.dtype, weight: bool = True,
                  eps: float | None = None, op: str = "aten::_fused_rms_norm") -> OperatorCard:
    """CPU decomposes rms_norm, so the signature is bound directly; CUDA returns (out, fp32 rstd)."""
    fn = torch.ops.aten._fused_rms_norm.default if op == "aten::_fused_rms_norm" else torch.ops.aten.rms_norm.default
    x = torch.randn(shape, dtype=dtype)
    w = torch.ones(ns, dtype=dtype) if weight else None
    sig = signature_of(fn, bind_arguments(fn, (x, ns, w, eps), {}))
    outs = [_desc(shape, dtype)]
    if op == "aten::_fused_rms_norm":
        outs.append(_desc(_stat_shape(shape, len(ns)), torch.float32))
    return _brief(op, sig, outs)


def batch_norm_card(shape: list[int], dtype: torch.dtype, affine: bool = True, cuda_saves: bool = True,
                    op: str = "aten::native_batch_norm") -> OperatorCard:
    """Captured on CPU (empty [0] saves); `cuda_saves` gives CUDA's eval outputs: fp32 [C] running_mean
    and rsqrt(running_var + eps) (batch_norm_cuda_out), as the H200 ResNet-50 cards record."""
    c = shape[1]
    x = torch.randn(shape, dtype=dtype)
    w = torch.ones(c, dtype=dtype) if affine else None
    rm, rv = torch.zeros(c, dtype=dtype), torch.ones(c, dtype=dtype)
    if op == "aten::native_batch_norm":
        t = _capture(lambda: F.batch_norm(x, rm, rv, w, w, training=False))
    else:
        t = _capture(lambda: torch.ops.aten._native_batch_norm_legit_no_training(x, w, w, rm, rv, 0.1, 1e-5))
    assert t.op == op and [o["shape"] for o in t.outputs[1:]] == [[0], [0]]
    outs = t.outputs if not cuda_saves else [t.outputs[0], _desc([c], torch.float32), _desc([c], torch.float32)]
    return _brief(t.op, t.signature, outs)


def _cards_for(dtype: torch.dtype) -> list[tuple[str, OperatorCard]]:
    """One or more representative cards per template in this dtype."""
    return [
        ("group_norm", group_norm_card([2, 64, 16, 16], 32, dtype)),
        ("group_norm", group_norm_card([1, 32, 10, 10], 8, dtype, affine=False)),
        ("layer_norm", layer_norm_card([4, 16, 96], [96], dtype)),
        ("layer_norm", layer_norm_card([2, 8, 1536], [1536], dtype, affine=False)),
        ("rms_norm", rms_norm_card([4, 16, 128], [128], dtype, eps=1e-6)),
        ("rms_norm", rms_norm_card([3, 40], [40], dtype, weight=False, op="aten::rms_norm")),
        ("batch_norm", batch_norm_card([4, 32, 14, 14], dtype)),
        ("batch_norm", batch_norm_card([4, 32, 7, 7], dtype, affine=False, cuda_saves=False)),
    ]


# ------------------------------------------------------------------------------------- acceptance


def test_every_h200_norm_card_is_accepted():
    cards = _h200_cards()
    ops = {c.op for c in cards}
    assert {"aten::native_group_norm", "aten::native_layer_norm", "aten::native_batch_norm"} <= ops
    for card in cards:
        owners = [t for t in TEMPLATES if card.op in t.ops]
        assert len(owners) == 1, card.op
        assert owners[0].accepts(card) is None, (card.signature_text, owners[0].accepts(card))


def test_h200_defaults_pick_the_expected_strategy():
    by_sig = {c.signature_text: c for c in _h200_cards()}
    vae = next(c for s, c in by_sig.items() if s.startswith("bf16[1,256,512,512]"))
    p = BY_NAME["group_norm"].default(vae)
    # 64 MB, more than half the H200's L2: one launch that reads each group once from memory
    assert (p["strategy"], p["vec"], p["tile_kb"], p["lookahead"]) == ("stream", 8, 64, 1)
    vae_res = _resolved(BY_NAME["group_norm"], vae, p, Hardware())
    assert [x.kernel for x in vae_res.launches] == ["gn_stream"]
    assert vae_res.launches[0].grid[0] == 32 * 2 * 64  # statistics and apply tiles of 64 KB, 64 per 4 MB group
    assert [(n, z) for n, _, z in vae_res.workspaces] == [("part", False), ("ctr", True)]  # counters start at 0
    # 512 KB groups fit a cluster of 8 blocks' shared memory: one launch, one pass over memory
    mid = next(c for s, c in by_sig.items() if s.startswith("bf16[1,512,128,128]"))
    p = BY_NAME["group_norm"].default(mid)
    assert (p["strategy"], p["cluster"], p["stash"], p["block"], p["unroll"]) == ("cluster", 8, "all", 256, 1)
    res = resolve(parse_spec(BY_NAME["group_norm"].render(mid, p).spec), Env.from_card(mid.signature, mid.outputs))
    assert res.launches[0].shared == 262144 // 8 * 2  # the whole chunk stashed
    ln = next(c for s, c in by_sig.items() if s.startswith("bf16[2,4096,1536]"))
    assert BY_NAME["layer_norm"].default(ln)["vec"] == 8
    ln_res = _resolved(BY_NAME["layer_norm"], ln, BY_NAME["layer_norm"].default(ln), Hardware())
    assert [x.kernel for x in ln_res.launches] == ["ln_regs"]  # the row stays in registers
    bn = next(c for s, c in by_sig.items() if s.startswith("f16[32,256,56,56]"))
    bn_res = _resolved(BY_NAME["batch_norm"], bn, BY_NAME["batch_norm"].default(bn), Hardware())
    written = {a.value for x in bn_res.launches for a in x.args if a.ctype == "ptr"}
    assert {("output", 1), ("output", 2)} <= written  # CUDA saves [C] are written


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_captured_cards_are_accepted(dtype):
    for name, card in _cards_for(dtype):
        assert BY_NAME[name].accepts(card) is None, (name, card.signature_text, BY_NAME[name].accepts(card))
    # Every template is the one the builtin proposer picks for its op.
    prop = BuiltinProposer(list(TEMPLATES))
    for name, card in _cards_for(dtype):
        assert prop.template_for(card)[0] is BY_NAME[name]


def _with_arg(card: OperatorCard, arg: str, **changes: Any) -> OperatorCard:
    sig = copy.deepcopy(card.signature)
    for a in sig["args"]:
        if a["name"] == arg:
            a.update(changes)
    return OperatorCard(card.card_id, card.op, sig, signature_text(sig), card.outputs)


def _with_outputs(card: OperatorCard, outputs: list[dict]) -> OperatorCard:
    return OperatorCard(card.card_id, card.op, card.signature, card.signature_text, outputs)


def test_declines_what_it_does_not_handle_exactly():
    gn = group_norm_card([2, 64, 8, 8], 32, torch.bfloat16)
    ln = layer_norm_card([4, 16, 96], [96], torch.float16)
    bn = batch_norm_card([4, 32, 14, 14], torch.float16)
    cases = {
        "channels_last": _with_arg(gn, "input", stride=[4096, 1, 512, 64]),
        "cpu tensor": _with_arg(gn, "input", device="cpu"),
        "float64": _with_arg(gn, "input", dtype="float64"),
        "neg bit": _with_arg(gn, "input", neg=True),
        "weight of the wrong size": _with_arg(gn, "weight", shape=[32], stride=[1]),
        "mean output of the wrong size": _with_outputs(gn, [gn.outputs[0], _desc([2, 16], torch.bfloat16),
                                                            gn.outputs[2]]),
        "layer_norm strided rows": _with_arg(ln, "input", stride=[3072, 192, 1]),
        "normalized_shape not trailing": _with_arg(ln, "normalized_shape", value=[16]),
        "batch_norm training": _with_arg(bn, "training", value=True),
        "batch_norm without running stats": _with_arg(bn, "running_var", absent=True),
        "batch_norm saves of another size": _with_outputs(bn, [bn.outputs[0], _desc([7], torch.float32),
                                                               _desc([7], torch.float32)]),
        "batch_norm channels_last": _with_arg(bn, "input", stride=[6272, 1, 448, 32]),
    }
    for what, card in cases.items():
        t = next(t for t in TEMPLATES if card.op in t.ops)
        why = t.accepts(card)
        assert why, f"{what}: accepted"
    gn_op = OperatorCard("x", "aten::native_layer_norm", gn.signature, gn.signature_text, gn.outputs)
    assert BY_NAME["group_norm"].accepts(gn_op)
    cudnn = OperatorCard("x", "aten::cudnn_batch_norm", _with_arg(bn, "eps", name="epsilon").signature, "",
                      bn.outputs + [_desc([0], torch.uint8)])
    assert "non-empty" in BY_NAME["batch_norm"].accepts(cudnn)
    cudnn_ok = _with_outputs(cudnn, [bn.outputs[0]] + [_desc([0], torch.float32)] * 2 + [_desc([0], torch.uint8)])
    assert BY_NAME["batch_norm"].accepts(cudnn_ok) is None


def test_builtin_proposer_proposes_defaults_then_untried_neighbours():
    prop = BuiltinProposer(list(TEMPLATES))
    card = _h200_cards()[0]
    first = asyncio.run(prop.propose(ProposalRequest(card=card, hardware=Hardware())))
    assert first.ok and first.params and first.params["template"] in BY_NAME
    parent = Attempt("c0", first.source, first.spec, params=first.params)
    child = asyncio.run(prop.propose(ProposalRequest(card=card, hardware=Hardware(), parent=parent,
                                                     intent="occupancy")))
    assert child.ok and child.params != first.params
    parse_spec(child.spec)


def test_builtin_proposer_offers_cluster_kernels_only_to_gpus_that_have_clusters():
    """On sm_90 the first kernel for 512 KB groups is the one-launch cluster kernel; a GPU without thread-block
    clusters (sm_80) gets only kernels it can launch, the first of them a fresh one, and the search still
    gets untried neighbours."""
    card = group_norm_card([1, 512, 128, 128], 32, torch.bfloat16)
    hopper = asyncio.run(BuiltinProposer(list(TEMPLATES)).propose(ProposalRequest(card=card, hardware=Hardware())))
    assert [x.kernel for x in parse_spec(hopper.spec).launches] == ["gn_cluster"]
    prop = BuiltinProposer(list(TEMPLATES))
    ampere = Hardware(name="NVIDIA A100", arch="sm_80", sms=108)
    seen = []
    for i in range(8):
        parent = Attempt(f"c{i}", seen[-1].source, seen[-1].spec, params=seen[-1].params) if seen else None
        got = asyncio.run(prop.propose(ProposalRequest(card=card, hardware=ampere, parent=parent, seed=i)))
        assert got.ok and "__cluster_dims__" not in got.source, got.intent
        seen.append(got)
    assert len({p.source for p in seen}) == len(seen)


def test_intent_directed_mutation_changes_only_what_the_intent_is_about():
    cards = [card for dtype in DTYPES for _, card in _cards_for(dtype)]
    assert check_intent_directed_children(list(TEMPLATES), cards) >= len(cards) // 2


# ------------------------------------------------------------------------------ render + resolve

_KERNEL_RE = re.compile(r'extern "C" __global__ void (?:__cluster_dims__\([\w, ]+\)\s*)?(?:__launch_bounds__\([\w, ]+\)\s*)?(\w+)\(')


def _kernels_in(source: str) -> set[str]:
    return set(_KERNEL_RE.findall(source))


def _check_rendered(name: str, card: OperatorCard, params: dict) -> tuple[str, list[str]]:
    """Render, parse, resolve against the card; returns (source, kernel names the spec launches)."""
    r = BY_NAME[name].render(card, params)
    spec = parse_spec(r.spec)
    res = resolve(spec, Env.from_card(card.signature, card.outputs))
    launched = [ln.kernel for ln in res.launches]
    assert set(launched) <= _kernels_in(r.source), (launched, _kernels_in(r.source))
    for ln in res.launches:
        assert ln.grid[0] >= 1 and ln.block[0] % 32 == 0
        ptrs = [a.value for a in ln.args if a.ctype == "ptr"]
        assert ("null",) not in ptrs  # absent tensors get a variant without the load, not a NULL
        if name == "batch_norm" and not any(card.outputs[k]["shape"][0] for k in (1, 2)):
            assert ("output", 1) not in ptrs and ("output", 2) not in ptrs  # nothing to write
    for _, nbytes, _ in res.workspaces:
        assert nbytes > 0
    return r.source, launched


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_instance_renders_and_resolves(dtype):
    count = 0
    for name, card in _cards_for(dtype):
        space = BY_NAME[name].space(card)
        assert all(len(v) for v in space.values())
        for values in itertools.product(*space.values()):
            _check_rendered(name, card, dict(zip(space, values)))
            count += 1
    assert count > 100


def _walk(name: str, card: OperatorCard, steps: int, seed: int) -> list[dict]:
    """The default and `steps` seeded mutations (a random walk, as the search explores)."""
    t = BY_NAME[name]
    rng = random.Random(seed)
    params = t.default(card)
    out = [params]
    for _ in range(steps):
        params = t.mutate(card, params, rng)
        out.append(params)
    return out


_POOL: list[Any] = []


def _compile_pool() -> Any:
    """The compile pool (two NVRTC worker processes) of every _compile_all in this process: a pool per call
    spawned its workers, loaded NVRTC and built their precompiled headers again, ~1.5 s each time."""
    if not _POOL:
        import atexit

        from engine.compile import CompilePool

        _POOL.append(CompilePool(max_workers=2))
        atexit.register(_POOL[0].close)
    return _POOL[0]


def _compile_all(jobs: dict[str, tuple[Any, set[str]]]) -> None:
    """Compile every source for sm_90 (two workers); each must compile without a warning and define the
    kernels its specs launch."""
    pool = _compile_pool()
    try:
        futures = {src: pool.submit(src, arch="sm_90") for src in jobs}
        results = {src: f.result(timeout=300) for src, f in futures.items()}
    except BaseException:
        _POOL.pop().close()  # a stuck or broken pool is not the next test's
        raise
    for src, res in results.items():
        what, launched = jobs[src]
        assert res.ok, f"{what}: {res.summary()}\n{src[-2000:]}"
        assert launched <= set(res.kernels), (launched, res.kernels)
        assert not res.warnings, f"{what}: {res.summary()}"


def _walk_jobs(steps: int) -> tuple[dict[str, tuple[Any, set[str]]], dict[str, set]]:
    """The compile jobs of the default and `steps` mutations of each template's richest card in each dtype, and
    {source: what it was rendered from (its card, kernels, parameter values)}."""
    jobs: dict[str, tuple[Any, set[str]]] = {}
    options: dict[str, set] = {}
    for dtype in DTYPES:
        first: dict[str, OperatorCard] = {}
        for name, card in _cards_for(dtype):
            first.setdefault(name, card)  # the richest card per template (affine, stats outputs)
        for i, (name, card) in enumerate(first.items()):
            for params in _walk(name, card, steps, seed=i):
                src, launched = _check_rendered(name, card, params)
                jobs.setdefault(src, (name, set()))[1].update(launched)
                options.setdefault(src, set()).update({("card", name, str(dtype)), *(("kernel", k) for k in launched),
                                                       *((name, k, repr(v)) for k, v in params.items())})
    return jobs, options


def _label_options(jobs: dict[str, tuple[Any, set[str]]]) -> dict[str, set]:
    """{source: its label's values, each with its place in the label, and its kernels}: what `covering` spreads a
    sample over."""
    return {src: {*((i, repr(v)) for i, v in enumerate(label)), *(("kernel", k) for k in kernels)}
            for src, (label, kernels) in jobs.items()}


def _sample(jobs: dict[str, tuple[Any, set[str]]], options: dict[str, set],
            first: list[str] = ()) -> dict[str, tuple[Any, set[str]]]:
    """`first` and as few other jobs as make every value in `options` compiled at least once."""
    return {src: jobs[src] for src in covering(options, first=list(first))}


def test_default_and_a_few_mutations_compile_with_nvrtc_for_sm_90():
    """The default and 3 seeded mutations per card, and as few of the 30-mutation walks' sources as make every
    card, kernel and parameter value compiled at least once: ~44 of 235 sources. All of them under `-m sweep`."""
    few, _ = _walk_jobs(3)
    jobs, options = _walk_jobs(30)
    assert set(few) <= set(jobs)  # the same seeded walks, shorter
    _compile_all(_sample(jobs, options, first=list(few)))


@pytest.mark.sweep  # not in the default run (pyproject's addopts): python -m pytest -m sweep
def test_default_and_thirty_mutations_compile_with_nvrtc_for_sm_90():
    _compile_all(_walk_jobs(30)[0])


def _cluster_jobs() -> dict[str, tuple[Any, set[str]]]:
    """Every cluster size x stash x block of 8 groups of 65536 elements in each dtype, checked as rendered."""
    t = BY_NAME["group_norm"]
    jobs: dict[str, tuple[Any, set[str]]] = {}
    for dtype in DTYPES:
        card = group_norm_card([1, 32, 128, 128], 8, dtype)
        space = t.space(card)
        assert "cluster" in space["strategy"] and set(space["cluster"]) == {2, 4, 8, 16}
        for k, stash, block in itertools.product(space["cluster"], space["stash"], (512, 1024)):
            params = {**t.default(card), "strategy": "cluster", "cluster": k, "stash": stash, "block": block}
            src, launched = _check_rendered("group_norm", card, params)
            assert launched == ["gn_cluster"]
            res = resolve(parse_spec(t.render(card, params).spec), Env.from_card(card.signature, card.outputs))
            (ln,) = res.launches
            chunk = -(-65536 // k)
            isz = torch.empty(0, dtype=dtype).element_size()
            assert ln.grid[0] == 8 * k and res.workspaces[0][1] == 8 * k * 12
            if stash == "none":
                assert ln.shared == 0
            else:  # the whole chunk when it fits (it does here), in whole batches of block * vec elements
                assert chunk * isz <= ln.shared <= 200 * 1024 and ln.shared % (block * params["vec"] * isz) == 0
            jobs[src] = ((dtype, k, stash, block), {"gn_cluster"})
    return jobs


def test_group_norm_cluster_strategy_on_large_groups_only():
    """Groups too large for one block (the SD3.5 VAE's) get the one-launch cluster strategy besides split
    and fused: its spec asks for the stash as dynamic shared memory within the GPU's per-block limit and its
    workspace holds one Welford triple per block. Small groups (one block each) never offer it. A sample
    compiles for sm_90: every 8th and enough others for every dtype, cluster size, stash and block (every
    instance under `-m sweep`)."""
    t = BY_NAME["group_norm"]
    small = group_norm_card([2, 64, 16, 16], 32, torch.float16)
    assert "cluster" not in t.space(small)["strategy"]
    with pytest.raises(ValueError, match="cluster"):
        t.render(small, {**t.default(small), "strategy": "cluster", "cluster": 4, "stash": "all"})
    jobs = _cluster_jobs()
    vae = group_norm_card([1, 256, 512, 512], 32, torch.float16)  # 4 MB groups: split first, 8 x 512 KB chunks
    assert t.space(vae)["strategy"][:3] == ["stream", "persist", "split"] and t.space(vae)["cluster"][0] == 8
    r = resolve(parse_spec(t.render(vae, {**t.default(vae), "strategy": "cluster", "block": 1024}).spec),
                Env.from_card(vae.signature, vae.outputs))
    assert r.launches[0].shared == 96 * 1024 * 2 and r.launches[0].grid[0] == 32 * 8  # 12 batches of 1024 x 8
    every_8th = [src for src, _ in sorted(jobs.items(), key=lambda kv: str(kv[1][0]))[::8]]
    _compile_all(_sample(jobs, _label_options(jobs), first=every_8th))


def _stream_jobs() -> dict[str, tuple[Any, set[str]]]:
    """The stream kernel in each dtype, with and without affine, every lookahead and two tile sizes, on the
    SD3.5 VAE's largest tensor (32 groups of 8 MB), and with the statistics kept in L2 in each access width:
    rendered and resolved for the H200; the compile jobs."""
    t = BY_NAME["group_norm"]
    jobs: dict[str, tuple[Any, set[str]]] = {}
    for dtype in DTYPES:
        for affine in (True, False):
            card = group_norm_card([1, 128, 1024, 1024], 32, dtype, affine=affine)
            space = t.space(card)
            assert space["strategy"][0] == "stream" and set(space["lookahead"]) == {0, 1, 2}
            assert space["l2"] == ["default", "keep"]
            for la, tile in itertools.product(space["lookahead"], (64, 256)):
                src, launched = _check_rendered("group_norm", card, {**t.default(card), "lookahead": la,
                                                                     "tile_kb": tile})
                assert launched == ["gn_stream"]
                jobs[src] = ((dtype, affine, la, tile), {"gn_stream"})
            # the statistics kept in L2: createpolicy and ld.global.L2::cache_hint in each access width (bf16's
            # vectors of 8, 4, 2 and 1 elements are the 16, 8, 4 and 2-byte loads)
            for v in space["vec"] if dtype == torch.bfloat16 and affine else ():
                src, launched = _check_rendered("group_norm", card, {**t.default(card), "l2": "keep", "vec": v})
                assert "SH = 3, AH = 4" in src and launched == ["gn_stream"]
                jobs[src] = ((dtype, affine, "keep", v), {"gn_stream"})
    return jobs


def test_group_norm_stream_instances_compile_for_sm_90():
    """Every stream instance rendered and resolved (_stream_jobs); compiled for the H200: enough of them for
    every dtype, affine or not, lookahead, tile size and L2 access width (every one under `-m sweep`)."""
    jobs = _stream_jobs()
    _compile_all(_sample(jobs, _label_options(jobs)))


@pytest.mark.sweep  # not in the default run (pyproject's addopts): python -m pytest -m sweep
def test_every_group_norm_stream_instance_compiles_for_sm_90():
    _compile_all(_stream_jobs())


def _persist_jobs() -> dict[str, tuple[Any, set[str]]]:
    """The persist kernel in each dtype (bf16 and fp32 with affine, fp16 without), 1 and 2 blocks per SM, on
    the SD3.5 VAE's largest tensors: 8 MB groups kept whole in shared memory, 16 MB groups in part (fp32's 32 MB groups,
    less than half kept, are not offered it). Its launch is cooperative (the blocks wait for each other), its
    grid the GPU's SMs times the blocks per SM, and its shared memory three slots of what it keeps, within
    what an SM holds for that many blocks; its vectors are cp.async's 16 bytes whatever `vec` asks. The compile
    jobs."""
    t = BY_NAME["group_norm"]
    jobs: dict[str, tuple[Any, set[str]]] = {}
    for dtype, affine in ((torch.bfloat16, True), (torch.float16, False), (torch.float32, True)):
        isz = torch.empty(0, dtype=dtype).element_size()
        for shape in ([1, 128, 1024, 1024], [1, 256, 1024, 1024]):
            card = group_norm_card(shape, 32, dtype, affine=affine)
            space = t.space(card)
            group_mb = shape[1] // 32 * 1024 * 1024 * isz / 2**20
            if group_mb > 16:
                assert "persist" not in space["strategy"] and "per_sm" not in space
                continue
            assert space["strategy"][:2] == ["stream", "persist"] and space["per_sm"] == [1, 2]
            for per_sm, block in ((1, 1024), (2, 512)):
                params = {**t.default(card), "strategy": "persist", "per_sm": per_sm, "block": block, "vec": 2}
                src, launched = _check_rendered("group_norm", card, params)
                (ln,) = _resolved(t, card, params, H200).launches
                assert launched == ["gn_persist"] and ln.cooperative and ln.grid == (132 * per_sm, 1, 1)
                assert f"constexpr int V = {16 // isz};" in src and "cp.async.cg.shared.global" in src
                assert per_sm * (ln.shared + 1024) <= H200.shared_per_sm
                kept = int(re.search(r"KEEP = (\d+);", src).group(1))
                whole = int(re.search(r"int L = (\d+);", src).group(1))
                assert whole * 132 * per_sm >= shape[1] // 32 * 1024 * 1024 > (whole - 8) * 132 * per_sm
                assert ln.shared == 3 * kept * isz  # three slots: applied, counted, in flight
                assert (kept == whole) == (group_mb <= 8) and kept >= whole / 2
                jobs[src] = ((dtype, affine, shape[1], per_sm), {"gn_persist"})
    # small groups a few per step (2 MB groups: four per step still keep their slices whole)
    small = group_norm_card([1, 512, 256, 256], 32, torch.bfloat16)
    assert t.space(small)["gpi"] == [1, 2, 4]
    for gpi in (2, 4):
        params = {**t.default(small), "strategy": "persist", "per_sm": 1, "block": 1024, "gpi": gpi}
        src, launched = _check_rendered("group_norm", small, params)
        (ln,) = _resolved(t, small, params, H200).launches
        kept = int(re.search(r"KEEP = (\d+);", src).group(1))
        assert f"constexpr int K = {gpi};" in src and ln.shared == 3 * gpi * kept * 2
        assert kept == int(re.search(r"int L = (\d+);", src).group(1))
        jobs[src] = (("gpi", gpi), {"gn_persist"})
    # more threads than an SM holds for that many blocks: the block is narrowed (sm_12x SMs hold 1536)
    card, hw = group_norm_card([1, 128, 1024, 1024], 32, torch.bfloat16), Hardware(max_threads_per_sm=1536)
    narrowed = t.render(card, {**t.default(card, hw=hw), "strategy": "persist", "per_sm": 2, "block": 1024}, hw=hw)
    assert narrowed.params["block"] == 512 and "block 512" in narrowed.intent
    return jobs


def test_group_norm_persist_instances_compile_for_sm_90_as_cooperative_launches():
    """Every persist instance of _persist_jobs rendered and resolved as a cooperative launch; compiled for the
    H200: enough of them for every dtype, affine or not, group size, blocks per SM and groups per step (every one
    under `-m sweep`)."""
    jobs = _persist_jobs()
    _compile_all(_sample(jobs, _label_options(jobs)))


@pytest.mark.sweep  # not in the default run (pyproject's addopts): python -m pytest -m sweep
def test_every_group_norm_persist_instance_compiles_for_sm_90():
    _compile_all(_persist_jobs())


@pytest.mark.sweep  # not in the default run (pyproject's addopts): python -m pytest -m sweep
def test_every_group_norm_cluster_instance_compiles_for_sm_90():
    _compile_all(_cluster_jobs())


# ------------------------------------------------------------------------------ the GPU it is for


def _resolved(t: Any, card: OperatorCard, params: dict, hw: Hardware) -> Any:
    return resolve(parse_spec(t.render(card, params, hw=hw).spec), Env.from_card(card.signature, card.outputs),
                   max_shared=hw.max_shared_per_block)


def test_a_gb10_gets_its_own_grid_and_never_a_cluster_launch():
    """The same cards rendered for a 48-SM GB10 with 99 KB of shared memory per block: fewer blocks per
    group where the grid is sized by the SM count, and no strategy that launches a thread-block cluster."""
    t = BY_NAME["group_norm"]
    card = group_norm_card([1, 512, 128, 128], 32, torch.bfloat16)  # 32 groups of 512 KB
    h200, gb10 = _resolved(t, card, t.default(card), Hardware()), _resolved(t, card, t.default(card, hw=GB10), GB10)
    assert h200.launches[0].kernel == "gn_cluster" and h200.launches[0].shared > 0
    # 16 MB is more than half the GB10's 24 MB L2 (not the H200's 60 MB): the one-launch stream kernel first
    assert [ln.kernel for ln in gb10.launches] == ["gn_stream"]
    assert "stream" not in t.space(card)["strategy"]
    space = t.space(card, hw=GB10)
    assert "cluster" not in space["strategy"] and "cluster" not in space
    split = {**t.default(card), "strategy": "split"}
    split_h200 = _resolved(t, card, {**split, "blocks_per_group": t.space(card)["blocks_per_group"][0]}, Hardware())
    split_gb10 = _resolved(t, card, {**t.default(card, hw=GB10), "strategy": "split"}, GB10)
    assert [ln.kernel for ln in split_gb10.launches] == ["gn_partial", "gn_apply"]
    assert split_gb10.launches[0].grid[0] < split_h200.launches[0].grid[0]  # ~4 blocks per SM on each
    for name, c in [*_cards_for(torch.bfloat16), ("group_norm", card)]:
        tt = BY_NAME[name]
        sp = tt.space(c, hw=GB10)
        relevant, seen, specs = getattr(tt, "_relevant", None), set(), set()
        for values in itertools.product(*sp.values()):
            params = dict(zip(sp, values))
            # every kernel once: parameters the strategy does not read (its `_relevant`) render nothing new
            key = tuple(sorted((k, params.get(k)) for k in relevant(params))) if relevant else values
            if key in seen:
                continue
            seen.add(key)
            r = tt.render(c, dict(zip(sp, values)), hw=GB10)
            assert "__cluster_dims__" not in r.source, (name, values)  # the text IS the behaviour here
            if r.spec not in specs:  # and every launch fits its shared memory (each distinct spec resolved once:
                specs.add(r.spec)    # rendering and parsing each instance's again took 15 of 34 s)
                resolve(parse_spec(r.spec), Env.from_card(c.signature, c.outputs), max_shared=GB10.max_shared_per_block)


def test_the_stash_follows_the_gpus_shared_memory_per_block():
    """A cluster GPU with 99 KB per block stashes less of each chunk than the H200's 227 KB allows."""
    t = BY_NAME["group_norm"]
    card = group_norm_card([1, 256, 512, 512], 32, torch.float16)
    small = Hardware(name="sm_90 with 99 KB", max_shared_per_block=101376)
    params = {**t.default(card), "strategy": "cluster", "cluster": 8, "stash": "all", "block": 1024}
    big, little = _resolved(t, card, params, Hardware()), _resolved(t, card, params, small)
    assert 0 < little.launches[0].shared < big.launches[0].shared <= 200 * 1024
    assert little.launches[0].shared <= small.max_shared_per_block - 8 * 8 - 4096


def test_batch_norm_reports_the_params_it_rendered():
    """A vector width the strategy cannot use is narrowed in render; the params say what was rendered."""
    t = BY_NAME["batch_norm"]
    card = batch_norm_card([4, 32, 7, 7], torch.float16)  # 49-element planes: only scalar plane accesses
    space = t.space(card)
    assert space["strategy"][0] == "flat" and max(space["vec"]) > 1
    asked = {**t.default(card), "strategy": "plane", "vec": max(space["vec"])}
    r = t.render(card, asked)
    assert r.params["vec"] == 1 and r.params["strategy"] == "plane"
    assert t.render(card, r.params).source == r.source  # the reported params render the same kernel
    first = asyncio.run(BuiltinProposer(list(TEMPLATES)).propose(ProposalRequest(card, Hardware())))
    assert {k: v for k, v in first.params.items() if k != "template"} == t.render(card, t.default(card)).params


# ----------------------------------------------------------------------------------- emulation
# A few instances per template RUN on the CPU (tests/cuda_emulator.py), compared with float64 references
# of eager CUDA's arithmetic under the lane's own tolerance; run twice, into a NaN and a finite prefill,
# so unwritten elements and run-to-run differences show.


def test_kernels_run_correctly_in_the_cpu_emulation(tmp_path):
    if not emu.available():
        pytest.skip("g++ is needed for the CUDA-on-CPU emulation")
    prepared = []
    for name, card, bound, params, expected, *on in _emulation_cases():
        t, hw = BY_NAME[name], on[0] if on else Hardware()
        full = {**t.default(card, hw=hw), **params}
        assert t.accepts(card) is None, f"{card.signature_text}: declined: {t.accepts(card)}"
        r = t.render(card, full, hw=hw)
        res = resolve(parse_spec(r.spec), Env.from_card(card.signature, card.outputs))
        prepared.append((f"{card.op} {card.signature_text} {full}", card, bound, res, expected, r.source))
    failures = emulate_and_compare(prepared, tmp_path)
    assert not failures, "\n".join(failures)


def emulate_and_compare(prepared: list[tuple], tmp_path: Path) -> list[str]:
    """Build every (label, card, bound, resolved, expected, source) in one emulation program, run each twice
    (into a NaN and a finite prefill, so unwritten elements and run-to-run differences show) and compare
    with `expected` under the lane's tolerance; the failures, one line each."""
    from engine.verify.compare import bitwise_equal, compare_outputs
    from engine.verify.tolerance import tolerances_for

    program = emu.build([(p[5], p[3]) for p in prepared], tmp_path)

    def both_runs(k: int) -> list[emu.Run]:
        _, card, bound, res, _, _ = prepared[k]
        inputs = {n: v for n, v in bound.items() if isinstance(v, torch.Tensor)}
        return [emu.run(program, k, res, inputs, [emu.output_like(d, fill) for d in card.outputs], tmp_path / str(fill))
                for fill in (float("nan"), -1234.5)]

    for fill in (float("nan"), -1234.5):
        (tmp_path / str(fill)).mkdir()
    with ThreadPoolExecutor(2) as pool:  # each run is one OS thread: two at once
        all_runs = list(pool.map(both_runs, range(len(prepared))))
    failures = []
    for (label, card, bound, _, expected, _), runs in zip(prepared, all_runs):
        inputs = {n: v for n, v in bound.items() if isinstance(v, torch.Tensor)}
        bad = [r.error for r in runs if r.error]
        if not bad:
            got, again = runs[0].outputs, runs[1].outputs
            bad = [x.message for x in compare_outputs(got, expected, tolerances_for(card.op, expected)) if not x.ok]
            bad += [f"out{i} differs between runs" for i, (a, b) in enumerate(zip(got, again))
                    if not bitwise_equal(a, b)]
            bad += [f"input {n} was modified" for r in runs for n, v in r.inputs.items() if not torch.equal(v, inputs[n])]
        if bad:
            failures.append(f"{label}: {'; '.join(bad)}")
    return failures


# float64 references of what eager CUDA computes (the lane compares against eager on the GPU).

def _ref_group_norm(x, w, b, groups, eps, stats_dtype):
    n, c = x.shape[:2]
    xd = x.double().reshape(n, groups, -1)
    mean, var = xd.mean(-1), xd.var(-1, unbiased=False)
    mq, rq = mean.to(stats_dtype), (1 / torch.sqrt(var + eps)).to(stats_dtype)
    # RowwiseMoments rounds mean/rstd to the stats dtype; ComputeFusedParams uses the rounded values.
    a = rq.double()[:, :, None] * (w.double().reshape(groups, -1) if w is not None else 1)
    sh = -a * mq.double()[:, :, None] + (b.double().reshape(groups, -1) if b is not None else 0)
    y = x.double().reshape(n, groups, c // groups, -1) * a[..., None] + sh[..., None]
    return [y.reshape(x.shape).to(x.dtype), mq, rq]


def _ref_rows(x, ns, w, b, eps, rms):
    dims = tuple(range(x.dim() - len(ns), x.dim()))
    xd = x.double()
    if rms:
        mean, var = None, (xd * xd).mean(dims, keepdim=True)
        y = xd / torch.sqrt(var + eps)
    else:
        mean, var = xd.mean(dims, keepdim=True), xd.var(dims, unbiased=False, keepdim=True)
        y = (xd - mean) / torch.sqrt(var + eps)
    y = y * w.double() if w is not None else y
    y = y + b.double() if b is not None else y
    return y.to(x.dtype), mean, 1 / torch.sqrt(var + eps)


def _ref_batch_norm(x, w, b, rm, rv, eps):
    shp = [1, -1] + [1] * (x.dim() - 2)
    inv = 1 / torch.sqrt(rv.double() + eps)
    y = (x.double() - rm.double().reshape(shp)) * inv.reshape(shp)
    y = y * w.double().reshape(shp) if w is not None else y
    y = y + b.double().reshape(shp) if b is not None else y
    return y.to(x.dtype), rm.double(), inv


# A GPU whose L2 is small enough (and no clusters) that the emulation's small tensors get the stream strategy.
SMALL_L2 = Hardware(l2_bytes=128 * 1024, clusters=False)
# The same with 2 SMs (the persist strategy launches a few blocks per SM, all at once in the emulation), and
# with 3 SMs of 64 KB of shared memory each: part of every block's slice is read again instead of kept.
TWO_SMS = Hardware(l2_bytes=128 * 1024, clusters=False, sms=2)
SMALL_SMEM = Hardware(l2_bytes=128 * 1024, clusters=False, sms=3, shared_per_sm=64 * 1024,
                      max_shared_per_block=64 * 1024)


def _case_group_norm(shape, groups, dtype, affine, params, hw=None):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 0.5 + 3.0).to(dtype)  # mean >> std: cancellation would show
    c = shape[1]
    w = (torch.randn(c, generator=g) * 0.3 + 1).to(dtype) if affine else None
    b = (torch.randn(c, generator=g) * 0.2).to(dtype) if affine else None
    t = _capture(lambda: F.group_norm(x, groups, w, b, 1e-6))
    card = _brief(t.op, t.signature, t.outputs)
    op = torch.ops.aten.native_group_norm.default
    bound = dict(bind_arguments(op, (x, w, b, shape[0], c, x[0, 0].numel(), groups, 1e-6), {}))
    return "group_norm", card, bound, params, _ref_group_norm(x, w, b, groups, 1e-6, dtype), *([hw] if hw else [])


def _case_rows(name, shape, ns, dtype, affine, params, op="aten::native_layer_norm", eps=1e-5):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(shape, generator=g) + 2.0).to(dtype)
    w = (torch.randn(ns, generator=g) * 0.3 + 1).to(dtype) if affine else None
    b = (torch.randn(ns, generator=g) * 0.2).to(dtype) if affine and name == "layer_norm" else None
    st = _stat_shape(shape, len(ns))
    if name == "layer_norm":
        fn, args = torch.ops.aten.native_layer_norm.default, (x, ns, w, b, eps)
    elif op == "aten::_fused_rms_norm":
        fn, args = torch.ops.aten._fused_rms_norm.default, (x, ns, w, eps)
    else:
        fn, args = torch.ops.aten.rms_norm.default, (x, ns, w, eps)
    y, mean, rstd = _ref_rows(x, ns, w, b, 1.1920928955078125e-07 if eps is None else eps, name == "rms_norm")
    outs, exp = [_desc(shape, dtype)], [y]
    stats = [] if op == "aten::rms_norm" else [rstd] if name == "rms_norm" else [mean, rstd]
    outs += [_desc(st, torch.float32)] * len(stats)
    exp += [s.reshape(st).float() for s in stats]
    card = _brief(op, signature_of(fn, bind_arguments(fn, args, {})), outs)
    return name, card, dict(bind_arguments(fn, args, {})), params, exp


def _case_batch_norm(shape, dtype, affine, saves, params, op="aten::native_batch_norm", pdtype=None):
    g = torch.Generator().manual_seed(3)
    c = shape[1]
    pdtype = pdtype or dtype
    x = (torch.randn(shape, generator=g) + 1).to(dtype)
    w = (torch.randn(c, generator=g) * 0.3 + 1).to(pdtype) if affine else None
    b = (torch.randn(c, generator=g) * 0.2).to(pdtype) if affine else None
    rm, rv = (torch.randn(c, generator=g) * 0.5 + 1).to(pdtype), (torch.rand(c, generator=g) + 0.5).to(pdtype)
    if op == "aten::native_batch_norm":
        fn, args = torch.ops.aten.native_batch_norm.default, (x, w, b, rm, rv, False, 0.1, 1e-5)
    else:
        fn, args = torch.ops.aten._native_batch_norm_legit_no_training.default, (x, w, b, rm, rv, 0.1, 1e-5)
    y, mean, inv = _ref_batch_norm(x, w, b, rm, rv, 1e-5)
    n = c if saves else 0
    outs = [_desc(shape, dtype), _desc([n], torch.float32), _desc([n], torch.float32)]
    exp = [y, mean.float(), inv.float()] if saves else [y, torch.empty(0), torch.empty(0)]
    card = _brief(op, signature_of(fn, bind_arguments(fn, args, {})), outs)
    return "batch_norm", card, dict(bind_arguments(fn, args, {})), params, exp


def _emulation_cases() -> list[tuple]:
    """Small shapes (the emulation runs a thread per CUDA thread) covering every code path."""
    bf, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    return [
        _case_group_norm([1, 8, 8, 8], 2, bf, True, {"strategy": "fused", "block": 256}),
        _case_group_norm([1, 8, 8, 8], 2, f16, True, {"strategy": "split", "blocks_per_group": 4, "block": 256,
                                                      "unroll": 1}),
        # 25-element planes (vec 1), chunks of 4 over 50 elements: uneven and empty chunks.
        _case_group_norm([1, 4, 5, 5], 2, bf, False, {"strategy": "split", "blocks_per_group": 16, "block": 128,
                                                      "order": "forward"}),
        _case_group_norm([2, 4, 4, 4], 2, bf, True, {"strategy": "split", "blocks_per_group": 2, "block": 256}),
        _case_group_norm([1, 6, 24], 3, f32, True, {"strategy": "fused", "block": 256, "unroll": 2}),
        # One cluster per group: chunks of 131072 of which 102400 stay in shared memory (the rest re-read);
        # 16 uneven chunks without a stash; four groups with whole chunks stashed.
        _case_group_norm([1, 4, 256, 256], 1, bf, True, {"strategy": "cluster", "cluster": 2, "block": 128}),
        _case_group_norm([1, 6, 100, 100], 2, f32, False, {"strategy": "cluster", "cluster": 16, "block": 128,
                                                           "stash": "none", "unroll": 2}),
        _case_group_norm([2, 8, 128, 128], 2, f16, True, {"strategy": "cluster", "cluster": 4, "block": 128,
                                                          "unroll": 1}),
        # Stream (tickets drawn in launch order here): 80 KB groups in three tiles (the last one shorter),
        # statistics one group ahead; four groups two ahead, no affine; one group of two tiles, statistics
        # then apply.
        _case_group_norm([1, 4, 128, 160], 2, bf, True, {"strategy": "stream", "tile_kb": 32, "lookahead": 1,
                                                        "block": 128}, hw=SMALL_L2),
        _case_group_norm([2, 4, 128, 160], 2, f16, False, {"strategy": "stream", "tile_kb": 32, "lookahead": 2,
                                                          "block": 128, "unroll": 1}, hw=SMALL_L2),
        _case_group_norm([1, 2, 100, 100], 1, f32, True, {"strategy": "stream", "tile_kb": 64, "lookahead": 0,
                                                         "block": 256}, hw=SMALL_L2),
        # The same with the statistics kept in L2 (the policy is a cache hint: the emulation runs plain loads),
        # and with at most 2 blocks per SM (dynamic shared memory the kernel leaves unused)
        _case_group_norm([1, 4, 128, 160], 2, bf, True, {"strategy": "stream", "tile_kb": 32, "lookahead": 1,
                                                        "block": 128, "l2": "keep", "resident": 2}, hw=SMALL_L2),
        # Persist (one cooperative launch, every block at once): two 80 KB groups in 2 slices kept whole; six
        # (each of the three slots used twice); five two at a time (the last step one group); four groups in
        # 6 slices (2 per SM) of which shared memory keeps part, two at a time; one fp32 group in 3 uneven
        # slices.
        _case_group_norm([1, 4, 128, 160], 2, bf, True, {"strategy": "persist", "per_sm": 1, "block": 128},
                         hw=TWO_SMS),
        _case_group_norm([2, 6, 128, 160], 3, bf, True, {"strategy": "persist", "per_sm": 1, "block": 128,
                                                        "unroll": 2}, hw=TWO_SMS),
        _case_group_norm([1, 5, 256, 160], 5, bf, True, {"strategy": "persist", "per_sm": 1, "block": 128,
                                                        "gpi": 2}, hw=TWO_SMS),
        _case_group_norm([2, 4, 128, 160], 2, f16, False, {"strategy": "persist", "per_sm": 2, "block": 128,
                                                          "unroll": 1, "gpi": 2}, hw=SMALL_SMEM),
        _case_group_norm([1, 2, 100, 100], 1, f32, True, {"strategy": "persist", "per_sm": 1, "block": 256},
                         hw=SMALL_SMEM),
        _case_rows("layer_norm", [3, 5, 40], [40], bf, True, {}),
        _case_rows("layer_norm", [2, 3, 1536], [1536], bf, False, {"block": 512, "rows_per_block": 1}),
        _case_rows("layer_norm", [2, 3, 12, 20], [12, 20], f16, True, {"vec": 2}),
        _case_rows("layer_norm", [2, 16384], [16384], f32, True, {"block": 128, "rows_per_block": 1}),  # stream
        _case_rows("rms_norm", [3, 5, 64], [64], bf, True, {}, op="aten::_fused_rms_norm", eps=1e-6),
        _case_rows("rms_norm", [3, 5, 64], [64], f16, False, {}, op="aten::_fused_rms_norm", eps=None),
        _case_rows("rms_norm", [2, 16384], [16384], f32, True, {"block": 128, "rows_per_block": 1},
                   op="aten::_fused_rms_norm", eps=1e-6),
        _case_rows("rms_norm", [4, 48], [48], bf, True, {}, op="aten::rms_norm", eps=1e-6),
        _case_batch_norm([4, 16, 7, 7], f16, True, True, {"strategy": "flat", "block": 128}),
        _case_batch_norm([2, 128, 7, 7], bf, True, True, {"strategy": "flat", "block": 128, "unroll": 1}),
        _case_batch_norm([2, 8, 32, 32], f16, False, False, {"strategy": "plane", "block": 128}),
        _case_batch_norm([3, 5, 6], f32, True, True, {"strategy": "plane", "block": 128},
                         op="aten::_native_batch_norm_legit_no_training"),
        _case_batch_norm([4, 16, 7, 7], f16, True, True, {"strategy": "flat", "block": 128}, pdtype=f32),
    ]


def test_group_norm_stream_keeps_its_statistics_in_l2_only_where_the_gpu_has_eviction_policies():
    """`l2: keep` (createpolicy, sm_80 on) is offered to the H200's stream kernel, not to a Volta's, and a
    kernel asked for it there is refused with the reason rather than rendered without it."""
    t = BY_NAME["group_norm"]
    card = group_norm_card([1, 128, 1024, 1024], 32, torch.bfloat16)
    assert t.space(card)["l2"] == ["default", "keep"]
    assert "SH = 0, AH = 1" in t.render(card, t.default(card)).source  # the first kernel: as before
    assert "SH = 3, AH = 4" in t.render(card, {**t.default(card), "l2": "keep"}).source
    volta = Hardware(arch="sm_70")
    assert t.space(card, hw=volta)["strategy"][0] == "stream" and "l2" not in t.space(card, hw=volta)
    with pytest.raises(ValueError, match="sm_80"):
        t.render(card, {**t.default(card, hw=volta), "l2": "keep"}, hw=volta)


@pytest.mark.parametrize("hw", [Hardware(), GB10], ids=["h200", "gb10"])
def test_group_norm_stream_can_hold_fewer_blocks_per_sm(hw):
    """`resident: N` pads each stream block with dynamic shared memory so that N fit on an SM and N + 1 do not
    (fewer tiles in flight between a group's two reads, which the L2 must hold); "all" (the first kernel) adds
    none, and block sizes whose threads already cap an SM at N need none."""
    t = BY_NAME["group_norm"]
    card = group_norm_card([1, 128, 1024, 1024], 32, torch.bfloat16)
    space = t.space(card, hw=hw)
    assert space["resident"][0] == "all"
    base = {**t.default(card, hw=hw), "strategy": "stream", "block": 512}
    assert _resolved(t, card, base, hw).launches[0].shared == 0
    # the test's GB10 has 228 KB per SM but 99 KB per block: one block per SM cannot be forced there
    assert space["resident"][1:] == ([2, 3, 1] if hw.max_shared_per_block * 2 > hw.shared_per_sm else [2, 3])
    if 1 not in space["resident"]:
        with pytest.raises(ValueError, match="cannot keep 2 blocks off an SM"):
            t.render(card, {**base, "resident": 1}, hw=hw)
    for n in space["resident"][1:]:
        r = _resolved(t, card, {**base, "resident": n}, hw)
        (launch,) = r.launches
        # + static (red[] padded to ab's 8-byte alignment, ab, the ticket: 248 B in sm_90's build) + the reserve
        static = 208 + 8 * 4 + 8
        assert launch.shared + static <= hw.max_shared_per_block  # 1 per SM took 4 B too many on the H200
        per_block = launch.shared + static + 1024
        assert n * per_block <= hw.shared_per_sm < (n + 1) * per_block, (n, launch.shared)
        assert f"at most {n} block(s) per SM" in t.render(card, {**base, "resident": n}, hw=hw).intent
    big = {**base, "block": 1024, "resident": 2}  # 2 x 1024 threads fill an SM already
    assert _resolved(t, card, big, hw).launches[0].shared == 0
