"""Whole-model check of layout routes (engine/cast/layouts.py), in a fresh process: the model with its cast
installed, eager forwards with and without the model's convolutional modules run channels-last.

A class is tried as one trial: its outermost modules routed, a few forwards (a signature's first call runs
eagerly and records the outputs' strides), then the model's output must stand against eager PyTorch's (as the
whole-model check judges it, engine.export.e2e.judge_output) and move from it by at most `drift_bar`: twice
what the cast's own kernels move it, and never less than the dtype's floor (a convolution run NHWC adds in
another order). Then the model with routes must be faster with confidence (the CI of without/with above 1),
both arms timed in their steady state, alternating, in rounds until the CI is `precision` wide or `max_s`
has passed. Classes are tried in `layouts.candidates`' order (the one holding the most convolutions first)
until `tries` were timed; one whose modules never ran is not counted. The first that passes is chosen.

`python -m engine.export.layout_check --config C --cast X --out R.json [--small]` (the export runs it).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

PRECISION = 0.02
MAX_S = 20.0
TRIES = 2
WARM_CALLS = 3
# Relative L2 of the model's output a layout may add at least, per output dtype: NHWC convolutions add in
# another order, and a 16-bit activation rounds differently after each.
DRIFT_FLOOR = {"bfloat16": 1e-2, "float16": 5e-3}
DRIFT_FLOOR_OTHER = 2e-3  # float32 (cuDNN's TF32 default makes a convolution's algorithm show at ~1e-3)


def drift_bar(dtype: str, cast_drift: float) -> float:
    """How far a layout route may move the model's output from eager's (relative L2)."""
    return max(2.0 * cast_drift, DRIFT_FLOOR.get(dtype, DRIFT_FLOOR_OTHER))


def trial(model: Any, forward: Callable[[], Any], select: Callable[[str, Any], bool], eager_out: Any,
          bar: float, timed: Callable[[Callable[[], Any]], float], precision: float = PRECISION,
          max_s: float = MAX_S) -> dict[str, Any]:
    """One class's routes against the model without them: speedup with its CI, the output's drift from eager's,
    the routes' counters, the signatures they proved, and `why` where the class is not kept."""

    from engine.bench.stats import speedup_ci
    from engine.cast.layouts import LayoutSet
    from engine.export.e2e import judge_output, rel_l2_err
    from engine.models.forwards import output_tensor

    ls = LayoutSet(model, select, learn=True)
    r: dict[str, Any] = {"modules": len(ls.routes), "paths": list(ls.routes)[:8], "skipped": ls.skipped}
    if not ls.routes:
        return {**r, "why": "no module to route"}
    with ls:
        for _ in range(WARM_CALLS):
            forward()
        ls.reset_counters()
        got = output_tensor(forward()).double()
    s = ls.summary()
    r.update(hits=s["hits"], misses=s["misses"], declines=s["declines"], failed=s["failed"][:4])
    if not s["hits"]:
        return {**r, "why": "no module ran channels-last" + (f" ({s['failed'][0]})" if s["failed"] else "")}
    ok, note = judge_output(eager_out, got)
    r["rel_l2_err"] = rel_l2_err(got, eager_out)
    r["drift_bar"] = bar
    if not ok:
        return {**r, "why": note}
    if not r["rel_l2_err"] <= bar:
        return {**r, "why": f"the output moves {r['rel_l2_err']:.1e} from eager's (relative L2), more than "
                            f"{bar:.1e}"}
    if note:
        r["output_note"] = note
    base, routed = [], []
    t0 = time.perf_counter()
    while True:
        for i in range(10):
            for arm in (("base", "routed") if i % 2 == 0 else ("routed", "base")):
                if arm == "routed":
                    with ls:
                        routed.append(timed(forward))
                else:
                    base.append(timed(forward))
        est = speedup_ci(base, routed, paired=True)
        if est.high - est.low <= precision or time.perf_counter() - t0 >= max_s:
            break
    med = lambda xs: sorted(xs)[len(xs) // 2] / 1e3  # noqa: E731
    r.update({"speedup": est.speedup, "speedup_ci": [est.low, est.high], "base_ms": med(base),
              "routed_ms": med(routed), "forwards": len(base), "signatures": ls.signatures()})
    del got
    if not est.low > 1.0:
        r["why"] = "not faster with confidence"
    return r


def check(model: Any, forward: Callable[[], Any], classes: list[str], eager_out: Any, cast_drift: float,
          dtype: str, timed: Callable[[Callable[[], Any]], float], precision: float = PRECISION,
          max_s: float = MAX_S, tries: int = TRIES) -> dict[str, Any]:
    """Trials of `classes` in order until one passes or `tries` were timed: {"tried": [...], "chosen": that
    trial or None}. `eager_out`: the model's output without the cast (float64); `cast_drift`: how far the
    cast alone moves it (relative L2); `dtype`: the output's own dtype (its drift floor)."""
    import torch

    bar = drift_bar(dtype, cast_drift)
    tried: list[dict[str, Any]] = []
    with torch.no_grad():
        for name in classes:
            r = {"class": name, **trial(model, forward, class_is(name), eager_out, bar, timed, precision, max_s)}
            tried.append(r)
            if "why" not in r:
                return {"tried": tried, "chosen": r}
            if sum("speedup" in t for t in tried) >= tries:
                break
    return {"tried": tried, "chosen": None}


def class_is(name: str) -> Callable[[str, Any], bool]:
    return lambda path, m: type(m).__name__ == name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Whole-model check of layout routes in this (fresh) process")
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

        from engine.bench.forward import time_steady
        from engine.cast.layouts import candidates
        from engine.cast.loader import load
        from engine.config import build_target, load_config
        from engine.export.e2e import rel_l2_err
        from engine.models.forwards import output_tensor

        target = build_target(load_config(args.config, small=args.small), torch.device("cuda"))
        model, forward = target.module, target.forward
        classes = candidates(model)
        if not classes:
            return {"tried": [], "chosen": None, "candidates": []}
        cast = load(args.cast)
        with torch.no_grad():
            for _ in range(WARM_CALLS):
                forward()
            out = output_tensor(forward())
            dtype = str(out.dtype).removeprefix("torch.")
            eager_out = out.double()
            with cast.enabled(model):
                for _ in range(WARM_CALLS):
                    forward()
                cast_drift = rel_l2_err(output_tensor(forward()).double(), eager_out)
                res = check(model, forward, classes, eager_out, cast_drift, dtype, time_steady, args.precision,
                            args.max_s, tries=max(1, args.tries))
        return {**res, "candidates": classes, "cast_rel_l2_err": cast_drift, "output_dtype": dtype}

    return run_job(work, args.out)


if __name__ == "__main__":
    sys.exit(main())
