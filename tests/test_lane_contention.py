"""The lane's busy-stream runs (engine/lane/worker.py): the contention blocks start just before the candidate's
kernels, after its outputs and workspaces are filled (blocks started when the run began were gone before a large
card's candidate launched), a gate on the candidate's stream waits for them, and a release after its kernels lets
them go. Stand-ins for the streams, and the kernels' effects emulated on host memory: no GPU needed. Whether two
streams really run side by side is measured on the GPU (docs/results/reproduce-h200/2026-12-05d)."""

import ctypes
import re

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
        compiled = compile_nvrtc(_HOG_SOURCE, arch=arch, name="kf_hog.cu", want_ptx=False, pch=False,
                                 contract=False)
        assert compiled.ok and compiled.cubin, (arch, compiled.summary())
    # held to the candidates' contract it would not compile (it reads the clock): the worker says contract=False
    assert not compile_nvrtc(_HOG_SOURCE, arch="sm_90", name="kf_hog.cu", want_ptx=False, pch=False).ok
    import inspect

    from engine.lane import worker
    assert "contract=False" in inspect.getsource(worker._Hog.__init__)


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


def test_a_contention_kernel_that_does_not_build_costs_the_blocks_not_the_worker(monkeypatch, capsys):
    """The blocks are built by NVRTC at the worker's start; a failure there (a new arch, a broken NVRTC) must leave a
    worker that verifies without them and says so, not a lane that cannot start."""
    from types import SimpleNamespace

    from engine.lane import worker as W

    w = object.__new__(Worker)
    w.device, w.arch = torch.device("cpu"), "sm_999"
    w.props = SimpleNamespace(multi_processor_count=4, max_threads_per_multi_processor=2048)
    w._peak = SimpleNamespace(clock_hz=1e9)
    monkeypatch.setattr(W, "compile_nvrtc", lambda *a, **k: SimpleNamespace(ok=False, cubin=b"", summary=lambda: "x"))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "main")
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: "plain stream")
    hog, side, ok = w._start_contention()
    assert (hog, side, ok) == (None, "plain stream", False)
    assert "busy-stream runs without contention blocks: the contention kernel does not compile" in capsys.readouterr().err


def test_the_lanes_line_says_where_no_stream_ran_beside_the_candidates():
    from engine.run.command import _contention_note

    assert _contention_note({"contention": True}) == "" and _contention_note({}) == ""
    assert "busy runs spread its blocks one per SM instead" in _contention_note({"contention": False})


# ---- the contention kernels' arguments and the start-up overlap check, on an emulated device -----------------

_CTYPES = {"long long": ctypes.c_int64, "unsigned int": ctypes.c_uint32, "unsigned long long": ctypes.c_uint64}


def _signatures() -> dict[str, list[tuple[str, str]]]:
    """Each kernel's parameters in _HOG_SOURCE: (name, C type; 'ptr' for a pointer)."""
    from engine.lane.worker import _HOG_SOURCE

    sigs = {}
    for kernel, params in re.findall(r"__global__ void (\w+)\(([^)]*)\)", _HOG_SOURCE):
        out = []
        for p in params.split(","):
            words = p.replace("*", " * ").replace("const", " ").split()
            out.append((words[-1], "ptr" if "*" in words else " ".join(words[:-1])))
        sigs[kernel] = out
    return sigs


class _Device:
    """cuLaunchKernel on host memory: decodes each launch's argument array by the kernel's signature in the source
    and runs the kernel's effect. `overlapping`: the hog spins until synchronize (work on other streams runs
    meanwhile); else it runs to its end before the next launch, as two streams that take turns."""

    def __init__(self, hog, overlapping: bool, behind: bool = False):
        self.hog, self.overlapping, self.spinning, self.launches = hog, overlapping, [], []
        self.behind = behind  # the hog starts only once the main stream's work (gate, release) is done
        self.sigs = _signatures()

    def args(self, kernel: str, params_address: int) -> dict[str, int]:
        sig = self.sig_checked(kernel, params_address)
        slots = (ctypes.c_void_p * len(sig)).from_address(params_address)
        return {name: (ctypes.c_void_p if kind == "ptr" else _CTYPES[kind]).from_address(slots[i]).value or 0
                for i, (name, kind) in enumerate(sig)}

    def sig_checked(self, kernel: str, params_address: int):
        """Each slot holds the address of the _Hog attribute named like the parameter, of the parameter's size."""
        sig = self.sigs[kernel]
        slots = (ctypes.c_void_p * len(sig)).from_address(params_address)
        by_address = {ctypes.addressof(v): (k, v) for k, v in vars(self.hog).items() if isinstance(v, ctypes._SimpleCData)}
        for i, (name, kind) in enumerate(sig):
            attr, value = by_address[slots[i]]
            assert attr == "_" + name, (kernel, i, attr, name)
            assert ctypes.sizeof(value) == ctypes.sizeof(ctypes.c_void_p if kind == "ptr" else _CTYPES[kind]), (kernel, name)
        return sig

    @staticmethod
    def u32(address: int) -> ctypes.c_uint32:
        return ctypes.c_uint32.from_address(address)

    def finish(self, a: dict[str, int], waited: bool = True) -> None:
        """The hog's end: released while it spun (`waited`: it had polled once before the release) or not."""
        freed = ctypes.c_int32(self.u32(a["released"]).value - a["gen"]).value >= 0 and waited
        self.u32(a["outcome"]).value = a["gen"] if freed else 0

    def launch(self, fn, grid, block, shared, stream, params_address, cooperative=False):
        a = self.args(fn, params_address)
        self.launches.append((fn, stream, grid[0], block[0]))
        if fn == "kf_hog":
            if self.behind:
                self.spinning.append(a)
                return
            self.u32(a["started"]).value += grid[0]
            if self.overlapping:
                self.spinning.append(a)
            else:
                self.finish(a)
        elif fn == "kf_hog_gate":
            assert self.behind or ctypes.c_int32(self.u32(a["started"]).value - a["want"]).value >= 0, \
                "the gate would time out"
            assert a["max_ns"] == 100_000
        elif fn == "kf_hog_release":
            self.u32(a["released"]).value = a["gen"]

    def synchronize(self, device=None):
        for a in self.spinning:
            if self.behind:  # it starts now, after the release: it finds it at its first look
                self.u32(a["started"]).value += 1
            self.finish(a, waited=not self.behind)
        self.spinning.clear()


def _emulated_hog(monkeypatch, overlapping: bool, threads_per_sm: int = 2048, behind: bool = False):
    from types import SimpleNamespace

    from engine.lane import worker as W

    class Module:
        def __init__(self, image):
            pass

        def function(self, name):
            return name

    monkeypatch.setattr(W, "compile_nvrtc", lambda *a, **k: SimpleNamespace(ok=True, cubin=b"x"))
    monkeypatch.setattr(W.drv, "Module", Module)
    hog = W._Hog("sm_90", 132, 1.98e9, torch.device("cpu"), threads_per_sm)
    dev = _Device(hog, overlapping, behind)
    monkeypatch.setattr(W.drv, "launch", dev.launch)
    monkeypatch.setattr(torch.cuda, "synchronize", dev.synchronize)
    return hog, dev


class _Plain:
    def __init__(self, handle):
        self.cuda_stream = handle

    def wait_stream(self, other):
        pass


def test_the_overlap_check_reads_a_release_seen_while_the_blocks_spin(monkeypatch):
    """`_Hog.overlaps`: the hog on the side stream, the gate and the release on the main one. Where the streams run
    side by side the hog sees the release (True); where they take turns it spins to its limit first (False). The
    arguments are decoded by the kernels' signatures in the source (names, sizes, order), so a packing that
    disagrees with a signature fails here, not on the GPU."""
    side, main = _Plain(7), _Plain(0)
    for overlapping in (True, False):
        hog, dev = _emulated_hog(monkeypatch, overlapping)
        assert [hog.overlaps(side, main) for _ in range(3)] == [overlapping] * 3
        assert [(fn, s) for fn, s, _, _ in dev.launches[:3]] == [("kf_hog", 7), ("kf_hog_gate", 0),
                                                                 ("kf_hog_release", 0)]
        started, released, outcome = (v & 0xFFFFFFFF for v in hog.counters.tolist())
        assert started == hog.launched == sum(n for fn, _, n, _ in dev.launches if fn == "kf_hog")
        assert released == hog.gen == 3 and outcome == (3 if overlapping else 0)


def test_the_generations_wrap_without_reading_a_spin_to_the_limit_as_a_release(monkeypatch):
    """Generation 0 is the outcome of blocks that spun to their limit: after 2**32 - 1 launches the count goes on at
    1, and both counters wrap (compared by signed difference)."""
    side, main = _Plain(7), _Plain(0)
    for overlapping in (True, False):
        hog, dev = _emulated_hog(monkeypatch, overlapping)
        hog.gen, hog.launched = 0xFFFFFFFE, 0xFFFFFFF0  # and the counters' int32 views of them
        hog.counters[0], hog.counters[1] = 0xFFFFFFF0 - (1 << 32), 0xFFFFFFFE - (1 << 32)
        assert [hog.overlaps(side, main) for _ in range(3)] == [overlapping] * 3
        assert hog.gen == 2 and hog.launched == (0xFFFFFFF0 + sum(n for _, _, n, _ in dev.launches[::3])) & 0xFFFFFFFF


def test_two_contention_blocks_and_the_gate_fit_an_sm_of_any_size(monkeypatch):
    """Two blocks leave 64 threads of an SM: room for the gate's warp, none for a 96-thread block. An SM of 1,536
    threads (sm_86, sm_89, sm_120) took one block of 992, so the gate waited for blocks that could not be resident."""
    from engine.lane.worker import hog_threads

    for per_sm in (2048, 1536, 1024):
        t = hog_threads(per_sm)
        assert t % 32 == 0 and t <= 1024 and 2 * t + 32 <= per_sm < 2 * t + 96, per_sm
        hog, dev = _emulated_hog(monkeypatch, True, per_sm)
        hog.launch(7, 0)
        (fn, _, blocks, threads), = dev.launches[:1]
        assert threads == t and 132 <= blocks <= 2 * 132 and blocks % 2 == 0


def test_blocks_that_start_after_the_release_do_not_read_as_overlapping(monkeypatch):
    """Where the side stream waits for the main one (the gate times out, the release runs, then the hog starts), the
    hog finds the release at its first look: that is no overlap either, and must not read as one."""
    hog, dev = _emulated_hog(monkeypatch, overlapping=False, behind=True)
    assert hog.overlaps(_Plain(7), _Plain(0)) is False
