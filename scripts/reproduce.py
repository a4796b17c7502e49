#!/usr/bin/env python3
"""Reproduce Kernel Forge's headline numbers on one GPU: for each reference config, capture → run (builtin
proposer, default budget) → export → end-to-end benchmark → torch.compile beside it; then the issue-4 target
cards, the search ablation, and one Markdown report.

    python scripts/reproduce.py --out docs/results/reproduce [--models resnet50,sd35_medium,gemma4_e2b,qwen35_a3b]
    python scripts/reproduce.py --out docs/results/reproduce --report-only     # (re)write report.md only
    python scripts/reproduce.py --out OUT --gpus 0,1          # models shared out over two GPUs, one process each
    CUDA_VISIBLE_DEVICES=1 python scripts/reproduce.py --out OUT --models resnet50 --models-only  # by hand

Every step writes its own files under OUT and is skipped when they exist, so the script can be run in
several sittings (a run cut short resumes with `kforge-tui run --resume`). Workspaces (with their
samples, tens of GB for SD3.5) live under --workspaces (default /tmp/kforge-reproduce), not in OUT.

With --gpus, each GPU's process takes the next model when it is done with one. The end-to-end and
torch.compile steps take turns through a lock in OUT: they time whole forwards, often host-bound, and two at
once on one host would slow each other.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import queue
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("resnet50", "sd35_medium", "gemma4_e2b", "qwen35_a3b")
# The original Kernel Forge study (a GB10, not an H200): per-op speedups on the same operators.
ORIGINAL = [("aten::mean.dim", "resnet50", "adaptive_avg_pool2d", 1.52),
            ("aten::native_group_norm", "sd35_medium", "group_norm", 1.70),
            ("aten::_softmax", "gemma4_e2b", "softmax", 2.83),
            ("aten::_softmax", "qwen35_a3b", "softmax", 1.54)]


COMPILE_MODE = "max-autotune-no-cudagraphs"  # bench_compile_ops' default for the whole-model comparison
ABLATION_CARDS = ("softmax fp32 [4,262144]", "layer_norm", "group_norm fp16 [1,512")


def log(msg: str) -> None:
    print(f"[reproduce {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def host_bench_turn(out: Path):
    """One host-sensitive benchmark at a time across the processes of one reproduce (an exclusive lock)."""
    with open(out / ".host-bench.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def on_gpus(models: list[str], gpus: list[str], argv_for: Any, log_dir: Path) -> dict[str, int]:
    """Run `argv_for(model)` for every model, one process per GPU at a time (CUDA_VISIBLE_DEVICES set), each
    GPU taking the next model when its process ends; returns every model's exit code."""
    todo: queue.Queue[str] = queue.Queue()
    for m in models:
        todo.put(m)
    codes: dict[str, int] = {}

    def worker(gpu: str) -> None:
        while True:
            try:
                m = todo.get_nowait()
            except queue.Empty:
                return
            log(f"{m}: on GPU {gpu}")
            with open(log_dir / f"{m}.gpu{gpu}.log", "a") as f:
                codes[m] = subprocess.call(argv_for(m), cwd=ROOT, stdout=f, stderr=f,
                                           env=dict(os.environ, CUDA_VISIBLE_DEVICES=gpu))
            log(f"{m}: GPU {gpu} done (exit {codes[m]})")

    threads = [threading.Thread(target=worker, args=(g,)) for g in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


def step(name: str, done: Path, argv: list[str], log_file: Path, stdout: Path | None = None) -> int:
    """Run one step unless `done` exists (non-empty); its stderr (and stdout unless captured to a file) go to
    log_file. A captured stdout is written beside the file and renamed into place only when the step
    succeeds, so a step killed with its sitting (a time limit, a lost machine) is run again next time."""
    if done.exists() and done.stat().st_size > 0:
        log(f"{name}: done already ({done})")
        return 0
    log(f"{name}: {' '.join(argv)}")
    t0 = time.perf_counter()
    partial = stdout.with_name(stdout.name + ".partial") if stdout else None
    with open(log_file, "a") as err:
        out = open(partial, "w") if partial else err
        try:
            rc = subprocess.call(argv, stdout=out, stderr=err, cwd=ROOT)
        finally:
            if partial:
                out.close()
    log(f"{name}: exit {rc} in {time.perf_counter() - t0:.0f} s")
    if partial and rc == 0:
        partial.replace(stdout)
    return rc


def latest_run(ws: Path) -> dict | None:
    db = ws / "kforge.db"
    if not db.exists():
        return None
    sys.path.insert(0, str(ROOT))
    from engine.store import open_readonly, read

    conn = open_readonly(db)
    try:
        return read.latest_run(conn)
    finally:
        conn.close()


def model_steps(model: str, out: Path, ws_root: Path, wall: float | None,
                compile_mode: str = COMPILE_MODE) -> None:
    py = sys.executable
    d, ws = out / model, ws_root / model
    d.mkdir(parents=True, exist_ok=True)
    logf = d / "steps.log"
    run = latest_run(ws)
    run_argv = [py, "-m", "kforge_tui", "run", "--no-tui", "--json", "--workspace", str(ws)]
    run_argv += ["--resume", run["id"]] if run and run["status"] != "done" else [f"configs/models/{model}.toml"]
    if wall:
        run_argv += ["--wall-time", str(wall)]
    if step(f"{model} run", d / "run.json", run_argv, logf, stdout=d / "run.json") != 0:
        log(f"{model}: the run did not finish; the next sitting resumes it")
        return
    step(f"{model} export", d / "export.json",
         [py, "-m", "kforge_tui", "export", "--workspace", str(ws), "--out", str(d / f"{model}.cast"), "--json"],
         logf, stdout=d / "export.json")
    if (d / f"{model}.cast").exists():
        models = "sd35_vae,sd35_medium" if model == "sd35_medium" else model
        with host_bench_turn(out):
            step(f"{model} e2e", d / "e2e" / "bench_e2e.md",
                 [py, "scripts/bench_e2e.py", "--out", str(d / "e2e"), "--casts", str(d), "--models", models], logf)
    comp = _load(d / "compile.json")
    if comp is not None and "whole_model" not in comp:  # cut short after its per-op part: run it again
        (d / "compile.json").unlink()
    with host_bench_turn(out):
        step(f"{model} torch.compile", d / "compile.json",
             [py, "scripts/bench_compile_ops.py", "--workspace", str(ws), "--out", str(d / "compile.json"),
              "--model-mode", compile_mode], logf)
    step(f"{model} run table", d / "run.md", [py, "scripts/run_table.py", str(ws / "kforge.db"),
                                               "--out", str(d / "run.md")], logf, stdout=Path("/dev/null"))
    if (ws / "kforge.db").exists() and not (d / "kforge.db").exists():
        src, dst = sqlite3.connect(ws / "kforge.db"), sqlite3.connect(d / "kforge.db")
        src.backup(dst)
        dst.close()
    if (d / "kforge.db").exists():
        # The report is made from this file: workspace databases stay out of git, their facts go in.
        write_facts(d / "kforge.db", d / FACTS)


# ------------------------------------------------------------------------------------------- report


def _load(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _f(v: Any, fmt: str = ".1f", none: str = "–") -> str:
    return none if v is None else format(v, fmt)


def _cast_cards(path: Path) -> dict[str, str]:
    """Card id -> category of the variants in a cast file (empty when there is none)."""
    if not path.exists():
        return {}
    sys.path.insert(0, str(ROOT))
    from engine.cast.format import read_cast

    return {v["card_id"]: v.get("category", "?") for v in read_cast(path).variants}


FACTS = "facts.json"  # what the report needs of a model's workspace database, beside its other results


# What the report reads of a candidate (sources, timings and reports stay in the database).
FACT_KEYS = ("id", "card_id", "parent_id", "status", "category", "proposer", "best_us", "eager_us", "speedup",
             "speedup_low", "speedup_high", "created_at")


def write_facts(db_path: Path, out: Path) -> None:
    """The report's facts of the run in `db_path`, as JSON (only FACT_KEYS of each candidate)."""
    facts = store_facts(db_path)
    facts["candidates"] = {cid: [{k: c.get(k) for k in FACT_KEYS} for c in cands]
                           for cid, cands in facts["candidates"].items()}
    out.write_text(json.dumps(facts, indent=1, sort_keys=True, default=str) + "\n")


def model_facts(d: Path) -> dict | None:
    """A model's facts: its facts.json, else read from its workspace database, else None (not run)."""
    if (d / FACTS).is_file():
        return json.loads((d / FACTS).read_text())
    if (d / "kforge.db").is_file():
        return store_facts(d / "kforge.db")
    return None


def store_facts(db_path: Path) -> dict:
    """Per card of the latest run: card row, best verified candidate, candidates; time to first verified."""
    sys.path.insert(0, str(ROOT))
    from engine.store import open_readonly, read

    conn = open_readonly(db_path)
    try:
        run = read.latest_run(conn)
        cards = {r["card_id"]: r for r in read.cards_of_capture(conn, run["capture_id"])}
        events = read.events_since(conn, run["id"])
        candidates = read.candidates(conn, run["id"])
    finally:
        conn.close()
    start = next((e["ts"] for e in events if e["kind"] == "run_started"), None)
    first_ok: dict[str, float] = {}
    for e in events:
        if e["kind"] == "evaluated" and e["card_id"] not in first_ok:
            p = json.loads(e["payload"]) if isinstance(e["payload"], str) else (e["payload"] or {})
            if p.get("status") == "verified" and start is not None:
                first_ok[e["card_id"]] = e["ts"] - start
    per: dict[str, list] = {}
    for c in candidates:
        per.setdefault(c["card_id"], []).append(c)
    compile_ms = []
    for e in events:
        if e["kind"] == "evaluated":
            p = json.loads(e["payload"]) if isinstance(e["payload"], str) else (e["payload"] or {})
            if p.get("compile_ms") is not None and not p.get("compile_cached"):
                compile_ms.append(float(p["compile_ms"]))
    evaluated = [e["ts"] for e in events if e["kind"] == "evaluated"]
    span = (max(evaluated) - min(evaluated)) if len(evaluated) > 1 else 0.0
    n = sum(len(v) for v in per.values())
    return {"run": run, "cards": cards, "candidates": per, "first_verified_s": first_ok,
            "candidates_per_min": 60 * n / span if span else None, "evaluations": n,
            "compile_ms": sorted(compile_ms)[len(compile_ms) // 2] if compile_ms else None}


def _export_error(log: Path) -> str | None:
    """The last `error: export: ...` line the export step wrote to steps.log (why it wrote no cast)."""
    if not log.is_file():
        return None
    errors = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("error: export: ")]
    return f"no cast: {errors[-1].removeprefix('error: export: ').replace('|', '/')}" if errors else None


def report(out: Path, models: list[str]) -> str:
    sys.path.insert(0, str(ROOT))
    from engine.outcomes import faster_with_confidence

    lines = ["# Kernel Forge: reproduced results", "",
             f"Written by `python scripts/reproduce.py --out {out}` "
             f"({time.strftime('%Y-%m-%d')}). Builtin proposer, default budget, one GPU; eager, torch.compile "
             "(`max-autotune-no-cudagraphs`) and the roofline beside every number. Timing: L2 flushed and the "
             "GPU kept busy before each timed call, medians, paired bootstrap 95 % CI.", ""]
    e2e_rows, harness, won_rows, compile_notes = [], [], [], []
    captured_ops: dict[str, dict[str, float]] = {}
    for model in models:
        d = out / model
        facts = model_facts(d)
        if facts is None:
            lines.append(f"- {model}: not run yet (no {d / FACTS} or {d / 'kforge.db'}).")
            continue
        for card in facts["cards"].values():
            op_share = captured_ops.setdefault(model, {})
            op_share[card["op"]] = max(op_share.get(card["op"], 0.0), card["share"] or 0.0)
        export = _load(d / "export.json") or {}
        compile_doc = _load(d / "compile.json") or {}
        comp = {o["card_id"]: o for o in compile_doc.get("ops", [])}
        in_cast_ids = _cast_cards(d / f"{model}.cast")
        covered = 0.0
        for cid, cands in facts["candidates"].items():
            card = facts["cards"][cid]
            ok = [c for c in cands if c["status"] == "verified" and c["best_us"]]
            if not ok:
                continue
            best = min(ok, key=lambda c: c["best_us"])
            if not faster_with_confidence((best["speedup_low"], best["speedup_high"])):
                continue
            in_cast = cid in in_cast_ids
            if in_cast:
                covered += card["share"] or 0.0
            roof = card.get("roofline_us")
            won_rows.append((model, card, best, comp.get(cid, {}), len(cands), in_cast_ids.get(cid),
                             100 * roof / best["best_us"] if roof else None))
        e2e = _load(d / "e2e" / "bench_e2e.json") or {}
        whole = compile_doc.get("whole_model") or {}
        # torch.compile's time beside the eager time of its own measurement: the end-to-end eager column may
        # come from another sitting (another load on the host), and host-bound models differ between them.
        compiled = (f"{whole['compile_ms']:.2f} (eager {whole['eager_ms']:.2f})"
                    if whole.get("compile_ms") is not None and whole.get("eager_ms") is not None
                    else _f(whole.get("compile_ms"), ".2f"))
        for r in e2e.get("models", []):
            g = r.get("cuda_graphs") or {}
            router = {"c++": "cpp"}.get(r.get("dispatched_by"), r.get("dispatched_by")) or r.get("router")
            label = r["model"] if "[" in r["model"] or not router else f"{r['model']} [{router} router]"
            graphs = "–" if g.get("speedup") is None else f"{g['speedup']:.3f}×"
            own = compiled if r["model"] == model else "–"  # the config's compile time, not a part's
            e2e_rows.append(f"| {label} | {r['eager_ms']:.2f} | {r['cast_ms']:.2f} | {r['speedup']:.3f}× "
                            f"({r['speedup_ci'][0]:.3f}–{r['speedup_ci'][1]:.3f}) | {graphs} | {own} | "
                            f"{r['rel_l2_err']:.1e} | {100 * covered:.0f} % |")
        if whole.get("error"):
            compile_notes.append(f"- {model}: {whole['error']}")
        elif whole.get("instead_of"):
            compile_notes.append(f"- {model}: torch.compile's {whole.get('mode')} mode, "
                                 f"{_f(whole.get('compile_ms'), '.2f')} ms: {whole['instead_of']}")
        elif whole.get("asked_mode"):
            compile_notes.append(f"- {model}: torch.compile's {whole['asked_mode']} mode (asked for with "
                                 f"`--compile-mode`), {_f(whole.get('compile_ms'), '.2f')} ms")
        elif not whole:
            compile_notes.append(f"- {model}: not measured here (`compile.json` has no whole-model result)")
        if not e2e.get("models"):
            why = export.get("error") or _export_error(d / "steps.log") or "no cast exported (see steps.log)"
            e2e_rows.append(f"| {model} | – | – | {why} | – | {compiled} | – | – |")
        first = sorted(facts["first_verified_s"].values())

        run = facts["run"]
        tokens = (run.get("tokens_in") or 0) + (run.get("tokens_out") or 0)
        llm = f"{tokens:,} tokens, ${run.get('cost_usd') or 0:.2f}" if tokens else "none (builtin proposer)"
        harness.append(f"| {model} | {facts['evaluations']} | {_f(facts['candidates_per_min'], '.0f')} | "
                       f"{_f(facts['compile_ms'], '.0f')} | "
                       f"{_f(first[len(first) // 2] if first else None, '.0f')} s | {llm} | "
                       f"{run['stopped_by']} |")
    won_rows.sort(key=lambda r: (models.index(r[0]), -(r[1]["share"] or 0.0)))
    missing = [ln for ln in lines if ln.startswith("- ")]
    lines = [ln for ln in lines if not ln.startswith("- ")]
    lines += ["## Per model, end to end", "",
              "| model | eager ms | with cast ms | speedup (95 % CI) | under CUDA graphs | torch.compile ms (its own eager) | "
              "output rel. L2 vs eager | model time covered by the cast |", "|---|---:|---:|---|---:|---:|---:|---:|"]
    lines += e2e_rows or ["| – | | | | | | | |"]
    if compile_notes:
        lines += ["", "torch.compile of the whole model:"] + compile_notes
    if missing:
        lines += [""] + missing
    lines += ["", "## Every card a kernel won (CI lower bound > 1 in the run)", "",
              "| model | op | signature | calls | share | eager µs | torch.compile µs | Kernel Forge µs (95 % CI of "
              "speedup) | % of roofline | % of copy | in cast (category) | candidates |",
              "|---|---|---|---:|---:|---:|---:|---|---:|---:|---|---:|"]
    for model, card, best, comp, n, in_cast, roof in won_rows:
        sig = card.get("signature_text") or ""
        if not sig:
            try:
                sys.path.insert(0, str(ROOT))
                from engine.capture.signature import signature_text

                sig = signature_text(json.loads(card["signature"]))
            except Exception:
                sig = card["card_id"]
        sig = sig if len(sig) <= 60 else sig[:57] + "…"
        # The card's own torch.compile reference (timed in the lane as eager is) where the run measured one;
        # bench_compile_ops' measurement (compile.json) for runs from before cards carried it.
        compiled = card.get("compile_us") if card.get("compile_us") is not None else comp.get("compile_us")
        copy_us = card.get("copy_us")
        of_copy = f"{100 * best['best_us'] / copy_us:.0f}" if copy_us else "–"
        lines.append(f"| {model} | `{card['op']}` | {sig} | {card['calls']:g} | {100 * (card['share'] or 0):.1f} % | "
                     f"{_f(card.get('eager_us'))} | {_f(compiled)} | {best['best_us']:.1f} "
                     f"({best['speedup']:.2f}×, {best['speedup_low']:.2f}–{best['speedup_high']:.2f}) | "
                     f"{_f(roof, '.0f')} | {of_copy} | {in_cast or 'no'} | {n} |")
    lines += ["", "## Harness", "", "| model | evaluations | candidates / min | median compile ms (uncached) | "
              "median time to first verified kernel per card | LLM tokens and cost | run stopped by |",
              "|---|---:|---:|---:|---:|---|---|"] + harness
    builtin = out / "builtin" / "bench_builtin.md"
    search = out / "search" / "bench_search.md"
    missing = "not run into this folder (`reproduce.py` without `--models-only` runs it)"
    lines += ["", "## Issue-4 target cards", ""]
    lines += [builtin.read_text().split("\n", 2)[2] if builtin.exists() else missing + "."]
    lines += ["", "## Search ablation", ""]
    lines += [search.read_text().split("\n", 2)[2] if search.exists() else missing + "."]
    lines += ["", "## Beside the original Kernel Forge study", "",
              "Theirs on a GB10, ours on an H200 — different GPUs; the same operators of the same models.", "",
              "| operator (model) | original Kernel Forge (GB10) | ours (H200): best card of that op |",
              "|---|---:|---:|"]
    for op, model, label, theirs in ORIGINAL:
        mine = [best["speedup"] for m, card, best, *_ in won_rows if m == model and card["op"] == op]
        if mine:
            ours = f"{max(mine):.2f}×"
        elif model not in captured_ops:
            ours = "– (model not run)"
        elif op not in captured_ops[model]:
            ours = f"– (the captured model runs no `{op}`: e.g. attention is one fused SDPA kernel)"
        else:
            ours = (f"– (its cards won nothing: the largest is {100 * captured_ops[model][op]:.2f} % of the "
                    "model's time, below the 0.1 % noise floor or not faster)")
        lines.append(f"| {label} ({model}) | {theirs:.2f}× | {ours} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--workspaces", type=Path, default=Path("/tmp/kforge-reproduce"))
    ap.add_argument("--wall-time", type=float, help="cap each run's search (seconds); resume later for the rest")
    ap.add_argument("--compile-mode", choices=(COMPILE_MODE, "default"), default=COMPILE_MODE,
                    help="torch.compile mode of the whole-model comparison (max-autotune falls back to the default "
                         "mode when it outlasts 480 s; 'default' skips that wait)")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--models-only", action="store_true",
                    help="only the per-model steps (e.g. one process per GPU); no target cards, ablation or report")
    ap.add_argument("--gpus", help="GPU indices to share the models out over, one process each (e.g. 0,1)")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    bad = [m for m in models if m not in MODELS]
    if bad:
        print(f"error: --models: unknown {bad[0]!r}; use {', '.join(MODELS)}", file=sys.stderr)
        return 2
    gpus = [g.strip() for g in (args.gpus or "").split(",") if g.strip()]
    if args.gpus is not None and (not gpus or not all(g.isdigit() for g in gpus) or len(set(gpus)) != len(gpus)):
        print(f"error: --gpus {args.gpus!r}: use distinct GPU indices separated by commas, e.g. 0,1", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        import torch

        if not torch.cuda.is_available():
            print("error: reproduce needs a CUDA GPU (use --report-only to rewrite the report)", file=sys.stderr)
            return 2
        if len(gpus) > 1:
            def argv_for(m: str) -> list[str]:
                argv = [sys.executable, str(Path(__file__).resolve()), "--out", str(args.out.resolve()),
                        "--workspaces", str(args.workspaces.resolve()), "--models", m, "--models-only"]
                return argv + (["--wall-time", str(args.wall_time)] if args.wall_time else []) + [
                    "--compile-mode", args.compile_mode]

            codes = on_gpus(models, gpus, argv_for, args.out)
            failed = {m: c for m, c in codes.items() if c != 0}
            if failed:
                log(f"per-model steps that exited non-zero: {failed} (their logs: {args.out}/<model>.gpu<N>.log)")
            if gpus:
                os.environ["CUDA_VISIBLE_DEVICES"] = gpus[0]  # the steps after the models: the first GPU
        else:
            if gpus:
                os.environ["CUDA_VISIBLE_DEVICES"] = gpus[0]
            for m in models:
                model_steps(m, args.out, args.workspaces, args.wall_time, args.compile_mode)
        if args.models_only:
            return 0
        py = sys.executable
        step("target cards", args.out / "builtin" / "bench_builtin.md",
             [py, "scripts/bench_builtin.py", "--out", str(args.out / "builtin")], args.out / "steps.log")
        # The three target cards with the widest parameter spaces, 12 evaluations per card, strategy and
        # seed (216 in all, about 5 minutes on an H200): all 11 cards at 20 x 3 seeds came to ~2,000
        # evaluations, more than one sitting's GPU time.
        step("search ablation", args.out / "search" / "bench_search.md",
             [py, "scripts/bench_search.py", "--model", "targets", "--only", *ABLATION_CARDS, "--budget", "12",
              "--seeds", "2", "--timing-s", "0.3", "--out", str(args.out / "search")], args.out / "steps.log")
    (args.out / "report.md").write_text(report(args.out, models))
    log(f"wrote {args.out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
