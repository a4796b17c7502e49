"""Confirmation in a fresh process: install a cast, then per variant check that its guard matches the
captured sample, that the public op's outputs match eager within tolerance (samples, fresh and edge
inputs), and time the public op with the override against the same op without it (engine.bench).

    python -m engine.export.confirm --cast FILE.cast --job JOB.json --out RESULT.json

JOB.json: {"samples": {variant_id: [sample file, ...]}, "timing": {TimingConfig fields}, "only": [variant_id,
...] (optional: the variants to check; the others are installed, not checked)}. A variant without samples runs on
inputs synthesised from its signature (what `audit --verify` does). Each variant's result is also written, as it is
final, to RESULT.json.partial, which the exporter reads while it waits (progress, and checkpoints of the variants
confirmed before an interruption).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.outcomes import faster_with_confidence


def synth_inputs(signature: dict[str, Any], device: Any, seed: int = 0) -> list[tuple[str, Any]]:
    """Arguments with the signature's exact dtypes, shapes, strides and pointer alignment."""
    import torch

    from engine.capture.signature import decode_value

    g = torch.Generator(device="cpu").manual_seed(seed)

    def tensor(d: dict[str, Any]) -> Any:
        dtype = getattr(torch, d["dtype"])
        shape, stride = list(d["shape"]), list(d["stride"])
        extent = 1 + sum((s - 1) * st for s, st in zip(shape, stride) if s > 0) if all(shape) else 0
        pad = 0 if int(d.get("align", 16)) >= 16 else int(d["align"]) // dtype.itemsize
        base = torch.empty(extent + pad + 1, dtype=dtype, device=device)
        if dtype.is_floating_point or dtype.is_complex:
            base.copy_(torch.randn(base.shape, generator=g).to(dtype))
        elif dtype == torch.bool:
            base.copy_(torch.rand(base.shape, generator=g) > 0.5)
        else:
            base.copy_(torch.randint(0, 4, base.shape, generator=g).to(dtype))
        return base.as_strided(shape, stride, pad)

    out = []
    for a in signature["args"]:
        if a["kind"] == "tensor":
            out.append((a["name"], None if a.get("absent") else tensor(a)))
        elif a["kind"] == "tensor_list":
            out.append((a["name"], [None if x is None else tensor(x) for x in a["items"]]))
        else:
            out.append((a["name"], decode_value(a.get("value"))))
    return out


# What a confirmed variant's evidence keeps of its confirmation (manifest `evidence.confirmed`).
CONFIRMED_KEYS = ("speedup", "speedup_ci", "eager_us", "cast_us", "reps", "throttled", "inputs", "host_eager_us",
                  "host_cast_us", "gpu_saved_us", "host_added_us", "net_us", "router")


CHAIN_OP = "kforge::chain"  # engine.capture.chains.CHAIN_OP


def _check_and_time(check: Any, candidate: Any, timed_call: Any, flush: Any, cfg: Any,
                    r: dict[str, Any]) -> Any:
    """Verify `candidate` on the check's sets, then time `timed_call` against eager as the lane does
    (rotating slots, audits) with eager alone as the control; fills `r` (verdict, timing, speedup, …)
    and returns the TimedRun, or None with `r["reason"]` set where it failed."""
    from engine.verify.timed import TimedCandidate, against_control, audited_ab, time_eager_alone

    verdict = check.check(candidate)
    r["verdict"] = verdict.to_json()
    if not verdict.ok:
        r["reason"] = f"{verdict.category}: {verdict.message}"
        return None
    # Timed as in the lane: rotating input slots with new values every call, eager on its own copies, a
    # random sample of calls audited against eager. Outputs are not poisoned here: the cast allocates them
    # inside the call, and a fill there would be timed.
    timed = audited_ab(check, TimedCandidate(timed_call), flush, cfg)
    if timed.category is not None:
        r["reason"] = f"{timed.category}: {timed.message}"
        return None
    ab = timed.ab
    # Eager alone is the control: where eager read slower beside the cast, the speedup is against eager
    # alone (as in the lane).
    timing_json = {**ab.to_json(), **timed.to_json()}
    control, _ = time_eager_alone(check, flush, cfg)
    timing_json.update(against_control(ab, control) or {})
    r.update(timing=timing_json, speedup=timing_json["speedup"], speedup_ci=list(timing_json["speedup_ci"]),
             eager_us=timing_json["eager"]["median"], eager_alone_us=control.median, cast_us=ab.candidate.median,
             reps=ab.reps, throttled=ab.throttled)
    return timed


def _suspended(run: Any) -> Any:
    """`run` with every installed override passing its calls to the original kernels (eager's arm)."""
    from engine.cast import runtime

    def eager(b: Any) -> Any:
        with runtime.suspended():
            return run(b)
    return eager


def _confirm_chain(state: Any, v: dict[str, Any], paths: list[str], device: Any, flush: Any, cfg: Any,
                   gate_host: bool) -> dict[str, Any]:
    """A chain card's variant (module or pattern card): it has no public op, so its plan is called on the
    chain's inputs and checked, timed and host-costed against `run_chain` (eager for the card), with the
    same checks, timing protocol and host gate as an op variant."""
    import torch

    from engine.bench.host import per_call_us
    from engine.capture.chains import run_chain
    from engine.capture.samples import load_sample
    from engine.cast import runtime
    from engine.verify.pipeline import as_list, card_check

    r: dict[str, Any] = {"ok": False}
    sig, plan = v["signature"], state.plan
    names = [a["name"] for a in sig["args"]]
    bound_sets = [load_sample(p, device, sig).args for p in paths] or [synth_inputs(sig, device)]
    r["inputs"] = "captured samples" if paths else "synthesised from the signature"
    check = card_check(CHAIN_OP, sig, bound_sets, sync=torch.cuda.synchronize, fresh=1, edges=True)
    # Eager for the card is the chain's ATen ops with no override: the cast under confirmation is installed,
    # and its op variants would otherwise serve the chain's members (a GroupNorm -> SiLU card was checked and
    # timed against the cast's own group_norm kernel plus eager's SiLU, 350 us where eager takes 3,787).
    check.eager, check.reference64 = _suspended(check.eager), _suspended(check.reference64)

    def args_of(b: Any) -> list[Any]:
        d = dict(b)
        return [d[n] for n in names]

    def candidate(b: Any, prefill: str) -> list[Any]:
        plan.prefill = prefill
        try:
            return as_list(plan(args_of(b)))
        finally:
            plan.prefill = None

    timed = _check_and_time(check, candidate, lambda b, prefill: (lambda: plan(args_of(b))), flush, cfg, r)
    if timed is None:
        return r
    ab = timed.ab
    r["hits"] = plan.hits
    speedup, (low, high), eager_us = r["speedup"], r["speedup_ci"], r["eager_us"]
    if not faster_with_confidence((low, high)):
        r["reason"] = f"not faster with confidence than the chain's eager ops: {speedup:.3f}x (95% CI {low:.3f}-{high:.3f})"
        return r
    inputs = args_of(timed.slot)
    cast_host = per_call_us(lambda: plan(inputs), n=200, rounds=3)
    with runtime.suspended():
        eager_host = per_call_us(lambda: run_chain(sig, inputs), n=200, rounds=3)
    saved, added = eager_us - ab.candidate.median, max(0.0, cast_host - eager_host)
    r.update(host_eager_us=eager_host, host_cast_us=cast_host, gpu_saved_us=saved, host_added_us=added,
             net_us=saved - added, router="python")
    if gate_host and saved <= added:
        r["reason"] = (f"the plan adds {added:.1f} µs of host time per call, more than the {saved:.1f} µs of GPU "
                       "time it saves: a host-bound model would be slower")
        return r
    r["ok"] = True
    return r


def confirm(cast_path: str, samples: dict[str, list[str]], timing: dict[str, Any],
            gate_host: bool = True, only: list[str] | None = None,
            on_variant: Callable[[str, dict[str, Any], dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run every check for every usable variant of the cast (of those in `only` where given: the cast still
    installs them all); returns JSON-ready results per variant. `on_variant(id, result, env)` is called as each
    variant's result is final, so that a confirmation cut short keeps what it finished."""
    import warnings

    import torch

    from engine.bench.host import per_call_us
    from engine.bench.timing import L2Flusher, TimingConfig
    from engine.capture.samples import load_sample
    from engine.cast import cpp_router, runtime
    from engine.cast.compat import current_env
    from engine.cast.loader import load
    from engine.ops import call_op, eager_call, resolve_op, written_args
    from engine.verify.inputs import clone_bound
    from engine.verify.pipeline import CardCheck, as_list

    device = torch.device("cuda", torch.cuda.current_device())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # unproven_ok: a cast from another GPU is verified here (audit --verify); any_target: each variant is
        # checked through the public op in eager, whatever targets the whole-model checks kept it for.
        cast = load(cast_path, unproven_ok=True, any_target=True)
        cast.install()
    results: dict[str, Any] = {"env": current_env(), "warnings": [str(w.message) for w in caught], "variants": {}}
    flush = L2Flusher(device)
    cfg = TimingConfig.from_json(timing)
    by_id = {v["id"]: v for v in (cast.manifest or {}).get("variants", [])}
    finished: list[tuple[str, dict[str, Any]]] = []   # the variant checked last, said once the next begins

    def said() -> None:
        if on_variant is not None and finished:
            on_variant(*finished.pop(), results["env"])

    try:
        for state in cast.variants:
            said()
            if only is not None and state.id not in only:
                continue
            r: dict[str, Any] = {"ok": False}
            results["variants"][state.id] = r
            finished.append((state.id, r))
            if state.problem is not None or state.plan is None:
                r["reason"] = state.problem or "not installed"
                continue
            v = by_id[state.id]
            if v["op"] == CHAIN_OP:
                r.update(_confirm_chain(state, v, samples.get(state.id) or [], device, flush, cfg, gate_host))
                continue
            op = resolve_op(v["op"])
            paths = samples.get(state.id) or []
            bound_sets = [load_sample(p, device, v["signature"]).args for p in paths] or [synth_inputs(v["signature"], device)]
            r["inputs"] = "captured samples" if paths else "synthesised from the signature"

            eager_of = eager_call(op, v["signature"])   # a twin's: input made contiguous, outputs as asserted

            def eager(b, run=eager_of):
                with runtime.suspended():
                    return run(b)

            before = state.hits
            call_op(op, clone_bound(bound_sets[0]))
            torch.cuda.synchronize()
            if state.hits == before:
                r["reason"] = "the guard did not match the variant's own inputs (no hit)"
                continue
            written = written_args(op)
            check = CardCheck(v["op"], bound_sets, eager, written_args=written, sync=torch.cuda.synchronize,
                              fresh=1, edges=True)
            def candidate(b, prefill, op=op, plan=state.plan):
                # Fresh outputs are poisoned as in the lane, so an output the kernel leaves unwritten
                # cannot pass by inheriting eager's freed memory from the caching allocator.
                plan.prefill = prefill
                try:
                    with cpp_router.prefill(prefill):
                        return as_list(call_op(op, b))
                finally:
                    plan.prefill = None

            timed = _check_and_time(check, candidate, lambda b, prefill, op=op: (lambda: call_op(op, b)),
                                    flush, cfg, r)
            if timed is None:
                continue
            ab, inputs = timed.ab, timed.slot
            r["hits"] = state.hits
            speedup, (low, high), eager_us = r["speedup"], r["speedup_ci"], r["eager_us"]
            if not faster_with_confidence((low, high)):
                r["reason"] = (f"not faster with confidence through the public op: {speedup:.3f}x "
                               f"(95% CI {low:.3f}-{high:.3f})")
                continue
            # Host cost per call of the public op with and without the override (the GPU queue is not
            # awaited per call): a Python-dispatched hit costs more host time than eager's C++ path, and
            # in a model whose host is the bottleneck that cost is paid in full. A variant ships only if
            # the GPU time it saves exceeds the host time it adds.
            cast_host = per_call_us(lambda op=op, inputs=inputs: call_op(op, inputs), n=200, rounds=3)
            cast.remove()
            try:
                eager_host = per_call_us(lambda run=eager_of, inputs=inputs: run(inputs), n=200, rounds=3)
            finally:
                cast.install()
            saved = eager_us - ab.candidate.median
            added = max(0.0, cast_host - eager_host)
            router = "c++" if state.cpp else "python"
            r.update(host_eager_us=eager_host, host_cast_us=cast_host, gpu_saved_us=saved, host_added_us=added,
                     net_us=saved - added, router=router)
            if gate_host and saved <= added:
                r["reason"] = (f"the {router} router adds {added:.1f} µs of host time per call, more than the "
                               f"{saved:.1f} µs of GPU time the kernel saves: a host-bound model would be slower")
                continue
            r["ok"] = True
        said()
    finally:
        cast.remove()
    return results


def partial_path(out: str | Path) -> Path:
    """Where the confirmation writes the variants it has finished, as it goes (`{"env", "variants"}`)."""
    return Path(f"{out}.partial")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Confirm a cast's variants in this (fresh) process")
    ap.add_argument("--cast", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    partial, done = partial_path(args.out), {}

    def finished(vid: str, r: dict[str, Any], env: dict[str, Any]) -> None:
        done[vid] = r
        tmp = partial.with_name(partial.name + ".tmp")
        tmp.write_text(json.dumps({"env": env, "variants": done}, default=str))
        tmp.replace(partial)   # the exporter polls it: never half a file

    def work() -> dict[str, Any]:
        job = json.loads(Path(args.job).read_text())
        return confirm(args.cast, job.get("samples", {}), job.get("timing", {}), job.get("gate_host", True),
                       only=job.get("only"), on_variant=finished)

    return run_job(work, args.out)


def run_job(work: Any, out: str) -> int:
    """A fresh-process job's end: `work()`'s JSON result (or the error and its traceback) written to `out`;
    exit 0 unless it failed."""
    try:
        result = work()
    except Exception as e:
        result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    Path(out).write_text(json.dumps(result, default=str))
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    from engine.exits import leave_process

    sys.exit(leave_process(main()))
