"""Compile a CUDA source to cubin + PTX in-process with NVRTC (`cuda.bindings.nvrtc`).

One `--gpu-architecture=sm_XX` compile yields both the cubin and the PTX (NVRTC 13's nvrtcGetPTX works
for a real arch), so there is no second `compute_XX` compile (a PTX-only compile alone costs ~60% of a
full one). Measured, one-kernel candidate, NVRTC 13.0: H200 box 6-7 ms median (fp32/fp16; ~20 ms for
a process's first compile), 2-core dev VM 30-55 ms. Anything including CCCL (cub, cuda/std) costs
~1.1-1.8 s; NVRTC's automatic precompiled headers (`-pch`, on by default here) bring later compiles in
the same process with the same leading #includes to ~0.2 s, one reason the compile pool keeps
long-lived worker processes.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from engine.compile.diagnostics import (
    CompileResult,
    CompilerUnavailable,
    Diagnostic,
    failure,
    forbidden_state,
    parse_log,
)
from engine.compile.headers import HeaderSet, bundled_headers_dir, find_headers, nvrtc_shims

INSTALL_HINT = "pip install cuda-python 'nvidia-cuda-nvrtc>=13.0' (or install a CUDA toolkit)"

_ARCH_RE = re.compile(r"^(sm|compute)_(\d{2,3})([af]?)$")
_ENTRY_RE = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)*\.entry\s+([A-Za-z_$][\w$]*)\s*\(", re.M)

# Defaults, and why:
#  -std=c++17     what cub/libcu++ and most kernel code expect; NVRTC 13's default is C++17 too, but be explicit.
#  -lineinfo      cheap (<5% compile time), lets profilers and our ptxas-error mapping (.loc) see source lines.
#  no -default-device: nvcc has no such flag, and a source must mean the same to both compilers (the lane
#                 can fall back to nvcc); "calling a __host__ function" errors are easy for the LLM to fix.
#  -pch           automatic precompiled headers: a big win for repeated CCCL includes (see module doc).
DEFAULT_OPTIONS: tuple[str, ...] = ("-std=c++17", "-lineinfo")


def normalize_arch(arch: str | int | tuple[int, int]) -> str:
    """'sm_90', 'sm_90a', 'compute_90', '90', '9.0', 90 or (9, 0) -> canonical 'sm_90' style string."""
    if isinstance(arch, tuple):
        return f"sm_{arch[0]}{arch[1]}"
    text = str(arch).strip().lower()
    if re.fullmatch(r"\d+\.\d+", text):
        major, minor = text.split(".")
        return f"sm_{major}{minor}"
    if re.fullmatch(r"\d{2,3}[af]?", text):
        return f"sm_{text}"
    text = text.replace("sm", "sm_", 1) if re.fullmatch(r"sm\d{2,3}[af]?", text) else text
    if not _ARCH_RE.match(text):
        raise ValueError(f"not a CUDA architecture: {arch!r} (expected e.g. 'sm_90', 'sm_90a', 'sm_121')")
    return text


def arch_of_current_device(device: int | None = None) -> str:
    """'sm_XY' of the current (or given) CUDA device, via torch. Compiling never needs this."""
    import torch  # deferred: the compiler itself never needs torch or a GPU

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: pass arch= explicitly (e.g. 'sm_90')")
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def source_hash(source: str) -> str:
    """sha256 hex of the source text."""
    return hashlib.sha256(source.encode()).hexdigest()


def entry_points(ptx: str | None = None, cubin: bytes | None = None) -> tuple[str, ...]:
    """extern "C" __global__ entry points: `.entry` names in the PTX, else CUDA-entry symbols of the cubin.

    Mangled names (`_Z...`: a C++-linkage or template kernel) are left out: the engine launches kernels
    by name through cuModuleGetFunction, which needs extern "C".
    """
    if ptx:
        names = _ENTRY_RE.findall(ptx)
    elif cubin:
        names = _elf_entries(cubin)
    else:
        return ()
    return tuple(dict.fromkeys(n for n in names if not n.startswith("_Z")))


def mangled_entry_points(ptx: str | None) -> tuple[str, ...]:
    """Entry points with C++ (mangled) names, which the engine cannot launch by name."""
    return tuple(n for n in _ENTRY_RE.findall(ptx or "") if n.startswith("_Z"))


def _elf_entries(cubin: bytes) -> list[str]:
    """Names of FUNC symbols flagged STO_CUDA_ENTRY (st_other 0x10) in a 64-bit little-endian CUDA ELF."""
    import struct

    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        return []
    try:
        e_shoff, = struct.unpack_from("<Q", cubin, 0x28)
        e_shentsize, e_shnum = struct.unpack_from("<HH", cubin, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, e_shoff + i * e_shentsize) for i in range(e_shnum)]
        names: list[str] = []
        for sh in sections:
            if sh[1] != 2:  # SHT_SYMTAB
                continue
            strtab = sections[sh[6]]
            off, size, entsize = sh[4], sh[5], sh[9] or 24
            for i in range(size // entsize):
                st_name, st_info, st_other = struct.unpack_from("<IBB", cubin, off + i * entsize)
                if st_info & 0xF == 2 and st_other & 0x10:  # STT_FUNC, STO_CUDA_ENTRY
                    start = strtab[4] + st_name
                    names.append(cubin[start:cubin.index(b"\0", start)].decode())
        return names
    except (struct.error, IndexError, ValueError):
        return []


_lock = threading.Lock()
_module: Any = None


def _load_nvrtc() -> Any:
    """Import cuda.bindings.nvrtc and make sure libnvrtc loads (the bindings load it lazily)."""
    from cuda.bindings import nvrtc

    nvrtc.nvrtcVersion()
    return nvrtc


def nvrtc_module() -> Any:
    """The loaded `cuda.bindings.nvrtc` module, or CompilerUnavailable naming what to install."""
    global _module
    if _module is None:
        with _lock:
            if _module is None:
                try:
                    _module = _load_nvrtc()
                except Exception as e:  # ImportError, or the dlopen failure the bindings raise
                    raise CompilerUnavailable(f"NVRTC is not available ({type(e).__name__}: {e}); "
                                              f"{INSTALL_HINT}") from e
    return _module


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the loaded libnvrtc."""
    nvrtc = nvrtc_module()
    _, major, minor = nvrtc.nvrtcVersion()
    return int(major), int(minor)


def supported_archs() -> tuple[int, ...]:
    """Real architectures this libnvrtc can target, e.g. (75, 80, ..., 90, 100, 120, 121)."""
    nvrtc = nvrtc_module()
    _, archs = nvrtc.nvrtcGetSupportedArchs()
    return tuple(int(a) for a in archs)


@lru_cache(maxsize=1)
def nvrtc_headers() -> HeaderSet:
    """The include dirs for this NVRTC; falls back to NVRTC's own bundled headers where it has them."""
    version = nvrtc_version()
    headers = find_headers(version)
    if headers.runtime_dir is None or headers.cccl_dir is None:
        bundled = bundled_headers_dir(nvrtc_module(), version)
        if bundled is not None:
            headers = find_headers(version, (bundled,))
    return headers


def compiler_version() -> str:
    """What goes into cache keys: NVRTC version plus the header set it compiles against."""
    major, minor = nvrtc_version()
    return f"nvrtc-{major}.{minor}+{nvrtc_headers().fingerprint()}"


def _check(nvrtc: Any, res: Any, what: str) -> Any:
    """Unwrap a cuda.bindings `(status, *values)` tuple, raising on a non-success status."""
    status, *values = res if isinstance(res, tuple) else (res,)
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(status)
        raise RuntimeError(f"{what}: {msg.decode() if isinstance(msg, bytes) else msg}")
    return values[0] if len(values) == 1 else values


def _get_bytes(nvrtc: Any, prog: Any, size_fn: str, get_fn: str) -> bytes | None:
    status, size = getattr(nvrtc, size_fn)(prog)
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return None
    buf = b" " * size
    (status,) = getattr(nvrtc, get_fn)(prog, buf)
    return buf if status == nvrtc.nvrtcResult.NVRTC_SUCCESS else None


def build_options(arch: str, options: Sequence[str] = (), *, pch: bool = True,
                  headers: HeaderSet | None = None) -> list[str]:
    """The full NVRTC option list: defaults, arch, include paths, then the caller's options (which win)."""
    opts = list(DEFAULT_OPTIONS)
    opts.append(f"--gpu-architecture={arch}")
    if pch:
        # Without these, logs gain "creating/using precompiled header" lines, and warnings #629-D/#630-D
        # ("options / initial directives do not match the precompiled header") whenever a PCH is not reused.
        opts += ["-pch", "--pch-messages=false", "--diag-suppress=629,630"]
    opts += (headers or nvrtc_headers()).options()
    opts += list(options)
    return opts


def compile_nvrtc(source: str, *, arch: str, name: str = "candidate.cu", options: Sequence[str] = (),
                  want_ptx: bool = True, pch: bool = True, contract: bool = True) -> CompileResult:
    """Compile `source` for `arch` ('sm_90': cubin + PTX; 'compute_90': PTX only) with NVRTC. `contract`: hold
    the module to the candidate contract (`forbidden_state`); off only for the engine's own kernels (the lane's
    contention kernels read the clock)."""
    arch = normalize_arch(arch)
    nvrtc = nvrtc_module()
    headers = nvrtc_headers()
    shims = nvrtc_shims(headers)
    opts = build_options(arch, options, pch=pch, headers=headers)
    started = time.perf_counter()
    prog = _check(nvrtc, nvrtc.nvrtcCreateProgram(
        source.encode(), name.encode(), len(shims),
        [text.encode() for _, text in shims], [inc.encode() for inc, _ in shims]), "nvrtcCreateProgram")
    try:
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        log_bytes = _get_bytes(nvrtc, prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog") or b""
        log = log_bytes.rstrip(b"\0").decode(errors="replace")
        ok = status == nvrtc.nvrtcResult.NVRTC_SUCCESS
        real = arch.startswith("sm_")
        cubin = _get_bytes(nvrtc, prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN") if ok and real else None
        # The PTX is also fetched after a failed compile: a ptxas error (bad inline asm) is reported at a
        # PTX line, mapped back to the source through the PTX's .loc directives.
        ptx_bytes = _get_bytes(nvrtc, prog, "nvrtcGetPTXSize", "nvrtcGetPTX")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    ptx = ptx_bytes.rstrip(b"\0").decode(errors="replace") if ptx_bytes else None
    if ok and want_ptx and ptx is None and real:
        # Older NVRTC gives no PTX for a real arch: compile again for the virtual one.
        extra = compile_nvrtc(source, arch=arch.replace("sm_", "compute_", 1), name=name, options=options,
                              want_ptx=True, pch=pch, contract=contract)
        ptx = extra.ptx
    diags = list(parse_log(log, source_name=name, ptx=ptx))
    if status == nvrtc.nvrtcResult.NVRTC_ERROR_CANCELLED:
        diags.append(failure("nvrtc", "compilation cancelled", "timeout"))
    elif not ok and not any(d.severity == "error" for d in diags):
        _, msg = nvrtc.nvrtcGetErrorString(status)
        text = msg.decode() if isinstance(msg, bytes) else str(msg)
        # A bad option is the caller's (deterministic) mistake; anything else is NVRTC's own trouble.
        code = "invalid-option" if status == nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_OPTION else "internal"
        diags.append(failure("nvrtc", f"{text}: {log.strip()[:500]}".rstrip(": "), code))
    if ok and real and cubin is None:
        ok = False
        diags.append(failure("nvrtc", "NVRTC produced no cubin", "internal"))
    if ok and contract and (refused := forbidden_state(ptx, "nvrtc")):
        ok, cubin = False, None
        diags += refused
    kernels = entry_points(ptx, cubin) if ok else ()
    if ok:
        diags += linkage_remarks(ptx, name, kernels)
    seconds = time.perf_counter() - started
    return CompileResult(ok=ok, cubin=cubin, ptx=ptx if want_ptx or not real else None, log=log,
                         diagnostics=tuple(diags), arch=arch, compiler="nvrtc", seconds=seconds,
                         source_hash=source_hash(source), kernels=kernels, options=tuple(opts))


def linkage_remarks(ptx: str | None, name: str, kernels: Sequence[str] = ("?",)) -> list[Diagnostic]:
    """Remarks for __global__ functions the engine cannot launch because their names are mangled, and a
    warning when nothing is launchable at all (the engine looks kernels up by their extern "C" name)."""
    out = [Diagnostic(file=name, line=None, column=None, severity="remark", code="not-extern-c",
                      message=f"kernel {m} has C++ linkage; declare it extern \"C\" to launch it by name")
           for m in mangled_entry_points(ptx)]
    if not kernels:
        out.append(Diagnostic(file=name, line=None, column=None, severity="warning", code="no-kernel",
                              message='no extern "C" __global__ function: nothing can be launched'))
    return out
