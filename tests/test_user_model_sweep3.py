"""A third sweep of user models, further down the user's path on a CPU: capture, `run --dry-run`, and what each
says to the user."""

import json
from pathlib import Path

import torch
from test_user_model_sweep import _config


def _capture_json(cli, tmp_path: Path, source: str, params: str = "") -> dict:
    code, out, err = cli("capture", _config(tmp_path, source, params), "--device", "cpu", "--json", "--workspace",
                         tmp_path / "ws")
    assert code == 0, err
    return json.loads(out)


def test_a_cpu_only_pytorch_build_does_not_make_every_op_cpu_only(monkeypatch):
    # A PyTorch built without CUDA (a `+cpu` wheel, a laptop's) registers no CUDA kernel for any op: a dry run there
    # said "cpu-only op: the GPU runs a different op" of relu, batch norm and most of a model, and proposed for none.
    from engine.run.as_gpu import is_cpu_only

    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    assert not is_cpu_only("aten::relu") and not is_cpu_only("aten::native_batch_norm")
    assert is_cpu_only("aten::_scaled_dot_product_flash_attention_for_cpu") and is_cpu_only("aten::mkldnn_rnn_layer")
