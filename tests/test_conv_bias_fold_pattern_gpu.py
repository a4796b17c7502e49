"""Conv-bias fold cards under torch.compile on CUDA, where the split is on by default (Inductor's CUDA lowering
splits a convolution's bias off anyway): the test_conv_bias_fold_pattern cases without `split_on_cpu`, in
bfloat16 under Inductor's layout optimization, with counting plans (no kernels). Written without a GPU at hand."""

from __future__ import annotations

import pytest
import torch
from test_cast_compile import CpuCast
from test_cast_pattern_cards import Counting
from test_chain_twins import _chain_sigs, _model
from test_conv_bias_fold_pattern import _calls, _compile, _fold_signature, _twin

pytestmark = pytest.mark.gpu


def _on_cuda(sig: dict) -> dict:
    """A signature captured on the CPU, its tensors on CUDA (the chain's members are device-agnostic)."""
    return {**sig, "args": [{**a, "device": "cuda"} for a in sig["args"]]}


def test_on_cuda_a_twin_fold_variant_takes_the_convolutions_output_as_held(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cpu_model = _model().to(torch.bfloat16)
    fold = _on_cuda(_fold_signature(_chain_sigs(cpu_model, torch.randn(2, 8, 4, 4, dtype=torch.bfloat16))))
    twin, strides = _twin(fold)
    plan, twin_plan = Counting(fold), Counting(twin)
    twin_plan.output_strides = strides
    model, x = cpu_model.cuda(), torch.randn(2, 8, 4, 4, dtype=torch.bfloat16, device="cuda")
    backend, graph, got, want = _compile(model, x, CpuCast("none"), [(fold, plan), (twin, twin_plan)],
                                         split_on_cpu=False, layout_opt=True)
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 1e-2
    assert backend.patterns.folds == {"split": 2, "reverted": 1}
    assert sum(backend.pattern_matches[0].values()) == 1 and (plan.calls, twin_plan.calls) == (0, 1)
    first, second = _calls(graph, "torch.ops.aten.convolution.default")
    assert ", None, [1, 1]," in first and ", None," not in second
    (row,) = [v for k, v in backend.layout_copies.items() if "kforge" in k]
    assert (row["calls"], row["inputs_copied"], row.get("inputs_as_held")) == (1, 0, 1), row
    assert not row.get("inputs_computed") and not row.get("inputs_computed_as_held"), row
