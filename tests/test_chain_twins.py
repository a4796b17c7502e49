"""Channels-last twins of GroupNorm -> SiLU chain cards (engine.capture.twins, TWIN_CHAINS), on the CPU.

Under torch.compile a VAE block's GroupNorm after a convolution is handed the convolution's channels-last
output, and the convolution after its SiLU wants channels-last input. A chain card proven for eager's
contiguous layout gets a copy on the way in and one on the way out (18 a decode on the SD3.5 VAE,
2026-12-03d). Its twin is the same chain on the channels-last input, with the outputs its members' meta
kernels give: it shares its original's pattern (one registered op), its variant takes the input as held and
returns what the next convolution wants."""

from __future__ import annotations

import cuda_emulator as emu
import pytest
import torch
import torch.nn.functional as F
from card_helpers import brief
from test_builtin_templates_norms import _ref_group_norm, emulate_and_compare
from test_cast_compile import CpuCast
from test_cast_layout_copies import _compiled_copies
from test_cast_pattern_cards import Counting, _GnSiluBlock
from test_chains import _heavy_ops, _patterns

from engine.capture.chains import CHAIN_OP, chain_output_strides, chain_signature, run_chain
from engine.capture.twins import channels_last_twins, twin_of, untwinned
from engine.cards import OperatorCard
from engine.launch import parse_spec, resolve
from engine.launch.expr import Env
from engine.propose.base import Hardware
from engine.propose.builtin.chains import GroupNormSiluChainTemplate

CL = torch.channels_last


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), _GnSiluBlock()).eval()


def _chain_sigs(model, x):
    """The GroupNorm -> SiLU chain's signature, and another chain of the same forward if there is one."""
    _, pats = _patterns(model, x)
    gn = [chain_signature(p.instances[0]) for p in pats if _heavy_ops(p)[:2] == ["native_group_norm", "silu"]]
    return gn[0]


def _meta_gn_strides(x):
    """The strides the meta kernel of native_group_norm gives its output for `x` channels-last."""
    from engine.ops import meta_output_strides

    xc = x.contiguous(memory_format=CL)
    bound = [("input", xc), ("weight", None), ("bias", None), ("N", x.shape[0]), ("C", x.shape[1]),
             ("HxW", x.shape[2] * x.shape[3]), ("group", 4), ("eps", 1e-5)]
    return meta_output_strides(torch.ops.aten.native_group_norm.default, bound)[0]


def _card(sig, outputs=()):
    return OperatorCard("orig", CHAIN_OP, sig, "chain", list(outputs), samples=1)


def test_a_group_norm_silu_chain_gets_a_twin_and_other_chains_none():
    x = torch.randn(2, 8, 4, 4)
    sig = _chain_sigs(_model(), x)
    twin = twin_of(_card(sig))
    assert twin is not None and twin.signature["twin_of"] == "orig"
    assert twin.signature_text == "chain[native_group_norm silu] in0 f32[2,8,4,4](s=128,1,32,8) in1 f32[8] in2 f32[8]"
    a0 = twin.signature["args"][0]
    assert a0["stride"] == [128, 1, 32, 8]                      # channels-last [2, 8, 4, 4]
    assert untwinned(twin.signature) == sig                     # what the compiled graph traced
    assert twin.signature["chain"] == sig["chain"] and twin.signature["args"][1:] == sig["args"][1:]
    # Outputs as the members' meta kernels give them for the channels-last input (torch 2.11's CUDA GroupNorm:
    # channels-last; later releases: contiguous), shapes and dtypes as captured
    silu_out = twin.outputs[[list(o) for o in sig["chain"]["outputs"]].index([1, 0])]
    assert silu_out["shape"] == [2, 8, 4, 4] and silu_out["dtype"] == "float32"
    assert tuple(silu_out["stride"]) == _meta_gn_strides(x)
    assert twin_of(twin) is None                                # no twin of a twin
    # channels_last_twins over a capture's chain cards: one per GroupNorm -> SiLU card
    assert list(channels_last_twins([_card(sig)])) == ["orig"]
    # A chain of other ops (GroupNorm then a multiply) has no builtin channels-last kernel: no twin
    other = {**sig, "chain": {**sig["chain"], "nodes": [sig["chain"]["nodes"][0],
                                                       {**sig["chain"]["nodes"][1], "op": "aten::relu"}]}}
    assert twin_of(_card(other)) is None


def test_a_twins_eager_is_the_chain_on_a_contiguous_copy_laid_out_as_its_members_meta_kernels_say():
    """What compiled code gets from PyTorch for the held input (CUDA GroupNorm takes contiguous input only)."""
    torch.manual_seed(1)
    x = torch.randn(2, 8, 4, 4)
    sig = _chain_sigs(_model(), x)
    twin = twin_of(_card(sig))
    w, b = torch.randn(8), torch.randn(8)
    want = run_chain(sig, [x, w, b])
    xc = x.contiguous(memory_format=CL)
    got = run_chain(twin.signature, [xc, w, b])
    assert [tuple(t.stride()) for t in got] == chain_output_strides(twin.signature, [xc, w, b])
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)


def test_the_chain_template_serves_a_twin_with_the_channels_last_kernels(tmp_path):
    """GroupNorm -> SiLU on a channels-last input: group_norm_cl's kernels (flat and tiled apply), SiLU on the
    rounded normalised value, every output in the twin's layout, in the CPU emulation."""
    if not emu.available():
        pytest.skip("g++ is needed for the CUDA-on-CPU emulation")
    t = GroupNormSiluChainTemplate()
    model = _model().to(torch.bfloat16)
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(2, 8, 6, 6, generator=g) * 0.5 + 3.0).to(torch.bfloat16)
    sig = _chain_sigs(model, x)
    twin = twin_of(_card(sig))
    w = (torch.randn(8, generator=g) * 0.3 + 1).to(torch.bfloat16)
    b = (torch.randn(8, generator=g) * 0.2).to(torch.bfloat16)
    xc = x.contiguous(memory_format=CL)
    gn = sig["chain"]["nodes"][0]
    names = {a["name"]: a["tensor"][1] for a in gn["args"] if "tensor" in a}
    bound = {"in0": xc, f"in{names['weight']}": w, f"in{names['bias']}": b}
    y, mean, rstd = _ref_group_norm(xc, w, b, 4, 1e-5, torch.bfloat16)
    act = F.silu(y.float()).to(torch.bfloat16)
    where = [tuple(o) for o in sig["chain"]["outputs"]].index((1, 0))
    prepared = []
    # The SiLU output as the meta kernel gives it on torch 2.11 (channels-last: the flat apply) and later
    # (contiguous: tiles transposed on the way out)
    for out in (CL, torch.contiguous_format):
        outs = [dict(o) for o in twin.outputs]
        outs[where]["stride"] = list(torch.empty(2, 8, 6, 6).contiguous(memory_format=out).stride())
        card = brief(CHAIN_OP, twin.signature, outs)
        assert t.accepts(card) is None, t.accepts(card)
        space = t.space(card)
        assert "strategy" not in space and ("apply" in space) == (out == CL)
        results = {(0, 1): mean, (0, 2): rstd, (1, 0): act.contiguous(memory_format=out)}
        expected = [results[tuple(o)] for o in sig["chain"]["outputs"]]
        for extra in ({}, {"apply": "tile"} if out == CL else {"tile_p": 32}, {"math": "fast", "unroll": 4}):
            params = {**t.default(card, hw=Hardware()), **extra}
            r = t.render(card, params, hw=Hardware())
            assert ("gncl_apply_flat" in r.spec) == (params.get("apply") == "flat")
            res = resolve(parse_spec(r.spec), Env.from_card(card.signature, card.outputs))
            prepared.append((f"twin {out} {params}", card, bound, res, expected, r.source))
    failures = emulate_and_compare(prepared, tmp_path)   # also: each output has the card's strides
    assert not failures, "\n".join(failures)


def test_under_compile_a_twin_variant_takes_the_convolutions_output_as_held_and_returns_what_the_next_wants(
        tmp_path, monkeypatch):
    """conv -> GroupNorm -> SiLU -> conv, compiled with Inductor's layout optimization: with the chain's
    contiguous variant alone, its input is copied in and its output copied back (1 and 1); with the twin's
    variant too, both share one pattern op, the twin's is passed the convolution's output as held and hit,
    and its output is copied only where the meta kernel gives another layout than the next conv wants."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model = _model()
    x = torch.randn(2, 8, 4, 4)
    sig = _chain_sigs(model, x)
    twin = twin_of(_card(sig))
    plan, twin_plan = Counting(sig), Counting(twin.signature)
    twin_plan.output_strides = tuple(tuple(o["stride"]) for o in twin.outputs)  # as a cast's manifest records
    rows = {}
    for label, cards in (("alone", [(sig, plan)]), ("with twin", [(sig, plan), (twin.signature, twin_plan)])):
        try:
            copies = _compiled_copies(model, x, CpuCast("none"), patterns=cards)
        finally:
            torch._dynamo.reset()
        (name, row), = copies.items()
        rows[label] = (name, row)
    name, alone = rows["alone"]
    twin_name, held = rows["with twin"]
    assert twin_name == name   # one registered op for the chain and its twin
    assert (alone["inputs_copied"], alone["outputs_copied"]) == (1, 1), alone
    # The output is what the meta kernel gives for the held input: channels-last on torch 2.11 (the H200), so
    # the next convolution takes it as it is; contiguous on later releases, and copied for it as before
    silu_cl = _meta_gn_strides(x) == tuple(x.contiguous(memory_format=CL).stride())
    assert (held["inputs_copied"], held["outputs_copied"], held.get("inputs_as_held")) == \
        (0, 0 if silu_cl else 1, 1), held
    assert (plan.calls, twin_plan.calls) == (1, 1)   # the first compile's call, then the twin's


NESTED = '''
import torch
from torch import nn

class Half(nn.Module):  # a VAE resnet's second half: conv -> GroupNorm -> SiLU -> conv
    def __init__(self):
        super().__init__()
        self.conv1, self.norm, self.conv2 = nn.Conv2d(8, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.conv2(torch.nn.functional.silu(self.norm(self.conv1(x))))

def build(device, dtype):
    torch.manual_seed(0)
    return nn.Sequential(Half(), Half()).to(device=device, dtype=dtype).eval(), \\
        (torch.randn(2, 8, 6, 6, device=device, dtype=dtype),)
'''


def test_a_capture_adds_the_chains_twin_sharing_its_samples(tmp_path):
    """Through the capture and the store: the GroupNorm -> SiLU chain card gets a twin among the chain cards,
    named in the capture's twins, stored with its original's sample files and loaded channels-last."""
    import asyncio

    from engine.capture.samples import load_sample
    from engine.capture.store import capture_and_store
    from engine.config import load_config
    from engine.store import Store, db_path

    (tmp_path / "nested.py").write_text(NESTED)
    config = tmp_path / "nested.toml"
    config.write_text('name = "nested"\nbuilder = "nested.py:build"\n[dtype]\ncpu = "float32"\ncuda = "bfloat16"\n'
                      "[capture]\nsamples = 2\nlayout_twins = true\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    result = capture_and_store(load_config(config), "cpu", ws, samples=2)
    gn_silu = [c for c in result.chains if [n["op"] for n in c.signature["chain"]["nodes"]]
               == ["aten::native_group_norm", "aten::silu"]]
    (orig,) = [c for c in gn_silu if c.card_id not in result.twins]
    (twin,) = [c for c in gn_silu if c.card_id in result.twins]
    assert result.twins[twin.card_id] == orig.card_id and twin.signature["twin_of"] == orig.card_id
    assert (twin.calls, twin.samples) == (orig.calls, orig.samples) and orig.samples >= 1
    assert "1 GroupNorm -> SiLU chain card(s)" in result.notes["channels-last twins"]

    async def paths():
        store = await Store.open(db_path(ws))
        async with store:
            return {cid: [r["path"] for r in await store.get_samples(result.capture_id, cid)]
                    for cid in (orig.card_id, twin.card_id)}

    got = asyncio.run(paths())
    assert got[twin.card_id] == got[orig.card_id]   # the same files
    x = dict(load_sample(ws / got[twin.card_id][0], signature=twin.signature).args)["in0"]
    assert x.is_contiguous(memory_format=CL) and not x.is_contiguous()


@pytest.mark.xdist_group("sd35_vae_dry_run")
def test_a_dry_run_of_the_sd35_vae_proposes_and_compiles_every_groupnorm_and_its_twins(sd35_vae_dry_run):
    """The SD3.5 VAE (small) with twins on, through `run --dry-run` on the CPU: every GroupNorm card, its
    channels-last twin, every GroupNorm -> SiLU chain card and its twin get kernels that compile for the H200.
    The run (conftest.sd35_vae_dry_run) has conv-bias folds on too, for test_conv_bias_fold_dry_run: their cards
    are left out here, and the rest are those of a run with twins alone."""
    import json

    code, out, err = sd35_vae_dry_run
    assert code == 0, err
    cards = [c for c in json.loads(out)["cards"] if not c.get("folded_from")
             and ("group_norm" in c["signature"] or c["op"] == "aten::native_group_norm")]
    served = [c for c in cards if c["stopped"] != "declined"]
    twins = [c for c in served if c.get("twin_of")]
    assert {c["op"] for c in twins} == {"aten::native_group_norm", "kforge::chain"}, [c["signature"] for c in twins]
    assert len(twins) >= 8, len(twins)
    failed = [(c["signature"], c["failures"]) for c in served if c["compiled"] < 1 or c["failures"]]
    assert not failed, failed


def test_a_twins_eager_asks_the_meta_kernels_once_per_layout(monkeypatch):
    """The lane times a twin's eager call after call: the fake run that gives its output strides is made once
    per layout, not on every call."""
    import engine.capture.chains as chains

    x = torch.randn(2, 8, 4, 4)
    sig = _chain_sigs(_model(), x)
    twin = twin_of(_card(sig))
    calls = []
    real = chains.chain_output_strides
    monkeypatch.setattr(chains, "chain_output_strides", lambda s, i: calls.append(1) or real(s, i))
    monkeypatch.setattr(chains, "_TWIN_STRIDES", {})
    xc, w, b = x.contiguous(memory_format=CL), torch.randn(8), torch.randn(8)
    first = run_chain(twin.signature, [xc, w, b])
    for _ in range(3):
        again = run_chain(twin.signature, [xc, w, b])
    assert len(calls) == 1
    assert [t.stride() for t in again] == [t.stride() for t in first]
