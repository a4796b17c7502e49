"""What a model builder hands to capture: the module tree, one forward, and layer multiplicities."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch


class ModelExited(Exception):
    """The model's forward called sys.exit: raised in place of the SystemExit, which ended kforge silently with the
    model's exit code (red team F7: `capture` exited 5 with no output). As an Exception, every caller that reports a
    forward that raised reports this one too; `code` is what the model passed to sys.exit."""

    def __init__(self, code: Any) -> None:
        super().__init__(f"the model called sys.exit({code!r})")
        self.code = code


def exit_guarded(forward: Callable[[], Any]) -> Callable[[], Any]:
    """`forward` with a SystemExit it raises turned into ModelExited. (os._exit ends the process where it is
    called: nothing in the process can catch it.)"""
    def call() -> Any:
        try:
            return forward()
        except SystemExit as e:
            raise ModelExited(e.code) from e

    return call


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
    inputs: Any = None   # the example inputs the forward passes (a user's builder's), where known


def target_from_inputs(model: torch.nn.Module, inputs: Any) -> CaptureTarget:
    """Wrap the `(model, example_inputs)` pair a user's builder returns."""
    if isinstance(inputs, Mapping):
        return CaptureTarget(module=model, forward=lambda: model(**inputs), inputs=inputs)
    if isinstance(inputs, (tuple, list)):
        if (len(inputs) == 2 and isinstance(inputs[0], (tuple, list)) and isinstance(inputs[1], Mapping)):
            return CaptureTarget(module=model, forward=_args_kwargs_hint(lambda: model(*inputs)), inputs=inputs)
        return CaptureTarget(module=model, forward=lambda: model(*inputs), inputs=inputs)
    return CaptureTarget(module=model, forward=lambda: model(inputs), inputs=inputs)


def _args_kwargs_hint(forward: Callable[[], Any]) -> Callable[[], Any]:
    """The forward of example inputs shaped like torch.export's (args, kwargs) pair, which are passed as two
    positional inputs: where the model refuses them, the error says what the builder should return."""
    def call() -> Any:
        try:
            return forward()
        except Exception as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise TypeError(f"{first} (the example inputs look like an (args, kwargs) pair, which is passed as two "
                            "positional inputs: return (model, args) with a tuple of positional inputs, or "
                            "(model, kwargs) with a dict of keyword inputs)") from e
    return call
