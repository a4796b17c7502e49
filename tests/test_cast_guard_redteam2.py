"""The second guard red team: calls where a cast raised, or served something eager would not compute.

On the CPU, with the stand-ins the other cast tests use: op routes installed at the CPU key with Python plans
(tests/test_cast_guard.py), graph routes with the stand-in backend of tests/test_cast_graph_routes.py."""

from __future__ import annotations

import torch
from test_cast_graph_routes import _routed

# ------------------------------------------------------------------------------------------ graph routes


def test_a_graph_route_called_with_an_expanded_argument_runs_eagerly_instead_of_raising():
    """A static copy of an expanded argument (stride 0) cannot be written: `copy_` refuses a destination whose
    elements share memory, and the route's first call of that signature raised where eager runs."""
    model, gs, backend = _routed()
    x = torch.randn(1, 8).expand(4, 8)
    with torch.no_grad():
        want = model(x)
        with gs:
            got = [model(x) for _ in range(3)]
    assert all(torch.equal(g[0], want[0]) and torch.equal(g[1]["gate"], want[1]["gate"]) for g in got)
    st = next(iter(gs.stats().values()))
    assert backend.captures == 0 and list(st["refused"].values()) == [
        "an argument whose elements share memory (an expanded view)"]
    assert st["declines"] == {"signature refused": 2}
