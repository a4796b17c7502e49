"""Host time: what the CPU spends issuing calls and forwards (where a host-bound model's time goes)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch


def per_call_us(fn: Any, n: int = 3000, rounds: int = 5) -> float:
    """Host µs per call of `fn` issued back to back, best of `rounds` (the GPU is not awaited per call;
    for ops small enough that the queue never fills, this is the host's cost alone)."""
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best = min(best, (t1 - t0) / n * 1e6)
    return best


def _issue_once(forward: Any) -> tuple[float, float]:
    """One forward with the GPU idle before it: (seconds to issue it, seconds until the GPU finished it)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    forward()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return t1 - t0, time.perf_counter() - t0


def issue_us(forward: Any, n: int = 20) -> tuple[float, float]:
    """A model forward's (median host µs to issue it, GPU idle before each; wall µs per forward)."""
    issue, wall = [], 0.0
    for _ in range(n):
        i, w = _issue_once(forward)
        issue.append(i)
        wall += w
    return sorted(issue)[n // 2] * 1e6, wall / n * 1e6


def python_profile(forward: Any, calls: int = 10, top: int = 8) -> str:
    """cProfile of `calls` forwards, the `top` functions by own time (where the host's time goes)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(calls):
        forward()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def gpu_launches(forward: Any) -> dict[str, int]:
    """What one forward puts on the GPU, counted by the profiler: kernels, and memory copies/sets (each a
    launch the host pays for). A host-bound forward's time is about launches × the host's cost per launch."""
    from torch.profiler import ProfilerActivity, profile

    forward()  # warm: lazy initialisation is not part of a forward
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        forward()
        torch.cuda.synchronize()
    return count_gpu_events(prof.events())


def count_gpu_events(events: Any) -> dict[str, int]:
    """Kernels and memcpy/memset among a profiler's events (those that ran on the device)."""
    kernels = copies = 0
    for e in events:
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        name = e.name.lower()
        if "memcpy" in name or "memset" in name:
            copies += 1
        else:
            kernels += 1
    return {"kernels": kernels, "copies": copies}


def host_per_forward(forward: Any, n: int = 20) -> dict[str, float]:
    """A forward's host side: µs to issue it (GPU idle before), launches on the GPU, and µs per launch."""
    issue, wall = issue_us(forward, n)
    launches = gpu_launches(forward)
    total = launches["kernels"] + launches["copies"]
    return {"issue_us": issue, "wall_us": wall, **launches, "us_per_launch": issue / total if total else float("nan")}


def host_pair(forward: Any, arm: Callable[[], contextlib.AbstractContextManager], n: int = 20
              ) -> tuple[dict[str, float], dict[str, float]]:
    """`host_per_forward` of the plain forward and of the forward inside `arm()` (e.g. `lambda:
    cast.enabled(model)`), their issue times taken in alternating rounds (which arm goes first alternates
    too), so that a drift of the host or of the GPU's clocks over the measurement falls on both alike.
    Entering and leaving `arm()` happen outside the timed forward. Returns (plain, in arm)."""
    times: dict[bool, list[float]] = {False: [], True: []}
    walls: dict[bool, float] = {False: 0.0, True: 0.0}
    for i in range(n):
        for inside in ((False, True) if i % 2 == 0 else (True, False)):
            with arm() if inside else contextlib.nullcontext():
                i, w = _issue_once(forward)
            times[inside].append(i)
            walls[inside] += w
    out = []
    for inside in (False, True):
        if inside:
            with arm():
                launches = gpu_launches(forward)
        else:
            launches = gpu_launches(forward)
        issue = sorted(times[inside])[n // 2] * 1e6
        total = launches["kernels"] + launches["copies"]
        out.append({"issue_us": issue, "wall_us": walls[inside] / n * 1e6, **launches,
                    "us_per_launch": issue / total if total else float("nan"), "alternated": True})
    return out[0], out[1]
