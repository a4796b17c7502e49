"""The fresh-process confirmation checks a chain card's variant against eager's own ops. The cast under
confirmation is installed there, so its op variants would serve the chain's members in eager's arm: on the
H200 a GroupNorm -> SiLU card was checked and timed against the cast's own group_norm kernel plus eager's SiLU
(350 µs where eager takes 3,787 µs), and its export reported that as the chain's eager."""

from __future__ import annotations

import contextlib

import torch
from test_builtin_chains import BF, GroupNormSilu, chain_cards

from engine.cast import runtime
from engine.export import confirm
from engine.verify import pipeline


def test_a_chain_cards_eager_arm_runs_with_the_casts_overrides_suspended(monkeypatch):
    state, seen = {"suspended": False}, []

    @contextlib.contextmanager
    def suspended():
        state["suspended"] = True
        try:
            yield
        finally:
            state["suspended"] = False

    real = pipeline.run_chain

    def spy(signature, inputs):
        seen.append(state["suspended"])
        return real(signature, inputs)

    def stop(check, candidate, timed_call, flush, cfg, r):  # the check's eager, then stop before any timing
        bound = check.sets[0][1]
        check.eager(bound)
        check.reference64([(n, t.double() if isinstance(t, torch.Tensor) else t) for n, t in bound])
        r["reason"] = "stopped by the test"
        return None

    monkeypatch.setattr(runtime, "suspended", suspended)
    monkeypatch.setattr(pipeline, "run_chain", spy)
    monkeypatch.setattr(confirm, "_check_and_time", stop)
    card = chain_cards(GroupNormSilu(), torch.randn(2, 8, 6, 6, dtype=BF))[0]

    class State:
        plan = None

    r = confirm._confirm_chain(State(), {"signature": card.signature}, [], torch.device("cpu"), None, None, True)
    assert r == {"ok": False, "inputs": "synthesised from the signature", "reason": "stopped by the test"}
    assert seen == [True, True]  # eager and its float64 reference, each with every override passing through
