"""Where Gemma's GPU time goes with its cast (and its layer routes) installed: kernels by total CUDA time.

    python3 diag_profile.py CAST OUT_TXT
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from engine.cast.loader import load  # noqa: E402
from engine.config import build_target, load_config  # noqa: E402

cast_path, out_path = Path(sys.argv[1]), Path(sys.argv[2])
t = build_target(load_config("configs/models/gemma4_e2b.toml"), torch.device("cuda"))
model, forward = t.module, t.forward
cast = load(cast_path)
lines = []
with torch.no_grad():
    for label, cm in (("eager", None), ("cast", cast)):
        if cm is not None:
            cast.install(model)
        for _ in range(3):
            forward()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
            for _ in range(3):
                forward()
            torch.cuda.synchronize()
        if cm is not None:
            cast.remove()
        lines.append(f"## {label} (3 forwards)\n")
        lines.append(p.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))
out_path.write_text("\n".join(lines))
print("\n".join(lines)[:6000])
