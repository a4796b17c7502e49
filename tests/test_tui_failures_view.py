"""Failure inspection as a user meets it: whole reasons (wrapped, not cut), a prompt that scrolls with
the keys as soon as its tab is shown, a preview of the failed node beside the tree, and dry-run
candidates that are not marked as failures. Synthetic fixture data (tests/tui_fixture.py)."""

import json
import sqlite3

import pytest
from tui_fixture import T0, build_store, event
from tui_helpers import screen_text

from kforge_tui.app import KforgeApp
from kforge_tui.screens.tree import SIDE_MIN_WIDTH

REASON_END = "ENDOFTHEREASON"
SPEC_END = "ENDOFTHESPEC"
LONG_REASON = ("the kernel wrote past the end of out0: " + "index 16777216 >= numel 16777216, " * 8
               + REASON_END)


@pytest.fixture
def store(tmp_path):
    db = tmp_path / "ws" / "kforge.db"
    ids = build_store(db)
    run = ids["runs"][-1]
    failed = ids["failed"]["runtime-fault"]
    with sqlite3.connect(db) as conn:
        spec = {"launches": [{"kernel": "k", "grid": [1, 1, 1], "block": [256, 1, 1],
                              "note": "x" * 150 + SPEC_END}]}
        conn.execute("UPDATE candidates SET error = ?, launch_spec = ? WHERE id = ?",
                     (LONG_REASON + "\nsecond line of the reason", json.dumps(spec), failed))
        call = conn.execute("SELECT llm_call_id FROM candidates WHERE id = ?", (failed,)).fetchone()[0]
        prompt = "\n".join(f"prompt line {i}" for i in range(200))
        conn.execute("UPDATE llm_calls SET prompt = ? WHERE id = ?", (prompt, call))
        # A dry run's end: every candidate of the last card compiled, never timed.
        dry_card = ids["cards"][-1]
        conn.execute("UPDATE candidates SET status = 'compiled', category = NULL, best_us = NULL, speedup = NULL,"
                     " error = 'compiled (dry run: not verified, not timed)' WHERE run_id = ? AND card_id = ?",
                     (run, dry_card))
        dry = [r[0] for r in conn.execute("SELECT id FROM candidates WHERE run_id = ? AND card_id = ?",
                                          (run, dry_card))]
        event(conn, run, T0 - 2, "evaluated", dry_card, {"candidate": dry[0], "status": "compiled"})
    return db, ids, failed, dry_card, dry


def make_app(db, run_id):
    app = KforgeApp(db, run_id, refresh_s=0, clock=lambda: T0)
    app.animation_level = "none"
    return app


async def opened(pilot, app, name):
    """Wait (by frames, not by a clock) until the pushed screen is up and has taken the focus."""
    for _ in range(100):
        await pilot.pause(0.05)
        if type(app.screen).__name__ == name and app.focused is not None and app.focused.screen is app.screen:
            break
    await pilot.pause(0.1)


async def settle(pilot, *keys):
    for k in keys:
        await pilot.press(k)
        await pilot.pause(0.05)
    await pilot.pause(0.15)


async def test_error_and_spec_tabs_wrap_long_lines_at_80(store):
    db, ids, failed, *_ = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        app.open_candidate(failed)
        await opened(pilot, app, "CandidateScreen")
        await settle(pilot, "5")
        text = screen_text(app)
        assert "the kernel wrote past the end of out0" in text
        assert REASON_END in text  # the end of a 300-character line, wrapped onto the screen
        assert max(len(line) for line in text.splitlines()) <= 80
        await settle(pilot, "3")
        assert SPEC_END in "".join(line.strip() for line in screen_text(app).splitlines())


async def test_prompt_tab_scrolls_with_the_keys_as_soon_as_it_is_shown(store):
    db, ids, failed, *_ = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        app.open_candidate(failed)
        await opened(pilot, app, "CandidateScreen")
        await settle(pilot, "8")
        before = screen_text(app)
        assert "prompt line 0" in before and "prompt line 150" not in before
        await settle(pilot, "pagedown")
        after = screen_text(app)
        assert after != before and "prompt line 0\n" not in after + "\n"
        await settle(pilot, "end")
        assert "(variant" in screen_text(app)  # the answer, at the end of the tab
        await settle(pilot, "home")
        top = screen_text(app)
        assert "proposer anthropic" in top
        await settle(pilot, "down", "down")
        assert "proposer anthropic" not in screen_text(app)  # the arrows scrolled the first line away


async def test_failure_preview_beside_the_tree_where_it_fits(store):
    db, ids, failed, *_ = store
    for size, beside in (((SIDE_MIN_WIDTH + 20, 40), True), ((80, 24), False)):
        app = make_app(db, ids["runs"][-1])
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            app.open_tree(app.model.nodes[failed].card_id)
            await opened(pilot, app, "TreeScreen")
            app.screen.reveal(failed)
            await settle(pilot)
            assert app.screen.current() == failed
            text = screen_text(app)
            assert failed in text
            # Wide: the category, what it means and the first lines of the reason, beside the tree.
            # At 80 columns the tree keeps the width (enter opens the whole reason).
            assert ("it raised a CUDA error while running" in text) is beside
            assert ("second line of the reason" in text) is beside
            assert ("the kernel wrote past the end" in text) is beside


async def test_dry_run_candidates_are_not_marked_failed(store):
    db, ids, _, dry_card, dry = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        log = [line for line in screen_text(app).splitlines() if dry[0] in line and "compiled" in line]
        assert log and all("✗" not in line and "○" in line for line in log), log
        app.open_tree(dry_card)
        await settle(pilot)
        text = screen_text(app)
        assert "○ compiled, not timed (dry run)" in text  # the legend explains the mark
        lines = [line for line in text.splitlines() if "cand-" in line]
        assert lines and all("✗" not in line for line in lines), lines
        assert any("○" in line for line in lines)
        assert "0 failed" in text
        app.open_candidate(dry[0])
        await opened(pilot, app, "CandidateScreen")
        await settle(pilot, "5")
        text = screen_text(app)
        assert "Not an error" in text and "✗" not in text


async def test_each_failure_of_the_demo_opens_on_the_tab_that_explains_it():
    # The demo's cheat passed verification and was caught while timed: it opened on a Verify tab that
    # read 'passed', with no word of why it was rejected.
    from kforge_tui.launcher import demo_copy

    db = demo_copy()
    app = KforgeApp(db, "run-ffa89ddf07d3", refresh_s=0, read_only=True)
    app.animation_level = "none"
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        failed = [n for n in app.model.nodes.values() if n.status == "rejected"]
        assert {n.category for n in failed} >= {"cheating", "mismatch", "compile", "nan", "overrun"}
        for n in failed:
            app.open_candidate(n.id)
            await opened(pilot, app, "CandidateScreen")
            body = screen_text(app).splitlines()[4:]  # below the header, summary, tab names and rule
            first = next(line for line in body if line.strip())
            assert not first.strip().startswith("passed"), (n.category, screen_text(app))
            if n.category != "compile":  # a compile error's log is in the compiler's own words
                assert n.category in " ".join(body), (n.category, screen_text(app))
            if n.category == "cheating":
                await settle(pilot, "6")  # its report, which passed, says where the reason is
                assert "Verification passed; the candidate was rejected after it (cheating)" in \
                    " ".join(screen_text(app).split()), screen_text(app)
            await settle(pilot, "escape")
