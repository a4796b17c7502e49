"""Compile a CUDA source to cubin + PTX with the `nvcc` executable, in a throw-away temp dir.

One nvcc run gives both: `-cubin -keep` leaves the PTX it assembled in the keep dir (measured here:
~0.43 s for a one-kernel fp16 candidate, against ~0.95 s for separate `-cubin` and `-ptx` runs). nvcc
is several times slower than NVRTC (process start, host preprocessing), so it is the fallback and the
cross-check, not the default.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from engine.compile.diagnostics import CompileResult, CompilerUnavailable, failure, forbidden_state, parse_log
from engine.compile.nvrtc import entry_points, linkage_remarks, normalize_arch, source_hash

INSTALL_HINT = "install a CUDA toolkit (or `pip install nvidia-cuda-nvcc`) and put nvcc on PATH or set CUDA_HOME"
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_OPTIONS: tuple[str, ...] = ("-std=c++17", "-lineinfo")
# Where nvcc lives when it is on neither PATH nor $CUDA_HOME (a module constant so tests can empty it).
FALLBACK_NVCC: tuple[Path, ...] = (Path("/usr/local/cuda/bin/nvcc"), Path("/opt/cuda/bin/nvcc"))


def find_nvcc() -> Path:
    """The nvcc to use: $CUDA_HOME/$CUDA_PATH's, then PATH's, then /usr/local/cuda's."""
    cands: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        if os.environ.get(var):
            cands.append(Path(os.environ[var]) / "bin" / "nvcc")
    on_path = shutil.which("nvcc")
    if on_path:
        cands.append(Path(on_path))
    cands += FALLBACK_NVCC
    for c in cands:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise CompilerUnavailable(f"nvcc not found; {INSTALL_HINT}")


@lru_cache(maxsize=4)
def _version_of(nvcc: str) -> str:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CompilerUnavailable(f"cannot run {nvcc} ({e}); {INSTALL_HINT}") from e
    m = re.search(r"release [\d.]+, V([\d.]+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1] if out.strip() else "unknown"


def compiler_version() -> str:
    """'nvcc-13.0.88' style string for cache keys."""
    return f"nvcc-{_version_of(str(find_nvcc()))}"


def compile_nvcc(source: str, *, arch: str, name: str = "candidate.cu", options: Sequence[str] = (),
                 want_ptx: bool = True, timeout: float | None = DEFAULT_TIMEOUT_S, contract: bool = True) -> CompileResult:
    """Compile `source` for `arch` ('sm_90': cubin + PTX; 'compute_90': PTX only) with nvcc. `contract`: as for
    compile_nvrtc."""
    arch = normalize_arch(arch)
    nvcc = find_nvcc()
    name = Path(name).name or "candidate.cu"
    stem = Path(name).stem or "candidate"
    real = arch.startswith("sm_")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kforge-nvcc-") as tmp:
        tdir = Path(tmp)
        (tdir / name).write_text(source)
        keep = tdir / "keep"
        keep.mkdir()
        out = tdir / (f"{stem}.cubin" if real else f"{stem}.ptx")
        cmd = [str(nvcc), "-cubin" if real else "-ptx", f"-arch={arch}", *DEFAULT_OPTIONS]
        if real:
            # -keep costs little and keeps the PTX also when ptxas fails, to map its errors to source lines.
            cmd += ["-keep", f"-keep-dir={keep}"]
        # -x cu: compile as CUDA whatever the file is called.
        cmd += [*options, "-x", "cu", "-o", out.name, name]
        env = dict(os.environ, TMPDIR=str(tdir))  # nvcc's own temporaries die with the dir, even on a kill
        log, code, timed_out = _run(cmd, tdir, env, timeout)
        cubin = out.read_bytes() if real and code == 0 and out.is_file() else None
        ptx_path = out if not real else keep / f"{stem}.ptx"
        ptx = ptx_path.read_text(errors="replace") if ptx_path.is_file() else None
    ok = code == 0 and not timed_out and (cubin is not None or not real)
    diags = list(parse_log(log, source_name=name, ptx=ptx))
    if timed_out:
        diags.append(failure("nvcc", f"nvcc timed out after {timeout:.0f} s", "timeout"))
    elif not ok and not any(d.severity == "error" for d in diags):
        diags.append(failure("nvcc", f"nvcc exited with {code}: {log.strip()[-500:]}", "internal"))
    if ok and contract and (refused := forbidden_state(ptx, "nvcc")):
        ok, cubin = False, None
        diags += refused
    kernels = entry_points(ptx, cubin) if ok else ()
    if ok:
        diags += linkage_remarks(ptx, name, kernels)
    return CompileResult(ok=ok, cubin=cubin, ptx=ptx if want_ptx or not real else None, log=log,
                         diagnostics=tuple(diags), arch=arch, compiler="nvcc",
                         seconds=time.perf_counter() - started, source_hash=source_hash(source),
                         kernels=kernels, options=tuple(c for c in cmd[1:] if not c.startswith("-keep")))


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float | None) -> tuple[str, int, bool]:
    """Run nvcc; on timeout kill its whole process group (cicc/ptxas children included)."""
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as e:
        raise CompilerUnavailable(f"cannot run {cmd[0]} ({e}); {INSTALL_HINT}") from e
    try:
        out, _ = proc.communicate(timeout=timeout)
        return out.decode(errors="replace"), proc.returncode, False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
        return out.decode(errors="replace"), -9, True
