"""StandInWorker: a process-level test double of the GPU worker (no GPU), obeying commands to
crash, hang, fault or answer, through the real lane protocol (`engine.lane.protocol.serve`)."""

import hashlib
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.lane.protocol import Rejected, WorkerFault, serve, unb64  # noqa: E402

loaded: list[str] = []


def echo(p):
    print("stray output that must not corrupt the protocol")
    time.sleep(p.get("sleep", 0))
    return {"echo": p.get("value"), "pid": os.getpid(), "t": time.time(), "loaded": list(loaded)}


def crash(p):
    os.kill(os.getpid(), signal.SIGSEGV)  # as a kernel fault that takes the process down


def hang(p):
    while True:
        time.sleep(1)


def fault(p):
    raise WorkerFault("runtime-fault", "an illegal memory access was encountered")


def reject(p):
    raise Rejected("mismatch", "out0: 3 elements differ")


def load_card(p):
    loaded.append(p.get("card_id", p.get("card")))
    return {"loaded": list(loaded)}


def time_eager(p):
    # A fixed answer: this stand-in tests the plumbing that stores eager latency, not a measurement.
    if "unmeasurable" in p["card_id"]:
        raise Rejected("internal", "RuntimeError: the op raised")
    return {"eager": {"median": 12.5, "iqr": 0.25, "n": 40}, "throttled": 0, "roofline_us": 3.0}


def time_copy(p):
    # Fixed answers again: the plumbing that stores the card's references, not a measurement.
    if "nobytes" in p["card_id"]:
        raise Rejected("protocol", f"card {p['card_id']}: no floor bytes to copy")
    return {"copy": {"median": 4.0, "iqr": 0.1, "n": 40}, "bytes": 1 << 20, "throttled": 0}


def time_compiled(p):
    if "nocompile" in p["card_id"]:
        raise Rejected("compile", "torch.compile (default) failed: Unsupported: the op has no meta kernel")
    if "slowcompile" in p["card_id"]:
        while True:  # a compile that never ends: the engine's timeout must end it
            time.sleep(1)
    return {"compiled": {"median": 9.5, "iqr": 0.2, "n": 40}, "throttled": 0, "mode": p.get("mode") or "m",
            "compile_s": 1.5}


def evaluate(p):
    # What the lane was handed, so a test can tell which compile's binary reached it.
    if p.get("card_id") not in loaded:
        raise Rejected("protocol", f"card {p.get('card_id')} is not loaded in this worker")
    cubin = unb64(p["cubin"]) if p.get("cubin") else b""
    return {"verdict": {"ok": True}, "cubin_sha256": hashlib.sha256(cubin).hexdigest(), "spec": p.get("spec")}


def bug(p):
    raise KeyError("oops")


if __name__ == "__main__":
    sys.exit(serve({"echo": echo, "crash": crash, "hang": hang, "fault": fault, "reject": reject,
                    "load_card": load_card, "bug": bug, "time_eager": time_eager, "evaluate": evaluate,
                    "time_copy": time_copy, "time_compiled": time_compiled}))
