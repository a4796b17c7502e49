"""Progress of long work, on stderr (stdout is reserved for a command's result).

On a terminal: one line per stage (capture, eager timing, lanes, search, export) updated in place by
rich. Elsewhere (a log, a pipe, CI): one JSON line per progress event, never a repeat of the last one.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO

PROGRESS_ENV = "KFORGE_PROGRESS"  # "1": progress lines on stderr even where it is not a terminal (a log)


def search_bar(cards: Iterable[tuple[int, bool]], iterations_per_card: int) -> tuple[int, int]:
    """The search's bar as (used, total) over the searched cards, each given as (iterations it used, whether it
    may still use more). A card that may go on may use its whole budget; one that is finished or has nothing
    left to try only what it used, so a card that ends early takes its unused iterations off the total and the
    bar reaches its end with the last card instead of jumping there when the run ends. `run --no-tui`'s bar
    (engine.run.report.search_progress) and the TUI overview's (kforge_tui.readmodel) both count so."""
    used = total = 0
    for n, going in cards:
        used += n
        total += max(n, iterations_per_card) if going else n
    return used, max(1, total)


def stderr_progress() -> Callable[[str], None]:
    """Progress lines on stderr when it is a terminal, or when KFORGE_PROGRESS=1 asks for them in a log
    (scripts/reproduce.py does: an export stopped by its time limit then says how far it got).

    Otherwise redirected stderr gets only errors and warnings, so a failure is exactly one line there.
    """
    tty = sys.stderr.isatty()
    if not tty and os.environ.get(PROGRESS_ENV) != "1":
        return lambda msg: None
    t0 = time.monotonic()

    def show(msg: str) -> None:
        # In a log each line says when it came (seconds since the command began): where an export's time went
        # (the SD3.5 VAE's stopped at 495 s on an H100, 2026-12-05g, with no way to tell which step took it).
        when = "" if tty else f"+{time.monotonic() - t0:.0f}s "
        print(f"kforge: {when}{msg}", file=sys.stderr, flush=True)
    return show


class StageProgress:
    """Stages of one command. `stage(name, msg)` starts or updates a stage, `update` sets its counts,
    `done` closes it; `close()` ends the display. `json_lines=None`: JSON unless `stream` is a terminal."""

    def __init__(self, stream: TextIO | None = None, json_lines: bool | None = None):
        self.stream = stream or sys.stderr
        self.json_lines = (not _isatty(self.stream)) if json_lines is None else json_lines
        self._last_line: str | None = None
        self._rich: Any = None
        self._tasks: dict[str, Any] = {}

    # -- the one place that writes ---------------------------------------------------------------------

    def emit(self, event: str, **fields: Any) -> None:
        """One JSON line (JSON mode only); an event equal to the previous one is not written again."""
        if not self.json_lines:
            return
        body = json.dumps({"event": event, **fields}, default=str, separators=(",", ":"))
        if body == self._last_line:
            return
        self._last_line = body
        self.stream.write(json.dumps({"t": round(time.time(), 3), "event": event, **fields}, default=str) + "\n")
        self.stream.flush()

    def _bars(self) -> Any:
        if self._rich is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                ProgressColumn,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.table import Column
            from rich.text import Text

            class Message(ProgressColumn):
                """What a running stage does now, on one line cut with an ellipsis where the line ends; an
                ended stage's last word whole (wrapped onto more lines where it must)."""

                def render(self, task: Any) -> Text:
                    if task.finished or task.stop_time is not None:
                        return Text(task.description)
                    return Text(task.description, no_wrap=True, overflow="ellipsis")

            class Mark(SpinnerColumn):
                """The spinner while a stage runs, ✓ once it is done, ■ where it stopped short (done(fill=False))."""

                def render(self, task: Any) -> Any:
                    if task.stop_time is not None and not task.finished:
                        return Text("■", style="yellow")
                    return super().render(task)

            # The stage, bar, counts and clock keep their widths; the message takes what is left of the line
            # (at 80 columns a long message squeezed out the stage's name, the bar and the counts).
            def fixed(width: int) -> Column:
                return Column(min_width=width, no_wrap=True)

            self._rich = Progress(Mark(finished_text="[green]✓[/]", table_column=fixed(1)),
                                  TextColumn("[bold]{task.fields[stage]:<8}[/]", table_column=fixed(8)),
                                  BarColumn(bar_width=24, table_column=fixed(24)),
                                  MofNCompleteColumn(table_column=fixed(9)), TimeElapsedColumn(table_column=fixed(7)),
                                  Message(table_column=Column(ratio=1, overflow="ellipsis")),
                                  console=Console(file=self.stream), refresh_per_second=4, transient=False)
            self._rich.start()
        return self._rich

    # -- stages ----------------------------------------------------------------------------------------

    def stage(self, name: str, message: str = "", *, total: int | None = None) -> None:
        """Start stage `name` (or say what it does now)."""
        if self.json_lines:
            self.emit("stage", stage=name, message=message, **({"total": total} if total is not None else {}))
            return
        bars = self._bars()
        if name not in self._tasks:
            self._tasks[name] = bars.add_task(message, stage=name, total=total)
        else:
            bars.update(self._tasks[name], description=message,
                        **({"total": total} if total is not None else {}))

    def update(self, name: str, *, completed: int | None = None, total: int | None = None,
               message: str | None = None, **counts: Any) -> None:
        """New counts of a running stage (JSON mode: one line carrying them)."""
        if self.json_lines:
            self.emit("progress", stage=name, **({"message": message} if message else {}),
                      **({"completed": completed} if completed is not None else {}),
                      **({"total": total} if total is not None else {}), **counts)
            return
        if name not in self._tasks:
            self.stage(name, message or "", total=total)
        kw: dict[str, Any] = {}
        if completed is not None:
            kw["completed"] = completed
        if total is not None:
            kw["total"] = total
        if message is not None:
            kw["description"] = message
        self._bars().update(self._tasks[name], **kw)

    def done(self, name: str, message: str | None = None, *, fill: bool = True) -> None:
        """Stage `name` is over; its bar filled, or with `fill=False` left where the work stopped."""
        if self.json_lines:
            self.emit("stage_done", stage=name, **({"message": message} if message else {}))
            return
        if name not in self._tasks:
            self.stage(name, message or "")
        task = self._tasks[name]
        bars = self._bars()
        t = next(x for x in bars.tasks if x.id == task)
        end = t.total if t.total is not None else max(t.completed, 1)
        bars.update(task, **({"total": end, "completed": end} if fill else {}),
                    **({"description": message} if message is not None else {}))
        bars.stop_task(task)

    def sink(self, name: str) -> Callable[[str], None]:
        """A `progress(msg)` callable (what capture and export take) that updates stage `name`."""
        return lambda msg: self.stage(name, msg)

    def close(self) -> None:
        """End the display (the terminal keeps its last state)."""
        if self._rich is not None:
            self._rich.stop()
            self._rich = None


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def stdout_console(**kw: Any) -> Any:
    """A rich Console for a command's output on stdout whose closed pipe (the reader quit early, `| head`) raises
    BrokenPipeError, which the CLI ends quietly with exit 141, as its plain and JSON output do; rich's own
    handling exits 1."""
    from rich.console import Console

    class _StdoutConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return _StdoutConsole(**kw)


def json_stdout(on: bool) -> contextlib.AbstractContextManager:
    """With --json, what the model's builder or forward prints ("loading…", a debug print) goes to stderr while
    the command works, so stdout holds one JSON document, printed after the block. Entered before the command's
    progress display and left after it: a display that redirects stdout itself (rich) started inside a redirect of
    ours, and stopped after it ended, would leave stdout pointing at stderr. File descriptor 1 goes to stderr too:
    what is written below Python's sys.stdout (a C extension's printf, a subprocess the builder starts, os.write(1),
    sys.__stdout__) came out ahead of the JSON document, which json.loads then refused."""
    if not on:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(_fd1_to_stderr())
    stack.enter_context(contextlib.redirect_stdout(sys.stderr))
    return stack


@contextlib.contextmanager
def _fd1_to_stderr() -> Any:
    """File descriptor 1 pointed at descriptor 2 for the block, then restored (nothing where either is not open)."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(2, 1)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        yield
    finally:
        for flush in (lambda: sys.__stdout__.flush(), _flush_c_stdio):
            with contextlib.suppress(Exception):
                flush()
        os.dup2(saved, 1)
        os.close(saved)


def _flush_c_stdio() -> None:
    """The C library's buffered stdout (a C extension's printf) written out while descriptor 1 is still stderr."""
    import ctypes

    ctypes.CDLL(None).fflush(None)
