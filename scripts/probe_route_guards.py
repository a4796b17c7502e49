"""What a module route costs a compiled model in Dynamo's guards, by how the route is hooked in (CPU).

    python scripts/probe_route_guards.py [--blocks 30] [--rounds 30] [--out DIR]

A cast's module cards and graph routes put a route object in a module instance's `forward`. Under
torch.compile nothing of an eager-only cast runs, yet Gemma 4 compiled with such a cast installed read 0.986x of
Gemma compiled alone on the H200 (docs/results/reproduce-h200/2026-12-04b). This probe isolates the guards. The
model is `--blocks` blocks of RMSNorm -> Linear -> RMSNorm, and both RMSNorms of every block are hooked. It is
compiled with a backend whose compiled function returns a constant, so a call costs Dynamo's guard check and
little else. Each way of hooking the norms is one copy of the model, and the copies are timed in rounds, in
turn. The lines are microseconds per call (medians) and the difference to the plain model:

- plain: nothing hooked;
- instance method: `forward` in the instance's __dict__, PyTorch's own bound method;
- module route: engine.cast.modules.ModuleRoute in the instance's __dict__ as its `forward` (how a cast hooked
  module cards in until the class dispatcher replaced it);
- class swap: each instance given its own subclass whose `forward` is the route;
- class dispatcher: engine.cast.modules.attach, how a cast hooks in module cards and graph routes now. The class's
  `forward` is replaced once by a function that, when Dynamo is tracing, calls the original at once. In eager it
  finds the instance's route in its __dict__ under another name.

This measures the host's guard work on this machine's CPU, not a model's speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build(blocks: int, norm_cls: type) -> Any:
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n1, self.lin, self.n2 = norm_cls(), nn.Linear(16, 16), norm_cls()

        def forward(self, x: Any) -> Any:
            return self.n2(self.lin(self.n1(x))) + x

    return nn.Sequential(*[Block() for _ in range(blocks)]).eval()


def norm_class(name: str) -> type:
    import torch
    from torch import nn

    def __init__(self: Any) -> None:
        nn.Module.__init__(self)
        self.w, self.eps = nn.Parameter(torch.ones(16)), 1e-6

    def forward(self: Any, x: Any) -> Any:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w

    return type(name, (nn.Module,), {"__init__": __init__, "forward": forward})


class _Owner:  # stands in for a Cast: a ModuleRoute holds its owner weakly
    pass


def hook(model: Any, how: str, norm_cls: type, owner: object) -> None:
    import torch

    from engine.cast.modules import ModuleRoute, attach

    for path, m in model.named_modules():
        if not isinstance(m, norm_cls):
            continue
        if how == "instance method":
            m.__dict__["forward"] = types.MethodType(norm_cls.forward, m)
        elif how == "module route":
            m.__dict__["forward"] = ModuleRoute(m, path, owner)
        elif how == "class swap":
            route = ModuleRoute(m, path, owner)

            def fwd(self: Any, *args: Any, _route: Any = route) -> Any:
                if torch.compiler.is_compiling():
                    return norm_cls.forward(self, *args)
                return _route(*args)

            m.__class__ = type(f"Routed{norm_cls.__name__}", (norm_cls,), {"forward": fwd})
        elif how == "class dispatcher":  # the shipped hook
            attach(m, ModuleRoute(m, path, owner))


WAYS = ("plain", "instance method", "module route", "class swap", "class dispatcher")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=400, help="calls per round and way")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    for name in ("blocks", "rounds", "calls"):
        if getattr(args, name) < 1:
            print(f"error: --{name} must be at least 1", file=sys.stderr)
            return 2

    import torch

    torch.set_num_threads(1)
    owner = _Owner()

    def constant(gm: Any, example: list[Any]) -> Any:
        out = gm(*example)
        return lambda *a: out

    x = torch.randn(2, 16)
    fns = {}
    for how in WAYS:
        cls = norm_class("Norm" + how.title().replace(" ", ""))  # a class per way: the dispatcher patches its own
        torch.manual_seed(0)
        model = build(args.blocks, cls)
        hook(model, how, cls, owner)
        fns[how] = (torch.compile(model, backend=constant), model)

    def per_call(fn: Any) -> float:
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn(x)
        return (time.perf_counter() - t0) / args.calls * 1e6

    with torch.no_grad():
        for fn, _ in fns.values():
            fn(x)
            per_call(fn)
        times: dict[str, list[float]] = {how: [] for how in WAYS}
        for _ in range(args.rounds):
            for how, (fn, _) in fns.items():
                times[how].append(per_call(fn))
    med = {how: statistics.median(v) for how, v in times.items()}
    hooked = 2 * args.blocks
    lines = [f"# Dynamo guard cost by how {hooked} modules are hooked (CPU, torch {torch.__version__})", "",
             "| way | µs per call | difference | per hooked module |", "|---|---:|---:|---:|"]
    for how in WAYS:
        d = med[how] - med["plain"]
        lines.append(f"| {how} | {med[how]:.1f} | {d:+.1f} | {d / hooked:+.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_route_guards.md").write_text(text)
        (args.out / "probe_route_guards.json").write_text(json.dumps(
            {"torch": torch.__version__, "blocks": args.blocks, "hooked": hooked, "median_us": med,
             "rounds_us": times}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
