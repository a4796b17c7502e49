#!/usr/bin/env python3
"""Where a cast costs time under torch.compile when it should cost nothing: the model compiled alone, compiled
with the cast's module routes installed (plain torch.compile), compiled through the cast's backend without
its routes, and both (what bench_compose's cast arm runs). On the H200 the Gemma 4 E2B cast, none of whose
variants is proven for compile, ran at 0.93x of torch.compile alone with 0 hits (docs/results/reproduce-h200/
2026-12-02c); this separates the routes from the backend.

    python scripts/probe_compose_overhead.py --model configs/models/gemma4_e2b.toml --cast FILE --out DIR
                                             [--mode default|reduce-overhead|max-autotune-no-cudagraphs] [--iters N]

Each arm is its own compiled function, compiled from fresh Inductor and Triton caches; all arms alternate
forward by forward in a rotating order (medians, paired 95 % CIs against torch.compile alone). Per arm: the
graphs Dynamo compiled and its graph breaks (torch._dynamo counters over the arm's first call), the cast's
hits per forward. Writes DIR/compose_overhead.json and DIR/compose_overhead.md; progress on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (arm, compiled through the cast's backend, the cast's module routes installed while it runs, own code): an arm
# with its own code object has its own Dynamo cache; the two "shared" arms compile the one function, as
# bench_compose's torch.compile and cast arms do (Dynamo then checks both arms' entries on each call).
ARMS = (("torch.compile", False, False, True), ("torch.compile, routes installed", False, True, True),
        ("cast backend, no routes", True, False, True), ("cast backend + routes", True, True, True),
        ("shared code: torch.compile", False, False, False), ("shared code: cast backend + routes", True, True, False))


def own_code(forward, name: str):
    """A function calling `forward` whose code object is its own (Dynamo keys its cache by code object)."""
    return eval(compile("lambda: forward()", f"<probe arm {name}>", "eval"), {"forward": forward})  # noqa: S307


def log(msg: str) -> None:
    print(f"[probe_compose_overhead {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a config, CONFIG@key=value,... as bench_compose takes it")
    ap.add_argument("--cast", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--mode", default="default", choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs"))
    ap.add_argument("--iters", type=int, default=30, help="forwards per arm")
    args = ap.parse_args(argv)
    if not args.cast.is_file():
        print(f"error: --cast {args.cast}: no such file; pass the .cast an export wrote", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("error: probe_compose_overhead: no CUDA GPU is visible", file=sys.stderr)
        return 2
    from torch._dynamo.utils import counters

    from engine.bench.forward import time_forward
    from engine.bench.stats import speedup_ci
    from engine.cast.loader import load
    from engine.config import build_target, load_config, override_params, parse_model_spec
    from scripts.bench_compose import fresh_caches

    spec = parse_model_spec(args.model)
    config = override_params(load_config(spec.name), spec.params)
    target = build_target(config, torch.device("cuda"))
    model, forward = target.module, target.forward
    cast = load(args.cast)
    kw = {} if args.mode == "default" else {"mode": args.mode}
    step = torch.compiler.cudagraph_mark_step_begin if args.mode == "reduce-overhead" else (lambda: None)
    caches = Path(tempfile.mkdtemp(prefix="kforge-compose-probe-"))
    args.out.mkdir(parents=True, exist_ok=True)

    def around(routes: bool):
        return cast.enabled(model) if routes else cast.enabled()

    fns: dict[str, tuple] = {}
    doc: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "model": args.model,
                 "cast": str(args.cast), "mode": args.mode, "iters": args.iters, "arms": {}}
    with torch.no_grad():
        for _ in range(3):
            forward()
        torch._dynamo.reset()
        for name, through_cast, routes, own in ARMS:
            fresh_caches(caches, name.replace(" ", "_").replace(",", ""))
            before = (counters["stats"]["unique_graphs"], sum(counters["graph_break"].values()))
            with around(routes) if (through_cast or routes) else contextlib.nullcontext():
                f = own_code(forward, name) if own else forward
                fn = cast.compile(f, **kw) if through_cast else torch.compile(f, **kw)
                t0 = time.perf_counter()
                step()
                fn()
                torch.cuda.synchronize()
                compile_s = time.perf_counter() - t0
            fns[name] = (fn, through_cast or routes, routes)
            doc["arms"][name] = {"compile_s": compile_s,
                                 "graphs": counters["stats"]["unique_graphs"] - before[0],
                                 "graph_breaks": sum(counters["graph_break"].values()) - before[1]}
            log(f"{name}: compiled in {compile_s:.1f} s, {doc['arms'][name]['graphs']} graph(s), "
                f"{doc['arms'][name]['graph_breaks']} break(s)")
        doc["graph_breaks"] = {str(k): v for k, v in counters["graph_break"].items()}
        names = [a[0] for a in ARMS]
        samples: dict[str, list[float]] = {n: [] for n in names}
        for i in range(args.iters + 1):  # the first round warms every arm up and is dropped
            k = i % len(names)
            for name in names[k:] + names[:k]:
                fn, enable, routes = fns[name]
                with around(routes) if enable else contextlib.nullcontext():
                    if name == names[-1] and i == 1:
                        cast.reset_stats()
                    step()
                    t = time_forward(fn)
                    if name == names[-1] and i == 1:
                        doc["hits_per_forward"] = sum(v["hits"] for v in cast.stats()["variants"])
                if i:
                    samples[name].append(t)
    base = samples[names[0]]
    for name in names:
        est = speedup_ci(base, samples[name], paired=True)
        doc["arms"][name].update({"ms": statistics.median(samples[name]) / 1e3, "vs_alone": est.speedup,
                                  "vs_alone_ci": [est.low, est.high]})
        log(f"{name}: {doc['arms'][name]['ms']:.2f} ms ({est.speedup:.3f}x of torch.compile alone, "
            f"{est.low:.3f}-{est.high:.3f})")
    (args.out / "compose_overhead.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Compose overhead probe: {args.model}, torch.compile {args.mode}", "",
             f"{doc['gpu']}, torch {doc['torch']}; cast `{args.cast}`; {args.iters} forwards per arm, alternated; "
             f"speedup = torch.compile alone / arm (medians, paired bootstrap 95 % CI). The cast's hits per "
             f"forward in the last arm: {doc.get('hits_per_forward', '–')}.", "",
             "| arm | ms | × torch.compile alone (95 % CI) | compile s | graphs | graph breaks |",
             "|---|---:|---|---:|---:|---:|"]
    for name in names:
        a = doc["arms"][name]
        lines.append(f"| {name} | {a['ms']:.2f} | {a['vs_alone']:.3f} ({a['vs_alone_ci'][0]:.3f}–"
                     f"{a['vs_alone_ci'][1]:.3f}) | {a['compile_s']:.1f} | {a['graphs']} | {a['graph_breaks']} |")
    if doc["graph_breaks"]:
        lines += ["", "Graph breaks (all arms): " + "; ".join(f"{k} ×{v}" for k, v in doc["graph_breaks"].items())]
    (args.out / "compose_overhead.md").write_text("\n".join(lines) + "\n")
    log(f"wrote {args.out / 'compose_overhead.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
