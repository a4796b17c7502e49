"""Red team, 2026-12-07: wrong kernels the table's per-element bound let through because their error is small on every
set the samples led to, and large (or systematic) where a model's other values take them: a half-precision output
rounded toward zero instead of to nearest (`compare.rounding_bias`), a normalization that drops or misplaces its eps
(the 'small' and 'zeros' edge sets), integer arithmetic narrowed to 32 bits (the 'wide ints' edge set). Each cheat
must fail, and eager and a kernel that computes exactly (float64, int64) and rounds once must still pass."""

import torch

from engine.ops import call_op, resolve_op
from engine.verify.compare import rounding_bias
from engine.verify.inputs import SMALL_RMS, edge_inputs, wide_int_inputs
from engine.verify.pipeline import CardCheck, as_list

BF, F16 = torch.bfloat16, torch.float16


def _check(op_name, samples):
    op = resolve_op(op_name)   # no canaries: these kernels write nothing out of place, and they cost most of the time
    return CardCheck(op_name, samples, lambda b: call_op(op, b), race_reps=2, guard=False)


def _eager(op_name):
    op = resolve_op(op_name)
    return lambda b, prefill: as_list(call_op(op, b))


def _exact(op_name, via=torch.float64):
    """Eager on `via` copies of the floating (float64) or integer (int64) inputs, each output cast back once."""
    op = resolve_op(op_name)
    ints = not via.is_floating_point

    def widen(v):
        if not isinstance(v, torch.Tensor) or v.dtype == torch.bool:
            return v
        return v.to(via) if v.is_floating_point() != ints else v

    def run(b, prefill):
        dtypes = [o.dtype for o in as_list(call_op(op, b))]
        return [o.to(dt) for o, dt in zip(as_list(call_op(op, [(n, widen(v)) for n, v in b])), dtypes)]
    return run


def _toward_zero(x, dtype):
    """`x` (float32 or wider) to `dtype`, truncating: bfloat16 as `__float_as_uint(f) >> 16` does, float16 one step
    toward zero wherever rounding to nearest went away from it."""
    x = x.float()
    if dtype == BF:
        return (x.view(torch.int32) & ~0xFFFF).view(torch.float32).to(BF)
    r = x.to(dtype)
    return torch.where(r.float().abs() > x.abs(), torch.nextafter(r, torch.zeros_like(r)), r)


def _toward_minus_inf(x, dtype):
    r = x.float().to(dtype)
    return torch.where(r.float() > x.float(), torch.nextafter(r, torch.full_like(r, -float("inf"))), r)


def _assert_fails_only_the_cheat(op_name, samples, cheat, where):
    v = _check(op_name, samples).check(cheat)
    assert not v.ok and v.category == "mismatch" and v.input_set.startswith(where), (op_name, v.input_set, v.message)
    for honest in (_eager(op_name), _exact(op_name)):
        h = _check(op_name, samples).check(honest)
        assert h.ok, (op_name, h.message)
    return v


def test_a_half_precision_output_rounded_toward_zero_fails_the_bias_check():
    """A float -> bfloat16 conversion that drops the low 16 bits errs by at most one ulp: within the table's row for
    every family (one ulp for elementwise ops, two for the rest), and within the precision check's 3x (twice the error
    of rounding to nearest). Its errors all point toward zero, half an ulp on average, where eager's and any kernel's
    that rounds to nearest lean neither way: a bias that adds up in a residual stream. So do those of a kernel
    that rounds toward -inf."""
    g = torch.Generator().manual_seed(0)

    def r(*shape, dtype):
        return torch.randn(*shape, generator=g).to(dtype)

    def add(cast):
        return lambda b, p: [cast(dict(b)["self"].float() + dict(b)["other"].float(), dict(b)["self"].dtype)]

    def softmax(b, p):
        x = dict(b)["self"]
        return [_toward_zero(torch.softmax(x.double(), -1), x.dtype)]

    def row_sum(b, p):
        x = dict(b)["self"]
        return [_toward_zero(x.double().sum(1), x.dtype)]

    cases = [
        ("aten::add.Tensor", [("self", r(32, 64, dtype=BF)), ("other", r(32, 64, dtype=BF)), ("alpha", 1)],
         add(_toward_zero)),
        ("aten::add.Tensor", [("self", r(32, 64, dtype=F16)), ("other", r(32, 64, dtype=F16)), ("alpha", 1)],
         add(_toward_minus_inf)),
        ("aten::_softmax", [("self", r(32, 64, dtype=F16)), ("dim", -1), ("half_to_float", False)], softmax),
        ("aten::sum.dim_IntList", [("self", r(128, 64, dtype=BF)), ("dim", [1]), ("keepdim", False)], row_sum),
    ]
    for op_name, sample, cheat in cases:
        v = _assert_fails_only_the_cheat(op_name, [sample], cheat, "sample")
        assert "lean toward" in v.message, v.message
    # a float32 kernel that rounds to nearest differs from eager here and there, either way: no bias
    x = torch.randn(4096, generator=g, dtype=torch.float64)
    e = (x.float().exp()).to(BF)
    assert rounding_bias((x.exp() * (1 + 1e-3 * torch.randn(4096, generator=g, dtype=torch.float64))).to(BF), e) is None
    assert rounding_bias(_toward_zero(x.exp(), BF), e) is not None
    assert rounding_bias(e[:32], _toward_zero(x[:32].exp(), BF)) is None   # too few elements to tell
    assert rounding_bias(x.float(), x.float()) is None                      # float32 and wider: not checked


def _ln(eps_of, mode):
    """A float64 layer norm whose rstd is 1/sqrt(var + eps_of(eps)) or (mode 'std') 1/(std + eps)."""
    def run(b, prefill):
        d = dict(b)
        x, dt = d["input"].double(), d["input"].dtype
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        rstd = 1 / (var.sqrt() + d["eps"]) if mode == "std" else (var + eps_of(d["eps"])).rsqrt()
        return [((x - mean) * rstd * d["weight"].double() + d["bias"].double()).to(dt), mean.to(dt), rstd.to(dt)]
    return run


def test_a_normalization_that_drops_or_misplaces_its_eps_fails_the_small_or_zeros_set():
    """Beside a variance of about 1, an eps of 1e-5 moves a layer norm's answer by 5e-6: a kernel that left it out
    (rsqrt(var)) or put it beside the standard deviation (1 / (std + eps)) passed every set, float32 included, and
    returns NaN on a row of zeros (a padded position, a group of channels a ReLU left dead, a batch norm channel whose
    running variance is 0). 'small' scales the inputs to an RMS of 2^-10, where eps is of the variance's order;
    'zeros' catches an eps too small for that (BERT's 1e-12)."""
    g = torch.Generator().manual_seed(1)

    def ln(eps, dtype=torch.float32):
        return [("input", torch.randn(16, 128, generator=g).to(dtype)), ("normalized_shape", [128]),
                ("weight", (1 + 0.1 * torch.randn(128, generator=g)).to(dtype)),
                ("bias", (0.1 * torch.randn(128, generator=g)).to(dtype)), ("eps", eps)]

    def bn():
        return [("input", torch.randn(4, 8, 4, 4, generator=g)), ("weight", 1 + 0.1 * torch.randn(8, generator=g)),
                ("bias", 0.1 * torch.randn(8, generator=g)), ("running_mean", 0.1 * torch.randn(8, generator=g)),
                ("running_var", 1 + 0.1 * torch.rand(8, generator=g)), ("momentum", 0.1), ("eps", 1e-5)]

    def bn_no_eps(b, p):
        d = {n: v.double() if isinstance(v, torch.Tensor) else v for n, v in b}
        per = [d[n][:, None, None] for n in ("running_mean", "running_var", "weight", "bias")]
        y = (d["input"] - per[0]) * per[1].rsqrt() * per[2] + per[3]
        return [y.float(), *as_list(call_op(resolve_op(BN), b))[1:]]

    def rms_no_eps(b, p):
        x = dict(b)["input"]
        y = x.double() * x.double().square().mean(-1, keepdim=True).rsqrt() * dict(b)["weight"].double()
        return [y.to(x.dtype)]

    LN, BN = "aten::native_layer_norm", "aten::_native_batch_norm_legit_no_training"
    rms = [("input", torch.randn(16, 128, generator=g)), ("normalized_shape", [128]),
           ("weight", 1 + 0.1 * torch.randn(128, generator=g)), ("eps", 1e-6)]
    for op_name, sample, cheat, where in (
            (LN, ln(1e-5), _ln(lambda eps: 0.0, "var"), "edge small"),
            (LN, ln(1e-5, F16), _ln(lambda eps: 0.0, "var"), "edge small"),
            (LN, ln(1e-5), _ln(None, "std"), "edge small"),
            (LN, ln(1e-12), _ln(lambda eps: 0.0, "var"), "edge zeros"),
            (BN, bn(), bn_no_eps, "edge zeros"),
            ("aten::rms_norm", rms, rms_no_eps, "edge small")):
        v = _check(op_name, [sample]).check(cheat)
        assert not v.ok and v.input_set == where, (op_name, v.input_set, v.message)
        for honest in (_eager(op_name), _exact(op_name)):
            assert _check(op_name, [sample]).check(honest).ok, op_name
    # 'small' scales by a power of two (no rounding) and leaves a tensor of zeros as it is; 'zeros' is zeros
    x = torch.randn(64, 64, generator=g)
    (_, small), (_, zeros) = edge_inputs([("self", x), ("other", torch.zeros(3))], ("small", "zeros"))
    ratio = dict(small)["self"] / x
    assert ratio.unique().numel() == 1 and float(ratio[0, 0]).hex().startswith("0x1.0000000000000p")
    assert abs(float(dict(small)["self"].square().mean().sqrt()) / SMALL_RMS - 1) < 0.5
    assert dict(small)["other"].eq(0).all() and dict(zeros)["self"].eq(0).all()
    # reductions get 'small' and not 'zeros' (eager's float16 cosine_similarity is NaN for zero vectors)
    labels = dict(_check("aten::sum.dim_IntList", [[("self", x), ("dim", [1]), ("keepdim", False)]]).sets)
    assert "edge small" in labels and "edge zeros" not in labels


def test_integer_arithmetic_narrowed_to_32_bits_fails_the_wide_ints_set():
    """Ids, counts and masks are small: a kernel that added int64 operands in 32-bit `int`, summed int32 values
    (eager sums them in int64) in an int32 accumulator, or converted an int64 factor through int32 matched eager on
    every set, and is wrong past 2^31 (hashed ids, byte offsets, timestamps). The 'wide ints' set moves every integer
    operand away from zero by a quarter of its dtype's range (int64: 2^32); indices are left alone."""
    g = torch.Generator().manual_seed(2)

    def ints(*shape, dtype=torch.int64, hi=1000):
        return torch.randint(0, hi, shape, generator=g).to(dtype)

    def d(b):
        return dict(b)

    cases = [
        ("aten::add.Tensor", [("self", ints(32, 32)), ("other", ints(32, 32)), ("alpha", 1)],
         lambda b, p: [(d(b)["self"].int() + d(b)["other"].int()).long()]),
        ("aten::sum.dim_IntList", [("self", ints(32, 32, dtype=torch.int32)), ("dim", [1]), ("keepdim", False)],
         lambda b, p: [d(b)["self"].sum(1, dtype=torch.int32).long()]),
        ("aten::cumsum", [("self", ints(8, 64)), ("dim", 1)], lambda b, p: [d(b)["self"].int().cumsum(1).long()]),
        ("aten::mul.Tensor", [("self", torch.randn(32, 32, generator=g)), ("other", ints(32, 32))],
         lambda b, p: [d(b)["self"] * d(b)["other"].int().float()]),
    ]
    for op_name, sample, cheat in cases:
        v = _check(op_name, [sample]).check(cheat)
        assert not v.ok and v.input_set == "edge wide ints", (op_name, v.input_set, v.message)
        for honest in (_eager(op_name), _exact(op_name, torch.int64)):
            assert _check(op_name, [sample]).check(honest).ok, op_name
    # only operands move: an index stays in its range; an op with no integer operand gets no such set
    idx, src = ints(10, hi=20), ints(10, 8)
    wide = dict(wide_int_inputs([("self", ints(20, 8, hi=10)), ("dim", 0), ("index", idx), ("source", src)]))
    assert torch.equal(wide["index"], idx) and torch.equal(wide["source"], src)   # by name: only known operands
    assert int(wide["self"].min()) >= 2**32
    assert wide_int_inputs([("self", torch.randn(4)), ("target", ints(4, hi=3))]) is None
    u8 = dict(wide_int_inputs([("self", torch.tensor([0, 100, 250], dtype=torch.uint8))]))["self"]
    assert u8.tolist() == [64, 164, 255]   # clamped to the dtype's range
