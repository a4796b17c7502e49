"""The TUI's commands: bad input is one line and exit 2; the detached engine gets the right argv;
the demo opens from a temporary copy; the TUI imports no GPU code."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CONFIGS, ROOT
from tui_fixture import build_store


def one_line(code, out, err, *needles):
    assert code == 2, (code, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]


def test_no_workspace_says_how_to_start(cli, tmp_path):
    one_line(*cli("--workspace", tmp_path / "nothing"), "kforge-tui run CONFIG")


def test_workspace_without_runs(cli, tmp_path):
    import sqlite3

    from tui_fixture import create_schema

    (tmp_path / "ws").mkdir()
    conn = sqlite3.connect(tmp_path / "ws" / "kforge.db")
    create_schema(conn)
    conn.commit()
    conn.close()
    one_line(*cli("--workspace", tmp_path / "ws"), "no runs", "kforge-tui run CONFIG")


def test_attaching_while_the_first_capture_runs_says_so(cli, tmp_path):
    # A detached run's first capture can take minutes before its run row exists: attaching then must not
    # tell the user to start a (second) run.
    import sqlite3

    from tui_fixture import create_schema

    ws = tmp_path / "ws"
    (ws / "samples" / ".partial-sd35-20261201-1").mkdir(parents=True)
    (ws / "logs").mkdir()
    (ws / "logs" / "engine-20261201-160000.log").write_text("capturing\n")
    conn = sqlite3.connect(ws / "kforge.db")
    create_schema(conn)
    conn.commit()
    conn.close()
    one_line(*cli("--workspace", ws), "a capture is in progress", "engine-20261201-160000.log",
             f"kforge-tui --workspace {ws}")


def test_the_attach_hint_names_the_workspace(tmp_path, monkeypatch):
    from kforge_tui.launcher import attach_command

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KFORGE_HOME", raising=False)
    assert attach_command(tmp_path / ".kforge") == "kforge-tui"  # the default: nothing to add
    assert attach_command(tmp_path / "elsewhere") == f"kforge-tui --workspace {tmp_path / 'elsewhere'}"


def test_compare_unknown_run_and_bad_theme(cli, tmp_path):
    build_store(tmp_path / "ws" / "kforge.db")
    one_line(*cli("compare", "run-fixture0", "run-nope", "--workspace", tmp_path / "ws"), "run-nope")
    one_line(*cli("--theme", "paisley", "--workspace", tmp_path / "ws"), "--theme paisley")
    one_line(*cli("--run", "run-zzz", "--workspace", tmp_path / "ws"), "--run run-zzz")


def test_bad_keymap_is_one_line(cli, tmp_path):
    build_store(tmp_path / "ws" / "kforge.db")
    km = tmp_path / "tui.toml"
    km.write_text('[keymap]\n"app.nonsense" = "z"\n')
    one_line(*cli("--keymap", km, "--workspace", tmp_path / "ws"), "app.nonsense")


def test_detached_engine_argv_is_headless_run_in_same_workspace(tmp_path):
    from kforge_tui.launcher import engine_argv

    args = argparse.Namespace(config="configs/models/resnet50.toml", provider="builtin", iterations=5,
                              strategy="mcts", wall_time=None, max_proposals=None, resume=None, device=None,
                              dry_run=True, small=False)
    argv = engine_argv(args, tmp_path)
    assert argv[1:4] == ["-m", "kforge_tui", "run"]
    assert "--no-tui" in argv and argv[-2:] == ["--workspace", str(tmp_path)]
    assert argv[argv.index("--iterations") + 1] == "5" and "--dry-run" in argv and "--small" not in argv


def test_run_detached_reports_an_engine_that_dies(cli, tmp_path, monkeypatch):
    # A config whose builder cannot be imported (found only when the engine captures): the detached engine
    # exits 2 before creating a run; we say so. (A config that does not exist is refused before the engine.)
    monkeypatch.setenv("KFORGE_FORCE_TUI", "1")  # as from a terminal (pytest's stdout is not one)
    config = tmp_path / "broken.toml"
    config.write_text('name = "broken"\nbuilder = "kforge_no_such_module:build"\n')
    code, out, err = cli("run", config, "--workspace", tmp_path / "ws")
    assert code == 2 and "before its run started" in err and "log:" in err


def test_demo_opens_a_readonly_copy(tmp_path):
    from kforge_tui.launcher import DEMO_DB, demo_copy
    from kforge_tui.readmodel import ReadModel

    before = DEMO_DB.read_bytes()
    copy = demo_copy()
    assert copy != DEMO_DB and copy.read_bytes() == before
    model = ReadModel(copy)
    runs = model.runs()
    assert runs, "the demo database holds a run"
    snap = model.poll(runs[0].id)
    assert snap.stats.candidates > 0 and model.cards
    model.close()


async def test_demo_app_runs_on_the_packaged_db():
    from tui_helpers import screen_text

    from kforge_tui.app import KforgeApp
    from kforge_tui.launcher import demo_copy
    from kforge_tui.readmodel import ReadModel

    db = demo_copy()
    run = ReadModel(db).runs()[0]
    app = KforgeApp(db, run.id, read_only=True, refresh_s=0, note="demo (read-only)")
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause(0.1)
        assert run.id in screen_text(app)
        await pilot.press("c")
        await pilot.pause(0.1)
        assert "cards" in screen_text(app)


PROBE = r"""
import sys
import kforge_tui.app, kforge_tui.launcher, kforge_tui.readmodel, kforge_tui.highlight
import kforge_tui.screens.overview, kforge_tui.screens.cards, kforge_tui.screens.tree
import kforge_tui.screens.candidate, kforge_tui.screens.failures, kforge_tui.screens.compare
import kforge_tui.screens.latency
kforge_tui.highlight.highlight_cuda('__global__ void k() {}')
bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'cuda', 'triton')
             or m.startswith(('engine.lane', 'engine.compile', 'engine.bench', 'engine.verify', 'engine.capture',
                              'engine.run', 'engine.propose')))
print('GPU:', bad)
"""


def test_tui_imports_no_gpu_code():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "GPU: []" in proc.stdout, proc.stdout


def test_headless_cli_help_does_not_import_textual():
    code = ("import sys, kforge_tui.cli\n"
            "try:\n    kforge_tui.cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('TEXTUAL:', sorted(m for m in sys.modules if m.startswith('textual')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "TEXTUAL: []" in proc.stdout, proc.stdout + proc.stderr
    assert "demo" in proc.stdout and "serve" in proc.stdout and "compare" in proc.stdout


def test_without_a_terminal_run_goes_headless_and_the_tui_says_it_needs_one(cli, tmp_path):
    # A pipe or a cron job: `run CONFIG` runs in the foreground instead of drawing a full-screen app.
    code, out, err = cli("run", CONFIGS / "examples" / "my_model.toml", "--small", "--dry-run", "--iterations",
                         "1", "--workspace", tmp_path)
    assert code == 0, err
    assert "not a terminal; running headless" in err and "stopped by iterations" in out
    # Opening the TUI on that workspace without a terminal is refused in one line.
    code, out, err = cli("--workspace", tmp_path)
    assert code == 2 and out == "" and err.count("\n") == 1 and "needs a terminal" in err


def _run_parser():
    from engine.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["run"]


def _viewer_dests() -> set[str]:
    from engine.cli import _add_tui

    viewer = argparse.ArgumentParser(add_help=False)
    _add_tui(viewer)
    return {a.dest for a in viewer._actions}


# Every option of `run` that the engine itself reads, straight from the parser: a new one is covered here
# without editing this test (the TUI's own display options, --workspace and --no-tui are the launcher's).
ENGINE_RUN_OPTIONS = [a for a in _run_parser()._actions if a.option_strings
                      and a.dest not in _viewer_dests() | {"help", "workspace", "no_tui"}]


def _example_value(action: argparse.Action) -> str:
    """A value the option accepts: its last choice, else the first of a few its type takes."""
    if action.choices:
        return str(list(action.choices)[-1])
    for value in ("7", "2.5", "some-value", "http://localhost:8000/v1"):
        try:
            (action.type or str)(value)
            return value
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            continue
    raise AssertionError(f"no example value for {action.option_strings}")


@pytest.mark.parametrize("action", ENGINE_RUN_OPTIONS, ids=lambda a: a.option_strings[-1])
def test_every_run_option_given_to_the_tui_reaches_the_detached_engine(action, tmp_path):
    from engine.cli import build_parser
    from kforge_tui.launcher import engine_argv

    given = [action.option_strings[-1]] + ([] if action.nargs == 0 else [_example_value(action)])
    config = [] if action.dest == "resume" else ["configs/models/resnet50.toml"]  # one or the other
    args = build_parser().parse_args(["run", *config, *given, "--theme", "kforge-light"])
    argv = engine_argv(args, tmp_path)
    assert argv[1:4] == ["-m", "kforge_tui", "run"]
    again = build_parser().parse_args(argv[3:])
    assert getattr(again, action.dest) == getattr(args, action.dest), argv
    assert again.no_tui and again.workspace == str(tmp_path)
    assert "--theme" not in argv, "the TUI's display options stay with the TUI"
    assert action.dest == "resume" or Path(again.config).name == "resnet50.toml"


# ---- a workspace database that cannot be opened: one line naming the file, exit 2 -------------------------


def _damaged(tmp_path, kind):
    ws = tmp_path / "ws"
    ws.mkdir()
    db = ws / "kforge.db"
    if kind == "random":
        db.write_bytes(bytes(range(256)) * 64)  # not an SQLite header at all
    elif kind == "truncated":
        build_store(tmp_path / "good" / "kforge.db")
        good = (tmp_path / "good" / "kforge.db")
        import sqlite3

        with sqlite3.connect(good) as conn:  # fold the WAL in, so the file alone holds the database
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.write_bytes(good.read_bytes()[:20_000])  # a copy cut short
    else:  # written by a newer Kernel Forge
        import sqlite3

        from engine.store import latest_version

        conn = sqlite3.connect(db)
        conn.execute(f"PRAGMA user_version = {latest_version() + 5}")
        conn.close()
    return ws, db


@pytest.mark.parametrize("kind", ["random", "truncated", "newer"])
@pytest.mark.parametrize("command", [[], ["compare", "run-a", "run-b"], ["--run", "run-a"]],
                         ids=["tui", "compare", "run"])
def test_unusable_database_is_one_line_naming_the_file(cli, tmp_path, monkeypatch, kind, command):
    monkeypatch.setenv("KFORGE_FORCE_TUI", "1")  # as from a terminal: the database is opened, not the check
    ws, db = _damaged(tmp_path, kind)
    fix = "upgrade kernel-forge" if kind == "newer" else "move it aside"
    one_line(*cli(*command, "--workspace", ws), str(db), fix, "--workspace")


@pytest.mark.parametrize("kind", ["random", "truncated"])
def test_capture_and_run_on_a_damaged_database_name_the_file(cli, tmp_path, kind):
    ws, db = _damaged(tmp_path, kind)
    one_line(*cli("capture", CONFIGS / "examples" / "my_model.toml", "--small", "--device", "cpu",
                  "--workspace", ws), str(db), "move it aside")
    one_line(*cli("run", CONFIGS / "examples" / "my_model.toml", "--small", "--dry-run", "--iterations", "1",
                  "--no-tui", "--workspace", ws), str(db), "move it aside")


def _scrambled(tmp_path) -> tuple[Path, Path, str]:
    """A workspace whose database has an intact header, size and schema, and the root page of each table and index
    zeroed (a torn write): it opens, and only a statement that reads a table sees the damage. (Zeroed, not scrambled:
    SQLite names a zero page type at once, where random bytes may look like a page and send it astray.)"""
    import sqlite3

    ws = tmp_path / "ws"
    ids = build_store(ws / "kforge.db")
    db = ws / "kforge.db"
    with sqlite3.connect(db) as conn:  # the WAL folded in: the file alone holds the database
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        roots = [r for (r,) in conn.execute("SELECT rootpage FROM sqlite_master WHERE rootpage > 1")]
    data = bytearray(db.read_bytes())
    for page in roots:
        data[(page - 1) * size:page * size] = bytes(size)
    db.write_bytes(bytes(data))
    for extra in ("kforge.db-wal", "kforge.db-shm"):
        (ws / extra).unlink(missing_ok=True)
    return ws, db, ids["runs"][-1]


@pytest.mark.parametrize("command", [
    ["runs"], ["prune"], ["compare", "run-fixture0", "--plain"], ["export", "RUN", "--out", "OUT"],
    ["run", "--resume", "RUN", "--no-tui", "--dry-run"],
    ["capture", CONFIGS / "examples" / "my_model.toml", "--small", "--device", "cpu"],
    ["run", CONFIGS / "examples" / "my_model.toml", "--small", "--dry-run", "--iterations", "1", "--no-tui"],
], ids=["runs", "prune", "compare", "export", "resume", "capture", "run"])
def test_a_database_damaged_past_its_header_is_one_line_for_every_command(cli, tmp_path, command):
    # Only runs and compare said so; prune, capture, run, run --resume and export said "internal error:
    # DatabaseError: database disk image is malformed", exit 1.
    ws, db, run_id = _scrambled(tmp_path)
    argv = [{"RUN": run_id, "OUT": tmp_path / "x.cast"}.get(a, a) for a in command]
    one_line(*cli(*argv, "--workspace", ws), str(db), "is not a valid SQLite database", "move it aside")
    samples = ws / "samples"
    assert not samples.is_dir() or not any(samples.iterdir()), "a capture that could not be stored keeps no samples"


@pytest.mark.parametrize("command", [["runs"], ["prune"], ["compare", "run-a", "--plain"]])
def test_an_empty_database_file_is_one_line_naming_it(cli, tmp_path, command):
    # A 0-byte kforge.db (a crash or a full disk as it was made): `runs` said "internal error: OperationalError:
    # no such table: runs".
    (tmp_path / "ws").mkdir()
    db = tmp_path / "ws" / "kforge.db"
    db.write_bytes(b"")
    one_line(*cli(*command, "--workspace", tmp_path / "ws"), str(db), "holds no tables", "move it aside")


def test_a_table_damaged_after_the_header_closes_the_app_with_one_line(cli, tmp_path, monkeypatch):
    # The launcher's first reads succeed; the app's first poll meets the damage: it exits 2, no traceback.
    import sqlite3

    monkeypatch.setenv("KFORGE_FORCE_TUI", "1")
    ids = build_store(tmp_path / "ws" / "kforge.db")
    from kforge_tui.readmodel import ReadModel

    def damaged_poll(self, run_id):
        raise sqlite3.DatabaseError("database disk image is malformed")

    monkeypatch.setattr(ReadModel, "poll", damaged_poll)
    db = tmp_path / "ws" / "kforge.db"
    one_line(*cli("--run", ids["runs"][-1], "--workspace", tmp_path / "ws"), str(db), "move it aside")


# ---- --color-system: every choice the parser offers opens the app ------------------------------------------


def _color_choices():
    from engine.cli import COLOR_SYSTEMS

    return COLOR_SYSTEMS


@pytest.mark.parametrize("choice", _color_choices())
def test_every_color_system_choice_creates_the_app(cli, tmp_path, monkeypatch, choice):
    from rich.console import Console

    from kforge_tui.app import KforgeApp

    monkeypatch.setenv("KFORGE_FORCE_TUI", "1")
    for name in ("TEXTUAL_COLOR_SYSTEM", "NO_COLOR"):  # setenv first: the launcher's writes are undone after
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    build_store(tmp_path / "ws" / "kforge.db")
    seen = {}

    def run(self):  # stands in for the full-screen loop: the app exists, Textual's settings are read
        seen["app"] = self
        import os

        # Textual hands TEXTUAL_COLOR_SYSTEM to Rich's Console: it must be a name Rich knows.
        seen["console"] = Console(color_system=os.environ.get("TEXTUAL_COLOR_SYSTEM", "auto"))

    monkeypatch.setattr(KforgeApp, "run", run)
    code, out, err = cli("--color-system", choice, "--workspace", tmp_path / "ws")
    assert code == 0, err
    assert isinstance(seen["app"], KforgeApp)
    if choice == "none":
        assert seen["app"].no_color  # NO_COLOR: Textual draws in monochrome
    elif choice != "auto":
        assert seen["console"].color_system == choice


def test_unknown_color_system_is_refused_by_the_parser(cli, tmp_path):
    code, out, err = cli("--color-system", "sepia", "--workspace", tmp_path)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--color-system" in err
