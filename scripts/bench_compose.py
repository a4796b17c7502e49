"""A cast under torch.compile on one model, whole forwards: eager, eager + cast, and per compile mode
torch.compile alone against torch.compile + cast (`Cast.compile`), alternating, medians with paired 95 % CIs;
output agreement with eager; the cast's hits per forward; compile time of each compiled arm.

    python scripts/bench_compose.py --out DIR [--model sd35_vae|CONFIG[@key=value,...]] [--cast FILE]
                                    [--keep REGEX] [--modes default,reduce-overhead] [--iters N]

Without --cast the cast is built here with the builtin proposer (`engine.export.direct.build_cast`: capture,
a small search, confirmation in a fresh process) for the ops matching --keep. Compile time: each compiled arm's
first call, from fresh Inductor and Triton cache folders, after the model was compiled once and thrown away
(Inductor's start in a process is paid by neither arm; not where every pair is one compile, the cast having
nothing for any mode measured); which arm compiles first alternates by mode, and the record says which. Writes
DIR/bench_compose.json and DIR/bench_compose.md.

Timing: the arms take turns. A turn is the arm's setup (the cast's arm installs the cast), a garbage collection
(with --block above 1), --warm-calls untimed calls, then --block timed calls back to back (defaults 1 and 4);
the turn's sample is their median. One timed call per turn let the install's wake into every sample of the
cast's arm: eager-only casts, with no kernel of theirs running, read 2-3 % slower than torch.compile alone (H200,
2026-12-04e).

A config written CONFIG@key=value[,key=value] is built with those [params] overridden (TOML values), e.g.
gemma4_e2b@full_depth=true for the real depth; the report names the model as written.

--inductor KEY=VALUE sets an Inductor config entry while both arms compile; --cast-inductor KEY=VALUE only
while the cast's arm compiles (e.g. layout_optimization=false: the convolutions stay in eager's layout, so
the cast's ops need no layout copies, against torch.compile alone as users run it). The record names both.

--control adds, per compile mode, arms timed against torch.compile alone, to tell where a difference comes
from: torch.compile alone timed again as an arm of its own (A/A: the timing's own bias, which should read
1.000), the graph compiled through the cast's backend run with the cast not installed (the backend), torch.compile
alone run with the cast installed (the installed routes), torch.compile alone run right after the cast was
installed and removed (what the cast's arm, installed around each call, leaves to the call after), both, and
torch.compile alone compiled a second time (the same code through a backend equal only to itself: how far
two compiles differ, as the cast's arm is a compile of its own). The arms take turns in balanced orders
(`engine.bench.stats.balanced_orders`): each follows every other equally often. The first version rotated one
order, so each arm kept its predecessor, and its "compiled again" arm was the same compiled function (Dynamo
reuses its code for the same frame and backend): that A/A arm read 1.017x (1.012-1.019) on ResNet-50 under
reduce-overhead (2026-12-03h). A second compile in one process loads the same generated source once (its Triton
kernels keep their tuning), so how far two processes' compiles differ is measured by running this script again.

--processes K runs the whole measurement in K fresh processes, one after another (DIR/process-1 ...; which
arm compiles first alternates between them too), and pools each compiled pair over them
(`engine.bench.stats.pooled_speedup`: the geometric mean and a t-interval whose error is the larger of the
spread between processes and their own CIs). Within one process a CI tells two compiled models apart; only
the spread between processes says whether the cast, and not the compile it happened to get, made the
difference. Needs --cast (each process must measure the same cast). The pool is written after each process,
and --pool-only pools the DIR/process-N records already there (a run cut short by a time limit).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# Where the model runs: "cuda" for every measurement. A test sets "cpu" to drive this script's control flow (arms,
# compile order, Dynamo record, report) without a GPU; what it times there is not a measurement of anything. The
# processes of --processes inherit it through KFORGE_COMPOSE_DEVICE.
DEVICE = os.environ.get("KFORGE_COMPOSE_DEVICE", "cuda")


def sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


WARM_CALLS = 1  # untimed calls of an arm, in its state, before each timed one (--warm-calls)
# Timed calls per turn of an arm, back to back after its warm calls; the turn's sample is their median (--block).
# With one call per turn, eager-only casts under torch.compile (one compile for both arms, no kernel of ours
# running) read 0.974-0.979 of torch.compile alone, slower with confidence over 3 processes; with 4, 0.984-0.997
# and no difference shown (H200, docs/results/reproduce-h200/2026-12-04e/).
BLOCK = 4


# The example inputs varied from forward to forward (engine.bench.varied.Varied, set in main): every arm of a
# round on the same variants, no forward on inputs an earlier one saw.
VARIED = None


def timed(run) -> float:
    """µs of a call made right after WARM_CALLS untimed calls of it, in the arm's state (its steady state, as a
    model in use runs; engine.bench.forward.time_steady says why): CUDA events on the GPU, the wall clock elsewhere.
    With BLOCK > 1 (--block), the median of BLOCK such calls made one after another, after a garbage collection:
    what an arm's setup around its turn (a cast installed and removed) leaves to Python's collector and to the host
    is paid once per turn, outside the timed calls, as a model in use pays its cast's install once."""
    from engine.bench.forward import time_steady

    kw = {"before": VARIED.before} if VARIED is not None else {}
    if BLOCK <= 1:
        return time_steady(run, DEVICE, WARM_CALLS, **kw)
    gc.collect()
    # what survived is frozen (main unfreezes it): the next turn's collection scans only what came since. Each
    # full collection of a heap holding Dynamo's and Inductor's state took 0.3 s, 21 of a 49 s CPU run.
    gc.freeze()
    ts = [time_steady(run, DEVICE, WARM_CALLS, **kw)] + [time_steady(run, DEVICE, 0, **kw) for _ in range(BLOCK - 1)]
    return sorted(ts)[len(ts) // 2]


def steady_us(run) -> float:
    """The median of three `timed` turns of `run` (to size the rounds), then the example inputs back: each turn
    copies a new variant in, and the outputs compared after it must be the example's (the eager row read a
    rel. L2 of 1.17 against eager with no hit of the cast, its output one of the variants', 2026-12-07)."""
    try:
        return sorted(timed(run) for _ in range(3))[1]
    finally:
        if VARIED is not None:
            VARIED.restore()


def log(msg: str) -> None:
    print(f"[bench_compose {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fresh_caches(root: Path, name: str) -> None:
    """Point Inductor's and Triton's on-disk caches at an empty folder (read at each compile): on the GPU, every
    measurement. On the CPU (DEVICE "cpu": the script's control-flow test, whose compile times are no measurement)
    the caches stay where the environment has them, shared by every compile and every process of --processes: an
    empty folder there cost each compile a C++ build and each process Inductor's vector-ISA probe (about 6.6 s a
    process on a 2-core CI machine)."""
    if DEVICE != "cuda":
        return
    d = root / name
    (d / "triton").mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(d)
    os.environ["TRITON_CACHE_DIR"] = str(d / "triton")


def hits(cast: Any) -> int:
    return sum(v["hits"] for v in cast.stats()["variants"])


PRECISION = 0.02  # widest 95 % CI a comparison settles for when --iters is 0 (as the export's check)
MAX_S = 30.0  # seconds of timing per comparison at most, then


def rotate(arms: list[tuple[str, Any, Any]], iters: int, precision: float | None = None,
           max_s: float = 0.0) -> dict[str, dict[str, Any]]:
    """Time `arms` ((name, run, around or None), the first the reference) `iters` times each, in balanced
    orders (each arm follows every other equally often; two arms: a b, b a, ...); per arm after the first, its
    median and the paired CI of median(first)/median(arm). With `precision`, rounds of `iters` follow until
    every CI is at most that wide or `max_s` seconds have passed (default-mode ResNet-50 on the H200 gave CIs
    0.18 wide from 60 forwards)."""
    import contextlib

    from engine.bench.stats import balanced_orders, speedup_ci

    times: dict[str, list[float]] = {name: [] for name, _, _ in arms}
    orders = balanced_orders(len(arms))
    med = lambda xs: sorted(xs)[len(xs) // 2] / 1e3  # noqa: E731
    base = times[arms[0][0]]
    t0, done = time.perf_counter(), 0
    try:
        while True:
            for i in range(done, done + iters):
                first = VARIED.new_pair(WARM_CALLS + BLOCK) if VARIED is not None else 0
                for name, run, around in (arms[j] for j in orders[i % len(orders)]):
                    if VARIED is not None:
                        VARIED.seek(first)
                    with (around() if around else contextlib.nullcontext()):
                        times[name].append(timed(run))
            done += iters
            ests = {name: speedup_ci(base, times[name], paired=True) for name, _, _ in arms[1:]}
            settled = precision is not None and all(e.high - e.low <= precision for e in ests.values())
            if precision is None or settled or time.perf_counter() - t0 >= max_s:
                break
    finally:   # the example inputs back: outputs compared after a comparison are the example's
        if VARIED is not None:
            VARIED.restore()
    return {name: {"ms": med(times[name]), "base_ms": med(base), "speedup": e.speedup,
                   "speedup_ci": [e.low, e.high], "iters": done,
                   **({"precise": settled} if precision is not None else {})} for name, e in ests.items()}


def pair(a, b, iters: int, around_b=None, precision: float | None = None, max_s: float = 0.0) -> dict[str, Any]:
    """Alternate `a` and `b` forwards `iters` times each (more rounds as `rotate`); medians and the paired CI
    of median(a)/median(b); `host_load`: what else the host did meanwhile (engine.bench.hostload)."""
    from engine.bench.hostload import HostWatch

    with HostWatch() as watch:
        r = rotate([("a", a, None), ("b", b, around_b)], iters, precision, max_s)["b"]
    return {"base_ms": r["base_ms"], "with_cast_ms": r["ms"], "speedup": r["speedup"],
            "speedup_ci": r["speedup_ci"], "iters": r["iters"], **({"precise": r["precise"]} if "precise" in r else {}),
            "host_load": watch.load.as_dict()}


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    finally:
        gc.unfreeze()  # what `timed` froze goes back to the collector (a caller's process lives on)


def _main(argv: list[str] | None) -> int:
    global VARIED
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--model", default="sd35_vae",
                    help="sd35_vae (the default) or a config name/path, optionally CONFIG@key=value[,key=value] to "
                         "override its [params] (e.g. gemma4_e2b@full_depth=true)")
    ap.add_argument("--small", action="store_true", help="the config's [small] size")
    ap.add_argument("--cast", type=Path, help="an existing cast (else one is built here)")
    ap.add_argument("--keep", default="", help="regex of ops to build variants for (default: every op)")
    ap.add_argument("--only", default="", help="regex: install just the cast's variants whose id or op matches it "
                                               "(e.g. native_group_norm: a cast's op variants without its pattern "
                                               "cards), to measure a part of a cast against the whole")
    ap.add_argument("--modes", default="default,reduce-overhead",
                    help="compile modes, comma-separated: default, max-autotune-no-cudagraphs, reduce-overhead")
    ap.add_argument("--control", action="store_true",
                    help="per mode, also time against torch.compile alone: itself as a second arm (A/A), the cast's "
                         "backend with the cast not installed, torch.compile alone with the cast installed, both")
    ap.add_argument("--iters", type=int, default=0,
                    help="forwards per arm, exactly (0: rounds of about 3 s per arm, 10 to 60 forwards, until the CI "
                         "is at most --precision wide or --max-s seconds have passed per comparison)")
    ap.add_argument("--precision", type=float, default=PRECISION, help="with --iters 0: the widest CI to settle for "
                                                                        "(default 0.02)")
    ap.add_argument("--max-s", type=float, default=MAX_S, help="with --iters 0: seconds of timing per comparison at "
                                                               "most (default 30)")
    ap.add_argument("--inductor", action="append", default=[], metavar="KEY=VALUE",
                    help="an Inductor config entry while both arms compile (repeatable)")
    ap.add_argument("--cast-inductor", action="append", default=[], metavar="KEY=VALUE",
                    help="an Inductor config entry while the cast's arm compiles (repeatable), "
                         "e.g. layout_optimization=false")
    ap.add_argument("--processes", type=int, default=1,
                    help="run everything in K fresh processes and pool each compiled pair over them (needs --cast)")
    ap.add_argument("--pool-only", action="store_true",
                    help="pool the --out DIR/process-N records already there (a --processes run cut short) and stop")
    ap.add_argument("--cast-first", choices=("even", "odd"), default="even",
                    help="which modes compile the cast's arm first: the even-numbered (default) or the odd")
    ap.add_argument("--warm-calls", type=int, default=WARM_CALLS,
                    help=f"untimed calls of an arm, in its state, before each timed one (default {WARM_CALLS})")
    ap.add_argument("--block", type=int, default=BLOCK,
                    help="timed calls per turn of an arm, back to back after its warm calls and a garbage collection; "
                         f"the turn's sample is their median (default {BLOCK}; 1: one call per turn, as before 2026-12-04e)")
    args = ap.parse_args(argv)
    if args.warm_calls < 1 or args.warm_calls > 20:
        print(f"error: --warm-calls {args.warm_calls}: use 1 to 20", file=sys.stderr)
        return 2
    if args.block < 1 or args.block > 50:
        print(f"error: --block {args.block}: use 1 to 50", file=sys.stderr)
        return 2
    globals()["WARM_CALLS"], globals()["BLOCK"] = args.warm_calls, args.block
    if args.pool_only:
        return pool_only(args)
    if args.processes < 1 or args.processes > 30:
        print(f"error: --processes {args.processes}: use 1 to 30", file=sys.stderr)
        return 2
    if args.processes > 1:
        if args.cast is None or not args.cast.is_file():
            print("error: --processes needs --cast FILE (an existing cast): every process must measure the same one",
                  file=sys.stderr)
            return 2
        return run_processes(args, list(sys.argv[1:] if argv is None else argv))
    try:
        both, cast_only = inductor_options(args.inductor, "--inductor"), inductor_options(args.cast_inductor,
                                                                                          "--cast-inductor")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    from engine.config import load_config, override_params, parse_model_spec
    from engine.errors import UsageError

    try:
        only_re = re.compile(args.only) if args.only else None
    except re.error as e:
        print(f"error: --only {args.only!r} is not a regular expression ({e}); e.g. --only native_group_norm",
              file=sys.stderr)
        return 2
    try:
        spec = parse_model_spec(args.model)
        if spec.name == "sd35_vae" and spec.params:
            raise UsageError(f"{args.model!r}: sd35_vae takes no overrides; use configs/examples/sd35_vae.toml@...")
        config = None if spec.name == "sd35_vae" else override_params(load_config(spec.name, small=args.small),
                                                                       spec.params)
    except UsageError as e:
        print(f"error: --model: {e}", file=sys.stderr)
        return 2

    import torch

    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("error: bench_compose: no CUDA GPU is visible; run it on the GPU the cast is for", file=sys.stderr)
        return 2
    from engine.bench.forward import auto_iters
    from engine.bench.varied import Varied
    from engine.cast import compose
    from engine.cast.loader import load
    from engine.config import sd35_vae
    from engine.export.e2e import rel_l2_err
    from engine.models.forwards import output_tensor

    args.out.mkdir(parents=True, exist_ok=True)
    caches = Path(tempfile.mkdtemp(prefix="kforge-compose-"))
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else f"{DEVICE} (a control-flow test, not a measurement)"
    doc: dict[str, Any] = {"gpu": gpu, "torch": torch.__version__, "model": args.model,
                           "date": time.strftime("%Y-%m-%d %H:%M"), "modes": {}, "warm_calls": WARM_CALLS,
                           "block": BLOCK,
                           **({"cast": str(args.cast)} if args.cast else {}),
                           **({"inductor": both} if both else {}), **({"cast_inductor": cast_only} if cast_only else {})}

    def save() -> None:
        (args.out / "bench_compose.json").write_text(json.dumps(doc, indent=1, default=str))
        (args.out / "bench_compose.md").write_text(report(doc))

    log(f"building {args.model}")
    if config is None:
        model, forward = sd35_vae()
    else:
        from engine.config import build_target
        target = build_target(config, torch.device(DEVICE))
        model, forward = target.module, target.forward
    enabled = lambda: cast.enabled(model)  # noqa: E731  (the model too: module cards patch its modules)
    cast_path = args.cast
    with torch.no_grad():
        if cast_path is None:
            from engine.export.direct import build_cast

            cast_path = args.out / "compose.cast"
            pat = re.compile(args.keep) if args.keep else None
            build = build_cast(forward, cast_path, work=caches / "build", model=args.model, progress=log,
                               keep=(lambda op: bool(pat.search(op))) if pat else (lambda op: True))
            doc["build"] = build
            save()
        cast = load(cast_path)
        if only_re is not None:
            ids = {v["id"] for v in cast.stats()["variants"] if only_re.search(v["id"]) or only_re.search(v["op"])}
            if not ids:
                print(f"error: --only {args.only!r} matches none of the cast's variants "
                      f"({', '.join(v['id'] for v in cast.stats()['variants'])})", file=sys.stderr)
                return 2
            cast = load(cast_path, only=ids)
            doc["only"] = args.only
        doc["variants"] = [{"id": v["id"], "op": v["op"]} for v in cast.stats()["variants"]
                           if only_re is None or v["id"] in ids]
        log(f"cast {cast_path}: {len(doc['variants'])} variant(s)")
        for _ in range(3):
            forward()
        eager_out = output_tensor(forward()).double()
        VARIED = Varied.record(model, forward)
        doc["inputs"] = VARIED.describe()
        log(f"inputs while timing: {doc['inputs']}")
        # turns per arm and round: about 3 s of one arm's calls, counted as turns of one warm and one timed call
        # (a turn of --block calls is that many more calls, and its sample a median of them)
        per_turn = (WARM_CALLS + BLOCK) / 2
        iters = args.iters or max(10, min(60, auto_iters(steady_us(forward) * per_turn, 3.0)))
        # --iters 0: rounds until the CI is narrow enough or the time is up; --iters N: exactly N
        until = {} if args.iters else {"precision": args.precision, "max_s": args.max_s}

        cast.reset_stats()
        with enabled():
            out = output_tensor(forward()).double()
        doc["eager"] = {"rel_l2_err": rel_l2_err(out, eager_out), "hits_per_forward": hits(cast),
                        **pair(forward, forward, iters, around_b=enabled, **until)}
        log(f"eager: {doc['eager']['base_ms']:.2f} ms, with cast {doc['eager']['with_cast_ms']:.2f} ms "
            f"({doc['eager']['speedup']:.3f}x)")
        save()

        # Inductor's first compile in a process also pays its own start (pattern passes filled lazily, the
        # compile workers started, the code generators' first use): paid here, on a small function and then on
        # the model itself (thrown away), so neither arm's compile time holds it. A small function alone left
        # most of it to whichever arm compiled first (ResNet-18 on the CPU: 13.9 s for the first compile of
        # the model after it, 4.3-5.3 s for each later one; ResNet-50 on the H200: 1.17x with the cast's arm
        # first, 0.85x with it second).
        # Where every mode's pair is one compile (the cast has nothing for any of them: `cast.compile` is
        # torch.compile's own), no arm's compile time is compared and the model is not compiled here: Qwen3.5's
        # 4 layers take about 230 s to compile on the H200, twice that would not fit a 10-minute command.
        modes = [m for m in args.modes.split(",") if m]
        warm_model = compiles_twice(cast, modes)
        fresh_caches(caches, "process-warm-up")
        t0 = time.perf_counter()
        torch.compile(lambda x: torch.nn.functional.silu(x * 2.0).sum(-1))(torch.randn(64, 64, device=DEVICE))
        if warm_model:
            torch.compile(forward)()
        sync()
        torch._dynamo.reset()
        doc["inductor_start_s"] = time.perf_counter() - t0
        doc["inductor_start_model"] = warm_model
        pattern_set = cast.pattern_set() if hasattr(cast, "pattern_set") else None
        for mode_index, mode in enumerate(modes):
            kw = {} if mode == "default" else {"mode": mode}
            replayed = mode == "reduce-overhead"  # CUDA graphs: a replay runs no Python, so counts no hit
            step = torch.compiler.cudagraph_mark_step_begin if replayed else (lambda: None)
            gc.unfreeze()  # the last mode's compiled functions and CUDA-graph pools, dropped, can be collected now
            torch._dynamo.reset()
            r: dict[str, Any] = {}
            try:
                from torch._dynamo.utils import counters

                def graphs() -> int:
                    return int(counters["stats"]["unique_graphs"])

                from engine.export.e2e import REPLAY_WARM_CALLS

                breaks0 = dict(counters["graph_break"])
                pass_s0 = pattern_set.seconds if pattern_set is not None else 0.0

                def first_call(arm: str, with_cast: bool, mode=mode, kw=kw, step=step, r=r, replayed=replayed,
                               key: str = "", own: bool = False) -> tuple[Any, int]:
                    """Compile the arm (fresh on-disk caches), time its first call into r[key] (default: the
                    arm's compile_s key); (callable, graphs compiled). Where the cast has nothing for the mode
                    (`own`, passed to both arms), both compile torch.compile's own graph: one cache folder for
                    the two, so that a cast whose module cards give the model another class forward (a second
                    Dynamo compile of the same graph) loads the first's code rather than compiling it again
                    (Qwen3.5's 4 layers: ~230 s each on the H200)."""
                    fresh_caches(caches, f"{mode}-own" if own else f"{mode}-{arm}")
                    g = graphs()
                    opts = {**both, **(cast_only if with_cast and not own else {})}  # own: the same for both
                    with enabled() if with_cast else contextlib.nullcontext(), \
                            torch._inductor.config.patch(**opts):  # read while the first call compiles
                        fn = cast.compile(forward, **kw) if with_cast else torch.compile(forward, **kw)
                        if with_cast and replayed:
                            cast.reset_stats()  # hits are counted over the calls that run Python (below)
                        t0 = time.perf_counter()
                        step()
                        fn()
                        sync()
                        r[key or ("compile_s_with_cast" if with_cast else "compile_s")] = time.perf_counter() - t0
                    return fn, graphs() - g

                # Which arm compiles first alternates by mode (what one compile leaves warm in the process
                # favours the next), and the record says which it was.
                cast_first = mode_index % 2 == (0 if args.cast_first == "even" else 1)
                # Nothing of the cast may run under this mode (its export kept nothing for it): cast.compile is
                # torch.compile itself, and Dynamo shares one compile between the two arms (compose.backend).
                own = compose.nothing_under(cast, mode)
                r["torch_compile_own"] = own
                if own:
                    log(f"{mode}: nothing of the cast runs under this mode: cast.compile is torch.compile's own code "
                        f"(one compile for both arms{'; --cast-inductor not applied' if cast_only else ''})")
                r["compiled_first"] = "with cast" if cast_first else "alone"
                for with_cast in ((True, False) if cast_first else (False, True)):
                    if with_cast:
                        fast, graphs_with_cast = first_call("cast", True, own=own)
                    else:
                        base, graphs_alone = first_call("plain", False, own=own)
                g2 = graphs()
                r["pattern_pass_s"] = (pattern_set.seconds - pass_s0) if pattern_set is not None else 0.0
                warm_hits = 0
                for i in range(3):
                    step()
                    base()
                    with enabled():
                        step()
                        fast()
                    if i == 0 and replayed:  # the cast arm's first two calls: its warm-up run and its recording
                        warm_hits = sum(v["hits"] for v in cast.stats()["variants"]) // REPLAY_WARM_CALLS
                step()
                r["rel_l2_err_plain"] = rel_l2_err(output_tensor(base()).double(), eager_out)
                cast.reset_stats()
                with enabled():
                    step()
                    r["rel_l2_err"] = rel_l2_err(output_tensor(fast()).double(), eager_out)
                st = cast.stats()
                r["hits_per_forward"] = sum(v["hits"] for v in st["variants"])
                if replayed:
                    r["hits_per_forward"] = warm_hits
                    r["hits_counted_over"] = "the warm-up and the recording (a replay runs no Python)"
                r["pattern_misses"] = st.get("pattern_misses", {})  # matched calls that no variant fitted
                r["pattern_problems"] = st.get("pattern_problems", {})
                r["pattern_matches"] = st.get("pattern_matches", {})  # per pattern op, over the graphs compiled
                r["layout_copies"] = st.get("layout_copies", {})  # Inductor's copies around the cast's ops

                def run_base(step=step, base=base):
                    step()
                    base()

                def run_fast(step=step, fast=fast):
                    step()
                    fast()

                g3 = graphs()
                r.update(pair(run_base, run_fast, iters, around_b=enabled, **until))
                # Dynamo's view of the two arms: graphs each compiled, breaks, and graphs compiled while timed
                # (a recompile there means an arm ran changed code, or eager's, during the measurement).
                r["dynamo"] = {"graphs_with_cast": graphs_with_cast, "graphs_alone": graphs_alone,
                               "graphs_in_warm_up": g3 - g2, "graphs_while_timed": graphs() - g3,
                               "graph_breaks": {str(k): v - breaks0.get(k, 0) for k, v in counters["graph_break"].items()
                                                if v - breaks0.get(k, 0)}}
                # One compile served both arms where the cast has nothing for the mode: no ratio to take
                r["compile_time_ratio"] = None if own else r["compile_s_with_cast"] / r["compile_s"]
                if args.control:  # which part of "with the cast" costs what, each arm against torch.compile alone
                    @contextlib.contextmanager
                    def toggled():  # the cast installed and removed just before the call, as the cast's arm has it
                        with enabled():
                            pass
                        yield

                    # torch.compile alone compiled a second time: a backend equal only to itself makes Dynamo
                    # compile the model again (the same code; its own CUDA-graph pool and allocations), as
                    # the cast's backend does. What it reads against the first compile is the compile's own spread.
                    fresh_caches(caches, f"{mode}-again")
                    g_again = graphs()
                    t0 = time.perf_counter()
                    with torch._inductor.config.patch(**both):
                        again = torch.compile(forward, backend=second_compile(kw.get("mode")))
                        step()
                        again()
                        sync()
                    r["compile_s_again"] = time.perf_counter() - t0
                    r["graphs_again"] = graphs() - g_again  # 0 would mean Dynamo reused the first compile's code

                    def run_again(step=step, again=again):
                        step()
                        again()

                    r["control"] = rotate([
                        ("alone", run_base, None),
                        ("alone, timed again (A/A)", run_base, None),                 # the timing's own bias
                        (AGAIN, run_again, None),                                     # the compile's own spread
                        ("the cast's backend, cast not installed", run_fast, None),  # the backend and its wrapper
                        ("alone, cast installed", run_base, enabled),                 # the installed routes
                        ("alone, right after the cast was installed and removed", run_base, toggled),  # its wake
                        ("the cast's backend, cast installed", run_fast, enabled)], iters, **until)
                    for name, c in r["control"].items():
                        log(f"{mode}: control, {name}: {c['ms']:.3f} ms, {c['speedup']:.3f}x of torch.compile alone "
                            f"(CI {c['speedup_ci'][0]:.3f}-{c['speedup_ci'][1]:.3f})")
                log(f"{mode}: torch.compile {r['base_ms']:.2f} ms, + cast {r['with_cast_ms']:.2f} ms "
                    f"({r['speedup']:.3f}x, CI {r['speedup_ci'][0]:.3f}-{r['speedup_ci'][1]:.3f}); compile "
                    f"{r['compile_s']:.1f} s vs {r['compile_s_with_cast']:.1f} s with the cast")
            except Exception as e:  # one mode failing is reported, the others still run
                import traceback

                r["error"] = f"{type(e).__name__}: {str(e)[:500]}"
                r["traceback"] = traceback.format_exc()[-3000:]
                log(f"{mode}: {r['error']}")
            doc["modes"][mode] = r
            save()
    save()
    print(report(doc))
    return 0


def compiles_twice(cast: Any, modes: list[str]) -> bool:
    """Whether some mode's pair is two compiles (torch.compile alone, and the cast's backend): the cast has
    variants for that mode's target. Otherwise every pair is one compile, torch.compile's own."""
    from engine.cast import compose

    return any(not compose.nothing_under(cast, m) for m in modes)


def inductor_options(items: list[str], flag: str) -> dict[str, Any]:
    """KEY=VALUE strings as Inductor config entries (true/false, integers, floats, else text); a key Inductor
    does not have, or an item without '=', is a ValueError naming the flag and the fix."""
    from torch._inductor import config

    out: dict[str, Any] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"{flag} {item!r}: write KEY=VALUE, e.g. {flag} layout_optimization=false")
        if key not in config.get_config_copy():
            raise ValueError(f"{flag} {item!r}: Inductor has no config entry {key!r} "
                             f"(see torch._inductor.config), e.g. {flag} layout_optimization=false")
        v = raw.strip()
        low = v.lower()
        value: Any = True if low == "true" else False if low == "false" else v
        if isinstance(value, str):
            for conv in (int, float):
                try:
                    value = conv(v)
                    break
                except ValueError:
                    pass
        out[key] = value
    return out


def _without(argv: list[str], flag: str, takes_value: bool = True) -> list[str]:
    """argv without `flag` (`--flag V` or `--flag=V`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = takes_value
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out


def run_processes(args: argparse.Namespace, argv: list[str]) -> int:
    """--processes K: this script K times, each in a fresh process writing DIR/process-i (the cast's arm
    compiled first in the even modes of odd-numbered processes, in the odd modes of the others), then each
    compiled pair (and the eager pair) pooled over the processes into DIR/bench_compose.json and .md."""
    import subprocess

    base = _without(_without(_without(argv, "--processes"), "--out"), "--cast-first")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for i in range(1, args.processes + 1):
        out = args.out / f"process-{i}"
        cmd = [sys.executable, str(Path(__file__).resolve()), *base, "--out", str(out),
               "--cast-first", "even" if i % 2 else "odd"]
        log(f"process {i} of {args.processes}: {' '.join(cmd[1:])}")
        rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, env={**os.environ, "KFORGE_COMPOSE_DEVICE": DEVICE}).returncode
        doc = json.loads((out / "bench_compose.json").read_text()) if (out / "bench_compose.json").is_file() else {}
        runs.append({"process": i, "rc": rc, "dir": out.name, "doc": doc})
        if rc == 2:  # bad input: every process would say the same
            return 2
        pool(args, runs)  # after each process: a run cut short keeps the pool of those that finished
    return 0 if all(r["rc"] == 0 for r in runs) else 1


def pool_only(args: argparse.Namespace) -> int:
    """--pool-only: pool the DIR/process-i records already there (a run whose last process was cut short)."""
    runs = []
    numbered = [d for d in args.out.glob("process-*") if d.name.rpartition("-")[2].isdigit()]
    for d in sorted(numbered, key=lambda d: int(d.name.rpartition("-")[2])):
        f = d / "bench_compose.json"
        runs.append({"process": int(d.name.rpartition("-")[2]), "rc": None, "dir": d.name,
                     "doc": json.loads(f.read_text()) if f.is_file() else {}})
    if not any(r["doc"] for r in runs):
        print(f"error: --out {args.out}: no process-N/bench_compose.json to pool; run with --processes K first",
              file=sys.stderr)
        return 2
    args.processes = len(runs)
    seen: list[str] = []
    for r in runs:
        seen += [m for m in r["doc"].get("modes", {}) if m not in seen]
    args.modes = ",".join(seen)  # the modes the records hold, whatever --modes says
    pool(args, runs)
    return 0


def pool(args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    """Each compiled pair (and the eager pair) pooled over the processes' records into DIR/bench_compose.json
    and .md; a mode a process did not finish is listed as missing for it."""
    from engine.bench.stats import SpeedupEstimate, pooled_speedup

    pooled: dict[str, Any] = {}
    first = next((r["doc"] for r in runs if r["doc"]), {})
    modes = [m for m in args.modes.split(",") if m] if args.modes else list(first.get("modes", {}))
    arms = ["eager"] + modes
    # The record keeps the shape of one process's (the report and reproduce.py read it as they read any): the
    # first complete process's details, and per compared pair the pooled speedup with the processes' geometric
    # mean times (median ratios pool exactly so), each process's reading beside it.
    merged = json.loads(json.dumps(first))
    for arm in arms:
        got = [(r["process"], (r["doc"].get("modes", {}).get(arm) if arm != "eager" else r["doc"].get("eager")) or {})
               for r in runs]
        ests = [(i, x) for i, x in got if "speedup" in x]
        row: dict[str, Any] = {"per_process": [{"process": i, "speedup": x["speedup"], "speedup_ci": x["speedup_ci"],
                                                "base_ms": x["base_ms"], "with_cast_ms": x["with_cast_ms"],
                                                **({"compiled_first": x["compiled_first"]} if "compiled_first" in x
                                                   else {})} for i, x in ests],
                               "missing": [i for i, x in got if "speedup" not in x]}
        if ests:
            p = pooled_speedup([SpeedupEstimate(x["speedup"], *x["speedup_ci"]) for _, x in ests])
            row.update({"speedup": p.speedup, "speedup_ci": [p.low, p.high], "processes": len(ests)})
            target = merged.get("eager") if arm == "eager" else merged.get("modes", {}).get(arm)
            if isinstance(target, dict):
                geo = lambda key, ests=ests: math.exp(sum(math.log(x[key]) for _, x in ests) / len(ests))  # noqa: E731
                target.update({"speedup": p.speedup, "speedup_ci": [p.low, p.high], "base_ms": geo("base_ms"),
                               "with_cast_ms": geo("with_cast_ms"), "pooled_over": len(ests),
                               "per_process": row["per_process"]})
        pooled[arm] = row
    doc = {**merged, "model": first.get("model", args.model), "gpu": first.get("gpu", "?"), "torch": first.get("torch", "?"),
           "date": time.strftime("%Y-%m-%d %H:%M"), "cast": first.get("cast") or str(args.cast), "processes": args.processes,
           "runs": [{k: v for k, v in r.items() if k != "doc"} for r in runs], "pooled": pooled}
    (args.out / "bench_compose.json").write_text(json.dumps(doc, indent=1, default=str))
    text = pooled_report(doc) + ("\n" + report(doc) if merged.get("modes") is not None else "")
    (args.out / "bench_compose.md").write_text(text)
    if len(runs) == args.processes:
        print(text)


def verdict(ci: list[float]) -> str:
    return "faster with confidence" if ci[0] > 1 else "slower with confidence" if ci[1] < 1 else "not resolved"


def pooled_report(doc: dict[str, Any]) -> str:
    lines = [f"# bench_compose over {doc['processes']} processes: {doc['model']}", "",
             f"{doc['gpu']}, torch {doc['torch']}, {doc['date']}; cast {doc['cast']}. Each process measured "
             "everything afresh (its own compiles; `process-N/` holds its report). Pooled: the geometric mean of "
             "the processes' speedups with a 95 % t-interval whose error is the larger of their spread and their "
             "own CIs (engine.bench.stats.pooled_speedup).", "",
             "| arm | per process: speedup (95 % CI) | pooled (95 % CI) | verdict |", "|---|---|---|---|"]
    for arm, row in doc["pooled"].items():
        per = "; ".join(f"{x['speedup']:.3f} ({x['speedup_ci'][0]:.3f}–{x['speedup_ci'][1]:.3f})"
                        + (f", {x['compiled_first']} compiled first" if x.get("compiled_first") else "")
                        for x in row["per_process"]) or "–"
        name = "eager + cast vs eager" if arm == "eager" else f"torch.compile {arm} + cast vs alone"
        if "speedup" in row:
            lines.append(f"| {name} | {per} | **{row['speedup']:.3f}** ({row['speedup_ci'][0]:.3f}–"
                         f"{row['speedup_ci'][1]:.3f}) | {verdict(row['speedup_ci'])} |")
        else:
            lines.append(f"| {name} | {per} | – | no process measured it |")
        if row.get("missing"):
            lines.append(f"| | missing in process(es) {', '.join(map(str, row['missing']))} | | |")
    bad = [r for r in doc["runs"] if r["rc"] not in (0, None)]  # None: pooled from records (--pool-only)
    if bad:
        lines += ["", "Processes that failed: " + ", ".join(f"{r['process']} (exit {r['rc']})" for r in bad)]
    return "\n".join(lines) + "\n"


AGAIN = "alone, compiled a second time (A/A of compiles)"


def second_compile(mode: str | None) -> Any:
    """torch.compile's Inductor backend for `mode`, equal only to itself: compiling with it never reuses the
    code Dynamo holds for the same frame under an equal backend."""
    import torch

    class SecondCompile(torch._TorchCompileInductorWrapper):
        def __eq__(self, other: object) -> bool:
            return self is other

        __hash__ = object.__hash__

    return SecondCompile(mode, None, None)


def report(doc: dict[str, Any]) -> str:
    from engine.cast.compose import describe_layout_copies

    f = lambda x, s=".2f": "–" if x is None else format(x, s)  # noqa: E731
    lines = [f"# bench_compose: {doc['model']}", "", f"{doc['gpu']}, torch {doc['torch']}, {doc['date']}; "
             f"{len(doc.get('variants', []))} variant(s) in the cast"
             + (f" (those matching --only {doc['only']!r})" if doc.get("only") else "")
             + "".join(f"; Inductor config {', '.join(f'{k}={v}' for k, v in doc[key].items())} {who}"
                       for key, who in (("inductor", "for both arms"), ("cast_inductor", "for the cast's arm only"))
                       if doc.get(key))
             + (f"; each turn of an arm: {doc.get('warm_calls', 1)} warm call(s), then {doc['block']} timed calls "
                f"back to back, their median the turn's sample" if doc.get("block", 1) > 1 else ""), "",
             "| arm | base ms | with cast ms | speedup (95 % CI) | rel. L2 vs eager | hits/forward | compile s "
             "(alone → with cast) |", "|---|---:|---:|---|---:|---:|---|"]
    e = doc.get("eager")
    if e:
        lines.append(f"| eager | {f(e['base_ms'])} | {f(e['with_cast_ms'])} | {e['speedup']:.3f} "
                     f"({e['speedup_ci'][0]:.3f}–{e['speedup_ci'][1]:.3f}) | {e['rel_l2_err']:.2e} | "
                     f"{e['hits_per_forward']} | – |")
    for mode, r in doc.get("modes", {}).items():
        if "error" in r:
            lines.append(f"| torch.compile {mode} | – | – | error: {r['error'][:120]} | – | – | – |")
            continue
        lines.append(f"| torch.compile {mode} | {f(r['base_ms'])} | {f(r['with_cast_ms'])} | {r['speedup']:.3f} "
                     f"({r['speedup_ci'][0]:.3f}–{r['speedup_ci'][1]:.3f}) | {r['rel_l2_err']:.2e} "
                     f"(alone {r['rel_l2_err_plain']:.2e}) | {r['hits_per_forward']} | "
                     + ("one compile, torch.compile's own (nothing of the cast for this mode) |" if r.get("torch_compile_own")
                        else f"{r['compile_s']:.1f} → {r['compile_s_with_cast']:.1f} ({r['compile_time_ratio']:.2f}×) |"))
    if "inductor_start_s" in doc and doc.get("inductor_start_model", True):
        lines.append(f"\nInductor's start in this process (a small function and the model compiled before either "
                     f"arm and thrown away, so that neither pays it): {doc['inductor_start_s']:.1f} s")
    elif "inductor_start_s" in doc:
        lines.append(f"\nInductor's start in this process (a small function compiled before either arm; not the "
                     f"model: each mode's pair is one compile, torch.compile's own): {doc['inductor_start_s']:.1f} s")
    for mode, r in doc.get("modes", {}).items():
        if r.get("pattern_matches"):
            lines.append(f"\n{mode}: pattern matches in the compiled graphs: "
                         + ", ".join(f"{k} {v}" for k, v in r["pattern_matches"].items()))
        for name, why in (r.get("pattern_misses") or {}).items():
            lines.append(f"\n{mode}: pattern op {name} missed {why['misses']} call(s)"
                         f"{' and declined ' + str(why['target_declines']) + ' for their target' if why['target_declines'] else ''}"
                         f"; the calls brought {' | '.join(why['calls_brought']) or '–'}; proven for "
                         f"{' | '.join(why['proven_for']) or 'nothing'}"
                         + (f"; {why['size_declines']} match(es) of other sizes kept Inductor's code"
                            if why.get("size_declines") else ""))
        copies = describe_layout_copies(r.get("layout_copies"))
        held = any(v.get("inputs_as_held") or v.get("biases_kept") for v in (r.get("layout_copies") or {}).values())
        if copies or held:
            lines.append(f"\n{mode}: {copies or 'no layout copies'}. Per op: " + "; ".join(
                f"{k} {v['calls']} call(s), {v['inputs_copied']} in, {v['outputs_copied']} out"
                + (f", {v['inputs_computed']} computed into place" if v.get("inputs_computed") else "")
                + (f", {v['inputs_as_held']} as held" if v.get("inputs_as_held") else "")
                + (f" ({v['inputs_computed_as_held']} of them computed into that layout)"
                   if v.get("inputs_computed_as_held") else "")
                + (f", {v['biases_kept']} convolution(s) kept their bias for it" if v.get("biases_kept") else "")
                + (" (not passed as held: " + "; ".join(f"{w} ×{n}" for w, n in v["held_declined"].items()) + ")"
                   if v.get("held_declined") else "")
                for k, v in r["layout_copies"].items()))
        if r.get("hits_counted_over"):
            lines.append(f"\n{mode}: hits per forward counted over {r['hits_counted_over']}")
        if r.get("control"):
            lines.append(f"\n{mode}: control arms, each against torch.compile alone, in balanced orders: " + "; ".join(
                f"{name} {f(c['ms'], '.3f')} ms, {c['speedup']:.3f} ({c['speedup_ci'][0]:.3f}–{c['speedup_ci'][1]:.3f})"
                for name, c in r["control"].items()))
            aa = r["control"].get("alone, timed again (A/A)")
            if aa:
                lo, hi = aa["speedup_ci"]
                reach = max(abs(hi - 1.0), abs(1.0 - lo))  # how far from 1 a comparison of a thing with itself read
                lines.append(f"\n{mode}: the A/A arm (torch.compile alone against itself) read {aa['speedup']:.3f} "
                             f"({lo:.3f}–{hi:.3f}): " + ("a bias in the timing; differences within "
                                                         f"±{reach:.3f} of 1 are not resolved in this run"
                                                         if lo > 1.0 or hi < 1.0 else "no bias shown"))
            again = r["control"].get(AGAIN)
            if again:
                lo, hi = again["speedup_ci"]
                lines.append(f"\n{mode}: a second compile of torch.compile alone read {again['speedup']:.3f} "
                             f"({lo:.3f}–{hi:.3f}) against the first: "
                             + ("two compiles of the same code differ by that much in this process; the cast's "
                                "arm is a compile too" if lo > 1.0 or hi < 1.0 else "no spread between compiles shown"))
        if "compiled_first" in r:
            lines.append(f"\n{mode}: compiled {r['compiled_first']} first; the cast's pattern pass took "
                         f"{r.get('pattern_pass_s', 0.0):.2f} s of its compile")
        dyn = r.get("dynamo")
        if dyn:
            breaks = "; ".join(f"{k} ×{v}" for k, v in dyn["graph_breaks"].items()) or "none"
            lines.append(f"\n{mode}: Dynamo compiled {dyn['graphs_with_cast']} graph(s) with the cast and "
                         f"{dyn['graphs_alone']} alone; {dyn.get('graphs_in_warm_up', 0)} more in the warm-up and "
                         f"{dyn['graphs_while_timed']} while timed; graph breaks: "
                         f"{breaks}")
        for card, why in (r.get("pattern_problems") or {}).items():
            lines.append(f"\n{mode}: chain card {card} is no pattern: {why}")
    from engine.bench.hostload import describe as describe_load
    from engine.bench.hostload import disturbed

    for arm, r in ([("eager", e)] if e else []) + [(f"torch.compile {m}", r) for m, r in doc.get("modes", {}).items()]:
        if r.get("host_load"):
            busy = disturbed(r["host_load"])
            lines.append(f"\n{arm}: the host while timed: {describe_load(r['host_load'])}"
                         + (f". **Busy** ({busy}): an arm that issues more from the host reads slower than on a "
                            "quiet host" if busy else ""))
    if e:
        for mode, r in doc.get("modes", {}).items():
            if "error" not in r:
                lines.append(f"\ntorch.compile {mode} + cast against eager: "
                             f"{e['base_ms'] / r['with_cast_ms']:.2f}× (torch.compile alone "
                             f"{e['base_ms'] / r['base_ms']:.2f}×; medians of different pairings)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
