"""Which op of sd35_medium's Decoder, routed channels-last with the cast enabled, hands on an NCHW tensor (H100,
2026-12-06d: the profile showed the 256-1024 stages NCHW under the route). Logs each torch function called on a
4-D tensor inside one routed forward: its name, the layouts in and out, the shape.  python trace.py CAST OUT"""
import sys
from pathlib import Path
import torch
from engine.config import build_target, load_config
from engine.cast.loader import load
from engine.cast.layouts import LayoutSet

cast_path, out = sys.argv[1], Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
target = build_target(load_config("configs/models/sd35_medium.toml", small=DEV == "cpu"), torch.device(DEV))
model, forward = target.module, target.forward
cast = load(cast_path)

def fmt(x):
    if not isinstance(x, torch.Tensor):
        return type(x).__name__ if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor) and fmt(x[0]) else "-"
    if x.dim() != 4:
        return f"{x.dim()}d"
    if x.is_contiguous():
        return "NCHW"
    return "CL" if x.is_contiguous(memory_format=torch.channels_last) else "other" + str(tuple(x.stride()))

log = []
class Spy(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        res = func(*args, **(kwargs or {}))
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and first.dim() == 4:
            o = res[0] if isinstance(res, (tuple, list)) and res and isinstance(res[0], torch.Tensor) else res
            log.append(f"{getattr(func, '__qualname__', str(func))[:34]:34s} in {fmt(first):6s} "
                       f"{[fmt(a) for a in args[1:3]]} out {fmt(o):6s} {tuple(first.shape)}")
        return res

with torch.no_grad(), cast.enabled():
    ls = LayoutSet(model, lambda p, m: type(m).__name__ == "Decoder", learn=True)
    with ls:
        forward(); forward()
        cast.reset_stats()
        with Spy():
            forward()
    st = cast.stats()
lines = [f"route {ls.summary()}", f"hits {[(v['id'], v['hits']) for v in st['variants'] if v['hits']]}"] + log
(out / "trace.txt").write_text("\n".join(lines))
keep = [l for l in log if "__get__" not in l and "is_contiguous" not in l and "size" not in l.split()[0]]
print("\n".join(lines[:2] + keep[-400:]))
