"""The README as a new user reads it: how to install, test and run a first command come first, and the test
command it gives is the one CI runs."""

from __future__ import annotations

from conftest import ROOT

INSTALL = 'pip install -e ".[models,dev]"'
TEST = "python -m pytest -q"


def test_set_up_and_a_first_command_are_in_the_first_40_lines():
    # They sat below 150 lines of results, where a first-time reader never got to them.
    top = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    assert INSTALL in top and TEST in top
    assert "kforge-tui capture configs/models/resnet50.toml --small" in top


def test_ci_runs_the_readmes_test_command():
    assert TEST in (ROOT / "README.md").read_text()
    commands = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert commands[-1].replace("python3 ", "python ", 1) == TEST
