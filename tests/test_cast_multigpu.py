"""A cast prepared on the second GPU runs there while the first GPU is the current device: the routers
launch in the variant's device context, as PyTorch's own kernels do (needs two GPUs)."""

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]


@pytest.mark.parametrize("router", ["python", "cpp"])
def test_a_cast_on_the_second_gpu_runs_while_the_first_is_current(tmp_path, monkeypatch, router):
    import engine.cast
    from engine.export.hostcost import relu_cast

    monkeypatch.setenv("KFORGE_CAST_ROUTER", router)
    torch.cuda.set_device(1)
    cast = None
    try:
        cast = engine.cast.load(relu_cast(tmp_path / "relu.cast"))  # prepared on cuda:1
        cast.install()
        x = torch.randn(4096, device="cuda:1", dtype=torch.float16)
        torch.cuda.set_device(0)
        cast.reset_stats()
        y = torch.relu(x)
        torch.cuda.synchronize(1)
        stats = cast.stats()
        assert [v["hits"] for v in stats["variants"]] == [1], stats
        assert [v["router"] for v in stats["variants"]] == ["c++" if router == "cpp" else "python"]
        assert torch.equal(y, x.clamp_min(0))
    finally:
        if cast is not None:
            cast.remove()
        torch.cuda.set_device(0)
