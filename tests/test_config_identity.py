"""A config's identity covers what builds the model: editing the builder `.py` is a new capture for `run`."""

import hashlib
import json
import sqlite3

from conftest import capture_json
from test_bad_input import assert_one_line_error

BUILDER = '''
import torch
from torch import nn

WIDTH = {width}

def build(device, dtype, batch=2):
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH), nn.GELU()).to(device, dtype).eval()
    return model, (torch.randn(batch, WIDTH, device=device, dtype=dtype),)
'''

TOML = 'name = "ident"\nbuilder = "net.py:build"\n[params]\nbatch = 4\n[small]\nbatch = 2\n'


def _write(tmp_path, width):
    (tmp_path / "net.py").write_text(BUILDER.format(width=width))
    cfg = tmp_path / "ident.toml"
    cfg.write_text(TOML)
    return cfg


def _run(cli, cfg, ws):
    code, out, err = cli("run", cfg, "--small", "--dry-run", "--no-tui", "--device", "cpu", "--iterations", "1",
                         "--workspace", ws, "--json")
    assert code == 0, err
    json.loads(out)  # one JSON document on stdout


def _store(ws):
    db = sqlite3.connect(ws / "kforge.db")
    captures = [c for (c,) in db.execute("SELECT id FROM captures ORDER BY created_at")]
    used = [c for (c,) in db.execute("SELECT capture_id FROM runs ORDER BY rowid")]
    sigs = {c: {s for (s,) in db.execute("SELECT signature_text FROM cards WHERE capture_id = ?", (c,))}
            for c in captures}
    return captures, used, sigs


def test_editing_the_builder_is_a_new_capture(cli, capsys, tmp_path):
    ws = tmp_path / "ws"
    cfg = _write(tmp_path, 16)
    first = capture_json(cfg, ws, capsys)
    _run(cli, cfg, ws)
    captures, used, _ = _store(ws)
    assert captures == [first["capture"]] and used == [first["capture"]]  # unchanged: the capture is reused

    (tmp_path / "net.py").write_text(BUILDER.format(width=24))  # the model changes, the TOML does not
    _run(cli, cfg, ws)
    captures, used, sigs = _store(ws)
    assert len(captures) == 2 and used == [first["capture"], captures[1]]
    assert sigs[captures[0]] != sigs[captures[1]]
    assert any("24" in s for s in sigs[captures[1]]) and not any("24" in s for s in sigs[captures[0]])


def test_shipped_builder_identity_covers_its_module(tmp_path):
    from engine.config import load_config

    config = load_config("resnet50")
    assert config.builder_file is not None and config.builder_file.name == "resnet50.py"
    assert config.sha256 != hashlib.sha256(config.path.read_bytes()).hexdigest()


def test_builder_file_missing_is_one_line(cli, tmp_path):
    cfg = _write(tmp_path, 16)
    (tmp_path / "net.py").unlink()
    for argv in (("capture", cfg, "--small", "--device", "cpu"),
                 ("run", cfg, "--small", "--dry-run", "--no-tui", "--device", "cpu")):
        code, out, err = cli(*argv, "--workspace", tmp_path / "ws")
        assert_one_line_error(code, out, err, "net.py", "not found")


def test_builder_file_unreadable_is_one_line(cli, tmp_path):
    cfg = _write(tmp_path, 16)
    (tmp_path / "net.py").unlink()
    (tmp_path / "net.py").mkdir()  # there, but not a file one can read
    code, out, err = cli("capture", cfg, "--small", "--device", "cpu", "--workspace", tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.py", "not a file")
