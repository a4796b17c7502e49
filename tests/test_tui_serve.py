"""`kforge-tui serve` starts a web server on the loopback address only, and refuses any other host."""

import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import ROOT

pytest.importorskip("textual_serve")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_binds_loopback_and_serves_the_page(tmp_path):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kforge_tui", "serve", "--demo", "--port", str(port)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                    page = r.read().decode()
                break
            except OSError:
                assert time.time() < deadline, "serve never answered on 127.0.0.1"
                time.sleep(0.2)
        assert "Kernel Forge" in page
        listening = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
        if listening.strip():  # where `ss` exists: every listening socket on the port is loopback
            addrs = [line.split()[3].rsplit(":", 1)[0] for line in listening.splitlines()]
            assert addrs and all(a in ("127.0.0.1", "[::1]") for a in addrs), listening
    finally:
        proc.terminate()
        proc.wait(10)
    assert "http://127.0.0.1:" in proc.stderr.read()


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "example.com"])
def test_serve_refuses_other_hosts(host):
    proc = subprocess.run([sys.executable, "-m", "kforge_tui", "serve", "--demo", "--host", host],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "loopback" in lines[0] and host in lines[0], proc.stderr
