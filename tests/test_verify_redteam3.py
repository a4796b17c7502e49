"""Red team, 2026-12-07: wrong kernels the table's per-element bound let through because their error is small on every
set the samples led to, and large (or systematic) where a model's other values take them: a half-precision output
rounded toward zero instead of to nearest (`compare.rounding_bias`). Each cheat
must fail, and eager and a kernel that computes exactly (float64, int64) and rounds once must still pass."""

import torch

from engine.ops import call_op, resolve_op
from engine.verify.compare import rounding_bias
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
