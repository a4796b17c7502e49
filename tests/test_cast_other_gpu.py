"""A cast on a GPU it was not proven on (issue: other GPUs): one line says so and how to proceed (audit
--verify, then load(..., unproven_ok=True)); `export --also-arch` ships cubins for other archs, marked
unproven; the loader picks the cubin for the exact arch, else the PTX."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
from conftest import ROOT
from test_cast_modules import ENV, Counting, _variant

import engine.cast
from engine.cast import format as cast_format
from engine.cast.format import CastWarning, file_entry, read_cast, write_cast
from engine.cast.loader import _image

SPARK = {**ENV, "gpu": "NVIDIA GB10", "arch": "sm_121", "compute_capability": [12, 1]}


def _cast(tmp_path, with_spark_cubin=True):
    files = {"kernels/rms.sm_90.cubin": b"cubin-90", "kernels/rms.ptx": b".version 8.0\n.target sm_90\n"}
    vf = {"cubin": file_entry("kernels/rms.sm_90.cubin", files["kernels/rms.sm_90.cubin"], arch="sm_90"),
          "ptx": file_entry("kernels/rms.ptx", files["kernels/rms.ptx"])}
    if with_spark_cubin:
        files["kernels/rms.sm_121.cubin"] = b"cubin-121"
        vf["cubin:sm_121"] = {**file_entry("kernels/rms.sm_121.cubin", b"cubin-121", arch="sm_121"), "proven": False}
    v = {**_variant(), "files": vf}
    manifest = {"format": cast_format.FORMAT, "format_version": cast_format.FORMAT_VERSION, "env": ENV,
                "variants": [v]}
    write_cast(tmp_path / "m.cast", manifest, files, "# test\n")
    return tmp_path / "m.cast"


def test_on_another_gpu_the_cast_stays_on_pytorch_and_says_what_to_do(tmp_path):
    path = _cast(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cast = engine.cast.load(path, env=SPARK, plans={"rms": Counting()})
    assert cast.problem is not None and not cast.usable()
    (w,) = [str(x.message) for x in caught if issubclass(x.category, CastWarning)]
    assert "\n" not in w and "proven on sm_90 (NVIDIA H200), not on this sm_121 (NVIDIA GB10)" in w
    assert f"kforge-tui audit {path} --verify" in w and "unproven_ok=True" in w
    assert "cubins compiled for sm_121 (not proven there)" in w


def test_unproven_ok_installs_it_with_its_cubin_for_that_arch(tmp_path):
    path = _cast(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cast = engine.cast.load(path, env=SPARK, plans={"rms": Counting()}, unproven_ok=True)
    assert cast.problem is None and [v.id for v in cast.usable()] == ["rms"]
    assert any("because unproven_ok=True" in str(x.message) for x in caught)
    f = read_cast(path)
    (v,) = f.variants
    assert _image(f, v, "sm_121") == b"cubin-121"  # its own cubin
    assert _image(f, v, "sm_90") == b"cubin-90"
    assert _image(f, v, "sm_100").startswith(b".version")  # no cubin: the PTX, for the driver to compile


def test_without_a_cubin_for_the_arch_the_line_says_ptx(tmp_path):
    path = _cast(tmp_path, with_spark_cubin=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.cast.load(path, env=SPARK, plans={"rms": Counting()})
    assert any("0 of 1 variant(s) compiled for sm_121, PTX for 1" in str(x.message) for x in caught)


def test_another_torch_is_still_refused_whatever_unproven_ok_says(tmp_path):
    path = _cast(tmp_path)
    other = {**SPARK, "torch": "2.99.0", "torch_minor": "2.99"}
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        cast = engine.cast.load(path, env=other, plans={"rms": Counting()}, unproven_ok=True)
    assert cast.problem is not None and not cast.usable()  # refused: the arch is not the only difference


def test_also_arch_extra_cubins_are_packaged_as_unproven():
    from engine.export.package import ExportVariant, package

    card = {"card_id": "c" * 16, "op": "aten::relu", "signature": {"op": "aten::relu", "args": [], "aliases": []},
            "outputs": [], "signature_text": "f16[8]"}
    cand = {"id": "cand-1", "source": "", "launch_spec": "[[launch]]\nkernel = \"k\"\ngrid = [1]\nblock = [32]\n"}
    v = ExportVariant(card, cand, b"90", ".target sm_90", "sm_90", extra_cubins={"sm_121": b"121"})
    manifest, files, _ = package([v], ENV, {"run": "r"})
    entry = manifest["variants"][0]["files"]["cubin:sm_121"]
    assert entry["arch"] == "sm_121" and entry["proven"] is False and files[entry["path"]] == b"121"


@pytest.mark.parametrize("value", ["121", "sm_121,gb10"])
def test_a_bad_also_arch_is_one_line(tmp_path, value):
    r = subprocess.run([sys.executable, "-m", "kforge_tui", "export", "--out", str(tmp_path / "x.cast"),
                        "--also-arch", value, "--workspace", str(tmp_path)], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--also-arch" in r.stderr, r.stderr
