"""`open_tui(args)`: what the TUI commands do (open, attach, run detached, demo, compare, serve).

The engine's CLI calls this only for commands that need the TUI; Textual is imported here, lazily.
"""

from __future__ import annotations

import argparse
import atexit
import errno
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine.cli import terminal_attached
from engine.errors import JobError, UsageError
from engine.store import is_corruption, unusable_database, writable
from engine.store.workspace import db_path, resolve_workspace

DEMO_DB = Path(__file__).resolve().parent / "demo" / "kforge.db"
LOOPBACK = ("127.0.0.1", "localhost", "::1")



def open_tui(args: argparse.Namespace) -> int:
    """Entry point handed to engine.cli.main; returns the exit code."""
    apply_color_system(getattr(args, "color_system", None))
    command = args.command
    if command == "serve":
        return serve(args)
    keymap, theme, state = tui_settings(args)
    if command == "demo":
        db, read_only, note = demo_copy(), True, "demo (read-only)"
        workspace = db.parent
    else:
        workspace = resolve_workspace(args.workspace)
        db, read_only, note = db_path(workspace), False, ""
        if command != "run" and db.is_file() and not writable(db):  # pause/resume/stop cannot be sent
            read_only, note = True, "read-only workspace"
        if command != "run" and not db.is_file():
            raise UsageError(f"no Kernel Forge workspace at {workspace}: start a run with "
                             "'kforge-tui run CONFIG' (or look around with 'kforge-tui demo')")
    run_id = None
    if command == "run":
        run_id = start_engine_detached(args, workspace)
    from kforge_tui.readmodel import ReadModel

    model = ReadModel(db)  # refuses a damaged file or a newer schema in one line (StoreError)
    try:
        compare: list[str] = []
        if command == "compare":
            for ref in args.runs:
                run = model.resolve_run(ref)
                if run is None:
                    known = ", ".join(r.id for r in model.runs()[:5]) or "none"
                    raise UsageError(f"compare: no run {ref!r} in {workspace} (latest: {known})")
                compare.append(run.id)
            run_id = compare[0]
        if run_id is None:
            ref = getattr(args, "run", None)
            if ref:
                run = model.resolve_run(ref)
                if run is None:
                    raise UsageError(f"--run {ref}: no such run in {workspace}")
            else:
                runs = model.runs()
                if not runs:
                    busy = capture_in_progress(workspace)
                    if busy:
                        raise UsageError(f"no run in {workspace} yet: a capture is in progress ({busy}); its run "
                                         f"appears when it finishes: '{attach_command(workspace)}' again then")
                    raise UsageError(f"no runs in {workspace} yet: start one with 'kforge-tui run CONFIG'")
                run = runs[0]
            run_id = run.id
    except sqlite3.DatabaseError as e:  # the header was readable, a table is not: the file is damaged
        if is_corruption(e):
            raise unusable_database(db, e) from None
        raise
    finally:
        model.close()
    if not (terminal_attached() or served()):
        raise UsageError(f"kforge-tui{' ' + command if command else ''}: the TUI needs a terminal (stdin and "
                         "stdout are not one); use 'kforge-tui run CONFIG --no-tui' for headless runs, or "
                         "'kforge-tui serve' for a browser")
    from kforge_tui.app import KforgeApp

    app = KforgeApp(db, run_id, read_only=read_only, refresh_s=getattr(args, "refresh", None) or 1.0,
                    compare_runs=compare, keymap=keymap, theme=theme, state_file=state,
                    start_mode="compare" if command == "compare" else "overview", note=note)
    app.run()
    if app.fatal is not None:  # the app found the database unusable after all, and closed itself
        raise app.fatal
    return app.return_code or 0


def apply_color_system(choice: str | None) -> None:
    """--color-system: Textual reads TEXTUAL_COLOR_SYSTEM when it is first imported (Rich's names: auto,
    truecolor, 256, standard); 'none' is NO_COLOR, which Textual reads when the app is created."""
    if not choice:
        return
    if choice == "none":
        os.environ.pop("TEXTUAL_COLOR_SYSTEM", None)  # Rich has no colour system named "none"
        os.environ["NO_COLOR"] = "1"
    else:
        os.environ["TEXTUAL_COLOR_SYSTEM"] = choice


def _keymap(args: argparse.Namespace) -> dict[str, str]:
    from kforge_tui.keymap import load_keymap

    path = getattr(args, "keymap", None)
    if path and not Path(path).is_file():
        raise UsageError(f"--keymap {path}: no such file")
    try:
        return load_keymap(Path(path) if path else None)
    except ValueError as e:
        raise UsageError(str(e)) from None


def tui_settings(args: argparse.Namespace) -> tuple[dict[str, str], str | None, Path]:
    """Keymap, theme and state file for the app. Keys: the user config's `[tui.keymap]`, then tui.toml or
    --keymap over it. Theme: --theme, else the user config's, else the one last chosen with T (remembered
    in the state file), else the default."""
    from kforge_tui.keymap import check_keymap
    from kforge_tui.state import read_state, state_path

    user = _user_config()
    try:
        configured = check_keymap(dict(user.keymap), str(user.path)) if user.keymap else {}
    except ValueError as e:
        raise UsageError(str(e)) from None
    keymap = {**configured, **_keymap(args)}
    state = state_path()
    theme = _theme(args) or _known_theme(user.theme) or _known_theme(read_state(state).get("theme"))
    return keymap, theme, state


def _user_config():  # noqa: ANN202 - engine.userconfig.UserConfig, through the one import the TUI may use
    from engine.cli import load_user_config

    return load_user_config()  # a bad file is one line, exit 2 (UsageError)


def _known_theme(name: object) -> str | None:
    """A remembered or configured theme, if this version still has it (else the default, silently)."""
    if not isinstance(name, str) or not name:
        return None
    from textual.theme import BUILTIN_THEMES

    from kforge_tui.themes import load_themes

    return name if name in [t.name for t in load_themes()] + list(BUILTIN_THEMES) else None


def _theme(args: argparse.Namespace) -> str | None:
    name = getattr(args, "theme", None)
    if not name:
        return None
    from textual.theme import BUILTIN_THEMES

    from kforge_tui.themes import load_themes

    names = [t.name for t in load_themes()] + list(BUILTIN_THEMES)
    if name not in names:
        raise UsageError(f"--theme {name}: unknown theme; choose one of {', '.join(names[:3])} "
                         f"or a Textual theme ({', '.join(list(BUILTIN_THEMES)[:4])}, …)")
    return name


def demo_copy() -> Path:
    """The packaged demo workspace, copied to a temporary folder (the package stays untouched)."""
    if not DEMO_DB.is_file():
        raise UsageError(f"the demo run is missing from this installation ({DEMO_DB})")
    folder = Path(tempfile.mkdtemp(prefix="kforge-demo-"))
    atexit.register(shutil.rmtree, folder, True)   # each demo left its copy behind (205 of them on one machine)
    target = folder / "kforge.db"
    shutil.copyfile(DEMO_DB, target)
    target.chmod(0o444)
    return target


def engine_argv(args: argparse.Namespace, workspace: Path) -> list[str]:
    """The detached engine's command line: the same `run`, headless, in the same workspace."""
    from engine.cli import run_argv

    config = args.config
    if config and Path(config).exists():
        config = str(Path(config).resolve())
    argv = run_argv(argparse.Namespace(**{**vars(args), "config": config}))
    return [sys.executable, "-m", "kforge_tui", "run", *argv, "--no-tui", "--workspace", str(workspace)]


def attach_command(workspace: Path) -> str:
    """The command that opens the TUI on this workspace again (the --workspace flag unless it is the default)."""
    from engine.store.workspace import resolve_workspace as default_of

    if Path(workspace).resolve() == default_of(None).resolve():
        return "kforge-tui"
    return f"kforge-tui --workspace {shlex.quote(str(workspace))}"


def capture_in_progress(workspace: Path) -> str | None:
    """What says a capture is running in the workspace: a sample folder a capture's process holds the lock
    of (engine.store.samples_being_written, as prune and the next capture ask), with the newest engine log;
    None when there is none."""
    from engine.store import samples_being_written

    writing = samples_being_written(workspace)
    if not writing:
        return None
    logs = sorted((Path(workspace) / "logs").glob("engine-*.log"), key=lambda p: p.stat().st_mtime)
    return f"samples being written to {writing[0][0].name}" + (f"; log {logs[-1]}" if logs else "")


def start_engine_detached(args: argparse.Namespace, workspace: Path) -> str:
    """Start `run --no-tui` in its own session (it outlives this terminal) and wait for its run row."""
    from engine.store import ensure_workspace

    if args.config is None and not args.resume:
        raise UsageError("run: give a model CONFIG (e.g. configs/models/resnet50.toml) or --resume RUN")
    ensure_workspace(workspace)
    logs = workspace / "logs"
    logs.mkdir(exist_ok=True)
    log_path = logs / f"engine-{time.strftime('%Y%m%d-%H%M%S')}.log"
    argv = engine_argv(args, workspace)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=os.getcwd())
    print(f"kforge: engine started (pid {proc.pid}), log {log_path}; waiting for its run "
          "(capture can take a while; Ctrl-C leaves the engine running)", file=sys.stderr, flush=True)
    try:
        return _wait_for_run(proc, workspace, log_path, args.resume)
    except KeyboardInterrupt:
        print(f"kforge: not attached; the engine keeps running (pid {proc.pid}). "
              f"Attach later with '{attach_command(workspace)}'", file=sys.stderr)
        raise SystemExit(0) from None


def _wait_for_run(proc: subprocess.Popen, workspace: Path, log_path: Path, resume: str | None) -> str:
    from engine.store import StoreError, open_readonly, read

    db = db_path(workspace)
    while True:
        if db.is_file():
            try:
                conn = open_readonly(db)
                try:
                    row = read.run(conn, resume) if resume else read.run_of_process(conn, proc.pid)
                finally:
                    conn.close()
                if row:
                    return row["id"]
            except (sqlite3.Error, StoreError):
                pass  # not migrated yet, or briefly locked
        code = proc.poll()
        if code is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] if log_path.is_file() else []
            why = tail[0] if tail else "no output"
            raise (UsageError if code == 2 else JobError)(
                f"the engine exited (code {code}) before its run started: {why} (log: {log_path})")
        time.sleep(0.3)


SERVED_ENV = "KFORGE_SERVED"  # set by `serve` for the app processes textual-serve starts


def served() -> bool:
    """This process is the app `kforge-tui serve` started for a browser: textual-serve runs it with pipes
    for stdin and stdout and Textual's web driver (TEXTUAL_DRIVER), not a terminal."""
    return os.environ.get(SERVED_ENV) == "1" and bool(os.environ.get("TEXTUAL_DRIVER"))


def serve(args: argparse.Namespace) -> int:
    """The same TUI in a browser through textual-serve, bound to localhost (reach it by an SSH tunnel)."""
    host = getattr(args, "host", None) or "127.0.0.1"
    if host not in LOOPBACK:  # the TUI can stop runs: never expose it to the network
        raise UsageError(f"serve: --host {host} is not a loopback address; the TUI is served on 127.0.0.1 only "
                         f"(from your machine: ssh -L {args.port}:127.0.0.1:{args.port} THIS_HOST)")
    try:
        from textual_serve.server import Server
    except ImportError:
        raise UsageError("serve: textual-serve is not installed (pip install textual-serve)") from None
    inner = [sys.executable, "-m", "kforge_tui"]
    if args.workspace:
        inner += ["--workspace", str(resolve_workspace(args.workspace))]
    for flag, attr in (("--theme", "theme"), ("--keymap", "keymap"), ("--run", "run")):
        if getattr(args, attr, None):
            inner += [flag, str(getattr(args, attr))]
    if args.demo:
        inner.append("demo")
    elif not db_path(resolve_workspace(args.workspace)).is_file():
        raise UsageError(f"serve: no Kernel Forge workspace at {resolve_workspace(args.workspace)} "
                         "(use 'kforge-tui serve --demo' to serve the demo run)")
    where = f"[{host}]" if ":" in host else host
    _check_port_free(host, args.port, where)
    os.environ[SERVED_ENV] = "1"  # textual-serve hands its own environment to every app process it starts
    print(f"kforge: serving on http://{where}:{args.port} (loopback only; from your machine: "
          f"ssh -L {args.port}:{where}:{args.port} THIS_HOST)", file=sys.stderr, flush=True)
    server = _relative_server(Server)(shlex.join(inner), host=host, port=args.port, title="Kernel Forge")
    try:
        server.serve()
    except OSError as e:  # taken between the check and the bind
        raise UsageError(f"serve: cannot listen on {where}:{args.port} ({e.strerror or e}); "
                         "choose another port with --port") from None
    if server.stopped_by is not None:
        from engine.run.interrupt import Interrupted, TerminatedStop

        n = server.tabs_closed
        tabs = f"{n} tab{'s' if n > 1 else ''} closed" if n else "no tab was open"
        if server.stopped_by == signal.SIGTERM:
            raise TerminatedStop(f"terminated: stopped serving on http://{where}:{args.port} ({tabs})")
        raise Interrupted(f"interrupted: stopped serving on http://{where}:{args.port} ({tabs})")
    return 0


def _check_port_free(host: str, port: int, where: str) -> None:
    """Refuse in one line when something already listens on host:port (before textual-serve logs anything)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UsageError(f"serve: cannot resolve {host} ({e})") from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
            try:
                probe.bind(address)
            except OSError as e:
                if e.errno == errno.EADDRNOTAVAIL and len(infos) > 1:  # e.g. no IPv6 here: skipped, as asyncio does
                    continue
                busy = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be bound ({e.strerror or e})"
                raise UsageError(f"serve: port {port} on {where} {busy}; choose another with --port") from None


# Run before textual.js (it reads the URL on window.onload): the websocket goes to the host and port the
# browser itself used, so a tunnel on another local port (ssh -L 9000:127.0.0.1:8000) works.
_WS_FROM_LOCATION = ("<script>document.getElementById('terminal').dataset.sessionWebsocketUrl = "
                     "(location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/ws';</script>")


# How long a stopped server gives its tabs' app processes to quit and their websockets to close.
_TABS_CLOSE_S = 10.0


def _relative_server(base: type) -> type:
    """textual-serve's Server whose page names no host: its stylesheet, script and images are under
    /static/ of whatever origin loaded the page, and its websocket URL is built from window.location.
    (textual-serve's own page writes http://HOST:PORT from its public_url into every URL.)

    It also stops as the other commands do. textual-serve takes SIGTERM and Ctrl-C as aiohttp's graceful
    exit, which waits for every request to end: a tab's websocket never does, so with a tab open the server
    ran on until the websocket's heartbeat gave up (some 20 s) and then exited 0. Here the first SIGTERM or
    Ctrl-C ends each tab's session at once (its app is told to quit and its websocket is closed, as when the
    tab goes away), then the server; `stopped_by` says which signal, for the exit code (143, 130). A second
    Ctrl-C exits at once; a second SIGTERM changes nothing (engine.run.interrupt.ignore_further_sigterm)."""
    import asyncio

    import aiohttp_jinja2
    from aiohttp import web

    from engine.run.interrupt import exit_now

    class RelativeServer(base):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.stopped_by: int | None = None
            self.tabs_closed = 0
            self._sessions: set[asyncio.Task] = set()

        async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
            session = asyncio.current_task()  # the task aiohttp runs this request in
            self._sessions.add(session)
            try:
                return await super().handle_websocket(request)
            finally:
                self._sessions.discard(session)

        def serve(self, debug: bool = False) -> None:
            self.debug = debug
            self.initialize_logging()
            loop = asyncio.new_event_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._stop, sig, loop)
            # The tabs are closed before the server stops, so its own wait for requests to end is short.
            web.run_app(self._make_app(), host=self.host, port=self.port, handle_signals=False, loop=loop,
                        print=lambda *args: None, shutdown_timeout=2.0)

        def _stop(self, sig: int, loop: asyncio.AbstractEventLoop) -> None:
            if self.stopped_by is not None:
                if sig == signal.SIGINT:
                    exit_now()
                return
            self.stopped_by = sig
            loop.create_task(self._close_tabs())

        async def _close_tabs(self) -> None:
            # Cancelled, textual-serve's websocket handler tells its app to quit, waits for it, and closes the
            # websocket: what aiohttp itself does to a request still running when its graceful wait ends.
            sessions = list(self._sessions)
            self.tabs_closed = len(sessions)
            for session in sessions:
                session.cancel()
            if sessions:
                await asyncio.wait(sessions, timeout=_TABS_CLOSE_S)
            self.request_exit()

        async def handle_index(self, request: web.Request) -> web.Response:
            try:
                font_size = int(request.query.get("fontsize", "16"))
            except ValueError:
                font_size = 16
            context = {"font_size": font_size, "app_websocket_url": "/ws",
                       "config": {"static": {"url": "/static/"}}, "application": {"name": self.title}}
            page = aiohttp_jinja2.render_string("app_index.html", request, context)
            page = page.replace("</body>", _WS_FROM_LOCATION + "\n  </body>", 1)
            return web.Response(text=page, content_type="text/html")

    return RelativeServer
