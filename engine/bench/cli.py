"""What the benchmark scripts share at their start: a model config read or one error line naming the input
and the fix (exit 2), and the check that a GPU is there for a script that measures on one."""

from __future__ import annotations

from typing import Any


def model_config(model: str, small: bool = False) -> tuple[Any, str | None]:
    """(the config at `model`, None), or (None, the line to print) for a config that does not load."""
    from engine.config import load_config
    from engine.errors import UsageError

    try:
        return load_config(model, small=small), None
    except (UsageError, FileNotFoundError, ValueError) as e:
        return None, f"error: --model {model}: {e}"


def gpu_missing(script: str, device: str = "cuda") -> str | None:
    """The line to print when `script` measures on a CUDA GPU (`device` "cuda") and none is visible."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        return f"error: {script}: no CUDA GPU is visible; run it on the GPU"
    return None
