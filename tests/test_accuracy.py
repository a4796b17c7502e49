"""The float32 control of whole-model accuracy (engine/bench/accuracy.py) and its place in bench_e2e's report."""

from __future__ import annotations

import pytest
import torch
from conftest import load_script

from engine.bench.accuracy import float32_output, rel_l2


class Deep(torch.nn.Module):
    """A deep bf16 stack with a float32 buffer beside its bf16 parameters."""

    def __init__(self, depth: int = 24, width: int = 64):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))
        for lin in self.layers:
            lin.weight.data = torch.randn(width, width, generator=g) / width ** 0.5 * 1.5
        self.register_buffer("scale", torch.tensor(0.5))
        self.to(torch.bfloat16)
        self.scale.data = self.scale.data.float()  # a buffer kept in float32, as rotary tables are

    def forward(self, x):
        for lin in self.layers:
            x = torch.tanh(lin(x)) + x * self.scale.to(x.dtype)
        return x


def test_the_float32_output_is_closer_to_the_exact_result_than_bf16_and_the_module_is_restored():
    m = Deep()
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    before = {n: (t.dtype, t.clone()) for n, t in list(m.named_parameters()) + list(m.named_buffers())}
    low = m(x)

    ref = float32_output(m, lambda: m(x), lambda out: out)

    assert ref.dtype == torch.float32
    with torch.no_grad():  # the exact result: the same weights in float64
        exact = Deep().double()
        exact.load_state_dict({k: v.double() for k, v in m.state_dict().items()})
        exact = exact(x.double())
    assert rel_l2(ref, exact) < rel_l2(low, exact) / 20
    for n, t in list(m.named_parameters()) + list(m.named_buffers()):
        assert t.dtype == before[n][0] and torch.equal(t, before[n][1]), n
    assert torch.equal(m(x), low)


def test_a_model_that_insists_on_its_dtype_raises_and_is_restored():
    m = Deep(depth=2)

    def forward():
        assert m.layers[0].weight.dtype == torch.bfloat16, "this model runs in bf16 only"
        return m(torch.zeros(1, 64))

    with pytest.raises(AssertionError, match="bf16 only"):
        float32_output(m, forward, lambda out: out)
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())


def test_bench_e2e_reports_both_outputs_against_float32_and_what_ran_in_the_graph():
    bench = load_script("bench_e2e")
    row = {"model": "gemma4_e2b@full_depth=true", "dispatched_by": "python", "variants": 8, "eager_ms": 57.3,
           "cast_ms": 41.2, "speedup": 1.39, "speedup_ci": [1.36, 1.46], "rel_l2_err": 0.82, "variants_hit": 7,
           "near_misses": {}, "restored_bit_exact": True, "hits": {}, "misses": {},
           "vs_float32": {"eager": 0.79, "cast": 0.80},
           "cuda_graphs": {"eager_ms": 39.7, "cast_ms": 39.7, "speedup": 1.0, "speedup_ci": [0.99, 1.0],
                           "rel_l2_err": 0.0, "cast_calls_captured": 0}}
    md = bench.markdown({"gpu": "H200", "torch": "2.11", "models": [row]})
    assert "| gemma4_e2b@full_depth=true | 7.9e-01 | 8.0e-01 | 8.2e-01 |" in md
    assert "| 1.0e+00" not in md and "| 0.0e+00 | 0 |" in md


def test_the_graph_arm_counts_only_the_cast_calls_made_while_capturing(monkeypatch):
    bench = load_script("bench_e2e")

    class Cast:
        hits = 0

        def reset_stats(self):
            self.hits = 0

        def stats(self):
            return {"variants": [{"hits": self.hits}]}

    cast, captured = Cast(), {"calls": 0}

    def forward():
        cast.hits += 2
        return "out"

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    for _ in range(2):  # the warm-up forwards before capture
        assert bench.counted(forward, cast, captured) == "out"
    assert captured["calls"] == 0
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    bench.counted(forward, cast, captured)
    assert captured["calls"] == 2


def test_bench_e2e_says_whether_the_casts_graph_routes_replayed_while_timed():
    bench = load_script("bench_e2e")
    row = {"model": "gemma4_e2b", "dispatched_by": "python", "variants": 8, "eager_ms": 10.5, "cast_ms": 8.4,
           "speedup": 1.24, "speedup_ci": [1.23, 1.25], "rel_l2_err": 0.026, "variants_hit": 8, "near_misses": {},
           "restored_bit_exact": True, "hits": {}, "misses": {},
           "graph_routes": {"classes": ["Gemma4TextDecoderLayer"], "modules": 4, "replaying": 3, "replays": 120,
                            "eager_calls": 41, "declines": {"hooks": 40}, "refused": ["a host sync"]}}
    md = bench.markdown({"gpu": "H200", "torch": "2.11", "models": [row]})
    assert "| gemma4_e2b | Gemma4TextDecoderLayer | 4 | 3 | 120 | 41 | hooks ×40 | a host sync |" in md
    del row["graph_routes"]
    assert "Graph routes of the cast" not in bench.markdown({"gpu": "H200", "torch": "2.11", "models": [row]})
