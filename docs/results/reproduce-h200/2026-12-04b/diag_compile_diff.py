"""Why is Gemma compiled with its eager-only cast installed 0.95x of Gemma compiled alone, with 0 hits?

One arm per process (python diag_compile_diff.py ARM CAST; TORCH_LOGS=output_code,graph_code to a file):
  alone      torch.compile(forward), no cast
  installed  torch.compile(forward) with the cast installed (module cards and graph routes patched in)
  backend    cast.compile(forward) with the cast not installed
  both       cast.compile(forward) with the cast installed (bench_compose's cast arm)
Prints the median of 40 steady forwards (engine.bench.forward.time_steady)."""
import os
import statistics
import sys
import tempfile

import torch

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp())
torch._inductor.config.fx_graph_cache = False

from engine.bench.forward import time_steady  # noqa: E402
from engine.cast.loader import load  # noqa: E402
from engine.config import build_target, load_config  # noqa: E402

arm, cast_path = sys.argv[1], sys.argv[2]
target = build_target(load_config("configs/models/gemma4_e2b.toml"), torch.device("cuda"))
model, forward = target.module, target.forward
cast = load(cast_path)
with torch.no_grad():
    ctx = cast.enabled(model) if arm in ("installed", "both") else torch.no_grad()
    with ctx:
        fn = cast.compile(forward) if arm in ("backend", "both") else torch.compile(forward)
        for _ in range(3):
            fn()
        ts = [time_steady(fn, "cuda") for _ in range(40)]
    hits = {v["id"]: v.get("hits") for v in cast.stats()["variants"]}
    print(f"ARM {arm}: {statistics.median(ts) / 1000:.3f} ms, hits {hits}", flush=True)
