"""The engine never imports Textual: every engine module, and a whole headless capture, run without it."""

import subprocess
import sys

from conftest import CONFIGS, ROOT

PROBE = r'''
import importlib, pkgutil, sys
import engine
for m in pkgutil.walk_packages(engine.__path__, "engine."):
    importlib.import_module(m.name)
import kforge_tui.cli
code = kforge_tui.cli.main(["capture", sys.argv[1], "--small", "--device", "cpu", "--json",
                            "--workspace", sys.argv[2]])
assert code == 0, code
loaded = sorted(m for m in sys.modules if m == "textual" or m.startswith("textual."))
print("TEXTUAL:", loaded, file=sys.stderr)
'''


def test_engine_and_headless_capture_never_import_textual(tmp_path):
    proc = subprocess.run([sys.executable, "-c", PROBE, str(CONFIGS / "examples" / "my_model.toml"),
                           str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "TEXTUAL: []" in proc.stderr
    assert '"model":"my_model"' in proc.stdout
