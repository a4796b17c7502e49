"""A card's references measured in a real lane, as a GPU run measures them after eager: the lane's copy of
the card's floor bytes (copy_us) and its eager under torch.compile (compile_us), for an op card and a chain
card, through the run's own functions (engine.run.eager) and a real lane.

    python -m pytest -q tests/test_card_refs_gpu.py
"""

from __future__ import annotations

import asyncio

import pytest
import torch

pytestmark = pytest.mark.gpu

N = 4096  # a 4096x4096 float32 transpose: 64 MiB read, 64 MiB written, far past the L2


def _measure(tmp_path, refs):
    from engine.cards import OperatorCard, card_from_row
    from engine.lane.client import GpuLane, worker_argv
    from engine.run.eager import measure_and_store_eager, measure_and_store_references
    from engine.store import Store

    async def run():
        lane = GpuLane(worker_argv(torch.cuda.current_device()), timeout_s=120)
        await lane.start()
        try:
            async with await Store.open(tmp_path / "kforge.db") as store:
                rows = [OperatorCard(r.card_id, r.op, r.signature, outputs=r.outputs, bytes=r.bytes).row()
                        for r in refs]
                await store.save_capture({"id": "cap", "model": "m", "device": "cuda", "dtype": "float32"},
                                         rows, [])
                await measure_and_store_eager(lane, store, "cap", refs)
                got = await measure_and_store_references(lane, store, "cap", refs, timeout_s=120)
                return {c["card_id"]: card_from_row(c) for c in await store.get_cards("cap")}, got
        finally:
            await lane.close()

    return asyncio.run(run())


def test_copy_and_torch_compile_references_in_a_real_lane(tmp_path):
    from gpu_harness import make_card
    from test_chain_lane_gpu import _chain_card

    x = torch.randn(N, N, device="cuda")
    xt = x.t()  # a transposed view: eager's clone reads it with a stride of N, a copy reads it in order
    clone = make_card(tmp_path / "clone", lambda: xt.clone(memory_format=torch.contiguous_format))
    chain = _chain_card(tmp_path / "chain")
    cards, got = _measure(tmp_path, [clone, chain])
    print(f"\nreferences: {got}")

    c = cards[clone.card_id]
    assert clone.op == "aten::clone" and c.bytes >= 2 * N * N * 4
    assert c.eager_us and c.eager_us > 0 and c.copy_us and c.copy_us > 0, got[clone.card_id]
    assert c.compile_us and c.compile_us > 0, c.compile_note
    # A copy of the same bytes in order is what the hardware allows: a strided clone cannot beat it.
    assert c.copy_us < c.eager_us, (c.copy_us, c.eager_us)
    # And it is a measured copy, near the bandwidth the lane measured at start (the roofline).
    assert 0.5 * c.roofline_us < c.copy_us < 3.0 * c.roofline_us, (c.copy_us, c.roofline_us)

    k = cards[chain.card_id]  # the RMSNorm chain, compiled as one function through run_chain
    assert k.eager_us and k.copy_us and k.copy_us > 0, got[chain.card_id]
    assert k.compile_us and k.compile_us > 0, k.compile_note
    assert got[chain.card_id]["compile"]["mode"] == "max-autotune-no-cudagraphs"
