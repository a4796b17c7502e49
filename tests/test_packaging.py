"""The wheel carries every package, the themes and the shipped configs."""

import sys

from conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


def test_every_python_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for top in ("engine", "kforge_tui") for p in (ROOT / top).rglob("__init__.py")}
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def test_shipped_configs_resolve_by_name(cli, tmp_path):
    from engine.config import find_config, shipped_configs

    assert set(shipped_configs()) >= {"resnet50", "sd35_medium", "gemma4_e2b", "qwen35_a3b"}
    assert find_config("resnet50").read_bytes() == (ROOT / "configs/models/resnet50.toml").read_bytes()


def test_wheel_carries_themes_and_configs(tmp_path):
    import subprocess
    import zipfile

    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("kernel_forge-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "kforge_tui/themes/kforge-dark.toml" in names
    for model in ("resnet50", "sd35_medium", "gemma4_e2b", "qwen35_a3b"):
        assert f"engine/shipped_configs/models/{model}.toml" in names
    assert "engine/shipped_configs/examples/my_model.py" in names
    assert "engine/shipped_configs/providers.toml" in names
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "kforge-tui = kforge_tui.cli:main" in entry
