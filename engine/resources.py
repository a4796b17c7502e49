"""Files shipped with Kernel Forge (the top-level configs/ and themes/ folders), and the memory a budget
may plan on (`available_device_bytes`).

Shipped files: in a source checkout (or an editable install) they are read where they stand; in an installed
wheel they are package data (`engine.shipped_configs`, `kforge_tui.themes`, see pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import Any

_PACKAGES = {"configs": "engine.shipped_configs", "themes": "kforge_tui.themes"}


def shipped_dir(kind: str) -> Path:
    """The folder of shipped `configs` or `themes`."""
    checkout = Path(__file__).resolve().parent.parent / kind
    if checkout.is_dir():
        return checkout
    return Path(str(files(_PACKAGES[kind])))


# ---- memory a budget may plan on -------------------------------------------------------------------


def mem_available_bytes(meminfo: str | Path = "/proc/meminfo") -> int | None:
    """`MemAvailable` from /proc/meminfo in bytes (None: no such file or line)."""
    try:
        text = Path(meminfo).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() == "MemAvailable":
            parts = rest.split()
            if parts and parts[0].isdigit():
                scale = 1024 if len(parts) < 2 or parts[1].lower() == "kb" else 1
                return int(parts[0]) * scale
    return None


def available_device_bytes(device: Any = None, *, props: Any = None, meminfo: str | Path = "/proc/meminfo",
                           mem_get_info: Callable[[Any], tuple[int, int]] | None = None) -> int:
    """Bytes of GPU memory a sample or workspace budget may plan on for `device`: the free device memory,
    or on an integrated GPU (unified memory: DGX Spark's GB10, Jetson) `MemAvailable`, because there
    cudaMemGetInfo counts the page cache as used. `props` is the device's properties
    (`torch.cuda.get_device_properties`, which has `is_integrated`); `meminfo` and `mem_get_info` are
    where the two numbers come from (tests pass their own)."""
    if props is None:
        import torch

        props = torch.cuda.get_device_properties(device)
    if getattr(props, "is_integrated", False):
        available = mem_available_bytes(meminfo)
        if available is not None:
            return available
    if mem_get_info is None:
        import torch

        mem_get_info = torch.cuda.mem_get_info
    return int(mem_get_info(device)[0])
