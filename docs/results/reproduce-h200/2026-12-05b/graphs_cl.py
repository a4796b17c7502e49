import statistics, sys, torch
sys.path.insert(0, ".")
from engine.bench.forward import capture_graph, time_steady
from engine.bench.stats import paired_rounds
from engine.config import build_target, load_config
for cfg in sys.argv[1:]:
    t = build_target(load_config(cfg), torch.device("cuda"))
    f, m = t.forward, t.module
    with torch.no_grad():
        for _ in range(3): f()
        g0 = capture_graph(f)[0]
        m.to(memory_format=torch.channels_last)
        for _ in range(3): f()
        g1 = capture_graph(f)[0]
        a, b, est = paired_rounds(lambda: time_steady(g0.replay), lambda: time_steady(g1.replay), 0.02, 15.0)
    print(f"{cfg}: CUDA graph replay as built {statistics.median(a)/1e3:.3f} ms, channels-last weights "
          f"{statistics.median(b)/1e3:.3f} ms: {est.speedup:.3f}x ({est.low:.3f}-{est.high:.3f}), {len(a)} pairs", flush=True)
    del g0, g1, t, f, m; torch.cuda.empty_cache()
