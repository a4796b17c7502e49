"""CPU tests of the channels-last group_norm template (engine/propose/builtin/group_norm_cl.py).

Cards are captured on CPU tensors in channels-last layout. CUDA eager returns contiguous output for them
(it copies the input first), the CPU channels-last, and the template writes whichever layout the card
records. Every instance renders and resolves, the default and seeded mutations compile with NVRTC for sm_90,
and instances RUN on the CPU (tests/cuda_emulator.py) against float64 references of eager CUDA's arithmetic,
under the lane's own tolerance."""

from __future__ import annotations

import itertools
import random

import cuda_emulator as emu
import pytest
import torch
import torch.nn.functional as F
from card_helpers import brief, captured
from test_builtin_templates_norms import _compile_all, _ref_group_norm, emulate_and_compare, group_norm_card

from engine.capture.signature import bind_arguments, describe_tensor
from engine.launch import parse_spec, resolve
from engine.launch.expr import Env
from engine.propose.base import Hardware
from engine.propose.builtin.group_norm_cl import TEMPLATES, channels_last
from engine.propose.builtin.proposer import BuiltinProposer

T = TEMPLATES[0]
CL = torch.channels_last


def cl_card(shape, groups, dtype, *, out="contiguous", affine=True, x=None, w=None, b=None):
    """A group_norm card on a channels-last input; output 0 as CUDA eager gives it (contiguous) or as the
    CPU does (`out="channels_last"`)."""
    x = torch.randn(shape, dtype=dtype) if x is None else x
    x = x.contiguous(memory_format=CL)
    if affine and w is None:
        w = b = torch.ones(shape[1], dtype=dtype)
    c = captured(lambda: F.group_norm(x, groups, w, b, 1e-6), lambda op: "norm" in op)
    outs = list(c.outputs)
    assert channels_last(outs[0]["shape"], outs[0]["stride"])  # the CPU's
    if out == "contiguous":
        outs[0] = describe_tensor(torch.empty(shape, dtype=dtype))
    return brief(c.op, c.signature, outs)


def test_each_layout_goes_to_its_template():
    proposer = BuiltinProposer()
    for dtype in (torch.bfloat16, torch.float32):
        card = cl_card([2, 64, 8, 8], 32, dtype)
        assert proposer.template_for(card)[0].name == "group_norm_cl"
        assert "not contiguous" in (proposer.templates[[t.name for t in proposer.templates].index("group_norm")]
                                    .accepts(card) or "")
        plain = group_norm_card([2, 64, 8, 8], 32, dtype)
        assert proposer.template_for(plain)[0].name == "group_norm"
        assert T.accepts(plain) == "input is contiguous (the group_norm template's)"
    # Neither contiguous nor channels-last: [N, C, H, W] with H innermost
    x = torch.randn(1, 8, 4, 6).transpose(2, 3).contiguous().transpose(2, 3)
    odd = captured(lambda: F.group_norm(x, 2), lambda op: "norm" in op)
    card = brief(odd.op, odd.signature, odd.outputs)
    assert T.accepts(card).startswith("input is not channels-last")
    assert BuiltinProposer().template_for(card)[0] is None


@pytest.mark.parametrize("out", ["contiguous", "channels_last"])
def test_every_instance_renders_and_resolves(out):
    n, kinds = 0, set()
    for dtype, shape, groups in ((torch.bfloat16, [1, 128, 16, 16], 32), (torch.float16, [2, 64, 6, 10], 8),
                                 (torch.float32, [1, 6, 5, 5], 2)):
        card = cl_card(shape, groups, dtype, out=out)
        assert T.accepts(card) is None, T.accepts(card)
        space = T.space(card)
        # Resolved once per distinct spec (a pure function of its text and the card): the 16560 instances'
        # sources share ~1900 specs, and parsing each instance's again took 30 of 52 s (21 s on CI)
        resolved = {}
        for values in itertools.product(*space.values()):
            r = T.render(card, dict(zip(space, values)))
            if r.spec not in resolved:
                resolved[r.spec] = resolve(parse_spec(r.spec), Env.from_card(card.signature, card.outputs))
            res = resolved[r.spec]
            flat = r.params.get("apply") == "flat"
            assert [ln.kernel for ln in res.launches] == ["gncl_stats", "gncl_apply_flat" if flat else "gncl_apply"]
            assert "apply" not in space or out == "channels_last"   # flat: channels-last output only
            kinds.add(r.params.get("apply", "tile"))
            assert res.workspaces[1][2] is True  # the counter is zeroed before every launch
            n += 1
    assert n > 100
    assert kinds == ({"flat", "tile"} if out == "channels_last" else {"tile"})


def test_the_default_and_mutations_compile_with_nvrtc_for_sm_90():
    jobs = {}
    for i, (dtype, out) in enumerate(itertools.product((torch.bfloat16, torch.float16, torch.float32),
                                                       ("contiguous", "channels_last"))):
        card = cl_card([2, 128, 32, 32], 32, dtype, out=out, affine=i % 2 == 0)
        rng, params = random.Random(i), T.default(card)
        for _ in range(4):
            apply = "gncl_apply_flat" if params.get("apply") == "flat" else "gncl_apply"
            jobs[T.render(card, params).source] = ((dtype, out, dict(params)), {"gncl_stats", apply})
            params = T.mutate(card, params, rng)
        swept = {**T.default(card), "order": "sweep"}        # the sweep order, each apply, compiles too
        for apply in ("tile", "flat") if out == "channels_last" else ("tile",):
            p = {**swept, "apply": apply} if out == "channels_last" else swept
            kernel = "gncl_apply_flat" if apply == "flat" else "gncl_apply"
            jobs[T.render(card, p).source] = ((dtype, out, p), {"gncl_stats", kernel})
    _compile_all(jobs)


def test_the_sd35_vae_card_gets_a_grid_that_fills_the_h200():
    """The VAE's largest GroupNorm as Inductor hands it over under torch.compile: [1, 128, 1024, 1024] bf16,
    channels-last, contiguous output. Statistics blocks ~4 per SM, every tile in one grid."""
    card = cl_card([1, 128, 8, 8], 32, torch.bfloat16)
    big = dict(card.signature)
    big["args"] = [dict(a) for a in card.signature["args"]]
    x = big["args"][0]
    x["shape"], x["stride"] = [1, 128, 1024, 1024], [128 * 1024 * 1024, 1, 128 * 1024, 128]
    for a in big["args"]:
        if a["name"] == "HxW":
            a["value"] = 1024 * 1024
    outs = [describe_tensor(torch.empty(0, dtype=torch.bfloat16).new_empty((1, 128, 1024, 1024), device="meta")),
            *card.outputs[1:]]
    outs[0] = {**outs[0], "device": "cuda"}
    vae = brief(card.op, big, outs)
    assert T.accepts(vae) is None, T.accepts(vae)
    res = resolve(parse_spec(T.render(vae, T.default(vae)).spec), Env.from_card(vae.signature, vae.outputs))
    stats, apply = res.launches
    assert 4 * 132 <= stats.grid[0] <= 8 * 132
    assert apply.grid[0] == (1024 * 1024 // 64) * (128 // 64)


def _case(shape, groups, dtype, params, *, out="contiguous", affine=True):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 0.5 + 3.0).to(dtype).contiguous(memory_format=CL)
    c = shape[1]
    w = (torch.randn(c, generator=g) * 0.3 + 1).to(dtype) if affine else None
    b = (torch.randn(c, generator=g) * 0.2).to(dtype) if affine else None
    card = cl_card(shape, groups, dtype, out=out, affine=affine, x=x, w=w, b=b)
    op = torch.ops.aten.native_group_norm.default
    hw = 1
    for s in shape[2:]:
        hw *= s
    bound = dict(bind_arguments(op, (x, w, b, shape[0], c, hw, groups, 1e-6), {}))
    y, mean, rstd = _ref_group_norm(x, w, b, groups, 1e-6, dtype)
    y = y.contiguous(memory_format=CL if out == "channels_last" else torch.contiguous_format)  # the card's layout
    return card, bound, params, [y, mean, rstd]


ONE_SM = Hardware(sms=1)   # the flat apply's blocks per image are 8 per SM: few enough to stride


def _cases():
    bf, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    return [
        # 4 channels per group, 8 per vector: two groups per vector (VG 2); two images; transposed tiles
        _case([2, 16, 6, 8], 4, bf, {"vec": 8, "block": 128, "blocks_per_image": 4, "tile_p": 32, "tile_c": 16}),
        # 16 channels per group, 4 per vector: four lanes per group (LPG 4); pixels not a multiple of the tile
        _case([1, 32, 10, 10], 2, f16, {"vec": 4, "block": 128, "blocks_per_image": 8, "tile_p": 64, "tile_c": 8,
                                        "unroll": 4}),
        # channels-last output (the CPU's layout), no affine, uneven chunks
        _case([1, 16, 7, 9], 4, bf, {"vec": 8, "block": 128, "blocks_per_image": 4,
                                     "tile_p": 32, "tile_c": 16}, out="channels_last", affine=False),
        # fp32, 3 channels per group: scalar vectors; one statistics block
        _case([1, 6, 5, 5], 2, f32, {"vec": 1, "block": 128, "blocks_per_image": 1, "tile_p": 32, "tile_c": 6}),
        # more statistics blocks than pixels per block row: blocks with empty chunks
        _case([1, 8, 4, 4], 2, f32, {"vec": 4, "block": 128, "blocks_per_image": 4, "tile_p": 32, "tile_c": 8}),
        # flat apply (channels-last output): two images, a last step with vectors past the end, 2 in flight
        _case([2, 16, 7, 9], 4, bf, {"vec": 8, "block": 128, "blocks_per_image": 4, "apply": "flat",
                                     "unroll": 2}, out="channels_last"),
        # flat apply, fp16, 4 lanes a group, no affine, 4 in flight
        _case([1, 32, 10, 10], 2, f16, {"vec": 4, "block": 128, "blocks_per_image": 8, "apply": "flat",
                                        "unroll": 4}, out="channels_last", affine=False),
        # flat apply, fp32, scalar vectors, 3 channels per group
        _case([1, 6, 5, 5], 2, f32, {"vec": 1, "block": 128, "blocks_per_image": 1, "apply": "flat"},
              out="channels_last"),
        # flat apply on one SM: 8 blocks per image, each striding over several steps (48 of 128 x 2 vectors)
        _case([1, 64, 48, 32], 32, bf, {"vec": 8, "block": 128, "blocks_per_image": 8, "apply": "flat",
                                        "unroll": 2, "hw": ONE_SM}, out="channels_last"),
        # 40 statistics blocks, 4 threads merging each group's partials: 10 each, 8 loads in flight, then 2
        _case([1, 64, 48, 32], 32, bf, {"vec": 8, "block": 128, "blocks_per_image": 40, "apply": "flat"},
              out="channels_last"),
        # order "sweep": statistics strided through each image, apply from the tail. Transposed tiles, two images,
        # pixels not a multiple of the tile, more blocks than steps (blocks with nothing to read)
        _case([2, 16, 6, 8], 4, bf, {"vec": 8, "block": 128, "blocks_per_image": 4, "tile_p": 32, "tile_c": 16,
                                     "order": "sweep"}),
        _case([1, 32, 10, 10], 2, f16, {"vec": 4, "block": 128, "blocks_per_image": 8, "tile_p": 64, "tile_c": 8,
                                        "unroll": 4, "order": "sweep"}),
        # sweep, flat apply: each thread's vectors reversed keep one set of channels (LANES - 1 - its own);
        # fp32 scalar vectors (not FIXED: coefficients read per vector); several steps per block on one SM
        _case([2, 16, 7, 9], 4, bf, {"vec": 8, "block": 128, "blocks_per_image": 4, "apply": "flat",
                                     "unroll": 2, "order": "sweep"}, out="channels_last"),
        _case([1, 6, 5, 5], 2, f32, {"vec": 1, "block": 128, "blocks_per_image": 2, "apply": "flat",
                                     "order": "sweep"}, out="channels_last"),
        _case([1, 64, 48, 32], 32, bf, {"vec": 8, "block": 128, "blocks_per_image": 8, "apply": "flat",
                                        "unroll": 2, "hw": ONE_SM, "order": "sweep"}, out="channels_last"),
    ]


def test_kernels_run_correctly_in_the_cpu_emulation(tmp_path):
    if not emu.available():
        pytest.skip("g++ is needed for the CUDA-on-CPU emulation")
    prepared = []
    for card, bound, params, expected in _cases():
        assert T.accepts(card) is None, T.accepts(card)
        hw = params.pop("hw", Hardware())
        full = {**T.default(card, hw=hw), **params}
        r = T.render(card, full, hw=hw)
        if full.get("apply") == "flat":
            assert "gncl_apply_flat" in r.spec
        res = resolve(parse_spec(r.spec), Env.from_card(card.signature, card.outputs))
        prepared.append((f"{card.signature_text} {full}", card, bound, res, expected, r.source))
    failures = emulate_and_compare(prepared, tmp_path)  # also: each output has the card's strides
    assert not failures, "\n".join(failures)


def test_the_clone_group_norm_chain_runs_correctly_in_the_cpu_emulation(tmp_path):
    """F.group_norm on a channels-last CUDA tensor is a copy to contiguous, then the GroupNorm (then SiLU, in
    a VAE block): the chain card (chain_clone_group_norm) runs the channels-last kernels with no copy, the
    SiLU applied to the rounded normalised value, outputs in the chain's order, against float64 references
    of eager CUDA's arithmetic."""
    if not emu.available():
        pytest.skip("g++ is needed for the CUDA-on-CPU emulation")
    from test_builtin_chains import ChannelsLastGroupNorm, chain_cards

    from engine.propose.builtin.chains import CloneGroupNormChainTemplate

    t = CloneGroupNormChainTemplate()
    prepared = []
    for silu, math in ((False, None), (True, "precise"), (True, "fast")):
        card = chain_cards(ChannelsLastGroupNorm(silu), torch.randn(2, 8, 6, 6, dtype=torch.bfloat16))[0]
        gn = next(nd for nd in card.signature["chain"]["nodes"] if nd["op"] == "aten::native_group_norm")
        names = {a["name"]: a["tensor"][1] for a in gn["args"] if "tensor" in a}   # weight, bias -> in k
        g = torch.Generator().manual_seed(1)
        x = (torch.randn(2, 8, 6, 6, generator=g) * 0.5 + 3.0).to(torch.bfloat16).contiguous(memory_format=CL)
        w = (torch.randn(8, generator=g) * 0.3 + 1).to(torch.bfloat16)
        b = (torch.randn(8, generator=g) * 0.2).to(torch.bfloat16)
        bound = {"in0": x, f"in{names['weight']}": w, f"in{names['bias']}": b}
        y, mean, rstd = _ref_group_norm(x, w, b, 4, 1e-6, torch.bfloat16)
        y = y.contiguous()   # clone to contiguous, then GroupNorm: CUDA eager's output layout
        results = {(1, 0): y, (1, 1): mean, (1, 2): rstd, (2, 0): F.silu(y.float()).to(torch.bfloat16)}
        expected = [results[tuple(o)] for o in card.signature["chain"]["outputs"]]
        params = {**t.default(card), **({"math": math} if math else {})}
        r = t.render(card, params, hw=Hardware())
        res = resolve(parse_spec(r.spec), Env.from_card(card.signature, card.outputs))
        label = f"{[nd['op'] for nd in card.signature['chain']['nodes']]} {params}"
        prepared.append((label, brief("aten::native_group_norm", card.signature, card.outputs), bound, res,
                         expected, r.source))
    failures = emulate_and_compare(prepared, tmp_path)
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------ the input bias: a convolution's bias folded in


class BiasGroupNormSilu(torch.nn.Module):
    """What Inductor leaves of a convolution with a bias before a GroupNorm and SiLU (the SD3.5 VAE's resnet
    blocks under torch.compile): the convolution without its bias, the bias added per channel, then the
    GroupNorm and SiLU; channels-last, as Inductor holds a convolution's output. `contiguous`: the same on
    a contiguous tensor (eager's layout)."""

    def __init__(self, c: int = 8, groups: int = 4, contiguous: bool = False):
        super().__init__()
        self.c1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b = torch.nn.Parameter(torch.randn(1, c, 1, 1))
        self.norm, self.c2, self.groups = torch.nn.GroupNorm(groups, c), torch.nn.Conv2d(c, c, 3, padding=1), groups
        self.contiguous = contiguous

    def forward(self, x):
        h = self.c1(x.contiguous() if self.contiguous else x.contiguous(memory_format=CL))
        return self.c2(F.silu(F.group_norm(h + self.b, self.groups, self.norm.weight, self.norm.bias, 1e-6)))


class GroupNormSilu(BiasGroupNormSilu):
    """The same block with the bias already added: the plain GroupNorm -> SiLU chain."""

    def forward(self, x):
        h = self.c1(x.contiguous() if self.contiguous else x.contiguous(memory_format=CL))
        return self.c2(F.silu(F.group_norm(h, self.groups, self.norm.weight, self.norm.bias, 1e-6)))


def fold_card(shape=(2, 8, 6, 6), groups=4, contiguous=False):
    from test_builtin_chains import chain_cards

    model = BiasGroupNormSilu(shape[1], groups, contiguous)
    (card,) = [c for c in chain_cards(model, torch.randn(*shape, dtype=torch.bfloat16))
               if [n["op"] for n in c.signature["chain"]["nodes"]][-1] == "aten::silu"]
    return card


def test_a_channels_last_bias_add_group_norm_silu_chain_gets_the_folding_template():
    from engine.propose.builtin.chains import ConvBiasGroupNormSiluChainTemplate

    card = fold_card()
    assert [n["op"] for n in card.signature["chain"]["nodes"]] == \
        ["aten::add.Tensor", "aten::native_group_norm", "aten::silu"]
    assert BuiltinProposer().template_for(card)[0].name == "chain_bias_group_norm_silu"
    # eager's contiguous layout: the group_norm_cl kernels do not take it, so the card waits for its twin
    why = ConvBiasGroupNormSiluChainTemplate().accepts(fold_card(contiguous=True))
    assert why.startswith("group_norm_cl: input is contiguous") and "needs a channels-last input" in why
    # a plain GroupNorm -> SiLU chain is not this template's
    from test_builtin_chains import chain_cards

    plain = [c for c in chain_cards(GroupNormSilu(), torch.randn(2, 8, 6, 6, dtype=torch.bfloat16))
             if [n["op"] for n in c.signature["chain"]["nodes"]][-1] == "aten::silu"][0]
    assert ConvBiasGroupNormSiluChainTemplate().accepts(plain).startswith("members ['native_group_norm', 'silu']")


def test_cards_without_an_input_bias_render_no_trace_of_it():
    """The input bias's fragments are empty without one: every other group_norm_cl card renders the source it
    rendered before (checked over all 32,616 instances of four cards when the fragments were added)."""
    for out in ("contiguous", "channels_last"):
        card = cl_card([1, 128, 16, 16], 32, torch.bfloat16, out=out)
        space = T.space(card)
        assert "input_bias" not in space
        for apply in space.get("apply", ["tile"]):
            src = T.render(card, {**T.default(card), "apply": apply}).source
            assert not any(s in src for s in ("TIB", "ibr[", "ibs[", "ibk[", " ib,", "ib["))


def test_every_fold_instance_renders_and_resolves_with_the_bias_passed_to_both_launches():
    from engine.propose.builtin.chains import ConvBiasGroupNormSiluChainTemplate

    t = ConvBiasGroupNormSiluChainTemplate()
    card = fold_card((1, 64, 8, 8), 8)
    space, base = t.space(card), t.default(card)
    assert space["input_bias"] == ["stored", "fp32"] and set(space["apply"]) == {"flat", "tile"}
    keys = ("vec", "apply", "input_bias", "order", "math")
    seen = set()
    for values in itertools.product(*(space[k] for k in keys)):
        params = {**base, **dict(zip(keys, values))}
        r = t.render(card, params)
        res = resolve(parse_spec(r.spec), Env.from_card(card.signature, card.outputs))
        assert [ln.kernel for ln in res.launches] == \
            ["gncl_stats", "gncl_apply_flat" if params["apply"] == "flat" else "gncl_apply"]
        for launch in parse_spec(r.spec).launches:   # x, then the bias, in both
            assert [(a.ctype, a.text) for a in launch.args[:2]] == [("ptr", "in0"), ("ptr", "in1")], launch.args
        assert f"input bias ({params['input_bias']})" in r.intent
        seen.add((params["apply"], params["input_bias"]))
    assert len(seen) == 4


def test_the_fold_kernels_compile_with_nvrtc_for_sm_90():
    from engine.propose.builtin.chains import ConvBiasGroupNormSiluChainTemplate

    t = ConvBiasGroupNormSiluChainTemplate()
    jobs = {}
    for shape, groups in (((1, 128, 16, 16), 32), ((2, 64, 6, 10), 8)):
        card = fold_card(shape, groups)
        rng, params = random.Random(len(jobs)), t.default(card)
        for form, apply, order in itertools.product(("stored", "fp32"), ("flat", "tile"), ("chunks", "sweep")):
            p = {**params, "input_bias": form, "apply": apply, "order": order}
            jobs[t.render(card, p).source] = ((shape, p), {"gncl_stats", "gncl_apply_flat" if apply == "flat"
                                                           else "gncl_apply"})
        for _ in range(3):
            params = t.mutate(card, params, rng)
            apply = "gncl_apply_flat" if params.get("apply") == "flat" else "gncl_apply"
            jobs[t.render(card, params).source] = ((shape, params), {"gncl_stats", apply})
    _compile_all(jobs)


def _emulated(cases, tmp_path):
    """Each (source, resolved spec, card outputs, bound inputs) run once in the CUDA-on-CPU emulation: the
    outputs, or the crash as an AssertionError."""
    program = emu.build([(src, res) for src, res, _, _ in cases], tmp_path)
    out = []
    for k, (_, res, outs, bound) in enumerate(cases):
        r = emu.run(program, k, res, bound, [emu.output_like(d, float("nan")) for d in outs], tmp_path)
        assert r.error is None, r.error
        out.append(r.outputs)
    return out


def test_the_stored_input_bias_is_bit_for_bit_the_plain_chain_on_the_tensor_eager_stores(tmp_path):
    """GN(x + b) with x + b rounded to bf16 first ("stored") gives the very bits the plain GroupNorm -> SiLU
    kernels give on bf16(x + b), the tensor eager stores before its GroupNorm, on a mean far from zero and
    per-channel biases that move it (both apply passes, both orders); the fp32 form stays within the lane's
    tolerance of eager there."""
    if not emu.available():
        pytest.skip("g++ is needed for the CUDA-on-CPU emulation")
    from test_builtin_chains import chain_cards

    from engine.propose.builtin.chains import ConvBiasGroupNormSiluChainTemplate, GroupNormSiluChainTemplate
    from engine.verify.compare import compare_outputs
    from engine.verify.tolerance import tolerances_for

    fold, tf = fold_card((2, 16, 6, 6), 4), ConvBiasGroupNormSiluChainTemplate()
    plain = [c for c in chain_cards(GroupNormSilu(16, 4), torch.randn(2, 16, 6, 6, dtype=torch.bfloat16))
             if [n["op"] for n in c.signature["chain"]["nodes"]][-1] == "aten::silu"][0]
    tp = GroupNormSiluChainTemplate()
    assert tp.accepts(plain) is None, tp.accepts(plain)
    def names(card):   # the GroupNorm's tensor arguments -> the chain input each is
        gn = next(nd for nd in card.signature["chain"]["nodes"] if nd["op"] == "aten::native_group_norm")
        return {a["name"]: a["tensor"][1] for a in gn["args"] if "tensor" in a}

    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 16, 6, 6, generator=g) * 0.5 + 3.0).to(torch.bfloat16).contiguous(memory_format=CL)
    b = (torch.randn(1, 16, 1, 1, generator=g) * 2.0).to(torch.bfloat16)
    w = (torch.randn(16, generator=g) * 0.3 + 1).to(torch.bfloat16)
    bb = (torch.randn(16, generator=g) * 0.2).to(torch.bfloat16)
    stored = (x.float() + b.float()).to(torch.bfloat16)   # what eager's add stores (opmath fp32, one rounding)
    nf, npl = names(fold), names(plain)
    bound_fold = {"in0": x, "in1": b, f"in{nf['weight']}": w, f"in{nf['bias']}": bb}
    bound_plain = {"in0": stored, f"in{npl['weight']}": w, f"in{npl['bias']}": bb}
    cases, labels = [], []
    for apply, order, form in itertools.product(("flat", "tile"), ("chunks", "sweep"), ("stored", "fp32")):
        p = {**tf.default(fold), "apply": apply, "order": order, "input_bias": form, "math": "precise"}
        r = tf.render(fold, p)
        cases.append((r.source, resolve(parse_spec(r.spec), Env.from_card(fold.signature, fold.outputs)),
                      fold.outputs, bound_fold))
        labels.append(("fold", apply, order, form))
        if form == "stored":
            q = {k: v for k, v in p.items() if k != "input_bias"}
            r = tp.render(plain, q)
            cases.append((r.source, resolve(parse_spec(r.spec), Env.from_card(plain.signature, plain.outputs)),
                          plain.outputs, bound_plain))
            labels.append(("plain", apply, order, form))
    got = dict(zip(labels, _emulated(cases, tmp_path)))
    order = [tuple(o) for o in fold.signature["chain"]["outputs"]]
    # both list mean, rstd, silu(y) (the plain chain's members are one place earlier: it has no add)
    assert order == [(1, 1), (1, 2), (2, 0)] and [tuple(o) for o in plain.signature["chain"]["outputs"]] == \
        [(0, 1), (0, 2), (1, 0)]

    def expected(before_gn):   # float64 references of eager CUDA's arithmetic: mean, rstd, silu(y)
        y, mean, rstd = _ref_group_norm(before_gn, w, bb, 4, 1e-6, torch.bfloat16)
        return [mean, rstd, F.silu(y.float()).to(torch.bfloat16)]

    eager = expected(stored)
    exact = expected(x.float() + b.float())   # x + b not rounded (exact in fp32: two bf16 values)
    exact[2] = exact[2].to(torch.bfloat16)
    tolerance = tolerances_for(fold.op, eager)
    for (kind, apply, order_, form), outs in got.items():
        if kind != "fold":
            continue
        if form == "stored":
            for a, c in zip(outs, got[("plain", apply, order_, form)]):
                assert torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16 else a,
                                   c.view(torch.int16) if c.dtype == torch.bfloat16 else c), (apply, order_)
            assert all(m.ok for m in compare_outputs(outs, eager, tolerance)), (apply, order_)
        else:
            # GN(x + b) without the rounding: right against x + b itself, and out of the lane's tolerance of
            # eager's here, where |x + b| is ten times the spread (bf16 steps of 1/32 against a sigma of
            # 1/2): the check that decides per card which form a model may have bites
            assert all(m.ok for m in compare_outputs(outs, exact, tolerances_for(fold.op, exact))), (apply, order_)
            assert not all(m.ok for m in compare_outputs(outs, eager, tolerance)), (apply, order_)
