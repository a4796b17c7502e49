"""Find the CUDA headers NVRTC needs, and the in-memory shims that make common includes work under NVRTC.

NVRTC ships no headers of its own (13.0): `cuda_fp16.h`, `cuda_bf16.h`, `cuda_fp8.h` come from the CUDA
runtime headers, and cub / libcu++ from CCCL. Both live in a toolkit (`<root>/include` and, from CUDA 13,
`<root>/include/cccl`) or in the nvidia pip wheels (`nvidia/cu13/include`, `nvidia/cuda_runtime/include`,
`nvidia/cuda_cccl/include`, ...). Search order: $CUDA_HOME / $CUDA_PATH / $CUDA_ROOT, the toolkit of the
`nvcc` on PATH, /usr/local/cuda and /usr/local/cuda-*, /opt/cuda, the pip wheels, cuda.pathfinder; among
those, a tree whose CUDA major version matches NVRTC's wins.

NVRTC has no C++ standard library and cannot compile host code, so two things LLM-written kernels do all
the time fail under NVRTC although they work with nvcc: `#include <cub/cub.cuh>` (its device-wide
algorithms are host code) and `#include <cstdint>` / `<type_traits>` / `<cmath>` .... `nvrtc_shims()` gives
small replacement headers that NVRTC takes from memory ahead of the include path: a cub umbrella of the
block/warp/thread-level headers only, and std headers forwarding to libcu++ (`cuda::std`).
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
import platform
import re
import shutil
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

_VERSION_RE = re.compile(r"#define\s+CUDA_VERSION\s+(\d+)")
_CCCL_RE = re.compile(r"#define\s+CCCL_VERSION\s+(\d+)")


@dataclass(frozen=True)
class HeaderSet:
    """Include directories for NVRTC (in -I order) and what was found."""

    include_dirs: tuple[Path, ...]
    runtime_dir: Path | None  # holds cuda_fp16.h, cuda_bf16.h, cuda_fp8.h
    cccl_dir: Path | None  # holds cub/ and cuda/std/
    cuda_version: tuple[int, int] | None
    cccl_version: int | None
    problems: tuple[str, ...] = ()

    def options(self) -> list[str]:
        """`--include-path=...` options for NVRTC."""
        return [f"--include-path={d}" for d in self.include_dirs]

    def fingerprint(self) -> str:
        """Identifies this header set in cache keys: paths plus versions (a toolkit upgrade changes it)."""
        text = repr((tuple(map(str, self.include_dirs)), self.cuda_version, self.cccl_version, _SHIM_VERSION))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _has_runtime(d: Path) -> bool:
    return (d / "cuda_fp16.h").is_file() and (d / "cuda_runtime.h").is_file()


def _has_cccl(d: Path) -> bool:
    return (d / "cub" / "cub.cuh").is_file() and (d / "cuda" / "std" / "type_traits").is_file()


def cuda_version_of(include_dir: Path) -> tuple[int, int] | None:
    """CUDA_VERSION from `cuda.h` (13000 -> (13, 0)), or from cuda_runtime_api.h's CUDART_VERSION."""
    for name, pat in (("cuda.h", _VERSION_RE), ("cuda_runtime_api.h", re.compile(r"#define\s+CUDART_VERSION\s+(\d+)"))):
        try:
            m = pat.search((include_dir / name).read_text(errors="replace"))
        except OSError:
            continue
        if m:
            v = int(m.group(1))
            return v // 1000, (v % 1000) // 10
    return None


def cccl_version_of(cccl_dir: Path) -> int | None:
    """CCCL_VERSION (e.g. 3000001) from libcu++'s version header."""
    for rel in ("cuda/std/__cccl/version.h", "cuda/version"):
        try:
            m = _CCCL_RE.search((cccl_dir / rel).read_text(errors="replace"))
        except OSError:
            continue
        if m:
            return int(m.group(1))
    return None


def _target_dir() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "x86_64-linux", "amd64": "x86_64-linux", "aarch64": "sbsa-linux",
            "arm64": "sbsa-linux"}.get(machine, f"{machine}-linux")


def _wheel_roots() -> list[Path]:
    """site-packages/nvidia/* folders of the nvidia pip wheels (a namespace package; nothing is imported)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


def candidate_include_dirs() -> list[tuple[str, Path]]:
    """(where-from, include dir) pairs in search order; only existing directories, no duplicates."""
    found: list[tuple[str, Path]] = []
    seen: set[Path] = set()

    def add(origin: str, d: Path) -> None:
        try:
            r = d.resolve()
        except OSError:
            return
        if r.is_dir() and r not in seen:
            seen.add(r)
            found.append((origin, r))

    def add_root(origin: str, root: Path) -> None:
        add(origin, root / "include")
        add(origin, root / "targets" / _target_dir() / "include")

    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        if os.environ.get(var):
            add_root(f"${var}", Path(os.environ[var]))
    nvcc = shutil.which("nvcc")
    if nvcc:
        # nvcc may be a symlink or a wrapper script; resolve() handles the former, the fixed paths below the latter.
        add_root("nvcc", Path(nvcc).resolve().parent.parent)
    add_root("/usr/local/cuda", Path("/usr/local/cuda"))
    for root in sorted(glob.glob("/usr/local/cuda-*"), key=_version_key, reverse=True):
        add_root(root, Path(root))
    add_root("/opt/cuda", Path("/opt/cuda"))
    for base in _wheel_roots():
        for sub in ("cu13", "cu12", "cuda_runtime", "cuda_nvrtc", "cuda_cccl"):
            add(f"wheel nvidia/{sub}", base / sub / "include")
    try:  # cuda.pathfinder (a cuda-bindings dependency) knows conda and other layouts too.
        from cuda import pathfinder  # type: ignore[attr-defined]

        for lib in ("cudart", "cccl"):
            try:
                d = pathfinder.find_nvidia_header_directory(lib)
            except Exception:  # noqa: BLE001 - any failure there just means "not found"
                d = None
            if d:
                add(f"cuda.pathfinder {lib}", Path(d))
    except ImportError:
        pass
    return found


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", path.rsplit("/", 1)[-1])) or (0,)


def find_headers(nvrtc_version: tuple[int, int] | None = None,
                 extra_dirs: tuple[Path, ...] = ()) -> HeaderSet:
    """Pick the runtime-header dir and the CCCL dir for NVRTC `nvrtc_version` (cached per arguments)."""
    return _find_headers(nvrtc_version, tuple(Path(d) for d in extra_dirs))


@lru_cache(maxsize=8)
def _find_headers(nvrtc_version: tuple[int, int] | None, extra_dirs: tuple[Path, ...]) -> HeaderSet:
    cands = [("extra", d) for d in extra_dirs] + candidate_include_dirs()
    runtime = [(origin, d) for origin, d in cands if _has_runtime(d)]

    def rank(item: tuple[int, tuple[str, Path]]) -> tuple[int, int]:
        # Headers of NVRTC's own major version first (exact minor better); otherwise keep search order.
        i, (_, d) = item
        v = cuda_version_of(d)
        if nvrtc_version is None or v is None:
            return (1, i)
        if v == nvrtc_version:
            return (0, i)
        return (1 if v[0] == nvrtc_version[0] else 2, i)

    problems: list[str] = []
    runtime_dir = min(enumerate(runtime), key=rank)[1][1] if runtime else None
    if runtime_dir is None:
        problems.append("no CUDA runtime headers (cuda_fp16.h) found: install a CUDA toolkit or "
                        "`pip install nvidia-cuda-runtime`, or set CUDA_HOME")
    cuda_version = cuda_version_of(runtime_dir) if runtime_dir else None

    # CCCL: the tree of the chosen runtime headers first (CUDA 13: include/cccl; CUDA 12: include itself).
    cccl_cands: list[Path] = []
    if runtime_dir is not None:
        cccl_cands += [runtime_dir / "cccl", runtime_dir]
    for _, d in cands:
        cccl_cands += [d / "cccl", d]
    cccl_dir = next((d for d in cccl_cands if _has_cccl(d)), None)
    if cccl_dir is None:
        problems.append("no CCCL headers (cub/cub.cuh) found: install a CUDA toolkit or "
                        "`pip install nvidia-cuda-cccl`")
    dirs: list[Path] = []
    # CCCL before the runtime headers, as nvcc orders them (-isystem include/cccl after -I include would
    # let a stale copy of cuda/std in include/ win; CUDA 12 trees keep both in one dir anyway).
    for d in (cccl_dir, runtime_dir):
        if d is not None and d not in dirs:
            dirs.append(d)
    return HeaderSet(include_dirs=tuple(dirs), runtime_dir=runtime_dir, cccl_dir=cccl_dir,
                     cuda_version=cuda_version, cccl_version=cccl_version_of(cccl_dir) if cccl_dir else None,
                     problems=tuple(problems))


def bundled_headers_dir(nvrtc_module: object, version: tuple[int, int]) -> Path | None:
    """Extract the headers that newer NVRTC builds bundle (13.x `nvrtcInstallBundledHeaders`), if it can.

    A fallback for machines with NVRTC but neither toolkit nor header wheels; NVRTC 13.0 has no such API,
    in which case this returns None.
    """
    install = getattr(nvrtc_module, "nvrtcInstallBundledHeaders", None)
    flag = getattr(nvrtc_module, "NVRTC_INSTALL_HEADERS_SKIP_IF_EXISTS", None)
    if install is None or flag is None:
        return None
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    dest = base / "kernel-forge" / f"nvrtc-headers-{version[0]}.{version[1]}"
    try:
        res = install(str(dest).encode(), int(flag))
        status = res[0] if isinstance(res, tuple) else res
        if int(status) != 0:
            return None
    except Exception:  # noqa: BLE001 - the symbol exists in the bindings but not in this libnvrtc
        return None
    return dest if _has_runtime(dest) else None


# ---------------------------------------------------------------------------------------------- shims

# Bumped whenever a shim's text changes, so cached compiles made with the old text are not reused.
_SHIM_VERSION = 1

# std header -> libcu++ header(s) it forwards to (only those that exist in the CCCL found are used).
_STD_FORWARDS: dict[str, tuple[str, ...]] = {
    "cstdint": ("cuda/std/cstdint",),
    "stdint.h": ("cuda/std/cstdint",),
    "cstddef": ("cuda/std/cstddef",),
    "stddef.h": ("cuda/std/cstddef",),
    "climits": ("cuda/std/climits",),
    "limits.h": ("cuda/std/climits",),
    "cfloat": ("cuda/std/cfloat",),
    "float.h": ("cuda/std/cfloat",),
    "cmath": ("cuda/std/cmath",),
    "math.h": ("cuda/std/cmath",),
    "cassert": ("cuda/std/cassert",),
    "assert.h": ("cuda/std/cassert",),
    "cstring": ("cuda/std/cstring",),
    "string.h": ("cuda/std/cstring",),
    "cstdlib": ("cuda/std/cstdlib",),
    "type_traits": ("cuda/std/type_traits",),
    "limits": ("cuda/std/limits",),
    "utility": ("cuda/std/utility",),
    "tuple": ("cuda/std/tuple",),
    "array": ("cuda/std/array",),
    "functional": ("cuda/std/functional",),
    "numeric": ("cuda/std/numeric",),
    "bit": ("cuda/std/bit",),
    "complex": ("cuda/std/complex",),
    "optional": ("cuda/std/optional",),
    "initializer_list": ("cuda/std/initializer_list",),
    # No <cuda/std/algorithm> umbrella in CCCL 3.0: the pieces kernels use.
    "algorithm": ("cuda/std/algorithm", "cuda/std/__algorithm/min.h", "cuda/std/__algorithm/max.h",
                  "cuda/std/__algorithm/clamp.h", "cuda/std/__algorithm/swap_ranges.h",
                  "cuda/std/__algorithm/fill.h", "cuda/std/__algorithm/copy.h"),
}

_INT_TYPES = ("int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t",
              "intptr_t", "uintptr_t", "intmax_t", "uintmax_t")

# Macros glibc's <float.h> / <math.h> give that libcu++ does not define under NVRTC.
_FLOAT_MACROS = """\
#ifndef FLT_MAX
#define FLT_MAX 3.402823466e+38F
#endif
#ifndef FLT_MIN
#define FLT_MIN 1.175494351e-38F
#endif
#ifndef FLT_EPSILON
#define FLT_EPSILON 1.192092896e-07F
#endif
#ifndef DBL_MAX
#define DBL_MAX 1.7976931348623158e+308
#endif
#ifndef DBL_MIN
#define DBL_MIN 2.2250738585072014e-308
#endif
#ifndef DBL_EPSILON
#define DBL_EPSILON 2.2204460492503131e-16
#endif
"""
_MATH_MACROS = """\
#ifndef HUGE_VALF
#define HUGE_VALF INFINITY
#endif
#ifndef HUGE_VAL
#define HUGE_VAL ((double)INFINITY)
#endif
#ifndef M_PI
#define M_E 2.7182818284590452354
#define M_LOG2E 1.4426950408889634074
#define M_LOG10E 0.43429448190325182765
#define M_LN2 0.69314718055994530942
#define M_LN10 2.30258509299404568402
#define M_PI 3.14159265358979323846
#define M_PI_2 1.57079632679489661923
#define M_PI_4 0.78539816339744830962
#define M_1_PI 0.31830988618379067154
#define M_2_PI 0.63661977236758134308
#define M_2_SQRTPI 1.12837916709551257390
#define M_SQRT2 1.41421356237309504880
#define M_SQRT1_2 0.70710678118654752440
#endif
"""


def _std_shim(name: str, targets: tuple[str, ...]) -> str:
    lines = ["#pragma once"] + [f"#include <{t}>" for t in targets]
    # Qualified lookup of std::X then finds cuda::std::X (declared __host__ __device__), which is what a
    # kernel calling std::min / std::numeric_limits / std::is_same means.
    lines.append("namespace std { using namespace ::cuda::std; }")
    if name in ("cstdint", "stdint.h"):
        # glibc's <cstdint> also declares the global names, and kernels rely on it.
        lines += [f"typedef ::cuda::std::{t} {t};" for t in _INT_TYPES]
    if name in ("cfloat", "float.h"):
        lines.append(_FLOAT_MACROS)
    if name in ("cmath", "math.h"):
        lines.append(_MATH_MACROS)
    return "\n".join(lines) + "\n"


_CUB_SKIP = ("cub/device/", "cub/util_allocator.cuh")


def _cub_umbrella(cccl_dir: Path) -> str | None:
    """cub/cub.cuh minus the device-wide algorithms and the caching allocator (host code NVRTC rejects)."""
    try:
        text = (cccl_dir / "cub" / "cub.cuh").read_text(errors="replace")
    except OSError:
        return None
    keep = ["#pragma once", "#include <cub/config.cuh>"]
    for inc in re.findall(r"^\s*#\s*include\s*<(cub/[^>]+)>", text, flags=re.M):
        if inc == "cub/config.cuh" or inc.startswith(_CUB_SKIP) or not (cccl_dir / inc).is_file():
            continue
        keep.append(f"#include <{inc}>")
    return "\n".join(keep) + "\n"


def nvrtc_shims(headers: HeaderSet) -> tuple[tuple[str, str], ...]:
    """(include name, text) pairs to hand NVRTC as in-memory headers; empty without CCCL."""
    return _nvrtc_shims(headers.cccl_dir)


@lru_cache(maxsize=4)
def _nvrtc_shims(cccl_dir: Path | None) -> tuple[tuple[str, str], ...]:
    if cccl_dir is None:
        return ()
    shims: list[tuple[str, str]] = []
    cub = _cub_umbrella(cccl_dir)
    if cub:
        shims.append(("cub/cub.cuh", cub))
    for name, targets in _STD_FORWARDS.items():
        present = tuple(t for t in targets if (cccl_dir / t).is_file())
        if present:
            shims.append((name, _std_shim(name, present)))
    return tuple(shims)


def describe(headers: HeaderSet) -> str:
    """One line per finding, for `doctor`-style reports."""
    lines = [f"runtime headers: {headers.runtime_dir or 'NOT FOUND'} (CUDA {headers.cuda_version})",
             f"CCCL headers:    {headers.cccl_dir or 'NOT FOUND'} (CCCL {headers.cccl_version})"]
    return "\n".join(lines + [f"problem: {p}" for p in headers.problems])
