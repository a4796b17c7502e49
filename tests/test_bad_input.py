"""Bad input: exit 2, one line on stderr naming the file or key, no traceback, nothing half-written."""

import sqlite3
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS

GOOD_MODEL = '''
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self, fail):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.fail = fail
    def forward(self, x):
        y = torch.relu(self.lin(x))
        if self.fail:
            raise RuntimeError("shape mismatch in block 3\\nsecond line")
        return y

def build(fail=False, explode=False):
    if explode:
        raise ValueError("cannot build with these params")
    return Net(fail), (torch.randn(2, 8),)
'''


def write(tmp_path: Path, toml: str, model: str | None = GOOD_MODEL) -> Path:
    if model is not None:
        (tmp_path / "net.py").write_text(model)
    cfg = tmp_path / "net.toml"
    cfg.write_text(textwrap.dedent(toml))
    return cfg


def assert_one_line_error(code, out, err, *needles):
    assert code == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]


def assert_nothing_written(ws: Path):
    samples = ws / "samples"
    assert not samples.exists() or not any(samples.iterdir())
    db = ws / "kforge.db"
    if db.exists():
        assert sqlite3.connect(db).execute("SELECT count(*) FROM captures").fetchone()[0] == 0


def capture(cli, cfg, ws, *extra):
    return cli("capture", cfg, "--device", "cpu", "--workspace", ws, *extra)


def test_missing_config(cli, tmp_path):
    code, out, err = capture(cli, tmp_path / "nope.toml", tmp_path / "ws")
    assert_one_line_error(code, out, err, "nope.toml", "not found")


def test_invalid_toml(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[params\n')
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "invalid TOML")


def test_unknown_key(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\nbatchsize = 3\n')
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "'batchsize'", "unknown key")


def test_unknown_nested_key(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[capture]\nsample = 3\n')
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "'capture.sample'")


def test_small_override_of_unknown_param(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[small]\nbatch = 1\n')
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "'small.batch'")


def test_builder_module_does_not_import(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "no_such_pkg.models:build"\n', model=None)
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "'builder'", "no_such_pkg.models")
    assert_nothing_written(tmp_path / "ws")


def test_builder_file_with_syntax_error(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n', model="def build(:\n")
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "'builder'", "SyntaxError")


def test_builder_function_missing(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:make"\n')
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "no function 'make'")


def test_param_the_builder_does_not_take(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[params]\nwidth = 3\n')
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "'params.width'")


def test_builder_raises(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[params]\nexplode = true\n')
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "cannot build with these params")
    assert_nothing_written(tmp_path / "ws")


def test_model_raises_during_forward(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[params]\nfail = true\n')
    ws = tmp_path / "ws"
    code, out, err = capture(cli, cfg, ws)
    assert_one_line_error(code, out, err, "net.toml", "RuntimeError: shape mismatch in block 3")
    assert "second line" not in err
    assert_nothing_written(ws)


def test_debug_shows_the_traceback(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[params]\nfail = true\n')
    code, _, err = capture(cli, cfg, tmp_path / "ws", "--debug")
    assert code == 2 and "Traceback" in err


def test_unknown_multiplicity_path(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[multiplicity]\n"blocks.0" = 4\n')
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "'multiplicity.blocks.0'")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present here")
def test_cuda_device_absent(cli, tmp_path):
    code, out, err = cli("capture", CONFIGS / "models" / "resnet50.toml", "--device", "cuda",
                         "--workspace", tmp_path / "ws")
    assert_one_line_error(code, out, err, "--device cuda", "--device cpu")
    assert_nothing_written(tmp_path / "ws")


def test_bad_option_is_one_line(cli, tmp_path):
    code, out, err = cli("capture", "x.toml", "--frobnicate")
    assert_one_line_error(code, out, err, "--frobnicate")


def test_workspace_is_a_file(cli, tmp_path):
    ws = tmp_path / "ws"
    ws.write_text("not a folder")
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n')
    code, out, err = capture(cli, cfg, ws)
    assert_one_line_error(code, out, err, str(ws))


def test_export_and_audit_refuse_bad_input(cli, tmp_path):
    # No GPU here: export says so; audit of a file that is not there names it.
    code, out, err = cli("export", "--out", tmp_path / "x.cast", "--workspace", tmp_path)
    assert_one_line_error(code, out, err, "export:")
    code, out, err = cli("audit", tmp_path / "missing.cast")
    assert_one_line_error(code, out, err, "missing.cast")


def test_help_lists_every_subcommand(cli, capsys):
    with pytest.raises(SystemExit) as exc:
        cli("--help")
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in ("capture", "run", "export", "audit", "compare", "demo"):
        assert name in out


def test_user_model_example_captures(cli, tmp_path):
    import json

    code, out, err = cli("capture", CONFIGS / "examples" / "my_model.toml", "--small", "--json",
                         "--device", "cpu", "--workspace", tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    ops = {c["op"]: c["calls"] for c in doc["cards"]}
    assert ops["aten::native_layer_norm"] == 24  # 2 blocks scaled ×12 each
    assert ops["aten::gelu"] == 24 and "aten::_softmax" in ops
