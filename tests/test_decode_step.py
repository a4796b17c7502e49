"""The reference LM builders' `decode = true` (engine/models/decode.py): the forward is one decoding step after
a prefill, repeatable (each call starts from a copy of the prefilled cache, made outside capture), and its
cards have decoding's shapes, which a prefill's cards never match, so a cast can be captured for generate()."""

from __future__ import annotations

import torch
from conftest import CONFIGS, capture_json

from engine.config import build_target, load_config


def test_a_decoding_step_is_repeatable_and_captures_decodings_shapes(tmp_path, capsys):
    config = load_config(CONFIGS / "examples" / "gemma4_e2b_decode.toml", small=True)
    target = build_target(config, torch.device("cpu"))
    assert target.notes["forward"].startswith("one decoding step: 1x1 token (the greedy next one) at position 128")
    first, second = target.forward(), target.forward()
    assert first.logits.shape[:2] == (1, 1) and torch.equal(first.logits, second.logits)  # the cache is not grown
    doc = capture_json(CONFIGS / "examples" / "gemma4_e2b_decode.toml", tmp_path, capsys, "--samples", "1")
    sigs = [c["signature"] for c in doc["cards"]]
    # nothing of the cache's copy is captured: only the step's own ops
    assert not any(c["op"] in ("aten::clone", "aten::copy_") for c in doc["cards"]), sorted({c["op"] for c in doc["cards"]})
    # the RMSNorm module chains run on one token: [1, 1, H] (a prefill's would be [1, 128, H])
    norms = [c for c in doc["chains"] if c["chain"]["kind"] == "module" and c["chain"]["module_class"] == "Gemma4RMSNorm"]
    assert norms and all("[1,1," in c["signature"] for c in norms), [c["signature"][:120] for c in norms]
    assert not any("[1,128," in s for s in sigs)
