"""The demo's written answers (tests/fixtures/recorded_answers/mlp_block.json), checked without a GPU: each
is labelled for what it is, compiles or fails to compile as it should, and the run that records the demo
(scripts/record_demo.py: one request at a time, four iterations per card) serves every one of them, each to
the prompt it was written for, through the real proposer, prompts and store."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sqlite3
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from card_helpers import brief

from engine.capture.recorder import CaptureMode
from engine.compile import compile_nvrtc
from engine.lane.evaluate import Evaluation
from engine.launch import parse_spec
from engine.outcomes import FAILURE_CATEGORIES
from engine.propose.answer import extract
from engine.propose.hardware_profiles import profile
from engine.propose.llm import LLMProposer
from engine.propose.repair import REPAIRABLE
from engine.run.orchestrator import Budgets, Orchestrator
from engine.run.plan import CardState
from engine.run.store_recorder import StoreRecorder
from engine.store import Store, db_path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "recorded_answers" / "mlp_block.json"
FLAWED = "deliberately flawed, written to exercise failure inspection: "
HONEST = "answers written by an AI assistant acting as the model for these prompts (not a provider's output)"


def load_script(name: str):
    """scripts/NAME.py as a module, registered (serve_answers' dataclasses need their module in sys.modules)."""
    key = "demo_" + name.replace("/", "_")
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, ROOT / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def _answers() -> list[tuple[str, dict]]:
    doc = json.loads(FIXTURE.read_text())
    return [(card["op"], a) for card in doc["cards"] for a in card["answers"]]


def test_every_answer_is_labelled_and_says_what_it_should_record() -> None:
    doc = json.loads(FIXTURE.read_text())
    assert doc["label"] == HONEST
    for card in doc["cards"]:
        by_id = {a["id"]: a for a in card["answers"]}
        assert len(by_id) == len(card["answers"]), "answer ids are unique within a card"
        for a in card["answers"]:
            assert a["expect"] == "verified" or a["expect"] in FAILURE_CATEGORIES, a["id"]
            # A flawed answer says so; a correct one carries no flaw label.
            assert (a["expect"] != "verified") == a.get("label", "").startswith(FLAWED), a["id"]
            if a["kind"] == "repair":
                assert by_id[a["repairs"]]["expect"] in REPAIRABLE, a["id"]
    failed = {a["expect"] for _, a in _answers() if a["expect"] != "verified"}
    # Issue 25: failures of several categories, among them a compile error, a wrong result, a write
    # outside the buffers and a reward hack caught by the timing audit.
    assert {"compile", "mismatch", "nan", "overrun", "cheating"} <= failed


def test_a_flawed_answer_is_served_with_its_label() -> None:
    sa = load_script("serve_answers")
    op, flawed = next((op, a) for op, a in _answers() if a.get("label"))
    text = sa.answer_text(flawed)
    assert FLAWED in text and text.index(FLAWED) < text.index("```cuda")
    assert extract(text).source.strip() == flawed["cuda"].strip()  # the note is prose, not code
    _, honest = next((op, a) for op, a in _answers() if not a.get("label"))
    assert "deliberately flawed" not in sa.answer_text(honest)


@pytest.mark.parametrize("op,answer", _answers(), ids=lambda v: v["id"] if isinstance(v, dict) else v)
def test_answer_compiles_unless_it_is_the_compile_error(op: str, answer: dict) -> None:
    sa = load_script("serve_answers")
    got = extract(sa.answer_text(answer))
    assert got.ok, got.reason
    parse_spec(got.spec)
    compiled = compile_nvrtc(got.source, arch="sm_90")
    # `now`: what the answer meets today where the shipped recording (`expect`) predates a check; the reward hack's
    # call counter has not compiled since 2026-12-06g (it was caught by the timed calls' audit when recorded)
    assert compiled.ok == (answer.get("now", answer["expect"]) != "compile"), compiled.summary()
    if answer.get("now") == "compile":
        assert [d for d in compiled.errors if d.code == "forbidden"] and answer["now_why"]


def _demo_cards() -> list[CardState]:
    """The four cards of scripts/demo/mlp_block.py at --small (2 x 1024 x 1024, fp16), captured on the CPU."""
    block = load_script("demo/mlp_block")
    target = block.build(device=torch.device("cpu"), dtype=torch.float16, batch=2)
    mode = CaptureMode(path_of=lambda: "m", weight_of=lambda p: 1, samples=0, sample_budget_bytes=0, sink=None,
                       use_cuda_events=False)
    with torch.no_grad(), mode:
        target.forward()
    cards = [brief(c.op, c.signature, c.outputs, card_id=f"card-{i}") for i, c in enumerate(mode.cards.values())]
    return [CardState(replace(c, share=0.25, eager_us=10.0, roofline_us=2.0, bytes=1 << 24), [f"/s/{c.card_id}"])
            for c in cards]


class ExpectedOutcomes:
    """A stand-in lane: each candidate gets the outcome its answer's `expect` names (verified at 1.1x)."""

    def __init__(self) -> None:
        self.expect = {(a["cuda"].strip(), a["toml"].strip()): a["expect"] for _, a in _answers()}

    async def __call__(self, card: CardState, proposal) -> Evaluation:
        expect = self.expect[(proposal.source.strip(), str(proposal.spec).strip())]
        if expect != "verified":
            return Evaluation("rejected", expect, f"{expect}: as the fixture expects", 0.0)
        return Evaluation("verified", None, "", 0.0, payload={"timing": {
            "eager": {"median": 10.0}, "candidate": {"median": 9.0}, "speedup": 10 / 9, "speedup_ci": [1.1, 1.12]}})


async def test_the_recording_run_serves_every_answer_to_its_prompt(tmp_path: Path, monkeypatch) -> None:
    sa, record = load_script("serve_answers"), load_script("record_demo")
    cards = _demo_cards()
    book = sa.AnswerBook.load(FIXTURE)
    assert sorted((c.card.op, c.card.signature_text) for c in cards) == sorted(
        (c["op"], c["signature"]) for c in book.cards), "the capture's signatures are the fixture's"
    monkeypatch.setenv("ANTHROPIC_API_KEY", "dummy")
    runner, port = await sa.start(book)
    try:
        # the SDK, imported here only: at the module's top it cost every xdist worker seconds of collection
        from engine.propose.providers.anthropic_client import AnthropicClient

        client = AnthropicClient(record.MODEL_NAME, base_url=f"http://127.0.0.1:{port}")
        async with await Store.open(db_path(tmp_path)) as store:
            await store.save_capture({"id": "cap", "model": "mlp_block", "device": "cuda", "dtype": "float16"},
                                     [c.card.row() for c in cards], [])
            run = await store.create_run("cap", "mlp_block", "anthropic", {})
            ids = (f"cand-{i:03d}" for i in itertools.count())
            o = Orchestrator(cards=cards, proposer=LLMProposer(client, name="anthropic"),
                             evaluate=ExpectedOutcomes(), recorder=StoreRecorder(store, run["id"]),
                             new_id=lambda: next(ids), hardware=profile("h200"), poll_s=0.005,
                             budgets=Budgets(iterations_per_card=4), max_proposals=1)
            assert await o.run() == "iterations"
    finally:
        await runner.cleanup()
    assert [s["answer"] for s in book.served if s["answer"] == sa.FALLBACK_ID] == []
    outcomes = record.answer_outcomes(db_path(tmp_path), FIXTURE)
    assert [(a, got) for _, a, expected, got in outcomes if got != expected] == []
    # Each repair answers its own failure: the failed candidate is its parent.
    conn = sqlite3.connect(db_path(tmp_path))
    try:
        parents = {c.strip(): p.strip() for c, p in conn.execute(
            "SELECT c.source, p.source FROM candidates c JOIN candidates p ON p.id = c.parent_id")}
    finally:
        conn.close()
    for op, a in _answers():
        if a["kind"] == "repair":
            failed = next(b for o_, b in _answers() if o_ == op and b["id"] == a["repairs"])
            assert parents[a["cuda"].strip()] == failed["cuda"].strip(), a["id"]


def test_the_shipped_demo_recorded_what_the_answers_expect() -> None:
    """kforge_tui/demo/kforge.db is a recording of these answers on an H200 (scripts/record_demo.py): every
    answer was served, and each flawed one failed in the category it was written for."""
    record = load_script("record_demo")
    db = ROOT / "kforge_tui" / "demo" / "kforge.db"
    outcomes = record.answer_outcomes(db, FIXTURE)
    assert [(a, expected, got) for _, a, expected, got in outcomes if got != expected] == []
    conn = sqlite3.connect(db)
    try:
        runs = conn.execute("SELECT status, json_extract(config, '$.model') FROM runs").fetchall()
        models = {m for (m,) in conn.execute("SELECT DISTINCT model_name FROM candidates")}
    finally:
        conn.close()
    assert runs == [("done", record.MODEL_NAME)] and models == {record.MODEL_NAME}
