"""Text from the workspace or the user shown as it reads, never parsed as markup: Textual reads a plain str as
rich markup, and `[/` in a filter, an error text with a bracketed path or the palette's `Filter [/]` entry closed
a tag that was never opened and ended the app (MarkupError); `out0[idx] = [nan]` lost its brackets."""

import sqlite3

import pytest
from test_tui_journeys import make_app, settle
from textual.command import CommandPalette
from tui_fixture import build_store
from tui_helpers import screen_text


@pytest.fixture
def store(tmp_path):
    db = tmp_path / "ws" / "kforge.db"
    ids = build_store(db)
    return db, ids


async def test_the_command_palette_opens_on_the_cards_screen(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, "c", "ctrl+p")
        assert isinstance(app.screen, CommandPalette)
        await pilot.pause(0.3)
        assert "Filter [/]" in screen_text(app)


async def test_a_filter_with_brackets_is_shown_as_typed(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot, "c", "slash", "left_square_bracket", "slash")
        assert "filter '[/'" in screen_text(app)


async def test_failures_show_error_text_with_brackets_as_it_is(store):
    db, ids = store
    run = ids["runs"][-1]
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT id FROM candidates WHERE run_id = ? AND status = 'rejected' ORDER BY id",
                            (run,)).fetchall()
        assert len(rows) >= 2
        conn.execute("UPDATE candidates SET error = ? WHERE id = ?", ("launch failed at [/tmp/k/cand.cu:12]",
                                                                      rows[0][0]))
        conn.execute("UPDATE candidates SET error = ? WHERE id = ?", ("mismatch at out0[idx] = [nan] in [i]row",
                                                                      rows[1][0]))
    app = make_app(db, run)
    async with app.run_test(size=(200, 60)) as pilot:
        await settle(pilot, "f")
        text = screen_text(app)
        assert "launch failed at [/tmp/k/cand.cu:12]" in text
        assert "mismatch at out0[idx] = [nan] in [i]row" in text
