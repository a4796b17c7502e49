"""The chain precision check's ratio (a kernel's error against the float64 chain over eager's) for honest and
low-precision RMSNorm kernels written in PyTorch, across row sizes and seeds: what CHAIN_PRECISION_FACTOR
rests on (docs/chains.md). CPU only.

    python scripts/chain_precision_sweep.py [--dtype bfloat16] [--rows 10] [--seeds 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.capture.chains import (
    CHAIN_OP,
    chain_signature,
    container_paths,
    find_chains,
    patterns,
    trace_forward,
)
from engine.verify.pipeline import card_check


class GemmaRMS(nn.Module):
    """Eager rounds once: `(h * rsqrt(mean(h^2) + eps) * (1 + w)).to(x.dtype)`."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d) * 0.1)

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (h * (1 + self.weight.float())).to(x.dtype)


class LlamaRMS(GemmaRMS):
    """Eager rounds twice: `w * (h * rsqrt(…)).to(x.dtype)`."""

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


class Holder(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x):
        return self.norm(x) * 2


def chain_card(kind, d, rows, dtype):
    model = Holder(kind(d)).to(dtype)
    if kind is LlamaRMS:
        with torch.no_grad():
            model.norm.weight.add_(1)
    x = torch.randn(rows, d, dtype=dtype)
    t = trace_forward(model, lambda: model(x), time_calls=False)
    (p,) = [p for p in patterns(find_chains(t.calls, container_paths(model), unknown=t.unknown)) if p.kind == "module"]
    return chain_signature(p.instances[0]), model.norm.weight.detach().clone()


def _tree(t):
    while t.shape[-1] > 1:
        t = t[..., 0::2] + t[..., 1::2]
    return t


def kernels(gemma: bool):
    """name -> run(x, w): float32 with eager's roundings (another sum order), and three low-precision ones."""
    def out(x, h, r, w):  # the weight step, rounding where eager rounds
        return ((h * r) * (1 + w.float())).to(x.dtype) if gemma else w * (h * r).to(x.dtype)

    def honest(x, w):
        h = x.float()
        return out(x, h, torch.rsqrt(_tree(h * h) / x.shape[-1] + 1e-6), w)

    def bf16(x, w, sequential=False):
        sq = x * x
        acc = sq[..., :1]
        if sequential:
            for i in range(1, x.shape[-1]):
                acc = acc + sq[..., i:i + 1]
        else:
            acc = _tree(sq)
        r = torch.rsqrt(acc / x.shape[-1] + 1e-6)
        return x * r * (1 + w) if gemma else w * (x * r)

    def f32_sum(x, w):
        r = torch.rsqrt((x.float() ** 2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)
        return x * r * (1 + w) if gemma else w * (x * r)

    return {"float32, eager's roundings": honest, "bf16 throughout, tree sum": bf16,
            "bf16 throughout, sequential sum": lambda x, w: bf16(x, w, True),
            "float32 sum, bf16 rsqrt and products": f32_sum}


def ratio(sig, sample, run) -> float | str:
    """The precision check's ratio for one sample (a factor of 0 makes it report it)."""
    check = card_check(CHAIN_OP, sig, [sample], fresh=0, edges=False, race_reps=0, precision_factor=0.0)
    v = check.check(lambda b, prefill: [run(b[0][1], b[1][1])])
    return v.details["precision"]["ratio"] if "precision" in v.details else v.category or "ok"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--rows", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--sizes", default="32,128,512,1024,4096")
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    torch.manual_seed(0)
    for kind in (GemmaRMS, LlamaRMS):
        for d in (int(s) for s in a.sizes.split(",")):
            sig, w = chain_card(kind, d, a.rows, dtype)
            for name, run in kernels(kind is GemmaRMS).items():
                if "sequential" in name and d > 1024:
                    continue  # one bf16 add per element in Python: slow, and far outside any factor already
                got = [ratio(sig, [("in0", torch.randn(a.rows, d, generator=torch.Generator().manual_seed(s))
                                    .to(dtype)), ("in1", w)], run) for s in range(a.seeds)]
                nums = [g for g in got if isinstance(g, float)]
                cell = (f"{min(nums):.2f} / {statistics.mean(nums):.2f} / {max(nums):.2f}" if nums else "–")
                other = sorted({g for g in got if not isinstance(g, float)})
                print(f"{kind.__name__:9} d={d:<5} {name:38} min/mean/max {cell}"
                      + (f"  ({len(got) - len(nums)} {', '.join(other)})" if other else ""), flush=True)


if __name__ == "__main__":
    main()
