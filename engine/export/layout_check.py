"""Whole-model check of layout routes (engine/cast/layouts.py), in a fresh process: the model with its cast
installed, eager forwards with and without the model's convolutional modules run channels-last.

A class is tried as one trial: its outermost modules routed, a few forwards (a signature's first call runs
eagerly and records the outputs' strides), then the model's output must stand against eager PyTorch's (as the
whole-model check judges it, engine.export.e2e.judge_output) and be about as accurate as the model without the
route: for a 16-bit model, its distance from the same model run once in float32 (`float32_output`) at most
ACCURACY_RATIO times the larger of eager's and the cast's (a convolution run NHWC adds in another order, so
the route's output is not eager's bit for bit; on a CPU the SD3.5 VAE decoder's small build read 2.26e-2 routed
against eager's own 2.20e-2 from float32). Where no float32 reference can be made, it may move from eager's
output by at most `drift_bar`: twice what the cast's kernels move it, never less than the dtype's floor. Then the model with routes must be faster with confidence (the CI of without/with above 1),
both arms timed in their steady state, alternating, in rounds until the CI is `precision` wide or `max_s`
has passed. The class kept is then timed under CUDA graphs too (`graphs_trial`: the forward captured with and
without its routes, replays alternating); where it is faster with confidence there, it serves that target too. Classes are tried in `layouts.candidates`' order (the one holding the most convolutions first)
until `tries` were timed; one whose modules never ran is not counted. The first that passes is chosen.

`python -m engine.export.layout_check --config C --cast X --out R.json [--small]` (the export runs it).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import Any

from engine.bench.agreement import compared

PRECISION = 0.02
MAX_S = 20.0
TRIES = 2
WARM_CALLS = 3
# Relative L2 of the model's output a layout may add at least, per output dtype: NHWC convolutions add in
# another order, and a 16-bit activation rounds differently after each.
DRIFT_FLOOR = {"bfloat16": 1e-2, "float16": 5e-3}
DRIFT_FLOOR_OTHER = 2e-3  # float32 (cuDNN's TF32 default makes a convolution's algorithm show at ~1e-3)


# With a float32 reference (a 16-bit model run once in float32): the routed model's error from it may be this
# many times the larger of eager's and the cast's (each 16-bit model's own rounding).
ACCURACY_RATIO = 1.5


def drift_bar(dtype: str, cast_drift: float) -> float:
    """How far a layout route may move the model's output from eager's (relative L2), where no float32
    reference could be made."""
    return max(2.0 * cast_drift, DRIFT_FLOOR.get(dtype, DRIFT_FLOOR_OTHER))


def float32_output(model: Any, forward: Callable[[], Any]) -> Any:
    """The output (float64) of a 16-bit model run once in float32: its 16-bit parameters and buffers upcast in
    place and the root module's floating arguments upcast by a pre-hook, then every tensor put back in its own
    dtype (a 16-bit value survives the round trip exactly). None where the model holds no 16-bit tensor or the
    float32 forward fails (a tensor held as a plain attribute, a forward that does not go through the root)."""
    import torch
    from torch.utils._pytree import tree_map

    from engine.models.forwards import output_tensor

    half = (torch.bfloat16, torch.float16)
    held = [t for t in list(model.parameters()) + list(model.buffers()) if t.dtype in half]
    if not held:
        return None
    dtypes = [t.dtype for t in held]

    def up(x: Any) -> Any:
        return x.float() if isinstance(x, torch.Tensor) and x.dtype in half else x

    try:   # a TorchScript root refuses Python hooks: no float32 reference then
        hook = model.register_forward_pre_hook(lambda m, a, k: (tree_map(up, a), tree_map(up, k)), with_kwargs=True)
    except RuntimeError:
        return None
    try:
        for t in held:
            t.data = t.data.float()
        out = output_tensor(forward())
        return out.double() if out is not None and out.dtype == torch.float32 else None
    except Exception:  # noqa: BLE001 - any failure only means no float32 reference
        return None
    finally:
        hook.remove()
        for t, d in zip(held, dtypes):
            t.data = t.data.to(d)


def judge(eager_out: Any, dtype: str, cast_out: Any, reference: Any = None) -> Callable[[Any], dict[str, Any]]:
    """The output rule of a trial: `rule(got)` -> {"why": ...} when the routed model's output may not stand,
    plus what was compared. With a float32 `reference`, the routed model must be about as accurate as the model
    without the route (ACCURACY_RATIO); without one, within `drift_bar` of eager's output."""
    from engine.export.e2e import rel_l2_err

    cast_drift = rel_l2_err(cast_out, eager_out)
    if reference is not None:
        base = max(rel_l2_err(eager_out, reference), rel_l2_err(cast_out, reference))

        def accurate(got: Any) -> dict[str, Any]:
            err = rel_l2_err(got, reference)
            r = {"float32_err": err, "float32_err_without": base}
            if not err <= ACCURACY_RATIO * base + 1e-7:
                r["why"] = (f"the output is {err:.1e} from the float32 model's (relative L2), more than "
                            f"{ACCURACY_RATIO:g} x {base:.1e} without the route")
            return r
        return accurate
    bar = drift_bar(dtype, cast_drift)

    def near(got: Any) -> dict[str, Any]:
        d = rel_l2_err(got, eager_out)
        r = {"drift_bar": bar}
        if not d <= bar:
            r["why"] = f"the output moves {d:.1e} from eager's (relative L2), more than {bar:.1e}"
        return r
    return near


def eager_output(forward: Callable[[], Any]) -> tuple[Any, str]:
    """The model's output after WARM_CALLS forwards, as the checks compare it (`compared`), and its own dtype."""
    from engine.models.forwards import output_tensor

    for _ in range(WARM_CALLS):
        forward()
    out = output_tensor(forward())
    return compared(out), str(out.dtype).removeprefix("torch.")


def judged(eager_out: Any, got: Any, rule: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """A routed model's output judged: against eager's (engine.export.e2e.judge_output), then by `rule`
    (`judge`): its drift from eager's, what the rule compared, and `why` where it may not stand."""
    from engine.export.e2e import judge_output, rel_l2_err

    ok, note = judge_output(eager_out, got)
    r: dict[str, Any] = {"rel_l2_err": rel_l2_err(got, eager_out)}
    if not ok:
        return {**r, "why": note}
    r.update(rule(got))
    if note and "why" not in r:
        r["output_note"] = note
    return r


def trial(model: Any, forward: Callable[[], Any], select: Callable[[str, Any], bool], eager_out: Any,
          rule: Callable[[Any], dict[str, Any]], timed: Callable[[Callable[[], Any]], float],
          precision: float = PRECISION,
          max_s: float = MAX_S) -> dict[str, Any]:
    """One class's routes against the model without them: speedup with its CI, the output's drift from eager's,
    the routes' counters, the signatures they proved, and `why` where the class is not kept."""

    from engine.bench.stats import paired_rounds
    from engine.cast.layouts import LayoutSet
    from engine.models.forwards import output_tensor

    ls = LayoutSet(model, select, learn=True)
    r: dict[str, Any] = {"modules": len(ls.routes), "paths": list(ls.routes)[:8], "skipped": ls.skipped}
    if not ls.routes:
        return {**r, "why": "no module to route"}
    with ls:
        for _ in range(WARM_CALLS):
            forward()
        ls.reset_counters()
        got = compared(output_tensor(forward()))
    s = ls.summary()
    r.update(hits=s["hits"], misses=s["misses"], declines=s["declines"], failed=s["failed"][:4])
    if not s["hits"]:
        return {**r, "why": "no module ran channels-last" + (f" ({s['failed'][0]})" if s["failed"] else "")}
    r.update(judged(eager_out, got, rule))
    if "why" in r:
        return r
    def with_routes() -> float:
        with ls:
            return timed(forward)

    base, routed, est = paired_rounds(lambda: timed(forward), with_routes, precision, max_s)
    med = lambda xs: sorted(xs)[len(xs) // 2] / 1e3  # noqa: E731
    r.update({"speedup": est.speedup, "speedup_ci": [est.low, est.high], "base_ms": med(base),
              "routed_ms": med(routed), "forwards": len(base), "signatures": ls.signatures()})
    del got
    if not est.low > 1.0:
        r["why"] = "not faster with confidence"
    return r


def check(model: Any, forward: Callable[[], Any], classes: list[str], eager_out: Any, cast_out: Any,
          dtype: str, timed: Callable[[Callable[[], Any]], float], precision: float = PRECISION,
          max_s: float = MAX_S, tries: int = TRIES, reference: Any = None) -> dict[str, Any]:
    """Trials of `classes` in order until one passes or `tries` were timed: {"tried": [...], "chosen": that
    trial or None}. `eager_out`, `cast_out`: the model's output without and with the cast (float64);
    `dtype`: the output's own dtype; `reference`: the float32 model's output where one was made (`judge`)."""
    import torch

    rule = judge(eager_out, dtype, cast_out, reference)
    tried: list[dict[str, Any]] = []
    with torch.no_grad():
        for name in classes:
            r = {"class": name, **trial(model, forward, class_is(name), eager_out, rule, timed, precision, max_s)}
            tried.append(r)
            if "why" not in r:
                return {"tried": tried, "chosen": r}
            if sum("speedup" in t for t in tried) >= tries:
                break
    return {"tried": tried, "chosen": None}


def graphs_trial(model: Any, forward: Callable[[], Any], chosen: dict[str, Any],
                 timed: Callable[[Callable[[], Any]], float], precision: float = PRECISION,
                 max_s: float = MAX_S) -> dict[str, Any]:
    """The chosen class under CUDA graphs: the forward captured with the routes (for the signatures the eager
    trial proved; a captured forward launches what the routed eager one does) against it captured without,
    replays alternating. {"speedup", "speedup_ci"} and `why` where the routes do not pay there."""
    import torch

    from engine.bench.forward import capture_graph
    from engine.bench.stats import paired_rounds
    from engine.cast.layouts import LayoutSet
    from engine.cast.runtime import EAGER, GRAPHS

    ls = LayoutSet(model, class_is(chosen["class"]), signatures=chosen["signatures"],
                   targets=frozenset({EAGER, GRAPHS}))
    with torch.no_grad():
        with ls:
            routed_graph = capture_graph(forward)[0]
        hits = ls.summary()["hits"]
        base_graph = capture_graph(forward)[0]
        if not hits:
            return {"why": "no module ran channels-last while the forward was captured"}
        base, routed, est = paired_rounds(lambda: timed(base_graph.replay), lambda: timed(routed_graph.replay),
                                          precision, max_s)
    r = {"speedup": est.speedup, "speedup_ci": [est.low, est.high], "replays": len(base)}
    if not est.low > 1.0:
        r["why"] = "not faster with confidence"
    return r


def with_graphs(res: dict[str, Any], graphs: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """`check`'s result with its CUDA-graph trial: the class chosen in eager is timed under CUDA graphs too and
    serves both targets where it wins there; where no class was faster in eager, the first whose output stood
    (timed, only not faster: a host-bound eager forward hides what the GPU saves) is timed under CUDA graphs
    and, where it wins there, chosen for that target alone. `graphs(trial)` runs one graph trial."""
    def run(t: dict[str, Any]) -> dict[str, Any]:
        try:
            return graphs(t)
        except Exception as e:  # noqa: BLE001 - a forward that cannot be captured: no CUDA-graph target
            return {"why": f"{type(e).__name__}: {e}"[:300]}

    chosen = res.get("chosen")
    if chosen is not None:
        chosen["targets"] = ["eager"]
        chosen["graphs"] = run(chosen)
        if "why" not in chosen["graphs"]:
            chosen["targets"].append("cuda-graphs")
        return res
    stood = next((t for t in res.get("tried", []) if "speedup" in t and t.get("signatures")), None)
    if stood is None:
        return res
    stood["graphs"] = run(stood)
    if "why" in stood["graphs"]:
        return res
    kept = {k: v for k, v in stood.items() if k != "why"}
    return {**res, "chosen": {**kept, "targets": ["cuda-graphs"], "eager_why": stood.get("why")}}


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
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: the plumbing's tests, no measurement
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

        target = build_target(load_config(args.config, small=args.small), torch.device(args.device))
        model, forward = target.module, target.forward
        classes = candidates(model)
        if not classes:
            return {"tried": [], "chosen": None, "candidates": []}
        cast = load(args.cast)
        with torch.no_grad():
            eager_out, dtype = eager_output(forward)
            reference = float32_output(model, forward)  # before the cast binds the parameters it reads
            with cast.enabled(model):
                for _ in range(WARM_CALLS):
                    forward()
                cast_out = compared(output_tensor(forward()))
                timed = functools.partial(time_steady, device=args.device)
                res = check(model, forward, classes, eager_out, cast_out, dtype, timed, args.precision,
                            args.max_s, tries=max(1, args.tries), reference=reference)
                if args.device == "cuda":
                    res = with_graphs(res, lambda t: graphs_trial(model, forward, t, timed, args.precision,
                                                                  args.max_s))
        return {**res, "candidates": classes, "cast_rel_l2_err": rel_l2_err(cast_out, eager_out),
                "output_dtype": dtype, "float32_reference": reference is not None}

    return run_job(work, args.out)


if __name__ == "__main__":
    from engine.exits import leave_process

    sys.exit(leave_process(main()))
