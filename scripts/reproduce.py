#!/usr/bin/env python3
"""Reproduce Kernel Forge's headline numbers, one model per sitting (one 10-minute device command each), then
one report assembled from those sittings. A model's sitting: run (builtin proposer, --wall-time) → export
--target eager,cuda-graphs,compile → bench_e2e (eager, CUDA graphs, host time per forward) → bench_compose (torch.compile
default and reduce-overhead, alone vs + cast); the record beside them names the commit, source digest, host,
GPU clocks and an eager control, and every step's outcome.

    python scripts/reproduce.py --out /tmp/r --models vit_b16 --deadline 540 --pack OUT   # one model, one sitting
    python scripts/reproduce.py --out docs/results/reproduce --report-only               # assemble report.md
    python scripts/reproduce.py --out OUT --extras        # the issue-4 target cards and the search ablation
    python scripts/reproduce.py --out OUT --gpus 0,1      # models shared out over two GPUs, one process each
    python scripts/reproduce.py --out OUT --models gemma4_e2b --full-depth   # + bench_e2e of all 35 layers

Models: resnet50, sd35_medium, gemma4_e2b, qwen35_a3b (configs/models) and sd35_vae, vit_b16, convnext_tiny,
whisper_encoder, deeplabv3 (configs/examples). Every step writes its own files under OUT/MODEL and is skipped
when they exist, so a model can take several sittings (a run cut short, or one whose wall time went to
its capture and eager timing before any search, resumes with `kforge-tui run --resume`). Workspaces (with their samples, tens of GB for SD3.5) live under --workspaces (default
/tmp/kforge-reproduce), not in OUT. --report-only refuses results of different code (their source digests
differ) unless --allow-mixed-commits, which flags them. The end-to-end and compose steps take turns through a
lock in OUT: they time whole forwards, often host-bound, and two at once on one host would slow each other.

One commit over several device sessions (the report refuses mixed code): tag the commit, extract its code into
an ignored folder with its name (`mkdir .pin && git archive TAG engine kforge_tui scripts configs pyproject.toml
| tar -x -C .pin && git rev-parse TAG > .pin/COMMIT`), carry `.pin` to the device and run the sittings there
(`cd .pin && PYTHONPATH=$PWD KFORGE_COMMIT=$(cat COMMIT) python3 scripts/reproduce.py ...`, with the
wheelhouse's folder on PYTHONPATH too: the steps must import the copy's code, and the copy is no git work tree
of its own, so the commit comes from the variable); its records name that commit and its source digest.

Runs and casts use the shrunk reference models (one layer of each kind, call counts scaled); their end-to-end
numbers over-weight what runs once per forward (Gemma's LM head and logit soft-cap). --full-depth adds, after a
model's steps, bench_e2e of the same cast on the model at its real depth (`NAME@full_depth=true`, for the
models whose builder takes it: gemma4_e2b, qwen35_a3b, sd35_medium); the report puts that row beside the
shrunk one and names each row's depth.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import queue
import re
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the engine of this checkout (or pinned copy), installed or not
MODELS = ("resnet50", "sd35_medium", "gemma4_e2b", "qwen35_a3b")  # the reference configs
EXAMPLES = ("sd35_vae", "vit_b16", "convnext_tiny", "whisper_encoder", "deeplabv3")  # configs/examples/
ALL_MODELS = MODELS + EXAMPLES
# Seconds of `run --wall-time` (capture and eager timing count) when --wall-time is not given: what leaves
# export, bench_e2e and bench_compose room in one 10-minute device command. The reference models' captures
# alone take minutes at full size; restrict their search with --ops to fit.
# SD3.5's capture (27 GB of samples) and eager timing of its 17 selected cards took 52 s and 86 s of a 204 s
# run on the H200 (2026-12-02), leaving its search 50 s: its runs get more, and its sitting's later steps
# follow in the next sitting. The VAE's run of 260 s (2026-12-02) spent 36 s capturing, 105 s timing eager for
# 13 cards and 95 s timing their references, and searched 4 of them for 34 s: its cast left the other GroupNorms
# to Inductor (1.21x over torch.compile where every GroupNorm served gave 1.29x); 480 s leaves its search ~240 s,
# and its export, e2e and compose follow in a second sitting. Gemma's run of 150 s (2026-12-02) spent 36 s
# capturing, 4 s timing eager and 55 s timing torch.compile references for 8 cards, and searched 20 s; its
# sitting's steps took 396 s in all (the run 130 s), so 210 s leaves its search ~80 s and fits one sitting.
WALL_S = {"resnet50": 150, "sd35_medium": 360, "gemma4_e2b": 210, "qwen35_a3b": 150, "sd35_vae": 480,
          "vit_b16": 120, "convnext_tiny": 120, "whisper_encoder": 120, "deeplabv3": 120}
# `run --ops` when --ops is not given: the LLMs' time is in their RMSNorm chains, whose module cards each hold
# under the 0.1 % share floor (Gemma 4 E2B at full depth: 1.51x eager from them alone, 2026-12-02), so an
# unrestricted run of 150 s would spend itself on the LM head and the matmuls instead.
# SD3.5's gains are its group norms (VAE) and q/k RMSNorm module cards; `group_norm` also selects the VAE's
# GroupNorm -> SiLU chain cards (patterns, under torch.compile).
OPS = {"gemma4_e2b": "module", "qwen35_a3b": "module", "sd35_medium": "module|group_norm",
       "sd35_vae": "group_norm"}
# `export --target` when --targets is not given. The VAE's cast is mostly GroupNorm -> SiLU pattern cards, which
# run only under torch.compile: its export also proves them for reduce-overhead (CUDA graphs), so that compose
# arm runs them (a variant runs only under the targets it was proven for).
TARGETS = "eager,cuda-graphs,compile"
MODEL_TARGETS = {"sd35_vae": "eager,cuda-graphs,compile,compile:reduce-overhead"}
# Each step's time limit (seconds; the run's is its wall time plus this), all inside --deadline; the export's is
# per target proven (each compile target compiles the model at least twice).
# (compose: both arms of each mode compile, after one compile of the model that neither arm is charged for.)
# bench_compose times each comparison in rounds until its CI is 0.02 wide, for at most this long (three
# comparisons per model: eager and two compile modes), within the compose step's limit.
COMPOSE_MAX_S = 20
STEP_LIMIT_S = {"run": 90, "export": 180, "e2e": 150, "compose": 300, "torch.compile": 540, "e2e full depth": 300}
EXPORT_S_PER_COMPILE_TARGET = 90
GRAPH_ROUTES_S = 120  # the export's graph-route check (--graph-routes): two classes' captures and timing
LAYOUT_ROUTES_S = 90  # the export's layout-route check (convolutional models): a build, two classes' timing
# Exports that take longer than that formula: sd35_medium under torch.compile compiles its MMDiT step + VAE in
# 42 s alone and 27 s with a cast (H200, 2026-12-02), and each variant set tried compiles again and is timed
# for up to 30 s; its compile target alone can take 3-5 minutes. Its export then has a sitting of its own.
# Gemma's 4-layer build: confirmation 21 s, eager check 55 s, compile check 127 s, reduce-overhead check about
# 90 s (H200, 2026-12-03g: `--target eager,compile,compile:reduce-overhead` was cut at 270 s and finished on a
# resume). Qwen compiles a larger graph than Gemma: the same, with room.
MODEL_EXPORT_S = {"sd35_medium": 480, "sd35_vae": 500, "gemma4_e2b": 420, "qwen35_a3b": 480}
# An export keeps what it finished (its confirmation, each target's check) as checkpoints, and the same command
# resumes from them: a sitting starts it when this much is left, enough for the confirmation and a first check.
EXPORT_NEED_S = 150
# bench_compose cannot resume: a sitting starts it only with this much left per process (ResNet-50 took 117 s,
# ViT-B/16 148 s on an H100; ConvNeXt-T started with 51 s left, was stopped and kept nothing, 2026-12-07).
COMPOSE_NEED_S = 150
# An export that was stopped part way has its confirmation and finished checks kept: the next sitting starts it
# with less left (Gemma's resume finished in 98 s, H200 2026-12-03g; it had been skipped with 133 s left).
EXPORT_RESUME_NEED_S = 60
# A run stopped part way resumes with what is left of its wall time, and at least this much: a search of its own.
RESUME_MIN_S = 120
FULL_DEPTH = {"full_depth": True}  # the builder argument that builds a reference model's every layer
FULL_DEPTH_STEP = "e2e full depth"  # bench_e2e --append of NAME@full_depth=true into the model's e2e/
COMPOSE_MODES = ("default", "reduce-overhead")
RECORD = "record.json"  # per model: the sitting (commit, host, GPU clocks, eager control) and each step's outcome
# What a per-model sitting hands back with --pack (a device command returns at most 8 files): the report's inputs.
PACKED = (RECORD, "facts.json", "export.json", "run.json", "steps.log", "e2e/bench_e2e.json",
          "compose/bench_compose.json")


def config_path(model: str) -> str:
    """The config a model name stands for: configs/models/NAME.toml or configs/examples/NAME.toml."""
    return f"configs/{'models' if model in MODELS else 'examples'}/{model}.toml"


def takes_full_depth(model: str) -> bool:
    """Whether the model's builder can build every layer of the real model (a `full_depth` argument)."""
    import inspect

    from engine.config import load_config, resolve_builder

    return "full_depth" in inspect.signature(resolve_builder(load_config(ROOT / config_path(model)))).parameters


def full_depth_spec(model: str) -> Any:
    """The model at its real depth as bench_e2e takes it (`configs/models/NAME.toml@full_depth=true`); its
    `label` names the row bench_e2e writes (`NAME@full_depth=true`)."""
    from engine.config import ModelSpec

    return ModelSpec(config_path(model), FULL_DEPTH)


def shrunk_depth(model: str) -> tuple[int, int] | None:
    """(layers built, layers of the real model) of a config that keeps one layer per kind ([multiplicity]);
    None where the config builds the whole model."""
    from engine.config import load_config

    mult = load_config(ROOT / config_path(model)).multiplicity
    return (len(mult), sum(mult.values())) if mult else None


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


TIMED_OUT = 124  # a step's exit code when its time limit ended it (as timeout(1) has it)
PARTIAL = 75  # export's exit code when interrupted after some targets: a partial cast (engine.export.package)


def step(name: str, done: Path | None, argv: list[str], log_file: Path, stdout: Path | None = None,
         timeout: float | None = None) -> int:
    """Run one step unless `done` exists (non-empty; None: no file says whether it is done); its stderr (and
    stdout unless captured to a file) go to log_file. A captured stdout is written beside the file and renamed
    into place only when the step succeeds, so a step killed with its sitting (a time limit, a lost machine) is
    run again next time. Past `timeout` seconds the step's process group gets SIGINT, then SIGKILL 30 s later;
    it returns TIMED_OUT."""
    if done is not None and done.exists() and done.stat().st_size > 0:
        log(f"{name}: done already ({done})")
        return 0
    log(f"{name}: {' '.join(argv)}" + (f" (limit {timeout:.0f} s)" if timeout else ""))
    t0 = time.perf_counter()
    partial = stdout.with_name(stdout.name + ".partial") if stdout else None
    with open(log_file, "a") as err:
        out = open(partial, "w") if partial else err
        try:
            # Its own process group, so a time limit ends the step's children (lanes, compile workers) too.
            # KFORGE_PROGRESS: the steps' progress lines go to the log too (where an export spent its time).
            proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=ROOT, start_new_session=True,
                                    env={**os.environ, "KFORGE_PROGRESS": "1"})
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _end_group(proc)
                rc = TIMED_OUT
                err.write(f"error: {name}: time limit of {timeout:.0f} s reached; stopped\n")
        finally:
            if partial:
                out.close()
    log(f"{name}: exit {rc} in {time.perf_counter() - t0:.0f} s")
    if partial and rc == 0:
        partial.replace(stdout)
    return rc


def _end_group(proc: subprocess.Popen) -> None:
    """Stop a step we started, and its children: SIGINT to its process group, SIGKILL if it outlives 30 s."""
    import signal

    for sig, wait_s in ((signal.SIGINT, 30), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def latest_run(ws: Path) -> dict | None:
    db = ws / "kforge.db"
    if not db.exists():
        return None
    from engine.store import open_readonly, read

    conn = open_readonly(db)
    try:
        return read.latest_run(conn)
    finally:
        conn.close()


BANDWIDTH_BYTES = 32e6  # issue 21: memory-bound builtin kernels on tensors of at least 32 MB ...
BANDWIDTH_TARGET = 0.90  # ... reach 90 % of the bandwidth of the lane's own copy of the same bytes


def matmul_tflops(rec: dict | None) -> float | None:
    """The median bf16 8192² matmul rate (TFLOP/s) of a model's sittings (their control), None if none."""
    rates = sorted(s["control"]["matmul_tflops"] for s in (rec or {}).get("sittings", [])
                   if isinstance(s.get("control"), dict) and s["control"].get("matmul_tflops"))
    return rates[len(rates) // 2] if rates else None


def bandwidth_target(won_rows: list[tuple], is_compute_op: Callable[[str], bool]) -> list[str]:
    """The report's section on issue 21's bandwidth target: every memory-bound card won by a builtin kernel
    whose bytes are at least BANDWIDTH_BYTES, with its kernel's bandwidth as a fraction of the lane's copy of
    the same bytes (copy µs / kernel µs)."""
    rows = [(model, card, best) for model, card, best, *_ in won_rows
            if best.get("proposer") == "builtin" and not is_compute_op(card["op"])
            and (card.get("bytes") or 0) >= BANDWIDTH_BYTES and card.get("copy_us")]
    head = [f"## Memory-bound builtin kernels on ≥ {BANDWIDTH_BYTES / 1e6:.0f} MB (target: ≥ "
            f"{100 * BANDWIDTH_TARGET:.0f} % of the lane's copy bandwidth)", ""]
    if not rows:
        return ["", *head, "No card qualifies (a won card of a builtin kernel with its bytes and the lane's copy "
                "of them timed)."]
    met = sum(card["copy_us"] / best["best_us"] >= BANDWIDTH_TARGET for _, card, best in rows)
    lines = ["", *head, f"{met} of {len(rows)} reach it.", "",
             "| model | op | signature | MB | copy µs | kernel µs | of copy bandwidth |", "|---|---|---|---:|---:|---:|---:|"]
    for model, card, best in sorted(rows, key=lambda r: r[2]["best_us"] and -r[1]["copy_us"] / r[2]["best_us"]):
        sig = (card.get("signature_text") or card["card_id"])[:60]
        lines.append(f"| {model} | `{card['op']}` | {sig} | {card['bytes'] / 1e6:.0f} | {card['copy_us']:.1f} | "
                     f"{best['best_us']:.1f} | {100 * card['copy_us'] / best['best_us']:.0f} % |")
    return lines


def search_never_began(run_json: Path) -> str | None:
    """Why a finished run evaluated nothing because its wall time was spent before the search began (its
    capture and eager timing took it), else None (a run that searched, or had nothing to propose)."""
    try:
        r = json.loads(run_json.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(r, dict) or r.get("evaluations") != 0 or r.get("stopped_by") != "wall_time":
        return None
    return str(r.get("nothing_proposed") or "the run's wall time was spent before its search began")


def source_digest() -> str:
    """sha256 over the code a sitting runs (engine/, kforge_tui/, scripts/, configs/): equal digests, equal code,
    also where the working tree travels without its git history (a device machine)."""
    import hashlib

    h = hashlib.sha256()
    for sub in ("engine", "kforge_tui", "scripts", "configs"):
        for f in sorted((ROOT / sub).rglob("*")):
            if f.is_file() and f.suffix in (".py", ".toml", ".cu", ".cuh", ".cpp", ".h") and "__pycache__" not in f.parts:
                h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def git_commit() -> tuple[str | None, bool | None]:
    """(HEAD's commit, whether the code differs from it), or the KFORGE_COMMIT variable and None where this code
    is not a git work tree of its own: no git (a device machine), or an extracted copy inside another
    repository's tree (a pinned commit, `git archive TAG | tar -x -C .pin`), whose HEAD is not this code's."""
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != ROOT.resolve():
            return os.environ.get("KFORGE_COMMIT") or None, None
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "engine", "kforge_tui", "scripts", "configs"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10)
        if head.returncode == 0 and dirty.returncode == 0:
            return head.stdout.strip(), bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("KFORGE_COMMIT") or None, None


def gpu_clocks() -> dict[str, str]:
    """The GPU's clocks, power limit and temperature as nvidia-smi reads them now (empty without it)."""
    fields = ("name", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem",
              "clocks.applications.graphics", "power.limit", "temperature.gpu")
    first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    try:
        p = subprocess.run(["nvidia-smi", "-i", first if first.isdigit() else "0",
                            f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [v.strip() for v in p.stdout.strip().split(",")]
    return dict(zip(fields, values)) if p.returncode == 0 and len(values) == len(fields) else {}


def eager_control() -> dict[str, float]:
    """The same few eager calls in every sitting, so sittings on different hosts can be compared: a bf16
    8192² matmul (GPU-bound), a 1 GiB copy, and the host's µs to issue one tiny kernel."""
    import torch

    from engine.bench.forward import time_forward
    from engine.bench.host import per_call_us
    from engine.bench.timing import copy_bandwidth

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    mm_ms = sorted(time_forward(lambda: a @ a) for _ in range(21))[10] / 1e3
    x = torch.zeros(1, device="cuda")
    launch_us = per_call_us(lambda: x.add_(1), n=2000, rounds=5)
    copy = copy_bandwidth(torch.device("cuda"))
    a = x = None  # freed before the model steps
    torch.cuda.empty_cache()
    return {"matmul_ms": mm_ms, "matmul_tflops": 2 * 8192 ** 3 / (mm_ms / 1e3) / 1e12,
            "copy_gbps": copy / 1e9, "host_us_per_launch": launch_us}


def sitting() -> dict[str, Any]:
    """Where and on what code this sitting runs: commit, source digest, host, GPU, clocks, eager control."""
    import socket

    import torch

    commit, dirty = git_commit()
    rec: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": commit, "dirty": dirty,
                           "source_digest": source_digest(), "host": socket.gethostname(),
                           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "clocks": gpu_clocks()}
    try:
        rec["control"] = eager_control()
    except Exception as e:  # the control is context, not a step: its failure is recorded, not fatal
        rec["control"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    return rec


def last_error(log_file: Path, offset: int) -> str:
    """The line that says why a step failed: the last `error`/exception line it wrote to the log, else its last."""
    try:
        with open(log_file, errors="replace") as f:
            f.seek(offset)
            lines = [ln.strip() for ln in f.read().splitlines() if ln.strip() and not ln.startswith("[")]
    except OSError:
        return "no log"
    errors = [ln for ln in lines if ln.lower().startswith("error") or "Error:" in ln or "Exception:" in ln]
    why = (errors or lines or ["no output"])[-1]
    return (why if len(why) <= 300 else why[:297] + "…").replace("|", "/")


def model_steps(model: str, out: Path, ws_root: Path, wall: float | None, compile_mode: str = COMPILE_MODE, *,
                ops: str | None = None, targets: str | None = None, deadline: float | None = None,
                compile_ops: bool = False, full_depth: bool = False, graph_routes: bool = True,
                compose_processes: int = 1) -> None:
    """One model's sitting: run → export → bench_e2e → bench_compose (→ bench_compile_ops with compile_ops; →
    bench_e2e at the real depth with full_depth), each step skipped when its result is there, each outcome (ok,
    failed with its error, timed out, skipped, not run and why) kept in OUT/MODEL/record.json beside the sitting
    (commit, host, GPU clocks, eager control)."""
    py = sys.executable
    d, ws = out / model, ws_root / model
    d.mkdir(parents=True, exist_ok=True)
    logf = d / "steps.log"
    rec = _load(d / RECORD) or {"model": model, "sittings": [], "steps": {}}
    rec["sittings"].append(sitting())
    now = len(rec["sittings"]) - 1

    def save() -> None:
        (d / RECORD).write_text(json.dumps(rec, indent=1, default=str) + "\n")

    save()

    def do(name: str, done: Path | Callable[[], bool], argv: list[str], limit: float,
           stdout: Path | None = None, need: float = 20) -> int | None:
        """Run step `name` unless `done` (its result file, or a function saying whether its result is there);
        skipped to the next sitting when less than `need` seconds of the deadline are left (a step that
        cannot resume, started short of its time, would spend the device time and keep nothing)."""
        finished = done() if callable(done) else done.exists() and done.stat().st_size > 0
        if finished:  # an earlier sitting's step: its outcome stands
            rec["steps"].setdefault(name, {"status": "ok", "sitting": None})
            return 0
        if deadline is not None:
            left = deadline - time.time() - 45  # room for a stopped step to end (SIGINT, 30 s, SIGKILL)
            if left < need:
                why = ("the sitting's --deadline was spent" if left < 20 else
                       f"it needs about {need:.0f} s and the sitting's --deadline left {left:.0f} s")
                rec["steps"][name] = {"status": "skipped", "why": why, "sitting": now}
                save()
                return None
            limit = min(limit, left)
        offset = logf.stat().st_size if logf.exists() else 0
        t0 = time.time()
        rc = step(f"{model} {name}", None if callable(done) else done, argv, logf, stdout=stdout, timeout=limit)
        entry = {"status": "ok" if rc == 0 else "timed out" if rc == TIMED_OUT else "partial" if rc == PARTIAL
                 else "failed", "rc": rc, "seconds": round(time.time() - t0, 1), "sitting": now}
        if rc == TIMED_OUT:
            entry["why"] = f"stopped at its time limit of {limit:.0f} s"
        elif rc == PARTIAL:
            entry["why"] = "interrupted after some of its targets"
        elif rc:
            entry["error"] = last_error(logf, offset)
        rec["steps"][name] = entry
        save()
        return rc

    def not_run(name: str, why: str) -> None:
        if name not in rec["steps"] or rec["steps"][name]["status"] != "ok":
            rec["steps"][name] = {"status": "not run", "why": why, "sitting": now}
            save()

    full_depth = full_depth and takes_full_depth(model)
    later = ("export", "e2e", "compose") + ((FULL_DEPTH_STEP,) if full_depth else ())
    run = latest_run(ws)
    wall = wall or WALL_S.get(model)
    ops = ops or OPS.get(model)
    targets = targets or MODEL_TARGETS.get(model, TARGETS)
    export_limit = (MODEL_EXPORT_S.get(model) or STEP_LIMIT_S["export"] + EXPORT_S_PER_COMPILE_TARGET * max(
        0, sum(t.startswith("compile") for t in targets.split(",")) - 1)) + (
        (GRAPH_ROUTES_S if graph_routes else 0) + LAYOUT_ROUTES_S if "eager" in targets.split(",") else 0)
    # ^ routes are tried for eager (layout routes only where the model ran convolutions)
    run_argv = [py, "-m", "kforge_tui", "run", "--no-tui", "--json", "--workspace", str(ws)]
    resume = run is not None and (run["status"] != "done" or rec.get("resume_run") == run["id"])
    run_argv += ["--resume", run["id"]] if resume else [config_path(model)]
    if resume and wall and rec.get("run_spent_s"):
        # The wall time is the run's in all: a resumed run gets what its earlier sittings left of it (the SD3.5
        # VAE's run was stopped at 365 s by its first sitting's limit and then given 480 s more, H100 2026-12-05g).
        left = max(RESUME_MIN_S, wall - rec["run_spent_s"])
        log(f"{model}: the run resumes with {left:.0f} s of its {wall:.0f} s wall time "
            f"({rec['run_spent_s']:.0f} s spent by earlier sittings)")
        wall = left
    run_argv += (["--wall-time", str(wall)] if wall else []) + (["--ops", ops] if ops else [])
    rc = do("run", d / "run.json", run_argv, (wall or 3600) + STEP_LIMIT_S["run"], stdout=d / "run.json")
    unsearched = search_never_began(d / "run.json") if rc == 0 else None
    ran = rec["steps"].get("run") or {}
    if rc is not None and (rc != 0 or unsearched) and ran.get("sitting") == now and "seconds" in ran:
        rec["run_spent_s"] = round(rec.get("run_spent_s", 0) + ran["seconds"], 1)
        save()
    if unsearched:
        # Its capture and eager timing spent the wall time (sd35_medium at 240 s, H200 2026-12-03f): done, with
        # nothing to export. Kept aside; the next sitting resumes the run, whose capture and timing are kept.
        (d / "run.json").replace(d / "run.unsearched.json")
        rec["resume_run"] = (latest_run(ws) or {}).get("id")
        rec["steps"]["run"].update(status="partial", why=f"{unsearched}; the next sitting resumes it")
        save()
        log(f"{model}: the run's wall time was spent before its search; the next sitting resumes it")
        for name in later:
            not_run(name, "the run's wall time was spent before its search began")
    elif rc != 0:
        log(f"{model}: the run did not finish; the next sitting resumes it")
        for name in later:
            not_run(name, "the run did not finish")
    else:
        need = EXPORT_RESUME_NEED_S if rec.get("export_stopped") else EXPORT_NEED_S
        rc = do("export", d / "export.json",
                [py, "-m", "kforge_tui", "export", "--workspace", str(ws), "--out", str(d / f"{model}.cast"),
                 "--json", "--target", targets] + (["--graph-routes"] if graph_routes else ["--no-graph-routes"]),
                 export_limit,
                stdout=d / "export.json",
                need=min(need, export_limit))
        if rc is not None:  # started: stopped part way (its checkpoints kept), or ended
            rec["export_stopped"] = rc in (TIMED_OUT, PARTIAL)
            save()
        cast = d / f"{model}.cast"
        unfinished = rc in (TIMED_OUT, PARTIAL)
        if unfinished:
            # Stopped part-way, it keeps its finished targets as checkpoints in the workspace, and the same
            # command resumes from them: not done (no export.json), and not a failure. A partial cast it wrote
            # (the finished targets only) is set aside so that no later step measures it as the model's cast.
            rec["steps"]["export"]["why"] += "; the next sitting resumes it from its checkpoints"
            save()
            if cast.exists():
                cast.replace(d / f"{model}.partial.cast")
        elif rc == 0:
            (d / f"{model}.partial.cast").unlink(missing_ok=True)  # an earlier sitting's, finished now
        if cast.exists():
            with host_bench_turn(out):
                do("e2e", d / "e2e" / "bench_e2e.md",
                   [py, "scripts/bench_e2e.py", "--out", str(d / "e2e"), "--casts", str(d), "--models",
                    config_path(model), "--no-host-cost"], STEP_LIMIT_S["e2e"])
            compose = _load(d / "compose" / "bench_compose.json")
            if compose is not None and not all(m in compose.get("modes", {}) for m in COMPOSE_MODES):
                (d / "compose" / "bench_compose.json").unlink()  # cut short before its last mode: run it again
            with host_bench_turn(out):
                do("compose", d / "compose" / "bench_compose.json",
                   [py, "scripts/bench_compose.py", "--out", str(d / "compose"), "--model", config_path(model),
                    "--cast", str(cast), "--modes", ",".join(COMPOSE_MODES), "--max-s", str(COMPOSE_MAX_S)]
                   + (["--processes", str(compose_processes)] if compose_processes > 1 else []),
                   STEP_LIMIT_S["compose"] * compose_processes, need=COMPOSE_NEED_S * compose_processes)
        else:
            why = (f"the export did not finish ({_why(rec, 'export')})" if unfinished else
                   _export_error(logf) or f"no cast ({_why(rec, 'export')}; see steps.log)")
            for name in later[1:]:
                not_run(name, why)
    if compile_ops:
        comp = _load(d / "compile.json")
        if comp is not None and "whole_model" not in comp:  # cut short after its per-op part: run it again
            (d / "compile.json").unlink()
        with host_bench_turn(out):
            do("torch.compile", d / "compile.json",
               [py, "scripts/bench_compile_ops.py", "--workspace", str(ws), "--out", str(d / "compile.json"),
                "--model-mode", compile_mode], STEP_LIMIT_S["torch.compile"])
    if full_depth and (d / f"{model}.cast").exists():
        e2e = d / "e2e"
        if (e2e / "bench_e2e.md").exists():
            # The same cast on every layer of the real model: its guards are per call signature, and every layer
            # of a kind has the shrunk one's. A row of its own in the e2e step's file (one file fewer to pack).
            spec = full_depth_spec(model)
            with host_bench_turn(out):
                do(FULL_DEPTH_STEP, lambda: any(r.get("model") == spec.label for r in
                                                (_load(e2e / "bench_e2e.json") or {}).get("models", [])),
                   [py, "scripts/bench_e2e.py", "--out", str(e2e), "--append", "--casts", str(d), "--models",
                    f"{spec.name}@{spec.overrides}", "--no-host-cost"], STEP_LIMIT_S[FULL_DEPTH_STEP])
        else:
            not_run(FULL_DEPTH_STEP, f"the e2e step did not finish ({_why(rec, 'e2e')})")
    if (ws / "kforge.db").exists():
        # Made again each sitting: a resumed run changed the table (the SD3.5 VAE's packed run.md showed the first
        # sitting's 6 searched cards after the second had searched 23, H100 2026-12-05g).
        (d / "run.md").unlink(missing_ok=True)
        step(f"{model} run table", d / "run.md", [py, "scripts/run_table.py", str(ws / "kforge.db"),
                                                   "--out", str(d / "run.md")], logf, stdout=Path("/dev/null"))
        # A fresh copy each sitting: a resumed run adds to the database.
        src, dst = sqlite3.connect(ws / "kforge.db"), sqlite3.connect(d / "kforge.db")
        src.backup(dst)
        dst.close()
    if (d / "kforge.db").exists():
        # The report is made from this file: workspace databases stay out of git, their facts go in.
        write_facts(d / "kforge.db", d / FACTS)
    rec["sittings"][now]["ended"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save()


def pack(out: Path, model: str, dest: Path) -> list[str]:
    """Copy the report's inputs of one model (PACKED, and the cast where it is under 16 MiB) to dest/MODEL."""
    import shutil

    copied = []
    for rel in PACKED + (f"{model}.cast",):
        src = out / model / rel
        if src.is_file() and (not rel.endswith(".cast") or src.stat().st_size < 16 << 20):
            (dest / model / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest / model / rel)
            copied.append(rel)
    return copied


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


class MixedRuns(Exception):
    """The per-model results in one folder come from different code (their source digests differ)."""


def sittings_code(out: Path, models: list[str]) -> dict[str, list[tuple[str | None, str | None]]]:
    """Per model with a record: the (commit, source digest) of each of its sittings."""
    code = {}
    for m in models:
        rec = _load(out / m / RECORD)
        if rec:
            code[m] = [(s.get("commit"), s.get("source_digest")) for s in rec.get("sittings", [])]
    return code


def mixed_code(out: Path, models: list[str]) -> str | None:
    """Why the models' sittings are not of one code (which model ran which), or None when they are."""
    code = sittings_code(out, models)
    digests = {dg for sits in code.values() for _, dg in sits}
    if len(digests) <= 1:
        return None
    by = {}
    for m, sits in code.items():
        for commit, dg in sits:
            by.setdefault(f"commit {(commit or 'unknown')[:10]} (source {(dg or '?')[:10]})", []).append(m)
    return "; ".join(f"{k}: {', '.join(sorted(set(v)))}" for k, v in sorted(by.items()))


def _why(rec: dict | None, name: str) -> str:
    """Why a step left no number, from the model's record (never a guess: 'not run' when nothing says more)."""
    st = ((rec or {}).get("steps") or {}).get(name)
    if not st:
        return "not run"
    reason = st.get("error") or st.get("why")
    return {"ok": "no result (the step ended without one)", "failed": "failed",
            "timed out": "timed out"}.get(st["status"], st["status"]) + (f": {reason}" if reason else "")


def _speed(r: dict, base: str, mine: str) -> str:
    lo, hi = r["speedup_ci"]
    return f"{r[base]:.2f} | {r[mine]:.2f} | {r['speedup']:.3f}× ({lo:.3f}–{hi:.3f})"


def _e2e_arms(row: dict | None, why: str, suffix: str = "", **extra: Any) -> list[dict[str, Any]]:
    """bench_e2e's two arms of one row (eager; CUDA graphs), or both with why there is no number."""
    eager, graphs = f"eager{suffix}", f"CUDA graphs (eager graphs vs cast graphs){suffix}"
    if row is None:
        return [{"arm": eager, "target": "eager", "why": why, **extra},
                {"arm": graphs, "target": "cuda-graphs", "why": why, **extra}]
    g = row.get("cuda_graphs")
    return [{"arm": eager, "target": "eager", "row": row, "base": "eager_ms", "mine": "cast_ms", **extra},
            {"arm": graphs, "target": "cuda-graphs", **extra,
             **({"row": g, "base": "eager_ms", "mine": "cast_ms"} if g and "speedup" in g else
                {"why": f"failed: {g['error']}" if g else "not run (bench_e2e --no-graphs)"})}]


def model_arms(d: Path, model: str) -> list[dict[str, Any]]:
    """The model's arms, each {arm, target, row (the timing dict, base/mine keys) or why (no number)}; the arms
    of the model at its real depth (`full_depth`: True) last, where reproduce --full-depth measured or tried them."""
    rec = _load(d / RECORD)
    e2e = _load(d / "e2e" / "bench_e2e.json")
    compose = _load(d / "compose" / "bench_compose.json")
    rows = {r["model"]: r for r in (e2e or {}).get("models", [])}
    failures = (e2e or {}).get("failures") or {}
    steps = (rec or {}).get("steps") or {}
    row = rows.get(model)
    why = ""
    if row is None:
        fail = failures.get(model)
        why = (f"failed: {fail[:300]}" if fail else _why(rec, "e2e") if "e2e" in steps
               else _export_error(d / "steps.log")
               or ("not run" if (d / f"{model}.cast").exists() else "not run (no cast in this folder)"))
    arms = _e2e_arms(row, why)
    modes = (compose or {}).get("modes", {})
    for mode, label, target in (("default", "torch.compile (default mode)", "compile"),
                                ("reduce-overhead", "torch.compile reduce-overhead", "compile:reduce-overhead")):
        r = modes.get(mode)
        if r and "speedup" in r:
            arms.append({"arm": label, "target": target, "row": r, "base": "base_ms", "mine": "with_cast_ms"})
        elif r:
            arms.append({"arm": label, "target": target, "why": f"failed: {r.get('error', '?')[:300]}"})
        else:
            arms.append({"arm": label, "target": target, "why": _why(rec, "compose") if compose is None or
                         (rec or {}).get("steps", {}).get("compose", {}).get("status") != "ok"
                         else "not run (not among bench_compose's --modes)"})
    e = (compose or {}).get("eager")
    arms.append({"arm": "eager, bench_compose's own pair (the control of its compiled arms)", "target": "eager",
                 **({"row": e, "base": "base_ms", "mine": "with_cast_ms"} if e else {"why": _why(rec, "compose")})})
    withhold_disagreeing_eager(arms[0], arms[-1])
    full = full_depth_spec(model).label
    if full in rows or full in failures or FULL_DEPTH_STEP in steps:
        fail = failures.get(full)
        arms += _e2e_arms(rows.get(full), f"failed: {fail[:300]}" if fail else _why(rec, FULL_DEPTH_STEP),
                          ", full depth", full_depth=True)
    return arms


# Two eager medians of one model, bench_e2e's and bench_compose's (the same forward on the same inputs, timed in
# two processes of one sitting), that differ by more than this: one of them ran on a disturbed host, and neither
# eager comparison is reported (engine.bench.hostload; ViT-B/16 on an H100 read 5.43 ms and 3.54 ms, and
# bench_e2e's 1.441x did not repeat: 1.006x in a later process, docs/results/report-2026-12-07/).
EAGER_AGREE = 1.10


def withhold_disagreeing_eager(e2e: dict[str, Any], control: dict[str, Any]) -> None:
    """Where bench_e2e's eager arm and bench_compose's eager pair both have numbers and their eager medians
    disagree by more than EAGER_AGREE, both arms lose their row for a `why` that gives the two medians and what
    each process's host did (a row kept as `withheld_row`)."""
    from engine.bench.hostload import describe, disturbed

    a, b = e2e.get("row"), control.get("row")
    if not a or not b or not a.get("eager_ms") or not b.get("base_ms"):
        return
    ratio = max(a["eager_ms"], b["base_ms"]) / min(a["eager_ms"], b["base_ms"])
    if ratio <= EAGER_AGREE:
        return
    hosts = "; ".join(f"{who}'s host: {disturbed(r.get('host_load')) or describe(r.get('host_load'))}"
                      for who, r in (("bench_e2e", a), ("bench_compose", b)) if r.get("host_load"))
    why = (f"withheld: the model's two eager timings disagree, {a['eager_ms']:.2f} ms (bench_e2e) and "
           f"{b['base_ms']:.2f} ms (bench_compose), {100 * (ratio - 1):.0f} % apart, so one ran on a disturbed "
           f"host and neither eager speedup stands ({a['speedup']:.3f}× and {b['speedup']:.3f}× as measured)"
           + (f"; {hosts}" if hosts else "") + "; time the model again (delete its e2e/ and compose/ folders)")
    for arm in (e2e, control):
        arm["withheld_row"] = arm.pop("row")
        for k in ("base", "mine"):
            arm.pop(k, None)
        arm["why"] = why


CHART = "speedups.svg"


def chart_groups(out: Path, models: list[str]) -> list[tuple[str, list[Any]]]:
    """Per model (and its full-depth row), its whole-forward arms as speedups over eager, for the chart. Only
    "eager + cast" is a pair timed together (its CI is drawn); the others divide medians of different pairings:
    torch.compile's arms bench_compose's (its own eager pair's eager median over each compiled arm's), CUDA
    graphs' bench_e2e's (its eager median over the eager graphs' and the cast graphs'), so they have none."""
    from engine.bench.chart import Bar

    groups: list[tuple[str, list[Any]]] = []
    for model in models:
        d = out / model
        arms = model_arms(d, model)
        compose = _load(d / "compose" / "bench_compose.json") or {}
        depth = shrunk_depth(model)

        def e2e_bars(row: dict | None) -> list[Any]:
            if not row:
                return []
            bars = [Bar("eager + cast", row["speedup"], tuple(row["speedup_ci"]))]
            g = row.get("cuda_graphs") or {}
            if "speedup" in g and g.get("eager_ms") and g.get("cast_ms"):
                bars += [Bar("CUDA graphs", row["eager_ms"] / g["eager_ms"]),
                         Bar("CUDA graphs + cast", row["eager_ms"] / g["cast_ms"])]
            return bars

        bars = e2e_bars(arms[0].get("row"))
        e = arms[4].get("row") or {}  # bench_compose's eager pair, unless withheld
        for mode, label in (("default", "torch.compile"), ("reduce-overhead", "reduce-overhead")):
            r = (compose.get("modes") or {}).get(mode) or {}
            if e.get("base_ms") and r.get("base_ms") and r.get("with_cast_ms"):
                bars += [Bar(label, e["base_ms"] / r["base_ms"]), Bar(f"{label} + cast", e["base_ms"] / r["with_cast_ms"])]
        groups.append((f"{model} ({depth[0]} of {depth[1]} layers)" if depth else model, bars))
        full = [a for a in arms if a.get("full_depth")]
        if full:
            groups.append((f"{model}, full depth", e2e_bars(full[0].get("row"))))
    return [(name, bars) for name, bars in groups if bars]


def speedup_chart(out: Path, models: list[str]) -> str | None:
    """The SVG of `chart_groups`, or None where no model has a number to draw."""
    from engine.bench.chart import bars_svg

    groups = chart_groups(out, models)
    if not groups:
        return None
    return bars_svg(groups, title="Whole forwards: speedup over eager", axis="× faster than eager (same GPU, "
                    "same sitting); whiskers: 95 % CI of a pair timed together", reference_label="eager")


def _targets_note(export: dict | None, target: str) -> str:
    """How many of the cast's variants serve `target` (a variant runs only under the targets it was kept for)."""
    inc = (export or {}).get("included")
    if not inc or not any("targets" in v for v in inc):
        return "?"
    n = sum(1 for v in inc if target in (v.get("targets") or ()))
    return f"{n} of {len(inc)}" if n else f"none of {len(inc)}: PyTorch runs"


def _sitting_line(s: dict) -> str:
    c, k = s.get("clocks") or {}, s.get("control") or {}
    clocks = (f"SM {c.get('clocks.sm', '?')} of {c.get('clocks.max.sm', '?')}, memory {c.get('clocks.mem', '?')}, "
              f"application {c.get('clocks.applications.graphics', '?')}, {c.get('temperature.gpu', '?')} °C, "
              f"driver {c.get('driver_version', '?')}" if c else "clocks not read (no nvidia-smi)")
    control = (f"bf16 8192² matmul {k['matmul_ms']:.3f} ms ({k['matmul_tflops']:.0f} TFLOP/s), copy "
               f"{k['copy_gbps']:.0f} GB/s, {k['host_us_per_launch']:.2f} µs to issue a tiny kernel"
               if "matmul_ms" in k else f"not measured ({k.get('error', 'no control in the record')})")
    commit = (s.get("commit") or "unknown")[:10] + (" + uncommitted changes" if s.get("dirty") else "")
    return (f"{s.get('started', '?')} on {s.get('host', '?')}, {s.get('gpu', '?')} ({clocks}); eager control: "
            f"{control}; code {commit} (source {(s.get('source_digest') or '?')[:10]})")


def _host_line(what: str, row: dict | None, why: str | None) -> str:
    """bench_e2e's host time per forward of one row, eager and with the cast, or why it is missing."""
    host = (row or {}).get("host")
    if not host:
        return f"{what}: – ({why or 'not in bench_e2e.json (older script)'})."
    e, c = host["eager"], host["cast"]
    return (f"{what} (GPU idle before each): eager {e['issue_us']:.0f} µs to issue, {e['kernels']} kernels + "
            f"{e['copies']} copies, {e['us_per_launch']:.2f} µs per launch; with the cast {c['issue_us']:.0f} µs, "
            f"{c['kernels']} + {c['copies']}, {c['us_per_launch']:.2f} µs per launch.")


def counted_key(cards: dict[str, dict[str, Any]], cid: str) -> str:
    """What a card's share of the model's time is counted once by (`engine.capture.twins.call_key`: a card and its
    channels-last twin), a conv-bias fold (engine.capture.folds) by the chain it was folded from: the same
    GroupNorm -> SiLU calls, with the convolution's bias add in front, which the chain's share does not hold."""
    from engine.capture.twins import call_key

    seen: set[str] = set()
    while cid in cards and cid not in seen:
        seen.add(cid)
        sig = cards[cid].get("signature")
        sig = json.loads(sig) if isinstance(sig, str) else sig
        if not isinstance(sig, dict):
            return cid
        origin = (sig.get("folded_from") or {}).get("card")
        if origin in cards:
            cid = origin
            continue
        return call_key(cards[cid]["op"], sig)
    return cid


def per_model_section(out: Path, models: list[str], covered: dict[str, float], chart: bool = False) -> list[str]:
    """The whole-forward arms of every model: a summary, where we lose, then per model its arms, host time per
    forward and its sittings. A number that is not there says why."""
    from engine.cast.compose import describe_layout_copies

    summary, lose, detail = [], [], []
    short = lambda why: why.split(":")[0]  # noqa: E731  (the summary's cell; the model's table has the rest)
    for model in models:
        d = out / model
        rec, export = _load(d / RECORD), _load(d / "export.json")
        arms = model_arms(d, model)
        if rec is None and all("why" in a for a in arms) and model_facts(d) is None:
            summary.append(f"| {model} | – (not run) | | | | | | |")
            continue
        def cell(a: dict[str, Any]) -> str:
            if "row" not in a:
                return f"– ({short(a['why'])})"
            r = a["row"]
            return f"{r['speedup']:.3f}× ({r['speedup_ci'][0]:.3f}–{r['speedup_ci'][1]:.3f})"

        full = [a for a in arms if a.get("full_depth")]
        depth = shrunk_depth(model)
        eager = arms[0].get("row")
        comp = next((a["row"] for a in arms if a["target"] == "compile" and "row" in a), None)
        ctrl = arms[4].get("row")
        alone = (f"{ctrl['base_ms'] / comp['base_ms']:.2f}×" if comp and ctrl else "–")
        name = f"{model} ({depth[0]} of {depth[1]} layers)" if depth else model
        summary.append(f"| {name} | {_f(eager and eager['eager_ms'], '.2f')} | " + " | ".join(map(cell, arms[:4])) +
                       f" | {alone} | {_f(100 * covered[model] if model in covered else None, '.0f')} % |")
        if full:  # bench_e2e alone runs the real depth: its two arms, the compiled ones not measured
            layers = f", {depth[1]} layers" if depth else ""
            summary.append(f"| {full_depth_spec(model).label} (full depth{layers}) | "
                           f"{_f(full[0].get('row') and full[0]['row']['eager_ms'], '.2f')} | "
                           + " | ".join(map(cell, full)) + " | – (not run at full depth) | – | – | – |")
        for a in arms:
            if "row" not in a:
                continue
            lo, hi = a["row"]["speedup_ci"]
            x = a["row"]["speedup"]
            # Enough digits that a CI wholly below 1 does not print as "1.000": 0.9996× (0.9993–0.9998).
            fmt = ".3f" if hi < 1 and round(hi, 3) < 1 or hi >= 1 and round(lo, 3) <= 1 else ".4f"
            idle = ("; the cast has nothing for this mode, so cast.compile is torch.compile itself: both arms ran "
                    "one compiled function, and what differs is the cast being installed and the timing"
                    if a["row"].get("torch_compile_own") else
                    "; none of the cast's variants serves this target, so both arms run PyTorch's kernels"
                    if _targets_note(export, a["target"]).startswith("none of") else "")
            if (a["target"].startswith("compile") and (a["row"].get("pooled_over") or 1) < 2
                    and not a["row"].get("torch_compile_own")):
                idle += "; one process (see the model's section)"
            if hi < 1:
                lose.append(f"- {model}, {a['arm']}: slower with the cast, {x:{fmt}}× "
                            f"(95 % CI {lo:{fmt}}–{hi:{fmt}}){idle}")
            elif lo <= 1:
                lose.append(f"- {model}, {a['arm']}: no gain shown, {x:{fmt}}× "
                            f"(95 % CI {lo:{fmt}}–{hi:{fmt}} holds 1){idle}")
        if arms[0].get("withheld_row"):
            lose.append(f"- {model}, eager: {arms[0]['why']}")
        if comp and ctrl and comp["base_ms"] < ctrl["with_cast_ms"]:
            lose.append(f"- {model}: torch.compile alone ({comp['base_ms']:.2f} ms) is faster than eager + cast "
                        f"({ctrl['with_cast_ms']:.2f} ms, bench_compose's pairs)")
        detail += ["", f"### {model}", "", "| arm | without cast ms | with cast ms | speedup (95 % CI) | "
                   "rel. L2 vs eager | cast variants for this target |", "|---|---:|---:|---|---:|---|"]
        for a in arms:
            if "row" in a:
                r = a["row"]
                err = _f(r.get("rel_l2_err"), ".1e") + (f" (alone {r['rel_l2_err_plain']:.1e})"
                                                        if r.get("rel_l2_err_plain") is not None else "")
                detail.append(f"| {a['arm']} | {_speed(r, a['base'], a['mine'])} | {err} | "
                              f"{_targets_note(export, a['target'])} |")
            else:
                detail.append(f"| {a['arm']} | – | – | {a['why']} | – | {_targets_note(export, a['target'])} |")
        single = [a["arm"] for a in arms if a["target"].startswith("compile") and "row" in a
                  and (a["row"].get("pooled_over") or 1) < 2 and not a["row"].get("torch_compile_own")]
        if single:
            detail += ["", f"{'; '.join(single)}: measured in one process, so the CI holds that process's two "
                       "compiles only. Two compiles of the same model differed by −2.4 % to +4.1 % on the H200 "
                       "(2026-12-04d); `--compose-processes K` pools the pair over K fresh processes."]
        from engine.export.report import attention_routes_text, graph_routes_text, layout_routes_text

        # what the export's route checks kept or tried (export --layout-routes, --graph-routes; attention routes
        # under a compile target)
        for key, text in (("layout_routes", layout_routes_text), ("graph_routes", graph_routes_text),
                          ("attention_routes", attention_routes_text)):
            if isinstance((export or {}).get(key), dict):
                g = text({key: export[key]})
                detail += ["", g[0].upper() + g[1:] + "."]
        if depth:
            then = (f"the full-depth arms run the same cast on every layer (`{full_depth_spec(model).label}`)."
                    if full else "`reproduce.py --full-depth` adds bench_e2e of every layer.")
            detail += ["", f"Depth: the arms without \"full depth\" run the model as captured, {depth[0]} of its "
                       f"{depth[1]} layers, which over-weights what runs once per forward (an LM head, a VAE); {then}"]
        for mode, r in ((_load(d / "compose" / "bench_compose.json") or {}).get("modes") or {}).items():
            copies = describe_layout_copies(r.get("layout_copies"))
            if copies:
                detail += ["", f"Layouts under torch.compile {mode}: {copies}."]
            if r.get("pattern_matches") or r.get("pattern_misses"):  # a pattern card that matched but missed
                missed = "; ".join(f"{name} missed {w['misses']} call(s), which brought {' | '.join(w['calls_brought'])}"
                                   f" (proven for {' | '.join(w['proven_for'])})"
                                   for name, w in (r.get("pattern_misses") or {}).items())
                detail += ["", f"Pattern cards under torch.compile {mode}: "
                           f"{sum((r.get('pattern_matches') or {}).values())} match(es) in the compiled graphs, "
                           f"{r.get('hits_per_forward', 0)} hit(s) per forward" + (f"; {missed}" if missed else "")]
        detail += ["", _host_line("Host time per forward", eager, arms[0].get("why"))]
        timed = eager or arms[0].get("withheld_row") or {}
        if timed.get("settled") or timed.get("host_load"):  # how bench_e2e's eager pair was timed
            from engine.bench.forward import describe_settle
            from engine.bench.hostload import describe

            detail.append(f"bench_e2e's eager pair: eager settled first, {describe_settle(timed.get('settled'))}; "
                          f"the host while timed: {describe(timed.get('host_load'))}.")
        if full:
            detail.append(_host_line("At full depth", full[0].get("row"), full[0].get("why")))
        cov = covered.get(model)
        detail.append(f"Model time covered by the cast's kernels: {_f(100 * cov if cov is not None else None, '.0f')} %"
                      + ("" if cov is not None else " (no run facts)") + " (captured shares of the cards won and "
                      "in the cast).")
        for i, s in enumerate((rec or {}).get("sittings", [])):
            steps = [f"{n} {st['status']}" for n, st in (rec.get("steps") or {}).items() if st.get("sitting") == i]
            detail.append(f"Sitting {i + 1}: {_sitting_line(s)}" + (f"; steps: {', '.join(steps)}" if steps else ""))
        if not (rec or {}).get("sittings"):
            detail.append("Sitting: not recorded (results from before reproduce.py kept a record).")
    head = ["## Per model, whole forwards", "",
            "Each model in its own sitting (`reproduce.py --models NAME`): arms alternated, medians, paired "
            "bootstrap 95 % CI of the speedup. Speedups are without the cast ÷ with it, within each arm: eager "
            "(bench_e2e), CUDA graphs (eager graphs vs cast graphs, bench_e2e), torch.compile default and "
            "reduce-overhead alone vs + cast (`cast.compile`, bench_compose). \"torch.compile alone vs eager\" "
            "divides medians of bench_compose's different pairings.", "",
            *([f"![Each model's whole forwards as speedups over eager]({CHART})", "",
               "The chart: every arm against eager (the dashed line). Only eager + cast is a pair timed together, "
               "with its 95 % CI; the other bars divide medians of different pairings (torch.compile's from "
               "bench_compose, CUDA graphs' from bench_e2e), so they carry no interval. The table below has each "
               "arm against its own baseline with a CI.", ""] if chart else []),
            "| model | eager ms | eager + cast | CUDA graphs: + cast | torch.compile + cast vs alone | "
            "reduce-overhead + cast vs alone | torch.compile alone vs eager | model time covered |",
            "|---|---:|---|---|---|---|---:|---:|"] + (summary or ["| – | | | | | | | |"])
    head += ["", "### Where we lose", ""] + (lose or ["- nowhere among the arms measured"])
    return head + detail


def sittings_gpu(out: Path, models: list[str]) -> str:
    """The GPU the models' sittings ran on, as the report names it ("H200"; "H100 and H200" where they differ;
    "the sittings' GPU" where no sitting recorded one)."""
    names = set()
    for model in models:
        for s in (_load(out / model / RECORD) or {}).get("sittings", []):
            gpu = s.get("gpu")
            if isinstance(gpu, str) and gpu:
                m = re.search(r"\b([A-Z]{1,3}\d{2,4}[A-Za-z]?)\b", gpu.replace("NVIDIA ", ""))
                names.add(m.group(1) if m else gpu)
    return " and ".join(sorted(names)) if names else "the sittings' GPU"


def report(out: Path, models: list[str], allow_mixed: bool = False, chart: bool = False) -> str:
    """The Markdown report of OUT's per-model results; raises MixedRuns when they come from different code
    (unless allow_mixed, which flags it at the top)."""
    from engine.bench.floor import card_flops, is_compute_op
    from engine.capture.hidden import row_shares
    from engine.outcomes import faster_with_confidence

    mixed = mixed_code(out, models)
    if mixed and not allow_mixed:
        raise MixedRuns(mixed)
    gpu = sittings_gpu(out, models)
    lines = ["# Kernel Forge: reproduced results", "",
             f"Assembled by `python scripts/reproduce.py --out {out} --report-only` "
             f"({time.strftime('%Y-%m-%d')}) from per-model sittings. Builtin proposer; eager, torch.compile "
             "and the roofline beside every number. Timing: L2 flushed and the GPU kept busy before each timed "
             "call, medians, paired bootstrap 95 % CI.", ""]
    if mixed:
        lines += [f"**Mixed code: these results come from different code ({mixed}); numbers of different "
                  "rows are not one experiment.**", ""]
    harness, won_rows, compile_notes = [], [], []
    captured_ops: dict[str, dict[str, float]] = {}
    covered_by: dict[str, float] = {}
    for model in models:
        d = out / model
        facts = model_facts(d)
        if facts is None:
            lines.append(f"- {model}: no run facts ({d / FACTS} or {d / 'kforge.db'}): "
                         f"{_why(_load(d / RECORD), 'run')}.")
            continue
        for card in facts["cards"].values():
            op_share = captured_ops.setdefault(model, {})
            op_share[card["op"]] = max(op_share.get(card["op"], 0.0), card["share"] or 0.0)
        compile_doc = _load(d / "compile.json") or {}
        comp = {o["card_id"]: o for o in compile_doc.get("ops", [])}
        in_cast_ids = _cast_cards(d / f"{model}.cast")
        tflops = matmul_tflops(_load(d / RECORD))
        counted: dict[str, float] = {}   # the calls' key -> the largest share of a card in the cast for them
        shares = row_shares(facts["cards"])   # a convolution's bias add: its part of the convolution's share
        for cid, cands in facts["candidates"].items():
            card = facts["cards"][cid]
            ok = [c for c in cands if c["status"] == "verified" and c["best_us"]]
            if not ok:
                continue
            best = min(ok, key=lambda c: c["best_us"])
            if not faster_with_confidence((best["speedup_low"], best["speedup_high"])):
                continue
            in_cast = cid in in_cast_ids
            if in_cast:  # a card, its channels-last twin and its conv-bias fold are the same calls: counted once
                key = counted_key(facts["cards"], cid)
                counted[key] = max(counted.get(key, 0.0), shares.get(cid) or 0.0)
            roof = card.get("roofline_us")
            sig = card.get("signature")
            sig = json.loads(sig) if isinstance(sig, str) else sig
            flops = card_flops(card["op"], sig) if is_compute_op(card["op"]) and isinstance(sig, dict) else None
            of_peak = 100 * flops / (best["best_us"] * 1e-6) / (tflops * 1e12) if flops and tflops else None
            won_rows.append((model, card, best, comp.get(cid, {}), len(cands), in_cast_ids.get(cid),
                             100 * roof / best["best_us"] if roof else None, of_peak))
        covered_by[model] = sum(counted.values())
        # bench_compile_ops' whole-model torch.compile (--compile-ops, or results from before bench_compose),
        # beside the eager time of its own measurement.
        whole = compile_doc.get("whole_model") or {}
        same = f" (eager {whole['eager_ms']:.2f} ms in the same measurement)" if whole.get("eager_ms") else ""
        if whole.get("error"):
            compile_notes.append(f"- {model}: {whole['error']}")
        elif whole.get("instead_of"):
            compile_notes.append(f"- {model}: torch.compile's {whole.get('mode')} mode, "
                                 f"{_f(whole.get('compile_ms'), '.2f')} ms: {whole['instead_of']}{same}")
        elif whole.get("asked_mode"):
            compile_notes.append(f"- {model}: torch.compile's {whole['asked_mode']} mode (asked for with "
                                 f"`--compile-mode`), {_f(whole.get('compile_ms'), '.2f')} ms{same}")
        elif whole.get("compile_ms") is not None:
            compile_notes.append(f"- {model}: torch.compile's {whole.get('mode') or COMPILE_MODE} mode, "
                                 f"{whole['compile_ms']:.2f} ms{same}")
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
    lines += per_model_section(out, models, covered_by, chart)
    if compile_notes:
        lines += ["", "torch.compile of the whole model by `bench_compile_ops.py` (`--compile-ops`):"] + compile_notes
    if missing:
        lines += ["", "Without run facts (no per-card tables):"] + missing
    lines += ["", "## Every card a kernel won (CI lower bound > 1 in the run)", "",
              "| model | op | signature | calls | share | eager µs | torch.compile µs | Kernel Forge µs (95 % CI of "
              "speedup) | % of roofline | % of copy | % of matmul peak | in cast (category) | candidates |",
              "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|---:|"]
    for model, card, best, comp, n, in_cast, roof, of_peak in won_rows:
        sig = card.get("signature_text") or ""
        if not sig:
            try:
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
                     f"{_f(roof, '.0f')} | {of_copy} | {_f(of_peak, '.0f')} | {in_cast or 'no'} | {n} |")
    lines += ["", "% of roofline: the card's bytes at the lane's copy bandwidth, over the kernel's time; % of copy: the "
              "kernel's time over the lane's own copy of the same bytes (100: as fast as that copy); % of matmul peak "
              "(compute-bound ops): the kernel's FLOP rate over the sitting's bf16 8192² matmul (its control)."]
    lines += bandwidth_target(won_rows, is_compute_op)
    lines += ["", "## Harness", "", "| model | evaluations | candidates / min | median compile ms (uncached) | "
              "median time to first verified kernel per card | LLM tokens and cost | run stopped by |",
              "|---|---:|---:|---:|---:|---|---|"] + harness
    builtin = out / "builtin" / "bench_builtin.md"
    search = out / "search" / "bench_search.md"
    missing = "not run into this folder (`reproduce.py --extras` runs it)"
    lines += ["", "## Issue-4 target cards", ""]
    lines += [builtin.read_text().split("\n", 2)[2] if builtin.exists() else missing + "."]
    lines += ["", "## Search ablation", ""]
    lines += [search.read_text().split("\n", 2)[2] if search.exists() else missing + "."]
    lines += ["", "## Beside the original Kernel Forge study", "",
              f"Theirs on a GB10, ours on an {gpu} — different GPUs; the same operators of the same models.", "",
              f"| operator (model) | original Kernel Forge (GB10) | ours ({gpu}): best card of that op |",
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
    ap.add_argument("--models", default=",".join(ALL_MODELS),
                    help="comma-separated (default: all); one per sitting fits a 10-minute device command")
    ap.add_argument("--workspaces", type=Path, default=Path("/tmp/kforge-reproduce"))
    ap.add_argument("--wall-time", type=float,
                    help="each run's wall time in seconds, capture and eager timing included (default: per model, "
                         "WALL_S); a sitting that resumes it gives it what is left, at least RESUME_MIN_S")
    ap.add_argument("--ops", help="search only the cards whose op matches REGEX (`run --ops`)")
    ap.add_argument("--targets",
                    help="`export --target`: what the cast's variants are proven for (default: per model, "
                         f"{TARGETS}, and for sd35_vae also compile:reduce-overhead; an arm whose target is not "
                         "among them runs PyTorch's kernels, and the report says so)")
    ap.add_argument("--deadline", type=float, metavar="S",
                    help="end this sitting's steps within S seconds (a step that would run past it is stopped or "
                         "skipped, and the record says so); e.g. 540 in a 10-minute device command")
    ap.add_argument("--pack", type=Path, metavar="DIR",
                    help="after the steps, copy each model's report inputs (at most 8 files) to DIR/MODEL")
    ap.add_argument("--compile-ops", action="store_true",
                    help="also bench_compile_ops.py: per-card torch.compile and the whole model in --compile-mode")
    ap.add_argument("--compile-mode", choices=(COMPILE_MODE, "default"), default=COMPILE_MODE,
                    help="with --compile-ops: torch.compile mode of bench_compile_ops' whole-model comparison")
    ap.add_argument("--full-depth", action="store_true",
                    help="after a model's steps, also bench_e2e of its cast on the model at its real depth "
                         "(NAME@full_depth=true: gemma4_e2b, qwen35_a3b, sd35_medium), a row beside the shrunk one")
    ap.add_argument("--extras", action="store_true",
                    help="the issue-4 target cards and the search ablation (a sitting of their own)")
    ap.add_argument("--graph-routes", action=argparse.BooleanOptionalAction, default=True,
                    help="export with graph routes tried (replaying the model's repeated modules from CUDA graphs; "
                         "the export's default); --no-graph-routes exports without")
    ap.add_argument("--compose-processes", type=int, default=1, metavar="K",
                    help="bench_compose in K fresh processes, each compiled pair pooled over them (its --processes): "
                         "a difference between compiles then counts only where it holds across processes")
    ap.add_argument("--report-only", action="store_true", help="assemble OUT/report.md from the per-model results")
    ap.add_argument("--allow-mixed-commits", action="store_true",
                    help="with --report-only: write the report of results from different code, flagged at its top")
    ap.add_argument("--models-only", action="store_true", help=argparse.SUPPRESS)  # the default now
    ap.add_argument("--gpus", help="GPU indices to share the models out over, one process each (e.g. 0,1)")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    if not 1 <= args.compose_processes <= 10:
        print(f"error: --compose-processes {args.compose_processes}: use 1 to 10", file=sys.stderr)
        return 2
    bad = [m for m in models if m not in ALL_MODELS]
    if bad:
        print(f"error: --models: unknown {bad[0]!r}; use {', '.join(ALL_MODELS)}", file=sys.stderr)
        return 2
    gpus = [g.strip() for g in (args.gpus or "").split(",") if g.strip()]
    if args.gpus is not None and (not gpus or not all(g.isdigit() for g in gpus) or len(set(gpus)) != len(gpus)):
        print(f"error: --gpus {args.gpus!r}: use distinct GPU indices separated by commas, e.g. 0,1", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        try:
            svg = speedup_chart(args.out, models)  # written only with the report (not where it refuses)
            text = report(args.out, models, allow_mixed=args.allow_mixed_commits, chart=svg is not None)
        except MixedRuns as e:
            print(f"error: {args.out}: the models' results come from different code ({e}); run them again on one "
                  "commit, or pass --allow-mixed-commits to write a report that says so", file=sys.stderr)
            return 2
        (args.out / "report.md").write_text(text)
        if svg is not None:
            (args.out / CHART).write_text(svg)
        else:  # a chart left from an earlier report would not be of these results
            (args.out / CHART).unlink(missing_ok=True)
        log(f"wrote {args.out / 'report.md'}" + (f" and {args.out / CHART}" if svg is not None else ""))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("error: reproduce needs a CUDA GPU (use --report-only to assemble the report)", file=sys.stderr)
        return 2
    deadline = time.time() + args.deadline if args.deadline else None
    if len(gpus) > 1:
        def argv_for(m: str) -> list[str]:
            argv = [sys.executable, str(Path(__file__).resolve()), "--out", str(args.out.resolve()),
                    "--workspaces", str(args.workspaces.resolve()), "--models", m, "--compile-mode", args.compile_mode]
            argv += ["--targets", args.targets] if args.targets else []
            argv += ["--wall-time", str(args.wall_time)] if args.wall_time else []
            argv += ["--ops", args.ops] if args.ops else []
            argv += ["--full-depth"] if args.full_depth else []
            argv += ["--graph-routes" if args.graph_routes else "--no-graph-routes"]
            argv += ["--compose-processes", str(args.compose_processes)]
            return argv + (["--compile-ops"] if args.compile_ops else [])

        codes = on_gpus(models, gpus, argv_for, args.out)
        failed = {m: c for m, c in codes.items() if c != 0}
        if failed:
            log(f"per-model steps that exited non-zero: {failed} (their logs: {args.out}/<model>.gpu<N>.log)")
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[0]  # the steps after the models: the first GPU
    else:
        if gpus:
            os.environ["CUDA_VISIBLE_DEVICES"] = gpus[0]
        for m in models:
            model_steps(m, args.out, args.workspaces, args.wall_time, args.compile_mode, ops=args.ops,
                        targets=args.targets, deadline=deadline, compile_ops=args.compile_ops,
                        full_depth=args.full_depth, graph_routes=args.graph_routes,
                        compose_processes=args.compose_processes)
    if args.extras:
        py = sys.executable
        step("target cards", args.out / "builtin" / "bench_builtin.md",
             [py, "scripts/bench_builtin.py", "--out", str(args.out / "builtin")], args.out / "steps.log")
        # The three target cards with the widest parameter spaces, 12 evaluations per card, strategy and
        # seed (216 in all, about 5 minutes on an H200): all 11 cards at 20 x 3 seeds came to ~2,000
        # evaluations, more than one sitting's GPU time.
        step("search ablation", args.out / "search" / "bench_search.md",
             [py, "scripts/bench_search.py", "--model", "targets", "--only", *ABLATION_CARDS, "--budget", "12",
              "--seeds", "2", "--timing-s", "0.3", "--out", str(args.out / "search")], args.out / "steps.log")
    if args.pack:
        for m in models:
            log(f"{m}: packed {', '.join(pack(args.out, m, args.pack)) or 'nothing'} into {args.pack / m}")
    log(f"assemble the report with: python scripts/reproduce.py --out {args.out} --report-only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
