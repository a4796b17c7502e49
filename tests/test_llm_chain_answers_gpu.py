"""The fixture's chain-card answers (written by an AI assistant acting as the model; see
tests/test_llm_chain_answers.py) through a real lane on their cards at full size: SD3.5's q/k RMSNorm over a
permuted [B,H,S,D] view and Gemma's (1 + w) RMSNorm. Both are correct kernels as far as reading tells: the
lane must verify them (a rejection is a false one, or the answer is wrong: look before relabelling) and
time them against eager."""

from __future__ import annotations

import pytest
from test_llm_chain_answers import chain_card, fixture


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sd3_qk_norm", "gemma_rms"])
def test_an_llm_style_chain_answer_verifies_and_is_timed(tmp_path, name):
    from gpu_harness import evaluate_many

    from engine.capture.chain_cards import synthetic_chain_card
    from engine.propose.answer import extract

    card = chain_card(name)
    ref = synthetic_chain_card(tmp_path / "card", card.signature, 2)
    ex = extract(next(a for a in fixture()["answers"] if a["name"] == name)["answer"])
    (ev,) = evaluate_many([(ref, ex.source, ex.spec)], cache_dir=tmp_path / "compile", timing={"max_seconds": 1.0})
    tm = ev.payload.get("timing") or {}
    print(f"\n{name}: {ev.status} {ev.category or ''} {ev.message[:300]}; eager "
          f"{(tm.get('eager') or {}).get('median')} us, answer {(tm.get('candidate') or {}).get('median')} us")
    assert ev.status == "verified", f"{ev.category}: {ev.message}"
    assert tm["candidate"]["median"] > 0 and tm["eager"]["median"] > 0
