"""A real lane whose loaded cards exceed its budget (`KFORGE_LANE_CARD_BYTES`, engine.lane.card_cache): cards are
put down and loaded again from their requests, and candidates on them verify as before. On an H100 the SD3.5 VAE's
27 cards' input sets filled the GPU and its largest GroupNorm card failed 9 of 9 candidates as "launch"
(2026-12-06). Lane time: seconds."""

from __future__ import annotations

import asyncio

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_cards_past_the_budget_are_put_down_and_come_back_verified(tmp_path, monkeypatch):
    from gpu_harness import brief_of, make_card

    from engine.compile import Compiler
    from engine.lane.client import GpuLane, worker_argv
    from engine.lane.evaluate import evaluate
    from engine.propose.base import Hardware
    from engine.propose.builtin.proposer import BuiltinProposer

    x = torch.randn(1 << 20, device="cuda", dtype=torch.float16)
    y = torch.randn(3, 1 << 18, device="cuda", dtype=torch.float32)
    cards = [make_card(tmp_path / "a", lambda: torch.relu(x)), make_card(tmp_path / "b", lambda: torch.relu(y))]
    major, minor = torch.cuda.get_device_capability()
    hw = Hardware(arch=f"sm_{major}{minor}", sms=torch.cuda.get_device_properties(0).multi_processor_count)
    jobs = []
    for ref in cards:
        card = brief_of(ref)
        template, reasons = BuiltinProposer().template_for(card, hw=hw)
        assert template is not None, reasons
        jobs.append((ref, template.render(card, template.default(card, hw=hw), hw=hw)))
    compiler = Compiler(tmp_path / "compile", "nvrtc", arch=f"sm_{major}{minor}")
    monkeypatch.setenv("KFORGE_LANE_CARD_BYTES", "1")  # every card is past it: one card held at a time

    async def run():
        lane = GpuLane(worker_argv(torch.cuda.current_device()), timeout_s=120)
        await lane.start()
        try:
            evs = [await evaluate(lane, ref, compiler.compile(r.source), r.spec, timing={"max_seconds": 0.3})
                   for ref, r in jobs + jobs + jobs]  # a, b, a, b, a, b
            ref = cards[0]
            again = await lane.request("load_card", {"card_id": ref.card_id, "op": ref.op, "signature": ref.signature,
                                                     "outputs": ref.outputs, "bytes": ref.bytes,
                                                     "samples": ref.samples})
            return evs, again
        finally:
            await lane.close()

    evs, again = asyncio.run(run())
    assert [e.status for e in evs] == ["verified"] * 6, [(e.category, e.message) for e in evs]
    assert again.ok, again.message
    st = again.payload
    print(f"\nlane cards after six evaluations on two cards with a 1-byte budget: {st}")
    # Each evaluation loads its card (a, b, then a again: 4 reloads) and puts the other down; b was the last, so
    # this request loads a again and puts b down.
    assert st["cached"] is False and st["loaded"] == 1 and st["budget_bytes"] == 1
    assert st["reloads"] == 5 and st["put_down"] == 6 and st["held_bytes"] >= x.numel() * 2
