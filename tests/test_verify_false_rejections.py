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


def _last_first(x, dim=-1, **kw):
    """A stable argsort that puts tied values last index first: another valid order for a sort that is not stable."""
    n = x.shape[dim]
    return n - 1 - torch.argsort(torch.flip(x, [dim]), dim=dim, stable=True, **kw)


def _last_equal(x, v, dim=-1):
    """The last index along `dim` where `x` equals `v` (a value taken from that row)."""
    eq = (x == v.unsqueeze(dim)) | (x.isnan() & v.unsqueeze(dim).isnan())
    return x.shape[dim] - 1 - torch.flip(eq, [dim]).int().argmax(dim)


def test_an_index_output_may_break_ties_its_own_way_where_the_op_leaves_it_open():
    """`topk`, `sort` and `argsort` (not stable), `kthvalue`, `median.dim`: which of tied positions comes back is
    the implementation's (documented for median, and for sort outside `stable=True`). The 'ties' edge set (and
    half-precision samples on their own) rejected a correct kernel that breaks ties last index first. Its indices
    are taken where they are another valid answer; an index that points at another value, one repeated within a
    row, or past the row still fails, and `max.dim`'s documented first index is still held."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 64, generator=g)
    h = (torch.randn(8, 64, generator=g) * 4).round().to(torch.bfloat16)   # ties in the sample itself

    def topk(b, p, wrong=None):
        d = dict(b)
        idx = _last_first(d["self"], descending=True)[:, :d["k"]].contiguous()
        if wrong:   # the first index twice where a tie allows its value
            idx = torch.where(d["self"].gather(1, idx[:, :1]) == d["self"].gather(1, idx[:, 1:2]), idx[:, :1], idx)
        return [d["self"].gather(1, idx), idx]

    def sort(b, p, wrong=None):
        x = dict(b)["self"]
        idx = _last_first(x)
        if wrong:
            idx = torch.where(idx == 0, 1, idx)   # points at another value (or repeats one) where the row holds 0
        return [x.gather(1, _last_first(x)), idx]

    def argsort(b, p, wrong=None):
        idx = _last_first(dict(b)["self"])
        return [idx.roll(1, 1) if wrong else idx]

    def kth(b, p, wrong=None):
        d = dict(b)
        v = d["self"].sort(-1).values[:, d["k"] - 1].contiguous()
        return [v, (_last_equal(d["self"], v) + (1 if wrong else 0)) % d["self"].shape[1]]

    def median(b, p, wrong=None):
        x = dict(b)["self"]
        v = x.median(-1).values
        return [v, _last_equal(x, v) + (64 if wrong else 0)]

    def max_last(b, p, wrong=None):
        x = dict(b)["self"]
        v = x.max(-1).values
        return [v, _last_equal(x, v)]

    cases = [
        ("aten::topk", lambda t: [("self", t), ("k", 5), ("dim", -1), ("largest", True), ("sorted", True)], topk),
        ("aten::sort", lambda t: [("self", t), ("dim", -1), ("descending", False)], sort),
        ("aten::argsort", lambda t: [("self", t), ("dim", -1), ("descending", False)], argsort),
        ("aten::kthvalue", lambda t: [("self", t), ("k", 3), ("dim", -1), ("keepdim", False)], kth),
        ("aten::median.dim", lambda t: [("self", t), ("dim", -1), ("keepdim", False)], median),
    ]
    for op_name, sample, honest in cases:
        for t in (x, h):
            v = _check(op_name, [sample(t)]).check(honest)
            assert v.ok, (op_name, t.dtype, v.input_set, v.message)
        assert _check(op_name, [sample(h)]).check(_eager(op_name)).ok, op_name
        v = _check(op_name, [sample(h)]).check(lambda b, p, f=honest: f(b, p, wrong="repeat"))
        assert not v.ok and v.category == "mismatch", (op_name, v.message)
    v = _check("aten::max.dim", [[("self", h), ("dim", -1), ("keepdim", False)]]).check(max_last)
    assert not v.ok and v.input_set == "sample 0", v.message
