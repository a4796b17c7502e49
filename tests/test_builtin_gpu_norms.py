"""GPU tests of the normalisation templates: real cards captured on the GPU, the default instance and a
few seeded mutations evaluated in a real lane (compile, verify on samples/fresh/edge inputs, time).

Each test asserts every candidate verifies and prints its speedup over eager, e.g.
    group_norm bf16[1,512,128,128] g32 | split block 512 vec 8 ...: verified 14.2x (eager 240.1 us, 16.9 us)
Lane time: about a minute for the whole file on an H200 (0.5 s of timing per candidate).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from engine.propose.builtin.batch_norm import TEMPLATES as BN
from engine.propose.builtin.group_norm import TEMPLATES as GN
from engine.propose.builtin.group_norm_cl import TEMPLATES as GN_CL
from engine.propose.builtin.row_norms import TEMPLATES as ROWS

BY_NAME = {t.name: t for t in (*GN, *GN_CL, *ROWS, *BN)}
TIMING = {"max_seconds": 0.5}


def _evaluate(tmp_path: Path, name: str, fn: Callable[[], Any], label: str, mutations: int = 3,
              extra: tuple[dict[str, Any], ...] = (), twin: bool = False) -> None:
    from gpu_harness import evaluate_cases

    evaluate_cases(tmp_path, BY_NAME, [(label, name, fn, {"mutations": mutations, "extra": extra, "twin": twin})],
                   TIMING)


@pytest.mark.gpu
def test_group_norm_sd35_vae_bf16_128(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(1, 512, 128, 128, device="cuda", dtype=torch.bfloat16) * 0.7 + 0.2
    w = torch.randn(512, device="cuda", dtype=torch.bfloat16) * 0.2 + 1
    b = torch.randn(512, device="cuda", dtype=torch.bfloat16) * 0.1
    _evaluate(tmp_path, "group_norm", lambda: F.group_norm(x, 32, w, b, 1e-6), "group_norm [1,512,128,128]",
              extra=({"strategy": "fused"}, {"strategy": "split", "blocks_per_group": 16, "block": 256},
                     {"strategy": "cluster"}, {"strategy": "cluster", "cluster": 16, "stash": "none"}))


@pytest.mark.gpu
def test_group_norm_sd35_vae_bf16_512(tmp_path):
    torch.manual_seed(1)
    x = torch.randn(1, 256, 512, 512, device="cuda", dtype=torch.bfloat16) * 0.7 + 0.2
    w = torch.randn(256, device="cuda", dtype=torch.bfloat16) * 0.2 + 1
    b = torch.randn(256, device="cuda", dtype=torch.bfloat16) * 0.1
    _evaluate(tmp_path, "group_norm", lambda: F.group_norm(x, 32, w, b, 1e-6), "group_norm [1,256,512,512]",
              mutations=2, extra=({"strategy": "split", "blocks_per_group": 64, "order": "forward"},
                                  {"strategy": "cluster"}, {"strategy": "cluster", "cluster": 8, "block": 1024},
                                  {"strategy": "stream", "lookahead": 0}, {"strategy": "stream", "tile_kb": 32}))


@pytest.mark.gpu
def test_group_norm_sd35_vae_bf16_1024(tmp_path):
    """The VAE's largest GroupNorm (268 MB in, 268 MB out): the stream kernel (the default: blocks draw
    tickets, apply tiles wait on their group's statistics tiles) beside the persist kernel (one cooperative
    launch; each block keeps its slice of two groups in shared memory, so memory is read once), at 1 and 2
    blocks per SM, under the lane's repeated runs; split for comparison. 2026-12-04e: the stream kernel
    moved its bytes at 65 % of the lane's copy (three passes at copy speed); `l2: keep` and fewer blocks per SM
    did not help (one block per SM failed to launch then: its padding was 4 B too large). 2026-12-04f: stream
    204 us; the first two persist kernels 262-295 us (about 4 us per group of latency, not bandwidth)."""
    torch.manual_seed(3)
    x = torch.randn(1, 128, 1024, 1024, device="cuda", dtype=torch.bfloat16) * 0.7 + 0.2
    w = torch.randn(128, device="cuda", dtype=torch.bfloat16) * 0.2 + 1
    b = torch.randn(128, device="cuda", dtype=torch.bfloat16) * 0.1
    _evaluate(tmp_path, "group_norm", lambda: F.group_norm(x, 32, w, b, 1e-6), "group_norm [1,128,1024,1024]",
              mutations=0, extra=({"strategy": "stream", "lookahead": 0}, {"strategy": "stream", "resident": 1},
                                  {"strategy": "persist", "per_sm": 1, "block": 1024},
                                  {"strategy": "persist", "per_sm": 1, "block": 512},
                                  {"strategy": "persist", "per_sm": 2, "block": 512},
                                  {"strategy": "persist", "per_sm": 2, "block": 1024},
                                  {"strategy": "persist", "per_sm": 1, "block": 1024, "unroll": 2},
                                  {"strategy": "split"}))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 256, 1024, 1024), (1, 512, 512, 512), (1, 256, 512, 512), (1, 512, 256, 256)],
                         ids=str)
def test_group_norm_persist_on_the_sd35_vae_shapes(tmp_path, shape):
    """The VAE's other GroupNorms larger than half the L2, bf16: the persist kernel (16 MB groups kept in part;
    8, 4 and 2 MB groups whole), one group per step and two or four (each step pays one wait for the other
    blocks), beside the stream kernel, each against eager and the lane's copy."""
    torch.manual_seed(4)
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 0.7 + 0.2
    w = torch.randn(shape[1], device="cuda", dtype=torch.bfloat16) * 0.2 + 1
    b = torch.randn(shape[1], device="cuda", dtype=torch.bfloat16) * 0.1
    _evaluate(tmp_path, "group_norm", lambda: F.group_norm(x, 32, w, b, 1e-6), f"group_norm {list(shape)}",
              mutations=0, extra=({"strategy": "persist", "per_sm": 1, "block": 1024},
                                  {"strategy": "persist", "per_sm": 2, "block": 512},
                                  {"strategy": "persist", "per_sm": 1, "block": 1024, "gpi": 2},
                                  {"strategy": "persist", "per_sm": 2, "block": 512, "gpi": 4}))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 128, 1024, 1024), (1, 512, 128, 128), (2, 64, 36, 36)], ids=str)
def test_group_norm_channels_last(tmp_path, shape):
    """The VAE's GroupNorms as torch.compile hands them over after a convolution: the channels-last twin of
    the captured card (channels-last input, contiguous output as CUDA eager returns), the channels-last kernel
    against eager, which copies the input to contiguous first (CUDA native_group_norm takes no other). The
    last shape has pixels that no tile size divides (1296) and two images. The twin's output is channels-last
    (torch 2.11's meta kernel for a channels-last input), so its apply pass is the flat one by default, with
    the tiled one beside it."""
    torch.manual_seed(2)
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 0.7 + 0.2
    w = torch.randn(shape[1], device="cuda", dtype=torch.bfloat16) * 0.2 + 1
    b = torch.randn(shape[1], device="cuda", dtype=torch.bfloat16) * 0.1
    _evaluate(tmp_path, "group_norm_cl", lambda: F.group_norm(x, 32, w, b, 1e-6),
              f"group_norm channels-last {list(shape)}", mutations=4,
              extra=({"apply": "tile"}, {"apply": "tile", "tile_p": 32}, {"apply": "tile", "tile_c": 32, "block": 512},
                     {"unroll": 4, "vec": 4}, {"unroll": 4}, {"block": 512}), twin=True)


@pytest.mark.gpu
def test_layer_norm_sd35_bf16_without_affine(tmp_path):
    torch.manual_seed(2)
    x = torch.randn(2, 4096, 1536, device="cuda", dtype=torch.bfloat16) + 0.5
    _evaluate(tmp_path, "layer_norm", lambda: F.layer_norm(x, (1536,), None, None, 1e-6),
              "layer_norm [2,4096,1536]", extra=({"block": 512, "rows_per_block": 1},))


@pytest.mark.gpu
def test_layer_norm_fp32_with_affine(tmp_path):
    torch.manual_seed(3)
    x = torch.randn(8, 1024, device="cuda") * 2 + 1
    w = torch.randn(1024, device="cuda") * 0.2 + 1
    b = torch.randn(1024, device="cuda") * 0.1
    _evaluate(tmp_path, "layer_norm", lambda: F.layer_norm(x, (1024,), w, b, 1e-5), "layer_norm [8,1024] fp32")


@pytest.mark.gpu
def test_batch_norm_eval_resnet50_fp16(tmp_path):
    torch.manual_seed(4)
    x = torch.randn(32, 256, 56, 56, device="cuda", dtype=torch.float16)
    w = torch.randn(256, device="cuda", dtype=torch.float16) * 0.2 + 1
    b = torch.randn(256, device="cuda", dtype=torch.float16) * 0.1
    rm = torch.randn(256, device="cuda", dtype=torch.float16) * 0.3
    rv = torch.rand(256, device="cuda", dtype=torch.float16) + 0.5
    _evaluate(tmp_path, "batch_norm", lambda: F.batch_norm(x, rm, rv, w, b, training=False, eps=1e-5),
              "batch_norm eval [32,256,56,56]", extra=({"strategy": "plane"},))


@pytest.mark.gpu
def test_batch_norm_eval_resnet50_fp16_small_planes(tmp_path):
    torch.manual_seed(5)
    x = torch.randn(32, 2048, 7, 7, device="cuda", dtype=torch.float16)
    w = torch.randn(2048, device="cuda", dtype=torch.float16) * 0.2 + 1
    b = torch.randn(2048, device="cuda", dtype=torch.float16) * 0.1
    rm = torch.randn(2048, device="cuda", dtype=torch.float16) * 0.3
    rv = torch.rand(2048, device="cuda", dtype=torch.float16) + 0.5
    _evaluate(tmp_path, "batch_norm", lambda: F.batch_norm(x, rm, rv, w, b, training=False, eps=1e-5),
              "batch_norm eval [32,2048,7,7]", mutations=2)


@pytest.mark.gpu
def test_rms_norm_bf16(tmp_path):
    op = getattr(torch.ops.aten, "_fused_rms_norm", None)
    if op is None:
        pytest.skip("this torch has no aten::_fused_rms_norm")
    torch.manual_seed(6)
    x = torch.randn(1, 2048, 1536, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1536, device="cuda", dtype=torch.bfloat16) * 0.2 + 1
    from gpu_harness import make_card

    try:  # without a CUDA kernel the op decomposes into several cards: nothing for this template
        make_card(tmp_path / "probe", lambda: op.default(x, [1536], w, 1e-6), samples=1)
    except AssertionError as e:
        pytest.skip(f"aten::_fused_rms_norm is not one CUDA op here: {e}")
    _evaluate(tmp_path, "rms_norm", lambda: op.default(x, [1536], w, 1e-6), "rms_norm [1,2048,1536]")


@pytest.mark.gpu
def test_a_cooperative_persist_launch_replays_from_a_cuda_graph(tmp_path):
    """Casts run under CUDA graphs (reduce-overhead, graph routes, the decoding step): the persist kernel's
    cooperative launch (cuLaunchCooperativeKernel) captured in a graph, with its zeroed counters, replays to the
    same bits as a direct launch, twice (the counters start from zero each time), and matches eager."""
    from gpu_harness import brief_of, make_card

    from engine.capture.signature import bind_arguments
    from engine.compile.toolchain import compile_source
    from engine.launch import Env, parse_spec, resolve
    from engine.launch import cuda_driver as drv
    from engine.launch.launcher import CandidateLauncher

    torch.manual_seed(5)
    x = torch.randn(1, 128, 512, 512, device="cuda", dtype=torch.bfloat16) * 0.7 + 0.2  # 2 MB groups
    w = torch.randn(128, device="cuda", dtype=torch.bfloat16) * 0.2 + 1
    b = torch.randn(128, device="cuda", dtype=torch.bfloat16) * 0.1
    card = brief_of(make_card(tmp_path, lambda: F.group_norm(x, 32, w, b, 1e-6), samples=1))
    t = BY_NAME["group_norm"]
    r = t.render(card, {**t.default(card), "strategy": "persist", "per_sm": 1, "block": 1024})
    built = compile_source(r.source, arch="sm_90")
    assert built.ok, built.log
    spec = resolve(parse_spec(r.spec), Env.from_card(card.signature, card.outputs))
    assert spec.launches[0].cooperative
    drv.init()
    launcher = CandidateLauncher(drv.Module(built.cubin), spec, card.op, card.outputs, x.device)
    op = torch.ops.aten.native_group_norm.default
    bound = list(bind_arguments(op, (x, w, b, 1, 128, 512 * 512, 32, 1e-6), {}))
    direct = [o.clone() for o in launcher.run(bound)]
    run = launcher.prepare(bound, None)
    run()  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = run()
    for _ in range(2):
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, c) for a, c in zip(direct, outs))
    ref = F.group_norm(x.float(), 32, w.float(), b.float(), 1e-6)
    assert (direct[0].float() - ref).abs().max().item() < 0.05
