"""scripts/reproduce.py --report-only on a recorded H200 ResNet-50 run (the TUI demo until 2026-12-01)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import load_script

ROOT = Path(__file__).resolve().parent.parent
DEMO_DB = ROOT / "tests" / "fixtures" / "resnet50-h200-run.db"  # builtin proposer, default budget


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
    # Parts that did not run say so rather than vanish: no torch.compile of the model, no target cards or ablation.
    assert "- resnet50: not measured here (`compile.json` has no whole-model result)" in text
    for part in ("## Issue-4 target cards", "## Search ablation"):
        assert text.split(part, 1)[1].lstrip().startswith("not run into this folder"), part


def test_an_export_that_refused_says_why_in_the_end_to_end_row(tmp_path):
    (tmp_path / "resnet50").mkdir()
    shutil.copy(DEMO_DB, tmp_path / "resnet50" / "kforge.db")
    (tmp_path / "resnet50" / "steps.log").write_text(
        "[reproduce 08:34:51] resnet50 export: ...\n"
        "error: export: resnet50 is slower with the cast in eager forwards (2 variant(s): 0.920x (95% CI "
        "0.899-0.964)); nothing written\n[reproduce 08:35:00] resnet50 export: exit 1 in 8 s\n")
    p = _report(tmp_path, "--report-only", "--models", "resnet50")
    assert p.returncode == 0, p.stderr
    row = next(ln for ln in (tmp_path / "report.md").read_text().splitlines() if ln.startswith("| resnet50 | – |"))
    assert "no cast: resnet50 is slower with the cast in eager forwards (2 variant(s): 0.920x" in row


def test_unknown_model_is_bad_input(tmp_path):
    p = _report(tmp_path, "--report-only", "--models", "bert")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "bert" in p.stderr


def _reproduce_module():
    return load_script("reproduce")


def test_a_step_counts_as_done_only_when_it_finished(tmp_path):
    # A sitting killed mid-step (a time limit) must not leave a file that makes the next sitting skip it.
    rp = _reproduce_module()
    out, log = tmp_path / "run.json", tmp_path / "steps.log"
    failing = [sys.executable, "-c", "print('{\"partial\": 1}'); raise SystemExit(3)"]
    assert rp.step("run", out, failing, log, stdout=out) == 3
    assert not out.exists()
    out.write_text("")  # what an older reproduce left behind when its sitting was killed
    ok = [sys.executable, "-c", "print('{\"status\": \"done\"}')"]
    assert rp.step("run", out, ok, log, stdout=out) == 0
    assert out.read_text().strip() == '{"status": "done"}'
    assert rp.step("run", out, failing, log, stdout=out) == 0  # done: not run again
    assert out.read_text().strip() == '{"status": "done"}'


def test_a_whole_model_max_autotune_that_outlasts_its_limit_is_measured_in_the_default_mode(tmp_path):
    mod = load_script("bench_compile_ops")
    modes = []

    def child(config, small, timeout_s, mode):  # max-autotune outlasts its limit; the default mode finishes
        modes.append(mode)
        if mode == mod.MODE:
            return {"error": f"torch.compile ({mode}) of the whole model did not finish in 480 s", "timed_out": True}
        return {"eager_ms": 10.0, "compile_ms": 7.5, "mode": mode}

    r = mod.whole_model_compiled("configs/models/gemma4_e2b.toml", False, 480, child=child)
    assert modes == [mod.MODE, "default"]
    assert r["compile_ms"] == 7.5 and r["mode"] == "default" and "did not finish in 480 s" in r["instead_of"]
    # The report names the mode beside the number, and why.
    (tmp_path / "resnet50").mkdir()
    shutil.copy(DEMO_DB, tmp_path / "resnet50" / "kforge.db")
    (tmp_path / "resnet50" / "compile.json").write_text(json.dumps({"ops": [], "whole_model": r}))
    p = _report(tmp_path, "--report-only", "--models", "resnet50")
    assert p.returncode == 0, p.stderr
    text = (tmp_path / "report.md").read_text()
    assert ("- resnet50: torch.compile's default mode, 7.50 ms: torch.compile (max-autotune-no-cudagraphs) of the "
            "whole model did not finish in 480 s") in text
    # The compiled model's time stands beside the eager time of the same measurement.
    assert "| 7.50 (eager 10.00) |" in text
    # Both modes outlasting it: one error naming both.
    r = mod.whole_model_compiled("x.toml", False, 480, child=lambda c, s, t, m: {
        "error": f"torch.compile ({m}) of the whole model did not finish in 480 s", "timed_out": True})
    assert "max-autotune-no-cudagraphs" in r["error"] and "in the default mode: torch.compile (default)" in r["error"]


def test_a_whole_model_compile_asked_for_in_the_default_mode_says_so(tmp_path):
    # `reproduce.py --compile-mode default` skips a max-autotune known to outlast its limit; the report names
    # the mode beside the number.
    (tmp_path / "resnet50").mkdir()
    shutil.copy(DEMO_DB, tmp_path / "resnet50" / "kforge.db")
    whole = {"eager_ms": 12.0, "compile_ms": 9.25, "mode": "default", "asked_mode": "default"}
    (tmp_path / "resnet50" / "compile.json").write_text(json.dumps({"ops": [], "whole_model": whole}))
    p = _report(tmp_path, "--report-only", "--models", "resnet50")
    assert p.returncode == 0, p.stderr
    text = (tmp_path / "report.md").read_text()
    assert "- resnet50: torch.compile's default mode (asked for with `--compile-mode`), 9.25 ms" in text
    assert "| 9.25 (eager 12.00) |" in text
    # A part of the config benchmarked on its own (SD3.5's VAE beside the whole sd35_medium) does not get the
    # whole config's compiled time.
    e2e = {"models": [dict(model=m, eager_ms=e, cast_ms=c, speedup=e / c, speedup_ci=[1.0, 1.1], rel_l2_err=0.0)
                      for m, e, c in (("resnet50_head", 3.0, 2.0), ("resnet50", 12.0, 10.0))]}
    (tmp_path / "resnet50" / "e2e").mkdir()
    (tmp_path / "resnet50" / "e2e" / "bench_e2e.json").write_text(json.dumps(e2e))
    assert _report(tmp_path, "--report-only", "--models", "resnet50").returncode == 0
    rows = [ln for ln in (tmp_path / "report.md").read_text().splitlines() if ln.startswith("| resnet50")]
    assert rows[0].startswith("| resnet50_head | 3.00 | 2.00 | 1.500× (1.000–1.100) | – | – |"), rows
    assert rows[1].startswith("| resnet50 | 12.00 | 10.00 | 1.200× (1.000–1.100) | – | 9.25 (eager 12.00) |"), rows
    bad = _report(tmp_path, "--report-only", "--compile-mode", "fastest")
    assert bad.returncode == 2 and "--compile-mode" in bad.stderr


def test_whole_model_compile_that_outlasts_its_limit_is_reported_not_fatal():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_compile_ops", ROOT / "scripts" / "bench_compile_ops.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = mod.whole_model_in_child("configs/models/resnet50.toml", False, timeout_s=0.05)
    assert r["error"] == "torch.compile (max-autotune-no-cudagraphs) of the whole model did not finish in 0 s"
    assert r["timed_out"] is True


def test_models_are_shared_out_over_gpus_one_process_each(tmp_path):
    # Each GPU's process takes the next model when it ends; every process sees only its own GPU.
    mod = _reproduce_module()
    script = ("import os, sys, time; time.sleep(0.3); "
              "open(sys.argv[1], 'w').write(os.environ['CUDA_VISIBLE_DEVICES']); sys.exit(3 if 'bad' in sys.argv[1] else 0)")
    codes = mod.on_gpus(["m1", "m2", "m3", "bad4"], ["0", "1"],
                        lambda m: [sys.executable, "-c", script, str(tmp_path / f"{m}.gpu")], tmp_path)
    assert codes == {"m1": 0, "m2": 0, "m3": 0, "bad4": 3}
    used = {m: (tmp_path / f"{m}.gpu").read_text() for m in ("m1", "m2", "m3", "bad4")}
    assert used["m1"] != used["m2"] and set(used.values()) == {"0", "1"}  # the first two start at once
    assert all((tmp_path / f"{m}.gpu{g}.log").exists() for m, g in used.items())


def test_bad_gpu_list_is_bad_input(tmp_path):
    for bad in ("", "0,0", "a,1"):
        p = _report(tmp_path, "--gpus", bad, "--models", "resnet50")
        assert p.returncode == 2 and "--gpus" in p.stderr and p.stderr.count("\n") == 1, (bad, p.stderr)


def test_host_benchmarks_take_turns(tmp_path):
    import threading
    import time

    mod = _reproduce_module()
    spans = []

    def bench():
        with mod.host_bench_turn(tmp_path):
            t0 = time.perf_counter()
            time.sleep(0.2)
            spans.append((t0, time.perf_counter()))

    threads = [threading.Thread(target=bench) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans.sort()
    assert len(spans) == 3 and all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # never two at once


def test_the_ablation_step_picks_exactly_three_target_cards():
    """reproduce's search ablation names target cards by label substrings: each must pick one card, or the
    ablation silently shrinks (or grows past a sitting's GPU time)."""
    import importlib.util

    specs = {}
    for name in ("reproduce", "bench_builtin"):
        spec = importlib.util.spec_from_file_location(f"_kf_{name}", ROOT / "scripts" / f"{name}.py")
        specs[name] = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = specs[name]  # dataclasses look their module up while the class is built
        spec.loader.exec_module(specs[name])
    labels = [c.label for c in specs["bench_builtin"]._cases()]  # cases build their tensors only when made
    picked = [lb for lb in labels if any(s in lb for s in specs["reproduce"].ABLATION_CARDS)]
    assert len(picked) == 3, picked
    assert all(sum(s in lb for lb in labels) == 1 for s in specs["reproduce"].ABLATION_CARDS)


def test_the_report_needs_only_the_facts_file_not_the_database(tmp_path):
    """Workspace databases stay out of git: a model folder holding facts.json reports the same as its db."""
    reproduce = load_script("reproduce")
    (tmp_path / "with_db" / "resnet50").mkdir(parents=True)
    shutil.copy(DEMO_DB, tmp_path / "with_db" / "resnet50" / "kforge.db")
    (tmp_path / "facts_only" / "resnet50").mkdir(parents=True)
    reproduce.write_facts(DEMO_DB, tmp_path / "facts_only" / "resnet50" / reproduce.FACTS)
    assert reproduce.FACTS == "facts.json"
    with_db = reproduce.report(tmp_path / "with_db", ["resnet50"])
    facts_only = reproduce.report(tmp_path / "facts_only", ["resnet50"])
    assert facts_only.replace("facts_only", "with_db") == with_db
    assert "not run yet" not in facts_only and "| resnet50 | `aten::" in facts_only
