"""`kforge-tui serve --demo` in a real headless Chromium, through a forwarder on another local port (as an
SSH tunnel is): the page loads, its websocket carries the demo's operator cards, and a screenshot is taken
(KFORGE_SCREENSHOT=PATH keeps it; docs/img/serve-demo.png was made so).

Needs `pip install playwright` and a Chromium (Debian's `apt-get install chromium`; Playwright's own browser
download is not needed); skipped where either is missing."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import threading
from pathlib import Path

import pytest
from test_tui_serve import ANSI, _forwarder, served  # noqa: F401 - the fixture

playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = next((p for p in (os.environ.get("KFORGE_CHROMIUM"), shutil.which("chromium"),
                             shutil.which("chromium-browser"), shutil.which("google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium)")


class _Tunnel:
    """The forwarder of test_tui_serve on its own event loop thread, for the synchronous browser."""

    def __init__(self, port: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(_forwarder(port), self.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_chromium_shows_the_served_demo_through_a_tunnel(served, tmp_path):  # noqa: F811
    port, proc = served
    tunnel = _Tunnel(port)
    received = bytearray()
    shot = Path(os.environ.get("KFORGE_SCREENSHOT") or tmp_path / "serve-demo.png")
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})

                def on_socket(ws) -> None:
                    ws.on("framereceived", lambda data: received.extend(
                        data if isinstance(data, bytes) else data.encode()))

                page.on("websocket", on_socket)
                page.goto(f"http://localhost:{tunnel.port}/")  # another host name and port than served
                for _ in range(600):  # until the app has drawn an operator card (60 s at most)
                    if b"native_layer_norm" in ANSI.sub(b"", bytes(received)) or proc.poll() is not None:
                        break
                    page.wait_for_timeout(100)
                page.wait_for_timeout(1500)  # the terminal paints what it received
                page.screenshot(path=str(shot))
            finally:
                browser.close()
    finally:
        tunnel.close()
    text = ANSI.sub(b"", bytes(received)).decode("utf-8", "replace")
    assert "native_layer_norm" in text and "Overview" in text, (text[-2000:], proc.poll())
    assert re.search(r"run-[0-9a-f]{12}", text)
    assert shot.stat().st_size > 10_000  # a picture of the app, not a blank page
