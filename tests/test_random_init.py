"""Random weights for reference models: the tiled fill works where builders allocate their models."""

import torch

from engine.models.random_init import _TiledFill


def test_the_fill_block_is_drawn_on_the_cpu_inside_a_cuda_device_context():
    # Builders allocate under `with torch.device("cuda")`; the fill's CPU generator must still draw its block
    # (on the H200 the SD3.5 builder failed with "Expected a 'cuda' device type for generator"). No GPU is
    # needed: the block and the rotation are drawn on the CPU, and the parameter here lives on the CPU.
    p = torch.empty(3 * 1_000_003, dtype=torch.bfloat16)
    with torch.device("cuda"):
        fill = _TiledFill(0, std=2.0)
        fill.fill(p)
    assert fill.block.device.type == "cpu"
    assert 1.8 < float(p.float().std()) < 2.2
