"""Every builtin template, rendered for each target GPU's profile, compiles with NVRTC for that arch and
offers only what the GPU has: no thread-block clusters where it has none, never more shared memory per
block than its limit, no Hopper/Blackwell-DC-only instructions on sm_12x.

A few instances per template and arch here; every instance under `-m slow`.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import re
import struct
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

import pytest
import torch
from test_builtin_templates_a import cards_for
from test_builtin_templates_norms import _cards_for as norm_cards_for
from test_builtin_templates_norms import group_norm_card

from engine.cards import OperatorCard
from engine.compile import compile_nvrtc
from engine.launch import parse_spec, resolve
from engine.launch.expr import Env
from engine.propose.base import Hardware, ProposalRequest
from engine.propose.builtin.proposer import BuiltinProposer, all_templates
from engine.propose.builtin.template import Template
from engine.propose.hardware_profiles import profile
from engine.propose.intents import INTENTS

# Each arch the templates must compile for, and the GPU whose figures it is rendered with.
TARGETS = {"sm_80": "a100", "sm_89": "l40s", "sm_90": "h200", "sm_100": "b200", "sm_121": "dgx-spark"}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SAMPLE = 2            # instances per template per arch in the fast test
ENUMERATE_MAX = 300   # larger spaces: a seeded walk of WALK mutations per card instead
WALK = 30
# Instructions a GPU without them cannot run (and that NVRTC would reject or mis-target for its arch).
NOT_ON_12X = re.compile(r"\b(wgmma|setmaxnreg|tcgen05|multicast::cluster|barrier\.cluster|mapa)\b")
CLUSTER = re.compile(r"__cluster_dims__|barrier\.cluster|\.reqnctapercluster|\.explicitcluster")


@cache
def _cards(dtypes: tuple[torch.dtype, ...] = DTYPES) -> tuple[OperatorCard, ...]:
    """Representative cards of every template and layout (small shapes), plus groups and rows large enough
    for the cluster strategies on GPUs that have them."""
    cards = [c for dt in dtypes for c in cards_for(dt)] + [c for dt in dtypes for _, c in norm_cards_for(dt)]
    cards += [group_norm_card([1, 512, 128, 128], 32, torch.bfloat16),   # 512 KB groups: cluster first on sm_90
              group_norm_card([1, 32, 128, 128], 8, torch.float16)]
    # channels-last input (group_norm_cl), both output layouts; a convolution's bias folded in (the fold chain)
    from test_builtin_group_norm_cl import cl_card, fold_card

    cards += [cl_card([2, 64, 16, 16], 32, torch.bfloat16), cl_card([1, 32, 8, 8], 8, torch.float32, out="channels_last")]
    cards += [fold_card()]   # chain_bias_group_norm_silu
    from test_builtin_chains import _cases  # the chain cards of every chain template (toy modules, traced)

    cards += list(_cases().values())
    from test_builtin_resample import _x, card_of  # nearest upsampling, NCHW and channels-last

    cards += [card_of(_x([1, 32, 8, 8], dt, fmt), scale_factor=2.0) for dt in dtypes
              for fmt in (torch.contiguous_format, torch.channels_last)]
    return tuple(cards)


def _template(card: OperatorCard, hw: Hardware) -> Template:
    template, why = BuiltinProposer().template_for(card, hw=hw)
    assert template is not None, why
    return template


def _instances(t: Template, card: OperatorCard, hw: Hardware, walk: int = WALK) -> list[dict[str, Any]]:
    """Every instance of a small space; the default and a seeded walk (as the search takes it) of a large one."""
    space = t.space(card, hw=hw)
    if t.instances(card, hw=hw) <= ENUMERATE_MAX:
        return [dict(zip(space, values)) for values in itertools.product(*space.values())]
    rng = random.Random(0)
    out = [t.default(card, hw=hw)]
    for _ in range(walk):
        out.append(t.mutate(card, out[-1], rng, rng.choice([None, *INTENTS]), hw=hw))
    return out


def _render(t: Template, card: OperatorCard, params: dict[str, Any], hw: Hardware) -> tuple[str, int]:
    """(source, the most dynamic shared memory one of its launches asks for), the spec resolved within the
    GPU's per-block limit, and the source checked for features the GPU lacks."""
    r = t.render(card, params, hw=hw)
    resolved = resolve(parse_spec(r.spec), Env.from_card(card.signature, card.outputs),
                       max_shared=hw.max_shared_per_block)
    if not hw.clusters:
        assert not CLUSTER.search(r.source), (t.name, params, hw.arch)
    if hw.capability >= (12, 0):
        assert not NOT_ON_12X.search(r.source), (t.name, params, hw.arch)
    return r.source, max((ln.shared for ln in resolved.launches), default=0)


@cache
def _jobs(arch: str, sample: int | None) -> dict[str, tuple[str, int]]:
    """{source: (template name, dynamic shared bytes)} for `arch`: `sample` instances per template (spread
    by digest), or every checked instance when `sample` is None."""
    hw = profile(TARGETS[arch])
    by_template: dict[str, dict[str, tuple[str, int]]] = {}
    for card in _cards():
        t = _template(card, hw)
        params = _instances(t, card, hw, walk=WALK if sample is None else 3)
        if sample is not None:
            params = params[:1] + params[1::max(1, len(params) // 4)]
        sources = by_template.setdefault(t.name, {})
        for p in params:
            src, shared = _render(t, card, p, hw)
            sources[src] = (t.name, max(shared, sources.get(src, ("", 0))[1]))
    assert set(by_template) == {t.name for t in all_templates()}, sorted(by_template)
    jobs: dict[str, tuple[str, int]] = {}
    for sources in by_template.values():
        ordered = sorted(sources, key=lambda s: hashlib.sha256(s.encode()).hexdigest())
        jobs.update({s: sources[s] for s in (ordered if sample is None else ordered[:sample])})
    return jobs


def _static_shared(cubin: bytes) -> dict[str, int]:
    """Static shared memory per kernel: the sizes of a cubin's `.nv.shared.<kernel>` ELF sections."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    entsize, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * entsize) for i in range(count)]
    names_at = headers[names_index][4]
    out = {}
    for name_at, *_, size, _, _, _, _ in headers:
        start = names_at + name_at
        name = cubin[start:cubin.index(b"\0", start)].decode()
        if name.startswith(".nv.shared.") and not name.startswith(".nv.shared.reserved"):
            out[name.removeprefix(".nv.shared.")] = size
    return out


def _compile_and_check(arch: str, jobs: dict[str, tuple[str, int]]) -> None:
    """Each source compiles for `arch`, targets it, and fits the GPU's shared memory per block (static +
    dynamic) and, where the GPU lacks them, uses no cluster or Hopper-only PTX."""
    hw = profile(TARGETS[arch])
    with ThreadPoolExecutor(min(8, os.cpu_count() or 2)) as pool:  # NVRTC releases the GIL
        results = list(pool.map(lambda s: compile_nvrtc(s, arch=arch), jobs))
    for (src, (name, dynamic)), res in zip(jobs.items(), results):
        assert res.ok, f"{name} for {arch}: {res.summary()}\n{src[-2000:]}"
        assert f".target {arch}" in res.ptx, (name, arch)
        static = max(_static_shared(res.cubin).values(), default=0)
        assert static <= 48 * 1024 and static + dynamic <= hw.max_shared_per_block, (name, arch, static, dynamic)
        if not hw.clusters:
            assert not CLUSTER.search(res.ptx), (name, arch)
        if hw.capability >= (12, 0):
            assert not NOT_ON_12X.search(res.ptx), (name, arch)


@pytest.mark.parametrize("arch", TARGETS)
def test_a_sample_of_every_template_compiles_for_each_arch(arch):
    jobs = _jobs(arch, SAMPLE)
    assert len(jobs) >= 2 * len(all_templates())
    _compile_and_check(arch, jobs)


@pytest.mark.sweep  # not in the default run (pyproject's addopts): python -m pytest -m sweep
@pytest.mark.parametrize("arch", TARGETS)
def test_every_template_instance_compiles_for_each_arch(arch):
    _compile_and_check(arch, _jobs(arch, None))


@pytest.mark.parametrize("arch", TARGETS)
def test_no_instance_offers_what_the_gpu_lacks(arch):
    """Every checked instance of every bfloat16 card (the strategies do not depend on the dtype), rendered
    for the arch's GPU (no compile): `_render` asserts the gating; the cluster strategies appear exactly
    where the GPU has clusters. Every dtype under `-m slow`, compiled."""
    hw = profile(TARGETS[arch])
    clusters = 0
    for card in _cards((torch.bfloat16,)):
        t = _template(card, hw)
        for p in _instances(t, card, hw):
            src, _ = _render(t, card, p, hw)
            clusters += "__cluster_dims__" in src
    assert (clusters > 0) == hw.clusters


def test_an_a100_is_offered_no_group_norm_cluster_kernel():
    card = group_norm_card([1, 512, 128, 128], 32, torch.bfloat16)
    t = _template(card, profile("h200"))
    assert "cluster" in t.space(card, hw=profile("h200"))["strategy"]  # what the A100 must not get
    a100 = profile("a100")
    space = t.space(card, hw=a100)
    assert "cluster" not in space["strategy"] and "cluster" not in space
    import asyncio

    got = asyncio.run(BuiltinProposer().propose(ProposalRequest(card, a100)))
    assert got.ok and "__cluster_dims__" not in got.source and "gn_cluster" not in got.spec


def test_dgx_spark_instances_fit_99_kb_and_compile_for_sm_121():
    hw = profile("dgx-spark")
    assert hw.arch == "sm_121" and hw.max_shared_per_block == 99 * 1024
    card = group_norm_card([1, 512, 128, 128], 32, torch.bfloat16)
    t = _template(card, hw)
    shared = [_render(t, card, p, hw)[1] for p in _instances(t, card, hw)]
    assert max(shared) <= 99 * 1024
    src, dynamic = _render(t, card, t.default(card, hw=hw), hw)
    _compile_and_check("sm_121", {src: (t.name, dynamic)})
