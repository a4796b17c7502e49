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


def test_a_builder_files_classes_can_be_found_by_module_name(tmp_path):
    """torch.compile (and pickling) look a model's classes up by their module's name: the builder file is
    registered as imported. (On the H200 the whole-model check under compile of a user-file model failed
    with "No module named 'kforge_user_model_rms_stack'".)"""
    import pickle

    import torch

    from engine.config import build_target, load_config

    (tmp_path / "um.py").write_text(
        "import torch\nfrom torch import nn\n\nclass Net(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.lin = nn.Linear(8, 8)\n\n    def forward(self, x):\n"
        "        return self.lin(x)\n\ndef build(device, dtype):\n"
        "    return Net().to(device=device, dtype=dtype), (torch.randn(2, 8, device=device, dtype=dtype),)\n")
    (tmp_path / "um.toml").write_text('name = "um"\nbuilder = "um.py:build"\n[dtype]\ncpu = "float32"\n')
    target = build_target(load_config(tmp_path / "um.toml"), torch.device("cpu"))
    again = pickle.loads(pickle.dumps(target.module))
    assert type(again).__name__ == "Net" and type(again).__module__ == type(target.module).__module__
