"""A refresh tick updates what changed in place: cells change, rows move only when their sort key
changed, new failures appear on top, and unchanged rows are not repainted."""

import sqlite3

from tui_fixture import T0, build_store
from tui_helpers import screen_text

from kforge_tui.app import KforgeApp
from kforge_tui.widgets import LiveTable


def _finish(db, run_id, card_id, nid, *, best_us=None, speedup=None, category=None, error=None):
    conn = sqlite3.connect(db)
    status = "verified" if speedup else "rejected"
    conn.execute("INSERT INTO candidates (id, run_id, card_id, source, source_hash, proposer, status, category, "
                 "error, best_us, eager_us, speedup, created_at, updated_at) VALUES (?, ?, ?, '// k', ?, 'test', ?, "
                 "?, ?, ?, 100.0, ?, ?, ?)",
                 (nid, run_id, card_id, f"h-{nid}", status, category, error, best_us, speedup, T0, T0))
    conn.commit()
    conn.close()


def _row_of(table: LiveTable, key: str) -> int:
    return table.get_row_index(key)


def _key_at(table: LiveTable, index: int) -> str:
    return table.coordinate_to_cell_key((index, 0)).row_key.value


async def test_cards_tick_updates_cells_in_place_and_resorts_only_on_key_change(tmp_path):
    db = tmp_path / "ws" / "kforge.db"
    ids = build_store(db, cards=40, per_card=2, runs=1)
    run_id = ids["runs"][0]
    app = KforgeApp(db, run_id, refresh_s=0, clock=lambda: T0)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("c")
        await pilot.pause(0.1)
        screen = app.screen
        table = screen.query_one("#cards", LiveTable)
        order = list(screen._shown)
        await pilot.press("down", "down")
        cursor_card = screen.current_card_id()
        target = order[10]
        _finish(db, run_id, target, "cand-new-fast", best_us=96.0, speedup=4.25)
        repainted = []
        original = table._refresh_lines
        table._refresh_lines = lambda i: (repainted.append(i), original(i))
        app.poll_now()
        await pilot.pause(0.1)
        assert screen._shown == order, "sorted by share, which did not change: no row moved"
        assert screen.current_card_id() == cursor_card
        assert repainted == [_row_of(table, target)], "only the changed row is repainted"
        assert "4.25×" in screen_text(app) and "96.00" in screen_text(app)

        # Sorted by speedup, the card that just got faster moves to the top on the next tick.
        from kforge_tui.screens.cards import SORTS

        while SORTS[screen.sort_col][0] != "speedup":
            await pilot.press("s")
        await pilot.pause(0.1)
        other = next(c for c in screen._shown[3:] if c != target)
        _finish(db, run_id, other, "cand-new-faster", best_us=1.0, speedup=99.0)
        app.poll_now()
        await pilot.pause(0.1)
        assert screen._shown[0] == other and _row_of(table, other) == 0
        assert table.row_count == len(screen._shown) == 40
        assert "99.00×" in screen_text(app), "a wider value widens its column"


async def test_failures_tick_appends_new_failures_and_never_moves_rows(tmp_path):
    db = tmp_path / "ws" / "kforge.db"
    ids = build_store(db, cards=6, per_card=14, runs=1)
    run_id = ids["runs"][0]
    app = KforgeApp(db, run_id, refresh_s=0, clock=lambda: T0)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("f")
        await pilot.pause(0.1)
        screen = app.screen
        table = screen.query_one("#failures", LiveTable)
        before = table.row_count
        first = [_key_at(table, i) for i in range(before)]
        cleared = []
        table.clear = lambda *a, **k: cleared.append(1)
        _finish(db, run_id, "card-0001", "cand-zz-new-failure", category="mismatch",
                error="mismatch: 3 of 4096 elements differ")
        app.poll_now()
        await pilot.pause(0.1)
        assert not cleared, "a tick never clears the table"
        assert table.row_count == before + 1
        assert _row_of(table, "cand-zz-new-failure") == before  # oldest first: the new one goes below
        assert [_key_at(table, i) for i in range(before)] == first  # and nothing that was there moved
        text = screen_text(app)
        assert "cand-zz-new-failure" in text and "mismatch: 3 of 4096" in text
        assert f"all {before + 1}" in text


async def test_failures_below_the_view_are_held_until_the_cursor_reaches_the_end(tmp_path):
    db = tmp_path / "ws" / "kforge.db"
    ids = build_store(db, cards=6, per_card=14, runs=1)
    run_id = ids["runs"][0]
    app = KforgeApp(db, run_id, refresh_s=0, clock=lambda: T0)
    async with app.run_test(size=(80, 24)) as pilot:  # fewer rows in view than failures
        await pilot.press("f")
        await pilot.pause(0.1)
        table = app.screen.query_one("#failures", LiveTable)
        before = table.row_count
        assert before > 20
        _finish(db, run_id, "card-0001", "cand-zz-new-failure", category="mismatch",
                error="mismatch: 3 of 4096 elements differ")
        app.poll_now()
        await pilot.pause(0.1)
        assert table.row_count == before  # nothing appended out of sight
        assert "+1 new at the end" in screen_text(app)
        await pilot.press("ctrl+end")
        await pilot.pause(0.1)
        assert table.row_count == before + 1 and _row_of(table, "cand-zz-new-failure") == before
        text = screen_text(app)
        assert "cand-zz-new-failure" in text and "+1 new" not in text
