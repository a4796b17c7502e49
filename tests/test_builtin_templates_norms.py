"""CPU tests of the normalisation templates (engine/propose/builtin/norms.py).

Cards are real: the H200 captures in docs/results/capture-h200, and signatures captured here on CPU
tensors (marked cuda, with the outputs CUDA eager gives: fp32 layer_norm statistics, [C] batch_norm
saves). Every instance renders and resolves; default + 30 seeded mutations compile with NVRTC for
sm_90; and a few instances per template RUN on the CPU through a small CUDA emulation (one OS thread
per CUDA thread, barriers for __syncthreads and warp shuffles, UBSan for misaligned vector accesses,
guard bytes for stray writes), compared with float64 references of eager CUDA's arithmetic under the
lane's own tolerance. The emulation runs in a subprocess so a kernel that aborts fails one test.

Run the emulation alone: `python tests/test_builtin_templates_norms.py --emulate`.
"""

from __future__ import annotations

import copy
import ctypes
import hashlib
import itertools
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from card_helpers import brief, captured, h200_cards

from engine.capture.signature import bind_arguments, describe_tensor, signature_of, signature_text
from engine.cards import OperatorCard
from engine.launch import parse_spec, resolve
from engine.launch.expr import Env
from engine.propose.builtin.norms import TEMPLATES

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
    """Captured on CPU; CUDA eager returns the same outputs (mean/rstd in the input dtype, [N, group])."""
    x = torch.randn(shape, dtype=dtype)
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
    assert p["strategy"] == "split" and p["vec"] == 8 and p["blocks_per_group"] >= 16
    # 512 KB groups fit a cluster of 8 blocks' shared memory: one launch, one pass over memory
    mid = next(c for s, c in by_sig.items() if s.startswith("bf16[1,512,128,128]"))
    p = BY_NAME["group_norm"].default(mid)
    assert (p["strategy"], p["cluster"], p["stash"], p["block"], p["unroll"]) == ("cluster", 8, "all", 256, 1)
    res = resolve(parse_spec(BY_NAME["group_norm"].render(mid, p).spec), Env.from_card(mid.signature, mid.outputs))
    assert res.launches[0].shared == 262144 // 8 * 2  # the whole chunk stashed
    ln = next(c for s, c in by_sig.items() if s.startswith("bf16[2,4096,1536]"))
    assert BY_NAME["layer_norm"].default(ln)["vec"] == 8
    assert "ln_regs" in BY_NAME["layer_norm"].render(ln, BY_NAME["layer_norm"].default(ln)).spec
    bn = next(c for s, c in by_sig.items() if s.startswith("f16[32,256,56,56]"))
    r = BY_NAME["batch_norm"].render(bn, BY_NAME["batch_norm"].default(bn))
    assert '{ ptr = "out1" }' in r.spec and '{ ptr = "out2" }' in r.spec  # CUDA saves [C] are written


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_captured_cards_are_accepted(dtype):
    for name, card in _cards_for(dtype):
        assert BY_NAME[name].accepts(card) is None, (name, card.signature_text, BY_NAME[name].accepts(card))
    # Every template is the one the builtin proposer picks for its op.
    from engine.propose.builtin.proposer import BuiltinProposer

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
    import asyncio

    from engine.propose.base import Attempt, Hardware, ProposalRequest
    from engine.propose.builtin.proposer import BuiltinProposer

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
    import asyncio

    from engine.propose.base import Attempt, Hardware, ProposalRequest
    from engine.propose.builtin.proposer import BuiltinProposer

    card = group_norm_card([1, 512, 128, 128], 32, torch.bfloat16)
    hopper = asyncio.run(BuiltinProposer(list(TEMPLATES)).propose(ProposalRequest(card=card, hardware=Hardware())))
    assert "__cluster_dims__(8, 1, 1)" in hopper.source
    prop = BuiltinProposer(list(TEMPLATES))
    ampere = Hardware(name="NVIDIA A100", arch="sm_80", sms=108)
    seen = []
    for i in range(8):
        parent = Attempt(f"c{i}", seen[-1].source, seen[-1].spec, params=seen[-1].params) if seen else None
        got = asyncio.run(prop.propose(ProposalRequest(card=card, hardware=ampere, parent=parent, seed=i)))
        assert got.ok and "__cluster_dims__" not in got.source, got.intent
        seen.append(got)
    assert len({p.source for p in seen}) == len(seen)


# ------------------------------------------------------------------------------ render + resolve

_KERNEL_RE = re.compile(r'extern "C" __global__ void (?:__cluster_dims__\([\w, ]+\)\s*)?(?:__launch_bounds__\(\w+\)\s*)?(\w+)\(')


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


def test_default_and_mutations_compile_with_nvrtc_for_sm_90(capsys):
    from engine.compile import CompilePool

    jobs: dict[str, tuple[str, set[str]]] = {}
    for dtype in DTYPES:
        first: dict[str, OperatorCard] = {}
        for name, card in _cards_for(dtype):
            first.setdefault(name, card)  # the richest card per template (affine, stats outputs)
        for i, (name, card) in enumerate(first.items()):
            for params in _walk(name, card, 30, seed=i):
                src, launched = _check_rendered(name, card, params)
                jobs.setdefault(src, (name, set()))[1].update(launched)
    pool = CompilePool(max_workers=2)
    started = time.perf_counter()
    try:
        futures = {src: pool.submit(src, arch="sm_90") for src in jobs}
        results = {src: f.result(timeout=300) for src, f in futures.items()}
    finally:
        pool.close()
    wall = time.perf_counter() - started
    per_family: dict[str, list[float]] = {}
    for src, res in results.items():
        name, launched = jobs[src]
        assert res.ok, f"{name}: {res.summary()}\n{src[-2000:]}"
        assert launched <= set(res.kernels), (launched, res.kernels)
        assert not res.warnings, f"{name}: {res.summary()}"
        per_family.setdefault(name, []).append(res.seconds)
    with capsys.disabled():
        counts = ", ".join(f"{k} {len(v)} ({sum(v):.1f} s)" for k, v in sorted(per_family.items()))
        print(f"\nnorm templates: {len(results)} distinct sources compiled for sm_90, {wall:.1f} s wall "
              f"on 2 workers; compile time per family: {counts}")


def test_group_norm_cluster_strategy_on_large_groups_only(capsys):
    """Groups too large for one block (the SD3.5 VAE's) get the one-launch cluster strategy besides split
    and fused: its spec asks for the stash as dynamic shared memory within sm_90's 227 KB, its workspace
    holds one Welford triple per block, and every cluster size and stash choice compiles for sm_90 in
    each dtype without a warning. Small groups (one block each) never offer it."""
    from engine.compile import CompilePool

    t = BY_NAME["group_norm"]
    small = group_norm_card([2, 64, 16, 16], 32, torch.float16)
    assert "cluster" not in t.space(small)["strategy"]
    with pytest.raises(ValueError, match="cluster"):
        t.render(small, {**t.default(small), "strategy": "cluster", "cluster": 4, "stash": "all"})
    jobs = {}
    for dtype in DTYPES:
        card = group_norm_card([1, 32, 128, 128], 8, dtype)  # 8 groups of 65536 elements
        space = t.space(card)
        assert "cluster" in space["strategy"] and set(space["cluster"]) == {2, 4, 8, 16}
        for k, stash, block in itertools.product(space["cluster"], space["stash"], (512, 1024)):
            params = {**t.default(card), "strategy": "cluster", "cluster": k, "stash": stash, "block": block}
            src, launched = _check_rendered("group_norm", card, params)
            assert launched == ["gn_cluster"] and f"__cluster_dims__({k}, 1, 1)" in src
            res = resolve(parse_spec(t.render(card, params).spec), Env.from_card(card.signature, card.outputs))
            (ln,) = res.launches
            chunk = -(-65536 // k)
            isz = torch.empty(0, dtype=dtype).element_size()
            assert ln.grid[0] == 8 * k and res.workspaces[0][1] == 8 * k * 12
            if stash == "none":
                assert ln.shared == 0
            else:  # the whole chunk when it fits (it does here), in whole batches of block * vec elements
                assert chunk * isz <= ln.shared <= 200 * 1024 and ln.shared % (block * params["vec"] * isz) == 0
            jobs[src] = (dtype, k, stash, block)
    vae = group_norm_card([1, 256, 512, 512], 32, torch.float16)  # 4 MB groups: split first, 8 x 512 KB chunks
    assert t.space(vae)["strategy"][0] == "split" and t.space(vae)["cluster"][0] == 8
    r = resolve(parse_spec(t.render(vae, {**t.default(vae), "strategy": "cluster", "block": 1024}).spec),
                Env.from_card(vae.signature, vae.outputs))
    assert r.launches[0].shared == 96 * 1024 * 2 and r.launches[0].grid[0] == 32 * 8  # 12 batches of 1024 x 8
    pool = CompilePool(max_workers=2)
    try:
        results = {src: pool.submit(src, arch="sm_90") for src in jobs}
        for src, fut in results.items():
            res = fut.result(timeout=300)
            assert res.ok and not res.warnings, (jobs[src], res.summary())
            assert res.kernels == ("gn_cluster",)
    finally:
        pool.close()
    with capsys.disabled():
        print(f"\ngroup_norm cluster: {len(jobs)} instances compiled for sm_90")


# ----------------------------------------------------------------------------------- emulation

def test_kernels_run_correctly_in_the_cpu_emulation():
    if shutil.which("g++") is None:
        pytest.skip("g++ is needed for the CUDA-on-CPU emulation")
    proc = subprocess.run([sys.executable, __file__, "--emulate"], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert proc.returncode == 0, f"emulation crashed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    bad = [x for x in lines if not x["ok"]]
    assert lines and not bad, "\n".join(f"{x['case']}: {x['why']}" for x in bad)


_SHIM = r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

struct kf_dim3 { unsigned x, y, z; };
thread_local kf_dim3 threadIdx, blockIdx;
static kf_dim3 blockDim, gridDim;
using std::max;
using std::min;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__ __restrict
#define __cluster_dims__(...)

struct __half { _Float16 v; };
inline float __half2float(__half h) { return (float)h.v; }
inline __half __float2half_rn(float f) { __half h; h.v = (_Float16)f; return h; }
struct __nv_bfloat16 { uint16_t v; };
inline float __bfloat162float(__nv_bfloat16 b) { uint32_t u = (uint32_t)b.v << 16; float f; memcpy(&f, &u, 4); return f; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u; memcpy(&u, &f, 4); __nv_bfloat16 b;
  if ((u & 0x7fffffffu) > 0x7f800000u) { b.v = (uint16_t)((u >> 16) | 0x40); return b; }
  u += 0x7fffu + ((u >> 16) & 1u); b.v = (uint16_t)(u >> 16); return b;
}
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __fdividef(float a, float b) { return a / b; }

static void kf_align(const void* p, size_t a) {
  if (((uintptr_t)p) % a) { fprintf(stderr, "misaligned %zu-byte access at %p\n", a, p); abort(); }
}
template <class R> inline R __ldcs(const R* p) { kf_align(p, alignof(R)); return *p; }
template <class R> inline R __ldg(const R* p) { kf_align(p, alignof(R)); return *p; }
template <class R> inline void __stcs(R* p, R v) { kf_align(p, alignof(R)); *p = v; }
inline float __ldcg(const float* p) { return *p; }
inline void __stcg(float* p, float v) { *p = v; }

struct KfWarp { std::barrier<> bar{32}; uint32_t buf[32]; };
thread_local KfWarp* kf_warp;
thread_local int kf_lane;
thread_local std::barrier<>* kf_block;
template <class T> inline T kf_shfl(T v, int src) {
  static_assert(sizeof(T) == 4, "32-bit shuffles only");
  memcpy(&kf_warp->buf[kf_lane], &v, 4);
  kf_warp->bar.arrive_and_wait();
  T r; memcpy(&r, &kf_warp->buf[src & 31], 4);
  kf_warp->bar.arrive_and_wait();
  return r;
}
template <class T> inline T __shfl_sync(unsigned, T v, int src) { return kf_shfl(v, src); }
template <class T> inline T __shfl_xor_sync(unsigned, T v, int m) { return kf_shfl(v, kf_lane ^ m); }
template <class T> inline T __shfl_down_sync(unsigned, T v, unsigned d) {
  return kf_shfl(v, kf_lane + (int)d < 32 ? kf_lane + (int)d : kf_lane);
}
inline void __syncthreads() { kf_block->arrive_and_wait(); }

struct KfPtr { void* p; template <class T> operator T*() const { return (T*)p; } };

// Clusters run one after another, the K blocks of a cluster together (each rank's kernel is compiled in
// its own namespace, so a __shared__ static is its block's own); a thread that returns drops out of its
// block's and warp's barriers, as exited threads do on the GPU.
thread_local std::barrier<>* kf_cluster;
inline void gn_cluster_sync() { kf_cluster->arrive_and_wait(); }
template <class F> static void kf_run(unsigned grid, unsigned block, unsigned k, F body) {
  gridDim = {grid, 1, 1}; blockDim = {block, 1, 1};
  std::barrier<> between(block * k);
  std::vector<std::unique_ptr<std::barrier<>>> blocks, clusters;
  std::vector<std::unique_ptr<KfWarp>> warps;
  for (unsigned b = 0; b < grid; ++b) {
    blocks.emplace_back(new std::barrier<>(block));
    for (unsigned w = 0; w < block / 32; ++w) warps.emplace_back(new KfWarp());
  }
  for (unsigned c = 0; c < grid / k; ++c) clusters.emplace_back(new std::barrier<>(block * k));
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < block * k; ++t)
    ts.emplace_back([&, t] {
      const unsigned q = t / block, tl = t % block;
      for (unsigned c = 0; c < grid / k; ++c) {
        const unsigned b = c * k + q;
        threadIdx = {tl, 0, 0}; blockIdx = {b, 0, 0};
        kf_block = blocks[b].get(); kf_warp = warps[b * (block / 32) + tl / 32].get(); kf_lane = tl % 32;
        kf_cluster = clusters[c].get();
        body(q);
        kf_block->arrive_and_drop();
        kf_warp->bar.arrive_and_drop();
        between.arrive_and_wait();
      }
    });
  for (auto& th : ts) th.join();
}
"""

_ARG_C = {"ptr": "KfPtr{*(void**)a[%d]}", "f32": "*(float*)a[%d]", "f64": "*(double*)a[%d]",
          "i32": "*(int*)a[%d]", "i64": "*(long long*)a[%d]", "u32": "*(unsigned*)a[%d]",
          "u64": "*(unsigned long long*)a[%d]"}
_ARG_CT = {"f32": ctypes.c_float, "f64": ctypes.c_double, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
           "u32": ctypes.c_uint32, "u64": ctypes.c_uint64}
_GUARD = 64  # sentinel bytes around every output and workspace


def _emu_build(cases: list[tuple[str, list]], workdir: Path) -> ctypes.CDLL:
    """One shared object for every (source, launches) case: each source in its own namespace (with
    `extern "C"` dropped so kernel names do not clash), launch entry `kf_launch_<case>_<i>` per launch."""
    parts = [_SHIM]
    for k, (source, launches) in enumerate(cases):
        body = re.sub(r"#include <cuda_(fp16|bf16)\.h>", "", source).replace('extern "C" __global__', "__global__")
        body = re.sub(r"// kf-cluster-begin.*?// kf-cluster-end\n", "", body, flags=re.S)  # the shim's barrier
        found = re.search(r"__cluster_dims__\((\d+)", body)
        size = int(found.group(1)) if found else 1
        for i, ln in enumerate(launches):
            # dynamic shared memory: a static array of the launch's size in each rank's namespace
            dyn = re.sub(r"extern __shared__ __align__\((\d+)\) unsigned char (\w+)\[\];",
                         lambda m, shared=ln.shared: f"alignas({m.group(1)}) static unsigned char {m.group(2)}[{max(1, shared)}];",
                         body)
            for q in range(size):
                parts.append(f"namespace kfc{k}_{i}_{q} {{\n{dyn}\n}}")
            call = ", ".join(_ARG_C[a.ctype] % j for j, a in enumerate(ln.args))
            ranks = " ".join(f"case {q}: kfc{k}_{i}_{q}::{ln.kernel}({call}); break;" for q in range(size))
            parts.append(f'extern "C" void kf_launch_{k}_{i}(unsigned g, unsigned b, void** a) '
                         f"{{ kf_run(g, b, {size}, [&](unsigned q) {{ switch (q) {{ {ranks} }} }}); }}")
    text = "\n".join(parts) + "\n"
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    lib, src = workdir / f"emu_{key}.so", workdir / f"emu_{key}.cpp"
    src.write_text(text)
    subprocess.run(["g++", "-std=c++20", "-O0", "-shared", "-fPIC", "-pthread", "-w", "-fsanitize=alignment",
                    "-fno-sanitize-recover=all", "-o", str(lib), str(src)], check=True, capture_output=True)
    return ctypes.CDLL(str(lib))


def _guarded(nbytes: int) -> tuple[torch.Tensor, int]:
    raw = torch.full((nbytes + 2 * _GUARD + 16,), 0xA5, dtype=torch.uint8)
    return raw, (-raw.data_ptr()) % 16 + _GUARD


def _emu_run(lib: ctypes.CDLL, case: int, resolved: Any, bound: dict, outputs: list[dict],
             prefill: float) -> list[torch.Tensor]:
    """Launch like the lane: prefilled outputs, uninitialised (NaN) workspaces; checks guards and inputs."""
    outs, regions = [], []
    for d in outputs:
        dt = getattr(torch, d["dtype"])
        numel = int(torch.Size(d["shape"]).numel())
        isz = torch.empty(0, dtype=dt).element_size()
        raw, off = _guarded(max(numel, 1) * isz)
        t = torch.empty(0, dtype=dt).set_(raw.untyped_storage(), off // isz, d["shape"], d["stride"])
        if numel:
            t.fill_(prefill)
        outs.append(t)
        regions.append((raw, off, numel * isz))
    ws = {}
    for name, nbytes, zero in resolved.workspaces:
        raw, off = _guarded(nbytes)
        raw[off:off + nbytes] = 0 if zero else 0xFF
        ws[name] = raw[off:]
        regions.append((raw, off, nbytes))
    before = {k: v.clone() for k, v in bound.items() if isinstance(v, torch.Tensor)}
    keep = []
    for i, ln in enumerate(resolved.launches):
        argv = (ctypes.c_void_p * max(1, len(ln.args)))()
        for j, a in enumerate(ln.args):
            if a.ctype == "ptr":
                kind = a.value[0]
                t = (bound[a.value[1]] if kind == "input" else outs[a.value[1]] if kind == "output"
                     else ws[a.value[1]] if kind == "workspace" else None)
                box: Any = ctypes.c_void_p(0 if t is None else t.data_ptr())
            else:
                box = _ARG_CT[a.ctype](a.value)
            keep.append(box)
            argv[j] = ctypes.cast(ctypes.pointer(box), ctypes.c_void_p)
        getattr(lib, f"kf_launch_{case}_{i}")(ctypes.c_uint(ln.grid[0]), ctypes.c_uint(ln.block[0]), argv)
    for raw, off, n in regions:
        if not (bool((raw[:off] == 0xA5).all()) and bool((raw[off + n:] == 0xA5).all())):
            raise AssertionError("a write landed outside an output or workspace")
    for k, v in before.items():
        if not torch.equal(v, bound[k]):
            raise AssertionError(f"input {k} was modified")
    return outs


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


def _case_group_norm(shape, groups, dtype, affine, params):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 0.5 + 3.0).to(dtype)  # mean >> std: cancellation would show
    c = shape[1]
    w = (torch.randn(c, generator=g) * 0.3 + 1).to(dtype) if affine else None
    b = (torch.randn(c, generator=g) * 0.2).to(dtype) if affine else None
    t = _capture(lambda: F.group_norm(x, groups, w, b, 1e-6))
    card = _brief(t.op, t.signature, t.outputs)
    op = torch.ops.aten.native_group_norm.default
    bound = dict(bind_arguments(op, (x, w, b, shape[0], c, x[0, 0].numel(), groups, 1e-6), {}))
    return "group_norm", card, bound, params, _ref_group_norm(x, w, b, groups, 1e-6, dtype)


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
        _case_group_norm([1, 4, 5, 5], 2, bf, False, {"strategy": "split", "blocks_per_group": 16, "block": 256,
                                                      "order": "forward"}),
        _case_group_norm([2, 4, 4, 4], 2, bf, True, {"strategy": "split", "blocks_per_group": 2, "block": 256}),
        _case_group_norm([1, 6, 24], 3, f32, True, {"strategy": "fused", "block": 256, "unroll": 2}),
        # One cluster per group: chunks of 131072 of which 102400 stay in shared memory (the rest re-read);
        # 16 uneven chunks without a stash; four groups with whole chunks stashed.
        _case_group_norm([1, 4, 256, 256], 1, bf, True, {"strategy": "cluster", "cluster": 2, "block": 128}),
        _case_group_norm([1, 6, 100, 100], 2, f32, False, {"strategy": "cluster", "cluster": 16, "block": 128,
                                                           "stash": "none", "unroll": 2}),
        _case_group_norm([2, 8, 128, 128], 2, f16, True, {"strategy": "cluster", "cluster": 4, "block": 256,
                                                          "unroll": 1}),
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


def _emulation_main() -> int:
    from engine.verify.compare import bitwise_equal, compare_outputs
    from engine.verify.tolerance import tolerances_for

    workdir = Path(tempfile.mkdtemp(prefix="kf_norms_emu_"))
    failed = 0
    try:
        prepared = []
        for name, card, bound, params, expected in _emulation_cases():
            t = BY_NAME[name]
            full = {**t.default(card), **params}
            why = t.accepts(card)
            assert why is None, f"{card.signature_text}: declined: {why}"
            r = t.render(card, full)
            res = resolve(parse_spec(r.spec), Env.from_card(card.signature, card.outputs))
            prepared.append((f"{card.op} {card.signature_text} {full}", card, bound, res, expected, r.source))
        lib = _emu_build([(p[5], list(p[3].launches)) for p in prepared], workdir)
        for k, (label, card, bound, res, expected, _) in enumerate(prepared):
            try:
                got = _emu_run(lib, k, res, bound, card.outputs, float("nan"))
                # A second run into a finite prefill: unwritten elements or run-to-run differences show.
                again = _emu_run(lib, k, res, bound, card.outputs, -1234.5)
                reports = compare_outputs(got, expected, tolerances_for(card.op, expected))
                bad = [x.message for x in reports if not x.ok]
                bad += [f"out{i} differs between runs" for i, (a, b) in enumerate(zip(got, again))
                        if not bitwise_equal(a, b)]
                why = "; ".join(bad) or None
            except AssertionError as e:  # a stray write, a modified input
                why = str(e)
            failed += why is not None
            print(json.dumps({"case": label, "ok": why is None, "why": why}), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__" and "--emulate" in sys.argv:
    sys.exit(_emulation_main())
