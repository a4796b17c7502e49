"""Content-addressed compile cache: an in-memory LRU in front of `<workspace>/cache/compile/<key>.*`.

The key is the sha256 of (source, arch, compiler, options, file name, compiler version); the version string
includes the NVRTC/nvcc release and, for NVRTC, the header set, so a toolkit upgrade never serves stale
cubins. An entry is `<key>.cubin`, `<key>.ptx` and `<key>.json` (metadata, written last: it is the commit
marker, and records the sha256 of the other two so that a truncated or corrupt entry is detected and
recompiled). Failed compiles are cached too (an LLM often resubmits the same broken source), except
failures caused by the environment (timeout, crashed worker).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from engine.compile.diagnostics import CompileResult, Diagnostic, is_transient
from engine.compile.nvrtc import normalize_arch
from engine.compile.toolchain import COMPILERS, CompilerName, compile_source, compiler_version

_FORMAT = 2  # 2: modules with module-scope globals or clock reads are refused (forbidden_state)


class CompileRunner(Protocol):
    """Where a cache miss is compiled off the event loop: `engine.compile.pool.CompilePool` is one."""

    async def compile(self, source: str, *, arch: str, compiler: CompilerName = "nvrtc",
                      options: Sequence[str] = (), name: str = "candidate.cu") -> CompileResult: ...


def cache_key(source: str, *, arch: str, compiler: str, options: Sequence[str], version: str,
              name: str = "candidate.cu") -> str:
    """sha256 hex over everything that determines the compiler's output."""
    blob = json.dumps({"source": source, "arch": arch, "compiler": compiler, "options": list(options),
                       "version": version, "name": name, "format": _FORMAT}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def default_cache_dir(workspace: Path) -> Path:
    """`<workspace>/cache/compile`."""
    return Path(workspace) / "cache" / "compile"


@dataclass
class CacheStats:
    """Counters; `compiles` counts real compiler invocations."""

    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    compiles: int = 0
    corrupt: int = 0


def _atomic_write(path: Path, data: bytes) -> None:
    """Write to a temp file in the same dir, then rename over `path`: readers never see half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class DiskCache:
    """The on-disk half: `<dir>/<key>.cubin|.ptx|.json`."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError:  # a read-only workspace (export reads one): every load misses, every store is skipped
            pass

    def load(self, key: str) -> CompileResult | None:
        """The stored result, or None when absent or damaged in any way."""
        try:
            text = (self.dir / f"{key}.json").read_text()
        except FileNotFoundError:
            return None  # a plain miss; anything wrong past this point is a damaged entry
        except OSError:
            raise _Corrupt(key) from None
        try:
            meta = json.loads(text)
            if meta.get("format") != _FORMAT:
                return None
            cubin = self._blob(key, "cubin", meta.get("cubin_sha256"))
            ptx_bytes = self._blob(key, "ptx", meta.get("ptx_sha256"))
            return CompileResult(
                ok=bool(meta["ok"]), cubin=cubin, ptx=ptx_bytes.decode() if ptx_bytes is not None else None,
                log=meta["log"], diagnostics=tuple(Diagnostic(**d) for d in meta["diagnostics"]),
                arch=meta["arch"], compiler=meta["compiler"], seconds=float(meta["seconds"]),
                source_hash=meta["source_hash"], kernels=tuple(meta["kernels"]),
                options=tuple(meta.get("options", ())), cached=True)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, _Corrupt):
            raise _Corrupt(key) from None

    def _blob(self, key: str, ext: str, digest: str | None) -> bytes | None:
        if digest is None:
            return None
        data = (self.dir / f"{key}.{ext}").read_bytes()
        if hashlib.sha256(data).hexdigest() != digest:
            raise _Corrupt(key)
        return data

    def store(self, key: str, result: CompileResult) -> None:
        """Write the blobs first and the json last (the json is what makes an entry exist)."""
        meta = {
            "format": _FORMAT, "ok": result.ok, "log": result.log,
            "diagnostics": [dataclasses.asdict(d) for d in result.diagnostics],
            "arch": result.arch, "compiler": result.compiler, "seconds": result.seconds,
            "source_hash": result.source_hash, "kernels": list(result.kernels), "options": list(result.options),
            "cubin_sha256": None, "ptx_sha256": None,
        }
        if result.cubin is not None:
            _atomic_write(self.dir / f"{key}.cubin", result.cubin)
            meta["cubin_sha256"] = hashlib.sha256(result.cubin).hexdigest()
        if result.ptx is not None:
            data = result.ptx.encode()
            _atomic_write(self.dir / f"{key}.ptx", data)
            meta["ptx_sha256"] = hashlib.sha256(data).hexdigest()
        _atomic_write(self.dir / f"{key}.json", json.dumps(meta).encode())

    def remove(self, key: str) -> None:
        """Drop an entry (used for a corrupt one before it is rewritten)."""
        for ext in ("json", "cubin", "ptx"):
            try:
                (self.dir / f"{key}.{ext}").unlink()
            except OSError:
                pass


class _Corrupt(Exception):
    pass


class Compiler:
    """A compiler for one (compiler, arch) with a cache: `Compiler(ws / "cache/compile", "nvrtc", arch="sm_90")`."""

    def __init__(self, cache_dir: Path | None = None, compiler: CompilerName = "nvrtc", *, arch: str,
                 name: str = "candidate.cu", memory_entries: int = 256) -> None:
        if compiler not in COMPILERS:
            raise ValueError(f"unknown compiler {compiler!r} (expected 'nvrtc' or 'nvcc')")
        self.compiler: CompilerName = compiler
        self.arch = normalize_arch(arch)
        self.name = name
        self.disk = DiskCache(cache_dir) if cache_dir is not None else None
        self.memory_entries = memory_entries
        self.stats = CacheStats()
        self._memory: OrderedDict[str, CompileResult] = OrderedDict()
        self._lock = threading.Lock()
        self._version: str | None = None

    @property
    def version(self) -> str:
        """The compiler version string in this cache's keys (loads the compiler once)."""
        if self._version is None:
            self._version = compiler_version(self.compiler)
        return self._version

    def key(self, source: str, options: Sequence[str] = ()) -> str:
        """The cache key of `source` compiled with `options`."""
        return cache_key(source, arch=self.arch, compiler=self.compiler, options=options, version=self.version,
                         name=self.name)

    def lookup(self, source: str, options: Sequence[str] = ()) -> CompileResult | None:
        """A cached result (memory, then disk), marked `cached=True`; None on a miss."""
        key = self.key(source, options)
        with self._lock:
            hit = self._memory.get(key)
            if hit is not None:
                self._memory.move_to_end(key)
                self.stats.memory_hits += 1
                return dataclasses.replace(hit, cached=True)
        if self.disk is not None:
            try:
                found = self.disk.load(key)
            except _Corrupt:
                self.stats.corrupt += 1
                self.disk.remove(key)
                found = None
            if found is not None:
                self.stats.disk_hits += 1
                self._remember(key, found)
                return found
        self.stats.misses += 1
        return None

    def store(self, source: str, options: Sequence[str], result: CompileResult) -> None:
        """Remember a fresh result (not transient failures)."""
        if is_transient(result.diagnostics):
            return
        key = self.key(source, options)
        self._remember(key, result)
        if self.disk is not None:
            try:
                self.disk.store(key, dataclasses.replace(result, cached=False))
            except OSError:
                pass  # a full or read-only disk costs a recompile later, not this result

    def _remember(self, key: str, result: CompileResult) -> None:
        with self._lock:
            self._memory[key] = dataclasses.replace(result, cached=False)
            self._memory.move_to_end(key)
            while len(self._memory) > self.memory_entries:
                self._memory.popitem(last=False)

    def compile(self, source: str, options: Sequence[str] = ()) -> CompileResult:
        """Compile through the cache (in this process)."""
        options = tuple(options)
        hit = self.lookup(source, options)
        if hit is not None:
            return hit
        self.stats.compiles += 1
        result = compile_source(source, arch=self.arch, compiler=self.compiler, name=self.name, options=options)
        self.store(source, options, result)
        return result

    async def compile_async(self, source: str, options: Sequence[str] = (),
                            pool: CompileRunner | None = None) -> CompileResult:
        """Compile through the cache; a miss goes to `pool` (a worker process), or a thread without one."""
        import asyncio

        options = tuple(options)
        hit = self.lookup(source, options)
        if hit is not None:
            return hit
        self.stats.compiles += 1
        if pool is not None:
            result = await pool.compile(source, arch=self.arch, compiler=self.compiler, options=options,
                                        name=self.name)
        else:
            result = await asyncio.to_thread(compile_source, source, arch=self.arch, compiler=self.compiler,
                                             name=self.name, options=options)
        self.store(source, options, result)
        return result
