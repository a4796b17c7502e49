"""Builtin nearest-neighbour upsampling template (engine/propose/builtin/resample.py): which cards it takes,
that every index it computes is eager's, that its kernels compile with NVRTC for sm_90, and that they RUN on
the CPU (tests/cuda_emulator.py) to eager's output bit for bit, NCHW and channels-last. No timing here."""

from __future__ import annotations

import dataclasses

import cuda_emulator as emu
import pytest
import torch
import torch.nn.functional as F
from card_helpers import brief, captured
from test_builtin_templates_norms import _compile_all, emulate_and_compare

from engine.capture.signature import bind_arguments
from engine.launch import Env, parse_spec, resolve
from engine.propose.builtin.proposer import BuiltinProposer
from engine.propose.builtin.resample import TEMPLATES, source_index, source_scale

T = TEMPLATES[0]
OP = torch.ops.aten.upsample_nearest2d.default
CL = torch.channels_last


def card_of(x, **kw):
    c = captured(lambda: F.interpolate(x, mode="nearest", **kw), lambda o: o == "aten::upsample_nearest2d")
    return brief(c.op, c.signature, c.outputs)


def _x(shape, dtype, layout=torch.contiguous_format, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).contiguous(memory_format=layout)


def test_the_vaes_upsamples_are_taken_in_both_layouts_with_eagers_output_layout():
    for layout, strategy in ((torch.contiguous_format, "rows"), (CL, "channels")):
        card = card_of(_x([1, 512, 16, 16], torch.bfloat16, layout), scale_factor=2.0)
        assert T.accepts(card) is None, T.accepts(card)
        assert BuiltinProposer().template_for(card)[0] is T
        r = T.render(card, T.default(card))
        assert f"kf_upsample_nearest_{strategy}" in r.spec and r.params["vec"] == 8


@pytest.mark.parametrize("ins, outs, scale", [
    (16, 32, 2.0), (128, 256, 2.0), (3, 7, None), (5, 12, None), (7, 3, None), (10, 30, 3.0), (6, 9, 1.5),
    (1000, 3000, None), (9, 9, None)])
def test_every_source_index_is_eagers(ins, outs, scale):
    """The kernel's fp32 index formula, evaluated in Python as it is on the GPU, against eager's output: each
    output row of a ramp input holds its source index."""
    ramp = torch.arange(ins, dtype=torch.float32).view(1, 1, ins, 1)
    kw = {"scale_factor": (scale, 1.0)} if scale else {"size": (outs, 1)}
    got = F.interpolate(ramp, mode="nearest", **kw).flatten().long().tolist()
    s = source_scale(ins, len(got), scale)
    assert [source_index(o, s, ins) for o in range(len(got))] == got


def test_declines_what_it_does_not_compute():
    import dataclasses

    assert "dtype" in T.accepts(card_of(_x([1, 4, 4, 4], torch.float64), scale_factor=2.0))
    card = card_of(_x([1, 4, 4, 6], torch.float32), scale_factor=2.0)
    odd = dataclasses.replace(card, outputs=[{**card.outputs[0], "stride": [192, 12, 48, 1]}])   # N, H, C, W
    assert "neither row-major nor channels-last" in T.accepts(odd)


def _bound(x, size, sh, sw):
    return dict(bind_arguments(OP, (x, list(size), sh, sw), {}))


def _cases():
    bf, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    specs = [
        # (shape, dtype, layout, interpolate kwargs, params)
        ([1, 16, 5, 6], bf, torch.contiguous_format, {"scale_factor": 2.0}, {"vec": 4, "block": 128, "unroll": 2}),
        ([2, 3, 5, 6], f32, torch.contiguous_format, {"size": (7, 9)}, {"vec": 1, "block": 128, "unroll": 4}),
        ([1, 4, 4, 8], f16, torch.contiguous_format, {"scale_factor": 3.0}, {"vec": 8, "block": 128, "unroll": 1}),
        ([1, 16, 5, 6], bf, CL, {"scale_factor": 2.0}, {"vec": 8, "block": 128, "unroll": 2}),
        ([2, 24, 3, 5], f16, CL, {"size": (8, 11)}, {"vec": 4, "block": 128, "unroll": 1}),
        ([1, 6, 4, 4], f32, CL, {"scale_factor": 2.0}, {"vec": 2, "block": 256, "unroll": 4}),
    ]
    out = []
    for shape, dtype, layout, kw, params in specs:
        x = _x(shape, dtype, layout, seed=len(out))
        card = card_of(x, **kw)
        y = F.interpolate(x, mode="nearest", **kw)
        size = list(y.shape[2:])
        sh, sw = (kw["scale_factor"],) * 2 if "scale_factor" in kw else (None, None)
        assert [o["stride"] for o in card.outputs] == [list(y.stride())]   # eager's layout, as the card says
        out.append((card, _bound(x, size, sh, sw), params, [y]))
    return out


def test_kernels_run_to_eagers_output_in_the_cpu_emulation(tmp_path):
    if not emu.available():
        pytest.skip("g++ is needed for the CUDA-on-CPU emulation")
    prepared = []
    for card, bound, params, expected in _cases():
        assert T.accepts(card) is None, T.accepts(card)
        full = {**T.default(card), **params}
        r = T.render(card, full)
        assert r.params["vec"] == params["vec"]
        res = resolve(parse_spec(r.spec), Env.from_card(card.signature, card.outputs))
        prepared.append((f"{card.signature_text} {full}", card, bound, res, expected, r.source))
    failures = emulate_and_compare(prepared, tmp_path)   # also: each output in the card's strides
    assert not failures, "\n".join(failures)


def test_the_space_compiles_with_nvrtc_for_sm_90():
    jobs = {}
    for layout in (torch.contiguous_format, CL):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            card = card_of(_x([1, 64, 8, 8], dtype, layout), scale_factor=2.0)
            for vec in T.space(card)["vec"]:
                for unroll in (1, 4):
                    r = T.render(card, {**T.default(card), "vec": vec, "unroll": unroll})
                    jobs[r.source] = (f"{card.signature_text} vec {vec}", {r.spec.split('"')[1]})
    _compile_all(jobs)


def test_an_upsamplings_channels_last_twin_is_taken_in_channels_with_eagers_layout():
    """A layout route runs the VAE's Decoder channels-last, where eager's channels-last upsampling took 2.73 ms
    against 1.04 ms in NCHW (sd35_medium, H100 2026-12-06c): upsampling has channels-last twins now
    (engine.capture.twins.TWIN_OPS). The twin's outputs are channels-last as eager's are, the template takes it
    in its channels strategy, and its eager computes eager's values."""
    from engine.capture.twins import twin_of
    from engine.verify.pipeline import card_check

    x = _x([1, 64, 8, 8], torch.bfloat16)
    card = dataclasses.replace(card_of(x, scale_factor=2.0), samples=1, card_id="up")
    twin = twin_of(card)
    assert twin is not None and twin.signature["twin_of"] == "up"
    xcl = x.contiguous(memory_format=CL)
    y = OP(xcl, [16, 16], 2.0, 2.0)
    assert [o["stride"] for o in twin.outputs] == [list(y.stride())] and not y.is_contiguous()
    assert T.accepts(twin) is None and "kf_upsample_nearest_channels" in T.render(twin, T.default(twin)).spec
    bound = [("self", xcl), ("output_size", [16, 16]), ("scales_h", 2.0), ("scales_w", 2.0)]
    out = card_check("aten::upsample_nearest2d", twin.signature, [bound]).eager(bound)
    out = out[0] if isinstance(out, (list, tuple)) else out
    assert torch.equal(out, y) and out.stride() == y.stride()


def test_an_upsampling_of_a_tensor_channels_last_in_name_only_gets_a_true_channels_last_twin():
    """sd35_medium's first upsampling is handed bf16[1,512,128,128] at (512, 1, 65536, 512): channels-last but for
    the batch stride, which PyTorch reads as NCHW (eager returns NCHW). Under a layout route the call holds a true
    channels-last tensor; its twin covers that one, with eager's channels-last output."""
    from engine.capture.twins import twin_of
    from engine.ops import channels_last_by_strides

    x = _x([1, 64, 8, 8], torch.bfloat16, CL)
    odd = torch.empty_strided(x.shape, (64, 1, 512, 64), dtype=x.dtype).copy_(x)
    card = dataclasses.replace(card_of(odd, scale_factor=2.0), samples=1, card_id="odd")
    assert card.outputs[0]["stride"] == [16384, 256, 16, 1]         # eager: NCHW out for it
    twin = twin_of(card)
    assert twin is not None and twin.signature["args"][0]["stride"] == list(x.stride())
    assert channels_last_by_strides(x.shape, x.stride()) and twin.outputs[0]["stride"] == list(
        OP(x, [16, 16], 2.0, 2.0).stride())
    assert twin_of(dataclasses.replace(card_of(x, scale_factor=2.0), samples=1)) is None  # truly CL: none
