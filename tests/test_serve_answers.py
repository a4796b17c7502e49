"""scripts/serve_answers.py: the demo's written answers reach the store through the real proposer client."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import sys
from pathlib import Path

import torch
from card_helpers import brief, captured

from engine.propose.base import ProposalRequest
from engine.propose.hardware_profiles import profile
from engine.propose.llm import LLMProposer
from engine.run.orchestrator import CandidateRecord
from engine.run.store_recorder import StoreRecorder
from engine.store import Store, db_path, read

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "recorded_answers" / "mlp_block.json"


def _serve_answers():
    spec = importlib.util.spec_from_file_location("serve_answers", ROOT / "scripts" / "serve_answers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["serve_answers"] = module
    spec.loader.exec_module(module)
    return module


def _gelu_card():
    c = captured(lambda: torch.nn.functional.gelu(torch.randn(2, 1024, 1024, dtype=torch.float16),
                                                  approximate="tanh"), keep=lambda op: op == "aten::gelu")
    return brief(c.op, c.signature, c.outputs, card_id="gelu-card")


def test_fixture_is_labelled_and_names_its_cards() -> None:
    doc = json.loads(FIXTURE.read_text())
    assert doc["label"] == ("answers written by an AI assistant acting as the model for these prompts "
                            "(not a provider's output)")
    for card in doc["cards"]:
        assert card["op"] and card["signature"] and card["answers"]
        assert all(a["cuda"].strip() and a["toml"].strip() for a in card["answers"])


async def test_proposer_gets_the_cards_answer_and_the_store_keeps_its_kernel(tmp_path: Path, monkeypatch) -> None:
    sa = _serve_answers()
    book = sa.AnswerBook.load(FIXTURE)
    card = _gelu_card()
    written = next(c for c in book.cards if c["op"] == card.op)
    assert written["signature"] == card.signature_text  # the prompt names the card as the fixture does
    monkeypatch.setenv("ANTHROPIC_API_KEY", "dummy")
    runner, port = await sa.start(book)
    try:
        # the SDK, imported here only: at the module's top it cost every xdist worker seconds of collection
        from engine.propose.providers.anthropic_client import AnthropicClient

        client = AnthropicClient("assistant-written-answers", base_url=f"http://127.0.0.1:{port}")
        proposal = await LLMProposer(client, name="anthropic").propose(ProposalRequest(card, profile("h200")))
        again = await LLMProposer(client, name="anthropic").propose(ProposalRequest(card, profile("h200")))
    finally:
        await runner.cleanup()
    assert proposal.ok, proposal.reason
    async with await Store.open(db_path(tmp_path)) as store:
        await store.save_capture({"id": "cap", "model": "mlp_block", "device": "cuda", "dtype": "float16"},
                                 [card.row()],
                                 [])
        run = await store.create_run("cap", "mlp_block", "anthropic", {})
        recorder = StoreRecorder(store, run["id"])
        for cid, p in (("cand-1", proposal), ("cand-2", again)):
            await recorder.candidate_proposed(CandidateRecord(cid, card.card_id, None, p))
    conn = sqlite3.connect(db_path(tmp_path))
    try:
        first, second = read.candidate_source(conn, "cand-1"), read.candidate_source(conn, "cand-2")
    finally:
        conn.close()
    whole = [a for a in written["answers"] if a["kind"] != "repair"]  # a repair only answers its failure
    assert first.strip() == whole[0]["cuda"].strip()
    assert second.strip() == whole[1]["cuda"].strip()  # the next unused answer, not the same


def test_fallback_when_no_answer_is_left() -> None:
    sa = _serve_answers()
    book = sa.AnswerBook.load(FIXTURE)
    prompt = "# Operator card `aten::gelu` (card x)\nExact call (your kernel handles only this one): `f16[7]`\n"
    assert book.pick(prompt) == (sa.FALLBACK_ID, sa.FALLBACK_TEXT)  # a card the fixture has no answer for
