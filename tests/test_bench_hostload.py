"""engine.bench.hostload: what else the host did while a comparison was timed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from engine.bench.hostload import HostWatch, describe, disturbed

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

BUSY = "import time\nt = time.perf_counter()\nwhile time.perf_counter() - t < {s}: pass\n"


@linux
def test_another_process_busy_while_timed_is_named():
    with HostWatch() as w:
        p = subprocess.Popen([sys.executable, "-c", BUSY.format(s=1.0)])
        p.wait()  # a child of ours counts as other work: it is not the forward being timed
    load = w.load.as_dict()
    assert load["other_cores"] >= 0.6, load
    assert "other processes used" in disturbed(load)
    assert describe(load).startswith("other processes ")


@linux
def test_a_busy_thread_of_ours_is_this_processes_time():
    stop = time.perf_counter() + 0.8
    spent = []

    def spin():
        t0 = time.thread_time()
        while time.perf_counter() < stop:
            pass
        spent.append(time.thread_time() - t0)

    with HostWatch(pace=False) as w:
        t = threading.Thread(target=spin)
        t.start()
        t.join()
    # the CPU the thread got (less than a core on a loaded machine) is counted as ours, to the clock tick
    assert w.load.own_cores * w.load.seconds >= 0.8 * spent[0] - 0.03, (w.load, spent)
    assert w.load.launch_us_before is None


def test_nothing_recorded_says_so_and_judges_nothing():
    assert describe(None) == "not recorded" and disturbed(None) is None
    quiet = {"seconds": 2.0, "cores": 16, "other_cores": 0.1, "steal_cores": 0.0, "own_cores": 1.0,
             "launch_us_before": 7.9, "launch_us_after": 8.1}
    assert disturbed(quiet) is None
    assert describe(quiet) == ("other processes 0.10 cores, steal 0.00, this process 1.00 (of 16) over 2.0 s; "
                               "7.90 → 8.10 µs to issue a tiny kernel")
    assert disturbed(quiet | {"steal_cores": 0.4}) == "the hypervisor took 0.40 cores (steal)"
