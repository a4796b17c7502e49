"""Compile candidate CUDA kernels (device code, `extern "C" __global__` entry points) to cubin + PTX.

    from engine.compile import Compiler, CompilePool, compile_nvrtc
    res = compile_nvrtc(src, arch="sm_90")              # in-process NVRTC (the default compiler)
    res.ok, res.cubin, res.ptx, res.kernels, res.summary()
    cc = Compiler(workspace / "cache" / "compile", "nvrtc", arch="sm_90")
    res = cc.compile(src)                                # content-addressed cache; res.cached
    async with CompilePool() as pool:                    # worker processes, for asyncio callers
        res = await cc.compile_async(src, pool=pool)

Bottom-up: diagnostics, headers < nvrtc, nvcc < toolchain (`compile_source`, one compile by compiler name)
< cache (`Compiler`) and pool (`CompilePool`), which know nothing of each other: `compile_async` takes any
object with the pool's `compile` coroutine (`CompileRunner`).
The arch is always the caller's ('sm_90' on an H200, 'sm_121' on a GB10): nothing here needs a GPU.
Importing this package loads neither NVRTC nor torch.
"""

from engine.compile.cache import CacheStats, Compiler, CompileRunner, cache_key, default_cache_dir
from engine.compile.diagnostics import CompileResult, CompilerUnavailable, Diagnostic, parse_log, summarize
from engine.compile.headers import HeaderSet, find_headers
from engine.compile.nvcc import compile_nvcc, find_nvcc
from engine.compile.nvrtc import (
    arch_of_current_device,
    compile_nvrtc,
    entry_points,
    normalize_arch,
    nvrtc_headers,
    nvrtc_version,
)
from engine.compile.pool import CompilePool
from engine.compile.toolchain import CompilerName, compile_source

__all__ = [
    "CacheStats", "CompilePool", "CompileResult", "CompileRunner", "Compiler", "CompilerName", "CompilerUnavailable",
    "Diagnostic", "HeaderSet",
    "arch_of_current_device", "cache_key", "compile_nvcc", "compile_nvrtc", "compile_source",
    "default_cache_dir", "entry_points", "find_headers", "find_nvcc", "normalize_arch", "nvrtc_headers",
    "nvrtc_version", "parse_log", "summarize",
]
