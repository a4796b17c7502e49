"""Where do the control's 2-5 % go? ResNet-50, torch.compile alone vs the cast's backend, arms that separate the
install/remove wake (cache pollution or state), the backend's own cost, and a warm-up call before each timed one."""
import contextlib, json, sys, time, os, tempfile
sys.path.insert(0, "scripts")
import torch
import bench_compose as bc
from engine.cast.loader import load
from engine.config import load_config, build_target

cfg = load_config("resnet50")
t = build_target(cfg, torch.device("cuda"))
model, forward = t.module, t.forward
cast = load("docs/results/reproduce-h200/2026-12-03g/resnet50/resnet50.cast")
enabled = lambda: cast.enabled(model)
out = {}
caches = tempfile.mkdtemp()
with torch.no_grad():
    for _ in range(3): forward()
    # toggle duration
    ts = []
    for _ in range(20):
        t0 = time.perf_counter()
        with enabled(): pass
        ts.append(time.perf_counter() - t0)
    tog = sorted(ts)[10]
    out["toggle_ms"] = tog * 1e3
    print("install+remove ms", tog * 1e3, flush=True)
    torch.compile(forward)(); torch._dynamo.reset()
    for mode in ("default", "reduce-overhead"):
        kw = {} if mode == "default" else {"mode": mode}
        step = torch.compiler.cudagraph_mark_step_begin if mode != "default" else (lambda: None)
        torch._dynamo.reset()
        from pathlib import Path; bc.fresh_caches(Path(caches), mode + "a")
        base = torch.compile(forward, **kw); step(); base(); step(); base()
        bc.fresh_caches(Path(caches), mode + "c")
        with enabled():
            fast = cast.compile(forward, **kw); step(); fast(); step(); fast()
        be = [b for b in getattr(cast, "_backends", [])] 
        def run_base(): step(); base()
        def run_fast(): step(); fast()
        def work():  # pure Python of about the toggle's length
            t0 = time.perf_counter(); junk = []
            while time.perf_counter() - t0 < tog:
                junk.append({"a": [1, 2, 3], "b": str(len(junk))})
        @contextlib.contextmanager
        def toggled():
            with enabled(): pass
            yield
        @contextlib.contextmanager
        def worked():
            work(); yield
        @contextlib.contextmanager
        def slept():
            time.sleep(tog); yield
        def then(cm, run):
            @contextlib.contextmanager
            def f():
                with cm():
                    run()
                    yield
            return f
        @contextlib.contextmanager
        def installed_warm():
            with enabled():
                run_fast()
                yield
        arms = [("alone", run_base, None),
                ("A/A", run_base, None),
                ("alone after install+remove", run_base, toggled),
                ("alone after python work of that length", run_base, worked),
                ("alone after a sleep of that length", run_base, slept),
                ("alone after install+remove, then one untimed call", run_base, then(toggled, run_base)),
                ("backend, not installed", run_fast, None),
                ("backend, not installed, after one untimed call of itself", run_fast, then(contextlib.nullcontext, run_fast)),
                ("backend, installed around, after one untimed call inside", run_fast, installed_warm)]
        r = bc.rotate(arms, 20, precision=0.01, max_s=35)
        out[mode] = r
        for k, v in r.items():
            print(f"{mode}: {k}: {v['ms']:.3f} ms {v['speedup']:.3f} ({v['speedup_ci'][0]:.3f}-{v['speedup_ci'][1]:.3f}) n={v['iters']}", flush=True)
        # host time per call (launch only, no sync inside)
        for name, fn in (("alone", run_base), ("backend", run_fast)):
            hs = []
            for _ in range(200):
                torch.cuda.synchronize(); t0 = time.perf_counter(); fn(); hs.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            out[f"{mode}_host_us_{name}"] = sorted(hs)[100] * 1e6
            print(f"{mode}: host us per call {name}: {sorted(hs)[100]*1e6:.1f}", flush=True)
        # Python calls made per forward
        for name, fn in (("alone", run_base), ("backend", run_fast)):
            calls = {}
            def prof(frame, event, arg):
                if event in ("call", "c_call"):
                    k = (frame.f_code.co_filename.split("site-packages/")[-1] + ":" + frame.f_code.co_name) if event == "call" else ("C:" + getattr(arg, "__qualname__", str(arg)))
                    calls[k] = calls.get(k, 0) + 1
            sys.setprofile(prof); fn(); sys.setprofile(None)
            out[f"{mode}_calls_{name}"] = calls
            print(f"{mode}: python calls {name}: {sum(calls.values())} ({len(calls)} distinct)", flush=True)
        a, b = out[f"{mode}_calls_alone"], out[f"{mode}_calls_backend"]
        diff = {k: b.get(k, 0) - a.get(k, 0) for k in set(a) | set(b) if b.get(k, 0) != a.get(k, 0)}
        print(f"{mode}: call diff backend-alone:", json.dumps(dict(sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:25]), indent=0), flush=True)
os.makedirs("/tmp/o/diag38", exist_ok=True)
json.dump(out, open("/tmp/o/diag38/diag.json", "w"), indent=1, default=str)
