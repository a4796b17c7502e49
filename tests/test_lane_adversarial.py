"""The adversarial suite: every cheat or fault is rejected with its category; correct kernels pass.

The compile-level half runs everywhere (NVRTC for sm_90 needs no GPU); the lane half needs the H200.
"""

import asyncio
from pathlib import Path

import pytest
import torch
from adversarial_kernels import ADVERSARIES

from engine.compile import Compiler, compile_nvrtc


def test_suite_is_large_enough():
    cheats = [a for a in ADVERSARIES if a.expect is not None]
    assert len(cheats) >= 15
    assert {a.expect for a in cheats} >= {"nan", "mutation", "mismatch", "suspicious", "runtime-fault",
                                          "timeout", "launch", "compile"}


@pytest.mark.parametrize("adv", ADVERSARIES, ids=[a.name for a in ADVERSARIES])
def test_every_kernel_compiles_for_sm90_unless_meant_not_to(adv):
    r = compile_nvrtc(adv.source, arch="sm_90")
    assert r.ok == (adv.expect != "compile"), r.summary()
    if not r.ok:
        assert r.diagnostics and r.diagnostics[0].line == 5


def _make_card(tmp_path: Path, kind: str):
    """One real call captured on the GPU, so the card has real samples on disk."""
    from gpu_harness import make_card

    torch.manual_seed(0)
    if kind == "add":
        return make_card(tmp_path, lambda: torch.add(torch.randn(1 << 22, device="cuda"),
                                                     torch.randn(1 << 22, device="cuda")))
    return make_card(tmp_path, lambda: torch.sum(torch.randn(512, 4096, device="cuda"), dim=1))


@pytest.mark.gpu
def test_lane_rejects_each_cheat_with_its_category(tmp_path):
    from engine.lane.client import GpuLane, worker_argv
    from engine.lane.evaluate import evaluate

    cards = {kind: _make_card(tmp_path / kind, kind) for kind in ("add", "sum")}
    compiler = Compiler(tmp_path / "cache", "nvrtc", arch="sm_{}{}".format(*torch.cuda.get_device_capability()))

    async def run_all():
        lane = GpuLane(worker_argv(torch.cuda.current_device()), timeout_s=60)
        await lane.start()
        out = []
        try:
            for adv in ADVERSARIES:
                timeout = 8 if adv.expect == "timeout" else None
                ev = await evaluate(lane, cards[adv.card], compiler.compile(adv.source), adv.spec,
                                    timeout_s=timeout, timing={"max_seconds": 1.0})
                out.append((adv, ev))
        finally:
            await lane.close()
        return out

    results = asyncio.run(run_all())
    lines = [f"{a.name}: expected {a.expect}, got {e.category} ({e.status}) {e.message[:160]}"
             for a, e in results]
    print("\n".join(lines))
    wrong = [ln for (a, e), ln in zip(results, lines) if e.category != a.expect]
    assert not wrong, "\n".join(wrong)
    for a, e in results:
        if a.expect is None:
            assert e.status == "verified" and e.payload["timing"]["speedup"] > 0
