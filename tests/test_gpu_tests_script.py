"""scripts/gpu_tests.py: one process per GPU test, so a crash is one named row, not a lost session."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_tests.py"


def _run_suite(tmp_path: Path, source: str) -> tuple[subprocess.CompletedProcess, Path]:
    """gpu_tests.py over a one-file suite; (its process, its output folder)."""
    tests = tmp_path / "suite"
    tests.mkdir()
    (tests / "test_probe.py").write_text(source)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), str(tests)], capture_output=True, text=True,
                       timeout=300)
    return r, out


def test_a_crashing_test_is_one_row_and_the_next_test_still_runs(tmp_path):
    r, out = _run_suite(
        tmp_path,
        "import ctypes\nimport pytest\n\n"
        "@pytest.mark.gpu\ndef test_a_crash():\n    print('about to crash', flush=True)\n    ctypes.string_at(0)\n\n"
        "@pytest.mark.gpu\ndef test_b_fine():\n    assert True\n\n"
        "@pytest.mark.gpu\ndef test_c_wrong():\n    assert 1 == 2\n")
    assert r.returncode == 1, r.stdout + r.stderr
    md = (out / "gpu_tests.md").read_text()
    rows = [ln for ln in md.splitlines() if ln.startswith("| `")]
    assert len(rows) == 3
    assert "test_a_crash" in rows[0] and "crashed (SIGSEGV)" in rows[0]
    assert "test_b_fine" in rows[1] and "| passed |" in rows[1]
    assert "test_c_wrong" in rows[2] and "| failed |" in rows[2]
    assert "1 crashed (SIGSEGV), 1 failed, 1 passed" in md
    assert "Segmentation fault" in (out / "logs" / "01.log").read_text()  # faulthandler's trace is kept


def test_nothing_to_run_is_a_usage_error(tmp_path):
    tests = tmp_path / "suite"  # a one-file suite: collecting the project's whole suite takes a minute
    tests.mkdir()
    (tests / "test_probe.py").write_text("import pytest\n\n@pytest.mark.gpu\ndef test_gpu():\n    pass\n")
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "out"), "-k", "no_such_test", str(tests)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "matches -k 'no_such_test'" in r.stderr


def test_a_test_killed_by_a_signal_python_does_not_name_says_its_number(tmp_path):
    import signal

    # Real-time signals have no name in Python's signal.Signals; killing itself with one, the test dies by it.
    r, out = _run_suite(
        tmp_path,
        "import os, signal\nimport pytest\n\n"
        "@pytest.mark.gpu\ndef test_rt():\n    signal.signal(signal.SIGRTMIN + 3, signal.SIG_DFL)\n"
        "    os.kill(os.getpid(), signal.SIGRTMIN + 3)\n")
    number = int(signal.SIGRTMIN) + 3
    assert r.returncode == 1, r.stderr
    assert f"crashed (signal {number})" in (out / "gpu_tests.md").read_text()
