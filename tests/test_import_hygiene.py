"""The engine never imports Textual: every engine module, and a whole headless capture, run without it."""

import pytest


@pytest.mark.xdist_group("engine_import_probe")
def test_engine_and_headless_capture_never_import_textual(engine_import_probe):
    # conftest.IMPORT_PROBE: every engine module, `--help`, `run --help`, then a headless capture of my_model
    proc = engine_import_probe
    assert proc.returncode == 0, proc.stderr
    assert "TEXTUAL: []" in proc.stderr
    assert '"model":"my_model"' in proc.stdout


def test_no_test_monkeypatches_a_torch_config_module():
    # pytest 9.2's monkeypatch undo deletes a setting from torch's config modules (ConfigModule), and every later
    # compile in that worker fails: 18 tests of the README's command failed on a fresh install. Tests use the
    # `torch_config` fixture (the module's own `patch`).
    import re
    from pathlib import Path

    pattern = re.compile(r"monkeypatch\.setattr\(\s*(config|fconfig|\w*_config|torch\._(inductor|dynamo|functorch)\.config)\s*,")
    here = Path(__file__).parent
    found = [f"{p.name}:{i}" for p in sorted(here.glob("*.py")) if p.name != Path(__file__).name
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found
