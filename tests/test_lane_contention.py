"""The lane's busy-stream runs (engine/lane/worker.py): the contention blocks start just before the candidate's
kernels, after its outputs and workspaces are filled. They spin ~30 µs; started when the run began, they were
gone before a large card's candidate launched (filling 100 MB of outputs takes longer), so its 'busy' runs
met an idle GPU. Stand-ins for the streams and the spinning kernel: no GPU needed."""

import torch

from engine.lane.worker import Worker


class _Stream:
    def __init__(self, log, name):
        self.log, self.name, self.cuda_stream = log, name, 0

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits for {other.name}")


def _worker(log, monkeypatch):
    w = object.__new__(Worker)
    w.device = torch.device("cpu")
    w._contended = w._hog_running = False
    w._side = _Stream(log, "side")
    main = _Stream(log, "main")

    class Hog:
        def launch(self, stream):
            log.append("contention blocks")

    w._hog = Hog()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    return w


def test_contention_starts_after_the_outputs_are_filled_and_before_the_kernels(monkeypatch):
    log: list[str] = []
    w = _worker(log, monkeypatch)

    def prepare():
        log.append("fill outputs")
        return lambda: log.append("candidate kernels")

    with w._contend():
        w._launch_beside(prepare())
    assert log == ["fill outputs", "side waits for main", "contention blocks", "candidate kernels",
                   "main waits for side"]


def test_no_contention_outside_the_busy_runs(monkeypatch):
    log: list[str] = []
    w = _worker(log, monkeypatch)
    w._launch_beside(lambda: log.append("candidate kernels"))
    with w._contend():
        pass   # a run that raised before launching: nothing started, nothing to wait for
    assert log == ["candidate kernels"]
