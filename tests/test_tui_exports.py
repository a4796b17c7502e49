"""`e` on the overview: the run's recorded exports, per target the whole-model numbers and which variants
serve it, readable at 80×24; and the latest export's per-target speedup in `runs --json` and `compare`.

The export rows are written here with made-up numbers (synthetic test data on the fixture store) to check
what the screen shows; none is a measurement."""

import asyncio
import json
import shutil

import pytest
from conftest import ROOT
from tui_fixture import T0, build_store
from tui_helpers import screen_text

import engine.cli
from engine.store import Store
from kforge_tui.app import KforgeApp

GN, GELU = "native_group_norm-card-000", "gelu-card-0001"
WRITTEN = {
    "started_at": T0 - 200, "finished_at": T0 - 100, "status": "written", "out_path": "/casts/sd35.cast",
    "cast_sha256": "ab" * 32, "targets": ["eager", "cuda-graphs", "compile"],
    "checks": [
        {"target": "eager", "mode": "eager", "speedup": 1.08, "speedup_ci": [1.05, 1.12], "eager_ms": 4.0,
         "cast_ms": 3.7, "rel_l2_err": 2e-4, "kept": [GN, GELU], "dropped": []},
        {"target": "cuda-graphs", "mode": "cuda-graphs", "speedup": 1.21, "speedup_ci": [1.18, 1.25],
         "eager_ms": 2.0, "cast_ms": 1.65, "rel_l2_err": 3e-4, "kept": [GN],
         "dropped": [{"id": GELU, "reason": "the model was slower (or its output rejected) with every set that "
                                           "held it; the smallest: 2 variant(s): 0.950x (95% CI 0.930-0.970)"}]},
        {"target": "compile", "mode": "compile", "refused": "export: slower under compile", "kept": [],
         "dropped": [{"id": GN, "reason": "export: slower under compile"},
                     {"id": GELU, "reason": "export: slower under compile"}]}],
    "variants": [{"id": GN, "op": "aten::native_group_norm", "card_id": "card-0000",
                  "targets": ["eager", "cuda-graphs"], "speedup": 1.5, "speedup_ci": [1.4, 1.6]},
                 {"id": GELU, "op": "aten::gelu", "card_id": "card-0001", "targets": ["eager"], "speedup": 1.3,
                  "speedup_ci": [1.2, 1.4]}],
    "excluded": [{"card_id": "card-0002", "op": "aten::_softmax", "reason": "no verified candidate"}],
    "options": {"model_check": True}, "env": {"gpu": "NVIDIA H200", "arch": "sm_90"}}
FAILED = {"started_at": T0 - 60, "finished_at": T0 - 50, "status": "failed", "out_path": "/casts/again.cast",
          "targets": ["eager"], "checks": [{"target": "eager", "mode": "not reached", "kept": [], "dropped": []}],
          "error": "export: no variant kept its speedup through the public op in a fresh process (2 tried); "
                   "nothing written"}


@pytest.fixture
def store(tmp_path):
    db = tmp_path / "ws" / "kforge.db"
    ids = build_store(db)
    return db, ids


async def add_exports(db, run_id, *rows):
    async with await Store.open(db) as s:
        for r in rows:
            await s.add_export({"run_id": run_id, **r})


async def open_exports(app, pilot):
    await pilot.pause(0.1)
    await pilot.press("e")
    for _ in range(100):
        if type(app.screen).__name__ == "ExportsScreen":
            break
        await pilot.pause(0.05)
    await pilot.pause(0.2)


async def test_e_lists_the_exports_and_each_targets_whole_model_numbers_at_80(store):
    db, ids = store
    run = ids["runs"][-1]
    await add_exports(db, run, WRITTEN, FAILED)
    app = KforgeApp(db, run, refresh_s=0, clock=lambda: T0)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_exports(app, pilot)
        text = screen_text(app)
        assert f"2 exports of {run}" in text
        # Newest first: the failure says why in the list and in the details.
        lines = text.splitlines()
        failed_row = next(i for i, line in enumerate(lines) if " failed " in line)
        written_row = next(i for i, line in enumerate(lines) if " written " in line)
        assert failed_row < written_row
        assert "eager 1.08× · cuda-graphs 1.21× · compile refused" in lines[written_row]
        assert "no variant kept its speedup" in text and "nothing written" in text
        await pilot.press("down")
        await pilot.pause(0.2)
        text = screen_text(app)
        assert "/casts/sd35.cast" in text and "targets asked: eager, cuda-graphs, compile" in text
        assert "1.080× (95% CI 1.050–1.120) · 4.00 → 3.70 ms" in text
        assert "1.210× (95% CI 1.180–1.250) · 2.00 → 1.65 ms" in text
        assert "refused: slower under compile" in text
        assert f"kept 2: {GN}, {GELU}" in text and f"kept 1: {GN}" in text  # who serves which target
        assert f"dropped {GELU}: the model was slower" in text
        assert all(len(line) <= 80 for line in text.splitlines())
        # The rest (the cast's variants and whom each serves) is below, in reach of tab and the arrows.
        await pilot.press("tab", "end")
        await pilot.pause(0.2)
        text = screen_text(app)
        assert "in the cast: 2 variant(s)" in text
        assert any(GN in line and "1.50×" in line and "eager, cuda-graphs" in line for line in text.splitlines())
        assert "_softmax card-000: no verified candidate" in text
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert type(app.screen).__name__ == "OverviewScreen"


async def test_without_exports_the_screen_says_how_to_export(store, tmp_path):
    db, ids = store
    run = ids["runs"][-1]
    app = KforgeApp(db, run, refresh_s=0, clock=lambda: T0)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_exports(app, pilot)
        text = screen_text(app)
        assert f"No export of {run} is recorded" in text
        assert f"kforge-tui export {run} --out model.cast --target eager,cuda-graphs" in text


async def test_an_old_workspace_opens_on_the_empty_exports_view(tmp_path):
    """The demo was recorded before exports were: the viewer does not migrate it and shows none."""
    db = tmp_path / "kforge.db"
    shutil.copy(ROOT / "kforge_tui/demo/kforge.db", db)
    app = KforgeApp(db, "run-ffa89ddf07d3", refresh_s=0, clock=lambda: T0, read_only=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_exports(app, pilot)
        assert "No export of run-ffa89ddf07d3 is recorded" in screen_text(app)


async def test_the_overview_footer_keeps_charts_at_80_and_help_lists_exports(store):
    db, ids = store
    app = KforgeApp(db, ids["runs"][-1], refresh_s=0, clock=lambda: T0)
    async with app.run_test(size=(80, 24)) as pilot:
        for _ in range(100):  # the footer composes once the screen's bindings are known
            lines = screen_text(app).splitlines()
            if len(lines) == 24 and "Quit" in lines[23]:
                break
            await pilot.pause(0.05)
        assert "g Charts" in lines[23], lines[23]
        await pilot.press("question_mark")
        await pilot.pause(0.2)
        assert "Exports of the run, per target" in screen_text(app)


def test_runs_and_compare_show_the_latest_exports_speedup_per_target(store, capsys):
    db, ids = store
    run = ids["runs"][-1]
    asyncio.run(add_exports(db, run, {**WRITTEN, "finished_at": T0 - 300}, {**WRITTEN, "checks": WRITTEN["checks"][:1]}))
    ws = str(db.parent)
    assert engine.cli.main(["runs", "--json", "--workspace", ws]) == 0
    runs = {r["id"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert runs[run]["exported"]["status"] == "written" and runs[run]["exported"]["out"] == "/casts/sd35.cast"
    assert runs[run]["exported"]["speedup"] == {"eager": 1.08}  # the latest of the two
    assert runs[ids["runs"][0]]["exported"] is None
    asyncio.run(add_exports(db, run, {**WRITTEN, "finished_at": T0}))
    assert engine.cli.main(["compare", *ids["runs"], "--plain", "--workspace", ws]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("exported"))
    assert "eager 1.08×, cuda-graphs 1.21×, compile –" in row
