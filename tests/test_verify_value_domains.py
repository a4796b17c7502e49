"""Red team, 2026-12-06: wrong kernels that specialised to values every captured sample held and every set drawn
from them kept (a constant mask, a constant integer tensor, inputs that alias, values of one sign), and that a
cast's guard, keyed by shapes, dtypes and strides, would still have run on a model's other values."""

import torch

from engine.ops import call_op, resolve_op
from engine.verify.inputs import fresh_inputs
from engine.verify.pipeline import CardCheck, as_list


def _check(op_name, samples):
    op = resolve_op(op_name)
    return CardCheck(op_name, samples, lambda b: call_op(op, b), race_reps=2)


def _eager(op_name):
    op = resolve_op(op_name)
    return lambda b, prefill: as_list(call_op(op, b))


def test_a_kernel_that_ignores_a_constant_mask_fails_on_fresh_masks():
    """A padding mask of a batch without padding is all False in every sample, and fresh draws kept its frequency
    (0): a masked_fill that returned `self`, a where that returned `self` for an all-True condition, and one that
    read the mask's first element only passed every set, and are wrong on the first padded batch."""
    g = torch.Generator().manual_seed(0)
    pad = torch.zeros(2, 1, 1, 64, dtype=torch.bool).expand(2, 4, 64, 64)   # broadcast, stride 0

    def masked(mask):
        return [("self", torch.randn(2, 4, 64, 64, generator=g)), ("mask", mask), ("value", -1e4)]

    def cond():
        return [("condition", torch.ones(64, 32, dtype=torch.bool)), ("self", torch.randn(64, 32, generator=g)),
                ("other", torch.randn(64, 32, generator=g))]

    cheats = [
        ("aten::masked_fill.Scalar", [masked(pad), masked(pad)], lambda b, p: [dict(b)["self"].clone()]),
        ("aten::masked_fill.Scalar", [masked(pad), masked(pad)],
         lambda b, p: [dict(b)["self"].masked_fill(dict(b)["mask"].reshape(-1)[0], -1e4)]),
        ("aten::where.self", [cond(), cond()], lambda b, p: [dict(b)["self"].clone()]),
        ("aten::where.self", [[("condition", torch.tensor(False)), ("self", torch.randn(8, generator=g)),
                               ("other", torch.randn(8, generator=g))]], lambda b, p: [dict(b)["other"].clone()]),
    ]
    for op_name, samples, cheat in cheats:
        v = _check(op_name, samples).check(cheat)
        assert not v.ok and v.input_set.startswith("fresh"), (op_name, v.message)
        assert _check(op_name, samples).check(_eager(op_name)).ok, op_name
    # a mask that is not constant keeps its frequency
    half = torch.rand(4096, generator=g) < 0.25
    drawn = dict(fresh_inputs([("mask", half)], 3))["mask"]
    assert abs(float(drawn.float().mean()) - 0.25) < 0.05


def test_a_kernel_that_assumes_a_constant_integer_tensor_fails_on_fresh_values():
    """An attention mask of ones (int64, a batch without padding) was drawn as ones again ([lo, hi] = [1, 1]): a
    cumsum of it that returned arange + 1 (position ids) and a mul by it that returned the other factor passed."""
    g = torch.Generator().manual_seed(1)
    ones = torch.ones(2, 64, dtype=torch.int64)
    cheats = [
        ("aten::cumsum", [[("self", ones), ("dim", 1)]], lambda b, p: [torch.arange(1, 65).expand(2, 64).contiguous()]),
        ("aten::mul.Tensor", [[("self", torch.randn(2, 64, generator=g)), ("other", ones)]],
         lambda b, p: [dict(b)["self"].clone()]),
    ]
    for op_name, samples, cheat in cheats:
        v = _check(op_name, samples).check(cheat)
        assert not v.ok and v.input_set.startswith("fresh"), (op_name, v.message)
        assert _check(op_name, samples).check(_eager(op_name)).ok, op_name
    # one step toward zero: an index stays within the range its value was in; a constant 0 is left alone
    drawn = dict(fresh_inputs([("i", torch.full((64,), 3)), ("z", torch.zeros(8, dtype=torch.int32))], 0))
    assert set(drawn["i"].tolist()) == {2, 3} and drawn["z"].eq(0).all()
    assert set(dict(fresh_inputs([("i", torch.full((64,), -3))], 0))["i"].tolist()) == {-3, -2}


def test_a_kernel_that_relies_on_its_inputs_aliasing_fails_on_the_unaliased_set():
    """A cast's guard keys aliasing only for ops that write an argument: the kernel of a `mul(x, x)` card also runs
    `mul(a, b)` of the same layouts. Every set kept the samples' aliasing, so a mul that read `self` twice (half the
    loads), a cat([x, x]) that copied its first tensor twice and an add of two halves of one buffer that found the
    second at `self` + 64 passed."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 64, generator=g)
    qkv = torch.randn(32, 128, generator=g)

    def second_half(b, p):
        s = dict(b)["self"]
        return [s + torch.as_strided(s, s.shape, s.stride(), s.storage_offset() + 64)]

    cheats = [
        ("aten::mul.Tensor", [("self", x), ("other", x)], lambda b, p: [dict(b)["self"] * dict(b)["self"]]),
        ("aten::cat", [("tensors", [x, x]), ("dim", 0)], lambda b, p: [dict(b)["tensors"][0].repeat(2, 1)]),
        ("aten::add.Tensor", [("self", qkv[:, :64]), ("other", qkv[:, 64:]), ("alpha", 1)], second_half),
    ]
    for op_name, sample, cheat in cheats:
        check = _check(op_name, [sample])
        v = check.check(cheat)
        assert not v.ok and v.input_set == "edge unaliased", (op_name, v.message)
        assert _check(op_name, [sample]).check(_eager(op_name)).ok, op_name
    unaliased = dict(dict(check.sets)["edge unaliased"])
    assert unaliased["self"].stride() == (128, 1) and unaliased["other"].stride() == (128, 1)
    assert unaliased["self"].untyped_storage().data_ptr() != unaliased["other"].untyped_storage().data_ptr()
    # an op that writes an argument is keyed by its aliasing: no such set
    y = torch.randn(64, generator=g)
    assert "edge unaliased" not in dict(CardCheck("aten::add_.Tensor", [[("self", y), ("other", y), ("alpha", 1)]],
                                                  lambda b: None, written_args=["self"]).sets)


def test_division_that_truncates_fails_on_operands_of_both_signs():
    """Samples of one sign (positions // a block size, a positive remainder's operands): a floor_divide that
    truncated, a remainder computed as fmod (C's `/` and `%`) matched eager on every set, 'negated' flipping every
    sign together (floor(-a / -b) = trunc(a / b)) and leaving integers alone. The 'signs' set flips each element's
    sign apart; a kernel that computes exactly and rounds once still passes it."""
    g = torch.Generator().manual_seed(3)

    def ints():
        return [("self", torch.randint(0, 1000, (256,), generator=g)), ("other", torch.randint(1, 17, (256,), generator=g))]

    def floats():
        return [("self", torch.rand(256, generator=g) * 10), ("other", torch.rand(256, generator=g) + 1)]

    def trunc(b, p):
        return [torch.div(dict(b)["self"], dict(b)["other"], rounding_mode="trunc")]

    def fmod(b, p):
        return [torch.fmod(dict(b)["self"], dict(b)["other"])]

    def exact(op_name):
        op = resolve_op(op_name)

        def run(b, p):
            b64 = [(n, v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for n, v in b]
            return [call_op(op, b64).to(dict(b)["self"].dtype)]
        return run

    for op_name, samples, cheat in (("aten::floor_divide", [ints(), ints()], trunc),
                                    ("aten::remainder.Tensor", [ints(), ints()], fmod),
                                    ("aten::remainder.Tensor", [floats(), floats()], fmod),
                                    ("aten::floor_divide", [floats(), floats()], trunc)):
        v = _check(op_name, samples).check(cheat)
        assert not v.ok and v.input_set == "edge signs", (op_name, v.message)
        assert _check(op_name, samples).check(_eager(op_name)).ok, op_name
        assert _check(op_name, samples).check(exact(op_name)).ok, op_name
    # an integer tensor against a Python scalar ('negated' leaves integers alone)
    sample = [("self", torch.randint(0, 1000, (256,), generator=g)), ("other", 7)]
    v = _check("aten::remainder.Scalar", [sample]).check(lambda b, p: [torch.fmod(dict(b)["self"], 7)])
    assert not v.ok and v.input_set == "edge signs", v.message
    assert _check("aten::remainder.Scalar", [sample]).check(_eager("aten::remainder.Scalar")).ok
    # reductions and index ops get no such set (a negative index is refused; on the GPU, a device-side assert)
    assert "edge signs" not in dict(_check("aten::sum.dim_IntList", [[("self", torch.randn(8, 8)), ("dim", [1]),
                                                                      ("keepdim", False)]]).sets)


def test_a_softmax_that_skips_small_exponentials_fails_on_the_wide_set():
    """Std-1 logits span ~7 in a row of 1024, fresh draws stay in the samples' range, and at x1000 ('large') rows are
    one-hot: a float16 softmax that skipped exp(z) below z = -9 (1e-4 of probability each) passed every set. The
    'wide' set (x8) reaches the cut; a softmax computed exactly and rounded once passes it in every dtype."""
    g = torch.Generator().manual_seed(4)

    def sample(dtype):
        return [("self", torch.randn(64, 1024, generator=g).to(dtype)), ("dim", -1), ("half_to_float", False)]

    def skips(b, p):
        x = dict(b)["self"]
        z = x.float() - x.float().amax(-1, keepdim=True)
        e = torch.where(z < -9, 0.0, z.exp())
        return [(e / e.sum(-1, keepdim=True)).to(x.dtype)]

    def exact(b, p):
        x = dict(b)["self"]
        return [torch.softmax(x.double(), -1).to(x.dtype)]

    samples = [sample(torch.float16)]
    v = _check("aten::_softmax", samples).check(skips)
    assert not v.ok and v.input_set in ("edge large", "edge wide"), v.message   # 'large' by chance: 3 elements
    check = _check("aten::_softmax", samples)   # the samples, fresh draws and the wide set: it fails on the last
    check.sets = [(label, b) for label, b in check.sets if label.startswith(("sample", "fresh", "edge wide"))]
    v = check.check(skips)
    assert not v.ok and v.input_set == "edge wide", v.message
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        samples = [sample(dtype)]
        assert "edge wide" in dict(_check("aten::_softmax", samples).sets)
        assert _check("aten::_softmax", samples).check(_eager("aten::_softmax")).ok, dtype
        v = _check("aten::_softmax", samples).check(exact)
        assert v.ok, (dtype, v.message)
