"""The one-shot toolchain call: compile a source with NVRTC or nvcc, no cache, no pool.

Both the cache (`engine.compile.cache`) and the worker processes (`engine.compile.pool`) compile through
`compile_source`, so the one place that picks a compiler by name is here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import engine.compile.nvcc as _nvcc
import engine.compile.nvrtc as _nvrtc
from engine.compile.diagnostics import CompileResult

CompilerName = Literal["nvrtc", "nvcc"]
COMPILERS: tuple[CompilerName, ...] = ("nvrtc", "nvcc")


def compile_source(source: str, *, arch: str, compiler: CompilerName = "nvrtc", name: str = "candidate.cu",
                   options: Sequence[str] = (), want_ptx: bool = True, contract: bool = True) -> CompileResult:
    """Compile with the named compiler (no cache). Looked up at call time so tests can monkeypatch. `contract`
    False: not held to the candidate contract (`forbidden_state`): the engine's and probes' own kernels only."""
    kw = {} if contract else {"contract": False}
    if compiler == "nvrtc":
        return _nvrtc.compile_nvrtc(source, arch=arch, name=name, options=options, want_ptx=want_ptx, **kw)
    if compiler == "nvcc":
        return _nvcc.compile_nvcc(source, arch=arch, name=name, options=options, want_ptx=want_ptx, **kw)
    raise ValueError(f"unknown compiler {compiler!r} (expected 'nvrtc' or 'nvcc')")


def compiler_version(compiler: CompilerName) -> str:
    """The version string that goes into cache keys."""
    return _nvrtc.compiler_version() if compiler == "nvrtc" else _nvcc.compiler_version()
