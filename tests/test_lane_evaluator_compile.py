"""The compile time an evaluation reports is the compile that candidate cost (the pool's), not the cache hit
the lane's own lookup finds a moment later: the harness table's 'median compile ms (uncached)' was empty on
the H200 because every evaluation said 'cached'."""

import asyncio

from engine.cards import OperatorCard
from engine.compile import Compiler
from engine.lane.evaluate import Evaluation
from engine.propose.base import Proposal
from engine.run import evaluators
from engine.run.evaluators import LaneEvaluator
from engine.run.plan import CardState

SOURCE = r'''
extern "C" __global__ void scale(const float* __restrict__ x, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 3.0f * x[i];
}
'''


class Lane:
    name = "lane0"


def test_an_evaluation_reports_the_pools_compile_not_the_lanes_cache_hit(tmp_path, monkeypatch):
    compiler = Compiler(tmp_path / "cache", "nvrtc", arch="sm_90")
    seen = []

    async def lane_check(lane, compiler, card, source, spec, **kw):  # the lane looks the binary up again
        again = compiler.compile(source)
        seen.append(again.cached)
        return Evaluation("verified", None, "", again.seconds, cached_compile=again.cached)

    monkeypatch.setattr(evaluators, "evaluate", lane_check)
    card = CardState(OperatorCard("c", "aten::mul.Tensor", {}, bytes=100, eager_us=40.0, roofline_us=1.0, share=0.5),
                     ["s"])
    ev = LaneEvaluator([Lane()], compiler)
    first = asyncio.run(ev(card, Proposal(SOURCE, {})))
    assert seen == [True]  # what the lane saw: a cache hit
    assert first.cached_compile is False and first.compile_seconds > 0.01  # what the candidate cost: NVRTC
    second = asyncio.run(ev(card, Proposal(SOURCE, {})))
    assert second.cached_compile is True  # the same source again: the pool's compile was a cache hit too
