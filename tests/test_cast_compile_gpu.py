"""A genuine cast (builtin group_norm kernel, sm_90) under torch.compile on the GPU, in each compile mode.
Under mode="reduce-overhead" the router runs only during warm-up and capture: its decision at capture is what
every replay runs, even after the cast is removed (written without a GPU at hand; run on the H200)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cast_helpers import write_genuine_cast

import engine.cast
from engine.cast.compat import current_env

pytestmark = pytest.mark.gpu


def f(x, w, b):
    return torch.relu(F.group_norm(x, 32, w, b, 1e-6)) * 2


def _inputs(h=16):
    x = torch.randn(1, 64, h, h, dtype=torch.float16, device="cuda")  # the genuine cast's signature at h=16
    w = torch.ones(64, dtype=torch.float16, device="cuda")
    return x, w, w.clone()


def _gn_hits(cast) -> int:
    return sum(v["hits"] for v in cast.stats()["variants"] if "group_norm" in v["op"])


@pytest.fixture
def cast(tmp_path):
    path = tmp_path / "genuine.cast"
    write_genuine_cast(path, env=current_env())
    c = engine.cast.load(path, strict=True)
    torch._dynamo.reset()
    with c.enabled():
        yield c
    torch._dynamo.reset()


@pytest.mark.parametrize("mode", [None, "max-autotune-no-cudagraphs"])
def test_compiled_model_calls_the_cast_kernel(cast, mode):
    x, w, b = _inputs()
    expected = f(x, w, b).float()
    cast.reset_stats()
    compiled = cast.compile(f, mode=mode)
    with torch.inference_mode():
        for _ in range(3):
            got = compiled(x, w, b)
    torch.cuda.synchronize()
    assert _gn_hits(cast) == 3
    assert torch.allclose(got.float(), expected, atol=2e-2, rtol=2e-2)
    other = _inputs(h=8)  # not covered: PyTorch's kernel through the same fallback call
    with torch.inference_mode():
        got_other = compiled(*other)
    assert _gn_hits(cast) == 3
    assert torch.allclose(got_other.float(), f(*other).float(), atol=2e-2, rtol=2e-2)


def test_reduce_overhead_replays_the_decision_taken_at_capture(cast):
    x, w, b = _inputs()
    expected = f(x, w, b).float()
    compiled = cast.compile(f, mode="reduce-overhead")
    cast.reset_stats()
    with torch.inference_mode():
        for _ in range(3):          # warm-up, capture, first replay
            got = compiled(x, w, b).clone()
        hits_at_capture = _gn_hits(cast)
        for _ in range(5):          # replays: the Python router does not run
            got = compiled(x, w, b).clone()
    torch.cuda.synchronize()
    assert hits_at_capture >= 1 and _gn_hits(cast) == hits_at_capture
    assert torch.allclose(got.float(), expected, atol=2e-2, rtol=2e-2)
    cast.remove()                   # the captured graph keeps the kernel it captured
    with torch.inference_mode():
        after = compiled(x, w, b).clone()
    torch.cuda.synchronize()
    assert torch.equal(after, got) and _gn_hits(cast) == hits_at_capture


def test_an_eager_only_cast_compiles_as_torch_compile_itself_on_the_gpu(tmp_path):
    """A cast held to eager (an export whose compile check kept nothing, ResNet-50's batch norms): cast.compile
    is torch.compile's own compile, so its output is bit for bit torch.compile's, its kernels run in eager and
    none inside the compiled calls, in default mode and under CUDA graphs."""
    path = tmp_path / "eager-only.cast"
    write_genuine_cast(path, env=current_env(), targets=["eager"])
    c = engine.cast.load(path, strict=True)
    x, w, b = _inputs()
    torch._dynamo.reset()
    try:
        with c.enabled(), torch.inference_mode():
            c.reset_stats()
            eager = f(x, w, b)
            assert _gn_hits(c) == 1  # the eager call is the cast's
            for mode in (None, "reduce-overhead"):
                plain = torch.compile(f, mode=mode)
                ours = c.compile(f, mode=mode)
                c.reset_stats()
                for _ in range(3):
                    want, got = plain(x, w, b).clone(), ours(x, w, b).clone()
                torch.cuda.synchronize()
                assert _gn_hits(c) == 0, mode
                assert torch.equal(got, want), mode
                assert torch.allclose(got.float(), eager.float(), atol=2e-2, rtol=2e-2), mode
    finally:
        torch._dynamo.reset()
