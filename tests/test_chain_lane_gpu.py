"""A chain card in a real lane: the toy model's RMSNorm module chain (tests/test_chains.py), traced on the
GPU, its samples written as the capture writes them, and a hand-written kernel for it (tests/
test_chain_lane.py) verified against `run_chain` and timed; a kernel that drops the weight's `1 +` is
rejected. Lane time: well under a minute on an H200."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

CORRECT = {"max_seconds": 0.5}


def _chain_card(tmp_path: Path, samples: int = 2):
    """The CardRef of the toy RMSNorm chain on the GPU, with `samples` sample files of its inputs."""
    from test_chain_lane import D
    from test_chains import Model

    from engine.capture.chain_cards import synthetic_chain_card
    from engine.capture.chains import chain_signature, container_paths, find_chains, patterns, trace_forward

    torch.manual_seed(0)
    model = Model(d=D).to(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 5, D, device="cuda", dtype=torch.bfloat16)
    t = trace_forward(model, lambda: model(x), time_calls=False)
    (norm,) = [p for p in patterns(find_chains(t.calls, container_paths(model), unknown=t.unknown))
               if p.kind == "module"]
    # Random inputs, the weight (in1) included: the kernel without the weight's `1 +` cannot pass by chance.
    return synthetic_chain_card(tmp_path, chain_signature(norm.instances[0]), samples)


@pytest.mark.gpu
def test_a_hand_written_rmsnorm_chain_kernel_verifies_and_is_timed_in_a_lane(tmp_path):
    from gpu_harness import evaluate_many
    from test_chain_lane import RMS_CHAIN_CU, RMS_CHAIN_SPEC

    card = _chain_card(tmp_path / "card")
    no_one_plus = RMS_CHAIN_CU.replace("(1.f + bf2f(w[i]))", "bf2f(w[i])")
    assert no_one_plus != RMS_CHAIN_CU
    good, wrong = evaluate_many([(card, RMS_CHAIN_CU, RMS_CHAIN_SPEC), (card, no_one_plus, RMS_CHAIN_SPEC)],
                                cache_dir=tmp_path / "compile", timing=CORRECT)
    tm = good.payload.get("timing") or {}
    print(f"\nrms chain: {good.status} {good.category or ''} {good.message[:300]}; eager "
          f"{(tm.get('eager') or {}).get('median')} us, ours {(tm.get('candidate') or {}).get('median')} us")
    assert good.status == "verified", f"{good.category}: {good.message}"
    assert good.payload["verdict"]["ok"] and good.payload["verdict"]["sets_checked"] == 2 + 2 + 4
    assert tm["candidate"]["median"] > 0 and tm["eager"]["median"] > 0
    floor = good.payload["physics_floor"]
    assert floor["flops"] is None and floor["binding"] in ("memory", "launch")
    assert wrong.status == "rejected" and wrong.category == "mismatch", f"{wrong.category}: {wrong.message}"
