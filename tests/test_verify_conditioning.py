"""Statistics a kernel computes in a form that loses digits under an offset of its inputs (a one-pass variance
E[x^2] - E[x]^2, in float32): right on the samples, which are centred near zero, and on every set drawn from
them (fresh draws keep their mean and std, the 'large' set scales mean and spread alike), wrong by 1e-3 .. 100 %
on activations that sit on an offset. The 'shifted' edge set (`engine.verify.inputs.SHIFT`) moves every floating
input of a reduction or normalization card by a multiple of its RMS."""

import pytest
import torch

from engine.ops import call_op, resolve_op
from engine.verify.inputs import SHIFT, edge_inputs
from engine.verify.pipeline import CardCheck, as_list

LN = "aten::native_layer_norm"
VAR = "aten::var.correction"


def _t(*shape, dtype, gen, mean=0.0, std=1.0):
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * std + mean).to(dtype)


def _ln_sample(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [("input", _t(128, 1024, dtype=dtype, gen=g)), ("normalized_shape", [1024]),
            ("weight", _t(1024, dtype=dtype, gen=g, mean=1.0, std=0.1)),
            ("bias", _t(1024, dtype=dtype, gen=g, std=0.1)), ("eps", 1e-5)]


def _check(op_name, samples):
    op = resolve_op(op_name)
    return CardCheck(op_name, samples, lambda b: call_op(op, b), race_reps=0)


def _layer_norm(one_pass):
    """A layer norm kernel in float32: statistics one-pass (E[x^2] - E[x]^2) or two-pass (another order than
    eager's), mean and rstd returned in eager's dtypes."""
    def run(b, prefill):
        d = dict(b)
        x = d["input"].float()
        if one_pass:
            mean = x.mean(-1, keepdim=True)
            var = (x * x).mean(-1, keepdim=True) - mean * mean
        else:
            mean = x.flip(-1).sum(-1, keepdim=True) / x.shape[-1]
            var = ((x - mean) ** 2).mean(-1, keepdim=True)
        rstd = torch.rsqrt(var + d["eps"])
        y = (x - mean) * rstd * d["weight"].float() + d["bias"].float()
        e = as_list(call_op(resolve_op(LN), b))   # only for the dtypes of the statistics outputs
        return [y.to(e[0].dtype), mean.to(e[1].dtype), rstd.to(e[2].dtype)]
    return run


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_one_pass_variance_passes_every_set_but_the_shifted_one(dtype):
    check = _check(LN, [_ln_sample(dtype, 0), _ln_sample(dtype, 1)])
    v = check.check(_layer_norm(one_pass=True))
    assert not v.ok and v.category == "mismatch", v.message
    assert v.input_set == "edge shifted", v.message   # every sample, fresh, negated, ties, large set passed
    assert v.sets_checked == [label for label, _ in check.sets].index("edge shifted") + 1   # every set before it passed


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_two_pass_layer_norm_in_another_order_passes_the_shifted_set(dtype):
    check = _check(LN, [_ln_sample(dtype, 0), _ln_sample(dtype, 1)])
    assert "edge shifted" in [label for label, _ in check.sets]
    v = check.check(_layer_norm(one_pass=False))
    assert v.ok, v.message


def test_a_one_pass_var_reduction_is_caught_on_the_shifted_set():
    g = torch.Generator().manual_seed(3)
    check = _check(VAR, [[("self", _t(64, 2048, dtype=torch.float32, gen=g)), ("dim", [1]), ("correction", 1),
                          ("keepdim", False)]])

    def one_pass(b, prefill):
        x = dict(b)["self"]
        n = x.shape[1]
        return [((x * x).sum(1) - x.sum(1) ** 2 / n) / (n - 1)]

    v = check.check(one_pass)
    assert not v.ok and v.category == "mismatch" and v.input_set == "edge shifted", v.message


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op_name, args", [
    (LN, None),
    ("aten::native_group_norm", [("N", 4), ("C", 64), ("HxW", 256), ("group", 8), ("eps", 1e-5)]),
    (VAR, [("dim", [1]), ("correction", 1), ("keepdim", False)]),
    ("aten::_softmax", [("dim", -1), ("half_to_float", False)]),
    ("aten::_log_softmax", [("dim", -1), ("half_to_float", False)]),
    ("aten::sum.dim_IntList", [("dim", [1]), ("keepdim", False)]),
    ("aten::cumsum", [("dim", 1)]),
])
def test_a_correctly_rounded_kernel_passes_the_shifted_set(dtype, op_name, args):
    """A kernel that computes exactly (float64) and rounds once passes: eager's own error on the shifted set is
    within the table (checked on the CPU's eager; the GPU's accumulates in float32 as well)."""
    g = torch.Generator().manual_seed(5)
    if args is None:
        sample = _ln_sample(dtype, 5)
    elif op_name == "aten::native_group_norm":
        sample = [("input", _t(4, 64, 16, 16, dtype=dtype, gen=g)), ("weight", _t(64, dtype=dtype, gen=g, mean=1.0)),
                  ("bias", _t(64, dtype=dtype, gen=g, std=0.1)), *args]
    else:
        sample = [("self", _t(64, 1024, dtype=dtype, gen=g)), *args]
    op = resolve_op(op_name)
    check = _check(op_name, [sample])
    check.sets = [(label, b) for label, b in check.sets if label == "edge shifted"]
    assert check.sets

    def exact(b, prefill):
        e = as_list(call_op(op, b))
        b64 = [(n, v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for n, v in b]
        return [r.to(x.dtype) if isinstance(r, torch.Tensor) else r for r, x in zip(as_list(call_op(op, b64)), e)]

    v = check.check(exact)
    assert v.ok, v.message


def test_the_shift_moves_values_by_a_multiple_of_their_rms_and_keeps_their_spread():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g)
    (_, b), = edge_inputs([("self", x)], ("shifted",))
    y = dict(b)["self"]
    rms = float(x.double().square().mean().sqrt())
    assert abs(float(y.double().mean() - x.double().mean()) - SHIFT[torch.float32] * rms) < 1e-3
    assert abs(float(y.double().std() / x.double().std()) - 1) < 1e-3
    # float16 stays finite however large its values (1 % of the format's range at most)
    h = (torch.randn(1024, generator=g) * 300).half()
    (_, b), = edge_inputs([("self", h)], ("shifted",))
    assert torch.isfinite(dict(b)["self"]).all()
    # integers are not touched
    (_, b), = edge_inputs([("self", x), ("index", torch.arange(5))], ("shifted",))
    assert torch.equal(dict(b)["index"], torch.arange(5))
