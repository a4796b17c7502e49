"""`export --layout-routes`: where the run's model ran convolutions, a fresh process tries running its
convolutional modules channels-last (engine.export.layout_check); the class it chose goes into the manifest
(`source.layout_routes`) with the signatures it proved, a cast's install with the model routes those modules,
and audit, the report and the export's own output say so.

No GPU: the real exporter with its GPU steps replaced by stand-ins (as test_export_graph_routes.py); the numbers
are made up, none is a measurement. The check itself runs on the CPU in test_layout_routes.py."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest
import torch
from test_export_checkpoints import Gpu, gpu, ws  # noqa: F401  (fixtures)
from test_export_record import EAGER, RUN, SLOWER
from test_layout_routes import Net, _net, _routes

from engine.cast.format import read_cast
from engine.errors import JobError
from engine.export import package as pkg

TRIED = {"tried": [{"class": "Net", "modules": 1, "speedup": 0.99, "speedup_ci": [0.97, 1.01], "rel_l2_err": 1e-4,
                    "why": "not faster with confidence"},
                   {"class": "Block", "modules": 2, "speedup": 1.21, "speedup_ci": [1.18, 1.24], "rel_l2_err": 2e-3,
                    "signatures": {"Block": [{"args": [], "outputs": [], "training": False}]}}]}


def _export(ws, monkeypatch, answer, layout_routes=True, convolutional=True):  # noqa: F811
    calls = []

    def check(cast_path, config, small, tmp, timeout_s=900):
        calls.append(read_cast(cast_path).manifest)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(pkg, "run_layout_check", check)
    if convolutional:  # the toy run's cards are relu: count them as the model's convolutions
        monkeypatch.setattr("engine.capture.twins.CONVOLUTIONS", ("aten::relu",))
    lines: list[str] = []
    result = pkg.export_run(ws, RUN, ws.parent / "toy.cast", targets=["eager"], progress=lines.append,
                            layout_routes=layout_routes)
    return result, lines, calls, read_cast(ws.parent / "toy.cast").manifest


def test_the_class_chosen_and_its_signatures_go_into_the_cast_and_each_class_tried_is_said(ws, gpu,  # noqa: F811
                                                                                          monkeypatch):
    gpu.model.update(eager=lambda s: EAGER)
    result, lines, calls, manifest = _export(ws, monkeypatch, {**TRIED, "chosen": TRIED["tried"][1]})
    assert len(calls) == 1 and [v["id"] for v in calls[0]["variants"]] == [v["id"] for v in result.included]
    g = manifest["source"]["layout_routes"]
    assert g["classes"] == ["Block"] and g["targets"] == ["eager"] and g["memory_format"] == "channels_last"
    assert g["signatures"] == TRIED["tried"][1]["signatures"] and g["speedup_ci"] == [1.18, 1.24]
    assert result.layout_routes == g
    said = "\n".join(lines)
    assert "layout routes: Net (1 module(s)): 0.990x (0.970-1.010), output rel. L2 1.0e-04, not kept: not " \
           "faster with confidence" in said
    assert "layout routes: Block (2 module(s)): 1.210x (1.180-1.240), output rel. L2 2.0e-03, kept" in said


def test_a_model_without_convolutions_is_not_checked(ws, gpu, monkeypatch):  # noqa: F811
    gpu.model.update(eager=lambda s: EAGER)
    _, _, calls, manifest = _export(ws, monkeypatch, TRIED, convolutional=False)
    assert calls == [] and "layout_routes" not in manifest["source"]


def test_without_the_flag_no_layout_check_runs(ws, gpu, monkeypatch):  # noqa: F811
    gpu.model.update(eager=lambda s: EAGER)
    _, _, calls, manifest = _export(ws, monkeypatch, TRIED, layout_routes=False)
    assert calls == [] and "layout_routes" not in manifest["source"]


def test_a_failed_layout_check_is_a_warning_and_the_cast_is_written(ws, gpu, monkeypatch):  # noqa: F811
    gpu.model.update(eager=lambda s: EAGER)
    result, _, _, manifest = _export(ws, monkeypatch, JobError("the layout-route check failed (exit 1): boom"))
    assert manifest["source"]["layout_routes"]["classes"] == []
    assert any(w.startswith("layout routes: the layout-route check failed") for w in result.warnings)
    assert result.included


def test_where_no_variant_is_kept_a_cast_of_layout_routes_alone_is_written(ws, gpu, monkeypatch):  # noqa: F811
    """A convolutional model whose kernels do not win may still gain from its convolutions run NHWC."""
    gpu.model.update(eager=lambda s: SLOWER)
    monkeypatch.setattr(pkg, "run_graph_check", lambda *a, **k: {"tried": [], "chosen": None})
    result, lines, calls, manifest = _export(ws, monkeypatch, {**TRIED, "chosen": TRIED["tried"][1]})
    assert len(calls) == 1 and calls[0]["variants"] == []
    assert manifest["variants"] == [] and result.included == []
    assert manifest["source"]["layout_routes"]["classes"] == ["Block"]
    assert "trying routes alone" in "\n".join(lines)


def test_where_nothing_is_kept_the_check_is_said_and_nothing_is_written(ws, gpu, monkeypatch):  # noqa: F811
    gpu.model.update(eager=lambda s: SLOWER)
    with pytest.raises(pkg.NothingKept) as e:
        _export(ws, monkeypatch, {"tried": TRIED["tried"][:1], "chosen": None})
    assert "is slower with the cast" in str(e.value) and "layout routes: none kept (Net (1 module(s))" in str(e.value)
    assert not (ws.parent / "toy.cast").exists()


def test_the_cli_tries_them_by_default_can_turn_them_off_and_says_what_it_kept(tmp_path, monkeypatch, capsys):
    import engine.cli
    from engine.export.package import ExportResult

    seen = {}
    routes = {"classes": ["Decoder"], "targets": ["eager"], "speedup": 1.25, "speedup_ci": [1.2, 1.3], "modules": 1,
              "rel_l2_err": 3e-3, "signatures": {"Decoder": [{}]}, "tried": []}

    def export_run(workspace, run_id, out, **kw):
        seen.update(kw)
        return ExportResult(out, [{"id": "relu-1", "op": "aten::relu", "speedup": 1.5, "speedup_ci": [1.4, 1.6],
                                   "targets": ["eager"]}], [], [], layout_routes=routes)

    monkeypatch.setattr(pkg, "export_run", export_run)
    base = ["export", "run-x", "--out", str(tmp_path / "m.cast"), "--workspace", str(tmp_path)]
    assert engine.cli.main(base) == 0 and seen["layout_routes"] is True
    assert "layout routes: Decoder run channels-last in eager, whole model 1.25× (1.20–1.30) in eager with them (1 module(s), " \
           "1 signature(s), output rel. L2 3.0e-03 from eager's)" in capsys.readouterr().out
    assert engine.cli.main(base + ["--no-layout-routes"]) == 0 and seen["layout_routes"] is False
    capsys.readouterr()
    assert engine.cli.main(base + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["layout_routes"]["classes"] == ["Decoder"]


def test_audit_and_the_report_say_which_class_runs_channels_last(ws, gpu, monkeypatch):  # noqa: F811
    import engine.cli
    from engine.export.report import markdown_report

    gpu.model.update(eager=lambda s: EAGER)
    _export(ws, monkeypatch, {**TRIED, "chosen": TRIED["tried"][1]})
    out = ws.parent / "toy.cast"
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert engine.cli.main(["audit", str(out)]) == 0
    assert "layout routes: Block run channels-last in eager, whole model 1.21× (1.18–1.24)" in buf.getvalue()
    assert "Layout routes: Block run channels-last in eager" in markdown_report(read_cast(out).manifest)


def test_a_loaded_cast_routes_the_models_modules_for_the_proven_signatures(tmp_path):
    """The loader's side: a cast whose manifest holds layout routes installs them when the model is named, and
    only then; remove() gives the class its forward back; the stats count the hits."""
    from test_cast_modules import ENV

    import engine.cast
    from engine.cast import format as cast_format
    from engine.cast.format import write_cast

    m, x = _net(), torch.randn(2, 8, 16, 16)
    with torch.no_grad():
        learned = _routes(m, learn=True)
        with learned:
            m(x)
    lr = {"classes": ["Net"], "targets": ["eager"], "memory_format": "channels_last",
          "signatures": json.loads(json.dumps(learned.signatures()))}
    manifest = {"format": cast_format.FORMAT, "format_version": cast_format.FORMAT_VERSION, "env": ENV,
                "variants": [], "source": {"layout_routes": lr}}
    write_cast(tmp_path / "l.cast", manifest, {}, "# test\n")
    cast = engine.cast.load(tmp_path / "l.cast", env=ENV)
    assert cast.problem is None and cast.layout_routes()["classes"] == ["Net"]
    with torch.no_grad():
        with cast.enabled():
            m(x)
            assert m.blocks[0].probe.seen == "contiguous"  # the model was not named: no route
        with cast.enabled(m):
            m(x)
            assert m.blocks[0].probe.seen == "channels_last"
            assert cast.stats()["layout_routes_summary"]["hits"] == 1
    assert type(m).forward is Net.forward
    with torch.no_grad():
        m(x)
    assert m.blocks[0].probe.seen == "contiguous"


def test_a_class_faster_under_cuda_graphs_too_serves_that_target_and_it_is_said(ws, gpu, monkeypatch):  # noqa: F811
    gpu.model.update(eager=lambda s: EAGER)
    chosen = {**TRIED["tried"][1], "targets": ["eager", "cuda-graphs"],
              "graphs": {"speedup": 1.12, "speedup_ci": [1.1, 1.14], "replays": 20}}
    result, lines, _, manifest = _export(ws, monkeypatch, {**TRIED, "chosen": chosen})
    g = manifest["source"]["layout_routes"]
    assert g["targets"] == ["eager", "cuda-graphs"] and g["graphs"]["speedup_ci"] == [1.1, 1.14]
    assert "layout routes under CUDA graphs: 1.120x (1.100-1.140), kept there" in "\n".join(lines)
    from engine.export.report import layout_routes_text

    assert "in eager with them; under CUDA graphs 1.12× (1.10–1.14)" in layout_routes_text(manifest["source"])
    slower = {**TRIED["tried"][1], "targets": ["eager"],
              "graphs": {"speedup": 0.99, "speedup_ci": [0.97, 1.01], "why": "not faster with confidence"}}
    _, lines, _, manifest = _export(ws, monkeypatch, {**TRIED, "chosen": slower})
    assert manifest["source"]["layout_routes"]["targets"] == ["eager"]
    assert "not kept there: not faster with confidence" in "\n".join(lines)


def test_remove_takes_out_the_routes_of_every_model_named_while_installed(tmp_path):
    """install(a), then install(b) on the installed cast: the set made for b replaced a's, which stayed attached,
    so after remove() model a still ran channels-last through a route of a cast no longer installed."""
    from test_cast_modules import ENV

    import engine.cast
    from engine.cast import format as cast_format
    from engine.cast import modules
    from engine.cast.format import write_cast

    a, b, x = _net(), _net(), torch.randn(2, 8, 16, 16)
    with torch.no_grad():
        learned = _routes(a, learn=True)
        with learned:
            a(x)
    lr = {"classes": ["Net"], "targets": ["eager"], "memory_format": "channels_last",
          "signatures": json.loads(json.dumps(learned.signatures()))}
    manifest = {"format": cast_format.FORMAT, "format_version": cast_format.FORMAT_VERSION, "env": ENV,
                "variants": [], "source": {"layout_routes": lr}}
    write_cast(tmp_path / "l.cast", manifest, {}, "# test\n")
    cast = engine.cast.load(tmp_path / "l.cast", env=ENV)
    with torch.no_grad():
        with cast.enabled(a), cast.enabled(b):
            a(x)
            assert a.blocks[0].probe.seen == "channels_last"
        a(x)
    assert a.blocks[0].probe.seen == "contiguous" and modules.route_of(a) is None and modules.route_of(b) is None
