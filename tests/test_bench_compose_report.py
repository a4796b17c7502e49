"""scripts/bench_compose.py's report without a GPU: what it says of Dynamo's graphs per compile mode."""

from __future__ import annotations

from conftest import load_script


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
