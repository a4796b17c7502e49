"""How far a reference model's output moves when some ops round differently by one unit in the last place.

A cast's kernels are verified op by op within a tolerance of a rounding step or two; the end-to-end check
then reports how far the model's final output moved against eager (`bench_e2e.py`'s "rel L2 err"). This
script says what to expect from rounding alone: it runs the model eagerly, then again with the outputs of
the named ops nudged by one ulp (up or down at random) on a fraction of their elements, and prints both
relative L2 distances of the final output. Runs on the CPU, with the config's small (--small) inputs.

    python scripts/ulp_sensitivity.py gemma4_e2b --ops gelu --fraction 0.1
    python scripts/ulp_sensitivity.py resnet50 --ops relu --device cpu --json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

UINT = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


class UlpNudge(TorchDispatchMode):
    """Moves a `fraction` of the (nonzero, finite) output elements of the named ops by one ulp."""

    def __init__(self, ops: set[str], fraction: float, seed: int = 1):
        super().__init__()
        self.ops, self.fraction = ops, fraction
        self.gen = torch.Generator().manual_seed(seed)
        self.nudged = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__.rstrip("_") in self.ops and isinstance(out, torch.Tensor) \
                and out.dtype in UINT and out.numel():
            bits = out.view(UINT[out.dtype])
            pick = (torch.rand(out.shape, generator=self.gen) < self.fraction).to(out.device)
            pick &= (out != 0) & torch.isfinite(out)
            step = torch.where(torch.rand(out.shape, generator=self.gen) < 0.5, 1, -1).to(bits.dtype).to(out.device)
            bits.copy_(torch.where(pick, bits + step, bits))  # adjacent bit pattern: the neighbouring value
            self.nudged += int(pick.sum())
        return out


def measure(model: str, ops: set[str], fraction: float, device: str = "cpu", small: bool = True) -> dict:
    from engine.config import build_target, load_config
    from engine.models.forwards import output_tensor

    target = build_target(load_config(model, small=small), torch.device(device))
    with torch.no_grad():
        a = output_tensor(target.forward()).double()
        b = output_tensor(target.forward()).double()
        nudge = UlpNudge(ops, fraction)
        with nudge:
            c = output_tensor(target.forward()).double()
    return {"model": model, "ops": sorted(ops), "fraction": fraction, "device": device, "small": small,
            "shape": list(a.shape), "elements_nudged": nudge.nudged,
            "rel_l2_eager_vs_eager": float((a - b).norm() / a.norm()),
            "rel_l2_nudged": float((a - c).norm() / a.norm())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a shipped config name (resnet50, sd35_medium, gemma4_e2b, qwen35_a3b) or a path")
    ap.add_argument("--ops", required=True, help="ATen op names whose outputs are nudged, comma-separated (gelu,mul)")
    ap.add_argument("--fraction", type=float, default=0.1, help="share of each output's elements nudged (0-1]")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--full", action="store_true", help="the config's full-size inputs instead of --small")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not 0 < args.fraction <= 1:
        print(f"error: --fraction {args.fraction}: use a share in (0, 1], e.g. 0.1", file=sys.stderr)
        return 2
    ops = {o.strip() for o in args.ops.split(",") if o.strip()}
    if not ops:
        print("error: --ops is empty: name at least one ATen op, e.g. --ops gelu", file=sys.stderr)
        return 2
    r = measure(args.model, ops, args.fraction, args.device, small=not args.full)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"{r['model']} {r['shape']}: eager against eager {r['rel_l2_eager_vs_eager']:.1e} rel. L2; "
              f"{r['elements_nudged']} outputs of {', '.join(r['ops'])} one ulp off: {r['rel_l2_nudged']:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
