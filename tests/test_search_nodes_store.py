"""The search tree goes to the store as the search runs (search_nodes): per card a root and one node per
evaluated candidate, with the visits, own value, best value of the subtree and dead flag that backup left."""

import math

from run_standin import CARDS, Proposer, StandInLane

from engine.cards import OperatorCard
from engine.lane.evaluate import Evaluation
from engine.run.orchestrator import Budgets, Orchestrator
from engine.run.plan import CardState
from engine.run.store_recorder import StoreRecorder
from engine.store import Store, db_path, new_id


class FailsEveryThird(StandInLane):
    """The stand-in lane, but every third evaluation is a wrong answer (a dead node)."""

    async def __call__(self, card, proposal):
        ev = await super().__call__(card, proposal)
        return Evaluation("rejected", "mismatch", "out0 differs", 0.0) if self.count % 3 == 0 else ev


async def test_search_nodes_mirror_the_tree_as_backup_left_it(tmp_path):
    async with await Store.open(db_path(tmp_path)) as store:
        await store.save_capture({"id": "cap-1", "model": "m", "device": "cuda", "dtype": "float16"}, [
            {"card_id": c, "op": "aten::gelu", "signature": {"op": "aten::gelu", "args": [], "aliases": []},
             "signature_text": "", "calls": 1, "share": 0.5, "bytes": 100} for c in CARDS], [])
        run = await store.create_run("cap-1", "m", "scripted", {"iterations": 7})
        cards = [CardState(OperatorCard(c, "aten::gelu", {}, bytes=100, eager_us=40.0, roofline_us=1.0, share=0.5),
                           ["s"]) for c in CARDS]
        o = Orchestrator(cards=cards, proposer=Proposer(), evaluate=FailsEveryThird(tmp_path / "ev.log", None),
                         recorder=StoreRecorder(store, run["id"]), new_id=lambda: new_id("cand"),
                         budgets=Budgets(iterations_per_card=7), max_proposals=2, poll_s=0.01)
        assert await o.run() == "iterations"
        for card_id in CARDS:
            rows = {r["node_id"]: r for r in await store.search_nodes(run["id"], card_id)}
            tree = o.trees[card_id]
            root = rows.pop(f"root:{card_id}")
            assert root["parent_node_id"] is None and root["candidate_id"] is None
            assert root["visits"] == 7  # every evaluation is a visit of the root
            cands = {c["id"]: c for c in await store.candidates(run["id"]) if c["card_id"] == card_id}
            assert set(rows) == set(cands)  # one node per evaluated candidate, named by it
            for node_id, r in rows.items():
                n = tree.nodes[node_id]
                assert r["candidate_id"] == node_id
                assert r["parent_node_id"] == (cands[node_id]["parent_id"] or f"root:{card_id}")
                assert (r["visits"], r["dead"], r["best_value"]) == (n.visits, n.dead, n.best_raw)
                if cands[node_id]["status"] == "verified":
                    assert math.isclose(r["value"], math.log(cands[node_id]["speedup"]))
                else:
                    assert r["dead"] and r["value"] == 0.0
            assert any(r["dead"] for r in rows.values()) and any(not r["dead"] for r in rows.values())
            assert math.isclose(root["best_value"], max(math.log(c["speedup"]) for c in cands.values()
                                                        if c["status"] == "verified"))
