"""LLM-style answers for chain cards (tests/fixtures/llm_chain_answers.json: written by an AI assistant
acting as the model from the rendered prompt alone, labelled so there). On the CPU: the prompt the fixture
answered is still the one rendered for its card, and each answer extracts, compiles with NVRTC for sm_90 and
its launch spec resolves against the card. On the GPU (test_llm_chain_answers_gpu.py): verified and timed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

FIXTURE = Path(__file__).parent / "fixtures" / "llm_chain_answers.json"


def fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def chain_card(name: str, device: str = "cpu"):
    """The chain card an answer was written for (traced on the CPU, described for the GPU)."""
    from test_builtin_chains import BF, GemmaRMS, HeadsNorm, chain_cards

    torch.manual_seed(0)
    if name == "sd3_qk_norm":
        return chain_cards(HeadsNorm(24, 64), torch.randn(2, 4096, 1536, dtype=BF))[0]
    if name == "gemma_rms":
        return chain_cards(GemmaRMS(1536), torch.randn(1, 2048, 1536, dtype=BF))[0]
    raise KeyError(name)


def rendered_prompt(card) -> str:
    from engine.propose.base import Hardware, ProposalRequest
    from engine.propose.prompting import build_messages

    system, msgs = build_messages(ProposalRequest(card, Hardware()))
    return "SYSTEM:\n" + system + "\n\n" + "\n\n".join(f"{m.role.upper()}:\n{m.content}" for m in msgs)


@pytest.mark.parametrize("name", ["sd3_qk_norm", "gemma_rms"])
def test_the_answer_extracts_compiles_and_its_spec_resolves(name):
    from engine.compile.nvrtc import compile_nvrtc
    from engine.launch import parse_spec, resolve
    from engine.launch.expr import Env
    from engine.propose.answer import extract, kernel_names

    entry = next(a for a in fixture()["answers"] if a["name"] == name)
    assert "acting as the model" in fixture()["label"]
    card = chain_card(name)
    # The answer was written for this prompt: if the prompt changes, record the answer again.
    assert hashlib.sha256(rendered_prompt(card).encode()).hexdigest() == entry["prompt_sha256"]
    ex = extract(entry["answer"])
    assert ex.ok, (ex.category, ex.reason)
    compile_nvrtc(ex.source, arch="sm_90")  # raises on a compile error
    (launch,) = resolve(parse_spec(ex.spec), Env.from_card(card.signature, card.outputs)).launches
    assert launch.kernel in kernel_names(ex.source)[0]
