"""bench_compose's eager row read rel. L2 1.17 against eager with 0 hits (2026-12-07, first GPU run of it with
varied inputs): the SD3.5 VAE decode, eager, then after Varied.record, then with each cast enabled, each
against the first output.     python vary_probe.py CAST..."""
import sys

import torch

import engine.cast
from engine.bench.varied import Varied
from engine.config import build_target, load_config
from engine.export.e2e import rel_l2_err
from engine.models.forwards import output_tensor

t = build_target(load_config("configs/examples/sd35_vae.toml"), torch.device("cuda"))
model, forward = t.module, t.forward
with torch.no_grad():
    for _ in range(3):
        forward()
    e = output_tensor(forward()).double()
    print("again", rel_l2_err(output_tensor(forward()).double(), e))
    v = Varied.record(model, forward)
    print(v.describe())
    print("after record", rel_l2_err(output_tensor(forward()).double(), e))
    for p in sys.argv[1:]:
        cast = engine.cast.load(p)
        cast.reset_stats()
        with cast.enabled(model):
            o = output_tensor(forward()).double()
        print(p, "enabled", rel_l2_err(o, e), "hits", sum(x.get("hits", 0) for x in cast.stats()["variants"]))
        print(p, "after", rel_l2_err(output_tensor(forward()).double(), e))
