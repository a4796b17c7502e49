"""The one tolerance table: how close a candidate's output must be to eager's, per op family and dtype.

A row bounds every element by

    |actual - expected| <= atol + rtol * |expected| + rms_rtol * rms(expected)

where rms(expected) is the root-mean-square of the finite expected values of the whole output. The
third term exists because an accumulating op (sum, matmul, norm) that is reordered errs in absolute
terms by a fraction of the magnitude of its partial sums, not of its result: an output that cancels to
near zero keeps the error of its large partials. A fixed atol is either too tight for data of scale
1e3 or too loose for data of scale 1e-3; the RMS of the output makes that term scale-free. It is zero
for elementwise ops, whose outputs are rounded once from a higher-precision value.

Reading the numbers: one ulp relative to the value is at most 2**-23 (fp32), 2**-10 ≈ 9.8e-4 (fp16),
2**-7 ≈ 7.8e-3 (bf16), 2**-3 (fp8 e4m3), 2**-2 (fp8 e5m2). Every row is chosen so that a correct
kernel that computes in the same precision as eager but in another order or with another (accurate)
formula passes, while computing in a lower precision than eager (fp32 op in bf16/fp16/TF32, fp16 op
accumulated in fp16) exceeds the bound on typical data.

fp32 matmul and convolution rows assume the eager reference ran with TF32 off
(`torch.backends.cuda.matmul.allow_tf32 = False`, `torch.backends.cudnn.allow_tf32 = False`); with
cuDNN's default (TF32 on) the reference itself errs by ~5e-4 and a full-precision kernel would fail.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

FAMILIES = ("exact", "elementwise", "reduction", "normalization", "matmul", "attention", "default")


@dataclass(frozen=True)
class Tolerance:
    """How close is close enough for one output (see the module docstring for the bound)."""

    atol: float
    rtol: float
    exact: bool
    nan_equal: bool = True
    # Fraction of elements allowed past the bound; 0 for every table row (a kernel is right everywhere).
    # NaN/inf disagreements are never covered by it.
    max_mismatch_fraction: float = 0.0
    # Scale-free absolute term: multiplied by the RMS of the finite expected values.
    rms_rtol: float = 0.0
    # Non-finite values must be of eager's kind (NaN, +inf, -inf). False: any non-finite value matches
    # any other (an accumulation order decides whether +inf and -inf meet: a sum-based mean of a row
    # holding +inf is +inf where eager's Welford update makes NaN); finite against non-finite never does.
    nonfinite_kind: bool = True

    def describe(self) -> str:
        """Short human form, e.g. 'atol=1e-06 rtol=1e-05' or 'exact'."""
        if self.exact:
            return "exact"
        text = f"atol={self.atol:.3g} rtol={self.rtol:.3g}"
        if self.rms_rtol:
            text += f" rms_rtol={self.rms_rtol:.3g}"
        if self.max_mismatch_fraction:
            text += f" allow={self.max_mismatch_fraction:.3g}"
        if not self.nonfinite_kind:
            text += " nonfinite=any"
        return text


EXACT = Tolerance(atol=0.0, rtol=0.0, exact=True)


@dataclass(frozen=True)
class TableRow:
    """One row of the table, for docs and the TUI."""

    family: str
    dtype: str
    atol: float
    rtol: float
    rms_rtol: float
    exact: bool
    why: str


# (family, dtype) -> (atol, rtol, rms_rtol, why). Families absent for a dtype fall back to "default".
# fp8 rows: atol is the format's smallest subnormal (a value rounding to 0 or to it differ by that much).
_F8E4 = 2.0**-9
_F8E5 = 2.0**-16
_ROWS: dict[tuple[str, str], tuple[float, float, float, str]] = {
    # --- elementwise: eager computes in fp32 "opmath" (fp64 for fp64) and rounds once.
    ("elementwise", "float64"): (1e-12, 1e-10, 0.0,
        "CUDA/libm fp64 math is within ~2 ulp (4e-16); 1e-10 allows another formula, yet an fp32 "
        "computation (6e-8) fails by 600x"),
    ("elementwise", "float32"): (1e-6, 1e-5, 0.0,
        "~80 ulp: covers accurate CUDA math (<=4 ulp) and most fast-math intrinsics; fp16/bf16/TF32 "
        "compute (>=2.4e-4) or tanh.approx (5e-4) fails; atol covers fp32 cancellation near 0 (gelu tail)"),
    ("elementwise", "float16"): (1e-5, 1e-3, 0.0,
        "one fp16 ulp (<=9.8e-4 relative): fp32 opmath rounded once may land on the neighbour; atol only "
        "for fp32 cancellation near zero, far below an ulp for |x| >= 0.01"),
    ("elementwise", "bfloat16"): (1e-5, 8e-3, 0.0,
        "one bf16 ulp (<=7.8e-3 relative), same reasoning as fp16"),
    ("elementwise", "float8_e4m3fn"): (_F8E4, 0.125, 0.0, "one e4m3 ulp; atol = smallest subnormal"),
    ("elementwise", "float8_e5m2"): (_F8E5, 0.25, 0.0, "one e5m2 ulp; atol = smallest subnormal"),
    # --- reduction: sum/mean/var/norm/softmax/cumsum accumulate in fp32 (fp64 for fp64).
    ("reduction", "float64"): (1e-12, 1e-9, 1e-10,
        "reordering errs ~u*sqrt(n) = 1e-16*sqrt(n); an fp32 accumulation fails by >100x"),
    ("reduction", "float32"): (1e-6, 1e-5, 1e-5,
        "reordered fp32 accumulation errs ~6e-8*sqrt(chunk) of the RMS (tree: ~2e-7; per-thread "
        "sequential chunks of 1e4: ~6e-6); bf16/fp16 inputs or accumulation err >=1e-4 of the RMS"),
    ("reduction", "float16"): (1e-5, 2e-3, 5e-4,
        "two ulp: output rounding plus one fp32 intermediate (e.g. log_softmax's logsumexp) crossing a "
        "rounding boundary; rms term = half an ulp at RMS scale for intermediates eager keeps in fp16. "
        "fp16 accumulation over 4096 terms errs ~1e-2 of the RMS and fails"),
    ("reduction", "bfloat16"): (1e-5, 1.6e-2, 4e-3,
        "two bf16 ulp, rms term half a bf16 ulp at RMS scale; bf16 accumulation errs ~0.1 of the RMS"),
    ("reduction", "float8_e4m3fn"): (_F8E4, 0.25, 0.0625, "two e4m3 ulp"),
    ("reduction", "float8_e5m2"): (_F8E5, 0.5, 0.125, "two e5m2 ulp"),
    # --- normalization: (x - mean) * rstd * w + b with fp32 statistics (Welford vs two-pass, rsqrt).
    ("normalization", "float64"): (1e-12, 1e-9, 1e-10, "as fp64 reduction"),
    ("normalization", "float32"): (1e-6, 1e-5, 1e-5,
        "statistics err ~1e-7..1e-6 relative (rsqrtf is 2 ulp); rms term covers x ~ mean cancellation "
        "and near-zero means; a one-pass E[x^2]-E[x]^2 in bf16/fp16 fails"),
    ("normalization", "float16"): (1e-5, 2e-3, 5e-4,
        "two fp16 ulp: output rounding, plus eager composites that round x*rstd before *w"),
    ("normalization", "bfloat16"): (1e-5, 1.6e-2, 4e-3, "two bf16 ulp, as fp16"),
    ("normalization", "float8_e4m3fn"): (_F8E4, 0.25, 0.0625, "two e4m3 ulp"),
    ("normalization", "float8_e5m2"): (_F8E5, 0.5, 0.125, "two e5m2 ulp"),
    # --- matmul: K-long dot products, accumulated sequentially along K inside GEMM tiles.
    ("matmul", "float64"): (1e-12, 1e-9, 1e-9, "fp64 GEMM reordering ~1e-16*sqrt(K)"),
    ("matmul", "float32"): (1e-5, 1e-4, 1e-4,
        "fp32 GEMMs differ in K blocking/split-K: ~6e-8*sqrt(K) of the RMS (K=16k: 8e-6, 5 sigma 4e-5); "
        "TF32 or bf16 inputs err ~4e-4..3e-3 of the RMS and fail (eager must run with TF32 off)"),
    ("matmul", "float16"): (1e-5, 2e-3, 2e-3,
        "two ulp; cuBLAS may reduce split-K partials in fp16 (allow_fp16_reduced_precision_reduction), "
        "~5e-4 of the RMS, 4 sigma; fp16 accumulation over K=4096 errs ~1e-2 of the RMS and fails"),
    ("matmul", "bfloat16"): (1e-5, 1.6e-2, 1.6e-2,
        "two bf16 ulp, bf16 split-K partials as fp16; bf16 accumulation over K=4096 errs ~0.1 of the RMS"),
    ("matmul", "float8_e4m3fn"): (_F8E4, 0.25, 0.125, "two e4m3 ulp (scaled_mm output)"),
    ("matmul", "float8_e5m2"): (_F8E5, 0.5, 0.25, "two e5m2 ulp"),
    # --- attention: two GEMMs and an online softmax; flash kernels round P to the input dtype.
    ("attention", "float64"): (1e-12, 1e-8, 1e-8, "two chained fp64 GEMMs + softmax"),
    ("attention", "float32"): (1e-5, 2e-4, 2e-4,
        "two chained fp32 GEMMs and a rescaled softmax (also the fp32 logsumexp output of flash kernels)"),
    ("attention", "float16"): (1e-5, 4e-3, 4e-3,
        "four fp16 ulp: P is rounded to fp16 before P@V at block-dependent scales, ~1e-3 of the RMS"),
    ("attention", "bfloat16"): (1e-5, 3.2e-2, 3.2e-2, "four bf16 ulp, as fp16"),
    ("attention", "float8_e4m3fn"): (_F8E4, 0.5, 0.25, "four e4m3 ulp"),
    ("attention", "float8_e5m2"): (_F8E5, 1.0, 0.5, "four e5m2 ulp"),
}
# Unknown ops get the elementwise rows: strict, so a mis-classified accumulating op fails loudly
# (a false reject, which costs a speedup) rather than passing a wrong kernel.
for (_fam, _dt), (_a, _r, _s, _why) in list(_ROWS.items()):
    if _fam == "elementwise":
        _ROWS[("default", _dt)] = (_a, _r, _s, "unknown op: elementwise strictness; " + _why)

_FLOAT_ROW_DTYPES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
# Dtypes that share a row with another: complex compares real and imaginary parts with the component's
# row; the fnuz fp8 variants have the same mantissa as their fn siblings.
_DTYPE_ALIASES = {
    "complex128": "float64", "complex64": "float32", "complex32": "float16", "chalf": "float16",
    "cfloat": "float32", "cdouble": "float64", "double": "float64", "float": "float32",
    "half": "float16", "float8_e4m3fnuz": "float8_e4m3fn", "float8_e5m2fnuz": "float8_e5m2",
    "f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
    "c64": "float32", "c128": "float64",
}


def _dtype_key(dtype: torch.dtype | str) -> str:
    name = str(dtype).removeprefix("torch.")
    return _DTYPE_ALIASES.get(name, name)


def tolerance_for(op: str, dtype: torch.dtype | str, *, family: str | None = None) -> Tolerance:
    """The tolerance for output `dtype` of ATen overload `op` (pass `family` to override the mapping).

    Call it per output: `native_layer_norm` on fp16 returns an fp16 output and fp32 mean/rstd.
    Integer, bool and any dtype without a float row (e.g. fp8 e8m0, packed fp4) compare exactly.
    """
    fam = family if family is not None else op_family(op)
    if fam not in FAMILIES:
        raise ValueError(f"unknown op family {fam!r}; one of {FAMILIES}")
    key = _dtype_key(dtype)
    if fam == "exact" or key not in _FLOAT_ROW_DTYPES:
        return EXACT
    atol, rtol, rms_rtol, _ = _ROWS[(fam, key)]
    return Tolerance(atol=atol, rtol=rtol, exact=False, rms_rtol=rms_rtol)


def table_rows() -> list[TableRow]:
    """Every row of the table, families in FAMILIES order, for docs and the TUI."""
    rows = [TableRow("exact", "any", 0.0, 0.0, 0.0, True,
                     "no arithmetic (copies, gathers, selections, comparisons): bit-for-bit values")]
    for fam in FAMILIES[1:]:
        for dt in _FLOAT_ROW_DTYPES:
            atol, rtol, rms_rtol, why = _ROWS[(fam, dt)]
            rows.append(TableRow(fam, dt, atol, rtol, rms_rtol, False, why))
    rows.append(TableRow("any", "integer/bool", 0.0, 0.0, 0.0, True, "integers and bools are exact"))
    return rows


# ---------------------------------------------------------------------------------------------------
# op -> family

_EXACT = frozenset("""
    copy _copy_from _copy_from_and_resize _to_copy to clone contiguous _to_dim_order_copy lift_fresh_copy
    cat concat concatenate stack hstack vstack dstack _cat split_with_sizes_copy split_copy unbind_copy
    chunk_copy narrow_copy repeat tile repeat_interleave expand flip fliplr flipud roll rot90
    constant_pad_nd pad _pad_circular _pad_enum reflection_pad1d reflection_pad2d reflection_pad3d
    replication_pad1d replication_pad2d replication_pad3d tril triu fill zero zeros_like ones_like
    full_like masked_fill masked_scatter masked_select where _s_where index_fill index_copy
    index index_select gather take take_along_dim index_put _index_put_impl _unsafe_index
    _unsafe_masked_index scatter select_scatter slice_scatter diagonal_scatter as_strided_scatter
    embedding one_hot put diag diag_embed diagonal_copy
    im2col pixel_shuffle pixel_unshuffle channel_shuffle native_channel_shuffle
    upsample_nearest1d upsample_nearest2d upsample_nearest3d _upsample_nearest_exact1d
    _upsample_nearest_exact2d _upsample_nearest_exact3d
    max_pool1d max_pool2d max_pool3d max_pool1d_with_indices max_pool2d_with_indices
    max_pool3d_with_indices adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d
    _adaptive_max_pool2d fractional_max_pool2d fractional_max_pool3d max_unpool2d max_unpool3d
    mkldnn_max_pool2d quantized_max_pool2d
    sort argsort topk kthvalue median nanmedian mode msort unique _unique _unique2 unique_consecutive
    unique_dim max min amax amin aminmax argmax argmin cummax cummin _cummax_helper _cummin_helper
    maximum minimum fmax fmin clamp clamp_min clamp_max clip relu relu6 hardtanh threshold
    neg negative abs absolute sign sgn signbit floor ceil trunc fix frac nan_to_num copysign nextafter
    heaviside conj_physical resolve_conj resolve_neg _conj_copy _neg_view_copy positive
    eq ne lt le gt ge equal greater greater_equal less less_equal not_equal isnan isinf isfinite
    isneginf isposinf isreal isclose isin bucketize searchsorted histc bincount nonzero nonzero_static
    argwhere count_nonzero all any logical_and logical_or logical_xor logical_not
    bitwise_and bitwise_or bitwise_xor bitwise_not bitwise_left_shift bitwise_right_shift
    __and__ __or__ __xor__ __lshift__ __rshift__ __iand__ __ior__ __ixor__ __ilshift__ __irshift__
    alias_copy detach_copy view_copy _reshape_copy reshape_copy permute_copy transpose_copy t_copy
    expand_copy slice_copy select_copy squeeze_copy unsqueeze_copy unfold_copy as_strided_copy
    view_as_real_copy view_as_complex_copy split_with_sizes unbind _convert_weight_to_int4pack
""".split())

_ELEMENTWISE = frozenset("""
    add sub subtract rsub mul multiply div divide true_divide floor_divide remainder fmod pow float_power
    square exp exp2 expm1 log log2 log10 log1p sqrt rsqrt reciprocal sin cos tan asin acos atan atan2
    arctan2 sinh cosh tanh asinh acosh atanh arcsin arccos arctan arcsinh arccosh arctanh sigmoid logit
    erf erfc erfinv lgamma digamma polygamma mvlgamma i0 sinc hypot lerp addcmul addcdiv xlogy
    special_xlog1py special_erfcx special_i0e special_i1 special_i1e special_ndtr special_ndtri
    gelu silu mish softplus softshrink hardshrink tanhshrink elu selu celu glu hardswish hardsigmoid
    leaky_relu prelu _prelu_kernel rrelu rrelu_with_noise log_sigmoid log_sigmoid_forward logaddexp
    logaddexp2 round deg2rad rad2deg angle polar complex outer ger kron _masked_scale native_dropout
    dropout threshold_backward upsample_linear1d upsample_bilinear2d upsample_bicubic2d
    upsample_trilinear3d _upsample_bilinear2d_aa _upsample_bicubic2d_aa grid_sampler grid_sampler_2d
    grid_sampler_3d cudnn_grid_sampler affine_grid_generator
""".split())

_REDUCTION = frozenset("""
    sum nansum mean nanmean prod var std var_mean std_mean norm linalg_vector_norm linalg_norm
    frobenius_norm nuclear_norm renorm native_norm _native_norm logsumexp softmax _softmax log_softmax
    _log_softmax _safe_softmax _masked_softmax special_softmax special_log_softmax cumsum cumprod
    logcumsumexp _logcumsumexp trace avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d
    adaptive_avg_pool2d adaptive_avg_pool3d _adaptive_avg_pool2d _adaptive_avg_pool3d
    mkldnn_adaptive_avg_pool2d lp_pool1d lp_pool2d lp_pool3d embedding_bag _embedding_bag
    _embedding_bag_forward_only index_add scatter_add scatter_reduce index_reduce _index_reduce
    _unsafe_masked_index_put_accumulate col2im segment_reduce _segment_reduce nll_loss_forward
    nll_loss2d_forward nll_loss cross_entropy_loss mse_loss l1_loss smooth_l1_loss huber_loss
    binary_cross_entropy binary_cross_entropy_with_logits kl_div soft_margin_loss cosine_similarity
    pairwise_distance histogram
""".split())

_MATMUL = frozenset("""
    mm addmm _addmm_activation bmm baddbmm addbmm matmul linear mv addmv dot vdot inner einsum tensordot
    _grouped_mm _scaled_mm _scaled_grouped_mm _int_mm _weight_int4pack_mm _weight_int8pack_mm
    _weight_int4pack_mm_for_cpu mkldnn_linear _mkldnn_linear fbgemm_linear_fp16_weight
    fbgemm_linear_int8_weight convolution _convolution convolution_overrideable conv1d conv2d conv3d
    conv_transpose1d conv_transpose2d conv_transpose3d conv_tbc cudnn_convolution
    cudnn_convolution_transpose cudnn_convolution_relu cudnn_convolution_add_relu mkldnn_convolution
    miopen_convolution miopen_depthwise_convolution miopen_convolution_transpose _slow_conv2d_forward
    slow_conv3d_forward slow_conv_dilated2d slow_conv_dilated3d slow_conv_transpose2d
    slow_conv_transpose3d thnn_conv2d _conv_depthwise2d conv_depthwise3d _nnpack_spatial_convolution
    cdist _cdist_forward _euclidean_dist pdist _pdist_forward bilinear _trilinear
    lstm gru rnn_tanh rnn_relu lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell _thnn_fused_lstm_cell
    _thnn_fused_gru_cell _cudnn_rnn miopen_rnn
""".split())

_ATTENTION = frozenset("""
    scaled_dot_product_attention _scaled_dot_product_attention_math _scaled_dot_product_flash_attention
    _scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_efficient_attention
    _scaled_dot_product_cudnn_attention _scaled_dot_product_fused_attention_overrideable
    _scaled_dot_product_attention_math_for_mps _flash_attention_forward _efficient_attention_forward
    _cudnn_attention_forward _native_multi_head_attention _transformer_encoder_layer_fwd
    multi_head_attention_forward _fused_sdp_choice
""".split())

_NORMALIZATION = frozenset("""
    layer_norm native_layer_norm group_norm native_group_norm batch_norm native_batch_norm
    _native_batch_norm_legit _native_batch_norm_legit_no_training _native_batch_norm_legit_functional
    _batch_norm_with_update _batch_norm_with_update_functional _batch_norm_no_update
    _batch_norm_impl_index cudnn_batch_norm miopen_batch_norm batch_norm_elemt batch_norm_stats
    batch_norm_gather_stats batch_norm_gather_stats_with_counts instance_norm rms_norm _fused_rms_norm
    _weight_norm _weight_norm_interface local_response_norm
""".split())

_BY_NAME: dict[str, str] = {}
for _family, _names in (("exact", _EXACT), ("elementwise", _ELEMENTWISE), ("reduction", _REDUCTION),
                        ("matmul", _MATMUL), ("attention", _ATTENTION), ("normalization", _NORMALIZATION)):
    for _n in _names:
        _BY_NAME[_n] = _family

# Overloads that change the arithmetic of an otherwise exact op.
_OVERLOAD_FAMILY = {
    ("scatter", "reduce"): "reduction", ("scatter", "value_reduce"): "reduction",
    ("round", "decimals"): "elementwise",  # round(x * 10**d) / 10**d is arithmetic, not a selection
}
# Families guessed from name fragments, for ops the explicit lists do not name (checked in order).
_PATTERNS = (
    (re.compile(r"attention"), "attention"),
    (re.compile(r"(layer|group|batch|instance|rms)_norm"), "normalization"),
    (re.compile(r"(^|_)conv(olution)?(_?transpose)?\d?d?(_|$)"), "matmul"),
    (re.compile(r"(^|_)(mm|bmm|addmm|baddbmm|matmul|linear)(_|$)"), "matmul"),
    (re.compile(r"(^|_)(max_pool|max_unpool)"), "exact"),
    (re.compile(r"(^|_)(avg_pool|lp_pool)"), "reduction"),
    (re.compile(r"(^|_)(log_)?softmax(_|$)"), "reduction"),
    (re.compile(r"_copy$"), "exact"),  # functionalised views materialised: pure copies
)
_NAMESPACED_DOTTED = re.compile(r"^(aten|prims|quantized|_quantized|torchvision|fbgemm)\.")


def split_op(op: str) -> tuple[str, str, str]:
    """'aten::add_.Tensor' -> ('aten', 'add_', 'Tensor'); also accepts 'aten.add_.Tensor' (str(OpOverload))."""
    text = op if isinstance(op, str) else op.name()  # an OpOverload also works
    if "::" in text:
        ns, rest = text.split("::", 1)
    elif _NAMESPACED_DOTTED.match(text):
        ns, rest = text.split(".", 1)
    else:
        ns, rest = "", text
    base, _, overload = rest.partition(".")
    return ns, base, overload


def _canonical(base: str) -> str:
    """In-place and legacy `_out` spellings share the family of the functional op."""
    if base.startswith("__") and base.endswith("__"):
        return base  # dunder (`__and__`, `__iand__`): listed as is
    base = base.removeprefix("_foreach_")  # _foreach_add_ -> add_: same math per element
    if base.endswith("_out") and base[:-4] in _BY_NAME:
        base = base[:-4]
    if base.endswith("_") and not base.endswith("__"):
        base = base[:-1]
    return base


def op_family(op: str) -> str:
    """The tolerance family of an ATen overload name as `OpOverload.name()` prints it."""
    _, base, overload = split_op(op)
    name = _canonical(base)
    ov = overload.removesuffix("_out")
    if (name, ov) in _OVERLOAD_FAMILY:
        return _OVERLOAD_FAMILY[(name, ov)]
    if name in _BY_NAME:
        return _BY_NAME[name]
    for pattern, family in _PATTERNS:
        if pattern.search(name):
            return family
    return "default"


def tolerances_for(op: str, outputs: object, *, family: str | None = None) -> list[Tolerance]:
    """One Tolerance per top-level output of `op` (a tensor, or a tuple/list of them), by each dtype.

    A list output (e.g. `split`) takes the row of its first tensor; non-tensor outputs compare exactly.
    """
    items = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    tols = []
    for o in items:
        if isinstance(o, (list, tuple)):
            o = next((x for x in o if isinstance(x, torch.Tensor)), None)
        tols.append(tolerance_for(op, o.dtype, family=family) if isinstance(o, torch.Tensor) else EXACT)
    return tols


# Families from strictest to loosest: a chain is held to its loosest member's rows (an elementwise
# member after a reduction rounds a value that already carries the reduction's error). "default" is
# elementwise strictness, ranked just above it so an all-elementwise chain stays "elementwise".
_LOOSENESS = ("exact", "elementwise", "default", "reduction", "normalization", "matmul", "attention")


def chain_family(signature: dict) -> str:
    """The tolerance family of a chain card (engine.capture.chains.chain_signature): its loosest member's."""
    nodes = (signature.get("chain") or {}).get("nodes") or []
    families = [op_family(n["op"]) for n in nodes]
    return max(families, key=_LOOSENESS.index) if families else "default"


def card_family(op: str, signature: dict | None = None) -> str:
    """The tolerance family of a card: its op's, or for a chain card its members' (`chain_family`)."""
    if signature is not None and isinstance(signature.get("chain"), dict):
        return chain_family(signature)
    return op_family(op)


# Families whose kernels may add in another order from run to run (atomics, split reductions): verification lets a
# second run differ from the first within tolerance, not bit for bit, so their kernels may be nondeterministic.
REORDERING_FAMILIES = frozenset({"reduction", "normalization", "matmul", "attention"})


def may_reorder(op: str, signature: dict | None = None) -> bool:
    """Whether a card's kernels may give another rounding from run to run (`REORDERING_FAMILIES`): a cast declines
    them while `torch.use_deterministic_algorithms(True)` is on."""
    return card_family(op, signature) in REORDERING_FAMILIES
