"""Greedy decoding, per token: eager against graph routes that take a static cache as a state object
(engine/cast/graphs.py, `states=True`, opt-in), against a cast installed in eager (--cast), and on a GPU against
what transformers does by default with a static cache; alternating whole generate() calls, and whether the
tokens are the same.

    python scripts/bench_decode.py --out OUT --model configs/models/qwen35_a3b.toml [--modules auto|REGEX]
        [--prompt 128] [--tokens 64] [--rounds 5] [--small] [--cache static|dynamic] [--cast FILE]
        [--no-routes] [--no-compiled]

The model is the config's (random weights); the prompt is random token ids. Every arm calls
`model.generate(ids, max_new_tokens=N, do_sample=False)`, with `cache_implementation="static"` under
--cache static (the default) and transformers' own default cache (a DynamicCache) under --cache dynamic:
- eager, routed and cast pass `disable_compile=True`. Without it, transformers compiles the decoding forward
  with torch.compile whenever the cache is static and the model is on a GPU (`_valid_auto_compile_criteria`):
  Dynamo then traces the layers, no route is called, and "eager" is not eager (the first run on the H200,
  2026-12-04d, found no class replaying for that reason);
- routed (static cache only: a growing cache declines every route) routes the model's repeated classes that
  hold submodules (`--modules auto`: the first of them that replays, the decoder layers on an LLM), with the
  cache a state object: keyed by identity and by the addresses of its tensors, which the graphs read and
  write in place; each capture is checked against its eager call, output and cache alike. Prefill runs
  eagerly (a lazily allocated cache changes on its first call). Each class tried is recorded with why it did
  not replay;
- cast (--cast FILE): eager generate() with the cast installed, its hits per generate() recorded. A cast
  captured from a prefill has no card of decoding's shapes; one exported from a decoding-step config
  (configs/examples/*_decode.toml, engine/models/decode.py) has;
- compiled (static cache on a GPU, unless --no-compiled) is transformers' own compile of the decoding forward,
  warmed up by one generate() before timing (its compile time is recorded): the reference a user of a static
  cache already has.
ms per token: the difference between generate() of N and of 1 new token, divided by N - 1, medians over the
rounds. Writes OUT/bench_decode.json and .md. Not a measurement off the GPU (`DEVICE` "cpu" in tests: the
control flow only).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEVICE = "cuda"
TRIAL_TOKENS = 4  # a class's trial: the prefill, a decode step run eagerly, one captured, one replayed
BACKEND: Any = None  # a test's stand-in for torch.cuda.graph


def log(msg: str) -> None:
    print(f"[bench_decode {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def seconds(run: Any) -> float:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    run()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def report(doc: dict[str, Any]) -> str:
    lines = [f"# bench_decode: {doc['model']}", "",
             f"{doc.get('gpu', '?')}, torch {doc.get('torch', '?')}, transformers {doc.get('transformers', '?')}, "
             f"{doc.get('date', '')}; prompt {doc['prompt']} "
             f"tokens, {doc['tokens']} new, {doc.get('cache', 'static')} KV cache, greedy", ""]
    trials = [f"- {name}: {t['replaying']} of {t['modules']} replaying; declines {t['declines'] or '–'}; "
              f"refused {'; '.join(t['refused']) or '–'}; eager calls {t['eager_calls']}"
              for name, t in doc.get("trials", {}).items() if not t["replaying"]]
    if trials:
        lines += ["Classes tried that did not replay:", "", *trials, ""]
    if "error" in doc:
        return "\n".join(lines + [f"error: {doc['error']}", ""])
    arms = doc.get("arms")
    if not arms:  # saved before the timing ended (a run cut short keeps what it found)
        return "\n".join(lines + ["Timing not finished.", ""])
    label = {"eager": "eager",
             "routed": f"graph routes ({doc.get('routed_class')})",
             "cast": f"eager + cast ({'installed' if doc.get('cast_installed') else 'NOT installed'}; "
                     f"{doc.get('cast_hits_per_generate', 0)} hits per generate())",
             "compiled": f"transformers' compiled decoding (its default here; compiled in {doc.get('compile_s', 0):.0f} s)"}
    same = {"eager": "–", "routed": doc.get("same_tokens"), "cast": doc.get("cast_same_tokens"),
            "compiled": doc.get("compiled_same_tokens")}
    lines += ["| arm | ms per token | × eager | generate() of all tokens, ms | tokens as eager's |",
              "|---|---:|---:|---:|---|"]
    for arm in arms:
        x = doc.get(f"{arm}_speedup", 1.0)
        lines.append(f"| {label[arm]} | {doc[f'{arm}_ms_per_token']:.3f} | {x:.2f}× | {doc[f'{arm}_ms']:.1f} | "
                     f"{same[arm]} |")
    lines.append("")
    if "speedup_vs_compiled" in doc:
        lines += [f"Graph routes against transformers' compiled decoding: **{doc['speedup_vs_compiled']:.2f}×**.", ""]
    if doc.get("routes_error"):
        lines += [f"Graph routes: {doc['routes_error']}.", ""]
    if "routes" in doc:
        r = doc["routes"]
        lines += [f"Routes: {r['modules']} module(s), {r['replaying']} replaying, {r['replays']} replays, "
                  f"{r['eager_calls']} eager calls; declines {r['declines'] or '–'}; refused {r['refused'] or '–'}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--model", required=True, help="a model config whose builder gives a transformers causal LM")
    ap.add_argument("--modules", default="auto", help="'auto' (repeated classes, the first that replays) or a "
                                                      "regex of class names")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--cache", choices=("static", "dynamic"), default="static",
                    help="the KV cache generate() uses: static (default; routes and transformers' compiled decoding "
                         "need it) or dynamic (transformers' own default: eager decoding, and the --cast arm)")
    ap.add_argument("--cast", type=Path, help="also time eager generate() with this cast installed (e.g. one "
                                              "exported from a decoding-step config, configs/examples/*_decode.toml)")
    ap.add_argument("--no-routes", action="store_true", help="leave out the graph-route arm")
    ap.add_argument("--no-compiled", action="store_true",
                    help="leave out transformers' compiled decoding (its default with a static cache on a GPU)")
    args = ap.parse_args(argv)
    if args.cast is not None and not args.cast.is_file():
        print(f"error: --cast {args.cast}: no such file; give a .cast written by kforge-tui export", file=sys.stderr)
        return 2
    if args.tokens < 2 or args.prompt < 1 or args.rounds < 1:
        print("error: --tokens must be at least 2, --prompt and --rounds at least 1", file=sys.stderr)
        return 2
    try:
        pat = None if args.modules == "auto" else re.compile(args.modules)
    except re.error as e:
        print(f"error: --modules {args.modules!r}: not a regular expression ({e}); e.g. 'DecoderLayer$'",
              file=sys.stderr)
        return 2
    from engine.bench.cli import gpu_missing
    from engine.config import build_target, config_or_error

    config, why = config_or_error(args.model, args.small)
    why = why or gpu_missing("bench_decode", DEVICE)
    if why:
        print(why, file=sys.stderr)
        return 2
    import torch

    from engine.cast.graphs import GraphSet, repeated_classes
    from engine.export.graph_check import class_is

    args.out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"model": args.model, "prompt": args.prompt, "tokens": args.tokens, "cache": args.cache,
                           "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else f"{DEVICE} (control flow only)",
                           "torch": torch.__version__, "transformers": _version("transformers"),
                           "date": time.strftime("%Y-%m-%d %H:%M"), "trials": {}}

    def save() -> None:
        (args.out / "bench_decode.json").write_text(json.dumps(doc, indent=1, default=str))
        (args.out / "bench_decode.md").write_text(report(doc))

    model = build_target(config, torch.device(DEVICE)).module
    if not hasattr(model, "generate"):
        doc["error"] = f"{type(model).__name__} has no generate(): not a transformers causal LM"
        save()
        print(f"error: --model {args.model}: {doc['error']}", file=sys.stderr)
        return 2
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 1000) or 1000)
    ids = torch.randint(0, min(vocab, 30000), (1, args.prompt), generator=torch.Generator().manual_seed(0)).to(DEVICE)

    cache = {"cache_implementation": "static"} if args.cache == "static" else {}

    def generate(n: int, compiled: bool = False) -> Any:
        return model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, disable_compile=not compiled,
                              **cache)

    compiled_arm = DEVICE == "cuda" and not args.no_compiled and args.cache == "static"

    classes = ([n for n in repeated_classes(model) if pat.search(n)] if pat is not None else repeated_classes(model))
    arms, gs, cast = ["eager"], None, None
    with torch.no_grad():
        want = generate(args.tokens)
        chosen = None
        if args.cache == "static" and not args.no_routes:  # routes take a static cache only (a dynamic one grows)
            for name in classes:
                trial = GraphSet(model, class_is(name), BACKEND, states=True)
                with trial:
                    generate(TRIAL_TOKENS)
                doc["trials"][name] = trial.summary()  # why a class does not replay is kept with the record
                if trial.summary()["replaying"]:
                    chosen, gs = name, trial
                    break
                log(f"{name}: no route replays ({trial.summary()['refused'] or trial.summary()['declines']})")
                save()
            doc["routed_class"] = chosen
            if gs is None:
                doc["routes_error"] = f"no class of {classes[:6]} replays with a static cache"
            else:
                with gs:
                    got = generate(args.tokens)
                doc["same_tokens"] = bool(torch.equal(got, want))
                arms.append("routed")
        if args.cast is not None:
            from engine.cast.loader import load

            cast = load(args.cast)
            with cast.enabled(model):
                doc["cast_installed"] = bool(cast.installed)
                cast.reset_stats()
                got = generate(args.tokens)
                doc["cast_hits_per_generate"] = sum(v["hits"] for v in cast.stats()["variants"])
            doc["cast_same_tokens"] = bool(torch.equal(got, want))
            doc["cast"] = str(args.cast)
            arms.append("cast")
        if len(arms) == 1:
            doc["error"] = doc.get("routes_error") or "nothing to compare with eager"
            save()
            print(report(doc))
            return 0
        if compiled_arm:
            log("transformers' compiled decoding: compiling (one generate() before timing)")
            doc["compile_s"] = seconds(lambda: generate(args.tokens, compiled=True))
            doc["compiled_same_tokens"] = bool(torch.equal(generate(args.tokens, compiled=True), want))
            arms.append("compiled")
        save()
        times: dict[str, list[float]] = {k: [] for arm in arms for k in (arm, arm + "1")}
        around = {"routed": gs, "cast": cast}
        for r in range(args.rounds):
            for arm in (arms if r % 2 == 0 else arms[::-1]):
                if arm in around:
                    around[arm].install(model) if arm == "cast" else around[arm].install()
                times[arm].append(seconds(lambda arm=arm: generate(args.tokens, compiled=arm == "compiled")))
                times[arm + "1"].append(seconds(lambda arm=arm: generate(1, compiled=arm == "compiled")))
                if arm in around:
                    around[arm].remove()
        if gs is not None:
            gs.reset_counters()
            with gs:
                generate(args.tokens)
            doc["routes"] = gs.summary()
    med = statistics.median
    for arm in arms:
        doc[f"{arm}_ms"] = med(times[arm]) * 1e3
        doc[f"{arm}_ms_per_token"] = max(1e-6, med(times[arm]) - med(times[arm + "1"])) * 1e3 / (args.tokens - 1)
    for arm in arms[1:]:
        doc[f"{arm}_speedup"] = doc["eager_ms_per_token"] / doc[f"{arm}_ms_per_token"]
    if "routed" in arms:
        doc["speedup"] = doc["routed_speedup"]
        if compiled_arm:
            doc["speedup_vs_compiled"] = doc["compiled_ms_per_token"] / doc["routed_ms_per_token"]
    doc["arms"] = arms
    save()
    print(report(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
