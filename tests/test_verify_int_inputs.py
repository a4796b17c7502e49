"""Integer inputs with structure: random values can break what an op asks of them (offsets that start at 0 and
rise, repeats that add up to a given size). Verification and timing must then still check the op, not fail
every candidate as an engine error."""

import torch

from engine.ops import call_op, resolve_op
from engine.verify.inputs import Regenerator, fresh_inputs, monotone
from engine.verify.pipeline import CardCheck

BAG = resolve_op("aten::_embedding_bag")
REPEAT = resolve_op("aten::repeat_interleave.self_Tensor")


def _bag_sample(seed):
    g = torch.Generator().manual_seed(seed)
    return [("weight", torch.randn(20, 8, generator=g)), ("indices", torch.randint(0, 20, (12,), generator=g)),
            ("offsets", torch.tensor([0, 4, 8])), ("scale_grad_by_freq", False), ("mode", 1), ("sparse", False),
            ("per_sample_weights", None), ("include_last_offset", False), ("padding_idx", -1)]


def test_embedding_bag_offsets_are_drawn_rising_from_zero_and_eager_passes_itself():
    # offsets were drawn uniformly ([7, 7, 1]): "offsets[0] has to be 0", raised for every candidate.
    samples = [_bag_sample(0), _bag_sample(1)]
    check = CardCheck("aten::_embedding_bag", samples, lambda b: call_op(BAG, b), race_reps=0)
    v = check.check(lambda b, prefill: list(call_op(BAG, b)))
    assert v.ok, v.message
    assert not check.keep_ints and not check.notes
    offsets = dict(fresh_inputs(samples[0], 5))["offsets"]
    assert offsets[0] == 0 and bool((offsets[1:] >= offsets[:-1]).all())
    assert monotone(torch.tensor([[0, 2, 2, 5], [1, 1, 3, 4]])) and not monotone(torch.tensor([0, 3, 1]))


def test_an_op_that_refuses_random_integers_is_checked_with_the_samples_integers():
    # repeat_interleave with output_size: the repeats must add up to it, which random repeats do not.
    sample = [("self", torch.randn(3)), ("repeats", torch.tensor([1, 2, 3])), ("dim", 0), ("output_size", 6)]
    check = CardCheck("aten::repeat_interleave.self_Tensor", [sample], lambda b: call_op(REPEAT, b), race_reps=0)
    v = check.check(lambda b, prefill: [call_op(REPEAT, b)])
    assert v.ok, v.message
    assert check.keep_ints and any("drawn again with the samples' integer tensors" in n for n in check.notes)
    fresh = dict(dict(check.sets)["fresh 0"])
    assert fresh["repeats"].tolist() == [1, 2, 3] and not torch.equal(fresh["self"], sample[0][1])
    # and so do timed calls' values
    regen = Regenerator(sample, 3, keep_ints=True)
    b = [(n, v.clone() if isinstance(v, torch.Tensor) else v) for n, v in sample]
    regen.refill_(b)
    assert dict(b)["repeats"].tolist() == [1, 2, 3] and not torch.equal(dict(b)["self"], sample[0][1])


def test_a_wrong_kernel_still_fails_with_the_samples_integers():
    sample = [("self", torch.randn(3)), ("repeats", torch.tensor([1, 2, 3])), ("dim", 0), ("output_size", 6)]
    check = CardCheck("aten::repeat_interleave.self_Tensor", [sample], lambda b: call_op(REPEAT, b), race_reps=0)
    v = check.check(lambda b, prefill: [call_op(REPEAT, b) * 1.5])
    assert not v.ok and v.category == "mismatch"


EMB = resolve_op("aten::embedding")


def test_ids_past_the_samples_largest_are_checked_up_to_the_tables_size():
    # A red-team embedding kernel that clamps ids below 4096 passed every set (all drawn within the samples'
    # ids) and got 472 of 512 rows wrong on a 50,000-word vocabulary.
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(50000, 8, generator=g)

    def sample():
        return [("weight", weight), ("indices", torch.randint(0, 4000, (64,), generator=g)), ("padding_idx", -1),
                ("scale_grad_by_freq", False), ("sparse", False)]

    check = CardCheck("aten::embedding", [sample(), sample()], lambda b: call_op(EMB, b), race_reps=0)
    ranged = dict(dict(check.sets)["edge index range"])["indices"]
    assert int(ranged.max()) == 49999
    assert check.check(lambda b, prefill: [call_op(EMB, b)]).ok

    def clamps(b, prefill):
        d = dict(b)
        return [d["weight"][d["indices"].clamp(max=4095)]]

    v = CardCheck("aten::embedding", [sample(), sample()], lambda b: call_op(EMB, b), race_reps=0).check(clamps)
    assert not v.ok and v.input_set == "edge index range"


def _scatter_add_sample(g):
    return [("self", torch.randn(5000, 4, generator=g)), ("dim", 0),
            ("index", torch.randint(0, 300, (64, 4), generator=g)), ("src", torch.randn(64, 4, generator=g))]


def _take_along_flat_sample(g):
    return [("self", torch.randn(100, 50, generator=g)), ("indices", torch.randint(0, 300, (64,), generator=g)),
            ("dim", None)]


def _take_sample(g):
    return [("self", torch.randn(100, 50, generator=g)), ("index", torch.randint(0, 300, (8, 8), generator=g))]


def _clamped(op_name, idx_name):
    op = resolve_op(op_name)

    def run(b, prefill):
        d = dict(b)
        d[idx_name] = d[idx_name].clamp(max=299)  # a kernel that assumed the ids it was shown
        return [call_op(op, list(d.items()))]
    return run


def test_scatter_add_and_flat_takes_are_checked_over_their_whole_index_range():
    """scatter_add's index is bounded by self's size along dim; take and take_along_dim with dim=None index the
    flattened self. A kernel that holds only the ids it was shown passes every set drawn like the samples."""
    for op_name, make, idx in (("aten::scatter_add", _scatter_add_sample, "index"),
                               ("aten::take_along_dim", _take_along_flat_sample, "indices"),
                               ("aten::take", _take_sample, "index")):
        op = resolve_op(op_name)
        g = torch.Generator().manual_seed(1)
        samples = [make(g), make(g)]
        check = CardCheck(op_name, samples, lambda b, op=op: call_op(op, b), race_reps=0)
        bound = dict(samples[0])["self"]
        size = bound.shape[0] if op_name.endswith("scatter_add") else bound.numel()
        assert int(dict(dict(check.sets)["edge index range"])[idx].max()) == size - 1, op_name
        assert check.check(lambda b, prefill, op=op: [call_op(op, b)]).ok, op_name
        v = CardCheck(op_name, samples, lambda b, op=op: call_op(op, b), race_reps=0).check(_clamped(op_name, idx))
        assert not v.ok and v.input_set == "edge index range", (op_name, v.message)


def test_a_kernel_that_baked_in_a_scalar_tensors_integer_fails_verification():
    """A 0-dim integer tensor (here pow's exponent) is not in a cast's guard key, and a fresh draw of 'its
    statistics' gave the same value back: a kernel squaring whatever the exponent passed every set."""
    POW = resolve_op("aten::pow.Tensor_Tensor")
    g = torch.Generator().manual_seed(0)

    def sample():
        return [("self", torch.rand(64, 8, generator=g) + 0.5), ("exponent", torch.tensor(2))]

    samples = [sample(), sample()]
    check = CardCheck("aten::pow.Tensor_Tensor", samples, lambda b: call_op(POW, b), race_reps=0)
    exps = {int(dict(b)["exponent"]) for name, b in check.sets if name.startswith("fresh")}
    assert exps and 2 not in exps and exps <= {1, 3}
    assert check.check(lambda b, prefill: [call_op(POW, b)]).ok
    v = CardCheck("aten::pow.Tensor_Tensor", samples, lambda b: call_op(POW, b), race_reps=0).check(
        lambda b, prefill: [dict(b)["self"] * dict(b)["self"]])
    assert not v.ok and v.input_set.startswith("fresh"), v.message
