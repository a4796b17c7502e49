"""The install works on Linux aarch64 (DGX Spark, GH200; issue 24, item 6): every dependency in
pyproject is known to have an aarch64 or pure-Python wheel (scripts/check_aarch64_wheels.py found it and
keeps the list, with the date), or is optional. A new dependency fails here until the script is run."""

import datetime

from conftest import load_script

aarch64 = load_script("check_aarch64_wheels")


def test_every_core_dependency_has_an_aarch64_wheel_on_record():
    core = aarch64.requirements()["core"]
    assert core, "pyproject has no [project] dependencies?"
    unknown = [r for r in core if aarch64.dist_name(r) not in aarch64.KNOWN_AARCH64]
    assert not unknown, (f"no aarch64 wheel on record for {unknown}: run scripts/check_aarch64_wheels.py, "
                         "add what it finds to KNOWN_AARCH64 (or make the dependency optional)")


def test_checked_extras_are_on_record_and_the_rest_are_optional():
    groups = aarch64.requirements(extras=("models", "dev"))
    for extra in ("models", "dev"):
        unknown = [r for r in groups[extra] if aarch64.dist_name(r) not in aarch64.KNOWN_AARCH64]
        assert not unknown, f"extra [{extra}]: no aarch64 wheel on record for {unknown}"
    # Anything else (ray) is an extra: optional, nothing imports it unless asked.
    core_names = {aarch64.dist_name(r) for r in groups["core"]}
    assert "ray" not in core_names


def test_the_record_is_dated_and_names_aarch64_or_pure_wheels():
    assert datetime.date.fromisoformat(aarch64.CHECKED) <= datetime.date.today()
    for name, file in aarch64.KNOWN_AARCH64.items():
        assert file.endswith(".whl"), name
        assert "aarch64" in file or file.endswith("-none-any.whl"), (name, file)


def test_requirement_names_and_markers():
    assert aarch64.dist_name("torch>=2.4") == "torch"
    assert aarch64.dist_name("Textual_Plotext>=1.0") == "textual-plotext"
    assert aarch64.dist_name("tomli>=2.0; python_version < '3.11'") == "tomli"
    assert not aarch64.applies("tomli>=2.0; python_version < '3.11'", "3.12")
    assert aarch64.applies("tomli>=2.0; python_version < '3.11'", "3.10")
    assert aarch64.applies("x; platform_machine == 'aarch64'") and not aarch64.applies("x; sys_platform == 'win32'")
