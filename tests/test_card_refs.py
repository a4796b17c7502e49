"""A card's two references beside eager: its op under torch.compile alone (compile_us) and the lane's copy
of its floor bytes (copy_us). Stored on the card, carried by `run --json`, drawn in the TUI as a labelled
line, and in the export's and reproduce.py's per-card tables. No GPU: Inductor on the CPU, a stand-in lane."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT
from tui_fixture import T0, build_store
from tui_helpers import screen_text

from engine.cards import OperatorCard, card_from_row
from engine.lane.client import GpuLane
from engine.store import Store, open_readonly, read

STANDIN = [sys.executable, str(ROOT / "tests" / "lane_standin.py")]
OLD_RUN_DB = ROOT / "tests" / "fixtures" / "resnet50-h200-run.db"
DEMO_DB = ROOT / "kforge_tui" / "demo" / "kforge.db"


def _row(card_id: str, bytes_: int = 1 << 20) -> dict:
    return {"card_id": card_id, "op": "aten::relu", "signature": {"op": "aten::relu", "args": [], "aliases": []},
            "signature_text": "f16[8]", "calls": 1, "share": 0.5, "bytes": bytes_}


# ---- torch.compile of a card's eager --------------------------------------------------------------------


def test_compile_eager_runs_an_in_place_op_as_eager_does():
    from engine.bench.compiled import compile_eager
    from engine.ops import call_op, resolve_op

    op = resolve_op("aten::add_.Tensor")
    x, y = torch.randn(64, 33), torch.randn(64, 33)
    bound = [("self", x.clone()), ("other", y), ("alpha", 2)]
    fn = compile_eager(lambda b: call_op(op, b), bound, mode="default")
    assert torch.equal(bound[0][1], x)  # tracing it changed nothing the caller holds
    out = fn(bound)
    assert torch.allclose(out, x + 2 * y) and torch.allclose(bound[0][1], x + 2 * y)


def test_compile_eager_compiles_a_chain_card_as_one_function(tmp_path):
    from test_chains import Model

    from engine.bench.compiled import compile_eager
    from engine.capture.chain_cards import synthetic_chain_card
    from engine.capture.chains import (
        chain_signature,
        container_paths,
        find_chains,
        patterns,
        run_chain,
        trace_forward,
    )
    from engine.capture.samples import load_sample
    from engine.verify.pipeline import chain_eager

    torch.manual_seed(0)
    model = Model(d=64)
    x = torch.randn(2, 5, 64)
    t = trace_forward(model, lambda: model(x), time_calls=False)
    (norm,) = [p for p in patterns(find_chains(t.calls, container_paths(model), unknown=t.unknown))
               if p.kind == "module"]
    ref = synthetic_chain_card(tmp_path, chain_signature(norm.instances[0]), 1, device="cpu")
    bound = load_sample(ref.samples[0], "cpu").args
    fn = compile_eager(chain_eager(ref.signature), bound, mode="default")
    got = fn(bound)
    want = run_chain(ref.signature, [v for _, v in bound])
    assert len(got) == len(want) and all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))


# ---- the store and the card -------------------------------------------------------------------------------


async def test_references_round_trip_through_the_store_onto_the_card(tmp_path):
    async with await Store.open(tmp_path / "kforge.db") as store:
        await store.save_capture({"id": "cap-1", "model": "m", "device": "cuda", "dtype": "float16"},
                                 [_row("c1"), _row("c2")], [])
        await store.update_card_refs("cap-1", "c1", compile_us=9.5, copy_us=4.0,
                                     ref_stats={"compile": {"median": 9.5, "mode": "m"}, "copy": {"median": 4.0}})
        await store.update_card_refs("cap-1", "c2", compile_us=None, copy_us=4.0,
                                     ref_stats={"compile": {"error": "torch.compile did not finish in 120 s"},
                                                "copy": {"median": 4.0}})
        with pytest.raises(KeyError):
            await store.update_card_refs("cap-1", "nope", compile_us=1.0, copy_us=1.0, ref_stats=None)
        rows = {r["card_id"]: r for r in await store.get_cards("cap-1")}
    c1, c2 = card_from_row(rows["c1"]), card_from_row(rows["c2"])
    assert (c1.compile_us, c1.copy_us, c1.compile_note) == (9.5, 4.0, None)
    assert c2.compile_us is None and c2.compile_note == "no compile reference (torch.compile did not finish in 120 s)"
    assert {k: c1.to_json()[k] for k in ("compile_us", "copy_us")} == {"compile_us": 9.5, "copy_us": 4.0}
    conn = open_readonly(tmp_path / "kforge.db")  # the TUI's and scripts' reader
    try:
        got = card_from_row(next(r for r in read.cards_of_capture(conn, "cap-1") if r["card_id"] == "c2"))
    finally:
        conn.close()
    assert got.copy_us == 4.0 and got.compile_note.startswith("no compile reference")


def test_the_demo_carries_references_from_its_h200_recording():
    """The demo (recorded on the H200 after the references landed) has the copy reference for every card it
    timed and torch.compile's for all but addmm, whose cold max-autotune compile ran past the recording's
    --compile-ref-timeout 20 (run-ffa89ddf07d3: "torch.compile for 3" of 4): its charts draw the line for the
    other three."""
    conn = open_readonly(DEMO_DB)
    try:
        cards = [card_from_row(r) for r in read.cards_of_capture(conn, read.latest_run(conn)["capture_id"])]
    finally:
        conn.close()
    timed = [c for c in cards if c.eager_us is not None]
    assert len(timed) == 4 and all(c.copy_us for c in timed)
    assert sorted(c.op for c in timed if not c.compile_us) == ["aten::addmm"]


@pytest.mark.parametrize("db", [OLD_RUN_DB], ids=["resnet50-run"])
async def test_a_database_from_before_the_references_still_opens(tmp_path, db):
    conn = open_readonly(db)  # read-only as the TUI opens it: no migration, no new columns
    try:
        cards = [card_from_row(r) for r in read.cards_of_capture(conn, read.latest_run(conn)["capture_id"])]
    finally:
        conn.close()
    assert cards and all(c.compile_us is None and c.copy_us is None and c.compile_note is None for c in cards)
    shutil.copy(db, tmp_path / "kforge.db")
    async with await Store.open(tmp_path / "kforge.db") as store:  # a run in it migrates it
        cap = (await store.list_captures())[0]["id"]
        rows = await store.get_cards(cap)
        await store.update_card_refs(cap, rows[0]["card_id"], compile_us=1.0, copy_us=2.0, ref_stats={})
        assert (await store.get_cards(cap))[0]["compile_us"] == 1.0


# ---- the run measures and stores them (stand-in lane) -------------------------------------------------------


@pytest.fixture
async def lane():
    lane = GpuLane(STANDIN, timeout_s=5, start_timeout_s=30)
    await lane.start()
    yield lane
    await lane.close()


async def test_the_run_stores_each_cards_references_and_why_one_has_no_compile(lane, tmp_path):
    from engine.run.eager import measure_and_store_references

    ids = ("good", "nocompile", "slowcompile", "nobytes")
    async with await Store.open(tmp_path / "kforge.db") as store:
        await store.save_capture({"id": "cap-1", "model": "m", "device": "cuda", "dtype": "float16"},
                                 [_row(c, 0 if c == "nobytes" else 1 << 20) for c in ids], [])
        refs = [card_from_row(r).ref([str(tmp_path / f"{r['card_id']}.st")]) for r in await store.get_cards("cap-1")]
        await measure_and_store_references(lane, store, "cap-1", refs, timeout_s=2.0)
        cards = {c["card_id"]: card_from_row(c) for c in await store.get_cards("cap-1")}
        rows = {c["card_id"]: c for c in await store.get_cards("cap-1")}
    assert (cards["good"].compile_us, cards["good"].copy_us) == (9.5, 4.0)
    assert rows["good"]["ref_stats"]["compile"]["compile_s"] == 1.5 and rows["good"]["ref_stats"]["copy"]["bytes"]
    assert cards["nocompile"].compile_us is None and cards["nocompile"].copy_us == 4.0
    assert cards["nocompile"].compile_note == ("no compile reference (torch.compile (default) failed: Unsupported: "
                                               "the op has no meta kernel)")
    # A compile that never ends costs its worker (killed and replaced) and is recorded, not waited for.
    assert cards["slowcompile"].compile_note == "no compile reference (torch.compile did not finish in 2 s)"
    assert cards["nobytes"].copy_us is None and cards["nobytes"].compile_us == 9.5
    assert rows["nobytes"]["ref_stats"]["copy"] == {"error": "protocol: card nobytes: no floor bytes to copy"}


async def test_eager_and_references_report_each_card_with_what_its_parts_took(lane, tmp_path):
    """The SD3.5 VAE's run spent 77 s timing eager and 75 s on references for 13 cards before its search,
    with one line for each stage the whole time: each card now moves the stage's count, and the seconds of
    its parts (loading its samples, timing, compiling) are stored with its stats."""
    from engine.run.eager import measure_and_store_eager, measure_and_store_references

    heard: list[tuple] = []
    async with await Store.open(tmp_path / "kforge.db") as store:
        await store.save_capture({"id": "cap-1", "model": "m", "device": "cuda", "dtype": "float16"},
                                 [_row("a"), _row("b"), _row("unmeasurable")], [])
        refs = [card_from_row(r).ref([str(tmp_path / f"{r['card_id']}.st")]) for r in await store.get_cards("cap-1")]
        await measure_and_store_eager(lane, store, "cap-1", refs,
                                      progress=lambda *a: heard.append(("eager", a[0], a[1], a[2].card_id, a[3])))
        await measure_and_store_references(lane, store, "cap-1", refs[:2], timeout_s=5.0,
                                           progress=lambda *a: heard.append(("refs", a[0], a[1], a[2].card_id, a[3])))
        rows = {c["card_id"]: c for c in await store.get_cards("cap-1")}
    assert [h[:4] for h in heard] == [("eager", 1, 3, "a"), ("eager", 2, 3, "b"), ("eager", 3, 3, "unmeasurable"),
                                     ("refs", 1, 2, "a"), ("refs", 2, 2, "b")]
    assert all(set(h[4]) == {"load", "measure"} for h in heard[:3])
    assert all(set(h[4]) == {"copy", "compile"} and min(h[4].values()) >= 0 for h in heard[3:])
    assert set(rows["a"]["eager_stats"]["seconds"]) == {"load", "measure"}
    assert rows["unmeasurable"]["eager_us"] is None  # its error is not stored as a time
    assert set(rows["a"]["ref_stats"]["copy"]["seconds"]) == {"load", "measure"}
    assert rows["a"]["ref_stats"]["compile"]["seconds"] >= 0


async def test_compile_can_be_skipped_and_the_copy_is_still_timed(lane, tmp_path):
    from engine.run.eager import measure_and_store_references

    async with await Store.open(tmp_path / "kforge.db") as store:
        await store.save_capture({"id": "cap-1", "model": "m", "device": "cuda", "dtype": "float16"},
                                 [_row("good")], [])
        refs = [card_from_row(r).ref(["x.st"]) for r in await store.get_cards("cap-1")]
        got = await measure_and_store_references(lane, store, "cap-1", refs, compile=False)
        (card,) = [card_from_row(c) for c in await store.get_cards("cap-1")]
    assert "compile" not in got["good"] and card.compile_us is None and card.compile_note is None
    assert card.copy_us == 4.0


async def test_compile_references_a_spent_budget_never_reached_are_timed_by_a_later_run(lane, tmp_path):
    # 2026-12-06b (H100): 17 of the VAE's 27 cards were left without a torch.compile reference by the run's budget,
    # and no later run (or resume) of that capture timed them: the note it left counted as a try
    from engine.run.command import _references
    from engine.run.eager import measure_and_store_references
    from engine.run.plan import CardState, SchedulePolicy

    class Stages:
        def __getattr__(self, name):
            return lambda *a, **kw: None

    proposer = SimpleNamespace(supports=lambda card: True)
    async with await Store.open(tmp_path / "kforge.db") as store:
        await store.save_capture({"id": "cap-1", "model": "m", "device": "cuda", "dtype": "float16"},
                                 [_row("a"), _row("b")], [])
        run_id = (await store.create_run("cap-1", "m", "builtin", {}))["id"]
        refs = [card_from_row(r).ref(["x.st"]) for r in await store.get_cards("cap-1")]
        await measure_and_store_references(lane, store, "cap-1", refs, budget_s=-1.0)
        spent = {c["card_id"]: card_from_row(c) for c in await store.get_cards("cap-1")}
        assert all(c.compile_untried and c.compile_us is None and c.copy_us == 4.0 for c in spent.values())
        assert spent["a"].compile_note == "no compile reference (the run's -1 s for compile references was spent)"

        def states():
            return [CardState(dataclasses.replace(c, eager_us=10.0), ["x.st"]) for c in spent.values()]

        # a run that times no torch.compile leaves them as they are
        await _references(lane, store, "cap-1", states(), SchedulePolicy(), proposer, {"compile_ref": False},
                          Stages(), run_id)
        assert all(card_from_row(c).compile_untried for c in await store.get_cards("cap-1"))
        await _references(lane, store, "cap-1", states(), SchedulePolicy(), proposer, {}, Stages(), run_id)
        timed = {c["card_id"]: card_from_row(c) for c in await store.get_cards("cap-1")}
    assert all(c.compile_us == 9.5 and not c.compile_untried and c.compile_note is None for c in timed.values())


def test_the_run_flags_turn_the_compile_reference_off():
    from engine.cli import build_parser

    args = build_parser().parse_args(["run", "m.toml", "--no-compile-ref", "--compile-ref-timeout", "30"])
    assert args.no_compile_ref and args.compile_ref_timeout == 30.0
    assert not build_parser().parse_args(["run", "m.toml"]).no_compile_ref


def test_run_json_cards_carry_the_references():
    from engine.run.plan import CardState
    from engine.run.report import card_summaries

    card = OperatorCard("c1", "aten::relu", {"op": "aten::relu", "args": [], "aliases": []}, share=0.5,
                        eager_us=12.0, compile_us=9.5, copy_us=4.0)
    other = OperatorCard("c2", "aten::relu", {"op": "aten::relu", "args": [], "aliases": []}, share=0.1)
    o = SimpleNamespace(cards={"c1": CardState(card, []), "c2": CardState(other, [])}, records={})
    doc = {c["id"]: c for c in card_summaries(o)}
    assert (doc["c1"]["compile_us"], doc["c1"]["copy_us"]) == (9.5, 4.0)
    assert doc["c2"]["compile_us"] is None and doc["c2"]["copy_us"] is None
    assert doc["c1"]["compile_in_context"] == []  # no chain holds its calls
    json.dumps(doc)


def _rms_cards(chain_compile_us=None):
    """An RMSNorm's `mul` op card (48 calls: 2 per norm, 24 norms) and the norm's chain card (24 calls)."""
    mul = OperatorCard("mul", "aten::mul.Tensor", {"op": "aten::mul.Tensor", "args": [], "aliases": []}, calls=48,
                       share=0.2, eager_us=8.0, compile_us=7.5)
    pow_ = OperatorCard("pow", "aten::pow.Tensor_Scalar", {"op": "aten::pow.Tensor_Scalar", "args": [], "aliases": []},
                        calls=24, share=0.1)
    chain = OperatorCard("rms", "kforge::chain", {"op": "kforge::chain", "args": [], "aliases": []}, calls=24,
                         share=0.4, signature_text="chain[_to_copy pow mean add rsqrt mul mul _to_copy] in0 bf16[8]",
                         chain={"kind": "module", "members": ["cp", "pow", "mean", "add", "rsqrt", "mul", "mul", "cp"]},
                         compile_us=chain_compile_us)
    return mul, pow_, chain


def test_an_op_card_is_shown_beside_the_chain_torch_compile_fuses_it_into():
    # Issue 19: the reference to beat both ways: the op under torch.compile alone, and in its context (the
    # chain Inductor fuses it into, timed compiled as a whole).
    from engine.cards import compile_in_context
    from engine.run.plan import CardState
    from engine.run.report import card_summaries

    mul, pow_, chain = _rms_cards(chain_compile_us=11.0)
    got = compile_in_context([mul, pow_, chain])
    assert got["mul"] == [{"chain": "rms", "ops": ["_to_copy", "pow", "mean", "add", "rsqrt", "mul", "mul", "_to_copy"],
                           "compile_us": 11.0, "held": 1.0}]
    assert got["pow"][0]["held"] == 1.0 and "rms" not in got
    # A chain whose compile reference was not measured says nothing.
    assert compile_in_context(list(_rms_cards())) == {}
    o = SimpleNamespace(cards={c.card_id: CardState(c, []) for c in (mul, pow_, chain)}, records={})
    doc = {c["id"]: c for c in card_summaries(o)}
    assert doc["mul"]["compile_in_context"][0]["compile_us"] == 11.0 and doc["mul"]["compile_us"] == 7.5

    from kforge_tui.readmodel import CardRow
    from kforge_tui.screens.latency import references

    row = CardRow("mul", "aten::mul.Tensor", "bf16[8]", 48, 0.2, 8.0, None, None, None, None, "queued", 0, 0, {},
                  None, compile_us=7.5)
    assert references(row, got["mul"]) == (" · torch.compile 7.50 µs alone · in context fused into chain _to_copy → "
                                           "pow → mean → add … (100% of its calls): torch.compile 11.00 µs for the chain")


# ---- shown: the TUI, the export's report, reproduce.py --------------------------------------------------


@pytest.fixture
def tui_store(tmp_path):
    db = tmp_path / "ws" / "kforge.db"
    ids = build_store(db)
    with sqlite3.connect(db) as conn:  # the largest card (the cards table's first row) has both references
        top = conn.execute("SELECT card_id FROM cards ORDER BY share DESC LIMIT 1").fetchone()[0]
        conn.execute("UPDATE cards SET compile_us = 300.0, copy_us = 50.0 WHERE card_id = ?", (top,))
    return db, ids, top


async def _settle(pilot, *keys):
    for k in keys:
        await pilot.press(k)
        await pilot.pause(0.05)
    for _ in range(10):
        await pilot.pause(0.05)


async def test_card_chart_draws_the_labelled_torch_compile_line_at_80x24(tui_store):
    from kforge_tui.app import KforgeApp

    db, ids, top = tui_store
    app = KforgeApp(db, ids["runs"][-1], refresh_s=0, clock=lambda: T0)
    app.animation_level = "none"
    async with app.run_test(size=(80, 24)) as pilot:
        await _settle(pilot, "c")
        assert "compile µs" in screen_text(app)
        await _settle(pilot, "l")
        assert type(app.screen).__name__ == "LatencyScreen" and app.screen.card_id == top
        text = screen_text(app)
        # In both charts' legends (the line's mark, then its label), beside eager's and the best's.
        assert text.count("⢕⢕ torch.compile") == 2 and "⢕⢕ eager" in text and "⢕⢕ best µs" in text
        assert app.model.cards[top].compile_us == 300.0 and app.model.cards[top].copy_pct is not None


async def test_cards_without_a_compile_reference_draw_no_compile_line(tui_store):
    from kforge_tui.app import KforgeApp

    db, ids, top = tui_store
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE cards SET compile_us = NULL, copy_us = NULL")
    app = KforgeApp(db, ids["runs"][-1], refresh_s=0, clock=lambda: T0)
    app.animation_level = "none"
    async with app.run_test(size=(120, 30)) as pilot:
        await _settle(pilot, "c", "l")
        text = screen_text(app)
        assert "⢕⢕ eager" in text and "torch.compile" not in text


def test_card_view_shows_compile_and_the_kernel_over_copy_fraction():
    from kforge_tui.readmodel import CardRow
    from kforge_tui.screens.latency import references

    row = CardRow("c", "aten::relu", "f16[8]", 1, 0.5, 120.0, 40.0, 60.0, 2.0, 66.0, "finished", 3, 0, {}, "k",
                  compile_us=90.0, copy_us=50.0)
    assert row.copy_pct == pytest.approx(120.0)
    assert references(row) == " · torch.compile 90.00 µs alone · copy 50.00 µs (best 120% of it)"
    failed = CardRow("c", "aten::relu", "f16[8]", 1, 0.5, 120.0, 40.0, None, None, None, "queued", 0, 0, {}, None,
                     compile_note="no compile reference (torch.compile did not finish in 120 s)")
    assert references(failed) == " · no compile reference (torch.compile did not finish in 120 s)"


def test_export_report_has_torch_compile_and_percent_of_copy_columns():
    from engine.export.package import ExportVariant, package

    env = {"gpu": "NVIDIA H200", "arch": "sm_90", "torch": "2.x", "cuda": "13", "driver": "1", "nvrtc": "13"}
    spec = '[[launch]]\nkernel = "k"\ngrid = [1]\nblock = [32]\nargs = [{ ptr = "out0" }]\n'
    row = {**_row("c1"), "outputs": [], "compile_us": 9.5, "copy_us": 4.0}
    cand = {"id": "cand-1", "source": "__global__ void k() {}", "launch_spec": spec, "proposer": "test",
            "status": "verified", "best_us": 5.0, "eager_us": 12.0, "speedup": 2.4}
    plain = {**_row("c2"), "outputs": []}
    manifest, _, report = package([ExportVariant(row, cand, None, "// ptx", "sm_90"),
                                   ExportVariant(plain, {**cand, "id": "cand-2"}, None, "// ptx", "sm_90")],
                                  env, {"run": "run-1"})
    header = next(ln for ln in report.splitlines() if ln.startswith("| variant |"))
    assert header.endswith("| torch.compile µs | % of copy |")
    rows = [ln for ln in report.splitlines() if ln.startswith("| relu-")]
    assert rows[0].endswith("| 9.5 | 125% |") and rows[1].endswith("| – | – |")
    assert manifest["variants"][0]["evidence"]["lane"]["copy_us"] == 4.0


def test_reproduce_table_takes_the_cards_own_compile_reference(tmp_path):
    (tmp_path / "resnet50").mkdir()
    db = tmp_path / "resnet50" / "kforge.db"
    shutil.copy(OLD_RUN_DB, db)
    with sqlite3.connect(db) as conn:  # as a run with references leaves the card rows (schema v5 columns)
        conn.execute("ALTER TABLE cards ADD COLUMN compile_us REAL")
        conn.execute("ALTER TABLE cards ADD COLUMN copy_us REAL")
        conn.execute("UPDATE cards SET compile_us = 123.4, copy_us = 10.0 WHERE op = 'aten::mean.dim'")
    p = subprocess.run([sys.executable, "scripts/reproduce.py", "--out", str(tmp_path), "--report-only",
                        "--models", "resnet50"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    text = (tmp_path / "report.md").read_text()
    assert "| torch.compile µs |" in text and "| % of copy |" in text
    mean = [ln for ln in text.splitlines() if ln.startswith("| resnet50 | `aten::mean.dim`")]
    assert mean and all("| 123.4 |" in ln for ln in mean)
    others = [ln for ln in text.splitlines() if ln.startswith("| resnet50 | `aten::native_batch_norm`")]
    assert others and all(" | – | " in ln for ln in others)
