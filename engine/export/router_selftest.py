"""The C++ router's self-test on this GPU, run in a child process before `auto` mode trusts the router.

On 2026-11-30 the router (built on an H200, torch 2.11) crashed its process with SIGSEGV on the first guard
miss of several real flows (a cast's host-cost probe, a Gemma forward, an export's confirmation), while
the same code passed its CPU-key tests. A router that can take a user's process down must prove itself
where it will run. This child builds a small cast (relu, an add of a Python number, a mean over a dim),
routes it through the C++ router and makes the kinds of calls that crashed there: hits, a plain miss,
near misses (another dtype, other strides, a misaligned view, another number, other values), then the
suspended path and a hit with poisoned outputs, checking every result against PyTorch's. Exit 0 means
every call returned the right answer; anything else (a crash included) keeps the loader on the Python
router. A crash prints the router's native stack (KFORGE_ROUTER_BACKTRACE).

    python -m engine.export.router_selftest      # prints one line per step; exit 0 when all passed
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def main() -> int:
    os.environ["KFORGE_CAST_ROUTER"] = "cpp"  # this process is the test: no self-test of its own
    os.environ["KFORGE_ROUTER_BACKTRACE"] = "1"  # a crash prints the router's native stack
    import faulthandler

    faulthandler.enable()
    import torch

    if not torch.cuda.is_available():
        print("router self-test: no CUDA GPU here", flush=True)
        return 3
    import engine.cast
    from engine.cast import cpp_router, runtime
    from engine.export.hostcost import probe_cast

    def step(what: str) -> None:
        print(f"router self-test: {what}", flush=True)  # the last line printed names the call that crashed

    relu, add, mean = torch.ops.aten.relu.default, torch.ops.aten.add.Tensor, torch.ops.aten.mean.dim
    x = torch.randn(4096, device="cuda", dtype=torch.float16)
    m = torch.randn(64, 4096, device="cuda")
    with tempfile.TemporaryDirectory() as tmp:
        step("building a cast: relu fp16[4096]; x + 1e-6 (a Python number in a Tensor slot); "
             "mean over the last dim (an int list, a bool and an absent dtype)")
        cast = engine.cast.load(probe_cast(Path(tmp) / "selftest.cast", [
            (relu, (x,)), (add, (x.float(), 1e-6)), (mean, (m, [-1], True))]))
        wide = torch.randn(8194, device="cuda", dtype=torch.float16)
        calls = [
            ("hit", lambda: torch.relu(x), lambda: x.clamp_min(0)),
            ("plain miss (other size)", lambda: torch.relu(wide), lambda: wide.clamp_min(0)),
            ("near miss (other dtype)", lambda: torch.relu(x.float()), lambda: x.float().clamp_min(0)),
            ("near miss (other strides)", lambda: torch.relu(wide[::2][:4096]), lambda: wide[::2][:4096].clamp_min(0)),
            ("near miss (misaligned view)", lambda: torch.relu(wide[1:4097]), lambda: wide[1:4097].clamp_min(0)),
            ("hit with a Python number", lambda: x.float() + 1e-6, None),
            ("near miss with another number", lambda: x.float() + 2e-6, None),
            ("hit with values (dim=[-1], keepdim=True)", lambda: m.mean(dim=[-1], keepdim=True), None),
            ("near miss with another value (keepdim=False)", lambda: m.mean(dim=[-1]), None),
            ("near miss with another dtype argument", lambda: m.mean(dim=[-1], keepdim=True, dtype=torch.float64),
             None),
        ]
        with cast.enabled():
            routed = [v.cpp is not None for v in cast.variants]
            if not all(routed):
                step(f"not every variant was routed in C++: {routed}")
                return 1
            for what, call, want in calls:
                step(what)
                got = call()
                torch.cuda.synchronize()
                if want is not None and not torch.equal(got, want()):
                    step(f"{what}: wrong result")
                    return 1
                if want is None:  # compare with PyTorch's own kernel, the comparison itself unrouted (allclose's
                    # `atol + rtol * |ref|` with atol=1e-6 is an fp32[4096] + 1e-6 call: the add variant's signature)
                    with runtime.suspended():
                        ref = call()
                        same = got.dtype == ref.dtype and got.shape == ref.shape and torch.allclose(
                            got, ref, rtol=1e-5, atol=1e-6)
                    if not same:
                        step(f"{what}: wrong result")
                        return 1
            step("suspended (every routed call to PyTorch)")
            with runtime.suspended():
                if not torch.equal(torch.relu(x), x.clamp_min(0)):
                    step("suspended: wrong result")
                    return 1
            step("hit with poisoned fresh outputs (export's confirmation)")
            with cpp_router.prefill("nan"):
                if not torch.equal(torch.relu(x), x.clamp_min(0)):
                    step("poisoned hit: wrong result")
                    return 1
            torch.cuda.synchronize()
            st = cast.stats()
            hits = [v.hits for v in cast.variants]  # read while installed, as a user of stats() inside the block
        step(f"hits per variant {hits}; misses {st['misses']}; near misses {st['near_misses']}")
        if hits != [2, 1, 1]:
            step(f"expected hits [2, 1, 1], counted {hits}")
            return 1
    step("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
