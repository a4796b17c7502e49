"""What the benchmark scripts share at their start: the check that a GPU is there for a script that measures on
one (a config that does not load is engine.config.config_or_error's)."""

from __future__ import annotations


def gpu_missing(script: str, device: str = "cuda") -> str | None:
    """The line to print when `script` measures on a CUDA GPU (`device` "cuda") and none is visible."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        return f"error: {script}: no CUDA GPU is visible; run it on the GPU"
    return None
