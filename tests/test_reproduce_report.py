"""scripts/reproduce.py --report-only on the recorded H200 ResNet-50 run shipped as the TUI demo."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO_DB = ROOT / "kforge_tui" / "demo" / "kforge.db"


def _report(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/reproduce.py", "--out", str(out), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_report_from_a_recorded_run(tmp_path):
    (tmp_path / "resnet50").mkdir()
    shutil.copy(DEMO_DB, tmp_path / "resnet50" / "kforge.db")
    p = _report(tmp_path, "--report-only", "--models", "resnet50,sd35_medium")
    assert p.returncode == 0, p.stderr
    text = (tmp_path / "report.md").read_text()
    assert "- sd35_medium: not run yet" in text
    won = [ln for ln in text.splitlines() if ln.startswith("| resnet50 | `aten::")]
    assert any("`aten::native_batch_norm`" in ln for ln in won) and any("`aten::mean.dim`" in ln for ln in won)
    # No cast file next to the run: the end-to-end row says why instead of inventing numbers.
    assert "| resnet50 | – | – | no cast exported" in text
    # The original study's numbers sit beside ours, with the GPUs named.
    assert "| adaptive_avg_pool2d (resnet50) | 1.52× | 2.48× |" in text and "GB10" in text


def test_unknown_model_is_bad_input(tmp_path):
    p = _report(tmp_path, "--report-only", "--models", "bert")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "bert" in p.stderr
