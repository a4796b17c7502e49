"""User journeys through the TUI by keys alone, on a deterministic fixture store (synthetic test data)."""

import sqlite3

import pytest
from tui_fixture import T0, build_store
from tui_helpers import screen_text

from kforge_tui.app import KforgeApp


@pytest.fixture
def store(tmp_path):
    db = tmp_path / "ws" / "kforge.db"
    ids = build_store(db)
    return db, ids


def make_app(db, run_id, **kw):
    return KforgeApp(db, run_id, refresh_s=0, clock=lambda: T0, **kw)


async def settle(pilot, *keys):
    for k in keys:
        await pilot.press(k)
        await pilot.pause(0.05)
    await pilot.pause(0.1)


async def until(pilot, ready, seconds: float = 10.0) -> bool:
    """Pause until `ready()` holds (a loaded machine can take a while to mount a screen); False on timeout."""
    for _ in range(int(seconds / 0.05)):
        if ready():
            return True
        await pilot.pause(0.05)
    return ready()


def controls(db):
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT run_id, command, card_id, args FROM controls ORDER BY seq").fetchall()


async def test_open_cards_tree_failed_node_compile_log(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        assert "evaluating" in screen_text(app) and "proposer calls in flight" in screen_text(app)
        await settle(pilot, "c")
        text = screen_text(app)
        assert "native_group_norm" in text and "sorted by share" in text
        await settle(pilot, "enter")  # top card by share: its search tree
        assert type(app.screen).__name__ == "TreeScreen"
        seen = []
        for _ in range(20):  # walk failed nodes with 'n' until a compile failure is under the cursor
            await settle(pilot, "n")
            cur = app.screen.current()
            seen.append(cur)
            if app.screen.rows[cur].category == "compile":
                break
        assert app.screen.rows[cur].category == "compile", seen
        assert cur in screen_text(app)  # the path to it was expanded
        await settle(pilot, "enter")
        text = screen_text(app)
        assert cur in text and "compile" in text
        # A compile failure opens on its log; '4' selects the log tab explicitly as well.
        await settle(pilot, "1", "4")
        assert 'identifier "blockDim_x" is undefined' in screen_text(app)
        await settle(pilot, "escape", "escape")
        assert type(app.screen).__name__ == "CardsScreen"


async def test_detail_tabs_show_source_verification_and_prompt(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        app.open_candidate(ids["failed"]["mismatch"])
        await settle(pilot)
        text = screen_text(app)
        assert "max abs err" in text and "(0, 3, 17, 5)" in text  # opens on the verification report
        await settle(pilot, "1")
        assert "__global__" in screen_text(app) and "highlighting:" in screen_text(app)
        await settle(pilot, "8")
        assert "Write a faster CUDA kernel" in screen_text(app)


async def test_tree_jumps_to_best_node(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        app.open_tree("card-0003")
        await settle(pilot, "b")
        best = app.model.cards["card-0003"].best_id
        assert app.screen.current() == best
        assert best in screen_text(app)


async def test_failures_filtered_by_category(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(pilot, "f")
        assert "all 40" in screen_text(app)
        for _ in range(10):
            if app.screen.category == "timeout":
                break
            await settle(pilot, "right_square_bracket")
        assert app.screen.category == "timeout"
        rows = [line for line in screen_text(app).splitlines() if "cand-" in line]
        assert rows and all("timeout" in line for line in rows)
        await settle(pilot, "enter")
        assert "no answer from the lane" in screen_text(app)
        # What the category means, in words, under the error (from engine.outcomes).
        assert "timeout: it did not finish in time" in screen_text(app)


async def test_cards_filter_and_sort(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot, "c", "slash", *"gelu", "enter")
        text = screen_text(app)
        assert "gelu" in text and "native_group_norm" not in text and "1 of 6 cards" in text
        await settle(pilot, "escape", "s")
        assert "sorted by eager µs" in screen_text(app)


async def test_compare_two_runs(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1], compare_runs=ids["runs"], start_mode="compare")
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "run-fixture0" in text and "run-fixture1" in text
        assert "builtin" in text and "anthropic" in text
        assert "failed: compile" in text and "best native_group_norm" in text


async def test_compare_marks_a_dry_run(store):
    # `compare --plain` said "done, dry run"; the TUI's compare said "done", with "verified 0 (0%)" below it.
    db, ids = store
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET config = json_set(config, '$.dry_run', json('true')) WHERE id = ?",
                     (ids["runs"][0],))
        status = conn.execute("SELECT status FROM runs WHERE id = ?", (ids["runs"][0],)).fetchone()[0]
    app = make_app(db, ids["runs"][-1], compare_runs=ids["runs"], start_mode="compare")
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert text.count(", dry run") == 1 and f"{status}, dry run" in text, text
        # Each cell whole: the columns kept the run id's width, cutting these until the terminal was resized.
        tokens = next(line for line in text.splitlines() if line.lstrip().startswith("tokens"))
        assert tokens.rstrip().endswith(" out"), tokens


async def test_control_rows_written(store):
    db, ids = store
    run = ids["runs"][-1]
    app = make_app(db, run)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, "p", "r")
        await settle(pilot, "X", "n")  # declined: nothing sent
        await settle(pilot, "X", "y")
        await settle(pilot, "c", "exclamation_mark")
    rows = controls(db)
    assert [r[1] for r in rows] == ["pause", "resume", "stop", "prioritize"]
    assert all(r[0] == run for r in rows)
    assert rows[3][2] == "card-0000" and '"factor"' in rows[3][3]


async def test_finished_run_and_read_only_session_write_nothing(store):
    db, ids = store
    async with make_app(db, ids["runs"][0]).run_test() as pilot:  # a finished run
        await settle(pilot, "p")
    async with make_app(db, ids["runs"][-1], read_only=True).run_test() as pilot:  # the demo
        await settle(pilot, "p")
        assert any("read-only" in str(n.message) for n in pilot.app._notifications)
    assert controls(db) == []


async def test_keymap_override_and_palette(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1], keymap={"app.pause": "P"})
    async with app.run_test() as pilot:
        await settle(pilot, "p")
        assert controls(db) == []
        await settle(pilot, "P")
        assert [r[1] for r in controls(db)] == ["pause"]
        app.open_tree("card-0000")
        await settle(pilot)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert any(t.startswith("Next failed") for t in titles)
        assert any(t.startswith("Pause [P]") for t in titles)


async def test_themes_load_and_switch(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1], theme="kforge-high-contrast")
    async with app.run_test() as pilot:
        await settle(pilot)
        names = set(app.available_themes)
        assert {"kforge-dark", "kforge-light", "kforge-high-contrast"} <= names
        assert app.theme == "kforge-high-contrast"
        await settle(pilot, "T")
        assert app.theme != "kforge-high-contrast"


async def test_latency_screen(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, "c", "l")
        text = screen_text(app)
        assert "latency" in text and "verified" in text and "best" in text


async def test_stop_dialog_shows_the_keys_it_asks_for(store):
    # "[y]es / [n]o" was read as Rich markup and shown as "es / o".
    db, ids = store
    async with make_app(db, ids["runs"][-1]).run_test(size=(120, 30)) as pilot:
        await settle(pilot, "X")
        text = screen_text(pilot.app)
        assert "[y]es / [n]o" in text, text
        await settle(pilot, "n")


# ---- 80×24, the smallest terminal we support (issue 25) -------------------------------------------------


async def test_tree_arrows_expand_and_collapse_without_scrolling_at_80(store):
    # At 80 columns the root label overflowed and → / ← scrolled the tree sideways instead.
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, "c", "enter")
        tree = app.screen.query_one("#tree")
        assert tree.max_scroll_x == 0
        first = app.screen.tnodes[app.screen.kids["__root__"][0]]
        await settle(pilot, "right")  # the root is open: → moves into it
        assert tree.cursor_node is first and not first.is_expanded
        await settle(pilot, "right")  # a closed node: → opens it
        assert first.is_expanded and tree.scroll_x == 0
        await settle(pilot, "right")  # an open node: → moves to its first child
        assert tree.cursor_node is first.children[0]
        await settle(pilot, "left")  # a leaf: ← goes to the parent
        assert tree.cursor_node is first
        await settle(pilot, "left")  # an open node: ← closes it
        assert not first.is_expanded and tree.scroll_x == 0
        tree.root.set_label("aten::op " + "f16[8,512,64,64] " * 8)  # a signature wider than the screen
        await settle(pilot)
        assert tree.max_scroll_x == 0
        assert any(line.endswith("…") and "aten::op" in line for line in screen_text(app).splitlines())


async def test_tree_legend_and_what_a_node_changed_at_80(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, "c", "enter", "b")
        text = screen_text(app)
        assert "vN: N finished tries in this subtree" in text and "[N]: N children" in text
        best = app.screen.current()
        parent = app.screen.rows[best].parent_id
        assert f"{best} vs {parent}: intent: variant" in text


def test_change_vs_parent_lists_the_params_that_differ():
    from kforge_tui.readmodel import describe_change

    assert describe_change({"vec": 8, "unroll": 4}, '{"vec": 8, "unroll": 2}', "x", True) == "unroll 2→4"
    assert describe_change({"vec": 8}, None, "", False) == "root: vec 8"
    assert describe_change(None, None, "tile the reduction", True) == "intent: tile the reduction"


@pytest.mark.parametrize("keys", [(), ("c",), ("c", "enter"), ("f",), ("m",)])
async def test_footer_keeps_help_theme_and_quit_at_80(store, keys):
    db, ids = store
    app = make_app(db, ids["runs"][-1], compare_runs=ids["runs"])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, *keys)
        await pilot.pause(0.2)  # the footer composes once the screen's bindings are known
        footer = screen_text(app).splitlines()[23]
        assert "? Help" in footer and "T Theme" in footer and "q Quit" in footer, footer


async def test_question_mark_lists_every_key_of_the_screen_at_80(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, "c", "enter", "question_mark")
        text = screen_text(app)
        # Keys the footer has no room for, the tree's hidden ones included.
        for what in ("Next failed", "Prev failed", "Expand", "Collapse", "Stop run", "Theme"):
            assert what in text, what
        await settle(pilot, "question_mark")
        assert type(app.screen).__name__ == "TreeScreen"


@pytest.mark.parametrize("keys", [(), ("c",), ("c", "enter"), ("candidate",), ("f",), ("g",), ("m",), ("e",)],
                         ids=["overview", "cards", "tree", "candidate", "failures", "charts", "compare", "exports"])
async def test_question_mark_shows_every_key_of_each_screen_without_scrolling_at_80(store, keys):
    from kforge_tui.screens.help import HelpScreen, key_rows

    db, ids = store
    app = make_app(db, ids["runs"][-1], compare_runs=ids["runs"])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        if keys == ("candidate",):
            app.open_candidate(ids["failed"]["mismatch"])
            assert await until(pilot, lambda: type(app.screen).__name__ == "CandidateScreen")
        else:
            await settle(pilot, *keys)
        under = app.screen
        await settle(pilot, "question_mark")
        assert await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.pause(0.2)
        text = " ".join(screen_text(app).split())
        words = set(text.split())
        for key, what, _ in key_rows(under):  # each key and what it does, on screen at once
            assert key in text, (key, screen_text(app))
            # Words, not the phrase: a phrase wraps inside its column of a two-column help.
            assert set(what.split()) <= words, (what, screen_text(app))
        assert app.screen.query_one("#help").max_scroll_y == 0  # nothing below the box's edge


async def test_palette_lists_each_command_once(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(80, 24)) as pilot:
        for keys in ((), ("c",), ("enter",)):
            await settle(pilot, *keys)
            names = [c.title.replace("\\[", "[").split(" [")[0].lower() for c in app.get_system_commands(app.screen)]
            assert len(names) == len(set(names)), names
            assert "quit" in names and "slash" not in " ".join(names)


async def test_cards_show_speedup_and_status_without_scrolling_at_80(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, "c")
        header = next(line for line in screen_text(app).splitlines() if line.strip().startswith("op "))
        for col in ("speedup", "status", "best µs"):
            assert col in header, header


async def test_candidate_shows_the_full_signature_at_80(store):
    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        cid = ids["failed"]["mismatch"]
        card = app.model.cards[app.model.candidate(cid).row["card_id"]]
        app.open_candidate(cid)
        from kforge_tui.screens.candidate import CandidateScreen

        def mounted() -> bool:  # the screen's own set-up done: its initial tab shown and its text focused
            if not isinstance(app.screen, CandidateScreen) or not app.screen.query("#tabs"):
                return False
            active = app.screen.query_one("#tabs").active
            return bool(active) and app.focused is not None and app.focused.id == f"scroll-{active}"

        assert await until(pilot, mounted)
        await settle(pilot, "1")
        want = f"signature {card.op} {card.signature}"
        await until(pilot, lambda: want in " ".join(screen_text(app).split()))
        flat = " ".join(screen_text(app).split())
        assert want in flat


@pytest.mark.parametrize("keys", [("c",), ("c", "enter"), ("f",)])
async def test_header_shows_the_runs_status_and_read_only_at_80(store, keys):
    # The run's status and that this session sends no controls, on screens other than the overview too
    # (the header used to end '… · sd35_medium · builtin · runn…' at 80 columns).
    db, ids = store
    conn = sqlite3.connect(db)  # a real run has no label (the fixture's says it is synthetic)
    conn.execute("UPDATE runs SET config = '{\"iterations\": 14}' WHERE id = ?", (ids["runs"][-1],))
    conn.commit()
    conn.close()
    app = make_app(db, ids["runs"][-1], read_only=True, note="demo (read-only)")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, *keys)
        header = screen_text(app).splitlines()[0]
        assert "running" in header and "demo (read-only)" in header, header


async def test_a_finished_run_that_searched_nothing_reads_done(tmp_path):
    # A run whose every card was declined read "done 0/1" with its bar at 0 % (found on unseen models' dry runs).
    db = tmp_path / "ws" / "kforge.db"
    ids = build_store(db, per_card=0, status="done", runs=1)
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "done 0/0: 0 ok, 0 failed" in text and "100%" in text, text


async def test_a_card_the_run_is_done_with_says_why_it_has_no_verified_node(tmp_path):
    # A declined card's tree read "no verified node yet", as if more might come.
    db = tmp_path / "ws" / "kforge.db"
    ids = build_store(db, per_card=0, status="done", runs=1)
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(140, 30)) as pilot:
        await settle(pilot, "c", "enter")
        assert type(app.screen).__name__ == "TreeScreen"
        text = screen_text(app)
        assert "no verified node (" in text and "no verified node yet" not in text, text


async def test_stop_on_a_finished_run_says_so_without_asking_first(tmp_path):
    # `X` on a finished run asked "Stop run …? [y]es / [n]o" and only after `y` said there was nothing to stop.
    db = tmp_path / "ws" / "kforge.db"
    ids = build_store(db, status="done", runs=1)
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot, "X")
        assert type(app.screen).__name__ != "ConfirmScreen"
        assert any("is done: nothing to stop" in str(n.message) for n in app._notifications)
        assert controls(db) == []


async def test_a_runs_note_is_wrapped_to_the_terminal_not_to_40_columns(tmp_path):
    # On the overview's first draw the event log has no width yet, and a run's note ("nothing proposed: ...") was
    # wrapped to about 31 characters a line on a 160-column terminal.
    import json

    db = tmp_path / "ws" / "kforge.db"
    ids = build_store(db, status="done", runs=1)
    note = ("nothing proposed: of 2 card(s), 2 declined (the proposer has nothing for this op); "
            "give --provider anthropic or openai for an LLM to write them")
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO events (run_id, ts, kind, card_id, payload) VALUES (?, ?, 'run_note', NULL, ?)",
                     (ids["runs"][-1], T0 - 2, json.dumps({"message": note})))
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(160, 40)) as pilot:
        await settle(pilot)
        assert "nothing proposed: of 2 card(s), 2 declined (the proposer has nothing for this op);" in \
            screen_text(app)


async def test_the_event_log_says_what_each_card_is(tmp_path):
    # The log named cards by their hash alone ("card_done efa47f0f2c61f449 reason=iterations").
    db = tmp_path / "ws" / "kforge.db"
    ids = build_store(db, status="done", runs=1)
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(160, 60)) as pilot:
        await settle(pilot)
        lines = [ln for ln in screen_text(app).splitlines() if "card_done" in ln]
        assert lines, screen_text(app)
        named = {f"{c.card_id[:8]} {c.label} " for c in app.model.cards.values()}
        assert all(any(n in ln for n in named) for ln in lines), lines


async def test_focus_moves_keep_the_footer_and_a_new_key_rebuilds_it(store):
    """The footer is rebuilt only when the keys it shows change: Textual's own rebuilt its key widgets on every
    focus change, key press and screen switch, about a third of the TUI's CPU."""
    from textual.widgets._footer import FooterKey

    db, ids = store
    app = make_app(db, ids["runs"][-1])
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.pause(0.2)  # the footer composes once the screen's bindings are known
        footer = screen_text(app).splitlines()[29]
        assert "p Pause" in footer, footer
        keys = list(app.screen.query(FooterKey))
        assert keys
        focused = app.focused
        await settle(pilot, "tab", "tab", "tab")  # focus moves through the screen: the same keys, the same widgets
        assert app.focused is not focused or len(app.screen.focus_chain) < 2
        assert list(app.screen.query(FooterKey)) == keys and all(k.is_attached for k in keys)
        app.update_keymap({"app.pause": "P"})  # a key changed: the footer shows it
        await settle(pilot)
        await pilot.pause(0.2)
        footer = screen_text(app).splitlines()[29]
        assert "P Paus" in footer and "p Pause" not in footer, footer
        assert list(app.screen.query(FooterKey)) != keys
