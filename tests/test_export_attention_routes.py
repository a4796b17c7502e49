"""The export's attention routes: where its targets include a compile mode and the run captured an SDPA op, a
fresh process (engine.export.attention_check) tries the math form per compile mode; the signatures and the
targets it kept go into the manifest (`source.attention_routes`), each mode tried is said, and a failed check
is a warning, never a lost cast.

No GPU: the real exporter with its GPU steps replaced by stand-ins (as test_export_layout_routes.py); the numbers
are made up, none is a measurement. The check itself runs on the CPU in test_cast_attention.py."""

from __future__ import annotations

import pytest
from test_export_checkpoints import Gpu, gpu, ws  # noqa: F401  (fixtures)
from test_export_record import EAGER, RUN

from engine.cast.format import read_cast
from engine.errors import JobError
from engine.export import package as pkg

SIG = {"q": [1, 1, 16384, 512], "k": [1, 1, 16384, 512], "v": [1, 1, 16384, 512], "dtype": "bfloat16", "scale": None}
FASTER = {"speedup": 1.14, "speedup_ci": [1.12, 1.16], "eager_ms": 28.3, "cast_ms": 24.9, "rel_l2_err": 2e-4}
KEPT = {"signatures": [SIG], "targets": ["compile"],
        "tried": [{"mode": "default", "rewritten": 1, "speedup": 1.137, "speedup_ci": [1.12, 1.15], "rel_l2_err": 3e-3},
                  {"mode": "reduce-overhead", "rewritten": 1, "speedup": 0.99, "speedup_ci": [0.97, 1.01],
                   "rel_l2_err": 3e-3, "why": "not faster with confidence"}]}


def _export(ws, monkeypatch, answer, targets=("compile", "compile:reduce-overhead"), attention=True):  # noqa: F811
    calls = []

    def check(cast_path, config, small, tmp, modes, timeout_s=900):
        calls.append((read_cast(cast_path).manifest, list(modes)))
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(pkg, "run_attention_check", check)
    monkeypatch.setattr(pkg, "has_attention", lambda cards: attention)
    lines: list[str] = []
    result = pkg.export_run(ws, RUN, ws.parent / "toy.cast", targets=list(targets), progress=lines.append)
    return result, lines, calls, read_cast(ws.parent / "toy.cast").manifest


@pytest.fixture
def compiled(gpu, monkeypatch):  # noqa: F811
    """The GPU stand-ins, their whole-model checks under compile taking (and ignoring) caches of their own."""
    monkeypatch.setattr(pkg, "run_model_check", lambda *a, caches=None, overlaps=None, **k: gpu.check(*a, **k))
    gpu.model.update(compile=lambda s: FASTER, **{"compile:reduce-overhead": lambda s: FASTER, "eager": lambda s: EAGER})
    return gpu


def test_the_modes_kept_and_their_signatures_go_into_the_cast_and_each_mode_tried_is_said(ws, compiled, monkeypatch):  # noqa: F811
    result, lines, calls, manifest = _export(ws, monkeypatch, KEPT)
    ((cand, modes),) = calls
    assert modes == ["default", "reduce-overhead"]
    assert [v["id"] for v in cand["variants"]] == [v["id"] for v in result.included]   # the cast kept so far
    a = manifest["source"]["attention_routes"]
    assert a["signatures"] == [SIG] and a["targets"] == ["compile"]
    assert result.attention_routes == a          # what `export --json` prints
    said = "\n".join(lines)
    assert "attention routes: compile mode default (1 call(s) in the math form): 1.137x (1.120-1.150), output " \
           "rel. L2 3.0e-03, kept" in said
    assert "compile mode reduce-overhead (1 call(s) in the math form): 0.990x (0.970-1.010), output rel. L2 " \
           "3.0e-03, not kept: not faster with confidence" in said


def test_audit_and_the_report_say_which_attention_runs_in_its_math_form(ws, compiled, monkeypatch):  # noqa: F811
    import io
    from contextlib import redirect_stdout

    import engine.cli
    from engine.export.report import markdown_report

    _export(ws, monkeypatch, KEPT)
    out = ws.parent / "toy.cast"
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert engine.cli.main(["audit", str(out)]) == 0
    line = "attention routes: 1 SDPA signature(s) (bfloat16[1, 1, 16384, 512]) computed in their math form under compile"
    assert line in buf.getvalue()
    assert line[0].upper() + line[1:] in markdown_report(read_cast(out).manifest)


@pytest.mark.parametrize("why", ["no compile target", "no attention card"])
def test_no_check_runs_where_it_could_find_nothing(ws, compiled, monkeypatch, why):  # noqa: F811
    targets = ("eager",) if why == "no compile target" else ("compile",)
    _, _, calls, manifest = _export(ws, monkeypatch, KEPT, targets=targets, attention=why != "no attention card")
    assert calls == [] and "attention_routes" not in manifest["source"]


def test_nothing_kept_leaves_no_signature_in_the_cast(ws, compiled, monkeypatch):  # noqa: F811
    none = {"signatures": [SIG], "targets": [], "tried": [KEPT["tried"][1]]}
    _, _, _, manifest = _export(ws, monkeypatch, none)
    a = manifest["source"]["attention_routes"]
    assert a["signatures"] == [] and a["targets"] == []


def test_a_failed_check_is_a_warning_and_the_cast_is_written(ws, compiled, monkeypatch):  # noqa: F811
    result, _, _, manifest = _export(ws, monkeypatch, JobError("the attention-route check failed (exit 1): boom"))
    assert manifest["source"]["attention_routes"]["targets"] == []
    assert any(w.startswith("attention routes: the attention-route check failed") for w in result.warnings)
    assert result.included


def test_where_no_variant_is_kept_a_cast_of_attention_routes_alone_is_written(ws, gpu, monkeypatch):  # noqa: F811
    """A model whose kernels do not win under torch.compile may still gain from its attention's math form."""
    from test_export_record import SLOWER

    monkeypatch.setattr(pkg, "run_model_check", lambda *a, caches=None, overlaps=None, **k: gpu.check(*a, **k))
    gpu.model.update(compile=lambda s: SLOWER)
    result, lines, calls, manifest = _export(ws, monkeypatch, KEPT, targets=("compile",))
    ((cand, modes),) = calls
    assert cand["variants"] == [] and modes == ["default"]
    assert manifest["variants"] == [] and result.included == []
    assert manifest["source"]["attention_routes"]["targets"] == ["compile"]
    assert result.attention_routes == manifest["source"]["attention_routes"]
    assert "trying routes alone" in "\n".join(lines)


def test_where_nothing_is_kept_the_attention_check_is_said_and_nothing_is_written(ws, gpu, monkeypatch):  # noqa: F811
    from test_export_record import SLOWER

    monkeypatch.setattr(pkg, "run_model_check", lambda *a, caches=None, overlaps=None, **k: gpu.check(*a, **k))
    gpu.model.update(compile=lambda s: SLOWER)
    none = {"signatures": [SIG], "targets": [], "tried": [{**KEPT["tried"][1], "mode": "default"}]}
    with pytest.raises(pkg.NothingKept) as e:
        _export(ws, monkeypatch, none, targets=("compile",))
    assert "attention routes: none kept (compile mode default" in str(e.value)
    assert not (ws.parent / "toy.cast").exists()


def _sdpa_card(shape, op="aten::_scaled_dot_product_efficient_attention", as_text=False):
    import json

    q = {"kind": "tensor", "name": "query", "dtype": "bfloat16", "shape": shape}
    sig = {"op": op, "args": [q, {**q, "name": "key"}, {**q, "name": "value"},
                              {"kind": "value", "name": "is_causal", "value": False}]}
    return {"op": op, "signature": json.dumps(sig) if as_text else sig}


@pytest.mark.parametrize("cards, checked", [
    ([_sdpa_card([1, 1, 16384, 512])], True),                     # the SD3.5 VAE's mid-block attention
    ([_sdpa_card([1, 1, 16384, 512], as_text=True)], True),       # the store's JSON text
    ([_sdpa_card([2, 24, 4096, 64])], False),                     # SD3.5's MMDiT: flash serves d = 64
    ([_sdpa_card([1, 16, 1024, 512])], False),                    # more matrices than the math form unrolls
    ([_sdpa_card([1, 1, 16384, 512], op="aten::_scaled_dot_product_flash_attention")], True),
    ([{"op": "aten::mm", "signature": {"args": []}}], False),      # no attention at all
    ([{"op": "aten::scaled_dot_product_attention", "signature": None}], True),  # unreadable: tried
    ([_sdpa_card([2, 24, 4096, 64]), _sdpa_card([1, 1, 1024, 512])], True),
])
def test_the_check_runs_only_where_a_captured_attention_can_qualify(cards, checked):
    """Most attention has head dims flash serves (d <= 256): the check, a fresh process that traces the model,
    would find nothing there and cost an export a minute; it runs where a card's query could qualify."""
    assert pkg.has_attention(cards) is checked
