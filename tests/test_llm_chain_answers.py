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


def small_chain_card(name: str):
    """The same chain on fewer rows (row width unchanged): what the CPU emulation can run in seconds. Both
    answers take their row count from the launch spec, so they serve it unchanged."""
    from test_builtin_chains import BF, GemmaRMS, HeadsNorm, chain_cards

    torch.manual_seed(0)
    if name == "sd3_qk_norm":
        return chain_cards(HeadsNorm(24, 64), torch.randn(1, 8, 1536, dtype=BF))[0]
    return chain_cards(GemmaRMS(1536), torch.randn(1, 6, 1536, dtype=BF))[0]


@pytest.mark.parametrize("name", ["sd3_qk_norm", "gemma_rms"])
def test_the_answer_verifies_in_the_cpu_emulation_on_a_smaller_instance(name, tmp_path):
    # The kernel runs on the CPU (tests/cuda_emulator.py) through the chain card's own CardCheck: captured-style
    # samples, a fresh set and the edge sets (zeros, huge, tiny, NaN/inf), against eager and the float64 chain.
    import cuda_emulator as emu

    from engine.capture.chains import CHAIN_OP
    from engine.launch import parse_spec, resolve
    from engine.launch.expr import Env
    from engine.propose.answer import extract
    from engine.verify.pipeline import card_check

    if not emu.available():
        pytest.skip("g++ is needed for the CUDA-on-CPU emulation")
    card = small_chain_card(name)
    ex = extract(next(a for a in fixture()["answers"] if a["name"] == name)["answer"])
    res = resolve(parse_spec(ex.spec), Env.from_card(card.signature, card.outputs))
    program = emu.build([(ex.source, res)], tmp_path)

    def kernel(bound, prefill):
        fill = float("nan") if prefill == "nan" else -1234.5
        run = emu.run(program, 0, res, dict(bound), [emu.output_like(d, fill) for d in card.outputs], tmp_path)
        assert run.error is None, run.error
        return run.outputs

    from test_chain_precision import _samples

    v = card_check(CHAIN_OP, card.signature, _samples(card, seeds=(0, 1)), fresh=1, edges=True, race_reps=0).check(kernel)
    assert v.ok, v.message
