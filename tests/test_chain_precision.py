"""The precision check of chain cards (engine.verify.pipeline.CHAIN_PRECISION_FACTOR): the builtin chain
templates' own kernels, run on the CPU (tests/cuda_emulator.py), pass it on rows of 32 to 4096; an RMSNorm
computed in bfloat16 throughout (no float32 upcast), which the old 3x bound let through, does not."""

from __future__ import annotations

import cuda_emulator as emu
import pytest
import torch
from test_builtin_chains import BF, GemmaRMS, GroupNormSilu, HeadsNorm, LlamaRMS, _toy, chain_cards

from engine.capture.chains import CHAIN_OP
from engine.launch import parse_spec, resolve
from engine.launch.expr import Env
from engine.propose.base import Hardware
from engine.propose.builtin.chains import GroupNormSiluChainTemplate, RmsNormChainTemplate
from engine.verify.pipeline import (
    CHAIN_PRECISION_FACTOR,
    PRECISION_FACTOR,
    PRECISION_FAMILIES,
    CardCheck,
    card_check,
)

SIZES = (32, 512, 4096)
SEEDS = (0, 1, 2)


def _samples(card, seeds=SEEDS):
    """Random input sets for a chain card: unit-normal activations, its own weight's scale for the rest, each
    in its signature's layout (a permuted view stays one)."""
    out = []
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        args = []
        for i, a in enumerate(card.signature["args"]):
            extent = sum((n - 1) * s for n, s in zip(a["shape"], a["stride"])) + 1
            base = (torch.randn(extent, generator=g) * (1.0 if i == 0 else 0.1) + (0.0 if i == 0 else 1.0))
            args.append((a["name"], base.to(getattr(torch, a["dtype"])).as_strided(a["shape"], a["stride"])))
        out.append(args)
    return out


def _cards():
    """(name, chain card, its template) for every RMSNorm variant at each row size, and GroupNorm + SiLU."""
    out = [("toy", chain_cards(_toy(), torch.randn(2, 5, 32, dtype=BF))[0], RmsNormChainTemplate())]
    for d in SIZES:
        out.append((f"gemma {d}", chain_cards(GemmaRMS(d), torch.randn(2, 5, d, dtype=BF))[0], RmsNormChainTemplate()))
        out.append((f"llama {d}", chain_cards(LlamaRMS(d), torch.randn(2, 5, d, dtype=BF))[0], RmsNormChainTemplate()))
    # SD3.5's q/k norm: a [B, H, S, D] permuted view in, eager's permuted layout out (stored through strides)
    out.append(("heads", chain_cards(HeadsNorm(4, 64), torch.randn(2, 6, 256, dtype=BF))[0], RmsNormChainTemplate()))
    out.append(("gn_silu", chain_cards(GroupNormSilu(), torch.randn(2, 8, 6, 6, dtype=BF))[0],
                GroupNormSiluChainTemplate()))
    return out


@pytest.fixture(scope="module")
def cards():
    return _cards()


def _cuda_group_norm_silu(bound):
    """Eager CUDA's GroupNorm + SiLU (tests/test_builtin_templates_norms.py's reference): mean and rstd
    rounded to the input dtype before y = x * a + b is formed from them, y rounded, then SiLU. The
    template follows it; eager on the CPU forms y from unrounded statistics, so it is no yardstick here."""
    (_, x), (_, w), (_, b) = bound
    n, c, groups = x.shape[0], x.shape[1], 4
    xd = x.double().reshape(n, groups, -1)
    mq = xd.mean(-1).to(x.dtype)
    rq = (1 / torch.sqrt(xd.var(-1, unbiased=False) + 1e-5)).to(x.dtype)
    a = rq.double()[:, :, None] * w.double().reshape(groups, -1)
    sh = -a * mq.double()[:, :, None] + b.double().reshape(groups, -1)
    y = (x.double().reshape(n, groups, c // groups, -1) * a[..., None] + sh[..., None]).reshape(x.shape).to(x.dtype)
    return [mq, rq, torch.nn.functional.silu(y.float()).to(x.dtype)]


def _emulated(cards, tmp_path, hw=None, params=None):
    """Each card's template kernel (defaults for `hw`, else the H200, updated by `params`), run on the CPU:
    a CardCheck candidate per card."""
    hw = hw or Hardware()
    prepared = []
    for name, card, t in cards:
        assert t.accepts(card) is None, f"{name}: {t.accepts(card)}"
        r = t.render(card, {**t.default(card, hw=hw), **(params or {})}, hw=hw)
        prepared.append((card, resolve(parse_spec(r.spec), Env.from_card(card.signature, card.outputs)), r.source))
    program = emu.build([(p[2], p[1]) for p in prepared], tmp_path)

    def candidate(k):
        card, res, _ = prepared[k]

        def kernel(bound, prefill):
            fill = float("nan") if prefill == "nan" else -1234.5
            run = emu.run(program, k, res, dict(bound), [emu.output_like(d, fill) for d in card.outputs], tmp_path)
            assert run.error is None, run.error
            return run.outputs
        return kernel
    return [candidate(k) for k in range(len(prepared))]


def test_the_builtin_chain_templates_pass_the_chain_precision_check(cards, tmp_path):
    # The templates compute in float32 and round where eager rounds: their error against the float64 chain
    # is eager's (a ratio of at most 1), on every row size, inside the chain factor.
    if not emu.available():
        pytest.skip("g++ is needed for the CUDA-on-CPU emulation")
    for (name, card, _), kernel in zip(cards, _emulated(cards, tmp_path)):
        check = _gn_silu_check(card) if name == "gn_silu" else \
            card_check(CHAIN_OP, card.signature, _samples(card), fresh=1, edges=False, race_reps=0)
        assert check.precision_factor == CHAIN_PRECISION_FACTOR and check.family in PRECISION_FAMILIES
        v = check.check(kernel)
        assert v.ok, f"{name}: {v.message}"


def _gn_silu_check(card) -> CardCheck:
    """The chain check of a GroupNorm + SiLU card against eager CUDA's arithmetic (_cuda_group_norm_silu)."""
    check = card_check(CHAIN_OP, card.signature, _samples(card), fresh=1, edges=False, race_reps=0)
    return CardCheck(CHAIN_OP, _samples(card), _cuda_group_norm_silu, fresh=1, edges=False, race_reps=0,
                     family=check.family, reference64=check.reference64, precision_factor=CHAIN_PRECISION_FACTOR)


@pytest.mark.parametrize("fn", ["fast", "precise"])
def test_the_group_norm_silu_stream_kernel_passes_it_too(tmp_path, fn):
    # The one-launch stream kernel (tensors of more than half the L2: here a GPU with a 128 KB L2, and 80 KB
    # groups in three tiles) with SiLU in its apply step, under the same check as the default kernels: with
    # eager's formula and with the hardware exponential and division (emulated as the hardware rounds them).
    if not emu.available():
        pytest.skip("g++ is needed for the CUDA-on-CPU emulation")
    card = chain_cards(GroupNormSilu(), torch.randn(1, 8, 128, 160, dtype=BF))[0]
    t, hw = GroupNormSiluChainTemplate(), Hardware(l2_bytes=128 * 1024, clusters=False)
    params = {**t.default(card, hw=hw), "math": fn}
    assert params["strategy"] == "stream"
    source = t.render(card, params, hw=hw).source
    assert "gn_stream" in source and ("kf_silu_fast(g_)" in source) == (fn == "fast")
    from engine.compile import compile_nvrtc

    for arch in ("sm_90", "sm_121"):  # the H200, the DGX Spark
        res = compile_nvrtc(source, arch=arch)
        assert res.ok and not res.warnings, (arch, res.summary())
    (kernel,) = _emulated([("gn_silu stream", card, t)], tmp_path, hw=hw, params={"math": fn})
    v = _gn_silu_check(card).check(kernel)
    assert v.ok, v.message


def _rms_in_bf16(card, eps: float):
    """x * (1 + w) RMSNorm with no upcast: squares, their tree sum, rsqrt and the products all in bf16."""
    def run(bound, prefill):
        x, w = bound[0][1], bound[1][1]
        acc = x * x
        while acc.shape[-1] > 1:
            acc = acc[..., 0::2] + acc[..., 1::2]
        return [(x * torch.rsqrt(acc / x.shape[-1] + eps) * (1 + w)).reshape(card.outputs[0]["shape"])]
    return run


@pytest.mark.parametrize("d", SIZES)
def test_a_chain_kernel_computing_in_bf16_fails_the_chain_precision_check(cards, d, monkeypatch):
    # Eager's chain (Gemma's RMSNorm) upcasts and rounds once; bf16 arithmetic errs 1.6-3x that against the
    # float64 chain, within the bf16 tolerance itself: only the precision check can tell, and its old 3x
    # bound passed it on most draws. The chain factor fails it on every one. (Its errors also lean one way,
    # which the rounding-bias check after the precision check catches now: the old factor is tried without it.)
    (card,) = [card for name, card, _ in cards if name == f"gemma {d}"]
    cheat = _rms_in_bf16(card, 1e-6)
    passed_before = 0
    for sample in _samples(card):
        v = card_check(CHAIN_OP, card.signature, [sample], fresh=0, edges=False, race_reps=0).check(cheat)
        assert not v.ok and "float64 reference" in v.message, v.message
        assert v.details["precision"]["factor"] == CHAIN_PRECISION_FACTOR
        with monkeypatch.context() as m:
            m.setattr("engine.verify.pipeline.rounding_bias", lambda a, e: None)
            passed_before += card_check(CHAIN_OP, card.signature, [sample], fresh=0, edges=False, race_reps=0,
                                        precision_factor=PRECISION_FACTOR).check(cheat).ok
    assert passed_before, "the old factor caught it on every draw here: this test no longer shows the hole"


@pytest.mark.parametrize("fn", ["fast", "precise"])
def test_the_glu_chains_pass_it_with_fast_and_precise_math(tmp_path, fn):
    # SwiGLU and tanh-GeGLU (Gemma's MLP) with the hardware exponential and division (emulated as the hardware
    # rounds them) or eager's formulas: both within the chain check against the float64 chain. The fast form is
    # tried first; an erf-GELU has none (no fast erf), so its space has no `math`.
    if not emu.available():
        pytest.skip("g++ is needed for the CUDA-on-CPU emulation")
    from test_builtin_chains import GatedMLP

    from engine.propose.builtin.chains import GluChainTemplate

    t = GluChainTemplate()
    x = torch.randn(2, 5, 256, dtype=BF)
    cards = [("swiglu", chain_cards(GatedMLP(256, torch.nn.functional.silu), x)[0], t),
             ("geglu", chain_cards(GatedMLP(256, lambda v: torch.nn.functional.gelu(v, approximate="tanh")), x)[0], t)]
    erf = chain_cards(GatedMLP(256, torch.nn.functional.gelu), x)[0]
    assert "math" not in t.space(erf)
    # An fp32 GLU is held to fp32 tolerances: eager's formulas first there.
    import dataclasses
    import json

    def widened(d):
        return json.loads(json.dumps(d).replace('"bfloat16"', '"float32"'))

    bf = cards[0][1]
    fp32 = dataclasses.replace(bf, signature=widened(bf.signature), outputs=widened(bf.outputs))
    assert t.space(fp32)["math"] == ["precise", "fast"]
    for name, card, _ in cards:
        assert t.space(card)["math"] == ["fast", "precise"] and t.default(card)["math"] == "fast", name
        src = t.render(card, {**t.default(card), "math": fn}).source
        assert ("__expf" in src) == (fn == "fast"), name
    for (name, card, _), kernel in zip(cards, _emulated(cards, tmp_path, params={"math": fn})):
        check = card_check(CHAIN_OP, card.signature, _samples(card), fresh=1, edges=False, race_reps=0)
        v = check.check(kernel)
        assert v.ok, f"{name} ({fn}): {v.message}"
