"""Capture on a CUDA GPU (skipped without one; run on the H200)."""

from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, run_cli

from engine.capture.samples import load_sample

pytestmark = pytest.mark.gpu


def test_resnet50_on_cuda_same_counts_as_cpu_and_samples_replay(tmp_path, capsys):
    import json

    code, out, err = run_cli(["capture", CONFIGS / "models" / "resnet50.toml", "--small", "--json",
                              "--device", "cuda", "--workspace", tmp_path, "--samples", "1"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["device"] == "cuda" and doc["dtype"] == "float16"
    calls = Counter()
    for c in doc["cards"]:
        calls[c["op"]] += c["calls"]
        assert all(a.get("device", "cuda") == "cuda" for a in c["args"] if a["kind"] == "tensor"
                   and not a.get("absent"))
    assert calls["aten::convolution"] == 53 and calls["aten::relu_"] == 49
    assert calls["aten::add_.Tensor"] == 16
    # batch-norm may dispatch to cudnn_batch_norm on CUDA instead of native_batch_norm
    assert sum(v for k, v in calls.items() if "batch_norm" in k) == 53
    # Shares come from CUDA events: every card has a positive measured time.
    assert all(c["capture_us"] > 0 for c in doc["cards"])
    relu = next(c for c in doc["cards"] if c["op"] == "aten::relu_")
    (f,) = (Path(tmp_path) / "samples" / doc["capture"]).glob(f"{relu['id']}.0.safetensors")
    sample = load_sample(f, "cuda")
    x = sample.args[0][1]
    assert x.is_cuda and (x < 0).any()
    y = x.clone().relu_()
    assert torch.equal(y, sample.outputs)
