"""Is the lane's hog co-resident with the candidate? Time the class-7 race kernel alone and beside hogs that
spin 30 us (the lane's) and 300 us, and count its wrong rows."""
import contextlib
import ctypes
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
ref = capture_card(Path(tempfile.mkdtemp()), lambda: torch.sum(torch.randn(512, 4096, device=dev), dim=1), 1)
res = resolve(parse_spec(A.spec), Env.from_card(ref.signature, ref.outputs), max_shared=w.max_shared)
L = CandidateLauncher(drv.Module(compile_nvrtc(A.source, arch=w.arch).cubin), res, ref.op, ref.outputs, dev,
                      max_shared=w.max_shared)
x = torch.randn(512, 4096, device=dev)
want = x.sum(dim=1)
bound = [("self", x), ("dim", [1]), ("keepdim", False), ("dtype", None)]
print("hog cycles (lane)", w._hog.cycles.value, "clock", w._peak.clock_hz)


def hog(frac, us, sleep):
    cyc = ctypes.c_int64(int(us * 1e-6 * w._peak.clock_hz))
    params = (ctypes.c_void_p * 1)(ctypes.addressof(cyc))

    @contextlib.contextmanager
    def ctx():
        main = torch.cuda.current_stream(dev)
        w._side.wait_stream(main)
        drv.launch(w._hog.fn, (2 * int(w._hog.sms * frac), 1, 1), (1024, 1, 1), 0, w._side.cuda_stream,
                   ctypes.addressof(params))
        torch.cuda._sleep(sleep)
        try:
            yield
        finally:
            main.wait_stream(w._side)
    return ctx


for name, ctx in [("alone", contextlib.nullcontext), ("lane hog", w._contend),
                  ("hog 90% 300us sleep 20000", hog(0.9, 300, 20000)), ("hog 50% 300us sleep 20000", hog(0.5, 300, 20000))]:
    bad, ms = [], []
    for _ in range(8):
        launch = L.prepare(bound, "nan")
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with ctx():
            s.record()
            (out,) = launch()
            e.record()
        torch.cuda.synchronize()
        ms.append(round(s.elapsed_time(e) * 1e3, 1))
        bad.append(int((~torch.isclose(out, want, rtol=1e-4, atol=1e-3)).sum()))
    print(f"{name}: wrong rows {bad}; kernel us {ms}")
