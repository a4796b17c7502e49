"""Cards for template and cast tests, captured on the CPU and described as the same call on CUDA, or
read from the H200 capture shipped in docs/results/capture-h200."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engine.capture.recorder import CaptureMode
from engine.capture.signature import signature_text
from engine.cards import OperatorCard
from engine.propose.base import Hardware

CAPTURES = Path(__file__).resolve().parent.parent / "docs" / "results" / "capture-h200"

# A DGX Spark: 48 SMs, 99 KB of shared memory per block, sm_121 (a GPU unlike the H200 the templates
# were tuned on).
GB10 = Hardware(name="NVIDIA GB10", arch="sm_121", sms=48, l2_bytes=24 << 20, bandwidth_bps=2.73e11,
                max_shared_per_block=101376)


def cudaify(d: Any) -> Any:
    """A CPU-captured descriptor as the same tensor would be described on the GPU."""
    if isinstance(d, dict):
        return {k: ("cuda" if k == "device" else cudaify(v)) for k, v in d.items()}
    if isinstance(d, list):
        return [cudaify(x) for x in d]
    return d


def brief(op: str, signature: dict, outputs: list[dict], card_id: str = "test") -> OperatorCard:
    sig = cudaify(signature)
    return OperatorCard(card_id, op, sig, signature_text(sig), cudaify(outputs))


def captured(fn: Callable[[], Any], keep: Callable[[str], bool]) -> Any:
    """The one captured card (recorder object) of `fn` whose op `keep` accepts; CPU, no samples."""
    mode = CaptureMode(path_of=lambda: "m", weight_of=lambda p: 1, samples=0, sample_budget_bytes=0, sink=None,
                       use_cuda_events=False)
    with torch.no_grad(), mode:
        fn()
    cards = [c for c in mode.cards.values() if keep(c.op)]
    assert len(cards) == 1, [c.op for c in mode.cards.values()]
    return cards[0]


def h200_cards(keep: Callable[[str], bool]) -> list[OperatorCard]:
    """Every card of the shipped H200 captures whose op `keep` accepts."""
    out = []
    for f in sorted(CAPTURES.glob("*.json")):
        for c in json.loads(f.read_text())["cards"]:
            if keep(c["op"]):
                sig = {"op": c["op"], "args": c["args"], "aliases": c["aliases"]}
                out.append(OperatorCard(c["id"], c["op"], sig, c["signature"], c["outputs"]))
    return out


def covering(options: dict[str, set], first: list[str] = ()) -> list[str]:
    """`first`, then as few more keys of `options` as a greedy pick finds that between them hold every value any
    key holds (the key holding most values not yet held next; ties to the earlier key). A sampled compile test
    compiles these sources: every card, kernel and value of every template parameter at least once."""
    chosen = list(first)
    left = set().union(*options.values()) - set().union(*(options[k] for k in chosen))
    while left:
        best = max(options, key=lambda k: len(options[k] & left))
        chosen.append(best)
        left -= options[best]
    return chosen


def check_intent_directed_children(templates: list[Any], cards: list[OperatorCard]) -> int:
    """Asserts the builtin proposer's child of each card's default, asked for "vectorisation", changes only
    vector/unroll parameters (where one of them makes a different kernel), carries the intent's name as its
    intent and the plan's description under params["plan"]; returns how many cards had such a choice."""
    import asyncio

    from engine.propose.base import Attempt, Hardware, ProposalRequest
    from engine.propose.builtin.proposer import BuiltinProposer
    from engine.propose.builtin.template import INTENT_PARAMS

    focused = 0
    for card in cards:
        proposer = BuiltinProposer(templates)
        first = asyncio.run(proposer.propose(ProposalRequest(card, Hardware())))
        assert first.ok and "plan" not in first.params and first.intent  # no intent asked: the description
        template = proposer.template_for(card)[0]
        space, start = template.space(card), {k: v for k, v in first.params.items() if k != "template"}
        if not any(template.render(card, {**start, k: v}).source != first.source
                   for k in INTENT_PARAMS["vectorisation"] & set(space) for v in space[k]):
            continue  # no vector/unroll choice makes a different kernel here: the child may change anything
        parent = Attempt("p", first.source, first.spec, params=first.params)
        child = asyncio.run(proposer.propose(ProposalRequest(card, Hardware(), parent=parent, seed=3,
                                                             intent="vectorisation")))
        assert child.ok and child.intent == "vectorisation" and child.params["plan"], card.signature_text
        changed = {k for k in child.params if k not in ("template", "plan") and child.params[k] != first.params[k]}
        assert changed and changed <= INTENT_PARAMS["vectorisation"], (card.op, changed)
        focused += 1
    return focused


def capture_source(tmp_path: Path, name: str, source: str, *, dtype: str = "float32", samples: int = 1,
                   params: str = "") -> Any:
    """A user's model as a builder file `NAME.py` holding `source` (its `build`) and a config beside it, captured
    on the CPU into a fresh workspace: the CaptureResult (engine.capture.run.capture_model)."""
    from engine.capture.run import capture_model
    from engine.config import load_config

    (tmp_path / f"{name}.py").write_text(source)
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nbuilder = "{name}.py:build"\n' + (f"[params]\n{params}\n" if params else "")
                    + f'[dtype]\ncpu = "{dtype}"\ncuda = "{dtype}"\n[capture]\nsamples = {samples}\n')
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    return capture_model(load_config(path), torch.device("cpu"), ws)
