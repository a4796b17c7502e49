"""End-to-end benchmark of casts on reference models (run on the GPU the casts are for).

    python scripts/bench_e2e.py --out DIR [--casts DIR] [--iters N] [--models NAME[@key=value,...],...]

For each model (ResNet-50 batch 32 fp16 channels_last; SD3.5-Medium VAE decode 1024x1024 bf16):
build a cast (or take DIR/<model>.cast from --casts), then time whole forwards with and without it,
alternating, each timed with CUDA events after a sync; compare the final outputs with eager; count
hits per variant and misses per op over one forward; where the cast holds graph routes, their replays, eager
calls and declines over the timed forwards. Also the host cost per call of eager, a guard miss and a guard
hit. Writes DIR/bench_e2e.json and DIR/bench_e2e.md; progress on stderr.

A model written NAME@key=value[,key=value] is built with those [params] overridden (TOML values: true,
false, numbers, strings), e.g. gemma4_e2b@full_depth=true for all 35 layers instead of the captured four;
it uses NAME.cast (a cast's guards are per call signature, which every layer of a kind shares) and is its
own row, named with its overrides.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.bench.forward import auto_iters, capture_graph, describe_settle, settle, time_forward, time_steady  # noqa: E402
from engine.bench.hostload import HostWatch, disturbed  # noqa: E402
from engine.bench.hostload import describe as describe_load  # noqa: E402
from engine.bench.varied import Varied  # noqa: E402
from engine.config import ModelSpec, config_model, override_params, parse_model_list, sd35_vae  # noqa: E402
from engine.errors import UsageError  # noqa: E402
from engine.models.forwards import output_tensor  # noqa: E402


def log(msg: str) -> None:
    print(f"[bench_e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def graph_of(forward):
    """The forward captured in a CUDA graph: (graph, static output tensor)."""
    g, out = capture_graph(forward)
    return g, output_tensor(out)


def host_arms(forward, cast, module) -> dict:
    """Host time per forward, eager and with the cast: µs to issue one, launches on the GPU, µs per launch."""
    from engine.bench.host import host_pair

    eager, mine = host_pair(forward, lambda: cast.enabled(module))
    log(f"host per forward: eager {eager['issue_us']:.0f} us to issue, {eager['kernels']} kernels + "
        f"{eager['copies']} copies; with the cast {mine['issue_us']:.0f} us, {mine['kernels']} + {mine['copies']}")
    return {"eager": eager, "cast": mine}


def counted(forward, cast, captured: dict):
    """`forward()`; while the stream is being captured, also the cast's hits in it as captured["calls"] (the
    warm-up forwards before capture run outside it, and under the eager target)."""
    if not torch.cuda.is_current_stream_capturing():
        return forward()
    cast.reset_stats()
    out = forward()
    captured["calls"] = sum(v["hits"] for v in cast.stats()["variants"])
    return out


def graph_arm(name: str, forward, cast, iters: int, module=None, varied=None) -> dict:
    """Both arms replayed from CUDA graphs: what the kernels bring once per-call host cost is gone."""
    from engine.bench.stats import speedup_ci

    captured = {"calls": 0}
    try:
        g_eager, out_eager = graph_of(forward)
        with cast.enabled(module):
            g_cast, out_cast = graph_of(lambda: counted(forward, cast, captured))
        in_graph = captured["calls"]
    except Exception as e:  # a model that cannot be captured is reported, not fatal
        log(f"{name}: CUDA-graph arm not possible: {type(e).__name__}: {e}")
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    eager_us, cast_us = [], []
    for _ in range(3):
        g_eager.replay()
        g_cast.replay()
    try:
        for i in range(iters):
            first = varied.new_pair() if varied is not None else 0
            for arm in (("eager", "cast") if i % 2 == 0 else ("cast", "eager")):
                g = g_eager if arm == "eager" else g_cast
                if varied is not None:
                    varied.seek(first)
                (eager_us if arm == "eager" else cast_us).append(
                    time_steady(g.replay, before=varied.before if varied is not None else None))
    finally:
        if varied is not None:   # the outputs compared below: both graphs' on the example inputs
            varied.restore()
    if varied is not None:
        g_eager.replay()
        g_cast.replay()
    torch.cuda.synchronize()
    est = speedup_ci(eager_us, cast_us, paired=True)
    diff = out_cast.double() - out_eager.double()
    r = {"eager_ms": statistics.median(eager_us) / 1e3, "cast_ms": statistics.median(cast_us) / 1e3,
         "speedup": est.speedup, "speedup_ci": [est.low, est.high], "iters": iters,
         "rel_l2_err": float(diff.norm() / out_eager.double().norm()), "cast_calls_captured": in_graph}
    log(f"{name}: CUDA graphs: eager {r['eager_ms']:.2f} ms, cast {r['cast_ms']:.2f} ms, {est.speedup:.3f}x "
        f"(95% CI {est.low:.3f}-{est.high:.3f}); rel err {r['rel_l2_err']:.2e}; cast calls captured {in_graph}")
    del g_eager, g_cast
    return r


def float32_control(name: str, module, forward, eager_out, cast_out) -> dict:
    """Eager's and the cast's outputs against the model run in float32: whether the cast is as accurate as eager
    when the two low-precision outputs differ (rounding differences grow through a deep random-weight model)."""
    from engine.bench.accuracy import float32_output, rel_l2

    if eager_out.dtype not in (torch.bfloat16, torch.float16):
        return {"skipped": f"the output is {eager_out.dtype}"}
    try:
        ref = float32_output(module, forward, output_tensor)
    except Exception as e:  # a model whose code insists on its dtype has no float32 reference
        log(f"{name}: no float32 reference: {type(e).__name__}: {e}")
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    r = {"eager": rel_l2(eager_out, ref), "cast": rel_l2(cast_out, ref)}
    del ref
    torch.cuda.empty_cache()
    log(f"{name}: rel L2 err against the model in float32: eager {r['eager']:.2e}, cast {r['cast']:.2e}")
    return r


def bench_model(name: str, make, keep, cast_path: Path, work: Path, iters: int, graphs: bool = True) -> dict:
    import engine.cast
    from engine.bench.stats import speedup_ci
    from engine.export.direct import build_cast

    module, forward = make()
    build = None
    if not cast_path.exists():
        log(f"{name}: building a cast (capture, builtin search, fresh-process confirmation)")
        t0 = time.perf_counter()
        with torch.no_grad():
            build = build_cast(forward, cast_path, work=work / work_name(name), keep=keep, model=name,
                               progress=log)
        build["seconds"] = time.perf_counter() - t0
    cast = engine.cast.load(cast_path)
    with torch.no_grad():
        eager_out = output_tensor(forward()).clone()
        with cast.enabled(module):  # the module too: module cards are patched only when it is named
            cast.reset_stats()
            cast_out = output_tensor(forward()).clone()
            stats = cast.stats()
        for _ in range(3):  # warm-up both arms
            forward()
            with cast.enabled(module):
                forward()
        # eager run until its pace stops moving: timed while a fresh process on a just-busy host still issues a
        # host-bound forward slowly, the cast's arm (a CUDA-graph replay issues almost nothing) reads faster
        settled = settle(forward)
        log(f"{name}: eager settled: {describe_settle(settled)}")
        eager_us, cast_us = [], []
        if iters <= 0:
            iters = auto_iters(sorted(time_forward(forward) for _ in range(3))[1])
        varied = Varied.record(module, forward)  # no forward timed on inputs an earlier one saw
        log(f"{name}: timing {iters} forwards per arm, alternating; {varied.describe()}")
        cast.reset_stats()  # what the graph routes did while timed (their graphs stay)
        watch = HostWatch()  # what else the host did meanwhile (engine.bench.hostload says why)
        try:
            with watch:
                for i in range(iters):
                    arms = ("eager", "cast") if i % 2 == 0 else ("cast", "eager")
                    first = varied.new_pair()
                    for arm in arms:
                        varied.seek(first)
                        if arm == "cast":
                            cast.install(module)
                            cast_us.append(time_steady(forward, before=varied.before))
                            cast.remove()
                        else:
                            eager_us.append(time_steady(forward, before=varied.before))
        finally:
            varied.restore()
        routes = cast.stats().get("graph_routes_summary")
        restored = output_tensor(forward())
        graph = graph_arm(name, forward, cast, iters, module, varied) if graphs else None
        host = host_arms(forward, cast, module)
        vs32 = float32_control(name, module, forward, eager_out, cast_out)
    est = speedup_ci(eager_us, cast_us, paired=True)
    diff = (cast_out.double() - eager_out.double())
    result = {
        "model": name, "cast": str(cast_path), "variants": len(cast.usable()), "inputs": varied.describe(),
        "eager_ms": statistics.median(eager_us) / 1e3, "cast_ms": statistics.median(cast_us) / 1e3,
        "speedup": est.speedup, "speedup_ci": [est.low, est.high], "iters": iters,
        "rel_l2_err": float(diff.norm() / eager_out.double().norm()), "max_abs_err": float(diff.abs().max()),
        "restored_bit_exact": bool(torch.equal(restored, eager_out)),
        "hits": {v["id"]: v["hits"] for v in stats["variants"]}, "misses": stats["misses"],
        "near_misses": stats["near_misses"], "near_miss_keys": stats["near_miss_keys"],
        "format_declines": stats.get("format_declines", {}),
        "every_variant_hit": all(v["hits"] > 0 for v in stats["variants"]),
        "dispatched_by": ", ".join(sorted({v["router"] for v in stats["variants"]})) or "-",
        "variants_hit": sum(1 for v in stats["variants"] if v["hits"] > 0),
        "build": build, "cuda_graphs": graph, "host": host, "vs_float32": vs32, "graph_routes": routes,
        "host_load": watch.load.as_dict(), "settled": settled,
    }
    log(f"{name}: host while timed: {describe_load(result['host_load'])}")
    if disturbed(result["host_load"]):
        log(f"{name}: WARNING: the host was busy while timed ({disturbed(result['host_load'])}): an arm that "
            "issues more from the host reads slower than on a quiet host")
    log(f"{name}: eager {result['eager_ms']:.2f} ms, cast {result['cast_ms']:.2f} ms, {est.speedup:.3f}x "
        f"(95% CI {est.low:.3f}-{est.high:.3f}); rel err {result['rel_l2_err']:.2e}; "
        f"every variant hit: {result['every_variant_hit']}; near misses {sum(result['near_misses'].values())}; "
        f"declined for their memory format {sum(result['format_declines'].values())}")
    del module
    torch.cuda.empty_cache()
    return result


def markdown(doc: dict) -> str:
    lines = ["# bench_e2e", "", f"{doc['gpu']}, torch {doc['torch']}, {time.strftime('%Y-%m-%d')}", "",
             "| model | router | variants | eager ms | cast ms | speedup (95% CI) | rel L2 err | variants hit | "
             "near misses | remove() exact |", "|---|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for r in doc["models"]:
        lines.append(f"| {r['model']} | {r.get('dispatched_by', '-')} | {r['variants']} | {r['eager_ms']:.2f} | {r['cast_ms']:.2f} | "
                     f"{r['speedup']:.3f}× ({r['speedup_ci'][0]:.3f}–{r['speedup_ci'][1]:.3f}) | "
                     f"{r['rel_l2_err']:.1e} | {r['variants_hit']}/{r['variants']} | {sum(r['near_misses'].values())} | "
                     f"{r['restored_bit_exact']} |")
    routed = [r for r in doc["models"] if r.get("graph_routes")]
    if routed:
        lines += ["", "Graph routes of the cast (its modules' forwards replayed from CUDA graphs in eager), over the "
                  "timed forwards with the cast:", "",
                  "| model | class | modules | replaying | replays | eager calls | declines | refused |",
                  "|---|---|---:|---:|---:|---:|---|---|"]
        for r in routed:
            g = r["graph_routes"]
            declines = ", ".join(f"{k} ×{n}" for k, n in g["declines"].items()) or "–"
            lines.append(f"| {r['model']} | {', '.join(g['classes'])} | {g['modules']} | {g['replaying']} | "
                         f"{g['replays']} | {g['eager_calls']} | {declines} | {'; '.join(g['refused']) or '–'} |")
    graphs = [r for r in doc["models"] if r.get("cuda_graphs") and "speedup" in r["cuda_graphs"]]
    if graphs:
        lines += ["", "Both arms replayed from CUDA graphs (no per-call host cost). A variant runs under capture only "
                  "where the cast was proven for the cuda-graphs target; 'cast calls captured' counts them (0: the "
                  "cast arm is eager's graph):", "",
                  "| model | eager ms | cast ms | speedup (95% CI) | rel L2 err | cast calls captured |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in graphs:
            g = r["cuda_graphs"]
            lines.append(f"| {r['model']} | {g['eager_ms']:.2f} | {g['cast_ms']:.2f} | {g['speedup']:.3f}× "
                         f"({g['speedup_ci'][0]:.3f}–{g['speedup_ci'][1]:.3f}) | {g['rel_l2_err']:.1e} | "
                         f"{g.get('cast_calls_captured', '?')} |")
    hosts = [r for r in doc["models"] if r.get("host")]
    if hosts:
        lines += ["", "Host time per forward (issued with the GPU idle, eager and cast in alternating rounds; launches counted by the profiler):", "",
                  "| model | eager: issue µs | kernels + copies | µs per launch | cast: issue µs | kernels + copies | "
                  "µs per launch |", "|---|---:|---:|---:|---:|---:|---:|"]
        for r in hosts:
            e, c = r["host"]["eager"], r["host"]["cast"]
            lines.append(f"| {r['model']} | {e['issue_us']:.0f} | {e['kernels']} + {e['copies']} | "
                         f"{e['us_per_launch']:.2f} | {c['issue_us']:.0f} | {c['kernels']} + {c['copies']} | "
                         f"{c['us_per_launch']:.2f} |")
    loads = [r for r in doc["models"] if r.get("host_load")]
    if loads:
        lines += ["", "The host while the eager pair was timed (engine.bench.hostload: a busy host slows the arm "
                  "that issues more from it):", ""]
        for r in loads:
            busy = disturbed(r["host_load"])
            lines.append(f"- {r['model']}: {describe_load(r['host_load'])}" + (f". **Busy**: {busy}" if busy else "")
                         + (f"; eager settled first: {describe_settle(r['settled'])}" if r.get("settled") else ""))
    accs = [r for r in doc["models"] if "eager" in (r.get("vs_float32") or {})]
    if accs:
        lines += ["", "Accuracy: each bf16/fp16 output against the same model run in float32 (a cast as accurate as "
                  "eager is as far from it as eager is, even where the two low-precision outputs differ):", "",
                  "| model | eager vs float32 | cast vs float32 | cast vs eager |", "|---|---:|---:|---:|"]
        for r in accs:
            a = r["vs_float32"]
            lines.append(f"| {r['model']} | {a['eager']:.1e} | {a['cast']:.1e} | {r['rel_l2_err']:.1e} |")
    for key in sorted(k for k in doc if k.startswith("host_cost")):
        h = doc[key]
        which = f", {h['router']} router" if h.get("router") else ""
        lines += ["", f"Host cost per call ({h['op']}{which}): eager {h['eager_us']:.2f} µs; guard hit "
                  f"{h['hit_us']:.2f} µs (+{h['hit_added_us']:.2f}); guard miss {h['miss_us']:.2f} µs vs eager "
                  f"{h['eager_miss_shape_us']:.2f} µs (+{h['miss_added_us']:.2f})."]
    for r in doc["models"]:
        lines += ["", f"## {r['model']} hits per variant", ""]
        lines += [f"- {vid}: {n}" for vid, n in r["hits"].items()]
        lines.append(f"- misses per op: {r['misses']}")
    return "\n".join(lines) + "\n"


MODELS = {  # name -> (builder of (params), ops kept when building a cast directly, iterations per arm, cast stem)
    "resnet50": (lambda p: config_model("resnet50", params=p), lambda op: True, 30, "resnet50"),
    "sd35_medium": (lambda p: config_model("sd35_medium", params=p), lambda op: True, 10, "sd35_medium"),
    "sd35_vae": (lambda p: sd35_vae(), lambda op: "group_norm" in op, 10, "sd35_medium"),
}


def check_models(specs: list[ModelSpec]) -> None:
    """A UsageError for the first model that is neither in MODELS nor a config, or whose overrides its config's
    builder does not take (before any model is built)."""
    from engine.config import load_config, shipped_configs

    for spec in specs:
        if spec.name not in MODELS and spec.name not in shipped_configs() and not Path(spec.name).is_file():
            raise UsageError(f"unknown model {spec.name!r}; use {', '.join(MODELS)}, a shipped config "
                             f"({', '.join(shipped_configs())}) or a config file")
        if spec.params and spec.name == "sd35_vae":
            raise UsageError(f"{spec.label!r}: sd35_vae takes no overrides; use configs/examples/sd35_vae.toml@...")
        if spec.params:
            override_params(load_config(spec.name), spec.params)


def row_label(spec: ModelSpec, router: str, routers: list[str]) -> str:
    """The `model` of a row: the model's label, and the router where several are compared."""
    return spec.label if len(routers) == 1 else f"{spec.label} [{router} router]"


def earlier_rows(earlier: dict, doc: dict, specs: list[ModelSpec], routers: list[str]) -> dict:
    """`doc` holding an earlier bench_e2e.json's rows, failures and host costs, less the rows these models
    will write again; a UsageError when that file is of another GPU."""
    if earlier.get("gpu") != doc["gpu"]:
        raise UsageError(f"its rows were measured on {earlier.get('gpu')!r}, not this {doc['gpu']!r}; "
                         "write to another --out")
    again = {row_label(s, r, routers) for s in specs for r in routers}
    kept = {k: v for k, v in earlier.items() if k.startswith("host_cost")}
    failures = {k: v for k, v in (earlier.get("failures") or {}).items() if k not in again}
    return {**doc, **kept, "models": [r for r in earlier.get("models", []) if r.get("model") not in again],
            **({"failures": failures} if failures else {})}


def work_name(label: str) -> str:
    """A model's label as a folder name (overrides may hold quotes or slashes)."""
    return re.sub(r"[^\w.@=,+-]", "_", label)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for bench_e2e.json and bench_e2e.md")
    ap.add_argument("--casts", help="folder with <model>.cast files to use (built there when missing); "
                                    "sd35_vae uses sd35_medium.cast")
    ap.add_argument("--iters", type=int, default=0, help="forwards per arm (default: 30 ResNet-50, 10 SD3.5, else about 2 s per arm)")
    ap.add_argument("--models", default="resnet50,sd35_vae,sd35_medium",
                    help="comma-separated: resnet50, sd35_vae, sd35_medium, a shipped config's name or a config file, "
                         "each optionally NAME@key=value[,key=value] to override its [params] (e.g. "
                         "gemma4_e2b@full_depth=true: the real depth, with gemma4_e2b.cast)")
    ap.add_argument("--append", action="store_true",
                    help="keep the other models' rows of an earlier DIR/bench_e2e.json (same GPU) and add these")
    ap.add_argument("--no-host-cost", action="store_true", help="skip the per-call host cost probe")
    ap.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph arm")
    ap.add_argument("--routers", default=os.environ.get("KFORGE_CAST_ROUTER") or "auto",
                    help="auto (what cast.install() picks: C++ where it passed its self-test on this GPU), "
                         "python, cpp, or e.g. python,cpp to compare the dispatch routers")
    args = ap.parse_args()
    try:
        specs = parse_model_list(args.models)
        check_models(specs)
    except UsageError as e:
        print(f"error: --models: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: bench_e2e: no CUDA GPU is visible", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    casts = Path(args.casts) if args.casts else out / "casts"
    casts.mkdir(parents=True, exist_ok=True)
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "models": []}
    routers = [r for r in args.routers.split(",") if r]
    if not routers or any(r not in ("auto", "python", "cpp") for r in routers):
        print(f"error: --routers {args.routers}: use auto, python, cpp or a list such as python,cpp", file=sys.stderr)
        return 2
    if args.append and (out / "bench_e2e.json").is_file():
        try:
            doc = earlier_rows(json.loads((out / "bench_e2e.json").read_text()), doc, specs, routers)
        except UsageError as e:
            print(f"error: --append: {out / 'bench_e2e.json'}: {e}", file=sys.stderr)
            return 2
    failed = False  # a model of this invocation (not an --append'ed earlier one) failed
    for spec in specs:
        # A config file (e.g. configs/examples/vit_b16.toml) is named by its stem, and so is its cast; overrides
        # (gemma4_e2b@full_depth=true) name the row but not the cast.
        build, keep, iters, stem = MODELS.get(spec.name) or (
            lambda p, n=spec.name: config_model(n, params=p), lambda op: True, 0, Path(spec.name).stem)
        make = lambda build=build, params=dict(spec.params): build(params)  # noqa: E731
        for router in routers:
            os.environ["KFORGE_CAST_ROUTER"] = router  # read by cast.install()
            label = row_label(spec, router, routers)
            try:
                r = bench_model(label, make, keep, casts / f"{stem}.cast", out / "work", args.iters or iters,
                                graphs=not args.no_graphs)
                r["router"] = router
                doc["models"].append(r)
            except Exception as e:  # one model failing must not lose the others' results
                log(f"{label}: FAILED: {type(e).__name__}: {e}")
                doc.setdefault("failures", {})[label] = f"{type(e).__name__}: {e}"
                failed = True
            (out / "bench_e2e.json").write_text(json.dumps(doc, indent=1, default=str))
    if not args.no_host_cost:
        from engine.export.hostcost import measure

        for router in routers:
            os.environ["KFORGE_CAST_ROUTER"] = router
            log(f"host cost per call ({router} router): eager, guard miss, guard hit")
            hc = measure(out)
            doc["host_cost" if router == routers[0] else f"host_cost_{router}"] = hc
            log(f"host cost ({router} router): {hc}")
    (out / "bench_e2e.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "bench_e2e.md").write_text(markdown(doc))
    log(f"wrote {out / 'bench_e2e.json'} and {out / 'bench_e2e.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
