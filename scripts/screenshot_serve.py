"""Screenshot `kforge-tui serve --demo` in headless Chromium, reached through a forwarded local port.

    pip install playwright && apt-get install chromium     # Debian's Chromium; no browser download
    python scripts/screenshot_serve.py --out docs/results/tui

The server listens on one port; the browser loads the page from another, through a TCP forwarder that
stands in for `ssh -L LOCAL:127.0.0.1:PORT box` (the page must not hard-code the server's port). The
script waits for the app to draw, presses `c` (the cards screen) and `g` (the run's charts), and writes
serve-overview.png, serve-cards.png and serve-charts.png. Exit 1 when the page never drew the app.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def forward(listen: int, target: int) -> threading.Thread:
    """A TCP forwarder 127.0.0.1:listen -> 127.0.0.1:target in a daemon thread (what `ssh -L` does)."""

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        finally:
            w.close()

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        tr, tw = await asyncio.open_connection("127.0.0.1", target)
        await asyncio.gather(pipe(r, tw), pipe(tr, w), return_exceptions=True)

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", listen)
        async with server:
            await server.serve_forever()

    t = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    t.start()
    return t


def wait_listening(port: int, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.2)
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("docs/results/tui"))
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = ap.parse_args()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("screenshot_serve: playwright is not installed; fix: pip install playwright", file=sys.stderr)
        return 2
    if not Path(args.chromium).exists():
        print(f"screenshot_serve: no Chromium at {args.chromium}; fix: apt-get install chromium, or --chromium PATH",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    port, local = free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-m", "kforge_tui", "serve", "--demo", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not wait_listening(port, 30):
            print("screenshot_serve: the server never listened", file=sys.stderr)
            return 1
        forward(local, port)
        flags = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=flags)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"http://127.0.0.1:{local}/")  # the forwarded port, not the server's
            page.mouse.click(700, 450)  # textual-serve starts the app on the first click
            # The app draws into xterm.js's rows; wait until the header's title is there.
            page.wait_for_function("document.body.innerText.includes('Kernel Forge')", timeout=60_000)
            time.sleep(2)
            page.screenshot(path=str(args.out / "serve-overview.png"))
            page.locator("textarea").first.focus()  # xterm.js takes keys through its helper textarea
            page.keyboard.press("c")
            time.sleep(4)
            page.screenshot(path=str(args.out / "serve-cards.png"))
            page.keyboard.press("g")  # the run's charts
            time.sleep(4)
            page.screenshot(path=str(args.out / "serve-charts.png"))
            browser.close()
        print(f"wrote serve-overview.png, serve-cards.png and serve-charts.png in {args.out} "
              f"(server on port {port}, page loaded through port {local})")
        return 0
    except Exception as e:  # the page never drew: say so in one line
        print(f"screenshot_serve: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
