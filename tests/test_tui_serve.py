"""`kforge-tui serve` starts a web server on the loopback address only, refuses any other host or a taken
port, and serves the app itself: a browser's websocket gets the demo's operator cards, also through a
tunnel that arrives on another local port (the page names no host and port of its own)."""

import asyncio
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import ROOT

pytest.importorskip("textual_serve")
aiohttp = pytest.importorskip("aiohttp")

ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-B]|\x1b[=>]")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served():
    """`kforge-tui serve --demo` on a free port, once it answers; yields (port, process)."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kforge_tui", "serve", "--demo", "--port", str(port)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2):
                    break
            except OSError:
                assert time.time() < deadline, "serve never answered on 127.0.0.1"
                time.sleep(0.2)
        yield port, proc
    finally:
        proc.terminate()
        proc.wait(10)


def test_serve_binds_loopback_and_serves_the_page(served):
    port, proc = served
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
        page = r.read().decode()
    assert "Kernel Forge" in page
    listening = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
    if listening.strip():  # where `ss` exists: every listening socket on the port is loopback
        addrs = [line.split()[3].rsplit(":", 1)[0] for line in listening.splitlines()]
        assert addrs and all(a in ("127.0.0.1", "[::1]") for a in addrs), listening
    proc.terminate()
    proc.wait(10)
    assert f"http://127.0.0.1:{port}" in proc.stderr.read()


async def _forwarder(target_port: int):
    """A TCP forwarder on another local port, as `ssh -L OTHER:127.0.0.1:PORT` is for the browser."""

    async def pipe(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def handle(client_r, client_w):
        server_r, server_w = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w))

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def _through_a_tunnel(port: int, timeout_s: float) -> tuple[str, list[int], str]:
    """Load the page through a forwarder as a browser would (its assets, then the websocket the page's
    script opens on window.location.host), send the client's resize, and read the screen until an
    operator of the demo shows. Returns (page, asset statuses, screen text)."""
    forwarder = await _forwarder(port)
    other = forwarder.sockets[0].getsockname()[1]
    origin = f"http://localhost:{other}"  # the browser's own location: another host name and port
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{origin}/?fontsize=14") as r:
                assert r.status == 200
                page = await r.text()
            assets = re.findall(r'(?:href|src)="(/[^"]*)"|url\("(/[^"]*)"\)', page)
            statuses = []
            for href, url in assets:
                async with session.get(origin + (href or url)) as r:
                    statuses.append(r.status)
            # textual.js: new WebSocket(URL + "?width=W&height=H"), then ["resize", {...}] once open
            ws_url = f"ws://localhost:{other}/ws"
            assert "location.host + '/ws'" in page
            screen = b""
            async with session.ws_connect(f"{ws_url}?width=120&height=40") as ws:
                await ws.send_json(["resize", {"width": 120, "height": 40}])
                await ws.send_json(["ping", "1"])
                deadline = time.monotonic() + timeout_s
                while b"native_layer_norm" not in ANSI.sub(b"", screen) and time.monotonic() < deadline:
                    try:
                        msg = await ws.receive(timeout=max(0.1, deadline - time.monotonic()))
                    except asyncio.TimeoutError:
                        break
                    if msg.type == aiohttp.WSMsgType.BINARY:
                        screen += msg.data
                    elif msg.type != aiohttp.WSMsgType.TEXT:  # closed: the app ended (or never started)
                        break
        return page, statuses, ANSI.sub(b"", screen).decode("utf-8", "replace")
    finally:
        forwarder.close()
        await forwarder.wait_closed()


def test_the_served_app_shows_the_demo_cards_through_a_tunnel_on_another_port(served):
    port, proc = served
    page, statuses, screen = asyncio.run(_through_a_tunnel(port, timeout_s=60))
    # The page names no host or port: every URL is relative to where the browser loaded it from.
    assert "127.0.0.1" not in page and "localhost" not in page and f":{port}" not in page, page
    assert statuses and all(s == 200 for s in statuses), statuses
    # The app started (no 'needs a terminal') and drew the demo run's operator cards.
    assert "native_layer_norm" in screen, (screen[-2000:], proc.poll())
    assert "Overview" in screen


def test_serve_refuses_a_taken_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "kforge_tui", "serve", "--demo", "--port", str(port)],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(port) in lines[0] and "in use" in lines[0] and "--port" in lines[0], proc.stderr


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "example.com"])
def test_serve_refuses_other_hosts(host):
    proc = subprocess.run([sys.executable, "-m", "kforge_tui", "serve", "--demo", "--host", host],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "loopback" in lines[0] and host in lines[0], proc.stderr


async def _open_tab(port: int):
    """A browser tab's session: the websocket textual.js opens, held open once the app has drawn its cards."""
    session = aiohttp.ClientSession()
    ws = await session.ws_connect(f"ws://127.0.0.1:{port}/ws?width=120&height=40")
    await ws.send_json(["resize", {"width": 120, "height": 40}])
    screen, deadline = b"", time.monotonic() + 60
    while b"native_layer_norm" not in ANSI.sub(b"", screen) and time.monotonic() < deadline:
        msg = await ws.receive(timeout=max(0.1, deadline - time.monotonic()))
        if msg.type == aiohttp.WSMsgType.BINARY:
            screen += msg.data
        elif msg.type != aiohttp.WSMsgType.TEXT:
            break
    assert b"native_layer_norm" in ANSI.sub(b"", screen), "the served app never drew the demo's cards"
    return session, ws


async def _stopped_with_a_tab_open(port: int, proc: subprocess.Popen, sig: int) -> tuple[int | None, str]:
    """Signal serve while a tab is open; the exit code within 30 s (None: still running) and how the tab's
    websocket ended."""
    session, ws = await _open_tab(port)
    try:
        proc.send_signal(sig)
        ended = "open"
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                msg = await ws.receive(timeout=0.2)  # as a tab does: pings answered, the close frame read
            except asyncio.TimeoutError:
                continue
            if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
                ended = "closed"
            await asyncio.sleep(0.05 if ended == "closed" else 0)
        return proc.poll(), ended
    finally:
        await ws.close()
        await session.close()


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
def test_serve_stops_on_a_signal_while_a_tab_is_connected(served, sig, code, word):
    # SIGTERM (`timeout`, systemd, a job scheduler) was taken as a graceful exit that waited for the open tabs'
    # websockets to end: with a tab connected, serve went on for tens of seconds, then exited 0.
    port, proc = served
    exit_code, ended = asyncio.run(_stopped_with_a_tab_open(port, proc, sig))
    assert exit_code == code, (exit_code, proc.stderr.read() if exit_code is not None else "still running after 30 s")
    assert ended == "closed"  # the tab was told the server went away
    lines = proc.stderr.read().strip().splitlines()
    assert lines[-1].startswith(f"{word}: stopped serving"), lines


def test_serve_stops_on_sigterm_with_no_tab(served):
    port, proc = served
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 143
    assert proc.stderr.read().strip().splitlines()[-1].startswith("terminated: stopped serving")
