"""Ctrl-C for headless commands: the first stops the work cleanly (what is done stays done, the run
stays resumable, one line says how), a second one exits at once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from engine.errors import KforgeError

T = TypeVar("T")
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM (`timeout`, a job scheduler, `kill`)


class Interrupted(KforgeError):
    """The user pressed Ctrl-C; the message is the one line to show (what was kept, how to go on)."""

    exit_code = EXIT_INTERRUPTED


class TerminatedStop(Interrupted):
    """Stopped by SIGTERM: as Interrupted, with the exit code a shell reports for SIGTERM."""

    exit_code = EXIT_TERMINATED


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt (inside `sigterm_raises`), so that the same
    cleanup runs: what is finished is kept, child processes are stopped."""


def _raise_terminated(*_: Any) -> None:
    ignore_further_sigterm()
    raise Terminated()


def _sigterm_ignored(*_: Any) -> None:
    pass


def ignore_further_sigterm() -> None:
    """From now on SIGTERM changes nothing: the process is already stopping as the first one asked.

    `timeout` sends SIGTERM to the command and then to its whole process group, so the command often gets
    two; the second one used to land in the first one's cleanup (a capture's half-written sample folder
    stayed, a run exited 130 at once as if Ctrl-C had been pressed twice, the line saying what was kept was
    never written). A scheduler that will not wait sends SIGKILL. A Python handler rather than SIG_IGN:
    a child started from here (a lane, a compile worker) must not inherit an ignored SIGTERM."""
    try:
        signal.signal(signal.SIGTERM, _sigterm_ignored)
    except ValueError:  # not the main thread
        pass


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside, the first SIGTERM raises Terminated in the main thread instead of ending the process at once
    (Python's default, which runs no cleanup), and later ones are ignored (ignore_further_sigterm, also after
    the block: the process is stopping, and a command's line saying what was kept is still to be written);
    with none, the previous handler again after the block. Off the main thread: no change."""
    try:
        before = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is _raise_terminated:  # no SIGTERM came
            signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)


class StopFlag:
    """Set by the first Ctrl-C. Work that can stop between steps (a capture thread, the orchestrator)
    registers a callback; work that cannot is cancelled as an asyncio task."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._hooks: list[Callable[[], None]] = []
        self.terminated = False   # stopped by SIGTERM (`timeout`, a job scheduler), not Ctrl-C

    @property
    def hit(self) -> bool:
        return self.event.is_set()

    def on_stop(self, hook: Callable[[], None] | None) -> None:
        """The one hook the next Ctrl-C calls instead of cancelling the task (None: cancel again)."""
        self._hooks = [hook] if hook is not None else []

    def quiet(self, sink: Any) -> Any:
        """A progress sink that goes silent once stopped (the shutdown is not news)."""
        if sink is None:
            return None

        def show(*a: Any, **k: Any) -> Any:
            return None if self.hit else sink(*a, **k)
        return show


_LAST_WORDS: list[Callable[[], None]] = []  # run by the second Ctrl-C before it exits (each one quick)


def on_exit_now(hook: Callable[[], None] | None) -> None:
    """What the second Ctrl-C does before exiting: one hook (e.g. mark the run stopped), replacing any
    earlier one; None removes it."""
    _LAST_WORDS[:] = [hook] if hook is not None else []


_LAST_WORDS_S = 8.0  # the longest the second Ctrl-C waits for its last words before exiting anyway
_exiting = threading.Event()


def exit_now(*_: Any) -> None:
    """The second Ctrl-C: no cleanup and no traceback, only the registered last words (best effort).

    The last words run on their own thread and the handler returns: it may have landed inside a store
    transaction that holds the write lock across awaits, and only the loop it interrupted can finish that
    transaction (blocking here would block the lock's release, and the row would stay 'running'). The
    thread ends the process as soon as the words are written, or after _LAST_WORDS_S whatever happens."""
    if _exiting.is_set():  # a third Ctrl-C: no more waiting
        os._exit(EXIT_INTERRUPTED)
    _exiting.set()
    hooks = list(_LAST_WORDS)

    def last_words() -> None:
        for hook in hooks:
            try:
                hook()
            except Exception as e:  # noqa: BLE001 - exiting anyway; a resume works as after a crash
                try:
                    os.write(2, f"interrupted: last words not written ({type(e).__name__}: {e})\n".encode())
                except OSError:
                    pass
        os._exit(EXIT_INTERRUPTED)

    def deadline() -> None:
        os._exit(EXIT_INTERRUPTED)

    timer = threading.Timer(_LAST_WORDS_S, deadline)
    timer.daemon = True
    timer.start()
    if not hooks:
        os._exit(EXIT_INTERRUPTED)
    threading.Thread(target=last_words, name="kforge-last-words", daemon=True).start()


# SIGINTs the Python-level handler (exit_on_next_sigint) took. asyncio's wakeup fd stays set after that handler
# replaces the loop's, so each such signal also reaches the loop's handler (run_interruptible's on_sigint),
# which must not take it a second time: two exit_now calls for one Ctrl-C made the second "a third Ctrl-C" and
# exited before the last words were written (the run left 'running', about one try in three).
_taken_by_handler = [0]


def _sigint_handler(*_: Any) -> None:
    _taken_by_handler[0] += 1
    exit_now()


def _duplicate_of_handled() -> bool:
    """Whether a SIGINT the loop reports now was already taken by the Python-level handler (consumes it)."""
    if _taken_by_handler[0] > 0:
        _taken_by_handler[0] -= 1
        return True
    return False


def exit_on_next_sigint() -> None:
    try:
        signal.signal(signal.SIGINT, _sigint_handler)
    except ValueError:  # not the main thread: nothing to install
        pass


def run_interruptible(make: Callable[[StopFlag], Coroutine[Any, Any, T]], *,
                      interrupted: str = "interrupted: stopped; nothing was kept") -> T:
    """asyncio.run with Ctrl-C handled: the first one calls the registered stop hook (or cancels the main
    task), a second exits at once. A cancelled main task becomes Interrupted(`interrupted`)."""
    stop = StopFlag()
    loop = asyncio.new_event_loop()
    task = loop.create_task(make(stop))

    def on_sigint() -> None:
        if stop.hit:
            if not _duplicate_of_handled():
                exit_now()
            return
        stop.event.set()
        exit_on_next_sigint()  # also while the loop is not running (its shutdown below)
        if stop._hooks:
            stop._hooks[0]()
        else:
            task.cancel()

    def on_sigterm() -> None:
        # `timeout`, a job scheduler, `kill`: stopped as by the first Ctrl-C (what is done is kept, the run
        # stays resumable), where Python's default ended the process with the run row left 'running'. Once
        # the stop is under way a SIGTERM changes nothing (ignore_further_sigterm says why); only a second
        # Ctrl-C hurries it.
        if stop.hit:
            return
        stop.terminated = True
        on_sigint()

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    except (NotImplementedError, RuntimeError, ValueError):  # Windows, or not the main thread
        pass
    try:
        try:
            return loop.run_until_complete(task)
        except asyncio.CancelledError:
            raise Interrupted(interrupted) from None
    finally:
        try:
            rest = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in rest:
                t.cancel()
            if rest:
                loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.remove_signal_handler(sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    pass
            if stop.hit:
                exit_on_next_sigint()
            if stop.terminated:  # not ended by the next one before the line saying what was kept is written
                ignore_further_sigterm()
            loop.close()


def run_again(args: Any, workspace: Any, *, dry: bool = False) -> str:
    """The command that starts a `run` stopped before its run was created (or resumed) again: as it was given, every
    run option kept (--iterations, --provider, --ops ...), so that it runs the same run, not the defaults. The CLI
    rebuilds it from its parser (engine.cli.run_argv) into args.argv_as_given; a run started otherwise names its
    config (or --resume RUN) alone."""
    argv = list(getattr(args, "argv_as_given", None)
                or ([str(args.config)] if getattr(args, "config", None) else [])
                or (["--resume", str(args.resume)] if getattr(args, "resume", None) else []))
    argv += ["--dry-run"] if dry and "--dry-run" not in argv else []
    argv += ["--no-tui"] if getattr(args, "no_tui", False) else []
    return shlex.join(["kforge-tui", "run", *argv, "--workspace", str(workspace)])


def stopped_before_the_run(args: Any, workspace: Any, word: str, *, dry: bool = False) -> str:
    """The line for a `run` stopped (`word`: interrupted, terminated) before it created its run or claimed the run
    it resumes: nothing changed, and the command that starts it again (run_again). In the first seconds (torch's
    import, the workspace's opening) the line named no command, where docs/cli.md promises one."""
    again = run_again(args, workspace, dry=dry)
    if getattr(args, "resume", None):
        return f"{word}: stopped before run {args.resume} was resumed, nothing changed; '{again}' resumes it"
    return f"{word}: stopped before the run was created, nothing to resume; '{again}' starts it again"
