"""A workspace this user cannot write (another user's, a read-only mount, an archived run) opens in the TUI
and in `runs`, read-only: its WAL database is read without the -shm file SQLite cannot create there
(issue 25, bug 8). As root, permissions do not stop writes, so the folder is mounted read-only in a
private mount namespace (unshare); as another user, it is chmod'ed."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tui_fixture import build_store

ROOT = Path(__file__).resolve().parents[1]

# Runs in the read-only folder: the TUI as `kforge-tui --workspace WS` opens it, its first screen drawn
# headless at 80x24 and printed, then a press of `p` (pause), which a read-only session cannot send.
_OPEN_TUI = textwrap.dedent("""
    import asyncio, os, sys
    sys.path[:0] = [{root!r}, {tests!r}]
    os.environ["KFORGE_FORCE_TUI"] = "1"
    from kforge_tui.app import KforgeApp
    from tui_helpers import screen_text

    def run(self):
        async def drive():
            async with self.run_test(size=(80, 24)) as pilot:
                await pilot.pause(0.5)
                print(screen_text(self))
                await pilot.press("p")
                await pilot.pause(0.2)
                print("NOTES:", " | ".join(str(n.message) for n in self._notifications))
        asyncio.run(drive())

    KforgeApp.run = run
    from kforge_tui.cli import main
    sys.exit(main(["--workspace", sys.argv[1], *sys.argv[2:]]))
""")


def _read_only(ws: Path, argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(ws.parent / "home")}
    if os.geteuid() != 0:
        for p in (ws, *ws.rglob("*")):
            p.chmod(p.stat().st_mode & ~0o222)
        cmd = argv
    else:
        if not shutil.which("unshare"):
            pytest.skip("root without unshare: no way to make a folder read-only")
        probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
        if probe.returncode != 0:
            pytest.skip(f"unshare -m not permitted here: {probe.stderr.decode().strip()}")
        q = str(ws)
        mount = f"mount --bind {q} {q} && mount -o remount,bind,ro {q} {q} && exec \"$@\""
        cmd = ["unshare", "-m", "sh", "-c", mount, "sh", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def ws(tmp_path):
    ws = tmp_path / "ws"
    ids = build_store(ws / "kforge.db")  # its latest run still running (another user's)
    conn = sqlite3.connect(ws / "kforge.db")  # what an engine leaves: a WAL database, no -wal / -shm files
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    assert not (ws / "kforge.db-shm").exists()
    return ws, ids


def test_runs_lists_a_read_only_workspace(ws):
    ws, ids = ws
    r = _read_only(ws, [sys.executable, "-m", "kforge_tui", "--workspace", str(ws), "runs"])
    assert r.returncode == 0, r.stderr
    assert ids["runs"][0] in r.stdout and ids["runs"][-1] in r.stdout
    assert not (ws / "kforge.db-shm").exists()


def test_the_tui_opens_a_read_only_workspace_and_says_controls_are_not_sent(ws, tmp_path):
    ws, ids = ws
    script = tmp_path / "open_tui.py"
    script.write_text(_OPEN_TUI.format(root=str(ROOT), tests=str(ROOT / "tests")))
    r = _read_only(ws, [sys.executable, str(script), str(ws)])
    assert r.returncode == 0, (r.stdout, r.stderr)
    screen, notes = r.stdout.split("NOTES:")
    assert ids["runs"][-1] in screen, screen
    assert "read-only (read-only workspace)" in notes, notes
