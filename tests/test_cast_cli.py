"""`kforge-tui audit` and `export` as a user sees them without a GPU: exit codes and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cast_helpers import edit_manifest, mark_member, write_genuine_cast
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


@pytest.mark.parametrize("edit,expect", [
    (lambda m: m.update(env=None), "env must be a table, not null"),
    (lambda m: m["variants"][0].update(evidence=None), "variants[0].evidence must be a table, not null"),
    (lambda m: m["variants"][0]["evidence"].update(confirmed={"speedup": "fast"}),
     "variants[0].evidence.confirmed.speedup must be a number or null, not the string 'fast'"),
    (lambda m: m["variants"][1].update(id=None), "variants[1].id must be a non-empty string, not null"),
    (lambda m: m["variants"][0].update(files="x"), "variants[0].files must be a table of files, not the string 'x'"),
    (lambda m: m["variants"][0].update(targets=5), "variants[0].targets must be a list, not 5"),
], ids=["env", "evidence", "speedup", "id", "files", "targets"])
def test_audit_of_a_manifest_field_of_the_wrong_type_is_exit_2_naming_it(cast_file, tmp_path, capsys, edit, expect):
    # these said "internal error: AttributeError / TypeError / ValueError", exit 1
    bad = tmp_path / "bad.cast"
    edit_manifest(cast_file, bad, edit)
    for json_flag in ([], ["--json"]):
        code, out, err = run_cli(["audit", bad, *json_flag], capsys)
        assert out == "" and _one_error_line(code, out, err) == f"error: audit: {bad}: manifest.json: {expect}"


def test_audit_json_writes_a_non_finite_number_as_null(cast_file, tmp_path, capsys):
    # Python's json wrote `Infinity`, which jq and other strict parsers refuse
    bad = tmp_path / "inf.cast"
    edit_manifest(cast_file, bad, lambda m: m["variants"][0]["evidence"].update(
        confirmed={"speedup": float("inf"), "speedup_ci": [1.5, float("nan")]}))
    code, out, err = run_cli(["audit", bad, "--json"], capsys)
    assert code == 0, err

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    doc = json.loads(out, parse_constant=refuse)
    first = doc["variants"][0]
    assert first["speedup"] is None and first["evidence"]["confirmed"]["speedup_ci"] == [1.5, None]
    code, out, err = run_cli(["audit", bad], capsys)
    assert code == 0 and "inf×" in out


def _fields(x, at=()):
    """Every place in a manifest: the keys and list indexes that lead to it. Not inside a variant's signature,
    outputs or provenance: their entries are read only on a GPU, where a variant that fails to prepare stays
    off by itself (and they are most of the places: the test took 20 s with them)."""
    if at:
        yield at
    if at and at[-1] in ("signature", "outputs", "provenance"):
        return
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    for k, v in items:
        yield from _fields(v, (*at, k))


def test_no_manifest_the_loader_accepts_makes_load_raise_or_audit_say_internal_error(cast_file, capsys, monkeypatch):
    """Every field of a genuine manifest, set in turn to a value of another type: load() never raises, and
    audit either shows the cast (exit 0) or names what is wrong (exit 2), never an internal error."""
    import warnings

    import engine.cast
    import engine.cast.loader
    import engine.export.audit
    from engine.cast.format import CastError, CastFile, check_manifest, read_cast

    genuine = read_cast(cast_file)
    wrong = [None, "x", 5, 1.5, True, [], {}, float("inf"), [1.0], [1.0, None], ["x"], {"x": 1}]
    accepted = 0
    for at in list(_fields(genuine.manifest)):
        for value in wrong:
            m = json.loads(json.dumps(genuine.manifest))
            parent = m
            for k in at[:-1]:
                parent = parent[k]
            parent[at[-1]] = value
            try:  # the shape check comes first: what it refuses never reaches the rest
                check_manifest(m)
            except CastError:
                continue
            accepted += 1

            def read(path, m=m):
                check_manifest(m)
                return CastFile(str(path), m, genuine.files, {})
            monkeypatch.setattr(engine.cast.loader, "read_cast", read)
            monkeypatch.setattr(engine.export.audit, "read_cast", read)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cast = engine.cast.load(cast_file, env=genuine.manifest["env"])
            cast.stats()
            for json_flag in ([], ["--json"]):
                code, out, err = run_cli(["audit", cast_file, *json_flag], capsys)
                assert code in (0, 2) and "internal error" not in err, (at, value, err)
    assert accepted > 100  # the free fields (provenance, signatures, …) took other types


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
