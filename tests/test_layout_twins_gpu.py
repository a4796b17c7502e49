"""H200: channels-last twins through the user's path, under torch.compile.

A VAE resnet half (conv -> GroupNorm -> SiLU -> conv): Inductor runs the convolutions channels-last, so the
GroupNorm is handed a channels-last input. `run` captures the GroupNorm card and its channels-last twin
(engine.capture.twins, auto on a CUDA capture with a convolution), searches both (group_norm and
group_norm_cl templates), `export --target compile` packages them, and under `cast.compile` the twin's
variant gets the convolution's output as Inductor holds it: no layout copy (`inputs_as_held`), a hit per
forward, and the decode's output agrees with eager. Once with the convolution before the GroupNorm
biased, once without: on CUDA Inductor peels a bias off into a pointwise add and computes that straight into
the GroupNorm's layout, so nothing was held channels-last (the SD3.5 VAE, 2026-12-03d); now that add is computed
straight into the twin's channels-last layout (`inputs_computed_as_held`) and the convolution keeps no bias."""

import textwrap

import pytest
from test_run_gpu import _document, build_user_model, compiled_call, user_model

pytestmark = pytest.mark.gpu

MODEL_PY = textwrap.dedent('''
    import torch
    from torch import nn

    class Half(nn.Module):  # a VAE resnet's second half: conv1 -> norm2 -> SiLU -> conv2, plus the shortcut
        def __init__(self, c):
            super().__init__()
            self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=BIAS)
            self.norm = nn.GroupNorm(32, c, eps=1e-6)
            self.conv2 = nn.Conv2d(c, c, 3, padding=1)

        def forward(self, x):
            return x + self.conv2(torch.nn.functional.silu(self.norm(self.conv1(x))))

    def build(device, dtype):
        torch.manual_seed(0)
        model = nn.Sequential(Half(128), Half(128)).to(device=device, dtype=dtype).eval()
        with torch.no_grad():
            for h in model:
                h.conv1.weight.mul_(0.1)
                h.conv2.weight.mul_(0.1)
        return model, (torch.randn(1, 128, 256, 256, device=device, dtype=dtype),)
''')


@pytest.mark.parametrize(("bias", "kind"), [(False, "ops"), (True, "ops"), (True, "chains"), (True, "folds")])
def test_a_channels_last_twin_serves_the_groupnorm_after_a_convolution_under_compile(cli, capsys, tmp_path, bias,
                                                                                      kind):
    """`kind` "ops": the GroupNorm op variants are loaded; "chains": the GroupNorm -> SiLU chain variants,
    whose twin also writes the channels-last output the next convolution takes (torch 2.11's meta kernel);
    "folds": the chains with conv1's bias add in front (engine.capture.folds, `conv_bias_folds` "auto"), whose
    twin reads conv1's output as held and adds the bias itself: no pointwise pass computes it first."""
    import torch

    from engine.cast.format import CHAIN_OP, read_cast

    config = user_model(tmp_path, "conv_gn", MODEL_PY.replace("BIAS", str(bias)), samples=1,
                        capture='layout_twins = "auto"\n')
    ws = tmp_path / "ws"
    code, out, err = cli("run", config, "--no-tui", "--iterations", "10", "--json", "--no-compile-ref",
                         "--ops", "group_norm", "--workspace", ws)
    assert code == 0, err
    doc = _document(out, err, "run")
    gn = [c for c in doc["cards"] if c["op"] == "aten::native_group_norm"]
    twins = [c for c in gn if c.get("twin_of")]
    with capsys.disabled():
        print("\n" + "\n".join(f"{c['signature']}: {c['speedup_ci']}" for c in gn))
    assert twins, f"no channels-last twin among {[c['signature'] for c in gn]}"
    assert all(c["speedup_ci"] and c["speedup_ci"][0] > 1.0 for c in gn), gn

    cast_file = tmp_path / "twins.cast"
    code, out, err = cli("export", "--out", cast_file, "--workspace", ws, "--json", "--target", "compile",
                         "--no-model-check")
    assert code == 0, err
    variants = read_cast(cast_file).manifest["variants"]
    cl = [v for v in variants if v["signature"]["args"][0]["stride"][1] == 1 and v["op"] != CHAIN_OP]
    assert cl, [v["signature"]["args"][0]["stride"] for v in variants]

    import engine.cast
    from engine.cast import runtime

    model, (x,) = build_user_model(tmp_path, "conv_gn")
    torch._dynamo.reset()
    # The run finds the GroupNorm -> SiLU chain card and its twin too (--ops group_norm selects them): one kind
    # at a time is under test (a chain's pattern would take both sites from the op variants).
    ops = {v["id"] for v in variants if (v["op"] == CHAIN_OP) == (kind != "ops")
           and bool(v["signature"].get("folded_from")) == (kind == "folds")}
    assert ops, [(v["op"], v["signature"].get("folded_from")) for v in variants]
    cast = engine.cast.load(cast_file, any_target=True, only=ops)
    with torch.no_grad():
        eager = model(x)
        with cast.enabled(model):
            fast = cast.compile(model)
            got, st = compiled_call(cast, model, x, fast)
            # Declined inside the compiled graph (routes suspended): PyTorch's GroupNorm gets the held
            # channels-last input made contiguous first (C++ or Python router), instead of rejecting it
            with runtime.suspended():
                declined = fast(x)
        removed = fast(x)   # the cast removed: the graph runs eagerly
    if kind != "ops":
        (row,) = [r for k, r in st["layout_copies"].items() if k.startswith("kforge.chain_")]
        cl = [v for v in variants if v["id"] in ops and v["signature"].get("twin_of")]
        assert cl, [v["signature"]["args"][0]["stride"] for v in variants if v["id"] in ops]
        # the SiLU output in the layout the next convolution wants (channels-last): nothing copied back
        outs_cl = all(o["stride"][1] == 1 for o in cl[0]["outputs"] if len(o["shape"]) == 4)
        assert row.get("outputs_copied", 0) == (0 if outs_cl else 2), row
    else:
        row = st["layout_copies"].get("aten.native_group_norm.default", {})
    hits = {v["id"]: v["hits"] for v in st["variants"]}
    with capsys.disabled():
        print(f"layout copies {st['layout_copies']}, hits {hits}, router {[v.get('router') for v in st['variants']]}")
    assert row.get("inputs_as_held", 0) >= 2 and row.get("inputs_copied", 0) == 0, row  # both norms after a conv
    computed = 2 if bias and kind != "folds" else 0   # a fold reads conv1's output and adds the bias itself
    assert (row.get("biases_kept", 0), row.get("inputs_computed_as_held", 0)) == (0, computed), row
    if kind == "folds":
        assert st.get("folds_split", 0) >= 2 and st.get("folds_reverted", 0) <= st["folds_split"] - 2, st
    assert sum(hits[v["id"]] for v in cl) >= 2, hits
    for out in (got, declined, removed):
        torch.testing.assert_close(out, eager, atol=5e-2, rtol=2e-2)
