import statistics, sys, torch
sys.path.insert(0, ".")
from engine.cast.layouts import LayoutSet
from engine.cast.runtime import EAGER, GRAPHS
from engine.config import build_target, load_config
from engine.export.layout_check import graphs_trial, float32_output
from engine.export.e2e import rel_l2_err
from engine.bench.forward import time_steady
from engine.models.forwards import output_tensor
t = build_target(load_config("configs/models/resnet50.toml"), torch.device("cuda"))
f, m = t.forward, t.module
with torch.no_grad():
    for _ in range(3): f()
    ref = output_tensor(f()).double()
    ref32 = float32_output(m, f)
    ls = LayoutSet(m, lambda p, mm: type(mm).__name__ == "ResNet", learn=True)
    with ls:
        for _ in range(3): f()
        got = output_tensor(f()).double()
    print("route hits", ls.summary(), "float32 err eager", rel_l2_err(ref, ref32), "routed", rel_l2_err(got, ref32), flush=True)
    chosen = {"class": "ResNet", "signatures": ls.signatures()}
    print("graphs_trial", graphs_trial(m, f, chosen, time_steady, 0.02, 15.0), flush=True)
