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


def _last_write_wins(op_name):
    """A correct index_copy / scatter / index_put that lets the LAST of repeated indices win: the op leaves which
    write lands to the implementation, and CPU eager lets another win."""
    def run(b, prefill):
        a = dict(b)
        out = a["self"].clone()
        if "index_copy" in op_name:
            dim, idx, src = a["dim"], a["index"], a["source"]
            for i in reversed(range(idx.numel())):   # the reverse order: the first write lands last
                out.select(dim, int(idx[i])).copy_(src.select(dim, i))
        elif "scatter" in op_name:
            dim, idx, src = a["dim"], a["index"], a["src"]
            o, ix, sr = out.movedim(dim, -1), idx.movedim(dim, -1), src.movedim(dim, -1)
            for j in reversed(range(ix.shape[-1])):
                o.scatter_(-1, ix[..., j:j + 1], sr[..., j:j + 1])
        else:   # index_put with one index tensor on dim 0
            idx, vals = a["indices"][0], a["values"]
            for i in reversed(range(idx.numel())):
                out[int(idx[i])] = vals[i]
        return [out]
    return run


def test_writes_through_indices_the_samples_never_repeat_are_drawn_without_repeats():
    """A KV cache's `index_copy` (or `cache[pos] = new`, index_put; a `scatter` of new entries) writes through
    positions that never repeat in the model. Fresh draws of the positions repeated some, eager's answer there was
    its own choice of which write lands, and a correct kernel that let another write land was rejected on 'fresh 0'.
    Drawn positions now repeat nothing where no sample's did, in the sets and in the race runs and timed calls
    (`Regenerator`); a kernel that ignores the positions still fails, and where a sample repeats one (the model
    writes through repeats itself) the sets are drawn as before."""
    g = torch.Generator().manual_seed(1)
    pos = torch.randperm(64, generator=g)[:12]
    cases = [
        ("aten::index_copy", [("self", torch.randn(64, 8, generator=g)), ("dim", 0), ("index", pos),
                              ("source", torch.randn(12, 8, generator=g))]),
        ("aten::index_put", [("self", torch.randn(64, 8, generator=g)), ("indices", [pos]),
                             ("values", torch.randn(12, 8, generator=g)), ("accumulate", False)]),
        ("aten::scatter.src", [("self", torch.randn(4, 64, generator=g)), ("dim", 1),
                               ("index", torch.stack([torch.randperm(64, generator=g)[:12] for _ in range(4)])),
                               ("src", torch.randn(4, 12, generator=g))]),
    ]
    for op_name, sample in cases:
        check = _check(op_name, [sample])
        assert check.distinct, op_name
        v = check.check(_last_write_wins(op_name))
        assert v.ok, (op_name, v.message)

        def ignores_positions(b, prefill, op_name=op_name, sample=sample):   # writes at the sample's positions
            a = dict(b)
            fixed = [(k, sample_v if k in ("index", "indices") else a[k]) for k, sample_v in sample]
            return as_list(call_op(resolve_op(op_name), fixed))
        assert not _check(op_name, [sample]).check(ignores_positions).ok, op_name
    # the race runs' and timed calls' draws repeat nothing either, on every line of a scatter's dim
    check = _check(cases[2][0], [cases[2][1]])
    regen = Regenerator(cases[2][1], 5, distinct=check.distinct)
    drawn = [(k, v.clone()) if isinstance(v, torch.Tensor) else (k, v) for k, v in cases[2][1]]
    for _ in range(3):
        regen.refill_(drawn)
        idx = dict(drawn)["index"]
        assert all(row.unique().numel() == row.numel() for row in idx) and int(idx.max()) <= 63
    # a sample that repeats a position: drawn as before (no constraint the model does not keep itself)
    rep = [("self", torch.randn(64, 8)), ("dim", 0), ("index", torch.tensor([3, 5, 3])), ("source", torch.randn(3, 8))]
    assert _check("aten::index_copy", [rep]).distinct == {}


def test_a_mode_among_several_is_any_of_them():
    """A row of activations repeats no value, so every value is a mode of it: eager returns one (and one of its
    positions), a correct kernel that returns another mode was rejected on 'sample 0'. Any value as frequent as
    eager's, at a position holding it, is taken; a value less frequent than eager's, or an index pointing elsewhere,
    still fails."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(16, 40, generator=g)
    x[:4, :6] = 1.5   # a few rows with one clear mode
    sample = [("self", x), ("dim", -1), ("keepdim", False)]

    def largest_mode_last_place(b, prefill):
        t = dict(b)["self"]
        values, indices = [], []
        for row in t:
            u, counts = row.unique(return_counts=True)
            modes = u[counts == counts.max()]
            v = (modes[~modes.isnan()] if (~modes.isnan()).any() else modes).max()   # a number before a NaN
            values.append(v)
            indices.append(int(((row == v) | (row.isnan() & v.isnan())).nonzero().max()))
        return [torch.stack(values), torch.tensor(indices)]

    def first_value(b, prefill):   # a mode only where the row repeats nothing (or its first value is the mode)
        t = dict(b)["self"]
        return [t[:, 0].clone(), torch.zeros(t.shape[0], dtype=torch.int64)]

    def wrong_index(b, prefill):
        v, i = largest_mode_last_place(b, prefill)
        return [v, (i + 1) % dict(b)["self"].shape[-1]]

    assert _check("aten::mode", [sample]).check(largest_mode_last_place).ok
    for bad in (wrong_index, first_value):
        assert not _check("aten::mode", [sample]).check(bad).ok, bad.__name__
