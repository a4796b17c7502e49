"""scripts/bench_compose.py's report without a GPU: what it says of Dynamo's graphs per compile mode."""

from __future__ import annotations

import pytest
from conftest import load_script


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory):
    """One Inductor cache folder for this module's end-to-end runs on the CPU, shared by the xdist workers of a
    session: there bench_compose compiles into the cache the environment names (no compile time is measured on
    the CPU), so the session pays Inductor's vector-ISA probe and the model's C++ kernels once, not once per test
    and process (20-30 s each on a 2-core CI machine)."""
    import os

    base = tmp_path_factory.getbasetemp()
    d = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "bench-compose-inductor"
    d.mkdir(exist_ok=True)
    return d


def _mode(**extra):
    return {"base_ms": 7.23, "with_cast_ms": 7.80, "speedup": 0.926, "speedup_ci": [0.920, 0.934], "rel_l2_err": 0.26,
            "rel_l2_err_plain": 0.26, "hits_per_forward": 0, "compile_s": 14.4, "compile_s_with_cast": 16.5,
            "compile_time_ratio": 1.15, **extra}


def test_the_report_says_how_many_graphs_each_arm_compiled_and_any_while_timed():
    report = load_script("bench_compose").report
    doc = {"gpu": "NVIDIA H200", "torch": "2.11", "date": "2026-12-02", "model": "gemma4_e2b", "variants": [],
           "modes": {"default": _mode(dynamo={"graphs_with_cast": 1, "graphs_alone": 1, "graphs_in_warm_up": 0,
                                              "graphs_while_timed": 2, "graph_breaks": {"data-dependent": 3}}),
                     "reduce-overhead": _mode()}}
    text = report(doc)
    assert ("default: Dynamo compiled 1 graph(s) with the cast and 1 alone; 0 more in the warm-up and 2 while "
            "timed; graph breaks: data-dependent ×3") in text
    assert "reduce-overhead: Dynamo" not in text  # a result written before the counters says nothing of them


def test_the_report_says_which_arm_compiled_first_and_what_the_pattern_pass_and_inductors_start_cost():
    report = load_script("bench_compose").report
    doc = {"gpu": "NVIDIA H200", "torch": "2.11", "date": "2026-12-02", "model": "sd35_vae", "variants": [],
           "inductor_start_s": 6.04,
           "modes": {"default": _mode(compiled_first="with cast", pattern_pass_s=0.41),
                     "reduce-overhead": _mode(compiled_first="alone", pattern_pass_s=0.38)}}
    text = report(doc)
    assert "default: compiled with cast first; the cast's pattern pass took 0.41 s of its compile" in text
    assert "reduce-overhead: compiled alone first; the cast's pattern pass took 0.38 s of its compile" in text
    assert "Inductor's start in this process" in text and "6.0 s" in text


def test_the_report_reads_the_a_a_arm_as_the_timings_own_bias():
    """ResNet-50 under reduce-overhead (H200, 2026-12-03h): torch.compile alone timed against itself read 1.017x
    (1.012-1.019). The report says what such a reading means for the other numbers of that run."""
    report = load_script("bench_compose").report

    def arm(s, lo, hi):
        return {"ms": 1.6, "base_ms": 1.6, "speedup": s, "speedup_ci": [lo, hi], "iters": 60}

    doc = {"gpu": "NVIDIA H200", "torch": "2.11", "date": "2026-12-03", "model": "resnet50", "variants": [],
           "modes": {"reduce-overhead": _mode(control={"alone, timed again (A/A)": arm(1.017, 1.012, 1.019)}),
                     "default": _mode(control={"alone, timed again (A/A)": arm(1.001, 0.995, 1.006)})}}
    text = report(doc)
    assert ("reduce-overhead: the A/A arm (torch.compile alone against itself) read 1.017 (1.012–1.019): a bias in "
            "the timing; differences within ±0.019 of 1 are not resolved in this run") in text
    assert "default: the A/A arm (torch.compile alone against itself) read 1.001 (0.995–1.006): no bias shown" in text


def test_the_report_reads_a_second_compile_as_the_compiles_own_spread():
    """ResNet-50 on the H200 (2026-12-04): the cast's backend with the cast not installed, the same code compiled a
    second time, read 1.050x under reduce-overhead and 0.989x in default mode against torch.compile alone."""
    bench = load_script("bench_compose")

    def arm(s, lo, hi):
        return {"ms": 1.6, "base_ms": 1.6, "speedup": s, "speedup_ci": [lo, hi], "iters": 60}

    doc = {"gpu": "NVIDIA H200", "torch": "2.11", "date": "2026-12-04", "model": "resnet50", "variants": [],
           "modes": {"reduce-overhead": _mode(control={bench.AGAIN: arm(1.050, 1.044, 1.057)}),
                     "default": _mode(control={bench.AGAIN: arm(0.998, 0.990, 1.004)})}}
    text = bench.report(doc)
    assert ("reduce-overhead: a second compile of torch.compile alone read 1.050 (1.044–1.057) against the first: "
            "two compiles of the same code differ by that much in this process; the cast's arm is a compile too") in text
    assert "default: a second compile of torch.compile alone read 0.998 (0.990–1.004) against the first: no spread " \
           "between compiles shown" in text


def test_the_scripts_control_flow_on_a_cpu(tmp_path, monkeypatch, inductor_cache):
    """bench_compose end to end on the CPU, with a cast none of whose variants can run here: cast.compile is then
    torch.compile's own code, so the cast's arm (compiled first) compiles once and the arm alone shares that
    compile (Dynamo's code for the same function and settings), nothing recompiles while timed, and the record
    and report say so. Not a
    measurement (DEVICE "cpu" times with the wall clock); it guards the script's flow, which otherwise runs only
    on a GPU."""
    import json

    from test_cast_modules import _write

    bench = load_script("bench_compose")
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor_cache))
    cast = _write(tmp_path)  # a module card for another model: installed on none of my_model's modules
    out = tmp_path / "out"
    import torch

    compiled, real_compile = [], torch.compile  # what is compiled, in order, and through which backend

    def recording(model=None, **kw):
        compiled.append((id(model), "backend" in kw))
        return real_compile(model, **kw)

    monkeypatch.setattr(torch, "compile", recording)
    folders, real_fresh = [], bench.fresh_caches  # the on-disk cache folder each compile starts from

    def recording_folders(root, name):
        folders.append(name)
        return real_fresh(root, name)

    monkeypatch.setattr(bench, "fresh_caches", recording_folders)
    code = bench.main(["--out", str(out), "--model", "configs/examples/my_model.toml", "--small", "--cast", str(cast),
                       "--modes", "default,reduce-overhead", "--iters", "3", "--block", "2", "--cast-inductor", "layout_optimization=false",
                       "--control"])
    assert code == 0
    doc = json.loads((out / "bench_compose.json").read_text())
    assert doc["cast_inductor"] == {"layout_optimization": False}
    r = doc["modes"]["default"]
    assert "error" not in r, r.get("traceback")
    assert r["compiled_first"] == "with cast" and r["hits_per_forward"] == 0 and r["pattern_pass_s"] == 0.0
    assert r["torch_compile_own"] is True and r["compile_time_ratio"] is None
    assert r["dynamo"]["graphs_with_cast"] >= 1 and r["dynamo"]["graphs_alone"] == 0  # one compile, shared
    assert r["dynamo"]["graphs_while_timed"] == 0, r["dynamo"]
    assert r["iters"] == 3 and r["compile_s"] > 0 and r["compile_s_with_cast"] > 0
    # what else the host did while each pair was timed, in the record and in the report
    assert r["host_load"]["other_cores"] is not None and r["host_load"]["launch_us_before"] > 0
    assert doc["eager"]["host_load"]["seconds"] > 0
    assert "eager: the host while timed: other processes" in (out / "bench_compose.md").read_text()
    # timed on varied inputs, and the example's back before each mode's outputs are compared (red team 2026-12-07:
    # they were compared on the last variant, 1.18 from eager's output)
    assert doc["inputs"] == "new variants of the example inputs every forward (1 of 1 tensors varied)"
    assert r["rel_l2_err_plain"] < 1e-4 and r["rel_l2_err"] < 1e-4
    # Inductor's start is paid before either arm, on a small function; not on the model, since each mode's
    # pair is one compile (a cast with variants for a mode also compiles the model once and throws it away)
    warm_fn, first_arm, second_mode = compiled[:3]
    assert not warm_fn[1] and warm_fn[0] != first_arm[0]
    assert not first_arm[1] and second_mode == first_arm  # the model through cast.compile: torch.compile's own
    assert doc["inductor_start_model"] is False
    # both arms of a mode the cast has nothing for compile from one cache folder (a second Dynamo compile of the
    # same graph loads the first's code); the control's second compile of torch.compile alone starts afresh
    assert folders[:3] == ["process-warm-up", "default-own", "default-own"]
    assert "reduce-overhead-own" in folders and folders.count("reduce-overhead-own") == 2
    assert any(f.startswith("default-") and f != "default-own" for f in folders)  # the A/A of compiles
    # Under reduce-overhead a replay runs no Python: the record says over which calls hits were counted
    ro = doc["modes"]["reduce-overhead"]
    assert "error" not in ro, ro.get("traceback")
    assert ro["compiled_first"] == "alone" and "replay runs no Python" in ro["hits_counted_over"]
    assert "hits_counted_over" not in r
    # --control: arms against torch.compile alone, in balanced orders: the timing's own bias, backend, routes
    assert list(r["control"]) == ["alone, timed again (A/A)", bench.AGAIN, "the cast's backend, cast not installed",
                                  "alone, cast installed", "alone, right after the cast was installed and removed",
                                  "the cast's backend, cast installed"]
    assert all(c["iters"] == 3 and c["ms"] > 0 for c in r["control"].values())
    assert r["graphs_again"] >= 1 and ro["graphs_again"] >= 1  # a second compile, not the first one's code again
    md = (out / "bench_compose.md").read_text()
    assert "a control-flow test, not a measurement" in md and "default: compiled with cast first" in md
    assert "one compile, torch.compile's own (nothing of the cast for this mode)" in md
    assert "a small function compiled before either arm; not the model" in md
    assert "default: control arms, each against torch.compile alone, in balanced orders: alone, timed again (A/A)" in md
    assert "reduce-overhead: hits per forward counted over the warm-up and the recording" in md


def test_on_the_gpu_each_compile_starts_from_empty_cache_folders_and_on_the_cpu_they_are_shared(tmp_path,
                                                                                                monkeypatch):
    """On the GPU every compile of a run starts from empty Inductor and Triton cache folders of its own, so its
    compile time and what its code was built from are its own. On the CPU (the control-flow test, no measurement)
    the caches stay where the environment put them, shared by every compile and process."""
    import os

    bench = load_script("bench_compose")
    shared = tmp_path / "shared"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(shared / "triton"))
    monkeypatch.setattr(bench, "DEVICE", "cuda")
    run = tmp_path / "run"
    for name in ("default-cast", "default-plain"):
        bench.fresh_caches(run, name)
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(run / name)
        assert os.environ["TRITON_CACHE_DIR"] == str(run / name / "triton")
        assert [p.name for p in (run / name).iterdir()] == ["triton"] and not any((run / name / "triton").iterdir())
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(shared / "triton"))
    bench.fresh_caches(run, "reduce-overhead-own")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(shared) and os.environ["TRITON_CACHE_DIR"] == str(shared / "triton")
    assert not (run / "reduce-overhead-own").exists()


def test_only_names_the_variants_it_keeps_or_refuses_in_one_line(tmp_path, monkeypatch, capsys):
    """--only REGEX measures part of a cast; a pattern that is no regex, or matches none of the cast's
    variants, stops before any timing with exit 2 and one line naming the input (and the variants there are)."""
    from test_cast_modules import _write

    bench = load_script("bench_compose")
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    cast = _write(tmp_path)
    base = ["--out", str(tmp_path / "out"), "--model", "configs/examples/my_model.toml", "--small", "--cast", str(cast),
            "--modes", "default", "--iters", "3"]
    assert bench.main([*base, "--only", "("]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --only '(' is not a regular expression") and "\n" not in err
    assert bench.main([*base, "--only", "no_such_op"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress line of the model's build
    assert err == "error: --only 'no_such_op' matches none of the cast's variants (rms)"


def test_inductor_options_are_checked_and_named_in_the_report():
    bench = load_script("bench_compose")
    assert bench.inductor_options(["layout_optimization=false", "max_autotune=True", "realize_reads_threshold=4"],
                                  "--cast-inductor") == {"layout_optimization": False, "max_autotune": True,
                                                         "realize_reads_threshold": 4}
    for bad, says in (("layout_optimisation=false", "Inductor has no config entry 'layout_optimisation'"),
                      ("layout_optimization", "write KEY=VALUE")):
        try:
            bench.inductor_options([bad], "--cast-inductor")
        except ValueError as e:
            assert says in str(e) and "--cast-inductor layout_optimization=false" in str(e)
        else:
            raise AssertionError(f"{bad!r} was accepted")
    doc = {"gpu": "NVIDIA H200", "torch": "2.11", "date": "2026-12-03", "model": "sd35_vae", "variants": [],
           "cast_inductor": {"layout_optimization": False}, "modes": {"default": _mode()}}
    assert "; Inductor config layout_optimization=False for the cast's arm only" in bench.report(doc)


def test_a_bad_inductor_option_exits_2_with_one_line(capsys):
    bench = load_script("bench_compose")
    assert bench.main(["--out", "/tmp/never", "--cast-inductor", "layout_optimisation=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --cast-inductor 'layout_optimisation=false'")


def test_control_arms_take_turns_so_each_follows_every_other_alike(monkeypatch):
    """The first --control rotated one order: each arm always ran right after the same other arm, and an arm
    timed against itself read 1.017x (1.012-1.019) on the H200."""
    from collections import Counter

    bc = load_script("bench_compose")
    ran = []
    monkeypatch.setattr(bc, "timed", lambda run: (run(), 1.0)[1])
    arms = [(name, (lambda name=name: ran.append(name)), None) for name in "abcd"]
    out = bc.rotate(arms, 8)
    assert set(out) == {"b", "c", "d"} and all(r["iters"] == 8 for r in out.values())
    rounds = [ran[k:k + 4] for k in range(0, len(ran), 4)]
    after = Counter((r[j], r[j + 1]) for r in rounds for j in range(3))
    assert len(after) == 12 and set(after.values()) == {2}


def test_comparisons_take_more_rounds_until_their_ci_is_narrow_or_the_time_is_up(monkeypatch):
    """bench_compose with --iters 0 times rounds until the CI is 0.02 wide or --max-s has passed (ResNet-50 in
    default mode on the H200 gave CIs 0.18 wide from one round of 60); --iters N is exactly N."""
    import itertools

    bc = load_script("bench_compose")
    noisy = itertools.cycle([90.0, 110.0, 100.0, 95.0, 105.0])
    calls = {"n": 0}

    def timed(run):
        calls["n"] += 1
        return next(noisy) if calls["n"] <= 8 else 100.0  # the first round noisy, the rest steady

    monkeypatch.setattr(bc, "timed", timed)
    arms = [("a", lambda: None, None), ("b", lambda: None, None)]
    r = bc.rotate(arms, 4, precision=0.02, max_s=600)["b"]
    assert r["iters"] > 4 and r["iters"] % 4 == 0 and r["precise"]
    assert r["speedup_ci"][1] - r["speedup_ci"][0] <= 0.02
    calls["n"] = 0
    r = bc.rotate(arms, 4)["b"]  # --iters N: one round, however wide
    assert r["iters"] == 4 and "precise" not in r and r["speedup_ci"][1] - r["speedup_ci"][0] > 0.02
    calls["n"] = -10**9  # noisy for good: the time limit ends it after the first round
    r = bc.rotate(arms, 4, precision=0.02, max_s=0.0)["b"]
    assert r["iters"] == 4 and r["precise"] is False


def test_processes_pool_each_compiled_pair_over_fresh_processes(tmp_path, monkeypatch, inductor_cache):
    """--processes K: the measurement again in K fresh processes (which arm compiles first alternates between
    them), each compiled pair pooled over them. On the CPU (not a measurement) it guards the flow: the
    processes run, write their own reports, and the pooled report says what each read and what they say
    together."""
    import json

    from test_cast_modules import _write

    bench = load_script("bench_compose")
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor_cache))
    cast = _write(tmp_path)
    out = tmp_path / "out"
    base = ["--out", str(out), "--model", "configs/examples/my_model.toml", "--small", "--modes", "default",
            "--iters", "3", "--block", "2"]
    assert bench.main([*base, "--processes", "2"]) == 2  # no --cast: each process would build its own
    assert bench.main([*base, "--cast", str(cast), "--processes", "2"]) == 0
    doc = json.loads((out / "bench_compose.json").read_text())
    assert [r["rc"] for r in doc["runs"]] == [0, 0] and doc["processes"] == 2
    firsts = [json.loads((out / f"process-{i}" / "bench_compose.json").read_text())["modes"]["default"]["compiled_first"]
              for i in (1, 2)]
    assert firsts == ["with cast", "alone"]
    row = doc["pooled"]["default"]
    assert row["processes"] == 2 and len(row["per_process"]) == 2
    assert row["speedup_ci"][0] <= row["speedup"] <= row["speedup_ci"][1]
    per = [json.loads((out / f"process-{i}" / "bench_compose.json").read_text())["modes"]["default"] for i in (1, 2)]
    merged = doc["modes"]["default"]  # the record keeps one process's shape, the pair pooled in it
    assert merged["speedup"] == row["speedup"] and merged["pooled_over"] == 2
    assert merged["base_ms"] == pytest.approx((per[0]["base_ms"] * per[1]["base_ms"]) ** 0.5)
    assert merged["base_ms"] / merged["with_cast_ms"] == pytest.approx(row["speedup"])
    md = (out / "bench_compose.md").read_text()
    assert "# bench_compose over 2 processes" in md and "torch.compile default + cast vs alone" in md
    assert "# bench_compose: configs/examples/my_model.toml" in md  # the merged record's own report after it
    assert "a control-flow test, not a measurement" in (out / "process-1" / "bench_compose.md").read_text()
    assert doc["cast"] == str(cast)
    assert json.loads((out / "process-1" / "bench_compose.json").read_text())["cast"] == str(cast)  # each process names what it measured
    # --pool-only: a run cut short (its second process's record lost) is pooled from what is there, naming the
    # cast and model the records hold; no records at all is a one-line error
    (out / "process-2" / "bench_compose.json").unlink()
    assert bench.main(["--out", str(out), "--pool-only"]) == 0
    cut = json.loads((out / "bench_compose.json").read_text())
    assert cut["pooled"]["default"]["processes"] == 1 and cut["pooled"]["default"]["missing"] == [2]
    assert cut["cast"] == str(cast) and cut["model"] == "configs/examples/my_model.toml"
    assert "Processes that failed" not in (out / "bench_compose.md").read_text()
    assert bench.main(["--out", str(tmp_path / "empty"), "--pool-only"]) == 2


def test_the_pooled_interval_carries_the_spread_between_processes():
    from engine.bench.stats import SpeedupEstimate as S
    from engine.bench.stats import pooled_speedup

    bench = load_script("bench_compose")
    # Whisper under reduce-overhead, 2026-12-04c: 0.963x in the sitting's process, 1.002x in the next
    two = pooled_speedup([S(0.963, 0.959, 0.970), S(1.002, 0.996, 1.007)])
    assert two.low < 1 < two.high and bench.verdict([two.low, two.high]) == "not resolved"
    # a loss every process shows stays a loss
    same = pooled_speedup([S(0.985, 0.979, 0.990), S(0.990, 0.980, 0.999), S(0.984, 0.978, 0.990)])
    assert same.high < 1 and bench.verdict([same.low, same.high]) == "slower with confidence"
    # and a gain stays a gain, no narrower than the processes' own CIs allow
    gain = pooled_speedup([S(1.30, 1.29, 1.32), S(1.31, 1.30, 1.32), S(1.29, 1.28, 1.30)])
    assert 1.27 < gain.low < 1.29 and gain.speedup == pytest.approx(1.30, abs=0.005)
    assert pooled_speedup([S(1.1, 1.0, 1.2)]) == S(1.1, 1.0, 1.2)


def test_the_model_is_compiled_and_thrown_away_first_only_where_some_pair_is_two_compiles():
    """Inductor's start is kept out of both arms' compile times by compiling the model once first; where the
    cast has nothing for any measured mode, each pair is one compile and that would only cost time (Qwen3.5's
    4 layers: ~230 s on the H200)."""
    bench = load_script("bench_compose")

    class Cast:
        def __init__(self, held):
            self.held = held

        def runs_under(self, target):
            return target in self.held

    eager_only, for_compile = Cast({"eager"}), Cast({"eager", "compile"})
    assert not bench.compiles_twice(eager_only, ["default", "reduce-overhead"])
    assert bench.compiles_twice(for_compile, ["default"])
    assert not bench.compiles_twice(for_compile, ["reduce-overhead"])  # its variants are for the default mode
    assert bench.compiles_twice(Cast({"compile:reduce-overhead"}), ["default", "reduce-overhead"])
