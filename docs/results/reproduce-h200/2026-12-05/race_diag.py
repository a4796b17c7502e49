"""Why the adversarial class-7 race (row sum whose leader reads its helper's partial after a fixed wait) is not
exposed by the lane's contention: run it alone and beside the worker's hog in several ways, count wrong rows."""
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, "tests")
from adversarial_kernels import RACE_NEEDS_CONTENTION as A  # noqa: E402

from engine.capture.single import capture_card  # noqa: E402
from engine.compile import compile_nvrtc  # noqa: E402
from engine.launch import Env, parse_spec, resolve  # noqa: E402
from engine.launch import cuda_driver as drv  # noqa: E402
from engine.launch.launcher import CandidateLauncher  # noqa: E402
from engine.lane.worker import Worker  # noqa: E402

w = Worker(0)
dev = w.device
torch.manual_seed(0)
ref = capture_card(Path(tempfile.mkdtemp()), lambda: torch.sum(torch.randn(512, 4096, device=dev), dim=1), 1)
res = resolve(parse_spec(A.spec), Env.from_card(ref.signature, ref.outputs), max_shared=w.max_shared)
comp = compile_nvrtc(A.source, arch=w.arch)
mod = drv.Module(comp.cubin)
L = CandidateLauncher(mod, res, ref.op, ref.outputs, dev, max_shared=w.max_shared)
print("launches", [(ln.kernel, ln.grid, ln.block) for ln in res.launches], "sms", w.props.multi_processor_count)
x = torch.randn(512, 4096, device=dev)
want = x.sum(dim=1)


def wrong(out):
    return int((~torch.isclose(out, want, rtol=1e-4, atol=1e-3)).sum())


def trial(name, ctx, n=20):
    bad = []
    for _ in range(n):
        with ctx():
            (out,) = L.run([("self", x), ("dim", [1]), ("keepdim", False), ("dtype", None)], "nan")
        torch.cuda.synchronize()
        bad.append(wrong(out))
    print(f"{name}: wrong rows per call {bad}")


import contextlib  # noqa: E402

trial("alone", contextlib.nullcontext)
trial("worker._contend", w._contend)


def hog_fixed(frac, sleep_cycles):
    @contextlib.contextmanager
    def ctx():
        main = torch.cuda.current_stream(dev)
        w._side.wait_stream(main)
        import ctypes
        blocks = 2 * max(1, int(w._hog.sms * frac))
        drv.launch(w._hog.fn, (blocks, 1, 1), (1024, 1, 1), 0, w._side.cuda_stream, ctypes.addressof(w._hog.params))
        torch.cuda._sleep(sleep_cycles)
        try:
            yield
        finally:
            main.wait_stream(w._side)
    return ctx


for frac in (0.5, 0.9):
    for sl in (4000, 40000):
        trial(f"hog {frac:.0%} sleep {sl}", hog_fixed(frac, sl), n=10)
