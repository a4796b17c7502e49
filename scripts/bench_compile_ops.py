#!/usr/bin/env python3
"""torch.compile beside eager, per card and for the whole model, with the lane's timing protocol.

    python scripts/bench_compile_ops.py --workspace WS --out compile.json [--cards N] [--no-model]
                                        [--model-timeout SECONDS]

For the cards of the workspace's latest run that have a verified candidate (the ones a cast could win),
the op is called on its first captured sample eagerly and through `torch.compile(mode=
"max-autotune-no-cudagraphs")`, alternated, L2 flushed, GPU kept busy before each call (engine.bench):
medians in µs. Then the whole model of the run's config, eager against torch.compile, forward latency
with CUDA events. Writes one JSON document. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from engine.bench.compiled import MODE  # noqa: E402  (the run's compile reference uses the same mode)


def log(msg: str) -> None:
    print(f"[bench_compile_ops {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def won_cards(ws: Path, limit: int) -> tuple[dict, list[dict]]:
    from engine.store import open_readonly, read

    db = open_readonly(ws / "kforge.db")
    try:
        run = read.latest_run(db)
        cap = read.capture(db, run["capture_id"])
        verified = {c["card_id"] for c in read.candidates(db, run["id"]) if c["status"] == "verified"}
        rows = [c for c in read.cards_of_capture(db, run["capture_id"]) if c["card_id"] in verified][:limit]
        cards = []
        for r in rows:
            paths = read.sample_paths(db, run["capture_id"], r["card_id"])
            if paths:
                cards.append({"card_id": r["card_id"], "op": r["op"], "share": r["share"], "sample": str(ws / paths[0]),
                              "signature": r["signature"]})
    finally:
        db.close()
    return cap, cards


def _eager(c: dict):
    """The card's eager as a function of its bound arguments: its op, or for a chain card run_chain."""
    from engine.bench.floor import CHAIN_OP
    from engine.ops import call_op, resolve_op
    from engine.verify.pipeline import chain_eager

    if c["op"] == CHAIN_OP:
        sig = c["signature"]
        return chain_eager(json.loads(sig) if isinstance(sig, str) else sig)
    op = resolve_op(c["op"])
    return lambda b: call_op(op, b)


def per_op(cards: list[dict]) -> list[dict]:
    """Each card's eager against its torch.compile (engine.bench.compiled, as the run's lane compiles it),
    alternated (A/B) on its first sample. A run's cards carry the lane's own measurement (compile_us)."""
    from engine.bench.compiled import compile_eager
    from engine.bench.timing import L2Flusher, TimingConfig, ab_time
    from engine.capture.samples import load_sample

    device = torch.device("cuda", torch.cuda.current_device())
    flush = L2Flusher(device)
    cfg = TimingConfig(max_seconds=0.5)
    out = []
    for c in cards:
        bound = load_sample(c["sample"], device).args
        r = {"card_id": c["card_id"], "op": c["op"]}
        try:
            eager = _eager(c)
            torch._dynamo.reset()
            compiled = compile_eager(eager, bound, MODE)
            compiled(bound)  # compile (autotune) outside the timing
            ab = ab_time(lambda e=eager, b=bound: e(b), lambda f=compiled, b=bound: f(b), flush, cfg)
            r.update(eager_us=ab.eager.median, compile_us=ab.candidate.median, compile_speedup=ab.speedup)
        except Exception as e:  # an op torch.compile cannot take is reported, not fatal
            r["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        log(f"{c['op']} {c['card_id'][:8]}: {r}")
        out.append(r)
    return out


def whole_model(config_path: str, small: bool, iters: int = 10, mode: str = MODE) -> dict:
    from engine.bench.forward import time_steady
    from engine.config import build_target, load_config

    target = build_target(load_config(config_path, small=small), torch.device("cuda"))
    forward = target.forward

    def time_forward(f) -> float:  # ms
        return time_steady(f) / 1e3  # right after an untimed call of itself

    with torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(forward, mode=mode)  # the closure that calls the model: Dynamo traces into it
        try:
            t0 = time.perf_counter()
            compiled()
            compile_s = time.perf_counter() - t0
            eager, comp = [], []
            for i in range(iters):
                for arm in (("eager", "compile") if i % 2 == 0 else ("compile", "eager")):
                    (eager if arm == "eager" else comp).append(time_forward(forward if arm == "eager" else compiled))
        except Exception as e:  # a model torch.compile cannot take is reported, not fatal
            return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return {"eager_ms": statistics.median(eager), "compile_ms": statistics.median(comp),
            "compile_seconds": compile_s, "iters": iters, "mode": mode}


def whole_model_in_child(config_path: str, small: bool, timeout_s: float, mode: str = MODE) -> dict:
    """whole_model() in a child process, so that a compile which outlasts `timeout_s` (max-autotune of a
    large model can take many minutes) is reported as such instead of costing the per-op results."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "whole.json"
        argv = [sys.executable, __file__, "--whole-model-only", config_path, "--out", str(out), "--mode", mode]
        if small:
            argv.append("--small")
        try:
            subprocess.run(argv, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return {"error": f"torch.compile ({mode}) of the whole model did not finish in {timeout_s:.0f} s",
                    "timed_out": True, "mode": mode}
        try:
            return json.loads(out.read_text())
        except (OSError, ValueError):
            return {"error": "the whole-model child process wrote no result (see its stderr above)"}


def whole_model_compiled(config_path: str, small: bool, timeout_s: float, child=None) -> dict:
    """The whole model under torch.compile in MODE; when its autotuning outlasts `timeout_s` (a large LLM's
    many GEMM shapes), in the default mode instead, saying so: a user who cannot wait for max-autotune
    compiles that way, and a number in the default mode says more than none."""
    child = child or whole_model_in_child
    first = child(config_path, small, timeout_s, MODE)
    if not first.get("timed_out"):
        return first
    log(f"whole model: {first['error']}; again in torch.compile's default mode (at most {timeout_s:.0f} s)")
    second = child(config_path, small, timeout_s, "default")
    if "error" in second:
        return {**first, "error": f"{first['error']}; in the default mode: {second['error']}"}
    return {**second, "instead_of": first["error"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cards", type=int, default=40, help="at most this many cards, by share")
    ap.add_argument("--no-model", action="store_true", help="skip the whole-model torch.compile")
    ap.add_argument("--model-timeout", type=float, default=480.0,
                    help="seconds the whole-model compile and timing may take (default 480)")
    ap.add_argument("--model-mode", choices=(MODE, "default"), default=MODE,
                    help=f"torch.compile mode of the whole model (default {MODE}, falling back to 'default' when it "
                         "times out; 'default' skips max-autotune, for models whose autotuning is known to outlast "
                         "the timeout)")
    ap.add_argument("--whole-model-only", metavar="CONFIG", help=argparse.SUPPRESS)  # the child process
    ap.add_argument("--small", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default=MODE, help=argparse.SUPPRESS)  # the child's torch.compile mode
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: bench_compile_ops needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.whole_model_only:
        args.out.write_text(json.dumps(whole_model(args.whole_model_only, args.small, mode=args.mode), default=str))
        return 0
    if args.workspace is None:
        print("error: bench_compile_ops: --workspace is required", file=sys.stderr)
        return 2
    cap, cards = won_cards(args.workspace, args.cards)
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "mode": MODE,
           "model": cap["model"], "ops": per_op(cards)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, default=str))  # the per-op part survives what follows
    if not args.no_model and cap.get("config_path"):
        log(f"whole model: eager against torch.compile (at most {args.model_timeout:.0f} s)")
        if args.model_mode == MODE:
            doc["whole_model"] = whole_model_compiled(cap["config_path"], bool(cap["small"]), args.model_timeout)
        else:
            doc["whole_model"] = {**whole_model_in_child(cap["config_path"], bool(cap["small"]), args.model_timeout,
                                                         args.model_mode), "asked_mode": args.model_mode}
        args.out.write_text(json.dumps(doc, indent=1, default=str))
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
