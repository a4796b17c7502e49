"""Whole-model check of graph routes (engine/cast/graphs.py), in a fresh process: the model with its cast
installed, eager forwards with and without routes on the whole model or one of its repeated classes.

A class is tried as one trial: its modules routed (the outermost instances), a few forwards to capture, then
the output must equal the output without routes bit for bit (a replay launches the kernels the eager call
launched), and the model with routes must be faster with confidence (the CI of without/with above 1).
Classes are tried in `graphs.route_candidates`' order (the model's own class, then its repeated classes
largest first) until `tries` of them were timed (a class none of
whose modules replays is not timed and not counted); the first that passes is chosen.
Both arms are timed in their steady state (engine.bench.forward.time_steady), alternating, in rounds until
the CI is `precision` wide or `max_s` has passed.

`python -m engine.export.graph_check --config C --cast X --out R.json [--small]` (the export runs it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

PRECISION = 0.02
MAX_S = 20.0
TRIES = 2
WARM_CALLS = 3  # forwards with the routes installed before timing: the first call of a signature captures


def trial(model: Any, forward: Callable[[], Any], select: Callable[[str, Any], bool], want: Any,
          timed: Callable[[Callable[[], Any]], float], precision: float = PRECISION, max_s: float = MAX_S,
          backend: Any = None) -> dict[str, Any]:
    """One class's routes against the model without them: speedup with its CI, whether the output equals
    `want` (the output without routes) bit for bit, and the routes' counters."""
    import torch

    from engine.bench.stats import paired_rounds
    from engine.cast.graphs import GraphSet
    from engine.models.forwards import output_tensor

    gs = GraphSet(model, select, backend)
    r: dict[str, Any] = {"modules": len(gs.routes), "paths": list(gs.routes)[:8], "skipped": gs.skipped}
    if not gs.routes:
        return {**r, "why": "no module to route"}
    with gs:
        for _ in range(WARM_CALLS):
            forward()
        got = output_tensor(forward())
    r["equal"] = bool(torch.equal(got, want))
    st = gs.stats()
    r["replaying"] = sum(1 for s in st.values() if s["replays"])
    r["refused"] = sorted({w for s in st.values() for w in s["refused"].values()})[:4]
    if not r["equal"]:
        return {**r, "routes": st, "why": "the output differs from the output without routes"}
    if not r["replaying"]:
        return {**r, "routes": st, "why": "no route replays a graph"}
    def with_routes() -> float:
        with gs:
            return timed(forward)

    base, routed, est = paired_rounds(lambda: timed(forward), with_routes, precision, max_s)
    med = lambda xs: sorted(xs)[len(xs) // 2] / 1e3  # noqa: E731
    r.update({"speedup": est.speedup, "speedup_ci": [est.low, est.high], "base_ms": med(base),
              "routed_ms": med(routed), "forwards": len(base), "routes": gs.stats()})
    if est.low <= 1.0:
        r["why"] = "not faster with confidence"
    return r


def check(model: Any, forward: Callable[[], Any], classes: list[str], timed: Callable[[Callable[[], Any]], float],
          precision: float = PRECISION, max_s: float = MAX_S, backend: Any = None,
          tries: int = TRIES) -> dict[str, Any]:
    """Trials of `classes` in order until one passes or `tries` of them were timed: {"tried": [...], "chosen":
    that trial or None}. A class none of whose modules replays (a host sync in its forward: Qwen3.5's MoE
    routing) costs a few forwards and does not count against `tries`."""
    import torch

    from engine.models.forwards import output_tensor

    tried: list[dict[str, Any]] = []
    with torch.no_grad():
        for _ in range(WARM_CALLS):
            forward()
        want = output_tensor(forward()).clone()
        for name in classes:
            r = {"class": name, **trial(model, forward, class_is(name), want, timed, precision, max_s, backend)}
            tried.append(r)
            if "why" not in r:
                return {"tried": tried, "chosen": r}
            if sum("speedup" in t for t in tried) >= tries:
                break
    return {"tried": tried, "chosen": None}


def class_is(name: str) -> Callable[[str, Any], bool]:
    """A GraphSet selector: the modules of that class name."""
    return lambda path, m: type(m).__name__ == name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Whole-model check of graph routes in this (fresh) process")
    ap.add_argument("--config", required=True)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--cast", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tries", type=int, default=TRIES)
    ap.add_argument("--precision", type=float, default=PRECISION)
    ap.add_argument("--max-s", type=float, default=MAX_S)
    args = ap.parse_args(argv)
    from engine.export.confirm import run_job

    def work() -> dict[str, Any]:
        import torch

        from engine.bench.forward import settle, time_steady
        from engine.cast.graphs import route_candidates
        from engine.cast.loader import load
        from engine.config import build_target, load_config

        target = build_target(load_config(args.config, small=args.small), torch.device("cuda"))
        model, forward = target.module, target.forward
        cast = load(args.cast)
        classes = route_candidates(model)
        with torch.no_grad():  # the model without routes until its pace stops moving (engine.bench.forward.settle)
            settled = settle(forward)
        with cast.enabled(model):
            out = check(model, forward, classes, time_steady, args.precision, args.max_s, tries=max(1, args.tries))
        return {**out, "candidates": classes, "settled": settled}

    return run_job(work, args.out)


if __name__ == "__main__":
    from engine.exits import leave_process

    sys.exit(leave_process(main()))
