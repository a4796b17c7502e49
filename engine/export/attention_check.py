"""Whole-model check of attention routes (engine/cast/attention.py), in a fresh process: the model compiled with
its cast, with and without its SDPA calls of large head dimension computed in their math form.

Per compile mode among the export's targets: the signatures the math form may serve are found in the graphs
Dynamo makes of the forward (a backend that only looks). Where there are any, the cast is written again with
those signatures as its routes for the mode. The model is compiled once with each cast, and the routed model's
output must stand against eager's (engine.export.e2e.judge_output). It must also be about as accurate as the
model without the routes: from the 16-bit model run once in float32, at most ACCURACY_RATIO times the error of
eager or of the cast without routes, whichever is larger (engine.export.layout_check.judge). Then it must be
faster with confidence: both arms timed in their steady state, alternating, in rounds until the CI is
`precision` wide or `max_s` has passed. The modes where it passes are the routes' targets.

`python -m engine.export.attention_check --config C --cast X --out R.json --modes default,reduce-overhead
[--small]` (the export runs it).
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.bench.agreement import compared

PRECISION = 0.02
MAX_S = 20.0
WARM_CALLS = 3


def discover(forward: Callable[[], Any]) -> list[dict[str, Any]]:
    """The SDPA signatures the math form may serve, in the graphs Dynamo makes of `forward` (nothing compiled:
    the backend returns each graph as it is)."""
    import torch

    from engine.cast.attention import signatures_seen

    seen: list[dict[str, Any]] = []

    def look(gm: Any, example_inputs: Any) -> Any:
        seen.extend(s for s in signatures_seen(gm) if s not in seen)
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(forward, backend=look)()
    finally:
        torch._dynamo.reset()
    return seen


def with_routes(cast_path: str, signatures: list[dict[str, Any]], targets: list[str], dest: Path) -> Path:
    """The cast at `cast_path` written again to `dest` with `signatures` as its attention routes for `targets`."""
    from engine.cast.format import read_cast, write_cast

    cf = read_cast(cast_path)
    manifest = dict(cf.manifest)
    manifest["source"] = {**(manifest.get("source") or {}),
                          "attention_routes": {"signatures": signatures, "targets": targets}}
    write_cast(dest, manifest, cf.files, "# attention-route trial\n")
    return dest


def trial(model: Any, forward: Callable[[], Any], plain: Any, routed: Any, mode: str, eager_out: Any,
          rule: Callable[[Any], dict[str, Any]], timed: Callable[[Callable[[], Any]], float],
          precision: float = PRECISION, max_s: float = MAX_S) -> dict[str, Any]:
    """The model compiled in `mode` with the `routed` cast against the `plain` one: speedup with its CI, the
    routed output's accuracy, the calls rewritten, and `why` where the routes are not kept for the mode."""
    import torch

    from engine.bench.stats import paired_rounds
    from engine.export.layout_check import judged
    from engine.models.forwards import output_tensor

    kw = {} if mode == "default" else {"mode": mode}
    torch._dynamo.reset()
    before = routed.stats().get("attention_rewrites", 0)   # the routed cast's count spans the modes tried
    arms = {}
    for name, cast in (("plain", plain), ("routed", routed)):
        with cast.enabled(model):
            fn = cast.compile(forward, **kw)
            for _ in range(WARM_CALLS):
                fn()
            arms[name] = (cast, fn)
    r: dict[str, Any] = {"mode": mode, "rewritten": routed.stats().get("attention_rewrites", 0) - before}
    if not r["rewritten"]:
        return {**r, "why": "no attention call was compiled in its math form"}
    with routed.enabled(model):
        got = compared(output_tensor(arms["routed"][1]()))
    r.update(judged(eager_out, got, rule))
    if "why" in r:
        return r

    def arm(name: str) -> Callable[[], float]:
        cast, fn = arms[name]

        def run() -> float:
            with cast.enabled(model):
                return timed(fn)
        return run

    base, fast, est = paired_rounds(arm("plain"), arm("routed"), precision, max_s)
    med = lambda xs: sorted(xs)[len(xs) // 2] / 1e3  # noqa: E731
    r.update({"speedup": est.speedup, "speedup_ci": [est.low, est.high], "base_ms": med(base),
              "routed_ms": med(fast), "forwards": len(base)})
    if not est.low > 1.0:
        r["why"] = "not faster with confidence"
    torch._dynamo.reset()
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Whole-model check of attention routes in this (fresh) process")
    ap.add_argument("--config", required=True)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--cast", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default="default", help="compile modes, comma-separated (default: default)")
    ap.add_argument("--precision", type=float, default=PRECISION)
    ap.add_argument("--max-s", type=float, default=MAX_S)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: the plumbing's tests, no measurement
    args = ap.parse_args(argv)
    from engine.export.confirm import run_job

    def work() -> dict[str, Any]:
        import torch

        from engine.bench.forward import time_steady
        from engine.cast import runtime
        from engine.cast.loader import load
        from engine.config import build_target, load_config
        from engine.export.layout_check import eager_output, float32_output, judge
        from engine.models.forwards import output_tensor

        modes = [m for m in args.modes.split(",") if m]
        target = build_target(load_config(args.config, small=args.small), torch.device(args.device))
        model, forward = target.module, target.forward
        with torch.no_grad():
            eager_out, dtype = eager_output(forward)
            sigs = discover(forward)
            if not sigs:
                return {"signatures": [], "tried": [], "targets": []}
            reference = float32_output(model, forward)   # before a cast binds the parameters it reads
            targets = [runtime.compile_target(m) for m in modes]
            with tempfile.TemporaryDirectory(prefix="kforge-attention-") as tmp:
                plain = load(args.cast)
                routed = load(with_routes(args.cast, sigs, targets, Path(tmp) / "routed.cast"))
                with plain.enabled(model):
                    for _ in range(WARM_CALLS):
                        forward()
                    cast_out = compared(output_tensor(forward()))
                rule = judge(eager_out, dtype, cast_out, reference)
                timed = functools.partial(time_steady, device=args.device)
                tried = [trial(model, forward, plain, routed, m, eager_out, rule, timed, args.precision, args.max_s)
                         for m in modes]
        kept = [runtime.compile_target(t["mode"]) for t in tried if "why" not in t]
        return {"signatures": sigs, "tried": tried, "targets": kept, "float32_reference": reference is not None}

    return run_job(work, args.out)


if __name__ == "__main__":
    from engine.exits import leave_process

    sys.exit(leave_process(main()))
