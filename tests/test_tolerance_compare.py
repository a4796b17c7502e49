"""The tolerance table (op -> family, family x dtype -> bound) and the output comparison."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from engine.verify import (
    EXACT,
    FAMILIES,
    Tolerance,
    bitwise_equal,
    compare,
    compare_outputs,
    op_family,
    table_rows,
    tolerance_for,
    tolerances_for,
)

FAMILY_OF = {
    "aten::add_.Tensor": "elementwise", "aten::add.Tensor": "elementwise", "aten::add.out": "elementwise",
    "aten::mul.Tensor": "elementwise", "aten::gelu": "elementwise", "aten::silu": "elementwise",
    "aten::silu_": "elementwise", "aten::_foreach_mul_.Scalar": "elementwise",
    "aten::native_group_norm": "normalization", "aten::native_batch_norm": "normalization",
    "aten::cudnn_batch_norm": "normalization", "aten::_fused_rms_norm": "normalization",
    "aten::native_layer_norm": "normalization", "aten::_native_batch_norm_legit_no_training": "normalization",
    "aten::_softmax": "reduction", "aten::_log_softmax.out": "reduction", "aten::mean.dim": "reduction",
    "aten::sum.dim_IntList": "reduction", "aten::cumsum": "reduction", "aten::var_mean.correction": "reduction",
    "aten::linalg_vector_norm": "reduction", "aten::_adaptive_avg_pool2d": "reduction",
    "aten::scatter.reduce": "reduction", "aten::index_add": "reduction",
    "aten::convolution": "matmul", "aten::addmm": "matmul", "aten::bmm": "matmul", "aten::mm.out": "matmul",
    "aten::baddbmm": "matmul", "aten::_grouped_mm": "matmul", "aten::cudnn_convolution_relu": "matmul",
    "aten::_scaled_dot_product_flash_attention": "attention",
    "aten::_scaled_dot_product_efficient_attention": "attention",
    "aten::_scaled_dot_product_cudnn_attention": "attention",
    "aten::_to_copy": "exact", "aten::cat": "exact", "aten::index_select": "exact", "aten::copy_": "exact",
    "aten::max_pool2d_with_indices": "exact", "aten::topk": "exact", "aten::sort": "exact",
    "aten::argmax": "exact", "aten::embedding": "exact", "aten::where.self": "exact",
    "aten::masked_fill_.Scalar": "exact", "aten::gather": "exact", "aten::scatter.src": "exact",
    "aten::eq.Tensor": "exact", "aten::__and__.Tensor": "exact", "aten::relu_": "exact",
    "aten::permute_copy": "exact", "aten::upsample_nearest2d.vec": "exact", "aten::clone": "exact",
    "aten::constant_pad_nd": "exact", "aten::upsample_bilinear2d.vec": "elementwise",
    "aten::some_new_op.default": "default", "mylib::fancy": "default",
}


@pytest.mark.parametrize("op,family", FAMILY_OF.items())
def test_op_family(op, family):
    assert op_family(op) == family


def test_op_family_accepts_overload_objects_and_dotted_names():
    assert op_family(torch.ops.aten.add_.Tensor) == "elementwise"
    assert op_family(str(torch.ops.aten.native_layer_norm.default)) == "normalization"  # 'aten.native_...'


def _op_of(family):
    return next(op for op, f in FAMILY_OF.items() if f == family)


@pytest.mark.parametrize("row", [r for r in table_rows() if r.family in FAMILIES[1:]],
                         ids=lambda r: f"{r.family}-{r.dtype}")
def test_every_dtype_row(row):
    tol = tolerance_for(_op_of(row.family), getattr(torch, row.dtype))
    assert (tol.atol, tol.rtol, tol.rms_rtol, tol.exact) == (row.atol, row.rtol, row.rms_rtol, False)
    assert tolerance_for(_op_of(row.family), row.dtype) == tol  # as the card stores it: 'float16'
    assert tolerance_for(_op_of(row.family), f"torch.{row.dtype}") == tol
    assert row.why


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool,
                                   torch.float8_e8m0fnu])
def test_integer_and_bool_dtypes_are_always_exact(family, dtype):
    assert tolerance_for("aten::whatever", dtype, family=family) == EXACT


def test_exact_family_is_exact_for_floats_and_complex_uses_component_row():
    assert tolerance_for("aten::cat", torch.float32) == EXACT
    assert tolerance_for("aten::add.Tensor", torch.complex64) == tolerance_for("aten::add.Tensor", torch.float32)
    assert tolerance_for("aten::mm", "bf16") == tolerance_for("aten::mm", torch.bfloat16)


def test_table_orders_precision_and_family():
    rows = {(r.family, r.dtype): r for r in table_rows()}
    for fam in ("elementwise", "reduction", "normalization", "matmul", "attention"):
        assert rows[(fam, "float64")].rtol < rows[(fam, "float32")].rtol < rows[(fam, "float16")].rtol
        assert rows[(fam, "float16")].rtol < rows[(fam, "bfloat16")].rtol
    for dt in ("float32", "float16", "bfloat16"):
        assert rows[("elementwise", dt)].rtol <= rows[("reduction", dt)].rtol <= rows[("matmul", dt)].rtol
        assert rows[("matmul", dt)].rtol <= rows[("attention", dt)].rtol
        assert rows[("elementwise", dt)].rms_rtol == 0  # rounded once: no scale term
    assert rows[("elementwise", "bfloat16")].rtol >= 2.0**-7  # one bf16 ulp must pass
    assert rows[("elementwise", "float16")].rtol >= 2.0**-10


def test_tolerances_for_each_output_dtype():
    out = torch.zeros(2, 8, dtype=torch.float16)
    stats = torch.zeros(2, 1, dtype=torch.float32)
    tols = tolerances_for("aten::native_layer_norm", (out, stats, stats))
    assert tols[0] == tolerance_for("aten::native_layer_norm", torch.float16)
    assert tols[1] == tols[2] == tolerance_for("aten::native_layer_norm", torch.float32)
    values, idx = torch.zeros(3), torch.zeros(3, dtype=torch.int64)
    assert tolerances_for("aten::topk", (values, idx)) == [EXACT, EXACT]


# --- compare --------------------------------------------------------------------------------------

F32_EW = tolerance_for("aten::add.Tensor", torch.float32)


def test_one_wrong_element_reports_index_and_values():
    expected = torch.linspace(-1, 1, 2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    actual = expected.clone()
    actual[1, 2, 3, 4] = 0.5
    r = compare(actual, expected, F32_EW)
    assert not r.ok and r.category == "mismatch"
    assert r.mismatches == 1 and r.numel == 120
    assert r.first_bad_index == (1, 2, 3, 4) == r.worst_index
    assert r.first_bad_actual == 0.5 and r.first_bad_expected == expected[1, 2, 3, 4].item()
    assert r.max_abs_err == pytest.approx(0.5)
    assert "1 of 120 elements differ" in r.message and "(1, 2, 3, 4)" in r.message
    assert "got 0.5, expected 1" in r.message and "atol=1e-06 rtol=1e-05" in r.message


def test_first_bad_and_worst_are_both_reported():
    expected = torch.ones(10)
    actual = expected.clone()
    actual[2] += 0.01
    actual[7] += 0.5
    r = compare(actual, expected, F32_EW)
    assert r.first_bad_index == (2,) and r.worst_index == (7,) and r.mismatches == 2
    assert "at (7,)" in r.message and "first bad at (2,)" in r.message


def test_nan_left_in_output():
    expected = torch.randn(64, 64)
    actual = expected.clone()
    actual[5, 7] = math.nan
    r = compare(actual, expected, F32_EW)
    assert not r.ok and r.category == "nan" and r.nan_count == 1
    assert r.first_bad_index == (5, 7) and math.isnan(r.first_bad_actual)
    assert "NaN" in r.message


def test_nan_where_expected_nan():
    expected = torch.tensor([1.0, math.nan, 3.0])
    assert compare(expected.clone(), expected, F32_EW).ok
    strict = Tolerance(atol=1e-6, rtol=1e-5, exact=False, nan_equal=False)
    r = compare(expected.clone(), expected, strict)
    assert not r.ok and r.category == "nan"
    missing = compare(torch.tensor([1.0, 2.0, 3.0]), expected, F32_EW)  # NaN expected, finite got
    assert not missing.ok and missing.category == "mismatch" and missing.first_bad_index == (1,)


def test_dtype_downcast_is_a_dtype_mismatch():
    expected = torch.randn(16, 16)
    r = compare(expected.half(), expected, F32_EW)
    assert not r.ok and r.category == "dtype" and "float16" in r.message
    # The same values, even exactly representable ones, do not hide the lost precision.
    exact_vals = torch.arange(16.0)
    assert compare(exact_vals.half(), exact_vals, F32_EW).category == "dtype"


def test_shape_mismatch_and_no_broadcasting():
    expected = torch.randn(3, 1)
    assert compare(torch.randn(3, 2), expected, F32_EW).category == "shape"
    # (1, 3) vs (3, 1) would broadcast to (3, 3) in a naive allclose; same for (4,) vs (1, 4).
    r = compare(expected.reshape(1, 3), expected, F32_EW)
    assert not r.ok and r.category == "shape" and "(1, 3)" in r.message
    v = torch.randn(4)
    assert compare(v.reshape(1, 4), v, F32_EW).category == "shape"
    assert compare(torch.full((1,), 0.5), torch.full((4,), 0.5), F32_EW).category == "shape"


def test_wrong_strides_and_transposed_but_equal_values():
    expected = torch.randn(8, 6)
    transposed_layout = expected.t().contiguous().t()  # same values, column-major storage
    assert torch.equal(transposed_layout, expected)
    r = compare(transposed_layout, expected, F32_EW)
    assert not r.ok and r.category == "stride" and "(1, 8)" in r.message
    strided = torch.randn(8, 12)[:, ::2]
    strided.copy_(expected)
    assert compare(strided, expected, F32_EW).category == "stride"
    # A square transpose has the right shape but the wrong values (and strides).
    sq = torch.randn(5, 5)
    assert not compare(sq.t(), sq, F32_EW).ok


def test_size_one_and_empty_strides_are_ignored():
    expected = torch.randn(4, 1, 5)
    odd = torch.empty_strided((4, 1, 5), (5, 999, 1))
    odd.copy_(expected)
    assert compare(odd, expected, F32_EW).ok
    empty_a = torch.empty_strided((0, 3), (1, 7))
    assert compare(empty_a, torch.empty(0, 3), F32_EW).ok


def test_non_contiguous_equal_strides_compare_values():
    base = torch.randn(10, 20)
    expected = base[:, ::2]
    actual = base.clone()[:, ::2]
    actual[3, 4] += 1
    r = compare(actual, expected, F32_EW)
    assert r.category == "mismatch" and r.first_bad_index == (3, 4)


def test_inf_handling():
    expected = torch.tensor([math.inf, -math.inf, 1.0, math.inf])
    assert compare(expected.clone(), expected, F32_EW).ok
    flipped = torch.tensor([math.inf, math.inf, 1.0, math.inf])
    r = compare(flipped, expected, F32_EW)
    assert not r.ok and r.first_bad_index == (1,) and r.max_abs_err == math.inf
    overflow = torch.tensor([math.inf, -math.inf, math.inf, math.inf])  # inf where eager is finite
    assert compare(overflow, expected, F32_EW).first_bad_index == (2,)
    finite = torch.tensor([3e38, -math.inf, 1.0, math.inf])  # finite where eager is inf
    r = compare(finite, expected, F32_EW)
    assert not r.ok and r.first_bad_index == (0,)
    # max_mismatch_fraction never excuses a non-finite disagreement.
    lenient = Tolerance(atol=1e-6, rtol=1e-5, exact=False, max_mismatch_fraction=0.5)
    assert not compare(finite, expected, lenient).ok


def test_max_mismatch_fraction():
    expected = torch.zeros(100)
    actual = expected.clone()
    actual[:3] = 1.0
    assert not compare(actual, expected, F32_EW).ok
    r = compare(actual, expected, Tolerance(atol=1e-6, rtol=1e-5, exact=False, max_mismatch_fraction=0.05))
    assert r.ok and r.mismatches == 3 and r.category is None


def test_exact_and_integer_compare():
    x = torch.randn(50)
    assert compare(x.clone(), x, EXACT).ok
    y = x.clone()
    y[10] = torch.nextafter(y[10], torch.tensor(math.inf))  # one ulp off
    r = compare(y, x, EXACT)
    assert not r.ok and r.first_bad_index == (10,)
    big = torch.tensor([2**60, 5, 7], dtype=torch.int64)  # 2**60 + 1 is not representable in float64
    r = compare(big + torch.tensor([1, 0, 0]), big, F32_EW)  # integers are exact whatever the tol
    assert not r.ok and r.first_bad_index == (0,) and r.first_bad_actual == 2**60 + 1
    assert compare(torch.tensor([True, False]), torch.tensor([True, True]), EXACT).first_bad_index == (1,)


def test_complex_compares_real_and_imag():
    x = torch.randn(6, dtype=torch.complex64)
    y = x.clone()
    y[4] += 1e-3j
    r = compare(y, x, F32_EW)
    assert not r.ok and r.first_bad_index == (4,) and isinstance(r.first_bad_actual, complex)
    assert compare(x.conj().resolve_conj().conj(), x, F32_EW).ok  # lazy conj bit resolved


def test_chunked_matches_whole():
    base = torch.randn(12, 10, 7)
    expected = base.transpose(0, 1)  # non-contiguous
    actual = expected.clone(memory_format=torch.preserve_format)
    actual[7, 9, 2] += 1.0
    actual[9, 11, 6] = math.nan
    whole = compare(actual, expected, F32_EW)
    for chunk in (1, 5, 64, 1000):
        r = compare(actual, expected, F32_EW, chunk_numel=chunk)
        assert replace(r, first_bad_actual=None) == replace(whole, first_bad_actual=None)  # NaN != NaN
    assert whole.category == "nan" and whole.first_bad_index == (9, 11, 6) and whole.mismatches == 2


# --- the tolerance is fair: correct reorderings pass, lower precision fails ------------------------

@pytest.mark.parametrize("scale,shift", [(1.0, 0.0), (1e3, 0.0), (1e-3, 0.0), (1.0, 3.0)])
def test_reordered_fp32_reduction_passes_and_bf16_compute_fails(scale, shift):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8192, generator=g) * scale + shift * scale
    tol = tolerance_for("aten::sum.dim_IntList", torch.float32)
    expected = x.sum(-1)  # eager: cascaded (pairwise-like) summation
    sequential = torch.from_numpy(np.cumsum(x.numpy(), axis=1, dtype=np.float32)[:, -1].copy())
    assert not torch.equal(sequential, expected)  # really a different order
    r = compare(sequential, expected, tol)
    assert r.ok, r.message
    assert compare(x.double().sum(-1).float(), expected, tol).ok  # more precise is fine too
    bf16_inputs = x.bfloat16().float().sum(-1)
    assert compare(bf16_inputs, expected, tol).category == "mismatch"
    assert compare(x.bfloat16().sum(-1).float(), expected, tol).category == "mismatch"


def test_reordered_fp32_matmul_passes_and_tf32_fails():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(128, 1024, generator=g), torch.randn(1024, 96, generator=g)
    tol = tolerance_for("aten::mm", torch.float32)
    expected = a @ b
    assert compare((a.double() @ b.double()).float(), expected, tol).ok
    blocked = sum(a[:, k:k + 128] @ b[k:k + 128] for k in range(0, 1024, 128))  # split-K order
    assert compare(blocked, expected, tol).ok

    def tf32(t):  # keep 10 mantissa bits, as the tensor cores read fp32 in TF32 mode
        return (t.view(torch.int32) & ~0x1FFF).view(torch.float32)

    r = compare(tf32(a) @ tf32(b), expected, tol)
    assert r.category == "mismatch", r.message


def test_fp32_elementwise_in_bf16_fails_but_formula_change_passes():
    x = torch.linspace(-6, 6, 10001)
    tol = tolerance_for("aten::gelu", torch.float32)
    expected = torch.nn.functional.gelu(x)
    via_erfc = 0.5 * (x.double() * torch.special.erfc(-x.double() / math.sqrt(2))).float()
    assert compare(via_erfc, expected, tol).ok
    assert compare(torch.nn.functional.gelu(x.bfloat16()).float(), expected, tol).category == "mismatch"
    assert compare(torch.nn.functional.gelu(x.half()).float(), expected, tol).category == "mismatch"


def test_half_outputs_allow_one_ulp():
    x = torch.randn(4096, dtype=torch.float32)
    for dtype in (torch.float16, torch.bfloat16):
        tol = tolerance_for("aten::silu", dtype)
        expected = torch.nn.functional.silu(x).to(dtype)
        one_ulp = torch.nextafter(expected, torch.full_like(expected, math.inf))
        assert compare(one_ulp, expected, tol).ok
        three_ulp = torch.nextafter(torch.nextafter(one_ulp, torch.full_like(expected, math.inf)),
                                    torch.full_like(expected, math.inf))
        assert not compare(three_ulp, expected, tol).ok


# --- compare_outputs and bitwise_equal ------------------------------------------------------------

def test_compare_outputs_tuples_lists_and_scalars():
    t = torch.randn(3)
    reports = compare_outputs((t, [t, t], 4, None), (t.clone(), [t.clone(), t.clone()], 4, None),
                              [F32_EW, F32_EW, EXACT, EXACT])
    assert [r.name for r in reports] == ["out0", "out1[0]", "out1[1]", "out2", "out3"]
    assert all(r.ok for r in reports)
    bad = t.clone()
    bad[1] += 1
    reports = compare_outputs((t, [t, bad]), (t, [t, t]), F32_EW)
    assert [r.ok for r in reports] == [True, True, False] and reports[2].first_bad_index == (1,)
    assert compare_outputs((t,), (t, t), F32_EW)[0].category == "shape"
    assert compare_outputs((5, t), (4, t), F32_EW)[0].category == "mismatch"
    assert compare_outputs((None,), (t,), F32_EW)[0].category == "dtype"
    assert compare_outputs(t, t, F32_EW)[0].ok  # a bare tensor is one output


def test_bitwise_equal():
    x = torch.randn(4, 5)
    assert bitwise_equal(x, x.clone())
    assert bitwise_equal(x, x.t().contiguous().t())  # strides do not matter, bytes do
    assert not bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    nan_a = torch.tensor([0x7FC00000], dtype=torch.int32).view(torch.float32)
    nan_b = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert bitwise_equal(nan_a, nan_a.clone()) and not bitwise_equal(nan_a, nan_b)
    assert not bitwise_equal(x, x.double())
    assert bitwise_equal(x.half(), x.half()) and bitwise_equal(x.bfloat16(), x.bfloat16())
    c = torch.randn(3, dtype=torch.complex128)
    assert bitwise_equal(c, c.clone()) and not bitwise_equal(c, c.conj())
    assert bitwise_equal(torch.tensor([True, False]), torch.tensor([True, False]))
