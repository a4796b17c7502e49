"""The adversarial suite: every cheat or fault is rejected with its category (or, for a cheat the
timing protocol defeats, gains nothing); correct kernels pass.

The compile-level and spec-level half runs everywhere (NVRTC for sm_90 and the launch-spec resolver
need no GPU; cards are captured on the meta device); the lane half needs the H200.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import torch
from adversarial_kernels import ADVERSARIES, CLASSES, KEEPS_STATE, NO_GAIN, Adversary, outcome_ok

from engine.compile import Compiler, compile_nvrtc
from engine.launch import Env, parse_spec, resolve
from engine.launch.spec import MAX_SHARED_BYTES


def _card_calls(device: str) -> dict[str, Callable[[], Any]]:
    """The one call each card kind captures (on `device`: 'cuda' for the lane, 'meta' for spec checks)."""

    def r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype)

    def index_add() -> torch.Tensor:
        index = torch.randint(0, 4096, (16384,), device=device)
        return torch.index_add(r(4096, 256), 0, index, r(16384, 256))

    return {
        "add": lambda: torch.add(r(1 << 22), r(1 << 22)),
        "sum": lambda: torch.sum(r(512, 4096), dim=1),
        "relu": lambda: torch.relu(r(1 << 22)),
        "softmax16": lambda: torch.softmax(r(2048, 4096, dtype=torch.float16), dim=-1),
        "index_add": index_add,
        "mm_bf16": lambda: torch.mm(r(2048, 16384, dtype=torch.bfloat16), r(16384, 2048, dtype=torch.bfloat16)),
        "cmul": lambda: torch.mul(r(1 << 22, dtype=torch.complex64), r(1 << 22, dtype=torch.complex64)),
        "var": lambda: torch.var(r(512, 4096), dim=1),
    }


CARD_OPS = {"add": "aten::add.Tensor", "sum": "aten::sum.dim_IntList", "relu": "aten::relu",
            "softmax16": "aten::_softmax", "index_add": "aten::index_add", "mm_bf16": "aten::mm",
            "cmul": "aten::mul.Tensor", "var": "aten::var.correction"}


def test_suite_is_large_enough():
    cheats = [a for a in ADVERSARIES if a.is_cheat]
    assert len(cheats) >= 30
    categories = set().union(*(a.accepted for a in cheats))
    # "suspicious" (below the physics floor) left the list in 2026-12-06g: the cheats that reached it kept a call
    # counter and are refused at compile now; the floor itself is tested in test_floor.py.
    assert categories >= {"nan", "mutation", "mismatch", "runtime-fault", "timeout", "launch",
                          "compile", "overrun", "cheating", "nondeterminism"}
    missing = [f"{k}: {what}" for k, what in CLASSES.items() if not any(a.cls == k for a in cheats)]
    assert not missing, "classes without a cheat:\n" + "\n".join(missing)
    # (The no-gain cheats, memos the timing protocol's fresh values defeat, kept their memo in module variables:
    # refused at compile since 2026-12-06g. NO_GAIN stays for a cheat that needs no state.)
    correct_cards = {a.card for a in ADVERSARIES if a.expect is None}
    assert correct_cards == set(CARD_OPS), "every card kind needs a correct kernel the lane must verify"
    names = [a.name for a in ADVERSARIES]
    assert len(set(names)) == len(names)


def test_no_gain_cheats_name_a_correct_kernel_on_their_card():
    by_name = {a.name: a for a in ADVERSARIES}
    for a in ADVERSARIES:
        if a.expect == NO_GAIN:
            honest = by_name.get(a.honest)
            assert honest is not None, f"{a.name}: no adversary named {a.honest!r}"
            assert honest.expect is None and honest.card == a.card, a.name
        else:
            assert a.honest is None, f"{a.name}: 'honest' only means something for {NO_GAIN}"


def test_outcome_rules():
    cheat = Adversary("c", ("suspicious", "cheating"), "", "")
    assert outcome_ok(cheat, "rejected", "cheating", None, None)
    assert not outcome_ok(cheat, "rejected", "mismatch", None, None)
    assert not outcome_ok(cheat, "verified", None, 1.0, 1.0)
    one = Adversary("o", "overrun", "", "")
    assert outcome_ok(one, "rejected", "overrun", None, None) and not outcome_ok(one, "rejected", "mutation", None, None)
    good = Adversary("g", None, "", "")
    assert outcome_ok(good, "verified", None, 0.9, None) and not outcome_ok(good, "rejected", "mismatch", None, None)
    no_gain = Adversary("n", NO_GAIN, "", "", honest="g")
    assert outcome_ok(no_gain, "rejected", "cheating", None, 1.0)
    assert outcome_ok(no_gain, "verified", None, 1.2, 1.0)       # within 1.25x the honest kernel
    assert not outcome_ok(no_gain, "verified", None, 1.3, 1.0)   # a gain: the cheat paid off
    assert not outcome_ok(no_gain, "verified", None, 1.0, None)  # nothing to compare with
    assert not outcome_ok(no_gain, "rejected", "internal", None, 1.0)  # the engine failed, not the cheat


@pytest.mark.parametrize("adv", ADVERSARIES, ids=[a.name for a in ADVERSARIES])
def test_every_kernel_compiles_for_sm90_unless_meant_not_to(adv):
    r = compile_nvrtc(adv.source, arch="sm_90")
    assert r.ok == (not adv.meant_not_to_compile), r.summary()
    if adv.name in KEEPS_STATE:   # refused for the state it keeps, by name, not for a syntax error
        assert [d for d in r.errors if d.code == "forbidden"], r.summary()
    elif not r.ok:
        assert r.diagnostics and r.diagnostics[0].line == 5


@pytest.fixture(scope="module")
def meta_cards(tmp_path_factory) -> dict[str, Any]:
    """Each card kind captured on the meta device: its op, signature and outputs, no data."""
    from engine.capture.single import capture_samples

    out = {}
    for kind, fn in _card_calls("meta").items():
        cards, _ = capture_samples(fn, tmp_path_factory.mktemp(kind), 0)
        assert len(cards) == 1, (kind, [c.op for c in cards])
        out[kind] = cards[0]
    return out


def test_cards_are_the_ops_the_kernels_are_written_for(meta_cards):
    assert {k: c.op for k, c in meta_cards.items()} == CARD_OPS
    assert meta_cards["index_add"].signature["args"][2]["dtype"] == "int64"


@pytest.mark.parametrize("adv", [a for a in ADVERSARIES if "launch" not in a.accepted and not a.meant_not_to_compile],
                         ids=[a.name for a in ADVERSARIES if "launch" not in a.accepted and not a.meant_not_to_compile])
def test_spec_resolves_for_its_card_and_names_compiled_kernels(adv, meta_cards):
    """A cheat meant to be caught by verification or timing must get past the launch spec first."""
    card = meta_cards[adv.card]
    resolved = resolve(parse_spec(adv.spec), Env.from_card(card.signature, card.outputs), max_shared=MAX_SHARED_BYTES)
    kernels = set(compile_nvrtc(adv.source, arch="sm_90").kernels)
    assert {ln.kernel for ln in resolved.launches} <= kernels


@pytest.mark.gpu
def test_lane_rejects_each_cheat_with_its_category(tmp_path):
    from gpu_harness import make_card

    from engine.lane.client import GpuLane, worker_argv
    from engine.lane.evaluate import evaluate

    torch.manual_seed(0)
    calls = _card_calls("cuda")
    cards = {kind: make_card(tmp_path / kind, calls[kind]) for kind in sorted({a.card for a in ADVERSARIES})}
    compiler = Compiler(tmp_path / "cache", "nvrtc", arch="sm_{}{}".format(*torch.cuda.get_device_capability()))

    async def run_all():
        lane = GpuLane(worker_argv(torch.cuda.current_device()), timeout_s=120)
        await lane.start()
        out = []
        try:
            for adv in ADVERSARIES:
                timeout = 8 if "timeout" in adv.accepted else None
                ev = await evaluate(lane, cards[adv.card], compiler.compile(adv.source), adv.spec,
                                    timeout_s=timeout, timing={"max_seconds": 1.0})
                out.append((adv, ev))
        finally:
            await lane.close()
        return out

    results = asyncio.run(run_all())
    speedups = {a.name: e.speedup for a, e in results if e.status == "verified"}
    lines, wrong = [], []
    for a, e in results:
        speed = f"{e.speedup:.2f}x" if e.speedup else "-"
        honest = f" (honest {speedups.get(a.honest) or 0:.2f}x)" if a.honest else ""
        ln = (f"[{a.cls}] {a.card}: {a.name}: expected {a.describe_expect()}, got {e.status}"
              f"{' ' + e.category if e.category else ''}, speedup {speed}{honest} [{e.seconds:.1f} s] {e.message[:160]}")
        lines.append(ln)
        if not outcome_ok(a, e.status, e.category, e.speedup, speedups.get(a.honest)):
            wrong.append(ln)
    print("\n".join(lines))
    assert not wrong, f"{len(wrong)} of {len(results)} adversaries got the wrong answer:\n" + "\n".join(wrong)
