"""A cast straight from a model, without a workspace run: capture, builtin templates (default + a few
neighbours), lane verification and timing, then the exporter's own fresh-process confirmation and
packaging. For tests and benchmarks on a GPU; users export runs (`kforge-tui export`).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engine.cast.format import write_cast
from engine.export.confirm import CONFIRMED_KEYS
from engine.export.package import ExportVariant, package, run_confirm
from engine.outcomes import faster_with_confidence
from engine.propose.base import Hardware


def hardware_of(props: Any) -> Hardware:
    """The GPU whose properties (`torch.cuda.get_device_properties`) these are, as the builtin templates
    take it: what a lane's hello reports, less the measured copy bandwidth (here the DRAM peak from the
    memory clock and bus width, `measured=False`; no template reads it)."""
    d = Hardware()
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    bandwidth = 2 * clock_khz * 1e3 * bus_bits / 8 if clock_khz and bus_bits else d.bandwidth_bps
    return Hardware(
        name=props.name, arch=f"sm_{props.major}{props.minor}", sms=int(props.multi_processor_count),
        l2_bytes=int(props.L2_cache_size), bandwidth_bps=float(bandwidth),
        max_shared_per_block=int(getattr(props, "shared_memory_per_block_optin", d.max_shared_per_block)),
        shared_per_sm=int(getattr(props, "shared_memory_per_multiprocessor", d.shared_per_sm)),
        max_threads_per_sm=int(getattr(props, "max_threads_per_multi_processor", d.max_threads_per_sm)),
        integrated=bool(getattr(props, "is_integrated", False)), measured=False,
    )


def current_hardware() -> Hardware:
    """The current CUDA device as a `Hardware` (the templates render for it, not for an H200)."""
    return hardware_of(torch.cuda.get_device_properties(torch.cuda.current_device()))


def capture_cards(forward: Callable[[], Any], sample_dir: Path, samples: int = 1,
                  keep: Callable[[str], bool] = lambda op: True) -> list[dict[str, Any]]:
    """Run `forward` under capture; cards as store-like rows with their sample files."""
    from engine.capture.signature import signature_text
    from engine.capture.single import capture_samples

    cards, files = capture_samples(forward, sample_dir, samples, keep=keep, budget_bytes=1 << 33,
                                   path_of=lambda: "model")
    out = []
    for t in cards:
        if keep(t.op) and files.get(t.id):
            out.append({"card_id": t.id, "op": t.op, "signature": t.signature,
                        "signature_text": signature_text(t.signature), "outputs": t.outputs, "bytes": t.bytes,
                        "calls": getattr(t, "calls", 1), "share": 0.0, "samples": files[t.id]})
    return out


def build_cast(forward: Callable[[], Any], out: Path, *, work: Path, mutations: int = 1,
               keep: Callable[[str], bool] = lambda op: True, lane_timing: dict[str, Any] | None = None,
               confirm_timing: dict[str, Any] | None = None, progress: Callable[[str], None] = print,
               model: str = "model") -> dict[str, Any]:
    """Capture, search a little, confirm, write `out`; returns {"included", "excluded", "cards"}."""
    from engine.cards import card_from_row
    from engine.cast.compat import current_env
    from engine.compile import Compiler
    from engine.lane.client import GpuLane, worker_argv
    from engine.lane.evaluate import evaluate
    from engine.propose.builtin import BuiltinProposer

    env = current_env()
    cards = capture_cards(forward, work / "samples", keep=keep)
    proposer = BuiltinProposer()
    hw = current_hardware()
    jobs = []
    for c in cards:
        brief = card_from_row(c)
        template, _ = proposer.template_for(brief, hw=hw)
        if template is None:
            continue
        rng = random.Random(0)
        params = [template.default(brief, hw=hw)]
        for _ in range(mutations * 8):
            if len(params) > mutations:
                break
            p = template.mutate(brief, params[-1], rng, hw=hw)
            if p not in params:
                params.append(p)
        for p in params:
            r = template.render(brief, p, hw=hw)
            jobs.append((c, r, template.name))
    progress(f"{model}: {len(cards)} cards captured, {len(jobs)} builtin candidates for "
             f"{len({j[0]['card_id'] for j in jobs})} of them")
    compiler = Compiler(work / "compile", "nvrtc", arch=env["arch"])

    compiled = [compiler.compile(r.source) for _, r, _ in jobs]  # each candidate's one compile

    async def lane_run() -> list[Any]:
        lane = GpuLane(worker_argv(torch.cuda.current_device()), timeout_s=300)
        await lane.start()
        try:
            evs = []
            for (c, r, _), res in zip(jobs, compiled):
                ref = card_from_row(c).ref(c["samples"])
                evs.append(await evaluate(lane, ref, res, r.spec, timing=lane_timing or {"max_seconds": 0.3}))
            return evs
        finally:
            await lane.close()

    evs = asyncio.run(lane_run())
    best: dict[str, tuple[Any, ...]] = {}
    for (c, r, tname), res, ev in zip(jobs, compiled, evs):
        t = ev.payload.get("timing") if ev.status == "verified" else None
        if not t or not faster_with_confidence(t["speedup_ci"]):
            continue
        us = t["candidate"]["median"]
        if c["card_id"] not in best or us < best[c["card_id"]][0]:
            best[c["card_id"]] = (us, c, r, tname, t, res)
    variants = []
    for us, c, r, tname, t, res in best.values():
        cand = {"id": f"direct-{c['card_id'][:8]}", "source": r.source, "launch_spec": r.spec, "proposer": "builtin",
                "model_name": tname, "intent": r.intent, "params": r.params, "speedup": t["speedup"],
                "speedup_low": t["speedup_ci"][0], "speedup_high": t["speedup_ci"][1],
                "eager_us": t["eager"]["median"], "best_us": us}
        variants.append(ExportVariant(c, cand, res.cubin, res.ptx, env["arch"], c["samples"]))
    progress(f"{model}: {len(variants)} card(s) with a verified lane win; confirming in a fresh process")
    source = {"run": None, "model": model, "provider": "builtin (direct)"}
    excluded = []
    with tempfile.TemporaryDirectory(prefix="kforge-direct-") as tmp:
        cand_path = Path(tmp) / "candidate.cast"
        manifest, files, report = package(variants, env, source)
        write_cast(cand_path, manifest, files, report)
        results = run_confirm(cand_path, {v.vid: v.samples for v in variants}, confirm_timing or {"max_seconds": 0.5},
                              Path(tmp))
    kept = []
    for v in variants:
        r = results["variants"].get(v.vid, {})
        if r.get("ok"):
            v.confirmed = {k: r.get(k) for k in CONFIRMED_KEYS}
            kept.append(v)
        else:
            excluded.append({"card_id": v.card["card_id"], "op": v.card["op"], "reason": str(r.get("reason"))})
    manifest, files, report = package(kept, env, source, excluded)
    write_cast(out, manifest, files, report)
    progress(f"{model}: wrote {out} with {len(kept)} variant(s); {len(excluded)} left out after confirmation")
    return {"included": [{"id": v.vid, "op": v.card["op"], **(v.confirmed or {})} for v in kept],
            "excluded": excluded, "cards": len(cards)}
