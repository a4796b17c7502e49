"""Eager itself, as the candidate, is never rejected (the honest sweep of 2026-12-07): op calls captured as cards the
way a model's are (`capture_samples`, samples loaded from disk), verified with eager as the kernel, and timed with
audits (`ab_time` replaced by the plain alternation of test_timed_protocol). Two honest candidates: eager's own
call, and the lane's `CandidateLauncher` (no kernels) allocating and poisoning the outputs as it does for a real
kernel, eager's values then copied into them. A rejection of either is a false rejection: aliasing, in-place
writes, views, out= arguments, list returns and layouts the checks got wrong.

The whole sweep (about 150 call patterns x 10 seeds) ran outside the suite; the parametrized test keeps a
representative subset, and each bug it found has its own test below."""

import pytest
import torch
import torch.nn.functional as F
from test_timed_protocol import _alternating_ab

from engine.bench.timing import TimingConfig
from engine.capture.samples import load_sample
from engine.capture.single import capture_samples
from engine.launch import ResolvedSpec
from engine.launch.launcher import CandidateLauncher
from engine.ops import call_op, resolve_op, tensors_of, written_args
from engine.verify.guard import Canaries
from engine.verify.inputs import tensors_of as bound_tensors
from engine.verify.pipeline import as_list, card_check

CFG = TimingConfig(min_reps=64, batch=16, audit_every=8, min_audits=3)


def _rn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _cl(*shape, seed=0):
    return _rn(*shape, seed=seed).contiguous(memory_format=torch.channels_last)


def _ints(lo, hi, shape, seed=1):
    return torch.randint(lo, hi, shape, generator=torch.Generator().manual_seed(seed))


# name -> (the op captured as the card, its inputs (made per test), the call on them: run twice under capture, as two
# samples; an in-place call's second sample holds the first's result)
CASES = {
    "relu_ half": ("aten::relu_", lambda: [_rn(4, 8, 16, 16, dtype=torch.half)], lambda x: x.relu_()),
    "add_ transposed": ("aten::add_.Tensor", lambda: [_rn(64, 8).t(), _rn(8, 64, seed=1)], lambda x, y: x.add_(y)),
    "mul_(x, x)": ("aten::mul_.Tensor", lambda: [_rn(8, 64)], lambda x: x.mul_(x)),
    "index_put_ accumulate": ("aten::index_put_", lambda: [_rn(16, 8), torch.tensor([1, 5, 5]), _rn(3, 8, seed=1)],
                              lambda x, i, v: x.index_put_((i,), v, accumulate=True)),
    "index_copy_": ("aten::index_copy_", lambda: [_rn(16, 8), torch.tensor([2, 9, 4]), _rn(3, 8, seed=1)],
                    lambda x, i, v: x.index_copy_(0, i, v)),
    "masked_fill_ broadcast": ("aten::masked_fill_.Scalar", lambda: [_rn(2, 4, 8, 8), torch.ones(8, 8).triu(1) > 0],
                               lambda x, m: x.masked_fill_(m, float("-inf"))),
    "add.out": ("aten::add.out", lambda: [_rn(8, 64), _rn(8, 64, seed=1), torch.empty(8, 64)],
                lambda a, b, o: torch.add(a, b, out=o)),
    "add(a, b, out=a)": ("aten::add.out", lambda: [_rn(8, 64), _rn(8, 64, seed=1)], lambda a, b: torch.add(a, b, out=a)),
    "max.dim_max out": ("aten::max.dim_max", lambda: [_rn(8, 64), torch.empty(8), torch.empty(8, dtype=torch.long)],
                        lambda a, v, i: torch.max(a, 1, out=(v, i))),
    "var_mean": ("aten::var_mean.correction", lambda: [_rn(8, 64)], lambda x: torch.var_mean(x, 1)),
    "topk": ("aten::topk", lambda: [_rn(8, 64)], lambda x: torch.topk(x, 5)),
    "layer_norm half": ("aten::native_layer_norm", lambda: [_rn(8, 256, dtype=torch.half), _rn(256, seed=1, dtype=torch.half)],
                        lambda x, w: F.layer_norm(x, (256,), w)),
    "group_norm channels-last": ("aten::native_group_norm", lambda: [_cl(2, 8, 4, 4), _rn(8, seed=1), _rn(8, seed=2)],
                                 lambda x, w, b: F.group_norm(x, 4, w, b)),
    "batch_norm training": ("aten::native_batch_norm", lambda: [_rn(4, 8, 5, 5), torch.zeros(8), torch.ones(8)],
                            lambda x, rm, rv: F.batch_norm(x, rm, rv, training=True)),
    "_native_batch_norm_legit": ("aten::_native_batch_norm_legit",
                                 lambda: [_rn(4, 8, 5, 5), _rn(8, seed=1), torch.zeros(8), torch.ones(8)],
                                 lambda x, w, rm, rv: torch.ops.aten._native_batch_norm_legit(x, w, None, rm, rv, True,
                                                                                             0.1, 1e-5)),
    "softmax half": ("aten::_softmax", lambda: [_rn(8, 64, dtype=torch.half)], lambda x: x.softmax(-1)),
    "cumsum of ones": ("aten::cumsum", lambda: [torch.ones(4, 32, dtype=torch.long)], lambda x: x.cumsum(1)),
    "embedding": ("aten::embedding", lambda: [_rn(50, 16), _ints(0, 40, (4, 7))], lambda w, i: F.embedding(i, w)),
    "gather expanded index": ("aten::gather", lambda: [_rn(8, 16), _ints(0, 16, (1, 5)).expand(8, 5)],
                              lambda x, i: x.gather(1, i)),
    "where 0-dim other": ("aten::where.self", lambda: [_rn(8, 1) > 0, _rn(8, 64, seed=1), torch.tensor(0.0)],
                          torch.where),
    "mul(x, x)": ("aten::mul.Tensor", lambda: [_rn(8, 64)], lambda x: x * x),
    "floor divide ints": ("aten::div.Tensor_mode", lambda: [_ints(-9, 9, (8, 64)), _ints(1, 9, (8, 64), seed=2)],
                          lambda a, b: torch.div(a, b, rounding_mode="floor")),
    "unsafe_split": ("aten::unsafe_split.Tensor", lambda: [_rn(12, 8)], lambda x: torch.ops.aten.unsafe_split(x, 4)),
    "_foreach_add_": ("aten::_foreach_add_.List", lambda: [_rn(8, 8), _rn(16, seed=1), _rn(8, 8, seed=2), _rn(16, seed=3)],
                      lambda a, b, c, d: torch._foreach_add_([a, b], [c, d])),
    "sdpa broadcast mask": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                            lambda: [_rn(1, 2, 8, 16), _rn(1, 2, 8, 16, seed=1), _rn(1, 2, 8, 16, seed=2),
                                     torch.ones(8, 8, dtype=torch.bool).tril().expand(1, 2, 8, 8)],
                            lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)),
}


def _card(tmp_path, name):
    """The card of CASES[name] as the lane loads it: (op, signature, outputs, samples)."""
    op, inputs, call = CASES[name]
    args = inputs()
    cards, files = capture_samples(lambda: [call(*args) for _ in range(2)], tmp_path, 2)
    card = next(c for c in cards if c.op == op)
    return op, card.signature, card.outputs, [load_sample(p, "cpu", card.signature).args for p in files[card.id]]


def _launched(op_name, outputs):
    """An honest launched kernel: the lane's launcher allocates (and poisons) its outputs, eager's values go in."""
    launcher = CandidateLauncher(None, ResolvedSpec((), ()), op_name, outputs, torch.device("cpu"),
                                 canaries=Canaries("cpu"))
    op = resolve_op(op_name)

    def prepare(bound, prefill):
        outs = launcher.allocate_outputs(dict(bound), prefill)

        def call():
            for o, r, alias in zip(outs, tensors_of(call_op(op, bound)), launcher.aliases):
                if alias is None:
                    o.copy_(r)
            return outs
        return call
    return prepare


def _eager(op_name):
    op = resolve_op(op_name)
    return lambda bound, prefill: (lambda: call_op(op, bound))


def _verify_and_time(monkeypatch, card, prepare, seed):
    """The verdict's failure and the timed run's problem, each None where there is none."""
    from engine.verify import timed

    monkeypatch.setattr(timed, "ab_time", _alternating_ab)
    op, signature, _, samples = card
    check = card_check(op, signature, samples, seed=1234 + 7 * seed, race_reps=2)
    v = check.check(lambda b, prefill: as_list(prepare(b, prefill)()))
    if not v.ok:
        return f"verification: {v.category}: {v.message}"
    run = timed.audited_ab(check, timed.TimedCandidate(prepare), lambda: None, CFG, seed=100 + seed)
    if run.category is not None or run.audited < CFG.min_audits:
        return f"timed: {run.category}: {run.message}"
    return None


@pytest.mark.parametrize("name", sorted(CASES))
def test_eager_as_the_candidate_is_never_rejected(tmp_path, monkeypatch, name):
    card = _card(tmp_path, name)
    for seed in range(3):
        for how, prepare in (("eager", _eager(card[0])), ("launched", _launched(card[0], card[2]))):
            problem = _verify_and_time(monkeypatch, card, prepare, seed)
            assert problem is None, f"{name}, seed {seed}, {how}: {problem}"


def test_a_read_only_input_that_is_the_written_one_ends_as_eager_leaves_it(tmp_path, monkeypatch):
    # mul_(x, x): `other` is `self`, and the op's write changes it. The check held every argument the schema does not
    # write to its values before the call, and an honest kernel was rejected ('input other was modified'), in
    # verification and in timed audits alike. Such an input must now end as eager leaves it.
    card = _card(tmp_path, "mul_(x, x)")
    assert _verify_and_time(monkeypatch, card, _eager(card[0]), 0) is None
    assert _verify_and_time(monkeypatch, card, _launched(card[0], card[2]), 0) is None


def test_a_read_only_input_beside_the_written_one_in_its_storage_must_stay_unchanged():
    # x[0].add_(x[1]): one storage, no byte shared. A kernel that also writes `other` is still a mutation.
    from engine.verify.pipeline import CardCheck

    op = resolve_op("aten::add_.Tensor")
    x = _rn(2, 64)
    check = CardCheck("aten::add_.Tensor", [[("self", x[0]), ("other", x[1]), ("alpha", 1)]],
                      lambda b: call_op(op, b), written_args=written_args(op), race_reps=0)

    def writes_other(b, prefill):
        out = call_op(op, b)
        dict(b)["other"].add_(1.0)
        return [out]

    v = check.check(writes_other)
    assert not v.ok and v.category == "mutation" and "input other" in v.message, v.message


def _bn_sample(training, seed=0):
    return [("input", _rn(4, 8, 5, 5, seed=seed)), ("weight", _rn(8, seed=1)), ("bias", _rn(8, seed=2)),
            ("running_mean", _rn(8, seed=3)), ("running_var", _rn(8, seed=4).abs() + 0.5), ("training", training),
            ("momentum", 0.1), ("eps", 1e-5)]


def test_a_training_native_batch_norm_must_update_its_running_statistics(monkeypatch):
    # native_batch_norm's schema (and cudnn_batch_norm's, miopen_batch_norm's) does not mark the running statistics it
    # updates in training, and F.batch_norm dispatches to it (on the CPU; cuDNN's on CUDA). Eager's own answer moved
    # them, and an honest kernel that updated them was rejected for mutating a read-only input; one that left them
    # passed. In eval they stay read-only.
    op = resolve_op("aten::native_batch_norm")
    assert written_args(op) == ["running_mean", "running_var"]
    assert written_args(op, _bn_sample(True)) == ["running_mean", "running_var"]
    assert written_args(op, _bn_sample(False)) == []
    samples = [_bn_sample(True, 0), _bn_sample(True, 5)]
    card = ("aten::native_batch_norm", {}, None, samples)
    assert _verify_and_time(monkeypatch, card, _eager(card[0]), 0) is None

    def stats_left(b, prefill):
        mine = dict(b)
        keep = [mine["running_mean"].clone(), mine["running_var"].clone()]
        out = call_op(op, b)
        mine["running_mean"].copy_(keep[0])
        mine["running_var"].copy_(keep[1])
        return list(out)

    v = card_check("aten::native_batch_norm", {}, samples, race_reps=0).check(stats_left)
    assert not v.ok and "mutated argument running_mean" in v.message, v.message

    def stats_written(b, prefill):
        out = call_op(op, b)
        dict(b)["running_mean"].add_(1.0)
        return list(out)

    v = card_check("aten::native_batch_norm", {}, [_bn_sample(False)], race_reps=0).check(stats_written)
    assert not v.ok and v.category == "mutation" and "running_mean" in v.message, v.message


def test_a_training_batch_norms_sample_holds_the_running_statistics_before_the_call(tmp_path):
    # The capture saved a CPU input that no written argument touches by reference, after the call: the sample of a
    # training native_batch_norm held the running statistics the call had updated, not those it was called with.
    rm, rv = torch.zeros(8), torch.ones(8)
    cards, files = capture_samples(lambda: F.batch_norm(_rn(4, 8, 5, 5), rm, rv, training=True), tmp_path, 1)
    card = next(c for c in cards if c.op == "aten::native_batch_norm")
    sample = load_sample(files[card.id][0])
    args = dict(sample.args)
    assert torch.equal(args["running_mean"], torch.zeros(8)) and torch.equal(args["running_var"], torch.ones(8))
    assert torch.equal(sample.mutated["running_mean"], rm) and not torch.equal(rm, torch.zeros(8))


def _launcher(op_name, outputs):
    return CandidateLauncher(None, ResolvedSpec((), ()), op_name, outputs, torch.device("cpu"))


def test_an_out_argument_that_is_an_input_is_not_poisoned():
    # torch.add(a, b, out=a): the launcher filled `out` with NaN before the call, and so `a`, which the kernel reads:
    # an honest kernel computed NaN + b. An out= argument of its own is still poisoned.
    spec = [{"shape": [8, 64], "stride": [64, 1], "dtype": "float32"}]
    launcher = _launcher("aten::add.out", spec)
    a, b = _rn(8, 64), _rn(8, 64, seed=1)
    launcher.allocate_outputs({"self": a, "other": b, "alpha": 1, "out": a}, "nan")
    assert not a.isnan().any()
    out = torch.empty(8, 64)
    launcher.allocate_outputs({"self": a, "other": b, "alpha": 1, "out": out}, "nan")
    assert out.isnan().all()


def test_a_list_return_is_one_output_per_tensor():
    # unsafe_split (an LSTM or GRU cell's gates) returns `Tensor[]`: one return, three tensors. The launcher zipped
    # the card's outputs with the schema's returns and allocated one: every candidate returned 1 output of 3.
    spec = [{"shape": [4, 8], "stride": [8, 1], "dtype": "float32"}] * 3
    outs = _launcher("aten::unsafe_split.Tensor", spec).allocate_outputs({"self": _rn(12, 8)}, "nan")
    assert len(outs) == 3 and all(o.shape == (4, 8) and o.isnan().all() for o in outs)


def test_an_op_that_returns_nothing_has_no_outputs(tmp_path, monkeypatch):
    # _foreach_add_ returns `()`: eager's None counted as one output, a launched kernel's none, and every one was
    # rejected ('0 outputs, expected 1'). What it writes is still held to eager's (a list argument, element by element).
    assert as_list(None) == []
    card = _card(tmp_path, "_foreach_add_")
    assert _verify_and_time(monkeypatch, card, _launched(card[0], card[2]), 0) is None

    def skips_one(b, prefill):
        mine = dict(b)
        torch._foreach_add_(mine["self"][:1], mine["other"][:1])
        return []

    v = card_check(card[0], card[1], card[3], race_reps=0).check(skips_one)
    assert not v.ok and "self[1]" in v.message, v.message


def _skips_writes_once_timed(op_name, after):
    """A kernel that does the op's writes honestly for `after` calls, then none: what it returns stays right."""
    op = resolve_op(op_name)
    calls = [0]

    def prepare(bound, prefill):
        def call():
            calls[0] += 1
            if calls[0] <= after:
                return call_op(op, bound)
            kept = [t.clone() for _, t in bound_tensors(bound)]
            out = call_op(op, bound)
            for (_, t), old in zip(bound_tensors(bound), kept):
                t.copy_(old)   # every write undone: an op returning `()` returns nothing to compare
            return out
        return call
    return prepare


@pytest.mark.parametrize("name", ["_foreach_add_", "batch_norm training"])
def test_a_kernel_that_skips_the_writes_it_does_not_return_once_timed_is_caught(tmp_path, monkeypatch, name):
    # Timed audits compared what the op returns and nothing else: `_foreach_add_` returns `()`, and a training batch
    # norm does not return its running statistics. A kernel that did those writes in verification and skipped them once
    # timed (here from its 60th call on) was never seen; an audit now holds every written argument to eager's.
    from engine.verify import timed

    card = _card(tmp_path, name)
    assert _verify_and_time(monkeypatch, card, _eager(card[0]), 0) is None
    op, signature, _, samples = card
    check = card_check(op, signature, samples, race_reps=2)
    cheat = _skips_writes_once_timed(op, 60)
    assert check.check(lambda b, prefill: as_list(cheat(b, prefill)())).ok
    monkeypatch.setattr(timed, "ab_time", _alternating_ab)
    cfg = TimingConfig(min_reps=128, batch=16, audit_every=4, min_audits=3)
    run = timed.audited_ab(check, timed.TimedCandidate(cheat), lambda: None, cfg, seed=5)
    assert run.category == "cheating" and "written argument" in run.message, run.message
