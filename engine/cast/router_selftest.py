"""The C++ router's self-test on this GPU, run in a child process before `auto` mode trusts the router.

On 2026-11-30 the router (built on an H200, torch 2.11) crashed its process with SIGSEGV on the first guard
miss of several real flows (a cast's host-cost probe, a Gemma forward, an export's confirmation), while
the same code passed its CPU-key tests. A router that can take a user's process down must prove itself
where it will run: this child builds a one-variant relu cast, routes it through the C++ router and makes
the calls that crashed there (a hit, plain misses, near misses of another dtype, other strides, a
misaligned view), checking every result against eager. Exit 0 means every call returned the right
answer; anything else (a crash included) keeps the loader on the Python router.

    python -m engine.cast.router_selftest      # prints one line per step; exit 0 when all passed
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def main() -> int:
    os.environ["KFORGE_CAST_ROUTER"] = "cpp"  # this process is the test: no self-test of its own
    import faulthandler

    faulthandler.enable()
    import torch

    if not torch.cuda.is_available():
        print("router self-test: no CUDA GPU here", flush=True)
        return 3
    import engine.cast
    from engine.cast.hostcost import relu_cast

    def step(what: str) -> None:
        print(f"router self-test: {what}", flush=True)  # the last line printed names the call that crashed

    with tempfile.TemporaryDirectory() as tmp:
        step("building a one-variant relu cast")
        cast = engine.cast.load(relu_cast(Path(tmp) / "selftest.cast"))
        x = torch.randn(4096, device="cuda", dtype=torch.float16)
        wide = torch.randn(8194, device="cuda", dtype=torch.float16)
        calls = [
            ("hit", x),
            ("plain miss (other size)", torch.randn(4104, device="cuda", dtype=torch.float16)),
            ("near miss (other dtype)", x.float()),
            ("near miss (other strides)", wide[::2][:4096]),
            ("near miss (misaligned view)", wide[1:4097]),
        ]
        with cast.enabled():
            if not cast.variants or cast.variants[0].cpp is None:
                step("the variant was not routed in C++")
                return 1
            for what, t in calls:
                step(what)
                got = torch.relu(t)
                torch.cuda.synchronize()
                if not torch.equal(got, t.clamp_min(0)):
                    step(f"{what}: wrong result")
                    return 1
            st = cast.stats()
        step(f"routed calls: {st}")
        if cast.variants[0].hits != 1:
            step(f"expected one hit, counted {cast.variants[0].hits}")
            return 1
    step("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
