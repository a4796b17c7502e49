"""Greedy decoding with a static KV cache, eager against graph routes that take the cache as a state object
(engine/cast/graphs.py, `states=True`, opt-in): per-token time of both, alternating whole generate() calls, and
whether the tokens are the same.

    python scripts/bench_decode.py --out OUT --model configs/models/qwen35_a3b.toml [--modules auto|REGEX]
        [--prompt 128] [--tokens 64] [--rounds 5] [--small]

The model is the config's (random weights); the prompt is random token ids. Both arms call
`model.generate(ids, max_new_tokens=N, do_sample=False, cache_implementation="static")`. The routed arm routes
the model's repeated classes that hold submodules (`--modules auto`: the first of them that replays, the
decoder layers on an LLM), with the cache a state object: keyed by identity and by the addresses of its tensors,
which the graphs read and write in place; each capture is checked against its eager call, output and cache
alike. Prefill runs eagerly (a lazily allocated cache changes on its first call). ms per token: the difference
between generate() of N and of 1 new token, divided by N - 1, medians over the rounds. Writes
OUT/bench_decode.json and .md. Not a measurement off the GPU (`DEVICE` "cpu" in tests: the control flow only).
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
BACKEND: Any = None  # a test's stand-in for torch.cuda.graph


def log(msg: str) -> None:
    print(f"[bench_decode {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


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
             f"{doc.get('gpu', '?')}, torch {doc.get('torch', '?')}, {doc.get('date', '')}; prompt {doc['prompt']} "
             f"tokens, {doc['tokens']} new, static KV cache, greedy", ""]
    if "error" in doc:
        return "\n".join(lines + [f"error: {doc['error']}", ""])
    lines += ["| arm | ms per token | generate() of all tokens, ms |", "|---|---:|---:|",
              f"| eager | {doc['eager_ms_per_token']:.3f} | {doc['eager_ms']:.1f} |",
              f"| graph routes ({doc['routed_class'] or 'none'}) | {doc['routed_ms_per_token']:.3f} | "
              f"{doc['routed_ms']:.1f} |", "",
              f"Per token: **{doc['speedup']:.2f}×**; tokens the same as eager's: {doc['same_tokens']}.", "",
              f"Routes: {doc['routes']['modules']} module(s), {doc['routes']['replaying']} replaying, "
              f"{doc['routes']['replays']} replays, {doc['routes']['eager_calls']} eager calls; declines "
              f"{doc['routes']['declines'] or '–'}; refused {doc['routes']['refused'] or '–'}.", ""]
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
    args = ap.parse_args(argv)
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
    doc: dict[str, Any] = {"model": args.model, "prompt": args.prompt, "tokens": args.tokens,
                           "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else f"{DEVICE} (control flow only)",
                           "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M")}

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

    def generate(n: int) -> Any:
        return model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              cache_implementation="static")

    classes = ([n for n in repeated_classes(model) if pat.search(n)] if pat is not None else repeated_classes(model))
    with torch.no_grad():
        want = generate(args.tokens)
        chosen, gs = None, None
        for name in classes:
            trial = GraphSet(model, class_is(name), BACKEND, states=True)
            with trial:
                generate(3)
            if trial.summary()["replaying"]:
                chosen, gs = name, trial
                break
            log(f"{name}: no route replays ({trial.summary()['refused'] or trial.summary()['declines']})")
        doc["routed_class"] = chosen
        if gs is None:
            doc["error"] = f"no class of {classes[:6]} replays with a static cache"
            save()
            print(report(doc))
            return 0
        with gs:
            got = generate(args.tokens)
        doc["same_tokens"] = bool(torch.equal(got, want))
        times: dict[str, list[float]] = {"eager": [], "routed": [], "eager1": [], "routed1": []}
        for r in range(args.rounds):
            for arm in (("eager", "routed") if r % 2 == 0 else ("routed", "eager")):
                if arm == "routed":
                    gs.install()
                times[arm].append(seconds(lambda: generate(args.tokens)))
                times[arm + "1"].append(seconds(lambda: generate(1)))
                if arm == "routed":
                    gs.remove()
        gs.reset_counters()
        with gs:
            generate(args.tokens)
        doc["routes"] = gs.summary()
    med = statistics.median
    for arm in ("eager", "routed"):
        doc[f"{arm}_ms"] = med(times[arm]) * 1e3
        doc[f"{arm}_ms_per_token"] = max(1e-6, med(times[arm]) - med(times[arm + "1"])) * 1e3 / (args.tokens - 1)
    doc["speedup"] = doc["eager_ms_per_token"] / doc["routed_ms_per_token"]
    save()
    print(report(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
