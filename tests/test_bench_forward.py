"""Whole-forward timing: each timed forward is its arm's steady state, right after an untimed call of itself.

On the H200 (ResNet-50 under torch.compile, 2026-12-04) a forward timed right after the cast was installed and
removed, after 2 ms of other Python, or after a 2 ms sleep read 2.5-4 % slower than one right after another
forward; the cast's arm, installed around each timed call, paid that every time and read 0.95x against the
very same compiled function."""

import contextlib

from conftest import load_script

import engine.bench.forward as fwd


def test_the_timed_call_comes_right_after_an_untimed_call_of_the_same_function(monkeypatch):
    events = []
    monkeypatch.setattr(fwd, "time_forward", lambda run: (events.append("timed"), run(), 42.0)[2])
    us = fwd.time_steady(lambda: events.append("call"))
    assert us == 42.0
    assert events == ["call", "timed", "call"]


def _fake_install():
    """(log, installed flag, a context manager standing for cast.enabled that logs install and remove)."""
    log, installed = [], [False]

    @contextlib.contextmanager
    def enabled():
        installed[0] = True
        log.append("install")
        yield
        installed[0] = False
        log.append("remove")

    return log, installed, enabled


def test_bench_compose_times_each_arm_right_after_an_untimed_call_in_the_arms_state(monkeypatch):
    """Both arms: the cast's arm installs the cast, calls once untimed, then the timed call, all installed."""
    bc = load_script("bench_compose")
    log, installed, enabled = _fake_install()
    monkeypatch.setattr(bc, "DEVICE", "cpu")
    monkeypatch.setattr(bc, "BLOCK", 1)  # one timed call per turn (--block 1)
    base = lambda: log.append(("base", installed[0]))  # noqa: E731
    fast = lambda: log.append(("fast", installed[0]))  # noqa: E731
    bc.pair(base, fast, 2, around_b=enabled)
    calls = [e for e in log if isinstance(e, tuple)]
    assert len(calls) == 8  # 2 rounds x 2 arms x (untimed + timed)
    # every call comes in twos of the same arm in the same state; the cast's always inside one install
    assert all(calls[i] == calls[i + 1] for i in range(0, 8, 2))
    assert set(calls) == {("base", False), ("fast", True)}
    assert log.count("install") == 2 and log.count("remove") == 2


def test_off_the_gpu_the_steady_call_is_timed_with_the_wall_clock_after_an_untimed_one(monkeypatch):
    calls = []
    monkeypatch.setattr(fwd, "time_forward", lambda run: (_ for _ in ()).throw(AssertionError("CUDA events")))
    us = fwd.time_steady(lambda: calls.append(1), device="cpu")
    assert calls == [1, 1] and us >= 0.0


def test_warm_untimed_calls_come_before_the_timed_one(monkeypatch):
    """bench_compose --warm-calls N: N untimed calls in the arm's state, then the timed one."""
    calls = []
    us = fwd.time_steady(lambda: calls.append(1), device="cpu", warm=3)
    assert calls == [1, 1, 1, 1] and us >= 0.0


def test_warm_zero_times_the_very_next_call(monkeypatch):
    calls = []
    fwd.time_steady(lambda: calls.append(1), device="cpu", warm=0)
    assert calls == [1]


def test_bench_compose_block_times_several_calls_per_turn_inside_one_install(monkeypatch):
    """--block 3: per turn of an arm, one install, the warm call, then three timed calls; the turn's sample is
    their median, so the install's wake is paid once per turn and outside the timed calls' median."""
    bc = load_script("bench_compose")
    log, installed, enabled = _fake_install()
    monkeypatch.setattr(bc, "DEVICE", "cpu")
    monkeypatch.setattr(bc, "BLOCK", 3)
    us = iter([5.0, 1.0, 2.0] * 4)  # each turn's three timed calls read 5, 1 and 2 µs

    def fake_steady(run, device="cuda", warm=1):
        for _ in range(warm + 1):
            run()
        return next(us)

    monkeypatch.setattr(fwd, "time_steady", fake_steady)
    r = bc.pair(lambda: log.append(("base", installed[0])), lambda: log.append(("fast", installed[0])), 2,
                around_b=enabled)
    calls = [e for e in log if isinstance(e, tuple)]
    assert len(calls) == 16  # 2 rounds x 2 arms x (1 warm + 3 timed)
    assert all(len(set(calls[i:i + 4])) == 1 for i in range(0, 16, 4))
    assert set(calls) == {("base", False), ("fast", True)}
    assert log.count("install") == 2
    assert r["base_ms"] == 2.0 / 1e3 and r["with_cast_ms"] == 2.0 / 1e3  # the median of 5, 1, 2 µs


def test_bench_compose_sizes_its_rounds_and_puts_the_example_inputs_back(monkeypatch):
    """The turns that size the rounds run on varied inputs; what is compared right after them (the eager row's
    output against eager's) must be the example's: before the fix it was the last variant's (rel. L2 1.17)."""
    import torch

    from engine.bench.varied import Varied

    bc = load_script("bench_compose")
    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    forward = lambda: model(x)  # noqa: E731
    with torch.no_grad():
        want = forward().clone()
        varied = Varied.record(model, forward, seed=1)
    assert varied.why is None
    monkeypatch.setattr(bc, "VARIED", varied)
    monkeypatch.setattr(bc, "DEVICE", "cpu")
    monkeypatch.setattr(bc, "BLOCK", 1)
    seen = []
    with torch.no_grad():
        assert bc.steady_us(lambda: seen.append(x.clone())) >= 0.0
        assert len(seen) == 6 and not torch.equal(seen[-1], seen[0])  # three turns, each on a variant of its own
        assert torch.equal(forward(), want)


def _scripted(monkeypatch, paces):
    """settle's forwards take `paces` (µs) one after another, on a clock that advances by them."""
    now = [0.0]

    def scripted(run, device="cuda", warm=1, before=None):
        assert warm == 0  # back to back: each call is the previous one's warm-up
        run()
        us = next(paces)
        now[0] += us / 1e6
        return us

    monkeypatch.setattr(fwd, "time_steady", scripted)
    monkeypatch.setattr(fwd, "_clock", lambda: now[0])


def test_settle_runs_the_forward_until_its_pace_stops_moving(monkeypatch):
    """ViT-B/16's eager forward on an H100 VM: 4.5-5.5 ms in a new process on a new machine, 3.0-3.2 ms once
    settled (2026-12-07). settle calls it until two windows agree, and says how the time moved."""
    paces = iter([5.4e3, 5.3e3, 5.0e3, 4.6e3, 4.0e3, 3.6e3, 3.5e3] + [3.52e3] * 100)
    calls = []
    _scripted(monkeypatch, paces)
    s = fwd.settle(lambda: calls.append(1), min_s=0.0, window=3)
    # the windows (4.0, 3.6, 3.5) and (3.52, 3.52, 3.52): medians 3.6 and 3.52, within 3 %, after 12 calls
    # (compared every 3 calls; thirds of 4 calls at 12: (3.6, 3.5, 3.52, 3.52) and four 3.52s)
    assert s["settled"] and s["calls"] == len(calls) == 12
    assert s["first_ms"] == 5.3 and s["last_ms"] == 3.52
    assert fwd.describe_settle(s).startswith("12 forwards over ") and s["seconds"] >= 0
    assert "5.30 → 3.52 ms a forward" in fwd.describe_settle(s)
    assert s["trace_ms"][0] == 5.4 and s["trace_ms"][-1] == 3.52 and len(s["trace_ms"]) == 10


def test_a_slow_drift_is_not_taken_for_a_settled_pace(monkeypatch):
    """H100, 2026-12-07d: ViT-B/16's eager fell from 8.0 to 4.6 ms a forward over 2 s, and two windows of 5
    forwards agreed within 3 % all along (the pace moved ~1 % between them), so settle stopped there and
    bench_e2e timed eager 1.4x slower than its settled 3.5 ms. Here the pace falls 0.2 % a forward for 400
    forwards (8.0 -> 3.6 ms, ~2.3 s) and then holds at 3.5 ms: settle must not stop before the pace does."""
    paces = iter([8.0e3 * 0.998 ** i for i in range(400)] + [3.5e3] * 10 ** 5)
    _scripted(monkeypatch, paces)
    s = fwd.settle(lambda: None, min_s=2.0, window=5)
    assert s["settled"] and s["calls"] > 400 and s["last_ms"] == 3.5
    assert s["first_ms"] > 7.9 and s["trace_ms"][0] > 7.0 and s["trace_ms"][-1] == 3.5


def test_a_pace_still_moving_when_the_time_is_up_says_so(monkeypatch):
    # 1 ms, then 2 % slower each forward: the thirds never agree
    _scripted(monkeypatch, (1000.0 * 1.02 ** i for i in range(10 ** 9)))
    s = fwd.settle(lambda: None, min_s=0.0, max_s=0.05, window=3)
    assert not s["settled"] and s["seconds"] >= 0.05 and s["first_ms"] == 1000.0 * 1.02 ** 1 / 1e3
    assert fwd.describe_settle(s).endswith("(still moving when the time was up)")
    assert fwd.describe_settle(None) == "not settled first"
