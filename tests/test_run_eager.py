"""The run stores the eager latency a lane measured on each card (the lane itself never touches the store)."""

import sys

import pytest
from conftest import ROOT

from engine.cards import card_from_row
from engine.lane.client import GpuLane
from engine.run.eager import measure_and_store_eager
from engine.store import Store

STANDIN = [sys.executable, str(ROOT / "tests" / "lane_standin.py")]


def _card(card_id: str, text: str) -> dict:
    return {"card_id": card_id, "op": "aten::relu", "signature": {"op": "aten::relu", "args": [], "aliases": []},
            "signature_text": text, "calls": 1, "share": 0.5, "bytes": 32}


@pytest.fixture
async def lane():
    lane = GpuLane(STANDIN, timeout_s=5, start_timeout_s=30)
    await lane.start()
    yield lane
    await lane.close()


async def test_eager_latency_lands_on_the_card(lane, tmp_path):
    async with await Store.open(tmp_path / "kforge.db") as store:
        await store.save_capture(
            {"id": "cap-1", "model": "m", "device": "cuda", "dtype": "float16"},
            [_card("c1", "f16[8]"), _card("c2", "f16[9]"), _card("unmeasurable", "f16[10]")],
            [{"card_id": cid, "idx": 0, "path": f"samples/{cid}.0.safetensors", "sha256": "x", "nbytes": 1}
             for cid in ("c1", "unmeasurable")])
        rows = await store.get_cards("cap-1")
        refs = [card_from_row(r).ref([] if r["card_id"] == "c2" else [str(tmp_path / f"{r['card_id']}.st")])
                for r in rows]
        results = await measure_and_store_eager(lane, store, "cap-1", refs)
        cards = {c["card_id"]: c for c in await store.get_cards("cap-1")}
    assert cards["c1"]["eager_us"] == 12.5 and cards["c1"]["roofline_us"] == 3.0
    seconds = cards["c1"]["eager_stats"].pop("seconds")  # loading the card and timing it, here
    assert set(seconds) == {"load", "measure"}
    assert cards["c1"]["eager_stats"] == {"median": 12.5, "iqr": 0.25, "n": 40, "throttled": 0}
    assert cards["c2"]["eager_us"] is None and results["c2"] == {"error": "no samples"}
    assert cards["unmeasurable"]["eager_us"] is None and results["unmeasurable"]["error"].startswith("internal")
