"""Single-op variants under torch.compile must not change what the compiled model computes (the op variant sweep,
CPU): a cast proves model A's call of one ATen op (its plan: PyTorch's own kernel, so a correct hit computes what
eager does), and a function B that differs from A in one detail (tests/op_compile_cases.py: a scalar, a keyword, an
absent weight, a dtype, a layout, a view, an in-place form, dynamic sizes) is compiled with it through
`compose.compile`. B's outputs must equal eager's, and A's variant must not run on a call that is not A's.

The whole sweep is scripts/op_compile_sweep.py; this file keeps the most telling cases."""

from __future__ import annotations

import pytest
from op_compile_cases import sweep_case

TESTED = ["gn same", "gn eps -0.0 vs 0.0", "gn no weight", "gn transposed view", "gn misaligned offset",
          "gn bf16 call, fp32 proven", "gn automatic dynamic", "softmax dtype=float32 on bf16",
          "clamp min 0 vs 0.0 on ints", "pow 2.0 vs 2 on ints", "leaky_relu -0.0 vs 0.0", "add_ in place",
          "gelu tanh vs none", "addmm beta", "bmm transposed"]


@pytest.fixture(autouse=True)
def _own_inductor_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


@pytest.mark.parametrize("name", TESTED)
def test_a_single_op_variant_never_changes_what_the_compiled_model_computes(name):
    # bf16: Inductor's own GroupNorm rounds otherwise than eager's; plain torch.compile gives that noise scale
    out = sweep_case(name, plain="bf16" in name)
    assert not out.problems, "\n".join(out.problems)


@pytest.mark.parametrize("name", ["gn channels-last input", "gn channels-last, proven cl", "gn channels-last, dynamic"])
def test_a_kept_op_returns_the_strides_the_compiled_graph_was_promised(name):
    # PyTorch's CPU GroupNorm returns a channels-last output for a channels-last input; its meta kernel says
    # contiguous. Kept as a fallback for the cast, the op's call (a miss running PyTorch's kernel, or a hit) raised
    # "expected size 8==8, stride 1==16 at dim=1" in the compiled model, where eager and torch.compile run.
    out = sweep_case(name, plain=False)
    assert not out.problems, "\n".join(out.problems)
