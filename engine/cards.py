"""Operator cards: one runtime-compatible variant of an ATen op as a model really calls it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OperatorCard:
    """An ATen overload plus the exact signature of its arguments, with what the capture measured.

    `calls` counts calls per forward of the full model (shrunk layers scaled by multiplicity);
    `share` is the card's fraction of the captured op time (measured during capture on the capture
    device); `bytes` is the minimum traffic of one call. `eager_us` and `roofline_us` are filled by
    the GPU lane, which times eager properly.
    """

    id: str
    op: str
    signature: dict[str, Any]
    signature_text: str
    calls: int
    captured_calls: int
    share: float
    bytes: int
    module_paths: dict[str, int]
    outputs: list[dict[str, Any]]
    capture_us: float
    samples: int
    output_varies: bool = False
    eager_us: float | None = None
    roofline_us: float | None = None
    tolerance: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The card as the CLI's `--json` prints it (DESIGN.md minimum shape plus details)."""
        return {
            "id": self.id, "op": self.op, "signature": self.signature_text, "calls": self.calls,
            "share": round(self.share, 6), "bytes": self.bytes, "captured_calls": self.captured_calls,
            "capture_us": round(self.capture_us, 3), "module_paths": self.module_paths,
            "outputs": self.outputs, "samples": self.samples, "output_varies": self.output_varies,
            "eager_us": self.eager_us, "roofline_us": self.roofline_us, "args": self.signature["args"],
            "aliases": self.signature["aliases"],
        }
