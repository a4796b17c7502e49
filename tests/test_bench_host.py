"""engine.bench.host.host_pair: the two arms' issue times come from alternating rounds, the arm's context
entered and left outside the timed forward. (bench_e2e timed 20 eager forwards, then 20 with the cast: on
the H200 a VAE cast that ran no kernel in eager read 3.6 ms more host time per forward than eager, and such a
measurement cannot tell a cost of the cast from a drift over it.)"""

import contextlib

import torch

from engine.bench import host


def test_arms_alternate_and_the_context_is_outside_the_timed_forward(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(host, "gpu_launches", lambda forward: {"kernels": 3, "copies": 1})
    order, state = [], {"inside": False, "entered": 0}

    @contextlib.contextmanager
    def arm():
        state["inside"] = True
        state["entered"] += 1
        try:
            yield
        finally:
            state["inside"] = False

    def forward():
        order.append("cast" if state["inside"] else "eager")

    plain, mine = host.host_pair(forward, arm, n=4)
    assert order == ["eager", "cast", "cast", "eager", "eager", "cast", "cast", "eager"]
    assert state["entered"] == 5  # once per timed cast forward, once for its launch count
    assert plain["kernels"] == 3 and mine["alternated"] and plain["issue_us"] >= 0
    assert mine["us_per_launch"] == mine["issue_us"] / 4
