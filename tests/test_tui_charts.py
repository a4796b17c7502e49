"""Charts a user would rather look at than read: a card's search against the eager line, the run's
candidates and estimated whole-model speedup over time, failures by category. Drawn by textual-plotext
on the synthetic fixture store (tests/tui_fixture.py) and on the shipped demo."""

import pytest
from tui_fixture import T0, build_store
from tui_helpers import screen_text

from engine.cards import OperatorCard
from engine.store.read import CandidateHead
from kforge_tui.app import KforgeApp
from kforge_tui.charts import card_series, run_series
from kforge_tui.screens.charts import GAIN_TITLE, PROGRESS_TITLE
from kforge_tui.screens.latency import SPEEDUP_TITLE, US_TITLE


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    db = tmp_path_factory.mktemp("charts") / "ws" / "kforge.db"
    return db, build_store(db)


def make_app(db, run_id):
    app = KforgeApp(db, run_id, refresh_s=0, clock=lambda: T0)
    app.animation_level = "none"
    return app


async def settle(pilot, *keys):
    for k in keys:
        await pilot.press(k)
        await pilot.pause(0.05)
    for _ in range(10):  # a few frames: a chart draws once its pane has a size
        await pilot.pause(0.05)


def head(nid, card, status, order, t, best_us=None, speedup=None):
    return CandidateHead(nid, card, None, status, "compile" if status == "rejected" else None, best_us, 100.0,
                         speedup, "", order, t)


def test_card_series_is_the_best_so_far_over_evaluations():
    nodes = [head("a", "c", "verified", 1, 1, 80.0, 1.25), head("b", "c", "rejected", 2, 2),
             head("d", "c", "verified", 3, 3, 90.0, 1.1), head("e", "c", "verified", 4, 4, 50.0, 2.0),
             head("f", "c", "evaluating", 5, 5)]
    s = card_series(nodes)
    assert s.evaluation == [1, 3, 4]  # the failed one counts as an evaluation, the in-flight one not yet
    assert s.best_us == [80.0, 80.0, 50.0] and s.speedup == [1.25, 1.25, 2.0] and s.finished == 4


def _card(cid, share, calls=1, chain=None):
    return OperatorCard(cid, "kforge::chain" if chain else "aten::gelu", {"args": []}, calls=calls, share=share,
                        chain=chain)


def test_run_series_estimates_the_model_speedup_by_amdahl_over_shares():
    cards = [_card("x", 0.5), _card("y", 0.5)]
    nodes = [head("a", "x", "verified", 1, 60, 50.0, 2.0), head("b", "y", "rejected", 2, 120),
             head("c", "y", "verified", 3, 180, 25.0, 4.0), head("d", "x", "verified", 4, 240, 80.0, 0.8)]
    s = run_series(nodes, cards, started_at=0.0)
    assert s.minutes == [1.0, 2.0, 3.0, 4.0]
    assert s.verified == [1, 1, 2, 3] and s.failed == [0, 1, 1, 1]
    # x at 2×: 1 / (0.25 + 0.5); then y at 4× as well: 1 / (0.25 + 0.125); a slower kernel changes nothing.
    assert s.model_speedup == pytest.approx([1 / 0.75, 1 / 0.75, 1 / 0.375, 1 / 0.375])


def test_run_series_counts_a_chains_calls_once():
    # x and y are all inside chain c (its share is theirs); z is outside. Before, the chain's share was
    # added to the model's time and its speedup to its members': 2x on the chain read as 1.2x, not 1.33x.
    cards = [_card("x", 0.25, calls=2), _card("y", 0.25, calls=2), _card("z", 0.5),
             _card("c", 0.5, calls=2, chain={"kind": "module", "members": ["x", "y"]})]
    nodes = [head("a", "c", "verified", 1, 60, 10.0, 2.0), head("b", "x", "verified", 2, 120, 10.0, 1.5),
             head("d", "z", "verified", 3, 180, 10.0, 2.0)]
    s = run_series(nodes, cards, started_at=0.0)
    # The chain at 2x: 0.5 + 0.25; x at 1.5x changes nothing (the chain is better for those calls); then z.
    assert s.model_speedup == pytest.approx([1 / 0.75, 1 / 0.75, 1 / 0.5])


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_card_chart_has_titles_axes_and_the_eager_line(store, size):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=size) as pilot:
        await settle(pilot, "c", "l")
        text = screen_text(app)
        assert US_TITLE in text and SPEEDUP_TITLE in text
        assert "evaluation" in text and "µs" in text and "× vs eager" in text
        assert "eager" in text and "best µs" in text and "best speedup" in text
        assert "latency" in text and "verified" in text


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_run_charts_screen_from_the_g_key(store, size):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=size) as pilot:
        await settle(pilot, "g")
        assert type(app.screen).__name__ == "RunChartsScreen"
        text = screen_text(app)
        assert PROGRESS_TITLE in text and GAIN_TITLE in text and "failures by category" in text
        assert "minutes" in text and "candidates" in text and "verified" in text and "failed" in text
        assert "est. whole-model speedup" in text
        top = max(app.model.failure_categories().items(), key=lambda kv: kv[1])
        assert f"{top[0]} {top[1]}" in text  # the most frequent category's bar, with its count


async def test_tree_shows_the_card_chart_beside_it_when_wide(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, "c", "enter")
        text = screen_text(app)
        assert "best µs over evaluations" in text and "evaluation" in text


async def test_charts_key_is_in_the_footer_and_the_help(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        assert "g Charts" in screen_text(app)
        await settle(pilot, "question_mark")
        assert "Charts of the run" in screen_text(app)


@pytest.mark.parametrize("size", [(40, 12), (24, 8)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_charts_in_a_tiny_terminal_say_so_instead_of_crashing(store, size):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=size) as pilot:
        await settle(pilot, "g")
        assert type(app.screen).__name__ == "RunChartsScreen"
        await settle(pilot, "c", "l")
        assert type(app.screen).__name__ == "LatencyScreen"
        screen_text(app)


async def test_charts_of_the_demo():
    from kforge_tui.launcher import demo_copy
    from kforge_tui.readmodel import ReadModel

    db = demo_copy()
    run = ReadModel(db).runs()[0]
    app = KforgeApp(db, run.id, read_only=True, refresh_s=0, note="demo (read-only)")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, "g")
        text = screen_text(app)
        assert PROGRESS_TITLE in text and GAIN_TITLE in text and "minutes" in text
        assert "no failed candidate" in text or "failed candidates" in text
        await settle(pilot, "c", "down", "l")  # the second card: addmm, the first, has no compile reference
        text = screen_text(app)
        assert "evaluation" in text and "eager" in text
        assert "torch.compile" in text  # three of the demo's four cards carry their H200 torch.compile references


async def test_a_dry_runs_charts_say_compiled_and_estimate_nothing(tmp_path):
    # A dry run's charts read "87 verified · est. whole-model speedup 1.00×" while compare said "verified 0":
    # its candidates compile and stop, nothing is timed.
    import sqlite3

    db = tmp_path / "ws" / "kforge.db"
    ids = build_store(db)
    run = ids["runs"][-1]
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET config = json_set(config, '$.dry_run', json('true')) WHERE id = ?", (run,))
    app = make_app(db, run)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, "g")
        text = screen_text(app)
        assert "dry run: " in text and " compiled · " in text and "nothing timed" in text
        assert "verified" not in text and "est. whole-model speedup" not in text
        assert "a dry run compiles and stops: nothing was timed" in text
