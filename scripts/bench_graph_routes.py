"""Whole-model eager forwards with graph routes on chosen modules (engine/cast/graphs.py), against eager.

    python scripts/bench_graph_routes.py --out OUT --model configs/models/gemma4_e2b.toml \\
        --modules 'DecoderLayer$' [--cast CAST] [--small]

`--modules`: a regular expression searched in each module's class name and path; the outermost matching
modules are routed. `--modules auto`: the model's own class (its whole forward), then its repeated classes
that hold submodules (decoder layers, blocks, attention), largest first, each its own trial (`--tries`,
default 3). `--cast`: a cast installed in both arms (its module and op cards then run inside the captured graphs where they are proven for CUDA graphs, and in eager's arm as usual), so the comparison is
the graph routes' own gain. Both arms are timed in their steady state (engine.bench.forward.time_steady),
alternating, until the CI is 0.02 wide or --max-s. The output must equal eager's bit for bit (a replay runs
eager's own kernels); the report says where it does not. Writes OUT/bench_graph_routes.json and .md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


# Where the model runs: "cuda" for every measurement. A test sets "cpu" and a stand-in for torch.cuda.graph
# (BACKEND) to drive the script's flow (trials, report) without a GPU; what it times there measures nothing.
DEVICE = "cuda"
BACKEND: Any = None


def timed(run: Any) -> float:
    """µs of a call made right after an untimed call of it, in the arm's state (its steady state, as a model in
    use runs; engine.bench.forward.time_steady says why): CUDA events on the GPU, the wall clock elsewhere."""
    from engine.bench.forward import time_steady

    return time_steady(run, DEVICE)


def log(msg: str) -> None:
    print(f"[bench_graph_routes {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def report(doc: dict[str, Any]) -> str:
    lines = [f"# bench_graph_routes: {doc['model']}", "",
             f"{doc.get('gpu', '?')}, torch {doc.get('torch', '?')}, {doc.get('date', '')}; modules /{doc['modules']}/"
             + (f"; cast {doc['cast']} in both arms" if doc.get("cast") else ""), ""]
    if "error" in doc:
        lines += [f"error: {doc['error']}", ""]
    for t in doc.get("trials", []):
        lines += [f"## /{t['modules_re']}/", ""]
        if "error" in t:
            lines += [f"error: {t['error']}", ""]
        if "speedup" in t:
            lines += ["| arm | ms | speedup (95 % CI) |", "|---|---:|---|",
                      f"| eager{' + cast' if doc.get('cast') else ''} | {t['base_ms']:.2f} | 1 |",
                      f"| + graph routes | {t['routed_ms']:.2f} | {t['speedup']:.3f} ({t['speedup_ci'][0]:.3f}–"
                      f"{t['speedup_ci'][1]:.3f}) |", ""]
        if "equal" in t:
            lines += [f"Output against eager's: {'bit for bit equal' if t['equal'] else 'DIFFERENT'}"
                      + (f"; {t['forwards']} forwards per arm." if "forwards" in t else "."), ""]
        if t.get("why"):
            lines += [f"Not kept: {t['why']}.", ""]
        st = t.get("routes", {})
        if st:
            lines += [f"{len(st)} module(s) routed, {t.get('replaying', 0)} replaying.", "",
                      "| module | captured | replays | eager calls | declines | refused |", "|---|---:|---:|---:|---|---|"]
            for path, v in st.items():
                dec = ", ".join(f"{k} ×{n}" for k, n in v["declines"].items()) or "–"
                ref = "; ".join(v["refused"].values()) or "–"
                lines.append(f"| {path or '(the whole model)'} | {v['captured']} | {v['replays']} | {v['eager_calls']} | {dec} | {ref} |")
            lines.append("")
        if t.get("skipped"):
            lines += ["Skipped: " + "; ".join(f"{p} ({w})" for p, w in t["skipped"].items()), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--model", required=True, help="a model config (configs/models/*.toml or a user config)")
    ap.add_argument("--modules", required=True,
                    help="regex searched in class names and paths, or 'auto': the model's own class, then its "
                         "repeated classes with submodules, largest first, one trial each (--tries)")
    ap.add_argument("--tries", type=int, default=3, help="with --modules auto: classes tried at most (default 3)")
    ap.add_argument("--cast", type=Path, help="a cast installed in both arms")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--precision", type=float, default=0.02)
    ap.add_argument("--max-s", type=float, default=30.0)
    args = ap.parse_args(argv)
    try:
        pat = re.compile(args.modules) if args.modules != "auto" else None
    except re.error as e:
        print(f"error: --modules {args.modules!r}: not a regular expression ({e}); pass e.g. 'DecoderLayer$'",
              file=sys.stderr)
        return 2
    if args.cast is not None and not args.cast.is_file():
        print(f"error: --cast {args.cast}: no such file; pass a .cast written by `kforge-tui export`", file=sys.stderr)
        return 2
    from engine.bench.cli import gpu_missing
    from engine.config import build_target, config_or_error

    config, why = config_or_error(args.model, args.small)
    why = why or gpu_missing("bench_graph_routes", DEVICE)
    if why:
        print(why, file=sys.stderr)
        return 2
    import torch

    from engine.cast.graphs import GraphSet
    from engine.models.forwards import output_tensor

    args.out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else f"{DEVICE} (a control-flow test, not a measurement)"
    doc: dict[str, Any] = {"model": args.model, "modules": args.modules, "gpu": gpu,
                           "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M"),
                           **({"cast": str(args.cast)} if args.cast else {})}

    def save() -> None:
        (args.out / "bench_graph_routes.json").write_text(json.dumps(doc, indent=1, default=str))
        (args.out / "bench_graph_routes.md").write_text(report(doc))

    log(f"building {args.model}")
    target = build_target(config, torch.device(DEVICE))
    model, forward = target.module, target.forward
    if pat is None:
        from engine.cast.graphs import route_candidates

        names = route_candidates(model)[:max(1, args.tries)]
        from engine.export.graph_check import class_is

        selects = [(f"^{n}$", class_is(n)) for n in names]
        doc["candidates"] = names
    else:
        selects = [(args.modules, lambda path, m: bool(pat.search(type(m).__name__) or pat.search(path)))]
    if not selects or not GraphSet(model, selects[0][1], BACKEND).routes:
        doc["error"] = f"no module's class name or path matches /{args.modules}/"
        save()
        print(f"error: --modules {args.modules!r}: no module of the model matches; classes are e.g. "
              f"{', '.join(sorted({type(m).__name__ for m in model.modules()})[:12])}", file=sys.stderr)
        return 2
    cast_cm: Any = contextlib.nullcontext()
    if args.cast is not None:
        from engine.cast.loader import load

        cast = load(args.cast)
        cast_cm = cast.enabled(model)
    from engine.export.graph_check import trial

    doc["trials"] = []
    with torch.no_grad(), cast_cm:
        for _ in range(3):
            forward()
        want = output_tensor(forward()).clone()
        for name, select in selects:
            log(f"/{name}/: routing and timing")
            try:
                t = trial(model, forward, select, want, timed, args.precision, args.max_s, BACKEND)
            except Exception as e:  # one trial failing is reported, the others still run
                t = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            doc["trials"].append({"modules_re": name, **t})
            log(f"/{name}/: " + (f"{t['speedup']:.3f}x ({t['speedup_ci'][0]:.3f}-{t['speedup_ci'][1]:.3f})"
                                 if "speedup" in t else t.get("why") or t.get("error", "")))
            save()
    save()
    print(report(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
