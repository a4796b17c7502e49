"""Gemma 4: which module's output first differs between an eager forward and the same forward replayed from a
CUDA graph (the whole-model and text-model routes were refused with "the replay differs from the eager call"),
and where the host's time goes in a forward with the cast and its layer routes installed.

    python3 diag_trunk.py CAST OUT_DIR
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
import torch  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from engine.bench.host import python_profile  # noqa: E402
from engine.cast.loader import load  # noqa: E402
from engine.config import build_target, load_config  # noqa: E402

cast_path, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
t = build_target(load_config("configs/models/gemma4_e2b.toml"), torch.device("cuda"))
model, forward = t.module, t.forward
rec: list = []


def hook(name):
    def h(mod, args, output):
        rec.append((name, [x.detach().clone() for x in tree_flatten(output)[0] if isinstance(x, torch.Tensor)]))
    return h


handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()]
with torch.no_grad():
    forward()
    rec.clear()
    forward()
    eager = list(rec)
    rec.clear()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        forward()
        forward()
    torch.cuda.current_stream().wait_stream(s)
    rec.clear()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        forward()
    graph = list(rec)
    g.replay()
    torch.cuda.synchronize()
    rows = []
    for (n1, a), (n2, b) in zip(eager, graph):
        eq = [bool(torch.equal(x, y)) for x, y in zip(a, b)]
        md = [float((x.double() - y.double()).abs().max()) if x.numel() and x.shape == y.shape else -1 for x, y in zip(a, b)]
        rows.append({"module": n1, "same_name": n1 == n2, "equal": eq, "max_abs": md})
    first = next((r for r in rows if not all(r["equal"])), None)
    print("calls recorded", len(eager), len(graph), "first differing:", json.dumps(first), flush=True)
    for r in rows[:60]:
        print(r["module"], r["equal"], [f"{x:.3g}" for x in r["max_abs"]])
    (out / "trunk_diff.json").write_text(json.dumps(rows, indent=1))
    for h in handles:
        h.remove()
    del g
    cast = load(cast_path)
    with cast.enabled(model):
        for _ in range(5):
            forward()
        prof = python_profile(forward, calls=20, top=25)
    (out / "host_profile.txt").write_text(prof)
    print(prof[:5000])
