"""Helpers for GPU tests: make a real card (captured on the GPU, samples on disk) and run candidates
through a real lane. Used by the GPU-marked tests; importing it needs no GPU."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch


def make_card(tmp_path: Path, fn: Callable[[], Any], samples: int = 2):
    """Run `fn` `samples` times under capture (it must make exactly one card) and return its CardRef."""
    from engine.capture.single import capture_card

    return capture_card(tmp_path, fn, samples)


def twin_ref(ref):
    """The channels-last twin of a captured card (engine.capture.twins), sharing its samples."""
    import dataclasses

    from engine.capture.twins import twin_of

    twin = twin_of(dataclasses.replace(brief_of(ref), samples=len(ref.samples)))
    assert twin is not None, f"{ref.op} {ref.signature} has no channels-last twin"
    return dataclasses.replace(ref, card_id=twin.card_id, signature=twin.signature, outputs=twin.outputs)


def brief_of(ref) -> Any:
    """The OperatorCard a proposer sees for a CardRef."""
    from engine.capture.signature import signature_text
    from engine.cards import OperatorCard

    return OperatorCard(ref.card_id, ref.op, ref.signature, signature_text(ref.signature), ref.outputs,
                     bytes=ref.bytes)


def evaluate_many(jobs: Sequence[tuple[Any, str, str]], *, cache_dir: Path, timing: dict | None = None,
                  timeout_s: float | None = None, copies: dict[str, Any] | None = None) -> list[Any]:
    """Evaluate (CardRef, source, spec) jobs in one real lane; returns engine.lane.evaluate.Evaluation list.
    `copies`: filled with {card_id: the lane's copy of the card's bytes, its payload or {'error'}}, timed in
    the same lane after the jobs (the bandwidth a memory-bound kernel is held to)."""
    from engine.compile import Compiler
    from engine.lane.client import GpuLane, worker_argv
    from engine.lane.eager import measure_copy
    from engine.lane.evaluate import evaluate

    compiler = Compiler(cache_dir, "nvrtc", arch="sm_{}{}".format(*torch.cuda.get_device_capability()))

    async def run() -> list[Any]:
        lane = GpuLane(worker_argv(torch.cuda.current_device()), timeout_s=120)
        await lane.start()
        try:
            evs = [await evaluate(lane, card, compiler.compile(src), spec, timing=timing or {"max_seconds": 1.0},
                                  timeout_s=timeout_s) for card, src, spec in jobs]
            if copies is not None:
                refs = {card.card_id: card for card, _, _ in jobs}
                try:
                    copies.update(await measure_copy(lane, list(refs.values())))
                except Exception as e:  # noqa: BLE001 - the copy is printed beside the kernels, never a failure
                    copies.update({cid: {"error": f"{type(e).__name__}: {e}"} for cid in refs})
            return evs
        finally:
            await lane.close()

    return asyncio.run(run())


def template_walk(template: Any, card: Any, mutations: int, seed: int = 0,
                  extra: tuple[dict[str, Any], ...] = ()) -> list[dict[str, Any]]:
    """A template's default, then up to `mutations` distinct seeded neighbours (a walk, as the search
    takes), then the default with each of `extra` applied."""
    import random

    rng = random.Random(seed)
    params = template.default(card)
    out = [params]
    for _ in range(mutations * 8):
        if len(out) > mutations:
            break
        params = template.mutate(card, params, rng)
        if params not in out:
            out.append(params)
    for e in extra:
        p = {**template.default(card), **e}
        if p not in out:
            out.append(p)
    return out


def evaluate_cases(tmp_path: Path, by_name: dict[str, Any],
                   cases: Sequence[tuple[str, str, Callable[[], Any], dict[str, Any]]],
                   timing: dict | None = None) -> None:
    """Capture each case's card, render its candidates, evaluate them all in ONE lane (lane start-up is
    paid once per test), print speedups, and fail listing every candidate that did not verify."""
    jobs, labels, failures = [], [], []
    for i, (label, name, fn, opts) in enumerate(cases):
        ref = make_card(tmp_path / f"card{i}", fn, samples=opts.get("samples", 2))
        if opts.get("twin"):
            ref = twin_ref(ref)
        card = brief_of(ref)
        t = by_name[name]
        assert card.op in t.ops, f"{label}: captured {card.op}, which {name} does not handle"
        why = t.accepts(card)
        if why is not None:
            failures.append(f"{label}: {card.op} {card.signature_text}: declined: {why}")
            continue
        seen = set()
        for p in template_walk(t, card, opts.get("mutations", 3), 0, opts.get("extra", ())):
            r = t.render(card, p)
            if r.source + r.spec not in seen:  # equal kernels and launches: evaluate once
                seen.add(r.source + r.spec)
                jobs.append((ref, r.source, r.spec))
                labels.append((f"{label}: {card.op} {card.signature_text}", r))
    copies: dict[str, Any] = {}
    evs = evaluate_many(jobs, cache_dir=tmp_path / "compile", timing=timing, copies=copies)
    last = None
    for (label, r), ev, (ref, _, _) in zip(labels, evs, jobs):
        copy_us = ((copies.get(ref.card_id) or {}).get("copy") or {}).get("median")
        if label != last:
            got = copies.get(ref.card_id) or {}
            print(f"\n{label}" + (f" (the lane's copy of its {got.get('bytes', 0) / 1e6:.0f} MB: {copy_us:.1f} us)"
                                   if copy_us else f" (the lane's copy: {got.get('error', 'not timed')})"))
            last = label
        tm = ev.payload.get("timing") or {}
        eager = (tm.get("eager") or {}).get("median")
        mine = (tm.get("candidate") or {}).get("median")
        beside = (tm.get("eager_beside") or {}).get("median")
        times = (f" (eager {eager:.1f} us, ours {mine:.1f} us, alone {ev.payload.get('eager_alone_us') or 0:.1f}"
                 + (f", beside {beside:.1f} CORRECTED" if beside else "")
                 + f", late rounds {tm.get('starved', 0)}, lead {tm.get('lead_us', 0):.0f} us)") if eager and mine else ""
        speed = f" {ev.speedup:.2f}x" if ev.speedup else ""
        if mine and copy_us:
            speed += f", {100 * copy_us / mine:.0f} % of copy bandwidth"
        print(f"  {r.intent}: {ev.status}{speed}{times}" + ("" if ev.status == "verified" else
                                                           f" [{ev.category}] {ev.message[:400]}"))
        if ev.status != "verified":
            failures.append(f"{label} {r.params}: {ev.category}: {ev.message[:400]}")
    assert not failures, "\n".join(failures)
