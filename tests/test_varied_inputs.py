"""Whole forwards are timed on inputs that change from forward to forward (engine/bench/varied.py): a kernel that
memoises whole answers (right ones: keyed by a hash of all its inputs) gained in the whole-model check, which fed
the same inputs every forward, and nowhere a user runs the model. CPU: the memo is a module that stands in for
such a kernel, counting its hits."""

from __future__ import annotations

import hashlib

import torch

from engine.bench.agreement import degenerate
from engine.bench.forward import time_steady
from engine.bench.varied import Varied


class Memo(torch.nn.Module):
    """A linear layer that returns its stored answer where every input byte is as before (right answers)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)
        self.memo: dict[str, torch.Tensor] = {}
        self.hits = 0

    def forward(self, x, ids=None, mask=None):
        key = hashlib.sha1(x.detach().float().numpy().tobytes()).hexdigest()
        if key in self.memo:
            self.hits += 1
            return self.memo[key]
        out = self.lin(x.float()) + (0 if ids is None else ids.float().mean())
        self.memo[key] = out
        return out


def test_a_memo_of_whole_answers_never_hits_on_the_timed_forwards():
    m = Memo()
    x = torch.randn(8, 32)
    forward = lambda: m(x)  # noqa: E731 - a builder's closure over its example inputs
    varied = Varied.record(m, forward, seed=1)
    assert varied.why is None
    assert varied.describe() == "new variants of the example inputs every forward (1 of 1 tensors varied)"
    m.hits = 0
    plain = lambda: m.lin(x)  # noqa: E731 - the eager arm: the model without the memoising kernel
    for i in range(100):   # pairs, alternating: the memo keeps every answer it saw, and still never hits
        pair = varied.new_pair()
        for arm in ((plain, forward) if i % 2 == 0 else (forward, plain)):
            varied.seek(pair)
            time_steady(arm, device="cpu", before=varied.before)
    assert m.hits == 0 and len(m.memo) == 1 + 2 + 200   # the example, the trial's two variants, every forward
    # the same timing on the example inputs alone: every forward after the first is a hit
    m.memo.clear()
    for _ in range(10):
        time_steady(forward, device="cpu")
    assert m.hits == 19   # the example inputs alone: every forward after the first is a hit


def test_both_arms_of_a_pair_see_the_same_inputs_and_the_example_comes_back():
    x = torch.randn(6, 32)
    seen = []
    m = Memo()
    varied = Varied.record(m, lambda: m(x), seed=2)
    original = x.clone()
    pair = varied.new_pair()
    for _arm in range(2):
        varied.seek(pair)
        time_steady(lambda: seen.append(x.clone()), device="cpu", before=varied.before)
    w0, t0, w1, t1 = seen   # each arm: its warm call, then its timed one
    assert torch.equal(w0, w1) and torch.equal(t0, t1) and not torch.equal(w0, t0)
    assert not torch.equal(t0, original)
    varied.restore()
    assert torch.equal(x, original)


def test_every_value_changes_and_ids_stay_ids_the_model_has():
    x = torch.randn(4, 64, 32, dtype=torch.bfloat16)
    ids = torch.randint(0, 1000, (4, 64))
    mask = torch.ones(4, 64, dtype=torch.int64)
    mask[:, 50:] = 0
    step = torch.tensor([7])
    m = Memo()

    def forward():
        return m(x, ids=ids, mask=mask, step=step)

    m.forward = lambda x, ids, mask, step: Memo.forward(m, x, ids, mask)
    varied = Varied.record(m, forward, seed=3)
    assert varied.describe().endswith("(3 of 4 tensors varied)")
    x0, ids0, mask0 = x.clone(), ids.clone(), mask.clone()
    varied.seek(5)
    varied.before()
    assert torch.equal(step, torch.tensor([7]))
    # floating: new values (a sum, a sum of squares, a hash of all bytes move), the distribution kept
    assert (x != x0).float().mean() > 0.9
    assert abs(float(x.float().std()) - float(x0.float().std())) < 0.05
    assert float(x.float().sum()) != float(x0.float().sum())
    # ids: drawn afresh within the example's range (red team 2026-12-07: permuted among a batch's few distinct
    # values, a batch of 2 had 2 variants)
    assert int(ids.min()) >= int(ids0.min()) and int(ids.max()) <= int(ids0.max())
    assert float((ids != ids0).float().mean()) > 0.9
    # a mask is rolled, never inverted
    assert int(mask.sum()) == int(mask0.sum()) and not torch.equal(mask, mask0)
    varied.restore()
    assert torch.equal(x, x0) and torch.equal(ids, ids0) and torch.equal(mask, mask0)


def test_where_nothing_can_vary_the_inputs_stay_and_the_record_says_why():
    m = Memo()
    assert Varied.record(m, lambda: m(torch.randn(4, 32))).why == \
        "the forward makes its inputs anew each call: nothing to vary in place"
    scalar = torch.ones(1, 32)
    assert Varied.record(m, lambda: m(scalar[:, :1].expand(1, 32).contiguous())).why is not None
    flags = torch.ones(2, 32, dtype=torch.bool)

    class Masked(torch.nn.Module):
        def forward(self, b):
            return b.float() * 2

    net = Masked()
    v = Varied.record(net, lambda: net(flags))
    assert v.why == "every input tensor is a mask, a boolean, a single element or an expanded view: nothing to vary"
    assert v.describe().startswith("the same inputs every forward (")
    v.before()   # nothing to copy
    assert torch.equal(flags, torch.ones(2, 32, dtype=torch.bool))

    wide = torch.randn(1, 32).expand(8, 32)   # an expanded input: written in place, it would raise
    v = Varied.record(m, lambda: m(wide))
    assert v.why == "every input tensor is a mask, a boolean, a single element or an expanded view: nothing to vary"

    scripted = torch.jit.script(torch.nn.Linear(4, 4))
    y = torch.randn(2, 4)
    assert "TorchScript" in Varied.record(scripted, lambda: scripted(y)).why


def test_a_model_that_breaks_on_varied_inputs_keeps_its_example_inputs():
    ids = torch.tensor([[2, 8, 40, 12, 6]])   # ids the model insists are even

    class Strict(torch.nn.Module):
        def forward(self, ids):
            if bool((ids % 2).any()):
                raise ValueError("ids must be even")
            return ids.float() * 2

    net = Strict()
    v = Varied.record(net, lambda: net(ids))
    assert v.why.startswith("the forward fails on varied inputs (ValueError: ids must be even")
    assert ids.tolist() == [[2, 8, 40, 12, 6]]

    class Zeroes(torch.nn.Module):   # an output that turns degenerate on other inputs than the example's
        def forward(self, x):
            return x * float(x[0, 0] == x0[0, 0])

    z, x0 = Zeroes(), torch.randn(3, 16)
    x1 = x0.clone()
    v = Varied.record(z, lambda: z(x1), judge=degenerate)
    assert v.why == "on varied inputs the model's output is all zeros" and torch.equal(x1, x0)


def test_inputs_that_must_stay_stay_and_a_short_id_tensor_still_varies():
    """Red team 2026-12-07: an inference tensor crashed the check (an in-place write outside inference mode, and
    again in restore); sorted offsets were permuted (the model then covered 15 of 31 rows); a parameter passed as
    an input was written in place; two ids of a batch of 2 had one variant."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(50, 8)

        def forward(self, x, offsets, w, ids):
            return x.sum() + offsets.float().sum() + w.sum() + self.table(ids).sum()

    net = Net()
    with torch.inference_mode():
        x = torch.randn(4, 8)
    offsets = torch.tensor([0, 5, 12, 20, 31])
    ids = torch.tensor([[7, 30]])
    version = net.table.weight._version
    v = Varied.record(net, lambda: net(x, offsets, net.table.weight, ids=ids), seed=4)
    assert v.kinds == [None, None, None, "token"]   # ids the model's table indexes: drawn over the table
    assert v.describe() == "new variants of the example inputs every forward (1 of 4 tensors varied)"
    drawn = set()
    for j in range(20):
        v.seek(j)
        v.before()
        drawn.add(tuple(ids.flatten().tolist()))
        assert torch.equal(offsets, torch.tensor([0, 5, 12, 20, 31]))
    assert len(drawn) >= 15 and all(0 <= i < 50 for pair in drawn for i in pair)
    assert any(i > 30 or i < 7 for pair in drawn for i in pair)
    assert net.table.weight._version == version
    v.restore()
    assert ids.tolist() == [[7, 30]]

    class Strict(torch.nn.Module):
        def forward(self, x):
            return x * 2

    s = Strict()
    with torch.inference_mode():
        only = torch.randn(3, 4)
    assert Varied.record(s, lambda: s(only)).why.startswith("every input tensor is")


def test_an_additive_mask_is_rolled_and_an_input_that_cannot_vary_holds_no_other_back():
    """Red team 2026-12-07: an additive float mask (0 and finfo.min) took noise, turned inf and NaN, and the model
    fell back to the same inputs every forward for all its inputs."""

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x, mask):
            return torch.softmax(self.lin(x) + mask, -1)

    net, x = Masked(), torch.randn(8, 16)
    mask = torch.zeros(8, 16)
    mask[:, 12:] = torch.finfo(torch.float32).min
    v = Varied.record(net, lambda: net(x, mask), judge=lambda o: degenerate(o))
    assert v.why is None and v.kinds == ["float", "mask"]
    v.seek(3)
    v.before()
    assert bool(torch.isfinite(net(x, mask)).all()) and int((mask < 0).sum()) == 8 * 4
    v.restore()

    ids = torch.tensor([[2, 8, 40, 12, 6]])   # ids the model insists are even: they stay, x still varies

    class Strict(torch.nn.Module):
        def forward(self, x, ids):
            if bool((ids % 2).any()):
                raise ValueError("ids must be even")
            return x * ids.sum()

    s = Strict()
    v = Varied.record(s, lambda: s(x, ids))
    assert v.why is None and v.kinds == ["float", None]
    assert v.describe() == "new variants of the example inputs every forward (1 of 2 tensors varied)"


def test_a_decode_steps_one_token_is_drawn_over_the_vocabulary():
    """Red team 2026-12-07, second pass: a decode step passes one token (and a fresh copy of its cache), so nothing
    varied and a memo keyed by a GEMM's input was kept at 3.66x on the shipped decode configs."""

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(1000, 16)
            self.pos = torch.nn.Embedding(64, 16)
            self.head = torch.nn.Linear(16, 1000)

        def forward(self, input_ids, cache):
            return self.head(self.embed(input_ids) + cache.mean(0))

    net, token, cache = Step(), torch.tensor([[417]]), torch.randn(8, 16)
    v = Varied.record(net, lambda: net(token, cache.clone()))
    # (the cache is a new tensor each call: it cannot be varied in place, so the token varies alone)
    assert v.kinds == ["token"] and v.describe().endswith("(1 of 1 tensors varied)")
    seen = set()
    for j in range(30):
        v.seek(j)
        v.before()
        seen.add(int(token))
    v.restore()
    assert len(seen) >= 25 and max(seen) < 1000 and int(token) == 417


def test_a_one_element_position_is_no_token_and_each_tensor_draws_its_own():
    """Review 2026-12-07: a generate()-style step's position_ids and cache_position (one element each, below the
    vocabulary) were drawn over the vocabulary like its token, all three to the same value, past the model's
    positions."""

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(1000, 16)
            self.pos = torch.nn.Embedding(200, 16)

        def forward(self, input_ids, position_ids, cache_position):
            return self.embed(input_ids) + self.pos(position_ids) + cache_position.float()

    net = Step()
    ids, pos, cache_pos = torch.tensor([[417]]), torch.tensor([[128]]), torch.tensor([128])
    v = Varied.record(net, lambda: net(input_ids=ids, position_ids=pos, cache_position=cache_pos))
    assert v.kinds == ["token", None, None]
    two = torch.tensor([[5, 9]])
    w = Varied.record(net, lambda: net(input_ids=two, position_ids=two.clone().fill_(3), cache_position=pos[0]))
    assert w.kinds[0] == "token"
