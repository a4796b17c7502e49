"""`kforge-tui audit` and `export` as a user sees them without a GPU: exit codes and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cast_helpers import mark_member, write_genuine_cast
from conftest import run_cli


@pytest.fixture
def cast_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.cast"
    write_genuine_cast(path)
    return path


def test_audit_lists_every_variant(cast_file, capsys):
    code, out, err = run_cli(["audit", cast_file], capsys)
    assert code == 0, err
    assert "native_group_norm" in out and "aten::relu" in out and "custom CUDA" in out and "NVIDIA H200" in out


def test_audit_json_is_one_document(cast_file, capsys):
    code, out, err = run_cli(["audit", cast_file, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["format"] == 1
    assert {v["op"] for v in doc["variants"]} == {"aten::native_group_norm", "aten::relu"}
    for v in doc["variants"]:
        assert set(v) >= {"op", "signature", "category", "speedup", "evidence", "provenance"}
        assert v["category"] == "custom CUDA" and v["signature"]


@pytest.mark.parametrize("damage", ["truncated", "not a zip", "missing"])
def test_audit_refuses_a_damaged_file_with_exit_2(cast_file, tmp_path, capsys, damage):
    bad = tmp_path / "bad.cast"
    if damage == "truncated":
        bad.write_bytes(cast_file.read_bytes()[:500])
    elif damage == "not a zip":
        bad.write_text("hello")
    code, out, err = run_cli(["audit", bad, "--json"], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: audit:")


def test_audit_refuses_a_digest_mismatch_with_exit_2(cast_file, tmp_path, capsys):
    import zipfile

    bad = tmp_path / "tampered.cast"
    with zipfile.ZipFile(cast_file) as zin, zipfile.ZipFile(bad, "w") as zout:
        for name in zin.namelist():
            data = zin.read(name)
            zout.writestr(name, data + b"//" if name.endswith(".cu") else data)
    code, out, err = run_cli(["audit", bad], capsys)
    assert code == 2 and "digest mismatch" in err and len(err.strip().splitlines()) == 1


def _one_error_line(code, out, err):
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: audit: ") and "internal error" not in err
    return err.strip()


@pytest.mark.parametrize("member", ["manifest.json", "kernel"])
def test_audit_of_a_member_zipfile_cannot_read_is_exit_2(cast_file, tmp_path, capsys, member):
    # an encrypted member (`zip -e`) said "internal error: RuntimeError: File ... is encrypted", exit 1
    import zipfile

    with zipfile.ZipFile(cast_file) as z:
        name = member if member == "manifest.json" else next(n for n in z.namelist() if n.endswith(".cu"))
    bad = tmp_path / "bad.cast"
    mark_member(cast_file, bad, name, encrypted=True)
    code, out, err = run_cli(["audit", bad], capsys)
    line = _one_error_line(code, out, err)
    assert str(bad) in line and f"{name} is damaged (encrypted" in line
    # a kernel file keeps only its variant off: the others are still listed
    assert out == "" if member == "manifest.json" else "aten::relu" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_audit_verify_and_export_need_a_gpu(cast_file, tmp_path, capsys):
    code, out, err = run_cli(["audit", cast_file, "--verify"], capsys)
    assert code == 2 and "no CUDA GPU" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_cli(["export", "--out", tmp_path / "x.cast", "--workspace", tmp_path / "ws"], capsys)
    # a folder without runs says so first, and nothing is made there (it was left an empty workspace): the input
    # to fix on any machine (it said "no CUDA GPU")
    assert code == 2 and f"no Kernel Forge workspace at {tmp_path / 'ws'} (no runs there)" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.cast").exists() and not (tmp_path / "ws").exists()


def test_export_of_a_dry_run_says_it_is_one(tmp_path, capsys):
    from conftest import CONFIGS

    code, out, err = run_cli(["run", CONFIGS / "examples" / "my_model.toml", "--small", "--dry-run", "--no-tui",
                              "--iterations", "1", "--json", "--workspace", tmp_path / "ws"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["export", "--out", tmp_path / "x.cast", "--workspace", tmp_path / "ws"], capsys)
    assert code == 2 and "is a dry run" in err and "--resume" in err, err
    assert not (tmp_path / "x.cast").exists()


def test_export_needs_out(tmp_path, capsys):
    code, out, err = run_cli(["export", "--workspace", tmp_path / "ws"], capsys)
    assert code == 2 and "--out" in err


def test_export_warnings_reach_a_redirected_stderr_and_the_json(tmp_path, capsys, monkeypatch):
    """The cast is written, but the model is not faster with confidence: a script running `export --json`
    with stderr in a log must still learn it (progress lines are for terminals only)."""
    import engine.export.package as export

    caveat = ("the model is not faster with this cast with confidence (0.975x, 95% CI 0.886-1.139); it is "
              "written because no variant set made it slower")

    def fake_export_run(workspace, run_id, out, **kw):  # the GPU part is tested on the H200 (test_run_gpu)
        return export.ExportResult(out, [{"id": "mul_Tensor-f224aaa6", "op": "aten::mul.Tensor", "speedup": 1.1,
                                          "speedup_ci": [1.07, 1.12]}], [], [caveat])

    monkeypatch.setattr(export, "export_run", fake_export_run)
    code, out, err = run_cli(["export", "--out", tmp_path / "x.cast", "--workspace", tmp_path / "ws", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["warnings"] == [caveat]
    assert err.strip() == f"kforge: warning: {caveat}"
    code, out, err = run_cli(["export", "--out", tmp_path / "x.cast", "--workspace", tmp_path / "ws"], capsys)
    assert code == 0 and out.startswith(f"wrote {tmp_path / 'x.cast'}: 1 variant(s)")
    assert err.strip() == f"kforge: warning: {caveat}"
