"""A decoding step (engine/models/decode.py) on the GPU: the forward is repeatable, and a CUDA graph of it
(bench_e2e's cuda-graphs arm, engine.bench.forward.capture_graph) replays the cache's copy with the step, so
each replay starts from the prefilled cache and equals the eager step bit for bit."""

from __future__ import annotations

import pytest
import torch
from conftest import CONFIGS

from engine.config import build_target, load_config

pytestmark = pytest.mark.gpu


def test_a_decoding_step_replays_from_a_cuda_graph_as_it_runs_eagerly():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from engine.bench.forward import capture_graph

    target = build_target(load_config(CONFIGS / "examples" / "gemma4_e2b_decode.toml", small=True),
                          torch.device("cuda"))
    with torch.no_grad():
        want = target.forward().logits.clone()
        assert torch.equal(target.forward().logits, want)  # repeatable: the cache is not grown
        graph, out = capture_graph(target.forward)
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out.logits, want)  # each replay from the prefilled cache
