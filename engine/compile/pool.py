"""Compile in worker processes so compiles overlap GPU work and each other.

Processes, not threads, measured: NVRTC does release the GIL (a Python thread keeps running during
nvrtcCompileProgram), but it serializes compiles inside the library. On the H200 box (16 cores), 48
one-kernel fp16 compiles: sequential 1.76 s, 8 threads 1.30 s (x1.4), 8 spawn workers 0.20 s (x8.8);
8 cub compiles: sequential 11.3 s, 8 threads 14.3 s (x0.8), 8 workers 2.2 s (x5.1). Processes also give
what threads cannot: a runaway compile (huge unrolls, template blow-up) can be killed on timeout, an ICE
(a segfault in libnvrtc) costs one worker instead of the engine, and each worker keeps its own NVRTC
precompiled-header state warm (cub includes ~1.8 s -> ~0.2 s on later compiles).
The spawn context keeps CUDA state out of the workers (forking a process holding a CUDA context is
undefined behaviour); NVRTC never touches the GPU, so workers need no device.
"""

from __future__ import annotations

import asyncio
import glob
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from engine.compile.diagnostics import CompileResult, failure
from engine.compile.nvrtc import normalize_arch, nvrtc_headers, source_hash
from engine.compile.toolchain import CompilerName, compile_source

DEFAULT_TIMEOUT_S = 300.0


def default_workers() -> int:
    """Half the cores, 1..8: compiles are CPU-bound and the lane needs CPU for the GPU work too."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def _init_worker() -> None:
    """Load libnvrtc and find the headers once per worker, so the first real compile pays neither.

    Ctrl-C in a terminal reaches the whole process group: a worker ignores it (its parent stops the pool),
    so it prints no traceback of its own. A worker whose parent is gone (killed: SIGKILL, the OOM killer, a
    job scheduler) ends too (`_exit_with_parent`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent()
    try:
        nvrtc_headers()
    except Exception:  # noqa: BLE001 - an initializer failure breaks the whole pool; the compile will report it
        pass


def _exit_with_parent(period_s: float = 1.0) -> None:
    """End this worker once the process that started it is gone. A pool worker waits for its next task on a queue
    whose write end it holds itself, so its parent's death never reaches it: a `run` killed with SIGKILL left its
    workers (and multiprocessing's resource tracker, whose pipe they hold) running for good."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            threading.Event().wait(period_s)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="kforge-parent-watch", daemon=True).start()


def _work(source: str, arch: str, compiler: CompilerName, name: str, options: tuple[str, ...],
          want_ptx: bool) -> CompileResult:
    return compile_source(source, arch=arch, compiler=compiler, name=name, options=options, want_ptx=want_ptx)


class CompilePool:
    """A pool of compiler worker processes for asyncio callers: `await pool.compile(src, arch="sm_90")`."""

    def __init__(self, max_workers: int | None = None, *, timeout: float | None = DEFAULT_TIMEOUT_S) -> None:
        self.max_workers = max_workers or default_workers()
        self.timeout = timeout
        self._ctx = multiprocessing.get_context("spawn")
        self._executor: ProcessPoolExecutor | None = None
        self._generation = 0
        self._lock = threading.Lock()
        self._closed = False

    def _current(self) -> tuple[ProcessPoolExecutor, int]:
        with self._lock:
            if self._closed:
                raise RuntimeError("CompilePool is closed")
            if self._executor is None:  # started lazily: constructing a pool costs nothing
                self._executor = ProcessPoolExecutor(self.max_workers, mp_context=self._ctx,
                                                     initializer=_init_worker)
            return self._executor, self._generation

    def _restart(self, generation: int, *, kill: bool) -> None:
        """Replace the executor of `generation` (if nobody did yet); `kill` its workers first (timeout)."""
        with self._lock:
            if generation != self._generation or self._executor is None:
                return
            executor, self._executor = self._executor, None
            self._generation += 1
        pids: list[int] = []
        if kill:
            # ProcessPoolExecutor cannot cancel a running task; killing its workers is the only way to stop
            # a runaway compile. `_processes` is private but present in every CPython 3.x.
            for proc in list((getattr(executor, "_processes", None) or {}).values()):
                pids.append(proc.pid)
                proc.kill()
        # No cancel_futures: a cancelled future would surface as CancelledError in an innocent caller's
        # coroutine; left alone, the broken executor fails them with BrokenProcessPool, which compile()
        # retries on the new executor.
        executor.shutdown(wait=False)
        _sweep_pch_dirs(pids)

    def submit(self, source: str, *, arch: str, compiler: CompilerName = "nvrtc", options: Sequence[str] = (),
               name: str = "candidate.cu", want_ptx: bool = True) -> Future[CompileResult]:
        """Submit a compile; a concurrent.futures Future (no timeout handling: prefer `compile`)."""
        executor, _ = self._current()
        return executor.submit(_work, source, normalize_arch(arch), compiler, name, tuple(options), want_ptx)

    async def compile(self, source: str, *, arch: str, compiler: CompilerName = "nvrtc",
                      options: Sequence[str] = (), name: str = "candidate.cu", want_ptx: bool = True,
                      timeout: float | None = None) -> CompileResult:
        """Compile in a worker. A timeout or a crashed worker gives ok=False (code 'timeout' / 'crash')."""
        arch = normalize_arch(arch)
        timeout = self.timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        for _attempt in range(2):
            executor, generation = self._current()
            try:
                fut = loop.run_in_executor(executor, _work, source, arch, compiler, name, tuple(options), want_ptx)
            except BrokenProcessPool:
                self._restart(generation, kill=False)
                continue
            except RuntimeError:
                # "cannot schedule new futures after shutdown": another compile's timeout replaced the
                # executor between _current() and here; take the new one (close() makes _current raise).
                continue
            try:
                return await asyncio.wait_for(fut, timeout)
            except asyncio.TimeoutError:
                self._restart(generation, kill=True)
                return _failed(source, arch, compiler, f"compile timed out after {timeout:.3g} s", "timeout")
            except BrokenProcessPool:
                # A worker died: this compile's, or a sibling's, or the pool was killed for another's timeout.
                # Retry once on a fresh pool; a second death is blamed on this source.
                self._restart(generation, kill=False)
        return _failed(source, arch, compiler, "the compiler crashed (worker process died)", "crash")

    def close(self, grace_s: float = 5.0) -> None:
        """Stop the workers: queued compiles are cancelled, one still running after `grace_s` is killed."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is None:
            return
        procs = list((getattr(executor, "_processes", None) or {}).values())
        executor.shutdown(wait=False, cancel_futures=True)
        killed = []
        for proc in procs:
            proc.join(grace_s)
            if proc.is_alive():
                proc.kill()
                killed.append(proc.pid)
        _sweep_pch_dirs(killed)

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> CompilePool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)


def _failed(source: str, arch: str, compiler: str, message: str, code: str) -> CompileResult:
    return CompileResult(ok=False, cubin=None, ptx=None, log=message, diagnostics=(failure(compiler, message, code),),
                         arch=arch, compiler=compiler, seconds=0.0, source_hash=source_hash(source), kernels=())


def _sweep_pch_dirs(pids: list[int]) -> None:
    """Remove the automatic-PCH dirs NVRTC makes per process (it deletes them at a clean exit, not a kill)."""
    for pid in pids:
        for d in glob.glob(os.path.join(tempfile.gettempdir(), f"__nvrtc_auto_pch_{pid}_*")):
            shutil.rmtree(d, ignore_errors=True)
