"""The checks that make a verified speedup hard to fake, on CPU with Python stand-ins for kernels:
guard bands, non-finite edge sets, the float64 precision check, repeated runs for races, per-call
fresh values for timed calls, and the re-check in place."""

import math

import pytest
import torch

from engine.launch import StaleWorkspacesKept, WorkspacesKept
from engine.ops import call_op, resolve_op
from engine.verify.guard import GUARD_BYTES, Canaries, GuardViolation
from engine.verify.inputs import Regenerator, clone_bound, edge_inputs, tensors_of
from engine.verify.pipeline import CardCheck, as_list

RELU = resolve_op("aten::relu")
SOFTMAX = resolve_op("aten::_softmax")
SUM = resolve_op("aten::sum.dim_IntList")


def relu_check(**kw):
    torch.manual_seed(0)
    samples = [[("self", torch.randn(4096))] for _ in range(2)]
    return CardCheck("aten::relu", samples, lambda b: call_op(RELU, b), **kw)


def good_relu(b, prefill):
    return [torch.relu(dict(b)["self"])]


# ---- guard bands ----------------------------------------------------------------------------------


def test_canaries_see_a_write_past_the_end_and_before_the_start():
    c = Canaries("cpu")
    out = c.empty_strided((10, 3), (3, 1), torch.float32, name="out0")
    out.fill_(1.0)
    assert c.violations() == []
    raw = torch.empty(0, dtype=torch.uint8).set_(out.untyped_storage())
    gb = c.regions[-1].before.numel()   # this buffer's guard before it: GUARD_BYTES to twice that
    assert GUARD_BYTES <= gb < 2 * GUARD_BYTES and gb % 512 == 0 and out.storage_offset() * 4 == gb
    end = gb + out.numel() * 4
    raw[end:end + 1024] ^= 0xFF  # 1 KiB past the output
    lines = c.violations()
    assert len(lines) == 1 and "out0" in lines[0] and "after the end" in lines[0] and "1024 bytes past" in lines[0]
    raw[gb - 4] ^= 0xFF
    assert any("before the start" in line for line in c.violations())


def test_canary_widths_vary_per_buffer_and_side():
    # One width for every guard band told a kernel where the next buffer began (red team 2026-12-06h)
    c = Canaries("cpu")
    for i in range(8):
        c.buffer(100, f"b{i}")
    widths = [w for r in c.regions for w in (r.before.numel(), r.after.numel())]
    assert len(set(widths)) > 4 and all(GUARD_BYTES <= w < 2 * GUARD_BYTES and w % 512 == 0 for w in widths)
    assert c.violations() == []


def test_canaries_queued_check_reports_once_and_forgets_buffers():
    c = Canaries("cpu")
    ws = c.buffer(256, name="workspace 'tmp'")
    ws.fill_(3)
    c.enqueue_check()
    assert c.regions == [] and c.pending_violation() is False
    ws2 = c.buffer(256, name="w")
    torch.empty(0, dtype=torch.uint8).set_(ws2.untyped_storage())[c.regions[-1].before.numel() + 256] ^= 1
    c.enqueue_check()
    assert c.pending_violation() is True
    assert c.pending_violation() is False  # read once


def test_guarded_clone_keeps_layout_values_and_aliasing():
    base = torch.randn(6, 8)
    view = base[:, 2:5]  # non-contiguous, offset into the same storage
    bound = [("self", base), ("other", view), ("dim", 1)]
    c = Canaries("cpu")
    copy = clone_bound(bound, alloc=c.buffer)
    a, b = copy[0][1], copy[1][1]
    assert torch.equal(a, base) and torch.equal(b, view) and b.stride() == view.stride()
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()  # still aliased
    assert a.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    assert c.violations() == [] and len(c.regions) == 1


def test_candidate_writing_past_its_input_copy_is_overrun():
    check = relu_check(race_reps=0)

    def overruns(b, prefill):
        x = dict(b)["self"]
        raw = torch.empty(0, dtype=torch.uint8).set_(x.untyped_storage())
        raw[x.storage_offset() * 4 + x.numel() * 4 + 100] = 7  # 100 bytes past the input
        return [torch.relu(x)]

    v = check.check(overruns)
    assert not v.ok and v.category == "overrun" and "self" in v.message and "after the end" in v.message


def test_guard_violation_raised_by_the_runner_is_overrun():
    check = relu_check(race_reps=0)

    def runner(b, prefill):
        raise GuardViolation("wrote outside its buffers: out0: 4 of the 65536 bytes after the end were overwritten")

    v = check.check(runner)
    assert not v.ok and v.category == "overrun" and "out0" in v.message


# ---- non-finite edge sets -------------------------------------------------------------------------


def test_nonfinite_edge_set_plants_nan_and_both_infinities():
    [(kind, b)] = edge_inputs([("self", torch.randn(100)), ("n", 3)], ("nonfinite",))
    x = b[0][1]
    assert kind == "nonfinite" and int(torch.isnan(x).sum()) == 2
    assert bool((x == math.inf).any()) and bool((x == -math.inf).any())


def test_relu_that_maps_nan_to_zero_is_rejected():
    check = relu_check(race_reps=0)

    def fmax_relu(b, prefill):  # fmaxf(x, 0): NaN becomes 0
        return [torch.nan_to_num(torch.relu(dict(b)["self"]), nan=0.0)]

    v = check.check(fmax_relu)
    assert not v.ok and v.category == "mismatch" and v.input_set == "edge nonfinite"
    assert relu_check(race_reps=0).check(good_relu).ok


def test_nan_skipping_sum_is_rejected():
    torch.manual_seed(0)
    samples = [[("self", torch.randn(64, 128)), ("dim", [1]), ("keepdim", False), ("dtype", None)]]
    check = CardCheck("aten::sum.dim_IntList", samples, lambda b: call_op(SUM, b), race_reps=0)

    def nansum(b, prefill):
        return [torch.nansum(dict(b)["self"], dim=1)]

    v = check.check(nansum)
    assert not v.ok and v.category in ("mismatch", "nan") and v.input_set == "edge nonfinite"


# ---- precision against float64 --------------------------------------------------------------------


def softmax_check():
    torch.manual_seed(0)
    samples = [[("self", torch.randn(64, 2048).half()), ("dim", -1), ("half_to_float", False)]]
    return CardCheck("aten::_softmax", samples, lambda b: call_op(SOFTMAX, b), race_reps=0, edges=False)


def _softmax_half_arith(x: torch.Tensor) -> torch.Tensor:
    """Softmax with every step rounded to float16, accumulating the row sum in float16 (sequential)."""
    m = x.amax(dim=-1, keepdim=True)
    e = torch.exp((x - m).float()).half()
    s = torch.zeros(x.shape[0], 1, dtype=torch.float16)
    for j in range(0, x.shape[1], 64):  # partial sums of 64, accumulated in fp16
        s = (s.float() + e[:, j:j + 64].float().sum(dim=-1, keepdim=True)).half()
    return (e.float() / s.float()).half()


def test_fp16_softmax_accumulated_in_fp16_is_a_precision_mismatch():
    check = softmax_check()
    v = check.check(lambda b, p: [_softmax_half_arith(dict(b)["self"])])
    assert not v.ok and v.category == "mismatch"
    assert "float64 reference" in v.message and "lower precision" in v.message
    assert v.details["precision"]["ratio"] > 3


def test_fp16_softmax_accumulated_in_fp32_in_another_order_passes():
    check = softmax_check()

    def fp32_softmax(b, p):
        x = dict(b)["self"].float()
        e = torch.exp(x - x.amax(dim=-1, keepdim=True))
        s = e.flip(-1).cumsum(-1)[:, -1:]  # a different summation order, in float32
        return [(e / s).half()]

    v = check.check(fp32_softmax)
    assert v.ok, v.message


# ---- races ----------------------------------------------------------------------------------------


def test_a_race_that_shows_in_later_runs_is_caught():
    check = relu_check()
    calls = [0]

    # every set's two runs, and a third (stale outputs) for each sample and fresh set after the first
    checked = 2 * len(check.sets) + sum(label.startswith(("sample", "fresh")) for label, _ in check.sets) - 1

    def flaky(b, prefill):  # right for every set's runs, wrong once more runs come (a rare race)
        calls[0] += 1
        out = torch.relu(dict(b)["self"])
        if calls[0] > checked + 1:
            out[17] += 1.0
        return [out]

    v = check.check(flaky)
    assert not v.ok and v.category == "nondeterminism" and "repeated run" in v.message


def test_race_runs_use_the_contention_hook():
    entered = []

    class Busy:
        def __enter__(self):
            entered.append(1)

        def __exit__(self, *a):
            return False

    check = relu_check(contend=Busy, race_reps=4)
    assert check.check(good_relu).ok
    assert len(entered) == 2  # every other repeated run


def _memoising_race(contended):
    """A relu whose fast path races (wrong beside other work, `contended()`), hidden by a memo: an answer computed
    on a quiet GPU is returned again for any later call whose inputs share a fingerprint of 9 elements."""
    memo: dict[tuple, torch.Tensor] = {}
    raced = [0]

    def run(b, prefill):
        x = dict(b)["self"]
        flat = x.view(-1)
        key = tuple(flat[:: max(1, flat.numel() // 8)][:8].tolist() + [float(flat[-1])])
        if key in memo:
            return [memo[key].clone()]
        out = torch.relu(x)
        if contended():
            out[17] += 1.0   # the race: it shows only beside other work
            raced[0] += 1
        memo[key] = out.clone()
        return [out]
    return run, raced


def test_a_race_hidden_by_memoising_repeated_inputs_is_caught():
    # The repeated runs went over two input sets verification had already run: a kernel that memoises on a
    # fingerprint of its inputs returned its quiet first answer beside the busy stream and never raced there.
    busy = [False]

    class Busy:
        def __enter__(self):
            busy[0] = True

        def __exit__(self, *a):
            busy[0] = False
            return False

    check = relu_check(contend=Busy)
    run, raced = _memoising_race(lambda: busy[0])
    v = check.check(run)
    assert raced[0] > 0, "the race never ran beside the busy stream"
    assert not v.ok and v.category == "nondeterminism", v.message
    assert "as on a busy GPU" in v.message


# ---- values for timed calls -----------------------------------------------------------------------


def test_regenerator_draws_new_values_with_the_samples_statistics():
    torch.manual_seed(0)
    x = torch.randn(10000) * 3 + 5
    idx = torch.randint(0, 50, (1000,))
    flags = torch.rand(1000) < 0.25
    sample = [("self", x), ("index", idx), ("mask", flags), ("dim", 0)]
    slot = clone_bound(sample)
    regen = Regenerator(sample, seed=7)
    seen = []
    for _ in range(3):
        regen.refill_(slot)
        (_, a), (_, i), (_, m) = tensors_of(slot)
        seen.append(a.clone())
        assert abs(float(a.mean()) - 5) < 0.3 and abs(float(a.std()) - 3) < 0.3
        assert float(a.min()) >= float(x.min()) and float(a.max()) <= float(x.max())
        assert int(i.min()) >= 0 and int(i.max()) <= 49 and i.dtype == torch.int64
        assert 0.15 < float(m.float().mean()) < 0.35
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])
    assert torch.equal(sample[0][1], x)  # the sample itself is untouched


def test_regenerator_draws_the_same_values_again_from_a_kept_state():
    # Timed calls' audits draw the candidate's values again after its call instead of copying them before it.
    torch.manual_seed(0)
    sample = [("self", torch.randn(1000) * 2 + 1), ("offsets", torch.tensor([0, 3, 3, 9, 20])),
              ("mask", torch.rand(300) < 0.3), ("z", torch.randn(64, dtype=torch.complex64)),
              ("index", torch.randint(0, 7, (50,)))]
    regen = Regenerator(sample, seed=5, keep_ints=False)
    slot, again = clone_bound(sample), clone_bound(sample)
    regen.refill_(slot)
    state = regen.state()
    regen.refill_(slot)
    after = regen.state()
    regen.redraw_(again, state)
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(tensors_of(slot), tensors_of(again)))
    assert torch.equal(regen.state(), after)   # the generator goes on where it was
    kept = Regenerator(sample, seed=5, keep_ints=True).kept(slot)
    assert [t.dtype for t in kept] == [torch.int64, torch.int64]


# ---- re-check in place ----------------------------------------------------------------------------


def test_recheck_in_place_catches_a_cache_keyed_by_address():
    check = relu_check(race_reps=0)
    cache: dict[int, torch.Tensor] = {}

    def by_address(b, prefill):
        x = dict(b)["self"]
        if x.data_ptr() not in cache:
            cache[x.data_ptr()] = torch.relu(x)
        return [cache[x.data_ptr()].clone()]

    buffers = clone_bound(check.sets[0][1])
    v = check.recheck_in_place(by_address, buffers)
    assert not v.ok and v.category == "mismatch" and "same buffers" in v.message


def _memo_in_workspace(op):
    """A candidate that memoises `op`'s answer on a fingerprint of 8 spread elements of its first input, in
    what stands for a workspace it never zeroes: a poisoned workspace (every prefill but WorkspacesKept) has
    lost the memo, one kept as its last call left it still holds it."""
    memo: dict = {}

    def run(b, prefill):
        x = b[0][1]
        if not isinstance(prefill, (WorkspacesKept, StaleWorkspacesKept)):
            memo.clear()
        fp = tuple(x.flatten()[:: max(1, x.numel() // 8)].tolist())
        if memo.get("fp") == fp:
            return [memo["out"].clone()]
        out = as_list(call_op(op, b))
        memo.update(fp=fp, out=out[0].clone())
        return out

    return run


def test_recheck_catches_a_memo_kept_in_a_workspace_it_never_zeroes():
    """The lane poisons a workspace before every call, so the memo never hits there and gains nothing; in a
    model called on the same inputs forward after forward it would. The re-check's last call finds the
    workspace as the call before left it and the buffers with a few values changed, never the fingerprint's."""
    torch.manual_seed(0)
    add = resolve_op("aten::add.Tensor")
    n = 1 << 18   # 4 changed of n: a fingerprint of 8 covers one about once in 8,000 re-checks
    samples = [[("self", torch.randn(n)), ("other", torch.randn(n)), ("alpha", 1)] for _ in range(2)]
    check = CardCheck("aten::add.Tensor", samples, lambda b: call_op(add, b), race_reps=0)
    run = _memo_in_workspace(add)
    assert check.check(run).ok                      # verification: poisoned workspaces, never a hit
    buffers = clone_bound(check.sets[0][1])
    for _ in range(3):
        run(buffers, "nan")                         # timing: the same buffers, poisoned workspaces
    v = check.recheck_in_place(run, buffers)
    assert not v.ok and v.category == "mismatch", v
    assert "a few values changed" in v.message and "memo kept in a workspace" in v.message
    # the same candidate without the memo passes the same re-check
    honest = CardCheck("aten::add.Tensor", samples, lambda b: call_op(add, b), race_reps=0)
    assert honest.recheck_in_place(lambda b, prefill: as_list(call_op(add, b)), clone_bound(honest.sets[0][1])).ok


def test_the_rechecks_calls_look_like_a_models_and_move_a_maxs_answer():
    """Red team 2026-12-06h: a memo that hits only where its outputs do not hold the lane's NaN (a model's block
    holds earlier values) passed the re-check, and one on `amax` met 4 changed values that never moved a row's
    max. The re-check's calls now find their outputs holding the candidate's own last answer, and the changed
    values sit above their row's max or below its min."""
    torch.manual_seed(0)
    amax = resolve_op("aten::amax")
    samples = [[("self", torch.randn(64, 4096)), ("dim", [-1]), ("keepdim", False)] for _ in range(2)]
    memo: dict = {}

    def run(b, prefill):
        x = b[0][1]
        if not isinstance(prefill, (WorkspacesKept, StaleWorkspacesKept)):
            memo.clear()
        fp = tuple(x.flatten()[:: x.numel() // 8].tolist())
        own = isinstance(prefill, list) and "out" in memo and torch.equal(prefill[0], memo["out"])
        if own and memo.get("fp") == fp:
            return [memo["out"].clone()]
        out = as_list(call_op(amax, b))
        memo.update(fp=fp, out=out[0].clone())
        return out

    check = CardCheck("aten::amax", samples, lambda b: call_op(amax, b), race_reps=0)
    assert check.check(run).ok
    v = check.recheck_in_place(run, clone_bound(check.sets[0][1]))
    assert not v.ok and "a few values changed" in v.message, v


def test_the_recheck_leaves_sorted_rows_sorted_and_integers_kept():
    """Red team 2026-12-06h: changed values unsorted `searchsorted`'s sequence (a kernel counting the values below
    was rejected there), and the re-check drew integers an op refuses (`repeat_interleave` with `output_size`:
    it raised instead of answering)."""
    g = torch.Generator().manual_seed(0)
    search = resolve_op("aten::searchsorted.Tensor")
    seq = torch.sort(torch.randn(4, 32, generator=g), -1).values
    sample = [("sorted_sequence", seq), ("self", torch.randn(4, 16, generator=g)), ("out_int32", False),
              ("right", False)]

    def count_below(b, prefill):   # no binary search: how many lie below, NaN taken as the largest value
        d = dict(b)
        below = d["sorted_sequence"].unsqueeze(-2) < d["self"].unsqueeze(-1)
        return [torch.where(torch.isnan(d["self"]).unsqueeze(-1), True, below).sum(-1).to(torch.int64)]

    check = CardCheck("aten::searchsorted.Tensor", [sample], lambda b: call_op(search, b), race_reps=0)
    assert check.check(count_below).ok
    for _ in range(10):
        v = check.recheck_in_place(count_below, clone_bound(check.sets[0][1]))
        assert v.ok, v.message
    repeat = resolve_op("aten::repeat_interleave.self_Tensor")
    sample = [("self", torch.randn(3)), ("repeats", torch.tensor([1, 2, 3])), ("dim", 0), ("output_size", 6)]
    check = CardCheck("aten::repeat_interleave.self_Tensor", [sample], lambda b: call_op(repeat, b), race_reps=0)
    honest = lambda b, prefill: [call_op(repeat, b)]   # noqa: E731
    assert check.check(honest).ok and check.keep_ints
    assert check.recheck_in_place(honest, clone_bound(check.sets[0][1])).ok


def test_an_integer_only_card_gets_the_last_call_too_and_a_gathers_indices_move():
    """Red team 2026-12-06h: the last call changed floating values only, so a card whose every input is an
    integer (a bitwise op, an argsort of ids) got none, and its memo in a workspace passed. Integer values are now
    rotated among a few drawn positions: each stays one the tensor held, so indices stay valid."""
    torch.manual_seed(0)
    xor = resolve_op("aten::bitwise_xor.Tensor")
    samples = [[("self", torch.randint(0, 1 << 20, (1 << 16,))), ("other", torch.randint(0, 1 << 20, (1 << 16,)))]
               for _ in range(2)]
    check = CardCheck("aten::bitwise_xor.Tensor", samples, lambda b: call_op(xor, b), race_reps=0)
    run = _memo_in_workspace(xor)
    assert check.check(run).ok and not check.keep_ints
    v = check.recheck_in_place(run, clone_bound(check.sets[0][1]))
    assert not v.ok and "a few values changed" in v.message, v
    assert check.recheck_in_place(lambda b, prefill: [call_op(xor, b)], clone_bound(check.sets[0][1])).ok
    # a 0/1 tensor: four positions drawn blindly held one value an eighth of the time, and the memo passed
    # (red team 2026-12-07: 9 of 80 re-checks); the rotation now always moves a value
    bnot = resolve_op("aten::bitwise_not")
    # (1 << 20 elements: the memo's 8-element fingerprint covers one of the 4 moved ones in about 1 of 30,000
    # re-checks, and then it recomputes and is right)
    bits = [[("self", torch.randint(0, 2, (1 << 20,)))] for _ in range(2)]
    check = CardCheck("aten::bitwise_not", bits, lambda b: call_op(bnot, b), race_reps=0)
    run = _memo_in_workspace(bnot)
    assert check.check(run).ok
    assert all(not check.recheck_in_place(run, clone_bound(check.sets[0][1])).ok for _ in range(20))
    # an embedding: the memo keyed by the table alone (its indices "never change") meets rows gathered elsewhere
    emb = resolve_op("aten::embedding")
    sample = [("weight", torch.randn(1000, 64)), ("indices", torch.randint(0, 1000, (4096,)))]
    check = CardCheck("aten::embedding", [sample, sample], lambda b: call_op(emb, b), race_reps=0)
    by_table = _memo_in_workspace(emb)   # (its first input is the table)
    assert check.check(by_table).ok
    assert not check.recheck_in_place(by_table, clone_bound(check.sets[0][1])).ok


def test_the_recheck_of_an_in_place_op_runs_on_values_not_on_scrubbed_bytes():
    """Red team 2026-12-06h: the answer of an in-place op is its input buffer, and scrubbing the answers filled
    that buffer with NaN: the last call ran on 99.9 % NaN. Eager now runs after the candidate, too."""
    relu_ = resolve_op("aten::relu_")
    torch.manual_seed(0)
    check = CardCheck("aten::relu_", [[("self", torch.randn(4096))]], lambda b: call_op(relu_, b), race_reps=0)
    seen = []

    def honest(b, prefill):
        seen.append(float(torch.isnan(b[0][1]).float().mean()))
        return [call_op(relu_, b)]

    buffers = clone_bound(check.sets[0][1])
    assert check.recheck_in_place(honest, buffers).ok
    assert seen == [0.0, 0.0, 0.0], seen


@pytest.mark.parametrize("family_op", ["aten::mm"])
def test_matmul_has_no_nonfinite_edge_set(family_op):
    torch.manual_seed(0)
    mm = resolve_op(family_op)
    check = CardCheck(family_op, [[("self", torch.randn(8, 8)), ("mat2", torch.randn(8, 8))]],
                      lambda b: call_op(mm, b))
    assert not any("nonfinite" in label for label, _ in check.sets)


def test_nonfinite_kind_may_differ_only_where_the_family_reorders_sums():
    from dataclasses import replace

    from engine.verify.compare import compare
    from engine.verify.tolerance import tolerance_for

    tol = tolerance_for("aten::native_layer_norm", torch.float32)
    expected = torch.tensor([1.0, float("nan"), float("inf")])
    welford_vs_sum = torch.tensor([1.0, float("inf"), float("nan")])
    assert not compare(welford_vs_sum, expected, tol).ok  # kinds must match by default
    loose = replace(tol, nonfinite_kind=False)
    assert compare(welford_vs_sum, expected, loose).ok
    assert not compare(torch.tensor([1.0, 0.0, float("inf")]), expected, loose).ok  # NaN -> 0 never passes
    assert not compare(torch.tensor([float("nan"), float("nan"), float("inf")]), expected, loose).ok


def test_speedup_is_taken_against_eager_alone_when_eager_reads_slower_beside_the_candidate():
    from engine.bench.stats import summarize
    from engine.bench.timing import ABResult
    from engine.verify.timed import against_control

    def ab(eager_us, cand_us):
        e, c = summarize(eager_us), summarize(cand_us)
        s = e.median / c.median
        return ABResult(e, c, s, 0.95 * s, 1.05 * s, len(eager_us), 0, 1.0, eager_us, cand_us)

    alone = summarize([6.3] * 20)
    assert against_control(ab([6.5] * 20, [5.0] * 20), alone) is None  # within 10 % + 0.5 µs
    fix = against_control(ab([35.6] * 20, [8.2] * 20), alone)
    assert fix is not None and fix["eager_corrected"]
    assert fix["speedup"] == pytest.approx(6.3 / 8.2)
    assert fix["speedup_ci"][0] < fix["speedup"] < fix["speedup_ci"][1]
    assert fix["eager"]["median"] == 6.3 and fix["eager_beside"]["median"] == 35.6
    assert "alone" in fix["eager_note"]


def test_canaries_differ_per_buffer_and_side_and_still_catch_a_write():
    # One pattern for every buffer made the 64 bytes before any buffer equal the 64 after it: a kernel could
    # tell the lane's guarded buffers from a model's and compute honestly only there (a red-team stand-in).
    from engine.verify.guard import Canaries

    c = Canaries("cpu", guard=512)
    c.buffer(100, "a")
    c.buffer(100, "b")
    ra, rb = c.regions
    assert not torch.equal(ra.before, ra.after) and not torch.equal(ra.before, rb.before)
    assert not torch.equal(ra.raw[:512], ra.raw[612:])
    assert c.violations() == []
    ra.raw[612] ^= 1   # one byte past the end of "a"
    (line,) = c.violations()
    assert line.startswith("a: 1 of the 512 bytes after the end were overwritten")
    assert bool(c.damaged())


def test_most_canary_sides_hold_values_not_noise_and_still_catch_a_write():
    # Uniform random bytes beside every buffer told the lane from a model (whose neighbouring memory holds another
    # tensor's values): a kernel could read past its input and compute honestly only beside noise.
    from engine.verify.guard import Canaries

    c = Canaries("cpu", guard=512)
    for i in range(40):
        c.buffer(64, f"b{i}")
    sides = [side for r in c.regions for side in (r.before, r.after)]

    def values_as(side, dtype):
        v = side.view(dtype).float()
        return bool(torch.isfinite(v).all()) and float(v.abs().max()) < 1e4 and float(v.abs().max()) > 0

    kinds = [next((d for d in (torch.float32, torch.bfloat16, torch.float16) if values_as(s, d)), None)
             for s in sides]
    assert sum(k is not None for k in kinds) >= len(sides) // 2, kinds   # 3 of 4 sides in expectation
    assert None in kinds   # and some are noise: neither kind tells the lane
    assert c.violations() == []
    r = c.regions[7]
    r.raw[512 + 64] = r.raw[512 + 64] ^ 1   # one bit of the first byte past the end
    (line,) = c.violations()
    assert line.startswith("b7: 1 of the 512 bytes after the end were overwritten")


def test_an_argument_the_op_updates_without_returning_it_must_end_as_eager_leaves_it():
    # _native_batch_norm_legit in training updates running_mean/var (Tensor(a!)) and returns neither: only
    # returned aliases and out= arguments counted as written, so the honest kernel was rejected as `mutation`
    # and one that skipped the update passed verification.
    from engine.ops import call_op, resolve_op
    from engine.verify.pipeline import card_check

    op = resolve_op("aten::_native_batch_norm_legit")
    torch.manual_seed(0)

    def sample():
        return [("input", torch.randn(4, 3, 5)), ("weight", torch.rand(3) + 0.5), ("bias", torch.randn(3)),
                ("running_mean", torch.zeros(3)), ("running_var", torch.ones(3)), ("training", True),
                ("momentum", 0.1), ("eps", 1e-5)]

    sig = {"args": [{"name": n, "kind": "tensor", "dtype": "float32", "shape": list(v.shape),
                     "stride": list(v.stride()), "device": "cpu"} if isinstance(v, torch.Tensor)
                    else {"name": n, "kind": "value", "value": v} for n, v in sample()], "aliases": []}
    check = card_check("aten::_native_batch_norm_legit", sig, [sample(), sample()], race_reps=0)
    assert {"running_mean", "running_var"} <= check.written
    assert check.check(lambda b, prefill: list(call_op(op, b))).ok

    def lazy(b, prefill):   # the right outputs, the running statistics left as they were
        copies = [(n, v.clone() if n.startswith("running") else v) for n, v in b]
        return list(call_op(op, copies))

    v = card_check("aten::_native_batch_norm_legit", sig, [sample(), sample()], race_reps=0).check(lazy)
    assert not v.ok and v.category == "mismatch" and "mutated argument running_" in v.message


def test_fp16_accumulation_on_a_quarter_of_the_rows_is_a_precision_mismatch():
    """The precision ratio over the whole output diluted it (2.5x eager's error where each such row reads 4.7x, under
    the 3x bar): it is also taken per block of rows (`PRECISION_BLOCK`)."""
    check = softmax_check()

    def part(b, p):
        x = dict(b)["self"]
        y = torch.softmax(x.float(), -1).half()
        y[-16:] = _softmax_half_arith(x[-16:])
        return [y]

    v = check.check(part)
    assert not v.ok and v.category == "mismatch" and "float64 reference" in v.message, v.message
    assert v.details["precision"]["ratio"] > 3


def test_an_honest_fp16_softmax_keeps_its_worst_block_under_the_bar():
    from engine.verify.pipeline import PRECISION_FACTOR, _worst_block_ratio

    torch.manual_seed(1)
    x = torch.randn(256, 2048).half()
    ref = torch.softmax(x.double(), -1)
    eager = torch.softmax(x, -1) if x.device.type == "cuda" else torch.softmax(x.float(), -1).half()
    e = torch.exp(x.float() - x.float().amax(-1, keepdim=True))
    honest = (e / e.flip(-1).cumsum(-1)[:, -1:]).half()
    u = 2.0 ** -11
    per = ref.abs().clamp_min(1e-3 * float(ref.square().mean().sqrt())) * u
    r = ref.flatten()
    ratio = _worst_block_ratio(r, (eager.double() - ref).flatten(), (honest.double() - ref).flatten(), per.flatten(), u)
    assert 0 < ratio < PRECISION_FACTOR / 1.5, ratio


# ---- the stored input sets --------------------------------------------------------------------------


def test_a_candidate_that_rewrites_the_cards_stored_sets_is_an_overrun_and_the_sets_are_made_again():
    # A kernel that maps NaN/inf to numbers is rejected on 'edge nonfinite'. The same kernel that also found the card's
    # stored sets (by scanning its allocation's segment for a copy of its own input) and made them finite was verified:
    # its own later sets and eager's copy saw the rewritten values, and so did every later candidate of the card
    # (red team, 2026-12-06g). Here by reference, as the device-side write would reach them.
    add = resolve_op("aten::add.Tensor")
    gen = torch.Generator().manual_seed(0)
    samples = [[("self", torch.randn(4096, generator=gen)), ("other", torch.randn(4096, generator=gen)),
                ("alpha", 1)] for _ in range(2)]

    def wrong(b):
        d = dict(b)
        return [torch.nan_to_num(d["self"] + d["other"], nan=0.0, posinf=0.0, neginf=0.0)]

    check = CardCheck("aten::add.Tensor", samples, lambda b: call_op(add, b))
    assert not check.check(lambda b, p: wrong(b)).ok and not check.held_damaged

    def cheat(b, prefill):
        for _, s in check.sets:
            for _, t in tensors_of(s):
                t.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        return wrong(b)

    check = CardCheck("aten::add.Tensor", samples, lambda b: call_op(add, b))
    v = check.check(cheat)
    assert not v.ok and v.category == "overrun", v
    assert "wrote into the card's stored input set" in v.message and check.held_damaged
    # an honest candidate changes nothing in them, check after check
    check = CardCheck("aten::add.Tensor", samples, lambda b: call_op(add, b))
    honest = lambda b, p: [dict(b)["self"] + dict(b)["other"]]  # noqa: E731
    assert check.check(honest).ok and check.check(honest).ok and not check.held_damaged
    check.require_held_intact()


def test_the_stored_sets_digest_sees_one_bit_anywhere_and_is_keyed():
    from engine.verify.pipeline import held_digest

    x = torch.randn(3 * (1 << 20) + 5)   # more than one chunk of words, and a tail of bytes past the last word
    bound = [("self", x), ("mask", torch.ones(7, dtype=torch.bool)), ("z", torch.randn(3, dtype=torch.complex64)),
             ("view", torch.randn(101, dtype=torch.float16)[1:]), ("strided", torch.randn(10, 10)[:, 1])]
    d = held_digest(bound, key=12345)
    assert d == held_digest(bound, key=12345) and d != held_digest(bound, key=54321)
    for t, i in ((x, len(x) - 1), (x, 1 << 20), (bound[1][1], 3)):
        old = t[i].clone()
        t.view(torch.uint8)[t.element_size() * i] ^= 1   # one bit of one element
        assert held_digest(bound, key=12345) != d
        t[i] = old
    assert held_digest(bound, key=12345) == d
    # two chunks swapped whole still change it (each chunk's sum is weighted by its place)
    a, b = x[: 1 << 19].clone(), x[1 << 19: 1 << 20].clone()
    x[: 1 << 19], x[1 << 19: 1 << 20] = b, a
    assert held_digest(bound, key=12345) != d


# ---- attention logits -------------------------------------------------------------------------------


def test_an_attention_kernel_that_skips_the_max_subtraction_fails_on_hot_logits():
    # Samples of random-init or small models give logits of about 1: exp(s) rounded to float16 without the max
    # subtracted first (it overflows past 11.09) matched eager on every set. Real attention meets logits of 20-50
    # (red team, 2026-12-06g): the 'hot logits' edge set scales the query to a largest logit of about 40.
    from engine.verify.inputs import HOT_LOGIT, hot_logits_inputs

    sdpa = resolve_op("aten::scaled_dot_product_attention")
    gen = torch.Generator().manual_seed(0)
    samples = [[("query", (torch.randn(1, 2, 64, 32, generator=gen) * 0.3).half()),
                ("key", (torch.randn(1, 2, 64, 32, generator=gen) * 0.3).half()),
                ("value", torch.randn(1, 2, 64, 32, generator=gen).half())] for _ in range(2)]
    hot = dict(hot_logits_inputs(samples[0]))
    logits = (hot["query"].float() @ hot["key"].float().transpose(-1, -2)) / math.sqrt(32)
    assert float(logits.abs().amax()) == pytest.approx(HOT_LOGIT, rel=1e-2)   # the query rounded to float16
    assert torch.equal(hot["key"], dict(samples[0])["key"])   # the query alone is scaled

    def no_max(b, prefill):   # softmax without the max subtracted, its exponentials stored in float16
        q, k, v = (dict(b)[n].float() for n in ("query", "key", "value"))
        p = torch.exp(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).half().float()
        return [((p @ v) / p.sum(-1, keepdim=True)).half()]

    check = CardCheck("aten::scaled_dot_product_attention", samples, lambda b: call_op(sdpa, b))
    assert "edge hot logits" in [label for label, _ in check.sets]
    v = check.check(no_max)
    assert not v.ok and v.input_set == "edge hot logits", v

    def stable(b, prefill):
        q, k, v = (dict(b)[n].float() for n in ("query", "key", "value"))
        return [(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v).half()]

    assert CardCheck("aten::scaled_dot_product_attention", samples, lambda b: call_op(sdpa, b)).check(stable).ok
    # no query or key to scale: no such set
    assert hot_logits_inputs([("self", torch.randn(4, 4))]) is None
