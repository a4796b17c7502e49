"""GpuLane protocol, watchdog and replacement, driven against StandInWorker (tests/lane_standin.py)."""

import asyncio
import sys

import pytest
from conftest import ROOT

from engine.lane.client import GpuLane, LaneUnavailable

STANDIN = [sys.executable, str(ROOT / "tests" / "lane_standin.py")]


@pytest.fixture
async def lane():
    lane = GpuLane(STANDIN, timeout_s=5, start_timeout_s=30)
    await lane.start()
    yield lane
    await lane.close()


async def test_answers_and_ignores_stray_stdout(lane):
    r = await lane.request("echo", {"value": [1, 2.5, "x"]})
    assert r.ok and r.payload["echo"] == [1, 2.5, "x"] and not r.restarted


async def test_crash_is_reported_and_worker_replaced(lane):
    pid = lane.pid
    r = await lane.request("crash")
    assert not r.ok and r.category == "runtime-fault" and r.restarted
    assert "SIGSEGV" in r.message
    after = await lane.request("echo", {"value": 1})
    assert after.ok and after.payload["pid"] != pid and lane.restarts == 1


async def test_hang_hits_the_watchdog(lane):
    r = await lane.request("hang", timeout_s=1.0)
    assert not r.ok and r.category == "timeout" and r.restarted
    assert "no answer within 1.0 s" in r.message and r.seconds > 0.9  # the request's timeout, not the lane's 5 s
    assert (await lane.request("echo", {"value": 2})).ok


async def test_poisoning_fault_replies_then_replaces(lane):
    pid = lane.pid
    r = await lane.request("fault")
    assert r.category == "runtime-fault" and "illegal memory access" in r.message and r.restarted
    assert (await lane.request("echo")).payload["pid"] != pid


async def test_rejection_keeps_the_worker(lane):
    pid = lane.pid
    r = await lane.request("reject")
    assert not r.ok and r.category == "mismatch" and not r.restarted
    assert (await lane.request("echo")).payload["pid"] == pid


async def test_worker_bug_is_internal_not_a_candidate_failure(lane):
    r = await lane.request("bug")
    assert r.category == "internal" and "KeyError" in r.message


async def test_sticky_requests_are_replayed_to_a_new_worker(lane):
    await lane.request("load_card", {"card": "a"}, sticky_key="card:a")
    await lane.request("load_card", {"card": "b"}, sticky_key="card:b")
    await lane.request("crash")
    r = await lane.request("echo")
    assert r.payload["loaded"] == ["a", "b"]  # loaded once per worker, again after replacement


async def test_requests_are_serialised(lane):
    replies = await asyncio.gather(*(lane.request("echo", {"value": i, "sleep": 0.2}) for i in range(3)))
    times = sorted(r.payload["t"] for r in replies)
    assert all(b - a >= 0.19 for a, b in zip(times, times[1:]))


async def test_unstartable_worker_is_a_lane_error():
    lane = GpuLane([sys.executable, "-c", "import sys; sys.exit(7)"], start_timeout_s=10)
    with pytest.raises(LaneUnavailable, match="exited at start"):
        await lane.start()


async def test_eager_is_measured_per_card_and_returned(lane):
    from engine.cards import OperatorCard
    from engine.lane.eager import measure_eager

    cards = [OperatorCard(cid, "aten::relu", {}, bytes=32).ref(samples)
             for cid, samples in (("c1", ["c1.0.safetensors"]), ("c2", []), ("unmeasurable", ["u.0.safetensors"]))]
    results = await measure_eager(lane, cards)
    seconds = results["c1"].pop("seconds")  # what loading and timing the card took, here
    assert set(seconds) == {"load", "measure"} and min(seconds.values()) >= 0
    assert results["c1"] == {"eager": {"median": 12.5, "iqr": 0.25, "n": 40}, "throttled": 0, "roofline_us": 3.0}
    assert results["c2"] == {"error": "no samples"}
    assert results["unmeasurable"] == {"error": "internal: RuntimeError: the op raised"}
    assert (await lane.request("echo")).payload["loaded"] == ["c1", "unmeasurable"]  # loaded before timing
