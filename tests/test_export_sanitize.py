"""`export --sanitize`: compute-sanitizer on each confirmed variant. On a CPU: the log parser on logs as
compute-sanitizer 2025 (CUDA 13.0) writes them on an H200, what drops a variant and what is only a
warning, the missing tool (exit 2, one line), and the flag's way from the CLI through export to the
report, with the sanitizer's process replaced by a stand-in that writes what the real one would. The
gpu-marked test at the end runs the real tool on a tiny cast."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import run_cli

from engine.export import sanitize
from engine.export.sanitize import ToolRun, judge, parse_log

# (The tool ends each message with "========= " and a trailing space; the samples here leave it out, and
# test_the_separator_with_or_without_its_space parses both.)
# compute-sanitizer --tool memcheck on a kernel `oob` whose 64 threads all write past a 1,024-byte buffer
# (records 3 to 63 left out here: the same message with other threads and addresses), then the API error it
# leaves behind.
MEMCHECK_OOB = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at oob+0xb0
=========     by thread (0,0,0) in block (0,0,0)
=========     Access to 0x7f2944800400 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f2944800000 of size 1,024 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: main [0x8d30] in bad
=========
========= Invalid __global__ write of size 4 bytes
=========     at oob+0xb0
=========     by thread (1,0,0) in block (0,0,0)
=========     Access to 0x7f2944800404 is out of bounds
=========     and is 5 bytes after the nearest allocation at 0x7f2944800000 of size 1,024 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: main [0x8d30] in bad
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cudaDeviceSynchronize.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: main [0x8e1d] in bad
=========
========= ERROR SUMMARY: 3 errors
"""

RACECHECK_RACE = """========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at racy+0xa0
=========     and Read access at racy+0xb0 [1024 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""

SYNCCHECK_DIVERGENT = """========= COMPUTE-SANITIZER
========= Barrier error detected. Divergent thread(s) in warp.
=========     at divg+0xc0
=========     by thread (0,0,0) in block (0,0,0)
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: main [0x8e18] in bad
=========
========= Barrier error detected. Divergent thread(s) in warp.
=========     at divg+0xc0
=========     by thread (1,0,0) in block (0,0,0)
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: main [0x8e18] in bad
=========
========= ERROR SUMMARY: 2 errors
"""

MEMCHECK_CLEAN = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"
RACECHECK_CLEAN = "========= COMPUTE-SANITIZER\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"


def test_memcheck_findings_in_the_variants_kernel_and_elsewhere():
    log = parse_log(MEMCHECK_OOB, ["oob"])
    assert log.ours == ["Invalid __global__ write of size 4 bytes at oob+0xb0 (2 times)"]
    assert log.others == ['Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on '
                          "CUDA API call to cudaDeviceSynchronize."]
    assert log.summary == 3 and log.ours_warnings == []
    # The same log for a variant whose kernel is another: nothing in it is that variant's.
    other = parse_log(MEMCHECK_OOB, ["group_norm_fwd"])
    assert other.ours == [] and len(other.others) == 2
    # A host frame that happens to share a name does not place the error in the kernel.
    assert parse_log(MEMCHECK_OOB, ["main", "bad"]).ours == []
    # A kernel name is matched whole: `oo` is not `oob`.
    assert parse_log(MEMCHECK_OOB, ["oo"]).ours == []


def test_racecheck_and_synccheck_findings():
    race = parse_log(RACECHECK_RACE, ["racy"])
    assert race.ours == ["Race reported between Write access at racy+0xa0"] and race.summary == 1
    sync = parse_log(SYNCCHECK_DIVERGENT, ["divg"])
    assert sync.ours == ["Barrier error detected. Divergent thread(s) in warp. at divg+0xc0 (2 times)"]
    assert sync.summary == 2
    warning = RACECHECK_RACE.replace("Error: Race", "Warning: Race").replace("(1 error, 0 warnings)",
                                                                            "(0 errors, 1 warning)")
    w = parse_log(warning, ["racy"])
    assert w.ours == [] and w.ours_warnings == ["Warning: Race reported between Write access at racy+0xa0"]
    assert w.summary == 0


def test_the_separator_with_or_without_its_space():
    as_written = MEMCHECK_OOB.replace("=========\n", "========= \n")
    assert as_written != MEMCHECK_OOB
    assert parse_log(as_written, ["oob"]) == parse_log(MEMCHECK_OOB, ["oob"])


def test_clean_logs_and_program_output_in_between():
    assert parse_log(MEMCHECK_CLEAN, ["k"]).summary == 0
    assert parse_log(RACECHECK_CLEAN, ["k"]).summary == 0
    mixed = "sync: no error\n" + MEMCHECK_CLEAN + "735.125\n"  # the program's own lines carry no prefix
    log = parse_log(mixed, ["k"])
    assert (log.ours, log.others, log.summary) == ([], [], 0)
    assert parse_log("", ["k"]).summary is None  # the tool never finished


def _run(log: str, result: dict | None = None, code: int | None = 0, output: str = "") -> ToolRun:
    return ToolRun(code, output, log, {"ok": True, "hits": 2} if result is None else result)


def test_what_drops_a_variant_and_what_is_only_a_warning():
    ok, why, warnings = judge("memcheck", _run(MEMCHECK_OOB, {"error": "RuntimeError: CUDA error"}, 1), ["oob"], 300)
    assert not ok and why == "compute-sanitizer memcheck: Invalid __global__ write of size 4 bytes at oob+0xb0 (2 times)"
    assert warnings == ["compute-sanitizer memcheck reported 1 finding(s) outside its kernels (PyTorch's own or CUDA "
                        'API calls), not held against it: Program hit cudaErrorLaunchFailure (error 719) due to '
                        '"unspecified launch failure" on CUDA API call to cudaDeviceSynchronize.']
    # PyTorch's own findings alone do not drop it.
    ok, why, warnings = judge("memcheck", _run(MEMCHECK_OOB, code=86), ["relu_kernel"], 300)
    assert ok and why is None and len(warnings) == 1
    assert judge("racecheck", _run(RACECHECK_RACE, code=86), ["racy"], 300)[:2] == (
        False, "compute-sanitizer racecheck: Race reported between Write access at racy+0xa0")
    assert judge("racecheck", _run(RACECHECK_CLEAN), ["k"], 300) == (True, None, [])
    # A run that cannot vouch for the kernel drops it too.
    assert judge("racecheck", _run("", code=None), ["k"], 300)[:2] == (
        False, "compute-sanitizer racecheck did not finish in 300 s")
    crashed = ToolRun(-11, "Fatal Python error: Segmentation fault\n", "========= COMPUTE-SANITIZER\n", None)
    assert judge("memcheck", crashed, ["k"], 300)[:2] == (
        False, "compute-sanitizer memcheck: the run ended without a result (exit -11): Fatal Python error: "
               "Segmentation fault")
    assert judge("memcheck", _run(MEMCHECK_CLEAN, {"error": "RuntimeError: boom"}, 1), ["k"], 300)[:2] == (
        False, "compute-sanitizer memcheck: the op failed under the sanitizer: RuntimeError: boom")
    missed = {"ok": False, "reason": "the guard never matched the variant's own inputs: its kernels did not run"}
    assert judge("synccheck", _run(MEMCHECK_CLEAN, missed), ["k"], 300)[:2] == (
        False, "compute-sanitizer synccheck: the guard never matched the variant's own inputs: its kernels did "
               "not run")
    assert judge("memcheck", _run("========= COMPUTE-SANITIZER\n", code=0, output="Killed"), ["k"], 300)[:2] == (
        False, "compute-sanitizer memcheck printed no summary (exit 0), so its run cannot vouch for the kernel: "
               "Killed")


def _no_sanitizer(monkeypatch, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.setattr(sanitize, "FALLBACK_DIRS", (str(tmp_path / "nowhere"),))


def test_export_sanitize_without_the_tool_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    _no_sanitizer(monkeypatch, tmp_path)
    code, out, err = run_cli(["export", "--out", tmp_path / "x.cast", "--workspace", tmp_path / "ws", "--sanitize"],
                             capsys)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "error: export --sanitize: compute-sanitizer not found (not on PATH, in $CUDA_HOME/bin or "
        f"{tmp_path / 'nowhere'}); install the CUDA toolkit's compute-sanitizer or put its bin folder on PATH"]
    assert not (tmp_path / "x.cast").exists()


def test_compute_sanitizer_is_found_on_path_then_in_cuda_home(tmp_path, monkeypatch):
    _no_sanitizer(monkeypatch, tmp_path)
    assert sanitize.find_sanitizer() is None
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    exe = home / "bin" / "compute-sanitizer"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert sanitize.find_sanitizer() == str(exe)
    monkeypatch.setenv("PATH", str(home / "bin"))
    assert sanitize.require_sanitizer() == str(exe)


def test_the_cli_hands_sanitize_and_its_timeout_to_export(tmp_path, capsys, monkeypatch):
    import engine.export.package as export

    seen = {}

    def fake_export_run(workspace, run_id, out, **kw):
        seen.update(kw)
        return export.ExportResult(out, [], [], [])

    monkeypatch.setattr(export, "export_run", fake_export_run)
    args = ["export", "--out", tmp_path / "x.cast", "--workspace", tmp_path / "ws"]
    assert run_cli([*args, "--sanitize", "--sanitize-timeout", "60"], capsys)[0] == 0
    assert seen["sanitize"] is True and seen["sanitize_timeout_s"] == 60.0
    assert run_cli(args, capsys)[0] == 0
    assert seen["sanitize"] is False and seen["sanitize_timeout_s"] is None
    code, out, err = run_cli([*args, "--sanitize-timeout", "0"], capsys)
    assert code == 2


def _stand_in(calls: list, faults: dict[tuple[str, str], str], timeout: set[str] = frozenset()):
    """run_sanitizer as the real tool would behave: a log and the child's result per (variant, tool)."""
    def run(argv, env, timeout_s):
        calls.append((argv, env, timeout_s))
        tool = argv[argv.index("--tool") + 1]
        vid = argv[argv.index("--variant") + 1]
        log, out = Path(argv[argv.index("--log-file") + 1]), Path(argv[argv.index("--out") + 1])
        if vid in timeout:
            return None, ""
        finding = faults.get((vid, tool))
        log.write_text(finding or (RACECHECK_CLEAN if tool == "racecheck" else MEMCHECK_CLEAN))
        out.write_text(json.dumps({"ok": True, "hits": 2, "calls": 2}))
        return (86 if finding else 0), ""
    return run


def test_export_leaves_out_a_variant_the_sanitizer_faults_and_says_why(tmp_path, monkeypatch):
    from cast_helpers import H200_ENV, genuine_variants

    import engine.export.package as package
    from engine.export.report import markdown_report

    gn, relu = [v for v in genuine_variants()]
    gn, relu = (package.ExportVariant(v.card, v.candidate, v.cubin, v.ptx, v.arch, list(s), {"speedup": 2.0})
                for v, s in ((gn, ["/samples/gn-0.safetensors"]), (relu, [])))
    gn_kernel = package._kernels(gn.candidate["launch_spec"])[0]
    fault = MEMCHECK_OOB.replace("oob+", f"{gn_kernel}+")
    pytorch_noise = MEMCHECK_OOB.replace("oob+", "vectorized_elementwise_kernel+")
    calls: list = []
    monkeypatch.setattr(sanitize, "run_sanitizer", _stand_in(calls, {(gn.vid, "memcheck"): fault,
                                                                     (relu.vid, "memcheck"): pytorch_noise}))
    source, excluded, warnings = {"run": "r", "model": "m", "provider": "builtin"}, [], []
    kept = package.sanitize_kept([gn, relu], H200_ENV, source, excluded, "/opt/cuda/bin/compute-sanitizer", None,
                                 lambda m: None, warnings.append)
    assert [v.vid for v in kept] == [relu.vid]
    assert excluded == [{"card_id": gn.card["card_id"], "op": "aten::native_group_norm",
                         "reason": f"compute-sanitizer memcheck: Invalid __global__ write of size 4 bytes at "
                                   f"{gn_kernel}+0xb0 (2 times)"}]
    assert relu.sanitizer == {"tools": ["memcheck", "racecheck", "synccheck"],
                              "inputs": "synthesised from the signature"}
    assert len(warnings) == 2 and all(w.startswith(f"{relu.vid}: compute-sanitizer memcheck reported 2 finding(s) "
                                                   "outside its kernels") or
                                      w.startswith(f"{gn.vid}: compute-sanitizer memcheck reported 1 finding(s)")
                                      for w in warnings)
    # What ran: the group_norm variant stopped at memcheck; relu went through all three tools.
    ran = [(a[a.index("--variant") + 1], a[a.index("--tool") + 1]) for a, _, _ in calls]
    assert ran == [(gn.vid, "memcheck"), (relu.vid, "memcheck"), (relu.vid, "racecheck"), (relu.vid, "synccheck")]
    argv, env, timeout_s = calls[0]
    assert argv[:2] == ["/opt/cuda/bin/compute-sanitizer", "--tool"] and "--error-exitcode" in argv
    assert argv[argv.index("-m") + 1] == "engine.export.sanitize"
    assert argv[argv.index("--samples") + 1:] == ["/samples/gn-0.safetensors"]
    assert "--samples" not in calls[1][0]
    assert env["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1" and timeout_s == 300
    assert source["sanitizer"] == {"tools": ["memcheck", "racecheck", "synccheck"], "timeout_s": 300}
    manifest, _, report = package.package(kept, H200_ENV, source, excluded)
    (v,) = manifest["variants"]
    assert v["evidence"]["sanitizer"]["tools"] == ["memcheck", "racecheck", "synccheck"]
    assert ("- compute-sanitizer: memcheck, racecheck, synccheck found no fault in its kernels (run on synthesised "
            "from the signature)") in report
    assert f"| {gn.card['card_id'][:8]} | `aten::native_group_norm` | compute-sanitizer memcheck: Invalid" in report
    assert "compute-sanitizer" not in markdown_report(package.package([gn], H200_ENV, {})[0])  # not asked: silent


def test_a_sanitizer_run_that_does_not_finish_drops_the_variant(monkeypatch):
    from cast_helpers import H200_ENV, genuine_variants

    import engine.export.package as package

    relu = genuine_variants()[1]
    relu = package.ExportVariant(relu.card, relu.candidate, relu.cubin, relu.ptx, relu.arch)
    calls: list = []
    monkeypatch.setattr(sanitize, "run_sanitizer", _stand_in(calls, {}, timeout={relu.vid}))
    excluded: list = []
    kept = package.sanitize_kept([relu], H200_ENV, {}, excluded, "cs", 5.0, lambda m: None)
    assert kept == [] and excluded[0]["reason"] == "compute-sanitizer memcheck did not finish in 5 s"
    assert calls[0][2] == 5.0


@pytest.mark.gpu
def test_the_real_sanitizer_passes_a_correct_kernel_and_drops_an_out_of_bounds_one(tmp_path):
    """H200 (not run on the CPU machine it was written on): a cast with the builtin relu kernel and an add
    kernel that writes 256 floats past its output; compute-sanitizer passes the first, memcheck drops the
    second naming its kernel."""
    import torch
    from adversarial_kernels import add_kernel
    from cast_helpers import captured_card, genuine_variants

    from engine.cast.compat import current_env
    from engine.cast.format import write_cast
    from engine.compile import compile_nvrtc
    from engine.export.package import ExportVariant, _child_env, _kernels, package

    tool = sanitize.find_sanitizer()
    if tool is None:
        pytest.skip("compute-sanitizer is not installed here")
    a, b = torch.randn(4096), torch.randn(4096)
    card = captured_card(lambda: a + b, "aten::add.Tensor")
    bad = add_kernel("writes past its output", "  if (i < n + 256) out[i] = a[i % n] + b[i % n];", None,
                     kernel="add_oob")
    res = compile_nvrtc(bad.source, arch="sm_90")
    assert res.ok, res.summary()
    oob = ExportVariant(card, {"id": "cand-oob", "source": bad.source, "launch_spec": bad.spec,
                               "proposer": "test"}, res.cubin, res.ptx, "sm_90")
    relu = genuine_variants()[1]
    env = current_env()
    manifest, files, report = package([relu, oob], env, {"run": "r", "model": "m", "provider": "test"})
    cast = tmp_path / "t.cast"
    write_cast(cast, manifest, files, report)
    clean = sanitize.check_variant(tool, cast, relu.vid, _kernels(relu.candidate["launch_spec"]), [], tmp_path,
                                   _child_env())
    assert clean["ok"], clean
    assert clean["tools"] == list(sanitize.TOOLS)
    faulty = sanitize.check_variant(tool, cast, oob.vid, ["add_oob"], [], tmp_path, _child_env(),
                                    tools=("memcheck",))
    assert not faulty["ok"]
    assert faulty["reason"].startswith("compute-sanitizer memcheck: Invalid __global__ write of size 4 bytes at "
                                       "add_oob+0x"), faulty
    print(f"\nsanitizer: {clean}\n{faulty}\n" + "\n".join(os.listdir(tmp_path)))


def test_memcheck_pads_every_allocation_so_a_write_into_the_next_buffer_shows(tmp_path):
    argv = sanitize.argv_for("compute-sanitizer", "memcheck", tmp_path / "log", tmp_path / "c.cast", "v1", [],
                             tmp_path / "out.json")
    assert argv[argv.index("--padding") + 1] == str(sanitize.PADDING_BYTES) and sanitize.PADDING_BYTES >= 4096
    race = sanitize.argv_for("compute-sanitizer", "racecheck", tmp_path / "log", tmp_path / "c.cast", "v1", [],
                             tmp_path / "out.json")
    assert "--padding" not in race
