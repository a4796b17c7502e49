"""Physics floors: FLOPs a matmul-like card must do, the GPU's peak, and the floor the lane holds a
candidate's time against. FLOP counts are checked against independent counts (torch's flop counter
where it is exact, a convolution of ones where padding makes it an overestimate)."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from card_helpers import CAPTURES, captured, h200_cards
from torch.utils.flop_counter import FlopCounterMode

from engine.bench.floor import (
    PEAK_MARGIN,
    Floor,
    GpuCompute,
    card_flops,
    is_compute_op,
    launch_floor_us,
    operand_dtypes,
    peak_flops,
    physics_floor,
)
from engine.capture.signature import bind_arguments, signature_of

H200 = GpuCompute("sm_90", 132, 1.98e9)
aten = torch.ops.aten


def card(fn, keep=lambda op: True):
    """The op name and signature the capture records for `fn` (run on the CPU)."""
    c = captured(fn, keep)
    return c.op, c.signature


def direct(op, *args, **kwargs):
    """The signature of one overload called with these arguments, for ops the capture decomposes."""
    return op.name(), signature_of(op, bind_arguments(op, args, kwargs))


def counted(fn) -> int:
    """FLOPs torch's flop counter attributes to `fn` (it counts every tap and every score)."""
    with FlopCounterMode(display=False) as m:
        fn()
    return m.get_total_flops()


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


# ------------------------------------------------------------------------------------- matmul FLOPs


def test_mm_addmm_bmm_count_two_flops_per_multiply_add():
    a, b = r(64, 32), r(32, 48)
    assert card_flops(*card(lambda: a @ b)) == 2 * 64 * 48 * 32 == counted(lambda: a @ b)
    bias = r(48)
    op, sig = card(lambda: torch.addmm(bias, a, b))
    assert op == "aten::addmm" and card_flops(op, sig) == 2 * 64 * 48 * 32
    x, y = r(3, 16, 8), r(3, 8, 24)
    assert card_flops(*card(lambda: torch.bmm(x, y))) == 2 * 3 * 16 * 24 * 8 == counted(lambda: torch.bmm(x, y))
    op, sig = card(lambda: torch.baddbmm(r(3, 16, 24), x, y))
    assert card_flops(op, sig) == 2 * 3 * 16 * 24 * 8


def test_linear_and_matmul_broadcast():
    x, w = r(2, 5, 16), r(8, 16)
    # the capture records linear as a view and an mm; the composite overloads are counted the same
    assert card_flops(*card(lambda: F.linear(x, w), lambda op: op == "aten::mm")) == 2 * 10 * 8 * 16
    assert card_flops(*direct(aten.linear.default, x, w, r(8))) == 2 * 10 * 8 * 16
    assert card_flops(*direct(aten.matmul.default, r(4, 1, 6, 7), r(3, 7, 5))) == 2 * 12 * 6 * 5 * 7
    assert card_flops(*direct(aten.matmul.default, r(7), r(7))) == 14
    assert card_flops(*direct(aten.matmul.default, r(6, 7), r(7))) == 2 * 6 * 7
    assert card_flops(*direct(aten.mv.default, r(6, 7), r(7))) == 2 * 6 * 7


def test_pairwise_distances_count_a_matmul_of_work():
    # cdist is every (row, row) pair over the feature dimension: a VQ codebook lookup's matmul, not a memory-bound op
    x, y = r(2, 40, 8), r(2, 30, 8)
    assert card_flops(*direct(aten._euclidean_dist.default, r(40, 8), r(30, 8))) == 2 * 40 * 30 * 8
    assert card_flops(*direct(aten._cdist_forward.default, x, y, 1.0, None)) == 2 * 2 * 40 * 30 * 8
    assert card_flops(*direct(aten._cdist_forward.default, r(1, 40, 8), y, 2.0, None)) == 2 * 2 * 40 * 30 * 8
    assert card_flops(*direct(aten._pdist_forward.default, r(10, 8), 2.0)) == 2 * 45 * 8
    assert card_flops(*direct(aten._cdist_forward.default, r(40, 8), r(30, 7), 2.0, None)) is None


def test_alpha_zero_needs_no_product():
    assert card_flops(*card(lambda: torch.addmm(r(48), r(64, 32), r(32, 48), alpha=0))) is None


def test_mismatched_or_unreadable_shapes_give_none():
    op, sig = direct(aten.mm.default, r(4, 5), r(5, 6))
    sig["args"][1]["shape"] = [7, 6]  # inner dims disagree: not an mm the signature can describe
    assert card_flops(op, sig) is None
    assert card_flops("aten::mm", {"args": []}) is None
    assert card_flops("aten::add.Tensor", direct(aten.add.Tensor, r(4), r(4))[1]) is None
    assert card_flops("aten::mm", {"op": "aten::mm", "args": "garbage"}) is None


# -------------------------------------------------------------------------------- convolution FLOPs


def _ones_count(conv, x, w, **kw) -> int:
    """Multiply-adds that touch real data: a convolution of ones with ones sums them exactly."""
    return int(conv(torch.ones_like(x, dtype=torch.float64), torch.ones_like(w, dtype=torch.float64), **kw).sum())


@pytest.mark.parametrize("x, w, kw", [
    ((2, 8, 16, 16), (12, 4, 3, 3), {"stride": 2, "padding": 1, "groups": 2}),
    ((1, 6, 13, 9), (6, 1, 5, 3), {"stride": (1, 2), "padding": (2, 1), "dilation": (2, 1), "groups": 6}),
    ((2, 3, 20, 20), (5, 3, 7, 7), {"stride": 3, "padding": 3}),
    ((1, 4, 5, 5), (4, 4, 3, 3), {"padding": 4}),  # padding wider than the kernel: whole output rows are 0
])
def test_conv2d_counts_only_taps_that_touch_the_input(x, w, kw):
    x, w = r(*x), r(*w)
    op, sig = card(lambda: F.conv2d(x, w, **kw))
    assert op == "aten::convolution"
    assert card_flops(op, sig) == 2 * _ones_count(F.conv2d, x, w, **kw) <= counted(lambda: F.conv2d(x, w, **kw))


def test_conv_without_padding_matches_the_flop_counter():
    x, w = r(2, 16, 12, 12), r(32, 8, 3, 3)
    assert card_flops(*card(lambda: F.conv2d(x, w, stride=2, groups=2))) == counted(
        lambda: F.conv2d(x, w, stride=2, groups=2))
    x1, w1 = r(2, 4, 30), r(6, 4, 5)
    assert card_flops(*card(lambda: F.conv1d(x1, w1, dilation=3))) == counted(lambda: F.conv1d(x1, w1, dilation=3))


def test_conv_padding_strings_and_unbatched_input():
    x, w = r(3, 10, 10), r(4, 3, 3, 3)
    assert card_flops(*direct(aten.conv2d.padding, x, w, None, [1, 1], "same")) == 2 * _ones_count(
        F.conv2d, x, w, padding="same")
    assert card_flops(*direct(aten.conv2d.padding, x, w, None, [2, 2], "valid")) == 2 * _ones_count(
        F.conv2d, x, w, stride=2)


def test_transposed_convolution():
    x, w = r(2, 6, 7, 7), r(6, 4, 3, 3)
    kw = {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2}
    op, sig = card(lambda: F.conv_transpose2d(x, w, **kw))
    assert op == "aten::convolution" and card_flops(op, sig) == 2 * _ones_count(F.conv_transpose2d, x, w, **kw)


# ---------------------------------------------------------------------------------- attention FLOPs


def _sdpa(q, k, v, **kw):
    return card(lambda: F.scaled_dot_product_attention(q, k, v, **kw), lambda op: "attention" in op)


def test_attention_counts_scores_and_values():
    qs, ks, vs = r(2, 4, 32, 16), r(2, 4, 32, 16), r(2, 4, 32, 16)
    op, sig = _sdpa(qs, ks, vs)
    assert op.startswith("aten::_scaled_dot_product")
    assert card_flops(op, sig) == 4 * 8 * 32 * 32 * 16  # QK^T and P@V, each 2·L·S·D per head
    # the GPU overloads, as the H200 capture records them (key length and value width of their own)
    q, k, v = r(2, 4, 32, 16), r(2, 4, 48, 16), r(2, 4, 48, 24)
    for op in (aten._scaled_dot_product_cudnn_attention.default, aten._scaled_dot_product_efficient_attention.default):
        assert card_flops(*direct(op, q, k, v, None, False)) == 2 * 8 * 32 * 48 * (16 + 24)
    assert card_flops(*direct(aten._scaled_dot_product_flash_attention.default, q, k, k)) == 2 * 8 * 32 * 48 * 32


@pytest.mark.parametrize("lq, lk", [(32, 32), (20, 50), (50, 20)])
def test_causal_attention_counts_the_unmasked_scores(lq, lk):
    q, k, v = r(1, 2, lq, 8), r(1, 2, lk, 8), r(1, 2, lk, 8)
    ones = torch.ones(lq, lk)
    # whichever way the causal mask is aligned (top-left or bottom-right), the smaller count
    pairs = min(int(ones.tril().sum()), int(ones.tril(lk - lq).sum()))
    op = aten._scaled_dot_product_cudnn_attention.default
    assert card_flops(*direct(op, q, k, v, None, False, 0.0, True)) == 2 * 2 * pairs * (8 + 8)
    if lq == lk:  # what the capture records on the CPU
        assert card_flops(*_sdpa(q, k, v, is_causal=True)) == 2 * 2 * pairs * (8 + 8)
    assert 2 * pairs >= min(lq, lk) ** 2  # at least half of the square part


def test_attention_with_a_mask_or_dropout():
    q = r(1, 2, 16, 8)
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    assert card_flops(*direct(aten.scaled_dot_product_attention.default, q, q, q, mask)) is None
    # dropped probabilities need no P@V, every score is still needed
    assert card_flops(*direct(aten._scaled_dot_product_flash_attention_for_cpu.default, q, q, q, 0.5)) == (
        2 * 2 * 16 * 16 * 8)


def test_grouped_mm_counts_only_what_the_signature_shows():
    a, b = r(4, 16, 8, dtype=torch.bfloat16), r(4, 8, 12, dtype=torch.bfloat16)
    assert card_flops(*direct(aten._grouped_mm.default, a, b)) == 2 * 4 * 16 * 12 * 8
    offs = torch.tensor([3, 9, 20, 32], dtype=torch.int32)
    assert card_flops(*direct(aten._grouped_mm.default, r(32, 8, dtype=torch.bfloat16), b, offs)) is None


def test_every_h200_matmul_card_is_counted():
    cards = h200_cards(lambda op: any(k in op for k in ("mm", "convolution", "attention")))
    counted_ops = {c.op for c in cards if card_flops(c.op, c.signature)}
    assert {"aten::mm", "aten::addmm", "aten::bmm", "aten::convolution",
            "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_efficient_attention"
            } <= counted_ops
    for c in cards:
        if c.op == "aten::_grouped_mm":  # offsets are data: no count
            assert card_flops(c.op, c.signature) is None
        assert operand_dtypes(c.op, c.signature)[0] in ("bfloat16", "float16", "float32")


def test_h200_floors_are_below_the_eager_times_the_capture_measured():
    checked = 0
    for f in sorted(CAPTURES.glob("*.json")):
        for c in json.loads(f.read_text())["cards"]:
            sig = {"op": c["op"], "args": c["args"], "aliases": c["aliases"]}
            floor = physics_floor(c["op"], sig, c["bytes"], bandwidth=1.15 * 4.8e12, peak=H200)
            if floor.compute_us:
                assert floor.us < c["capture_us"], (c["signature"], floor.reason(), c["capture_us"])
                checked += 1
    assert checked > 50


# ----------------------------------------------------------------------------------------- the peak


def test_h200_peak():
    bf16 = peak_flops("sm_90", 132, 1.98e9, "bfloat16")
    assert bf16 == pytest.approx(1.07e15 * PEAK_MARGIN, rel=0.10)
    assert peak_flops("sm_90a", 132, 1.98e9, "float16") == bf16
    assert peak_flops("sm_90", 132, 1.98e9, "float32") == bf16 / 2  # TF32
    assert peak_flops("sm_90", 132, 1.98e9, "float8_e4m3fn") == bf16 * 2
    # H100 SXM: 989 TFLOP/s dense at 1.83 GHz
    assert peak_flops("sm_90", 132, 1.83e9, "bfloat16") == pytest.approx(989e12 * PEAK_MARGIN, rel=0.01)


def test_unknown_arch_dtype_or_clock_has_no_peak():
    assert peak_flops("sm_75", 40, 1.59e9, "float16") is None
    assert peak_flops("gfx942", 304, 2.1e9, "float16") is None
    assert peak_flops("sm_90", 132, 1.98e9, "int64") is None
    assert peak_flops("sm_90", 132, float("nan"), "bfloat16") is None
    assert peak_flops("sm_90", 0, 1.98e9, "bfloat16") is None


def test_a_format_without_its_own_unit_gets_the_fastest_rate():
    # A100 has no fp8 unit; a kernel could still emulate fp8 on any unit, so the peak stays an upper bound
    assert peak_flops("sm_80", 108, 1.41e9, "float8_e4m3fn") == peak_flops("sm_80", 108, 1.41e9, "int8")
    assert peak_flops("sm_121", 48, 2.5e9, "bfloat16") > 0


# ---------------------------------------------------------------------------------------- the floor


def test_mm_4096_floor_is_compute_bound_and_below_cublas():
    a = r(4096, 4096, dtype=torch.bfloat16)
    op, sig = direct(aten.mm.default, a, a)
    nbytes = 3 * 4096 * 4096 * 2
    floor = physics_floor(op, sig, nbytes, bandwidth=1.15 * 4.8e12, peak=H200, launch_us=2.0)
    assert floor.binding == "compute" and floor.us == floor.compute_us
    assert floor.memory_us < floor.us < 200.0  # cuBLAS takes ~0.2 ms on an H200
    assert floor.us > 5 * floor.memory_us  # the memory-only floor bounded almost nothing
    assert floor.reason() == "137.4 GFLOP take 116.7 µs at 1178 TFLOP/s (bfloat16 on sm_90)"


def test_memory_and_launch_floors_and_their_reasons():
    x = r(1024, 1024)
    op, sig = direct(aten.add.Tensor, x, x)
    floor = physics_floor(op, sig, 50331648, bandwidth=4.81e12, peak=H200, launch_us=2.0)
    assert floor.binding == "memory" and floor.compute_us == 0.0
    assert floor.reason() == "moving 50331648 bytes takes 10.5 µs at 4.81 TB/s"
    tiny = physics_floor(op, sig, 1024, bandwidth=4.81e12, peak=H200, launch_us=2.25)
    assert tiny.binding == "launch" and tiny.us == 2.25
    assert tiny.reason() == "one kernel launch takes 2.25 µs on this GPU"
    assert physics_floor(op, sig, 0, bandwidth=0, peak=None).us == 0.0


def test_peak_as_a_number_and_floor_to_json():
    a = r(256, 256)
    op, sig = direct(aten.mm.default, a, a)
    floor = physics_floor(op, sig, 0, bandwidth=0, peak=1e12)
    assert floor.compute_us == pytest.approx(2 * 256**3 / 1e12 * 1e6)
    assert isinstance(floor, Floor) and floor.to_json()["binding"] == "compute"
    assert math.isclose(floor.to_json()["us"], floor.us)


@pytest.mark.gpu
def test_launch_floor_is_below_the_fastest_small_kernels():
    dev = torch.device("cuda", 0)
    us = launch_floor_us(dev)
    x = torch.randn(4096, device=dev)
    times = []
    for _ in range(50):  # a small real op, timed as the protocol times a call
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(200_000)
        s.record()
        torch.relu(x)
        e.record()
        times.append((s, e))
    torch.cuda.synchronize()
    fastest = min(s.elapsed_time(e) for s, e in times) * 1e3
    assert 0 < us < fastest, (us, fastest)


def test_fused_multi_head_attention_is_compute():
    """nn.MultiheadAttention in inference runs one `_native_multi_head_attention` call (ViT): a compute op,
    where chains stop (a chain spanned LayerNorm → attention → add → LayerNorm before), with its FLOPs."""
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    x = r(2, 10, 32)
    with torch.no_grad():
        op, sig = card(lambda: mha(x, x, x, need_weights=False))
    assert op == "aten::_native_multi_head_attention" and is_compute_op(op)
    e, b, n = 32, 2, 10
    assert card_flops(op, sig) == 2 * b * 3 * n * e * e + 2 * b * n * e * e + 4 * b * n * n * e
