"""Timing whole model forwards: device time of one call, CUDA-graph capture, how many forwards to time.

The per-op timing protocol (L2 flush, alternation, adaptive repetitions) is `engine.bench.timing`; these
are the pieces the whole-model check and the end-to-end benchmarks time forwards with.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def time_forward(run: Callable[[], Any]) -> float:
    """Device µs of one call of `run` (CUDA events, synchronised before and after)."""
    import torch

    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    run()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3


def time_steady(run: Callable[[], Any], device: str = "cuda", warm: int = 1,
                before: Callable[[], Any] | None = None) -> float:
    """Device µs of a call of `run` made right after `warm` untimed calls of it (time_forward of the last; off
    the GPU, `device` other than "cuda", the wall clock: a script's control flow on the CPU, no measurement).

    Whatever ran on the host just before a timed forward weighs on it: on the H200 (ResNet-50 under
    torch.compile, 2026-12-04, docs/results/reproduce-h200/2026-12-04/) a forward right after installing and
    removing a cast (2 ms of Python), after 2 ms of other Python, or after a 2 ms sleep read 2.5-4 % slower
    than one right after another forward, and a forward after those and one untimed call read as fast as
    any (1.003x). An arm that installs a cast around its calls paid that every time. A model in use runs its
    forwards back to back: that steady state is what both arms of a comparison are timed in.

    `before` runs ahead of every call, outside the timed window (engine.bench.varied.Varied.before: the next
    variant of the inputs)."""
    for _ in range(warm):  # 0: timed right after whatever ran before (the previous timed call of a block)
        if before is not None:
            before()
        run()
    if before is not None:
        before()
    if device != "cuda":
        import time

        t0 = time.perf_counter()
        run()
        return (time.perf_counter() - t0) * 1e6
    return time_forward(run)


def capture_graph(forward: Callable[[], Any]) -> tuple[Any, Any]:
    """The forward captured in a CUDA graph after warm-up on a side stream: (graph, its static output)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            forward()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = forward()
    return g, out


# settle: forwards back to back until the median time of the last third of the calls is within SETTLE_TOL of the
# middle third's (each at least SETTLE_WINDOW calls), after at least SETTLE_MIN_S and at most SETTLE_MAX_S seconds.
SETTLE_WINDOW = 5
SETTLE_TOL = 0.03
SETTLE_MIN_S = 6.0
SETTLE_MAX_S = 30.0
_clock = time.perf_counter   # settle's clock (tests give it a scripted one)


def settle(run: Callable[[], Any], device: str = "cuda", min_s: float = SETTLE_MIN_S,
           max_s: float = SETTLE_MAX_S, window: int = SETTLE_WINDOW, tol: float = SETTLE_TOL,
           before: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Call `run` back to back until its time per call stops moving: the medians of the last two thirds of the
    calls so far (each at least `window` calls) within `tol` of each other, after at least `min_s` seconds; at
    most `max_s`. Returns what it saw: seconds, calls, the first and last windows' medians in ms, whether it
    settled, and `trace_ms`, the medians of ten equal slices of the calls, in order.

    A host-bound forward runs at the host's pace, and that pace is not constant on a fresh or just-busy host:
    on an H100 VM (2026-12-07, docs/results/report-2026-12-07/) ViT-B/16's eager forward issued in 4.5-5.5 ms
    in a new process on a new machine and in 3.0-3.2 ms once settled, while its cast's arm, replayed from a
    CUDA graph, issues almost nothing. Timed in that early phase, the cast read 1.44x faster; settled, 1.006x.
    Whole-model comparisons settle the arm without the cast first, so both arms are timed at the pace the
    model runs at in use.

    The windows grow with the run: two windows of 5 forwards compared after 2 s (the first form) agreed within
    3 % while the pace was still falling from 8.0 to 4.6 ms a forward (H100, 2026-12-07d), a drift too slow to
    show across 10 calls. Thirds of everything so far span seconds, so a drift shows until it has stopped for a
    third of the run."""
    import statistics

    times: list[float] = []
    t0 = _clock()
    done = False
    while True:
        times.append(time_steady(run, device, warm=0, before=before))
        elapsed = _clock() - t0
        n = len(times)
        third = max(window, n // 3)
        # compared every `window` calls, or every ~2 % of the calls on a long run (medians of thousands)
        if n >= 2 * third and elapsed >= min_s and n % max(window, n // 50) == 0:
            a, b = statistics.median(times[-2 * third:-third]), statistics.median(times[-third:])
            if abs(a - b) <= tol * b:
                done = True
                break
        if elapsed >= max_s:
            break
    k = min(window, len(times))
    cuts = [round(i * len(times) / 10) for i in range(11)]
    trace = [round(statistics.median(times[i:j]) / 1e3, 4) for i, j in zip(cuts, cuts[1:]) if j > i]
    return {"seconds": elapsed, "calls": len(times), "first_ms": statistics.median(times[:k]) / 1e3,
            "last_ms": statistics.median(times[-k:]) / 1e3, "settled": done, "trace_ms": trace}


def describe_settle(s: dict[str, Any] | None) -> str:
    """One line: how the forward's time moved while it settled."""
    if not s:
        return "not settled first"
    return (f"{s['calls']} forwards over {s['seconds']:.1f} s, {s['first_ms']:.2f} → {s['last_ms']:.2f} ms a forward"
            + ("" if s["settled"] else " (still moving when the time was up)"))


def auto_iters(forward_us: float, seconds: float = 2.0, lo: int = 10, hi: int = 100) -> int:
    """Forwards per arm: about `seconds` of timing per arm, at least `lo` (the CI needs pairs), at most `hi`."""
    return max(lo, min(hi, int(seconds * 1e6 / max(forward_us, 1.0))))


def kernel_times(forward: Callable[[], Any], n: int = 3, top: int = 25) -> dict[str, Any]:
    """GPU kernel time per forward by kernel (torch.profiler over `n` forwards): the total, and the `top`
    kernels by time, each with its calls per forward. Needs a CUDA GPU."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            forward()
        torch.cuda.synchronize()
    rows, total = [], 0.0
    for e in prof.key_averages():
        dev = getattr(e, "self_device_time_total", None)
        if dev is None:
            dev = getattr(e, "self_cuda_time_total", 0.0)
        if dev and e.device_type == torch.autograd.DeviceType.CUDA:
            rows.append({"name": e.key[:120], "us_per_forward": dev / n, "count_per_forward": e.count / n})
            total += dev / n
    rows.sort(key=lambda r: -r["us_per_forward"])
    return {"gpu_kernel_us_per_forward": total, "top": rows[:top]}
