"""Timed calls that look like checked ones (engine.verify.timed) on a real GPU, with torch stand-ins for
kernels: honest candidates pass and are timed, ones that change behaviour when timed are caught."""

import pytest
import torch

from engine.ops import call_op, resolve_op

pytestmark = pytest.mark.gpu

ADD = resolve_op("aten::add.Tensor")


def _setup():
    from engine.bench.timing import L2Flusher, TimingConfig
    from engine.verify.pipeline import CardCheck

    torch.manual_seed(0)
    dev = torch.device("cuda")
    samples = [[("self", torch.randn(1 << 20, device=dev)), ("other", torch.randn(1 << 20, device=dev)),
                ("alpha", 1)] for _ in range(2)]
    check = CardCheck("aten::add.Tensor", samples, lambda b: call_op(ADD, b), sync=torch.cuda.synchronize)
    return check, L2Flusher(dev), TimingConfig(max_seconds=0.5, warmup_s=0.05)


def _add(b):
    d = dict(b)
    return torch.add(d["self"], d["other"])


def test_honest_candidate_is_timed_and_audited():
    from engine.verify.timed import TimedCandidate, audited_ab, time_eager_alone

    check, flush, cfg = _setup()
    seen = set()

    def prepare(b, prefill):
        seen.add(prefill if isinstance(prefill, str) else "stale")   # stale: a list of eager's last outputs
        return lambda: _add(b)

    run = audited_ab(check, TimedCandidate(prepare), flush, cfg, seed=1)
    assert run.category is None, run.message
    assert run.audited >= cfg.min_audits and run.ab.reps >= cfg.min_reps
    assert 0.5 < run.ab.speedup < 2.0
    assert seen == {"nan", "sentinel", "stale"}
    alone, _ = time_eager_alone(check, flush, cfg)
    assert alone.median > 0


def test_candidate_that_skips_work_when_timed_is_cheating():
    from engine.verify.timed import TimedCandidate, audited_ab

    check, flush, cfg = _setup()
    last = {}

    def prepare(b, prefill):  # "memoises": returns the previous result for the same buffers
        key = dict(b)["self"].data_ptr()

        def call():
            if key in last:
                return last[key]
            last[key] = out = _add(b)
            return out
        return call

    run = audited_ab(check, TimedCandidate(prepare), flush, cfg, seed=2)
    assert run.category == "cheating" and "behaves differently when timed" in run.message


def test_candidate_that_mutates_its_inputs_when_timed_is_mutation():
    from engine.verify.timed import TimedCandidate, audited_ab

    check, flush, cfg = _setup()

    def prepare(b, prefill):
        def call():
            out = _add(b)
            dict(b)["other"].zero_()
            return out
        return call

    run = audited_ab(check, TimedCandidate(prepare), flush, cfg, seed=3)
    assert run.category == "mutation" and "other" in run.message


def test_values_change_every_call_and_sides_do_not_share_buffers():
    from engine.verify.timed import TimedCandidate, audited_ab

    check, flush, cfg = _setup()
    firsts, cand_ptrs = [], set()

    def prepare(b, prefill):
        x = dict(b)["self"]
        cand_ptrs.add(x.data_ptr())
        firsts.append(float(x[0]))
        return lambda: _add(b)

    eager_ptrs = set()
    orig = check.eager

    def eager(b):
        eager_ptrs.add(dict(b)["self"].data_ptr())
        return orig(b)

    check.eager = eager
    run = audited_ab(check, TimedCandidate(prepare), flush, cfg, seed=4)
    assert run.category is None, run.message
    assert len(cand_ptrs) == cfg.slots and not (cand_ptrs & eager_ptrs)
    assert len(set(firsts)) > 0.9 * len(firsts)  # new values nearly every call


def test_a_candidate_that_copies_eagers_answer_never_finds_one_when_timed():
    # The attacker reads anything eager ever produced (device memory is not cleared when the allocator takes
    # a block back): whenever that holds the answer to its own inputs, it copies it instead of computing.
    from engine.verify.timed import TimedCandidate, audited_ab

    check, flush, cfg = _setup()
    produced, found = [], []
    orig = check.eager

    def eager(b):
        out = orig(b)
        produced.append(out.clone())
        del produced[:-64]   # the last 64 answers: every round's (and every audit's) since long before
        return out

    check.eager = eager

    def prepare(b, prefill):
        def call():
            honest = _add(b)
            copy = next((t for t in produced if torch.equal(t, honest)), None)
            found.append(copy is not None)
            return copy.clone() if copy is not None else honest
        return call

    run = audited_ab(check, TimedCandidate(prepare), flush, cfg, seed=5)
    assert run.category is None, run.message
    assert found and not any(found), f"eager's answer was in memory in {sum(found)} of {len(found)} timed calls"


def test_a_host_stall_inside_the_timed_window_is_not_timed():
    # Every third call of one arm stalls 400 µs on the host between its start event and its launch:
    # with the default 80 µs lead the GPU idles inside those calls' events. Those rounds are dropped
    # (and the lead lengthened), so both arms, doing the same work, read the same.
    import time

    from engine.bench.timing import L2Flusher, TimingConfig, time_calls

    dev = torch.device("cuda")
    x = torch.randn(1 << 20, device=dev)
    n = [0]

    def steady():
        return x * 2

    def stalling():
        n[0] += 1
        if n[0] % 3 == 0:
            t = time.perf_counter()
            while time.perf_counter() - t < 400e-6:
                pass
        return x * 2

    run = time_calls([steady, stalling], L2Flusher(dev), TimingConfig(max_seconds=1.0, warmup_s=0.05))
    assert run.starved > 0 and run.lead_us > 80
    a, b = (sorted(t)[len(t) // 2] for t in run.times)
    assert abs(b - a) / a < 0.15, f"the stalling arm read {b:.2f} µs against {a:.2f} µs"
    assert max(run.times[1]) < 200, "a stalled call's host time was timed"
