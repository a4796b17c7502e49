"""The environment a cast was proven in, and whether the current one is the same where it matters.

Kernels are proven on one GPU arch against one torch minor version (eager's exact output layout and
numerics can change between torch releases). Anything else is a reason to stay on PyTorch. Another
version of the same minor (a patch release, another CUDA build) is installed, and named in a warning.
"""

from __future__ import annotations

import re
from typing import Any


def torch_minor(version: str) -> str:
    """'2.11.0+cu130' -> '2.11'."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return f"{m.group(1)}.{m.group(2)}" if m else version


def current_env(device: int | None = None, *, gpu: bool = True) -> dict[str, Any]:
    """torch/CUDA/driver/NVRTC versions and, when a GPU is visible and `gpu`, its name and arch."""
    import torch

    env: dict[str, Any] = {"torch": torch.__version__, "torch_minor": torch_minor(torch.__version__),
                           "cuda": torch.version.cuda, "gpu": None, "arch": None, "driver": None,
                           "nvrtc": None}
    try:
        from engine.compile import nvrtc_version

        env["nvrtc"] = "{}.{}".format(*nvrtc_version())
    except Exception:  # NVRTC missing: recorded as unknown, never fatal
        pass
    if gpu and torch.cuda.is_available():
        idx = torch.cuda.current_device() if device is None else device
        major, minor = torch.cuda.get_device_capability(idx)
        env.update(gpu=torch.cuda.get_device_name(idx), arch=f"sm_{major}{minor}",
                   compute_capability=[major, minor])
        try:
            from cuda.bindings import driver as cu

            err, v = cu.cuDriverGetVersion()
            if err == cu.CUresult.CUDA_SUCCESS:
                env["driver"] = f"{v // 1000}.{v % 1000 // 10}"
        except Exception:
            pass
    return env


def incompatibility(cast_env: dict[str, Any], here: dict[str, Any]) -> str | None:
    """Why kernels proven in `cast_env` must not run `here`, or None when they may."""
    if not here.get("arch"):
        return "no CUDA GPU is visible"
    if cast_env.get("arch") != here["arch"]:
        return (f"GPU arch {here['arch']} ({here.get('gpu')}) differs from the cast's "
                f"{cast_env.get('arch')} ({cast_env.get('gpu')})")
    want = cast_env.get("torch_minor") or torch_minor(str(cast_env.get("torch", "")))
    if want != here["torch_minor"]:
        return f"torch {here['torch']} differs from the cast's torch {cast_env.get('torch')} (minor {want})"
    return None


def torch_drift(cast_env: dict[str, Any], here: dict[str, Any]) -> str | None:
    """The torch the cast was proven on and the one here, in words, where they differ but their minor is the
    same (the loader installs such a cast); None where they are equal or either is unknown."""
    made, now = cast_env.get("torch"), here.get("torch")
    if not made or not now or made == now:
        return None
    want = cast_env.get("torch_minor") or torch_minor(str(made))
    if want != (here.get("torch_minor") or torch_minor(str(now))):
        return None   # another minor: incompatibility() refuses it
    return f"proven on torch {made}, loaded under torch {now} (same minor {want}): installed"
