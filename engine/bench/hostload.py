"""What else the host did while a comparison was timed, so a reader can tell a result from a disturbed host.

A host-bound arm (an eager forward that issues a kernel every 20-40 µs) runs as fast as the host lets it; an
arm that replays CUDA graphs issues almost nothing and does not care. So a host slowed by other work makes
the graph-replaying arm look faster than it is. On an H100 VM (2026-12-07, docs/results/report-2026-12-07/)
bench_e2e timed ViT-B/16's eager forward at 5.43 ms against its cast's 3.77 ms (1.44×, CI 1.42-1.48), with
35.6 µs of host per launch; the same forward, in one process a little later on the same machine, ran 3.52 ms
against 3.50 ms (1.006×) at 19.4 µs per launch, and bench_compose's eager pair had read 0.999×.

`HostWatch` samples, around the timed part:
- the CPU time of every other process on the host (from /proc/stat, less this process's own), in cores;
- the CPU time a hypervisor took from this VM (steal), in cores;
- this process's own CPU time, in cores (more than about one: threads of ours busy beside the forward);
- the host's µs to issue one tiny kernel before and after (the pace a host-bound forward runs at; recorded, not
  judged: see OTHER_CORES).

Linux only for the /proc figures (elsewhere they are None); the pace needs only torch.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any

# Thresholds for `disturbed`: other processes using more than half a core over the window, or steal of more than
# a tenth of one. The pace of issuing a tiny kernel is recorded, not judged: it moves by 2x on an idle 2-core
# machine after half a second of sleep (the CPU's clock), so a threshold on it would flag quiet hosts.
OTHER_CORES = 0.5
STEAL_CORES = 0.1


def _proc_stat() -> tuple[int, int, int] | None:
    """(busy jiffies of all CPUs, steal jiffies, total jiffies) from /proc/stat, None where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    v = [int(x) for x in fields[1:]]
    v += [0] * (10 - len(v))
    user, nice, system, idle, iowait, irq, softirq, steal = v[:8]  # guest time is already in user and nice
    busy = user + nice + system + irq + softirq
    return busy, steal, busy + idle + iowait + steal


def _own_jiffies() -> int | None:
    """This process's user + system jiffies, all its threads (not its children: their time is other work), or
    None."""
    try:
        with open("/proc/self/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # after the command's closing parenthesis: state is field 3, utime 14, stime 15
    return int(rest[11]) + int(rest[12])


def launch_us(n: int = 1000, rounds: int = 3) -> float | None:
    """The host's µs to issue one tiny kernel back to back (without a GPU, one tiny op on the CPU), best of
    `rounds` after one untimed round."""
    try:
        import torch
    except ImportError:
        return None
    cuda = torch.cuda.is_available()
    x = torch.zeros(1, device="cuda" if cuda else "cpu")
    best = float("inf")
    for r in range(rounds + 1):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1)
        t1 = time.perf_counter()
        if r:
            best = min(best, (t1 - t0) / n * 1e6)
    if cuda:
        torch.cuda.synchronize()
    return best


@dataclass
class HostLoad:
    seconds: float
    cores: int
    other_cores: float | None   # CPU time of every other process over the window, in cores
    steal_cores: float | None   # taken by the hypervisor
    own_cores: float | None     # this process, all its threads
    launch_us_before: float | None
    launch_us_after: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def disturbed(load: dict[str, Any] | None) -> str | None:
    """Why a comparison timed under `load` (a HostLoad's dict) may not stand, or None where nothing says so."""
    if not load:
        return None
    why = []
    if (load.get("other_cores") or 0) > OTHER_CORES:
        why.append(f"other processes used {load['other_cores']:.1f} of {load.get('cores', '?')} cores")
    if (load.get("steal_cores") or 0) > STEAL_CORES:
        why.append(f"the hypervisor took {load['steal_cores']:.2f} cores (steal)")
    return "; ".join(why) or None


def describe(load: dict[str, Any] | None) -> str:
    """One line for a report: what the host did while the comparison was timed."""
    if not load:
        return "not recorded"
    parts = []
    if load.get("other_cores") is not None:
        parts.append(f"other processes {load['other_cores']:.2f} cores, steal {load['steal_cores']:.2f}, "
                     f"this process {load['own_cores']:.2f} (of {load['cores']}) over {load['seconds']:.1f} s")
    a, b = load.get("launch_us_before"), load.get("launch_us_after")
    if a is not None and b is not None:
        parts.append(f"{a:.2f} → {b:.2f} µs to issue a tiny kernel")
    return "; ".join(parts) or "not recorded"


class HostWatch:
    """`with HostWatch() as w: <timed part>`, then `w.load` (a HostLoad). Sampling costs a few ms, outside
    the timed part; `pace=False` skips the tiny-kernel pace (the /proc figures alone)."""

    def __init__(self, pace: bool = True):
        self.pace = pace
        self.load: HostLoad | None = None

    def __enter__(self) -> HostWatch:
        self._before = launch_us() if self.pace else None
        self._t0, self._stat0, self._own0 = time.perf_counter(), _proc_stat(), _own_jiffies()
        return self

    def __exit__(self, *exc: Any) -> None:
        t1, stat1, own1 = time.perf_counter(), _proc_stat(), _own_jiffies()
        seconds = max(t1 - self._t0, 1e-9)
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        other = steal = own = None
        if self._stat0 and stat1 and self._own0 is not None and own1 is not None:
            own_j = own1 - self._own0
            own = own_j / hz / seconds
            # /proc/stat and /proc/self/stat tick separately: a process alone can read a little above or below
            other = max(0.0, (stat1[0] - self._stat0[0] - own_j) / hz / seconds)
            steal = (stat1[1] - self._stat0[1]) / hz / seconds
        after = launch_us() if self.pace else None
        self.load = HostLoad(seconds=seconds, cores=os.cpu_count() or 1, other_cores=other, steal_cores=steal,
                             own_cores=own, launch_us_before=self._before, launch_us_after=after)
