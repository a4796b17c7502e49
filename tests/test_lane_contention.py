"""The lane's busy-stream runs (engine/lane/worker.py): the contention blocks start just before the candidate's
kernels, after its outputs and workspaces are filled, and are released after them. They spin ~30 µs; started when the run began, they were
gone before a large card's candidate launched (filling 100 MB of outputs takes longer), so its 'busy' runs
met an idle GPU. Stand-ins for the streams and the spinning kernel: no GPU needed."""

import torch

from engine.lane.worker import Worker


class _Stream:
    def __init__(self, log, name):
        self.log, self.name, self.cuda_stream = log, name, object()

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits for {other.name}")


def _worker(log, monkeypatch):
    w = object.__new__(Worker)
    w.device = torch.device("cpu")
    w._contended = w._hog_running = False
    w.contention = True  # a side stream that runs beside the default one was found (Worker.__init__)
    w._side = _Stream(log, "side")
    main = _Stream(log, "main")

    class Hog:
        def launch(self, stream, gate_stream):
            log.append("contention blocks")
            log.append("gate on main" if gate_stream is main.cuda_stream else "gate elsewhere")

        def release(self, stream):
            log.append("release on main" if stream is main.cuda_stream else "release elsewhere")

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
    assert log == ["fill outputs", "side waits for main", "contention blocks", "gate on main", "candidate kernels",
                   "release on main", "main waits for side"]


def test_a_launch_that_raises_still_releases_the_contention_blocks(monkeypatch):
    """The blocks stay until released (2 ms at most): a candidate whose launch raised must not leave every later
    run waiting for them."""
    import pytest

    log: list[str] = []
    w = _worker(log, monkeypatch)

    def boom():
        raise RuntimeError("launch failed")

    with pytest.raises(RuntimeError, match="launch failed"), w._contend():
        w._launch_beside(boom)
    assert log == ["side waits for main", "contention blocks", "gate on main", "release on main",
                   "main waits for side"]


def test_no_contention_outside_the_busy_runs(monkeypatch):
    log: list[str] = []
    w = _worker(log, monkeypatch)
    w._launch_beside(lambda: log.append("candidate kernels"))
    with w._contend():
        pass   # a run that raised before launching: nothing started, nothing to wait for
    assert log == ["candidate kernels"]


def test_the_contention_kernels_compile_for_every_arch_we_serve():
    """The hog and its gate are NVRTC-compiled by every lane worker at start; a source that does not compile
    stops every verification. Compile-level only: whether the gate holds the candidate until the hog's blocks
    are resident is measured on the GPU (docs/results/reproduce-h200/2026-12-05d)."""
    from engine.compile import compile_nvrtc
    from engine.lane.worker import _HOG_SOURCE

    for arch in ("sm_80", "sm_90", "sm_100", "sm_121"):
        compiled = compile_nvrtc(_HOG_SOURCE, arch=arch, name="kf_hog.cu", want_ptx=False, pch=False)
        assert compiled.ok and compiled.cubin, (arch, compiled.summary())


def test_the_side_stream_is_one_seen_to_run_beside_the_default_stream():
    """On an H100 the contention blocks and the candidate took turns (their streams shared a hardware queue), so
    the worker tries new streams until one is seen to overlap, and says where none does."""
    from engine.lane.worker import pick_side_stream

    made = []

    def make():
        made.append(len(made))
        return made[-1]

    assert pick_side_stream(make, lambda s: s == 2) == (2, True) and made == [0, 1, 2]
    made.clear()
    assert pick_side_stream(make, lambda s: False, tries=4) == (3, False) and made == [0, 1, 2, 3]


def test_without_an_overlapping_stream_the_busy_runs_launch_no_blocks(monkeypatch):
    """Blocks that could only run before or after the candidate would hold nothing while it runs and cost each busy
    run their 2 ms limit: where no stream overlaps, the candidate runs alone."""
    log: list[str] = []
    w = _worker(log, monkeypatch)
    w.contention = False
    with w._contend():
        w._launch_beside(lambda: log.append("candidate kernels"))
    assert log == ["candidate kernels"]


def test_the_lanes_line_says_where_no_stream_ran_beside_the_candidates():
    from engine.run.command import _contention_note

    assert _contention_note({"contention": True}) == "" and _contention_note({}) == ""
    assert "races that need a busy GPU are not provoked" in _contention_note({"contention": False})
