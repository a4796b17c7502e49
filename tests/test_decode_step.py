"""The reference LM builders' `decode = true` (engine/models/decode.py): the forward is one decoding step after
a prefill, repeatable (each call starts from a copy of the prefilled cache, made outside capture), and its
cards have decoding's shapes, which a prefill's cards never match, so a cast can be captured for generate()."""

from __future__ import annotations

import pytest
import torch
from conftest import CONFIGS, OutErr, capture_json

from engine.config import build_target, load_config

DECODE = CONFIGS / "examples" / "gemma4_e2b_decode.toml"


# The small Gemma's decoding step built (with its 128-token prefill) and captured once for the two tests below,
# which each built and captured it (23 s of the two tests' 24 s here). Neither changes the model: the cast test
# removes its cast.
@pytest.fixture(scope="module")
def decode_target():
    return build_target(load_config(DECODE, small=True), torch.device("cpu"))


@pytest.fixture(scope="module")
def decode_capture(tmp_path_factory):
    """The decoding-step config's capture with one sample: (its workspace, its JSON)."""
    ws = tmp_path_factory.mktemp("ws")
    return ws, capture_json(DECODE, ws, OutErr(), "--samples", "1")


def test_a_decoding_step_is_repeatable_and_captures_decodings_shapes(decode_target, decode_capture):
    target = decode_target
    assert target.notes["forward"].startswith("one decoding step: 1x1 token (the greedy next one) at position 128")
    first, second = target.forward(), target.forward()
    assert first.logits.shape[:2] == (1, 1) and torch.equal(first.logits, second.logits)  # the cache is not grown
    _, doc = decode_capture
    sigs = [c["signature"] for c in doc["cards"]]
    # nothing of the cache's copy is captured: only the step's own ops
    assert not any(c["op"] in ("aten::clone", "aten::copy_") for c in doc["cards"]), sorted({c["op"] for c in doc["cards"]})
    # the RMSNorm module chains run on one token: [1, 1, H] (a prefill's would be [1, 128, H])
    norms = [c for c in doc["chains"] if c["chain"]["kind"] == "module" and c["chain"]["module_class"] == "Gemma4RMSNorm"]
    assert norms and all("[1,1," in c["signature"] for c in norms), [c["signature"][:120] for c in norms]
    assert not any("[1,128," in s for s in sigs)


def test_module_cards_of_a_decoding_step_serve_generate_with_its_default_cache(tmp_path, decode_target,
                                                                               decode_capture):
    """The RMSNorm module cards the decoding-step config captures are the calls eager generate() makes at
    every decoding step with transformers' default (dynamic) cache: a cast of them (plans that compute the
    chain exactly and count) serves those steps, and the tokens are generate()'s own."""
    import json
    import sqlite3

    import engine.cast
    from engine.capture.chains import CHAIN_OP, run_chain
    from engine.cast import format as cast_format
    from engine.cast.format import write_cast
    from engine.store import db_path

    ws, doc = decode_capture
    norms = [c for c in doc["chains"] if c["chain"]["kind"] == "module" and c["chain"]["module_class"] == "Gemma4RMSNorm"]
    db = sqlite3.connect(db_path(ws))
    variants, plans, calls = [], {}, {}
    for c in norms:
        sig = json.loads(db.execute("SELECT signature FROM cards WHERE card_id = ?", (c["id"],)).fetchone()[0])
        ch = c["chain"]
        variants.append({"id": c["id"], "op": CHAIN_OP, "signature": sig, "signature_text": c["signature"],
                         "outputs": [], "launch_spec": "", "kernels": [], "files": {}, "category": "custom CUDA",
                         "evidence": {}, "provenance": {},
                         "module": {"class": ch["class"], "paths": ch["paths"], "args": ch["args"],
                                    "params": ch["params"]}})
        calls[c["id"]] = 0

        def plan(inputs, sig=sig, vid=c["id"]):
            calls[vid] += 1
            return run_chain(sig, inputs)
        plans[c["id"]] = plan
    env = {"torch": torch.__version__, "torch_minor": ".".join(torch.__version__.split(".")[:2]), "cuda": "13.0",
           "gpu": "NVIDIA H200", "arch": "sm_90", "compute_capability": [9, 0], "driver": "13.0", "nvrtc": "13.0"}
    write_cast(tmp_path / "decode.cast", {"format": cast_format.FORMAT, "format_version": cast_format.FORMAT_VERSION,
                                          "env": env, "variants": variants}, {}, "# test\n")
    model = decode_target.module
    ids = torch.randint(3, 1000, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=4, do_sample=False)
        cast = engine.cast.load(tmp_path / "decode.cast", env=env, plans=plans)
        try:
            with cast.enabled(model):
                got = model.generate(ids, max_new_tokens=4, do_sample=False)
        finally:
            cast.remove()
    assert torch.equal(got, want)
    # 3 decoding steps after the prefill (whose 16-token norms are another shape): every norm card served each,
    # in each of its modules (more where a prefill runs a layer on its last token only, as transformers 5.24 does
    # for Gemma's KV-shared layers)
    paths = {c["id"]: len(c["chain"]["paths"]) for c in norms}
    assert calls and all(n >= 3 * paths[vid]
                         for vid, n in calls.items()), (calls, paths)


def test_scripts_take_a_config_with_overrides():
    """bench_decode and bench_graph_routes read --model through config_or_error: CONFIG@key=value overrides
    [params] (a decoding step at the real depth: gemma4_e2b_decode.toml@full_depth=true), a malformed one or a
    key the builder lacks is one line naming the input."""
    from engine.config import config_or_error

    config, why = config_or_error(str(CONFIGS / "examples" / "gemma4_e2b_decode.toml") + "@full_depth=true")
    assert why is None and config.params["full_depth"] is True and config.params["decode"] is True
    _, why = config_or_error("gemma4_e2b@full_depth")
    assert why.startswith("error: --model gemma4_e2b@full_depth: ") and "is not key=value" in why and "\n" not in why
    _, why = config_or_error(str(CONFIGS / "examples" / "gemma4_e2b_decode.toml") + "@no_such_param=1")
    assert why is not None and "no_such_param" in why and "\n" not in why


def test_the_cache_goes_by_the_name_the_models_forward_takes():
    """transformers 5.2x takes and returns the cache as `cache` (`past_key_values` a deprecated alias); the
    H200's 5.17 as `past_key_values`. A step passes it by the name its model's forward has."""
    from types import SimpleNamespace

    from engine.models.decode import decode_step

    class Old(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None, use_cache=False, logits_to_keep=0):
            seen.append(("past_key_values", past_key_values))
            return SimpleNamespace(logits=torch.zeros(1, input_ids.shape[1], 4), past_key_values=[1, 2])

    class New(torch.nn.Module):
        def forward(self, input_ids, cache=None, use_cache=False, logits_to_keep=0):
            seen.append(("cache", cache))
            return SimpleNamespace(logits=torch.zeros(1, input_ids.shape[1], 4), cache=[3])

    for model, name, prefilled in ((Old(), "past_key_values", [1, 2]), (New(), "cache", [3])):
        seen = []
        forward, _ = decode_step(model, torch.zeros(1, 5, dtype=torch.long))
        forward()
        assert seen[-1] == (name, prefilled)  # a copy of the prefilled cache, by the forward's own name
