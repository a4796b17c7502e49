"""What a model builder hands to capture: the module tree, one forward, and layer multiplicities."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class CaptureTarget:
    """One model ready to be captured.

    `module` is walked for module paths (hooks on every submodule); `forward` runs exactly one
    model forward on the example inputs and returns its output. `multiplicity` maps a module path
    prefix of a shrunk model to how many layers of that kind the full model has, so card call counts
    describe the real model. `notes` records choices that change which ops run (attention backend,
    experts implementation, shrinking) for the user to see next to the cards. `full_depth` says a
    reference builder built every layer of the real model: no call needs scaling, and a config's
    [multiplicity] (written for the shrunk build) does not apply.
    """

    module: torch.nn.Module
    forward: Callable[[], Any]
    multiplicity: Mapping[str, int] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)
    full_depth: bool = False


def target_from_inputs(model: torch.nn.Module, inputs: Any) -> CaptureTarget:
    """Wrap the `(model, example_inputs)` pair a user's builder returns."""
    if isinstance(inputs, Mapping):
        return CaptureTarget(module=model, forward=lambda: model(**inputs))
    if isinstance(inputs, (tuple, list)):
        return CaptureTarget(module=model, forward=lambda: model(*inputs))
    return CaptureTarget(module=model, forward=lambda: model(inputs))
