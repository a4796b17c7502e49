#!/usr/bin/env python3
"""The host cost of one call of a pattern card's op, as a compiled graph makes it (`torch.ops.kforge.chain_*`):
the op's dispatch, its guard (the input key, the table, the modes) and what it does to the plan's outputs
(unaliased, laid out as the compiled code was promised). The plan does no work (it returns outputs made once),
so what is timed is the path alone. CPU tensors: a host measurement, no GPU involved.

    python scripts/probe_pattern_call.py [--calls 20000] [--repeats 7] [--chain rms|add-rms|silu-mul] [--json FILE]

Prints µs per call (the best of the repeats' means) for the op, for its guard called directly, and for a plain
ATen op (`torch.add`) as the yardstick of this host's dispatch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def per_call_us(f, calls: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--chain", choices=("rms", "add-rms", "silu-mul"), default="rms",
                    help="the chain: an RMSNorm with its weight (2 inputs), residual add + RMSNorm (3), SiLU(gate) * up (2)")
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args(argv)
    if args.calls < 1 or args.repeats < 1:
        print("error: --calls and --repeats must be at least 1", file=sys.stderr)
        return 2

    import torch
    import torch.nn.functional as F

    from engine.capture import chains
    from engine.cast import patterns as P
    from engine.cast import runtime

    class RMS(torch.nn.Module):  # Gemma's form
        def __init__(self, d):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(d))

        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            return (h * (1 + self.weight.float())).to(x.dtype)

    class Layer(torch.nn.Module):
        def __init__(self, d):
            super().__init__()
            self.norm1, self.attn, self.norm2 = RMS(d), torch.nn.Linear(d, d), RMS(d)
            self.gate, self.up, self.down = (torch.nn.Linear(d, 2 * d), torch.nn.Linear(d, 2 * d),
                                             torch.nn.Linear(2 * d, d))

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            h = self.norm2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    model = torch.nn.Sequential(Layer(256), Layer(256)).eval()
    x = torch.randn(64, 256)
    trace = chains.trace_forward(model, lambda: model(x))
    want = {"rms": "pow mean add rsqrt mul add mul", "add-rms": "add pow mean add rsqrt mul add mul",
            "silu-mul": "silu mul"}[args.chain]
    pats = [p for p in chains.patterns(chains.find_chains(trace.calls, chains.container_paths(model), unknown=trace.unknown))
            if " ".join(c.op.split("::")[1].split(".")[0] for c in p.instances[0].calls if not c.view) == want]
    if not pats:
        print(f"error: the probe's model has no {args.chain} chain", file=sys.stderr)
        return 1
    sig = chains.chain_signature(pats[0].instances[0])
    ins = tuple(torch.randn(a["shape"]) for a in sig["args"])
    made = [t.clone() for t in chains.run_chain(sig, list(ins))]
    # no work: the path alone is timed; proven for the compile target and called inside its scope, as a compiled
    # graph of the cast's backend calls it
    plan = runtime.Plan("probe", lambda bound: made, targets=frozenset({runtime.compile_target(None)}))
    owner = object()
    ps = P.build(owner, [(sig, plan)])
    if ps.problems or not ps.built:
        print(f"error: the probe's chain did not build as a pattern: {ps.problems}", file=sys.stderr)
        return 1
    pop = ps.built[0].op
    op = P.chain_op(pop.name)
    with torch.no_grad(), runtime.target_scope(runtime.compile_target(None)):
        op(*ins)
        if plan.hits != 1:
            print(f"error: the op did not hit its variant ({pop.why_missed()})", file=sys.stderr)
            return 1
        res = {"op_us": per_call_us(lambda: op(*ins), args.calls, args.repeats),
               "guard_us": per_call_us(lambda: pop(ins), args.calls, args.repeats),
               "torch_add_us": per_call_us(lambda: torch.add(ins[0], ins[0]), args.calls, args.repeats),
               "chain": args.chain, "inputs": len(ins), "torch": torch.__version__}
    ps.remove()
    for k in ("op_us", "guard_us", "torch_add_us"):
        print(f"{k:14s} {res[k]:7.2f} µs per call")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
