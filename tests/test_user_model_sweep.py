"""Unusual but legitimate user models (and a few that are not) through `kforge-tui capture` on the CPU: what
a user sees, a capture or one line with exit 2."""

from pathlib import Path


def _config(tmp_path: Path, source: str, params: str = "") -> Path:
    (tmp_path / "user_model.py").write_text("import torch\nfrom torch import nn\n\n" + source)
    path = tmp_path / "user_model.toml"
    path.write_text('name = "user_model"\nbuilder = "user_model.py:build"\n' + (f"[params]\n{params}\n" if params else ""))
    return path


def _capture(cli, tmp_path: Path, source: str, params: str = "") -> tuple[int, str, str]:
    return cli("capture", _config(tmp_path, source, params), "--device", "cpu", "--workspace", tmp_path / "ws")


META = '''
class Bump(nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1


def build(where):
    if where == "params":
        return nn.Linear(16, 16, device="meta"), (torch.randn(4, 16),)
    return Bump(), (torch.randn(4, 16, device="meta"),)
'''


def test_a_model_on_meta_is_one_line_naming_the_meta_device(cli, tmp_path):
    # Weights on 'meta' failed as a device mismatch in the warm-up; meta inputs ran the warm-up and then failed
    # in the captured forward as "likely a Kernel Forge bug".
    code, out, err = _capture(cli, tmp_path, META, 'where = "params"')
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "'weight' is on the 'meta' device" in err and "`device` the builder is passed" in err
    code, out, err = _capture(cli, tmp_path, META, 'where = "inputs"')
    assert code == 2 and err.count("\n") == 1
    assert "on the 'meta' device" in err and "example inputs are meta tensors" in err and "Kernel Forge bug" not in err
    assert not any((tmp_path / "ws" / "samples").glob("*"))
