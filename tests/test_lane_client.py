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
    assert 0.9 < r.seconds < 4
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


async def test_eager_latency_lands_on_the_card(lane, tmp_path):
    from engine.lane.eager import card_refs, measure_eager
    from engine.store import Store

    db = tmp_path / "kforge.db"
    async with await Store.open(db) as store:
        await store.save_capture(
            {"id": "cap-1", "model": "m", "device": "cuda", "dtype": "float16"},
            [{"card_id": "c1", "op": "aten::relu", "signature": {"op": "aten::relu", "args": [], "aliases": []},
              "signature_text": "f16[8]", "calls": 1, "share": 1.0, "bytes": 32},
             {"card_id": "c2", "op": "aten::relu", "signature": {"op": "aten::relu", "args": [], "aliases": []},
              "signature_text": "f16[9]", "calls": 1, "share": 0.0, "bytes": 36}],
            [{"card_id": "c1", "idx": 0, "path": "samples/c1.0.safetensors", "sha256": "x", "nbytes": 1}])
        refs = await card_refs(store, tmp_path, "cap-1")
        results = await measure_eager(lane, store, "cap-1", refs)
        cards = {c["card_id"]: c for c in await store.get_cards("cap-1")}
    assert cards["c1"]["eager_us"] == 12.5 and cards["c1"]["roofline_us"] == 3.0
    assert cards["c1"]["eager_stats"]["iqr"] == 0.25
    assert cards["c2"]["eager_us"] is None and results["c2"] == {"error": "no samples"}
