#!/usr/bin/env python3
"""Time chosen instances of a builtin template on one of bench_builtin's cards, each verified and timed
in a real lane exactly as the search evaluates a candidate (issue 4: what a template's space can reach,
beyond the points a budgeted search happens to visit).

    python scripts/probe_template_params.py --out DIR --case "group_norm fp16 [1,256" \\
        --sweep strategy=cluster cluster=16,8 stash=all,none block=512,1024 \\
        --extra '{"strategy": "split"}'

--case picks the card (a substring of a bench_builtin label). Instances: the template's default with
each combination of the --sweep values (KEY=V1,V2,...; integers where they parse), plus each --extra JSON
object applied to the default. Each is rendered, compiled (NVRTC), verified against eager on the card's
captured samples and A/B-timed against eager (L2 flushed, per-call events) by one lane. Writes
DIR/probe_<slug>.json and .md, fastest first, with the copy floors bench_builtin reports (PyTorch's
clone of the main input, and of 4 bytes). Needs a CUDA GPU.

--twin probes the card's channels-last twin instead (engine.capture.twins: the same samples, the input
channels-last, as torch.compile or a layout route hands it over; eager CUDA GroupNorm cannot take it as
such, so no capture makes it), e.g. the group_norm_cl template's `order`:

    python scripts/probe_template_params.py --out DIR --case "VAE, largest" --twin --sweep order=chunks,sweep
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))



def _value(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


def parse_sweep(items: list[str]) -> dict[str, list[Any]]:
    """KEY=V1,V2 items as {key: [values]}; raises ValueError naming a malformed item."""
    out: dict[str, list[Any]] = {}
    for item in items:
        key, sep, vals = item.partition("=")
        if not sep or not key or not vals:
            raise ValueError(f"--sweep {item!r}: expected KEY=V1,V2,...")
        out[key] = [_value(v) for v in vals.split(",") if v]
    return out


def instances(default: dict[str, Any], sweep: dict[str, list[Any]], extras: list[dict[str, Any]]
              ) -> list[dict[str, Any]]:
    """The default with every sweep combination, then with each extra; no duplicates, in order."""
    out: list[dict[str, Any]] = []
    keys = list(sweep)
    for combo in itertools.product(*(sweep[k] for k in keys)) if keys else [()]:
        p = {**default, **dict(zip(keys, combo))}
        if p not in out:
            out.append(p)
    for e in extras:
        p = {**default, **e}
        if p not in out:
            out.append(p)
    return out


def extra_cases() -> list[Any]:
    """Cards beyond bench_builtin's targets: the SD3.5 VAE's largest group norm (8 MB groups, 6 calls a
    decode, 5.6 % of the sd35_medium config's eager time in its H200 capture)."""
    import torch
    import torch.nn.functional as F
    from bench_builtin import Case

    def vae_gn():
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(1, 128, 1024, 1024, device="cuda", dtype=torch.bfloat16, generator=g) * 0.7 + 0.2
        w = torch.randn(128, device="cuda", dtype=torch.bfloat16, generator=g) * 0.2 + 1
        b = torch.randn(128, device="cuda", dtype=torch.bfloat16, generator=g) * 0.1
        return (lambda: F.group_norm(x, 32, w, b, 1e-6)), x

    return [Case("group_norm bf16 [1,128,1024,1024] g32 (SD3.5 VAE, largest)", vae_gn, "–")]


def all_cases(builtin: list[Any]) -> list[Any]:
    """bench_builtin's cards, then the extra ones it does not have (by label: it took the VAE's largest group
    norm in since, and a --case naming it matched both)."""
    have = {c.label for c in builtin}
    return builtin + [c for c in extra_cases() if c.label not in have]


def twin_ref(ref: Any) -> Any:
    """The channels-last twin of a captured card (a CardRef), sharing its sample files; exits with one line
    where the card has none."""
    from engine.capture.signature import signature_text
    from engine.capture.twins import twin_of
    from engine.cards import CardRef, OperatorCard

    card = OperatorCard(ref.card_id, ref.op, ref.signature, signature_text(ref.signature), ref.outputs,
                        bytes=ref.bytes, samples=len(ref.samples))
    twin = twin_of(card)
    if twin is None:
        raise SystemExit(f"error: --twin: {ref.op} {card.signature_text} has no channels-last twin "
                         "(engine.capture.twins: a contiguous 4-D or 5-D input of a twinned op); drop --twin")
    return CardRef(twin.card_id, twin.op, twin.signature, twin.outputs, ref.bytes, list(ref.samples))


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:60]


async def probe(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from engine.capture.signature import signature_text
    from engine.capture.single import capture_card
    from engine.cards import OperatorCard
    from engine.compile import Compiler
    from engine.lane.client import GpuLane, worker_argv
    from engine.lane.evaluate import ensure_loaded, evaluate
    from engine.propose.builtin import BuiltinProposer

    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_builtin import _cases

    cases = [c for c in all_cases(_cases()) if args.case in c.label]
    if len(cases) != 1:
        raise SystemExit(f"error: --case {args.case!r} matches {len(cases)} bench_builtin cards "
                         f"({[c.label for c in cases] or 'none'}); give a substring of exactly one label")
    case = cases[0]
    work = Path(args.workspace)
    fn, x = case.make()
    ref = capture_card(work / "card", fn, samples=2)
    if args.twin:
        ref = twin_ref(ref)
    clone = capture_card(work / "clone", x.clone, samples=1)
    tiny = torch.zeros(1, device="cuda")
    floor = capture_card(work / "tiny", lambda: tiny.clone(), samples=1)
    del fn, x
    torch.cuda.empty_cache()
    brief = OperatorCard(ref.card_id, ref.op, ref.signature, signature_text(ref.signature), ref.outputs, bytes=ref.bytes)
    template = BuiltinProposer().template_for(brief)[0]
    if template is None:
        raise SystemExit(f"error: no builtin template takes {case.label} ({ref.op})")
    todo = instances(template.default(brief), args.sweep, args.extra)
    lane = GpuLane(worker_argv(0), timeout_s=180)
    await lane.start()
    rows: list[dict[str, Any]] = []
    try:
        hello = (await lane.request("hello")).payload
        compiler = Compiler(work / "cache", "nvrtc", arch=hello["arch"])
        floors = {}
        for name, r in (("clone_us", clone), ("floor_us", floor)):
            await ensure_loaded(lane, r)
            got = await lane.request("time_eager", {"card_id": r.card_id})
            floors[name] = got.payload["eager"]["median"] if got.ok else None
        for i, params in enumerate(todo):
            row: dict[str, Any] = {"params": params}
            try:
                rendered = template.render(brief, params)
            except ValueError as e:
                row.update(status="not rendered", message=str(e))
                rows.append(row)
                continue
            ev = await evaluate(lane, ref, compiler.compile(rendered.source), rendered.spec,
                                timing={"max_seconds": args.timing_s})
            row.update(intent=rendered.intent, status=ev.status, category=ev.category,
                       message=ev.message[:300] if ev.status != "verified" else "")
            t = ev.payload.get("timing")
            if ev.status == "verified" and t:
                row.update(eager_us=t["eager"]["median"], us=t["candidate"]["median"], speedup=t["speedup"],
                           speedup_ci=t["speedup_ci"],
                           copy_frac=copy_frac(ref.bytes, t["candidate"]["median"], clone.bytes, floors["clone_us"]))
            rows.append(row)
            mark = f"{row['us']:.2f} µs ({row['speedup']:.2f}x)" if "us" in row else f"{ev.status} [{ev.category}]"
            print(f"[{i + 1}/{len(todo)}] {rendered.intent}: {mark}", file=sys.stderr, flush=True)
    finally:
        await lane.close()
    rows.sort(key=lambda r: r.get("us", float("inf")))
    return {"gpu": hello["name"], "torch": torch.__version__,
            "case": case.label + (" (its channels-last twin)" if args.twin else ""), "target": case.target,
            "min_speedup": case.min_speedup, "template": template.name, "bytes": ref.bytes,
            "clone_bytes": clone.bytes, **floors,
            "rows": rows}


def copy_frac(nbytes: int, us: float, clone_bytes: int, clone_us: float | None) -> float | None:
    """The bandwidth an instance reached as a fraction of the lane's own copy's (PyTorch's clone of the card's
    main input, timed in the same lane the same way): 1.0 moves its bytes as fast as that copy moves its own
    (issue 21; a fixed bandwidth figure rated every card against the H200's copy, on any GPU)."""
    if not us or not clone_us or not clone_bytes:
        return None
    return (nbytes / us) / (clone_bytes / clone_us)


def report(d: dict[str, Any]) -> str:
    lines = [f"# {d['case']}: {d['template']} template instances ({d['gpu']}, torch {d['torch']})", "",
             f"Target: {d['target']}. Each row verified against eager and A/B-timed in the lane (L2 flushed, "
             f"per-call events). PyTorch's clone of the main input: {d['clone_us'] or float('nan'):.2f} µs; "
             f"of 4 bytes (the protocol's floor): {d['floor_us'] or float('nan'):.2f} µs.", "",
             "% of the copy: the instance's bytes over its time, as a fraction of the clone's bytes over the clone's "
             "time (1.0: as fast as PyTorch's own copy on this GPU).", "",
             "| instance | µs | eager µs | speedup (95 % CI) | % of the copy | status |", "|---|---:|---:|---|---:|---|"]
    for r in d["rows"]:
        if "us" in r:
            lo, hi = r["speedup_ci"]
            frac = r.get("copy_frac")
            lines.append(f"| {r['intent']} | {r['us']:.2f} | {r['eager_us']:.2f} | {r['speedup']:.2f}× "
                         f"({lo:.2f}–{hi:.2f}) | {'–' if frac is None else f'{100 * frac:.0f} %'} | verified |")
        else:
            lines.append(f"| {r.get('intent') or json.dumps(r['params'])} | – | – | – | – | {r['status']}"
                         f"{' [' + r['category'] + ']' if r.get('category') else ''} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--case", required=True, help="substring of one bench_builtin card label")
    ap.add_argument("--sweep", nargs="*", default=[], help="KEY=V1,V2,... (the product over all keys)")
    ap.add_argument("--extra", nargs="*", default=[], help="JSON objects of parameters, each one instance")
    ap.add_argument("--timing-s", type=float, default=1.0, help="timing cap per instance (s)")
    ap.add_argument("--twin", action="store_true",
                    help="probe the card's channels-last twin (its input channels-last, the same samples)")
    ap.add_argument("--workspace", default="/tmp/kforge-probe-template")
    args = ap.parse_args()
    try:
        args.sweep = parse_sweep(args.sweep)
        args.extra = [json.loads(e) for e in args.extra]
        if not all(isinstance(e, dict) for e in args.extra):
            raise ValueError("--extra: each value must be a JSON object")
    except (ValueError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("error: probe_template_params needs a CUDA GPU", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    d = asyncio.run(probe(args))
    d["wall_s"] = time.monotonic() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"probe_{slug(d['case'])}"
    (args.out / f"{name}.json").write_text(json.dumps(d, indent=1) + "\n")
    (args.out / f"{name}.md").write_text(report(d))
    print(report(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
