"""A CPU capture computes slow half-precision calls in float32 (engine.capture.wide_compute), and the cards
it records are exactly those of the real half-precision calls: same ops, argument and output dtypes,
shapes and strides. Each case runs the op once as it is and once under WideCompute."""

import pytest
import torch
import torch.nn.functional as F

from engine.capture.recorder import CaptureMode, ModulePaths
from engine.capture.wide_compute import WideCompute

aten = torch.ops.aten
bf16, f16 = torch.bfloat16, torch.float16


def _r(*shape, dtype=bf16, seed=0):
    g = torch.Generator().manual_seed(seed + len(shape) + sum(shape))
    return torch.randn(*shape, generator=g).to(dtype)


def _depthwise_input():
    return _r(1, 64, 96).transpose(1, 2).contiguous().transpose(1, 2)  # Qwen's causal conv1d reads [B, C, L]


def _grouped(dtype):
    x, w = _r(600, 32, dtype=dtype), _r(4, 16, 32, dtype=dtype).transpose(-2, -1)
    offs = torch.tensor([150, 150, 420, 600], dtype=torch.int32)  # an empty group too
    return aten._grouped_mm.default, (x, w, offs), {}


CASES = {
    "mm (linear: weight transposed)": lambda: (aten.mm.default, (_r(130, 48), _r(40, 48).t()), {}),
    "addmm f16": lambda: (aten.addmm.default, (_r(40, dtype=f16), _r(128, 48, dtype=f16),
                                               _r(40, 48, dtype=f16).t()), {"beta": 0.5, "alpha": 2.0}),
    "bmm": lambda: (aten.bmm.default, (_r(3, 128, 8), _r(3, 8, 6)), {}),
    "baddbmm": lambda: (aten.baddbmm.default, (_r(3, 128, 6), _r(3, 128, 8), _r(3, 6, 8).transpose(1, 2)), {}),
    "conv2d f16 (resnet)": lambda: (aten.convolution.default, (
        _r(2, 16, 14, 14, dtype=f16), _r(32, 16, 3, 3, dtype=f16), None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1), {}),
    "conv2d bf16 bias (vae)": lambda: (aten.convolution.default, (
        _r(1, 8, 6, 6), _r(8, 8, 3, 3), _r(8), [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {}),
    "conv2d channels_last": lambda: (aten.convolution.default, (
        _r(2, 8, 6, 6).to(memory_format=torch.channels_last), _r(16, 8, 1, 1), None, [1, 1], [0, 0], [1, 1],
        False, [0, 0], 1), {}),
    "conv2d patchify (mmdit)": lambda: (aten.convolution.default, (
        _r(1, 16, 4, 4), _r(24, 16, 2, 2), _r(24), [2, 2], [0, 0], [1, 1], False, [0, 0], 1), {}),
    "depthwise conv1d (gated deltanet)": lambda: (aten.convolution.default, (
        _depthwise_input(), _r(64, 1, 4), None, [1], [3], [1], False, [0], 64), {}),
    "grouped_mm": lambda: _grouped(bf16),
    "sdpa for cpu causal": lambda: (aten._scaled_dot_product_flash_attention_for_cpu.default, (
        _r(1, 128, 4, 16).transpose(1, 2), _r(1, 128, 4, 16).transpose(1, 2), _r(1, 128, 4, 16).transpose(1, 2)),
        {"is_causal": True}),
    "sdpa for cpu masked": lambda: (aten._scaled_dot_product_flash_attention_for_cpu.default, (
        _r(1, 2, 128, 8), _r(1, 2, 40, 8), _r(1, 2, 40, 8)), {"attn_mask": _r(1, 1, 128, 40), "scale": 0.3}),
}


def _describe(out):
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [(t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset()) for t in outs]


@pytest.mark.parametrize("case", sorted(CASES))
def test_widened_call_returns_the_real_calls_outputs(case):
    func, args, kwargs = CASES[case]()
    real = func(*args, **kwargs)
    wide = WideCompute()
    with wide:
        got = func(*args, **kwargs)
    assert wide.widened == 1, "the call ran in float32"
    assert _describe(got) == _describe(real)
    for g, r in zip(got if isinstance(got, tuple) else [got], real if isinstance(real, tuple) else [real]):
        assert torch.allclose(g.float(), r.float(), rtol=0.05, atol=0.05 * r.float().abs().max().item() + 1e-3)


def test_float32_pointwise_and_few_row_calls_run_as_they_are():
    wide = WideCompute()
    with wide:
        aten.mm.default(torch.randn(300, 4), torch.randn(4, 5))
        aten.add.Tensor(_r(3, 4), _r(3, 4))
        aten.mm.default(_r(64, 48), _r(40, 48).t())  # converting the weight would cost more
        _grouped(bf16)[0](_r(512, 32), _r(256, 16, 32).transpose(-2, -1),
                          torch.arange(2, 513, 2, dtype=torch.int32))  # 2 rows per expert
    assert wide.widened == 0 and wide.kept == 2


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.proj = torch.nn.Linear(16, 48)
        self.out = torch.nn.Linear(16, 8, bias=False)

    def forward(self, x):
        h = F.silu(self.conv(x)).flatten(2).transpose(1, 2)  # [B, 144, 16]
        q, k, v = self.proj(h).view(h.shape[0], -1, 3, 2, 8).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(a.transpose(1, 2).reshape(h.shape)).transpose(1, 2).reshape(x.shape)


def _cards(model, x, wide: bool):
    paths = ModulePaths(model, {})
    mode = CaptureMode(path_of=paths.current, weight_of=paths.weight, samples=0, sample_budget_bytes=0,
                       sink=None, use_cuda_events=False)
    below = WideCompute() if wide else None
    with paths, torch.no_grad():
        if below is not None:
            with below, mode:
                model(x)
        else:
            with mode:
                model(x)
    cards = {cid: (t.op, t.signature, t.outputs, t.calls, t.module_paths, t.bytes) for cid, t in mode.cards.items()}
    return cards, below


def test_captured_cards_are_unchanged_by_wide_compute():
    torch.manual_seed(0)
    model = torch.nn.Sequential(_Block(), _Block()).to(bf16).eval()
    x = _r(2, 8, 12, 12)
    real, _ = _cards(model, x, wide=False)
    wide, mode = _cards(model, x, wide=True)
    assert mode.widened >= 8 and mode.kept == 0
    assert wide == real


def test_a_parameter_is_widened_once_over_forwards_until_it_is_written():
    lin = torch.nn.Linear(48, 40, bias=False).to(bf16).requires_grad_(False)
    x = _r(130, 48)
    wide = WideCompute(lin.parameters())
    with torch.no_grad(), wide:
        first, second = lin(x), lin(x)
    assert wide.widened == 2 and wide.converted == 3, "the activation twice, the weight once"
    assert torch.equal(first, second)
    with torch.no_grad():
        lin.weight.mul_(2)  # a written parameter is converted again, not read stale
        with wide:
            third = lin(x)
    assert wide.converted == 5
    assert torch.allclose(third.float(), 2 * first.float(), rtol=0.02, atol=0.02)


def test_a_model_built_under_inference_mode_is_widened_without_a_cache():
    """Its parameters are inference tensors, which keep no version counter to tell a written one by."""
    with torch.inference_mode():
        lin = torch.nn.Linear(48, 40, bias=False).to(bf16)
    x = _r(130, 48)
    wide = WideCompute(lin.parameters())
    with torch.no_grad(), wide:
        first, second = lin(x), lin(x)
    assert wide.widened == 2 and wide.converted == 4 and torch.equal(first, second)


def test_no_cache_beyond_its_budget_and_none_for_activations():
    lin = torch.nn.Linear(48, 40, bias=False).to(bf16).requires_grad_(False)
    x = _r(130, 48)
    wide = WideCompute(lin.parameters(), cache_bytes=100)  # a float32 weight needs 7680 bytes
    with torch.no_grad(), wide:
        lin(x), lin(x)
    assert wide.widened == 2 and wide.converted == 4
