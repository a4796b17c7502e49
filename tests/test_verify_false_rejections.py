"""False rejections, 2026-12-07: correct kernels that verification rejected because a fresh or edge set broke a
precondition of the op, or because eager's answer there is one of several the op's contract allows. Each honest
kernel must pass, and a wrong kernel for the same op must still fail."""

import torch

from engine.ops import call_op, resolve_op
from engine.verify.inputs import Regenerator, edge_inputs, fresh_inputs
from engine.verify.pipeline import CardCheck, as_list


def _check(op_name, samples):
    op = resolve_op(op_name)
    return CardCheck(op_name, samples, lambda b: call_op(op, b), race_reps=2, guard=False)


def _eager(op_name):
    op = resolve_op(op_name)
    return lambda b, prefill: as_list(call_op(op, b))


def _count_below(seq, x, right):
    """A search without a binary search: how many of the sorted values lie below `x` (at or below, `right`), NaN
    taken as the largest value (as eager's and NumPy's sorts put it last)."""
    nan = torch.isnan(x).unsqueeze(-1)
    seq = seq.unsqueeze(-2) if seq.dim() > 1 else seq
    below = (seq <= x.unsqueeze(-1)) if right else (seq < x.unsqueeze(-1))
    return torch.where(nan, True, below).sum(-1).to(torch.int64)


def test_a_search_over_a_sorted_float_sequence_sees_sorted_sequences_only():
    """`searchsorted`'s sorted_sequence and `bucketize`'s boundaries must be sorted; fresh draws of them were not
    (and 'negated' reversed them), eager returned what its binary search happened to find, and a kernel that
    counts the values below was rejected on 'fresh 0'. Rows sorted in the samples stay sorted in every set drawn
    from them; a kernel that confuses left with right still fails (on 'ties', where values meet boundaries)."""
    g = torch.Generator().manual_seed(0)
    seq = torch.sort(torch.randn(4, 32, generator=g), -1).values
    bounds = torch.sort(torch.randn(16, generator=g)).values
    cases = [
        ("aten::searchsorted.Tensor",
         [("sorted_sequence", seq), ("self", torch.randn(4, 16, generator=g)), ("out_int32", False), ("right", False)],
         lambda b, p, flip=False: [_count_below(dict(b)["sorted_sequence"], dict(b)["self"], dict(b)["right"] ^ flip)]),
        ("aten::bucketize.Tensor",
         [("self", torch.randn(8, 16, generator=g)), ("boundaries", bounds), ("out_int32", False), ("right", True)],
         lambda b, p, flip=False: [_count_below(dict(b)["boundaries"], dict(b)["self"], dict(b)["right"] ^ flip)]),
    ]
    for op_name, sample, honest in cases:
        v = _check(op_name, [sample]).check(honest)
        assert v.ok, (op_name, v.input_set, v.message)
        assert _check(op_name, [sample]).check(_eager(op_name)).ok, op_name
        v = _check(op_name, [sample]).check(lambda b, p, h=honest: h(b, p, flip=True))
        assert not v.ok and v.category == "mismatch", (op_name, v.message)
    # every set and every timed draw keeps sorted rows sorted; unsorted ones are drawn as before
    rows = [("s", seq), ("u", torch.randn(4, 32, generator=g))]
    drawn = [fresh_inputs(rows, 1)] + [b for _, b in edge_inputs(rows, ("negated", "nonfinite", "large"))]
    regen = Regenerator(rows, 2)
    drawn.append([(n, t.clone()) for n, t in rows])
    regen.refill_(drawn[-1])
    for b in drawn:
        s, u = dict(b)["s"], dict(b)["u"]
        assert bool((s[:, 1:] >= s[:, :-1]).all()) and not torch.isnan(s).any()
        assert not bool((u[:, 1:] >= u[:, :-1]).all())
