"""Fresh and edge sets are drawn where the sample lives (engine.verify.inputs.on_device): a host draw of one large
GPU activation took seconds (float64 normals, then a copy), most of the SD3.5 VAE's card loading on an H100."""

import pytest
import torch

from engine.verify.inputs import edge_inputs, fresh_inputs, on_device


def test_a_host_generator_draws_host_tensors_itself():
    g = torch.Generator().manual_seed(3)
    assert on_device(g, torch.device("cpu")) is g


def test_a_device_without_generators_of_its_own_is_drawn_for_on_the_host():
    g = torch.Generator().manual_seed(3)
    assert on_device(g, torch.device("meta")) is g


def test_host_fresh_sets_are_the_draws_they_were():
    # The host path is unchanged: the same seed gives the same values as a float64 draw on the host did.
    x = torch.randn(4, 8, dtype=torch.float32)
    got = dict(fresh_inputs([("self", x)], 7))["self"]
    mean, std = float(x.double().mean()), float(x.double().std())
    lo, hi = float(x.min()), float(x.max())
    want = (torch.randn(32, generator=torch.Generator().manual_seed(7), dtype=torch.float64) * std + mean)
    assert torch.equal(got.flatten(), want.clamp_(lo, hi).float())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_fresh_and_edge_sets_are_drawn_on_the_gpu_and_repeat_per_seed():
    dev = torch.device("cuda")
    x = torch.randn(1, 64, 256, 256, device=dev, dtype=torch.bfloat16) * 3 + 1
    mask = torch.rand(1, 64, 256, 256, device=dev) < 0.3
    ids = torch.randint(0, 50, (4096,), device=dev)
    sample = [("self", x), ("mask", mask), ("ids", ids)]
    a, b, c = fresh_inputs(sample, 5), fresh_inputs(sample, 5), fresh_inputs(sample, 6)
    for (name, u), (_, v), (_, w) in zip(a, b, c):
        assert u.device.type == "cuda" and torch.equal(u, v), name
        assert not torch.equal(u, w), name
    fx = dict(a)["self"].double()
    assert abs(float(fx.mean()) - 1.0) < 0.05 and abs(float(fx.std()) - 3.0) < 0.1
    assert float(fx.min()) >= float(x.min()) and float(fx.max()) <= float(x.max())
    assert abs(float(dict(a)["mask"].float().mean()) - 0.3) < 0.01
    fi = dict(a)["ids"]
    assert int(fi.min()) >= int(ids.min()) and int(fi.max()) <= int(ids.max())
    signs = dict(edge_inputs(sample, ("signs",)))
    if "signs" in signs:
        s = dict(signs["signs"])["self"]
        assert s.device.type == "cuda" and torch.equal(s.abs(), x.abs())
