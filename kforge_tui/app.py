"""The Kernel Forge TUI: one App, one screen per module, a fixed-rate refresh over a read-only store."""

from __future__ import annotations

import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from textual.app import App, SystemCommand
from textual.markup import escape
from textual.screen import Screen

from engine.errors import KforgeError
from engine.store import is_corruption, unusable_database
from kforge_tui import keymap as keys
from kforge_tui.controls import ControlWriter, ReadOnlyWorkspace
from kforge_tui.readmodel import EventRow, ReadModel, RunInfo, Snapshot
from kforge_tui.themes import DEFAULT_THEME, load_themes


class KforgeApp(App):
    """Watch and steer one run; every screen reads from `self.model` and the latest snapshot."""

    TITLE = "Kernel Forge"
    CSS_PATH = "app.tcss"
    BINDINGS = keys.APP

    def __init__(self, db_file: Path, run_id: str, *, read_only: bool = False, refresh_s: float = 1.0,
                 clock: Callable[[], float] = time.time, compare_runs: Sequence[str] = (),
                 keymap: dict[str, str] | None = None, theme: str | None = None, start_mode: str = "overview",
                 note: str = "", state_file: Path | None = None) -> None:
        super().__init__()
        self.model = ReadModel(db_file)
        self.run_id = run_id
        self.controls = ControlWriter(None if read_only else Path(db_file),
                                      note.removesuffix(" (read-only)") or "demo")
        self.refresh_s = refresh_s
        self.clock = clock
        self.compare_runs = list(compare_runs)
        self.start_mode = start_mode
        self.note = note
        self.events: deque[EventRow] = deque(maxlen=1000)
        self.snapshot: Snapshot | None = None
        self.ticks = 0
        self._polling = False
        self._keymap = keymap or {}
        self.state_file = state_file  # where a theme chosen with T is remembered (None: nowhere)
        self.fatal: KforgeError | None = None  # why the app closed itself; the launcher reports it
        for t in load_themes():
            self.register_theme(t)
        self.theme = theme or DEFAULT_THEME

    # Screens import lazily so startup stays quick.
    MODES = {
        "overview": lambda: _screen("overview", "OverviewScreen"),
        "cards": lambda: _screen("cards", "CardsScreen"),
        "failures": lambda: _screen("failures", "FailuresScreen"),
        "compare": lambda: _screen("compare", "CompareScreen"),
        "charts": lambda: _screen("charts", "RunChartsScreen"),
    }

    @property
    def run_info(self) -> RunInfo:
        assert self.snapshot is not None
        return self.snapshot.run

    def on_mount(self) -> None:
        if self._keymap:
            self.set_keymap(self._keymap)
        try:
            self.poll_now()  # the first screen opens on data, not on an empty frame
        except sqlite3.DatabaseError as e:
            if not is_corruption(e):
                raise
            self.fatal = unusable_database(self.model.db_file, e)
            self.exit(return_code=self.fatal.exit_code)
            return
        self.switch_mode(self.start_mode)
        if self.refresh_s > 0:
            self.set_interval(self.refresh_s, self._tick, name="refresh")

    def on_unmount(self) -> None:
        self.model.close()

    # ---- refresh: one poll per tick in a worker thread, applied in one batch ------------------------------

    def _tick(self) -> None:
        if self._polling:  # a slow disk: skip the tick rather than queue history
            return
        self._polling = True
        self.run_worker(self._poll_in_thread, thread=True, group="poll", exit_on_error=False)

    def _poll_in_thread(self) -> None:
        try:
            snap = self.model.poll(self.run_id)
        except Exception as e:  # the database is briefly locked or gone: say so, keep the last view
            self.call_from_thread(self.notify, f"refresh failed: {e}", severity="warning", timeout=3)
            self._polling = False
            return
        self.call_from_thread(self.apply_snapshot, snap)

    def poll_now(self) -> Snapshot:
        """Poll synchronously (startup, and tests that want the next tick now)."""
        snap = self.model.poll(self.run_id)
        self.apply_snapshot(snap)
        return snap

    def apply_snapshot(self, snap: Snapshot) -> None:
        self._polling = False
        self.snapshot = snap
        self.events.extend(snap.events)
        self.ticks += 1
        self.sub_title = _subtitle(snap.run, self.note)
        screen = self.screen if self.is_mounted(self.screen) else None
        if screen is not None and hasattr(screen, "apply_snapshot"):
            with self.batch_update():
                screen.apply_snapshot(snap)

    def is_mounted(self, screen: Screen | None) -> bool:
        try:
            return screen is not None and screen.is_attached
        except Exception:
            return False

    # ---- actions -------------------------------------------------------------------------------------------

    def action_control(self, command: str, card_id: str | None = None) -> None:
        """Write a control row for the open run (pause, resume, stop, prioritize)."""
        run = self.run_info
        if not run.live:
            self.notify(f"run {run.id} is {run.status}: nothing to {command}", severity="warning")
            return
        try:
            args = {"factor": 10.0} if command == "prioritize" else None
            self.controls.send(run.id, command, card_id, args)
        except ReadOnlyWorkspace as e:
            self.notify(str(e), severity="warning")
            return
        what = f"{command} {card_id}" if card_id else command
        self.notify(f"sent '{what}' to the engine of {run.id}")

    def action_stop_run(self) -> None:
        from kforge_tui.screens.confirm import ConfirmScreen

        if not self.run_info.live:  # a finished run asked "Stop run …? [y]es" first, then said nothing to stop
            self.action_control("stop")
            return

        def done(ok: bool | None) -> None:
            if ok:
                self.action_control("stop")
        self.push_screen(ConfirmScreen(f"Stop run {self.run_info.id}? In-flight work finishes, then the "
                                       "engine exits. [y]es / [n]o"), done)

    def action_next_theme(self) -> None:
        names = [t.name for t in load_themes()]
        self.theme = names[(names.index(self.theme) + 1) % len(names)] if self.theme in names else names[0]
        self.notify(f"theme: {self.theme}")
        if self.state_file is not None:  # the next session starts with it (unless --theme or the config says)
            from kforge_tui.state import remember

            remember(self.state_file, theme=self.theme)

    def open_candidate(self, candidate_id: str) -> None:
        from kforge_tui.screens.candidate import CandidateScreen

        self.push_screen(CandidateScreen(candidate_id))

    def open_tree(self, card_id: str) -> None:
        from kforge_tui.screens.tree import TreeScreen

        self.push_screen(TreeScreen(card_id))

    def open_latency(self, card_id: str) -> None:
        from kforge_tui.screens.latency import LatencyScreen

        self.push_screen(LatencyScreen(card_id))

    def action_toggle_help(self) -> None:
        """Every binding of the current screen, with what it does (Textual's side panel is too narrow
        at 80 columns to read)."""
        from kforge_tui.screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))

    # Textual's own palette entries that one of our bindings already gives (with its key).
    _SUPERSEDED = {"Quit": "app.quit", "Keys": "app.help"}

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Every bound action of the app and the current screen, each once, so the palette lists them all."""
        ours = []
        seen = set()
        for active in screen.active_bindings.values():
            binding = active.binding
            if not binding.id or binding.id in seen:
                continue
            seen.add(binding.id)

            async def run(target=active.node, action=binding.action) -> None:
                await target.run_action(action)
            title = binding.tooltip or binding.description
            # the palette reads a title as markup: `Filter [/]` closed a tag never opened (MarkupError)
            ours.append(SystemCommand(escape(f"{title} [{self.get_key_display(binding)}]"), title, run))
        for command in super().get_system_commands(screen):
            if self._SUPERSEDED.get(command.title) not in seen:
                yield command
        yield from ours


def _screen(module: str, name: str) -> Screen:
    import importlib

    return getattr(importlib.import_module(f"kforge_tui.screens.{module}"), name)()


def _subtitle(run: RunInfo, note: str) -> str:
    """What every screen's header says of the run, most telling first: an 80-column header cuts the end
    (the run id, model and provider are also on the overview's first line)."""
    parts = [run.status]
    if run.label:  # e.g. a stand-in run must never pass for a measurement
        parts.append(run.label)
    if note:  # 'demo (read-only)', 'read-only workspace'
        parts.append(note)
    return " · ".join([*parts, run.id, run.model, run.provider])
