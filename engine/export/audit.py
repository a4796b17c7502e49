"""`kforge-tui audit FILE.cast [--verify] [--json]`: what a cast holds, and (--verify) whether its
variants are still right and fast on this GPU."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

from engine.cast.format import CastError, read_cast
from engine.export.report import audit_document


def audit(path: str | Path, *, verify: bool = False, timing: dict[str, Any] | None = None) -> dict[str, Any]:
    """The audit document; raises CastError for a file that cannot be read at all."""
    f = read_cast(path)
    doc = audit_document(f.manifest, f.problems)
    doc["file"] = str(path)
    if verify:
        doc["verify"] = verify_here(path, timing or {"max_seconds": 1.0})
        for v in doc["variants"]:
            r = doc["verify"]["variants"].get(v["id"], {})
            v["verify"] = ("ok: " if r.get("ok") else "FAILED: " + str(r.get("reason", "no result")) + "; ") + \
                (f"{r['speedup']:.2f}x now (95% CI {r['speedup_ci'][0]:.2f}-{r['speedup_ci'][1]:.2f}), "
                 f"eager {r['eager_us']:.1f} us -> {r['cast_us']:.1f} us on {r.get('inputs')}"
                 if r.get("speedup") else "not timed")
            v["verified_ok"] = bool(r.get("ok"))
    return doc


def audit_json(doc: dict[str, Any]) -> str:
    """`audit --json`: the document as strict JSON, one line. A non-finite number (a manifest may hold one: a
    measurement gone wrong, or a hand-edited file) is written as null, where Python would write `Infinity`,
    which jq and other strict parsers refuse."""
    def finite(x: Any) -> Any:
        if isinstance(x, float):
            return x if math.isfinite(x) else None
        if isinstance(x, dict):
            return {str(k): finite(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [finite(v) for v in x]
        return x
    return json.dumps(finite(doc), separators=(",", ":"), default=str, allow_nan=False)


def verify_here(path: str | Path, timing: dict[str, Any]) -> dict[str, Any]:
    """Re-check numerics and speed of every variant on this GPU (inputs synthesised from signatures)."""
    import torch

    from engine.errors import UsageError
    from engine.export.package import run_confirm

    if not torch.cuda.is_available():
        raise UsageError("audit --verify: no CUDA GPU is visible; --verify re-checks the kernels on a GPU")
    with tempfile.TemporaryDirectory(prefix="kforge-audit-") as tmp:
        return run_confirm(Path(path), {}, timing, Path(tmp))


__all__ = ["CastError", "audit", "audit_json", "verify_here"]
