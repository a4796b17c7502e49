"""`auto` mode trusts the C++ router only after its self-test passed in a child process on this GPU: a
crash there (SIGSEGV on guard misses, as seen on an H200) becomes one reason and the Python router."""

import subprocess
import sys

from engine.cast import cpp_router


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_crashing_self_test_names_the_signal_and_the_call():
    why = cpp_router._self_test(_child(
        "import ctypes\n"
        "print('router self-test: hit', flush=True)\n"
        "print('router self-test: near miss (other dtype)', flush=True)\n"
        "ctypes.string_at(0)\n"))
    assert why is not None
    assert "crashed with SIGSEGV at 'near miss (other dtype)'" in why
    assert "KFORGE_CAST_ROUTER=cpp" in why


def test_the_self_test_output_is_kept_and_named(tmp_path):
    log = tmp_path / "selftest.log"
    why = cpp_router._self_test(_child("import sys; print('router self-test: hit'); print('boom', file=sys.stderr); "
                                       "sys.exit(1)"), log_path=log)
    assert f"(its output: {log})" in why
    text = log.read_text()
    assert "exit 1" in text and "router self-test: hit" in text and "boom" in text


def test_a_failing_self_test_gives_its_exit_code_and_a_passing_one_none():
    assert "failed with exit code 1" in cpp_router._self_test(_child("raise SystemExit(1)"))
    assert cpp_router._self_test(_child("print('router self-test: passed')")) is None


def test_a_hanging_self_test_is_cut_off():
    why = cpp_router._self_test(_child("import time; time.sleep(30)"), timeout_s=1)
    assert why is not None and "did not finish in 1 s" in why


def test_the_verdict_is_remembered_beside_the_build(tmp_path):
    runs = []

    def crash():
        runs.append(1)
        return "its self-test on this GPU crashed with SIGSEGV"

    assert cpp_router._verdict("kforge_router_x", cache_dir=tmp_path, run=crash).endswith("SIGSEGV")
    assert cpp_router._verdict("kforge_router_x", cache_dir=tmp_path, run=crash).endswith("SIGSEGV")
    assert runs == [1]  # the second process reads the verdict instead of testing again
    other = tmp_path / "other"
    assert cpp_router._verdict("kforge_router_y", cache_dir=other, run=lambda: None) is None
    assert cpp_router._verdict("kforge_router_y", cache_dir=other, run=crash) is None  # passed, remembered
    assert runs == [1]
    assert not list(tmp_path.glob("*.tmp")) and not list(other.glob("*.tmp"))  # written whole, renamed


def test_an_empty_verdict_file_is_no_verdict_and_the_test_runs_again(tmp_path):
    # What a reader sees while another process writes its verdict (or after a full disk): not a pass.
    import hashlib

    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    (tmp_path / f"selftest-{hashlib.sha256(gpu.encode()).hexdigest()[:10]}.txt").write_text("")
    runs = []

    def crash():
        runs.append(1)
        return "its self-test on this GPU crashed with SIGSEGV"

    assert cpp_router._verdict("kforge_router_z", cache_dir=tmp_path, run=crash).endswith("SIGSEGV")
    assert runs == [1]


def test_the_self_test_module_runs_and_says_when_there_is_no_gpu():
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: tests/test_cast_cpp_router.py::test_router_self_test_passes_on_the_gpu")
    r = subprocess.run([sys.executable, "-m", "engine.export.router_selftest"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 3 and "no CUDA GPU here" in r.stdout


def test_the_self_test_cast_compiles_for_sm90_here(tmp_path, monkeypatch):
    """The cast the GPU self-test routes (relu fp16, x + 1e-6 in fp32, a mean over the last dim) renders from the builtin templates
    and compiles with NVRTC for sm_90; built here from the same calls on CPU tensors, described as on the GPU."""
    import torch
    from card_helpers import cudaify

    from engine.cast import compat
    from engine.cast.format import read_cast
    from engine.export.hostcost import package_cards, probe_card

    env = dict(compat.current_env(), arch="sm_90", gpu="NVIDIA H200", compute_capability=[9, 0])
    monkeypatch.setattr(compat, "current_env", lambda: env)
    x = torch.randn(4096, dtype=torch.float16)
    cards = [cudaify(probe_card("probe0", torch.ops.aten.relu.default, (x,))),
             cudaify(probe_card("probe1", torch.ops.aten.add.Tensor, (x.float(), 1e-6))),
             cudaify(probe_card("probe2", torch.ops.aten.mean.dim, (torch.randn(64, 4096), [-1], True)))]
    cast = read_cast(package_cards(tmp_path / "selftest.cast", cards))
    assert [v["op"] for v in cast.variants] == ["aten::relu", "aten::add.Tensor", "aten::mean.dim"]
    assert "other=1e-06" in cast.variants[1]["signature_text"]
    cubins = [n for n in cast.files if n.endswith(".sm_90.cubin")]
    assert len(cubins) == 3 and all(len(cast.files[n]) > 1000 for n in cubins)
