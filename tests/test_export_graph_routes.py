"""`export --graph-routes`: after the eager check keeps a cast, a fresh process tries graph routes on the model's
repeated classes (engine.export.graph_check); the class it chose goes into the manifest (`source.graph_routes`),
each class tried is one progress line, and a failed check costs only the routes (a warning, the cast written).

No GPU: the real exporter with its GPU steps replaced by stand-ins (as test_export_checkpoints.py); the
numbers are made up, none is a measurement. The graph check itself, on the CPU with a stand-in for
torch.cuda.graph, is in test_cast_graph_routes.py."""

from __future__ import annotations

import pytest
from test_export_checkpoints import Gpu, gpu, ws  # noqa: F401  (fixtures)
from test_export_record import EAGER, RUN, SLOWER

from engine.cast.format import read_cast
from engine.errors import JobError
from engine.export import package as pkg

TRIED = {"tried": [{"class": "Block", "modules": 2, "replaying": 2, "speedup": 0.97, "speedup_ci": [0.95, 0.99],
                    "why": "not faster with confidence"},
                   {"class": "Attention", "modules": 2, "replaying": 2, "speedup": 1.31, "speedup_ci": [1.25, 1.36]}]}


def _export(ws, monkeypatch, answer, graph_routes=True):  # noqa: F811
    calls = []

    def check(cast_path, config, small, tmp, timeout_s=900):
        calls.append(read_cast(cast_path).manifest)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(pkg, "run_graph_check", check)
    lines: list[str] = []
    result = pkg.export_run(ws, RUN, ws.parent / "toy.cast", targets=["eager"], progress=lines.append,
                            graph_routes=graph_routes)
    return result, lines, calls, read_cast(ws.parent / "toy.cast").manifest


def test_the_class_chosen_goes_into_the_cast_and_each_class_tried_is_said(ws, gpu, monkeypatch):  # noqa: F811
    gpu.model.update(eager=lambda s: EAGER)
    result, lines, calls, manifest = _export(ws, monkeypatch, {**TRIED, "chosen": TRIED["tried"][1]})
    assert len(calls) == 1 and [v["id"] for v in calls[0]["variants"]] == [v["id"] for v in result.included]
    g = manifest["source"]["graph_routes"]
    assert g["classes"] == ["Attention"] and g["targets"] == ["eager"] and g["speedup_ci"] == [1.25, 1.36]
    assert result.graph_routes == g
    said = "\n".join(lines)
    assert "graph routes: Block (2 module(s), 2 replaying): 0.970x (0.950-0.990), not kept: not faster with " \
           "confidence" in said
    assert "graph routes: Attention (2 module(s), 2 replaying): 1.310x (1.250-1.360), kept" in said


def test_no_class_chosen_records_what_was_tried_and_routes_nothing(ws, gpu, monkeypatch):  # noqa: F811
    gpu.model.update(eager=lambda s: EAGER)
    _, _, _, manifest = _export(ws, monkeypatch, {"tried": TRIED["tried"][:1], "chosen": None})
    g = manifest["source"]["graph_routes"]
    assert g["classes"] == [] and len(g["tried"]) == 1


def test_a_failed_graph_check_is_a_warning_and_the_cast_is_written(ws, gpu, monkeypatch):  # noqa: F811
    gpu.model.update(eager=lambda s: EAGER)
    result, _, _, manifest = _export(ws, monkeypatch, JobError("the graph-route check failed (exit 1): boom"))
    assert manifest["source"]["graph_routes"]["classes"] == []
    assert any(w.startswith("graph routes: the graph-route check failed") for w in result.warnings)
    assert result.included


def test_without_the_flag_no_graph_check_runs(ws, gpu, monkeypatch):  # noqa: F811
    gpu.model.update(eager=lambda s: EAGER)
    _, _, calls, manifest = _export(ws, monkeypatch, TRIED, graph_routes=False)
    assert calls == [] and "graph_routes" not in manifest["source"]


def test_graph_routes_are_tried_by_default_and_the_cli_can_turn_them_off(tmp_path, monkeypatch):
    import engine.cli
    from engine.export.package import ExportResult

    seen = {}

    def export_run(workspace, run_id, out, **kw):
        seen.update(kw)
        return ExportResult(out, [{"id": "relu-1", "op": "aten::relu", "speedup": 1.5, "speedup_ci": [1.4, 1.6],
                                   "targets": ["eager"]}], [], [])

    monkeypatch.setattr(pkg, "export_run", export_run)
    base = ["export", "run-x", "--out", str(tmp_path / "m.cast"), "--workspace", str(tmp_path)]
    assert engine.cli.main(base) == 0 and seen["graph_routes"] is True
    assert engine.cli.main(base + ["--no-graph-routes"]) == 0 and seen["graph_routes"] is False
    assert engine.cli.main(base + ["--graph-routes"]) == 0 and seen["graph_routes"] is True


def test_the_export_says_what_it_routed_in_text_and_json(tmp_path, monkeypatch, capsys):
    import json

    import engine.cli
    from engine.export.package import ExportResult

    routes = {"classes": ["Attention"], "targets": ["eager"], "speedup": 1.31, "speedup_ci": [1.25, 1.36],
              "modules": 4, "tried": []}
    monkeypatch.setattr(engine.cli, "_export", lambda args, out, progress: ExportResult(
        out, [{"id": "relu-1", "op": "aten::relu", "speedup": 1.5, "speedup_ci": [1.4, 1.6], "targets": ["eager"]}],
        [], [], graph_routes=routes))
    base = ["export", "run-x", "--out", str(tmp_path / "m.cast"), "--workspace", str(tmp_path), "--graph-routes"]
    assert engine.cli.main(base) == 0
    assert "graph routes: Attention replayed from CUDA graphs in eager, whole model 1.31× (1.25–1.36) with them " \
           "(4 module(s))" in capsys.readouterr().out
    assert engine.cli.main(base + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["graph_routes"]["classes"] == ["Attention"]


def test_audit_and_the_report_say_which_class_is_routed_or_why_none(ws, gpu, monkeypatch):  # noqa: F811
    import engine.cli
    from engine.cast.format import read_cast as read
    from engine.export.report import markdown_report

    gpu.model.update(eager=lambda s: EAGER)
    _export(ws, monkeypatch, {**TRIED, "chosen": TRIED["tried"][1]})
    out = ws.parent / "toy.cast"
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert engine.cli.main(["audit", str(out)]) == 0
    assert "graph routes: Attention replayed from CUDA graphs in eager, whole model 1.31× (1.25–1.36) with them " \
           "(2 module(s))" in buf.getvalue()
    assert "Graph routes: Attention replayed" in markdown_report(read(out).manifest)
    _export(ws, monkeypatch, {"tried": TRIED["tried"][:1], "chosen": None})
    buf = io.StringIO()
    with redirect_stdout(buf):
        engine.cli.main(["audit", str(out)])
    assert "graph routes: none kept (Block (2 module(s), 2 replaying): 0.970x (0.950-0.990), not kept: not faster " \
           "with confidence)" in buf.getvalue()


def test_where_no_variant_is_kept_a_cast_of_graph_routes_alone_is_written(ws, gpu, monkeypatch):  # noqa: F811
    """A host-bound model whose kernels do not win (the whole-model check refuses every set) may still gain
    from graph routes: the export tries them with no variant, and writes a cast holding only the routes."""
    gpu.model.update(eager=lambda s: SLOWER)
    result, lines, calls, manifest = _export(ws, monkeypatch, {**TRIED, "chosen": TRIED["tried"][1]})
    assert len(calls) == 1 and calls[0]["variants"] == []  # the graph check ran a cast of no variant
    assert manifest["variants"] == [] and result.included == []
    assert manifest["source"]["graph_routes"]["classes"] == ["Attention"]
    assert manifest["source"]["model"] and manifest["source"]["run"] == RUN
    said = "\n".join(lines)
    assert "is slower with the cast" in said and "trying routes alone" in said


def test_a_cast_of_routes_alone_from_a_run_without_winners_says_so_in_its_report(tmp_path):
    from engine.export.report import markdown_report

    env = {"gpu": "NVIDIA H200", "arch": "sm_90", "torch": "2.11.0", "cuda": "13.0", "driver": "580",
           "nvrtc": "13.0"}
    manifest, _, _ = pkg.package([], env, {"run": "r", "model": "toy", "graph_routes": {
        "classes": ["Layer"], "targets": ["eager"], "speedup": 1.4, "speedup_ci": [1.3, 1.5], "modules": 4}})
    text = markdown_report(manifest)
    assert "## Routes" in text and "Graph routes: Layer replayed from CUDA graphs in eager" in text


def test_where_neither_variants_nor_routes_are_kept_nothing_is_written_and_both_are_said(ws, gpu,  # noqa: F811
                                                                                       monkeypatch):
    gpu.model.update(eager=lambda s: SLOWER)
    with pytest.raises(pkg.NothingKept) as e:
        _export(ws, monkeypatch, {"tried": TRIED["tried"][:1], "chosen": None})
    assert "is slower with the cast" in str(e.value) and "graph routes: none kept (Block" in str(e.value)
    assert not (ws.parent / "toy.cast").exists()


def test_without_graph_routes_an_export_that_keeps_nothing_fails_as_before(ws, gpu, monkeypatch):  # noqa: F811
    gpu.model.update(eager=lambda s: SLOWER)
    with pytest.raises(JobError, match="is slower with the cast"):
        _export(ws, monkeypatch, TRIED, graph_routes=False)


def test_a_model_the_gpu_sets_the_pace_of_gets_no_graph_route_check(ws, gpu, monkeypatch):  # noqa: F811
    """The SD3.5 VAE: replayed whole from a CUDA graph it is barely faster than in eager, so no part of it replayed
    can be faster with confidence; its graph-route check (a fresh process, the model built and timed again) went
    by without a class and its export ran past its limit (H100, 2026-12-05g). Where the eager and cuda-graphs
    targets' checks show replay saving under 3 % with the cast and without it, the routes are not tried."""
    from engine.export.report import graph_routes_text

    calls = []
    monkeypatch.setattr(pkg, "run_graph_check", lambda *a, **k: calls.append(a) or {"tried": [], "chosen": None})
    eager = {**EAGER, "eager_ms": 80.0, "cast_ms": 40.0}
    gpu.model.update(eager=lambda s: eager, **{"cuda-graphs": lambda s: {**EAGER, "eager_ms": 79.2, "cast_ms": 39.5}})
    lines: list[str] = []
    result = pkg.export_run(ws, RUN, ws.parent / "toy.cast", targets=["eager", "cuda-graphs"], progress=lines.append,
                            graph_routes=True)
    assert calls == [] and result.included
    g = read_cast(ws.parent / "toy.cast").manifest["source"]["graph_routes"]
    assert g["classes"] == [] and g["skipped"].startswith("not tried: replaying the whole forward from a CUDA graph "
                                                          "saves at most 1.2% of its eager time (80.00 -> 79.20 ms "
                                                          "without the cast, 40.00 -> 39.50 ms with it), under 3%")
    assert f"graph routes: {g['skipped']}" in lines
    assert graph_routes_text({"graph_routes": g}) == f"graph routes: none kept ({g['skipped']})"

    # a host-bound model (replay saves 30 % with the cast): the routes are tried
    gpu.model.update(**{"cuda-graphs": lambda s: {**EAGER, "eager_ms": 79.2, "cast_ms": 28.0}})
    pkg.export_run(ws, RUN, ws.parent / "toy.cast", targets=["eager", "cuda-graphs"], progress=lines.append,
                   graph_routes=True, fresh=True)
    assert len(calls) == 1


def test_without_a_cuda_graphs_check_the_graph_routes_are_tried(ws, gpu, monkeypatch):  # noqa: F811
    assert pkg.gpu_bound({"eager": {"eager_ms": 80.0, "cast_ms": 40.0}}) is None
    assert pkg.gpu_bound(None) is None
    gpu.model.update(eager=lambda s: EAGER)
    _, _, calls, _ = _export(ws, monkeypatch, {"tried": [], "chosen": None})
    assert len(calls) == 1


def test_an_export_interrupted_in_its_route_checks_writes_its_checked_targets(ws, gpu, monkeypatch):  # noqa: F811
    """The SD3.5 VAE's export was stopped by its time limit (a SIGINT) in its graph-route check, after every target's
    whole-model check had finished, and wrote nothing (H100, 2026-12-05g). The routes only add to a cast: the cast of
    the checked targets is written, as a partial cast the same export finishes (its checks reused)."""
    from engine.export.package import ExportPartial
    from engine.export.report import graph_routes_text

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(pkg, "run_graph_check", interrupted)
    gpu.model.update(eager=lambda s: EAGER)
    lines: list[str] = []
    with pytest.raises(ExportPartial, match=r"interrupted: wrote a partial cast .*toy.cast, proven for eager, "
                                            r"without graph routes; not checked: graph routes; the same export "
                                            r"again checks only those") as e:
        pkg.export_run(ws, RUN, ws.parent / "toy.cast", targets=["eager"], progress=lines.append, graph_routes=True)
    assert e.value.exit_code == pkg.EXIT_PARTIAL
    manifest = read_cast(ws.parent / "toy.cast").manifest
    assert [v["targets"] for v in manifest["variants"]] and all(v["targets"] == ["eager"] for v in manifest["variants"])
    g = manifest["source"]["graph_routes"]
    assert g["classes"] == [] and g["interrupted"].startswith("interrupted")
    assert "graph routes: interrupted; the cast is written without them" in lines
    assert graph_routes_text(manifest["source"]).startswith("graph routes: none kept (interrupted")
    # the same export again: the eager check is reused and the routes are tried
    monkeypatch.setattr(pkg, "run_graph_check", lambda *a, **k: {**TRIED, "chosen": TRIED["tried"][1]})
    result = pkg.export_run(ws, RUN, ws.parent / "toy.cast", targets=["eager"], progress=lines.append,
                            graph_routes=True)
    assert result.graph_routes["classes"] == ["Attention"] and gpu.checks == {"eager": 1}


def test_an_interruption_before_any_variant_is_kept_still_stops_the_export(ws, gpu, monkeypatch):  # noqa: F811
    gpu.model.update(eager=lambda s: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        pkg.export_run(ws, RUN, ws.parent / "toy.cast", targets=["eager"], graph_routes=True)
