"""Does Kernel Forge install on Linux aarch64 (DGX Spark, GH200)? Ask pip, from any machine.

For each dependency of pyproject's [project] dependencies and of the `models` and `dev` extras:

    pip download --only-binary=:all: --platform manylinux2014_aarch64 --platform manylinux_2_28_aarch64
                 --python-version 3.12 --no-deps -d TMP REQUIREMENT

and where no aarch64 wheel is found, whether a pure-Python wheel (`--platform any`) or an sdist exists.
With `--with-deps`, the whole set is also resolved together for aarch64 (`pip install --dry-run
--report`), which catches a binary dependency of a dependency (pydantic-core under anthropic, cuda-bindings
under cuda-python) without downloading it.

    python scripts/check_aarch64_wheels.py [--with-deps [--skip torch,torchvision]] [--json]

Exit status 0 when every core dependency has an aarch64 (or pure-Python) wheel, 1 otherwise.
`KNOWN_AARCH64` below is what the last run found (`CHECKED` is its date); tests/test_aarch64_deps.py
holds pyproject to it, so a new dependency needs a run of this script first (docs/results/aarch64.md).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PLATFORMS = ("manylinux2014_aarch64", "manylinux_2_28_aarch64")
PYTHON = "3.12"
EXTRAS = ("models", "dev")

CHECKED = "2026-12-01"
# Distribution name -> the file pip chose for aarch64 at CHECKED (run this script to refresh). With
# --with-deps --skip torch,torchvision the rest resolved too (79 files, every binary one an aarch64 wheel);
# torch's own CUDA dependencies could not be resolved from the index at hand (docs/results/aarch64.md).
KNOWN_AARCH64: dict[str, str] = {
    "tomli": "tomli-2.5.0-py3-none-any.whl",  # only below Python 3.11 (checked with --python-version 3.10)
    "torch": "torch-2.14.1-cp312-cp312-manylinux_2_28_aarch64.whl",
    "numpy": "numpy-2.5.5-cp312-cp312-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl",
    "textual": "textual-8.2.8-py3-none-any.whl",
    "textual-plotext": "textual_plotext-1.0.1-py3-none-any.whl",
    "rich": "rich-15.0.0-py3-none-any.whl",
    "aiohttp": "aiohttp-3.14.5-cp312-cp312-manylinux2014_aarch64.manylinux_2_17_aarch64.manylinux_2_28_aarch64.whl",
    "anthropic": "anthropic-2.15.0-py3-none-any.whl",
    "openai": "openai-3.57.0-py3-none-any.whl",
    "aiosqlite": "aiosqlite-0.22.1-py3-none-any.whl",
    "cuda-python": "cuda_python-13.4.4-py3-none-any.whl",
    "nvidia-cuda-nvrtc": "nvidia_cuda_nvrtc-13.5.37-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
    "nvidia-cuda-cccl": "nvidia_cuda_cccl-13.3.5.0.6-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
    "safetensors": "safetensors-0.8.0-cp310-abi3-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
    "textual-serve": "textual_serve-1.1.3-py3-none-any.whl",
    "tree-sitter": "tree_sitter-0.26.1-cp312-cp312-manylinux2014_aarch64.manylinux_2_17_aarch64.manylinux_2_28_aarch64.whl",
    "tree-sitter-cuda": "tree_sitter_cuda-0.21.2-cp310-abi3-manylinux2014_aarch64.manylinux_2_17_aarch64.manylinux_2_28_aarch64.whl",
    "ninja": "ninja-1.13.2-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
    "torchvision": "torchvision-0.29.1-cp312-cp312-manylinux_2_28_aarch64.whl",
    "transformers": "transformers-5.24.0-py3-none-any.whl",
    "diffusers": "diffusers-0.42.1-py3-none-any.whl",
    "pytest": "pytest-9.2.0-py3-none-any.whl",
    "pytest-asyncio": "pytest_asyncio-1.5.0-py3-none-any.whl",
    "pytest-xdist": "pytest_xdist-3.8.0-py3-none-any.whl",  # added 2026-12-02 (pure Python; with execnet-2.1.2)
    "ruff": "ruff-0.17.6-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
}

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def dist_name(requirement: str) -> str:
    """'torch>=2.4' -> 'torch'; 'tomli>=2.0; python_version < "3.11"' -> 'tomli' (normalized, PEP 503)."""
    m = _NAME.match(requirement)
    if not m:
        raise ValueError(f"cannot read a name from requirement {requirement!r}")
    return re.sub(r"[-_.]+", "-", m.group(1)).lower()


def applies(requirement: str, python: str = PYTHON) -> bool:
    """Whether the requirement's environment marker holds on Linux aarch64 with `python` (no marker: yes)."""
    _, _, marker = requirement.partition(";")
    if not marker.strip():
        return True
    try:
        from packaging.markers import Marker
    except ModuleNotFoundError:  # pip vendors packaging
        from pip._vendor.packaging.markers import Marker
    env = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "aarch64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    return Marker(marker.strip()).evaluate(env)


def requirements(pyproject: Path = ROOT / "pyproject.toml", extras: tuple[str, ...] = EXTRAS) -> dict[str, list[str]]:
    """{'core': [...], 'models': [...], ...}: the requirement strings of [project] and of each extra."""
    project = tomllib.loads(pyproject.read_text())["project"]
    out = {"core": list(project.get("dependencies", []))}
    for extra in extras:
        out[extra] = list(project.get("optional-dependencies", {}).get(extra, []))
    return out


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "-q"],
                          capture_output=True, text=True)


def _platform_args(platforms: tuple[str, ...]) -> list[str]:
    return [a for p in platforms for a in ("--platform", p)]


def check(requirement: str, tmp: Path) -> dict[str, str]:
    """One requirement: {'status': 'wheel' | 'pure' | 'sdist' | 'missing', 'file': ..., 'error': ...}."""
    spec = requirement.partition(";")[0].strip()
    dest = tmp / dist_name(requirement)
    r = _pip("download", "--only-binary=:all:", *_platform_args(PLATFORMS), "--python-version", PYTHON,
             "--no-deps", "-d", str(dest), spec)
    files = sorted(p.name for p in dest.glob("*")) if dest.exists() else []
    if r.returncode == 0 and files:
        status = "pure" if files[0].endswith("-none-any.whl") else "wheel"
        return {"status": status, "file": files[0]}
    error = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
    r = _pip("download", "--only-binary=:all:", "--platform", "any", "--python-version", PYTHON, "--no-deps",
             "-d", str(dest), spec)
    if r.returncode == 0:
        return {"status": "pure", "file": sorted(p.name for p in dest.glob("*"))[0]}
    r = _pip("download", "--no-binary=:all:", "--no-deps", "-d", str(dest), spec)
    if r.returncode == 0:
        return {"status": "sdist", "file": sorted(p.name for p in dest.glob("*"))[0], "error": error}
    return {"status": "missing", "file": "", "error": error}


def resolve_all(specs: list[str], tmp: Path) -> dict[str, object]:
    """The whole set resolved together for aarch64, dependencies of dependencies included, nothing
    downloaded beyond metadata: {'ok': bool, 'files': {name: file}, 'error': str}."""
    report = tmp / "report.json"
    r = _pip("install", "--dry-run", "--ignore-installed", "--only-binary=:all:", *_platform_args(PLATFORMS),
             "--python-version", PYTHON, "--target", str(tmp / "target"), "--report", str(report), *specs)
    if r.returncode != 0:
        return {"ok": False, "files": {}, "error": "\n".join(r.stderr.strip().splitlines()[-3:])}
    doc = json.loads(report.read_text())
    files = {item["metadata"]["name"].lower(): item["download_info"]["url"].rsplit("/", 1)[-1]
             for item in doc.get("install", [])}
    return {"ok": True, "files": files, "error": ""}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--with-deps", action="store_true", help="also resolve the whole set with its dependencies")
    ap.add_argument("--skip", default="", metavar="NAMES",
                    help="with --with-deps: leave these (comma-separated) out of the whole-set resolve, e.g. "
                         "torch where the index at hand lacks one of its CUDA wheels")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON document")
    args = ap.parse_args(argv)
    groups = requirements()
    results: dict[str, dict[str, dict[str, str]]] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for group, reqs in groups.items():
            results[group] = {}
            for req in reqs:
                if not applies(req):
                    results[group][dist_name(req)] = {"status": "not-needed", "file": "",
                                                      "error": f"marker excludes Python {PYTHON}"}
                    continue
                results[group][dist_name(req)] = check(req, tmp)
                if not args.json:
                    res = results[group][dist_name(req)]
                    print(f"{group:7s} {dist_name(req):22s} {res['status']:8s} {res['file'] or res.get('error', '')}")
        resolved = None
        if args.with_deps:
            skip = {dist_name(n) for n in args.skip.split(",") if n.strip()}
            specs = [r.partition(";")[0].strip() for reqs in groups.values() for r in reqs
                     if applies(r) and dist_name(r) not in skip]
            resolved = resolve_all(specs, tmp / "all")
            if not args.json:
                print(f"whole set with dependencies: {'resolves' if resolved['ok'] else 'FAILS'} for aarch64"
                      + (f" ({len(resolved['files'])} files)" if resolved["ok"] else f": {resolved['error']}"))
    bad = [n for n, r in results["core"].items() if r["status"] in ("missing", "sdist")]
    if args.json:
        print(json.dumps({"platforms": PLATFORMS, "python": PYTHON, "results": results, "resolved": resolved,
                          "core_without_wheel": bad}, indent=1))
    elif bad:
        print(f"core dependencies without an aarch64 wheel: {', '.join(bad)}")
    return 1 if bad or (resolved is not None and not resolved["ok"]) else 0


if __name__ == "__main__":
    sys.exit(main())
