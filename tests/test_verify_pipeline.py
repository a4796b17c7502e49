"""The verification pipeline rejects each cheat with its category (Python stand-ins for kernels, CPU)."""

import torch

from engine.ops import call_op, resolve_op, write_only_args
from engine.verify.pipeline import CardCheck

GELU = resolve_op("aten::gelu")
RELU_ = resolve_op("aten::relu_")
SUM = resolve_op("aten::sum.dim_IntList")


def gelu_check(**kw):
    torch.manual_seed(0)
    samples = [[("self", torch.randn(64, 33)), ("approximate", "tanh")] for _ in range(2)]
    return CardCheck("aten::gelu", samples, lambda b: call_op(GELU, b), **kw), samples


def good_gelu(bound, prefill):
    x = bound[0][1]
    return [torch.nn.functional.gelu(x, approximate="tanh")]


def test_correct_candidate_passes():
    check, _ = gelu_check()
    v = check.check(good_gelu)
    assert v.ok, v.message
    assert v.sets_checked == 2 + 2 + 5  # samples, fresh draws, edge cases (negated, ties, large, wide, nonfinite)


def test_partial_write_is_nan():
    check, _ = gelu_check()

    def partial(bound, prefill):
        out = torch.full((64, 33), float("nan"))
        out[:, :32] = torch.nn.functional.gelu(bound[0][1][:, :32], approximate="tanh")
        return [out]

    v = check.check(partial)
    assert v.category == "nan" and "out0" in v.message and "(0, 32)" in v.message


def test_unwritten_elements_that_happen_to_be_right_are_found_by_the_second_prefill():
    # Eager output holds NaN where the input is NaN; a kernel that skips those elements leaves the
    # prefill there: right under the NaN prefill, wrong under the sentinel one.
    x = torch.randn(16, 16)
    x[3, 4] = float("nan")
    check = CardCheck("aten::gelu", [[("self", x), ("approximate", "none")]],
                      lambda b: call_op(GELU, b), fresh=0, edges=False)

    def skip_nan(bound, prefill):
        inp = bound[0][1]
        out = torch.full_like(inp, float("nan") if prefill == "nan" else -1234.5)
        ok = ~torch.isnan(inp)
        out[ok] = torch.nn.functional.gelu(inp[ok])
        return [out]

    v = check.check(skip_nan)
    assert v.category == "nan" and "never written" in v.message


def test_wrong_values_are_a_mismatch_with_index_and_values():
    check, _ = gelu_check()

    def off_by_one(bound, prefill):
        out = good_gelu(bound, prefill)[0]
        out[5, 7] += 1.0
        return [out]

    v = check.check(off_by_one)
    assert v.category == "mismatch" and "(5, 7)" in v.message
    assert v.details["reports"][0]["first_bad_index"] == (5, 7)


def test_lower_precision_fails():
    check, _ = gelu_check()
    v = check.check(lambda b, p: [good_gelu(b, p)[0].bfloat16().float()])
    assert v.category == "mismatch"


def test_wrong_dtype_or_layout_is_a_mismatch():
    check, _ = gelu_check()
    assert check.check(lambda b, p: [good_gelu(b, p)[0].half()]).category == "mismatch"
    assert check.check(lambda b, p: [good_gelu(b, p)[0].t().contiguous().t()]).category == "mismatch"


def test_input_mutation():
    check, _ = gelu_check()

    def clobber(bound, prefill):
        out = good_gelu(bound, prefill)
        bound[0][1].zero_()  # uses the input as scratch
        return out

    v = check.check(clobber)
    assert v.category == "mutation" and "self" in v.message


def test_returning_the_input_buffer_is_caught():
    check, _ = gelu_check()

    def in_place(bound, prefill):
        x = bound[0][1]
        x.copy_(torch.nn.functional.gelu(x, approximate="tanh"))
        return [x]

    assert check.check(in_place).category == "mutation"


def test_specialised_to_captured_values_fails_fresh_inputs():
    check, samples = gelu_check()
    memo = [(s[0][1].clone(), torch.nn.functional.gelu(s[0][1], approximate="tanh")) for s in samples]

    def lookup(bound, prefill):
        x = bound[0][1]
        for key, val in memo:
            if torch.equal(key, x):
                return [val.clone()]
        return [torch.zeros_like(x)]

    v = check.check(lookup)
    assert v.category == "mismatch" and v.input_set == "fresh 0"


def test_nondeterministic_output():
    check, _ = gelu_check()
    counter = iter(range(1000))

    def flaky(bound, prefill):
        out = good_gelu(bound, prefill)[0]
        if next(counter) % 2:
            out[0, 0] = out[0, 0] + 1e-7 * out[0, 0].abs()  # within tolerance, but not repeatable
        return [out]

    v = check.check(flaky)
    assert v.category == "nondeterminism"


def test_cache_keyed_by_pointer_is_caught_after_timing():
    check, samples = gelu_check()
    cache = {}

    def cached(bound, prefill):
        x = bound[0][1]
        if x.data_ptr() not in cache:
            cache[x.data_ptr()] = torch.nn.functional.gelu(x, approximate="tanh")
        return [cache[x.data_ptr()].clone()]

    first = check.check(cached)  # fresh buffers each set, but a freed address may come back
    # an address that comes back serves another set's answer: caught as wrong values, the NaN an edge set held,
    # or another set's answer where its outputs held one ('cheating'); never an engine fault
    assert first.ok or first.category not in ("internal", "protocol"), first
    cache.clear()
    timed = [("self", samples[0][0][1].clone()), ("approximate", "tanh")]
    cached(timed, "nan")  # timing loop: the same buffers again and again
    v = check.recheck_in_place(cached, timed)
    assert not v.ok and v.category == "mismatch" and "same buffers" in v.message


def test_in_place_op_must_end_as_eager_left_it():
    x = torch.randn(100)
    check = CardCheck("aten::relu_", [[("self", x)]], lambda b: call_op(RELU_, b),
                      written_args=["self"], fresh=1, edges=True)

    def good(bound, prefill):
        return [bound[0][1].clamp_(min=0)]

    def wrong(bound, prefill):
        return [bound[0][1].abs_()]

    assert check.check(good).ok
    assert check.check(wrong).category == "mismatch"


def test_reduction_may_reorder_but_must_stay_within_tolerance():
    torch.manual_seed(1)
    x = torch.randn(8, 4096)
    check = CardCheck("aten::sum.dim_IntList", [[("self", x), ("dim", [1]), ("keepdim", False),
                                                  ("dtype", None)]], lambda b: call_op(SUM, b), fresh=1)
    flip = iter(range(1000))

    def reordered(bound, prefill):
        t = bound[0][1]
        if next(flip) % 2:
            return [t.view(8, 64, 64).sum(2).sum(1)]
        return [t.double().sum(1).float()]

    assert check.check(reordered).ok, check.check(reordered).message


def test_out_variant_write_only_args_known():
    assert write_only_args(resolve_op("aten::add.out")) == ["out"]


def test_kernel_specialised_to_a_constant_input_fails_fresh_inputs():
    # A norm weight of ones (random-init models have them): a kernel that ignores it must fail.
    x, w = torch.randn(32, 64), torch.ones(64)
    mul = resolve_op("aten::mul.Tensor")
    check = CardCheck("aten::mul.Tensor", [[("self", x), ("other", w)]], lambda b: call_op(mul, b))
    v = check.check(lambda b, p: [b[0][1].clone()])
    assert v.category == "mismatch" and v.input_set.startswith("fresh")
