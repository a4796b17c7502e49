"""Check that a `--small` CPU capture's speed-ups leave its cards as they are: each config is captured as a
user's capture runs (float32 compute where engine.capture.wide_compute applies, samples and chain samples)
and as before (half-precision compute throughout, no samples); every
op and chain card (op, signature, outputs, calls, module paths, bytes) and the skipped counts must agree,
and the chain-sampling forward must have made the captured forward's calls (no "chain samples" note).

    python scripts/compare_wide_capture.py [CONFIG ...]

Prints one line per config (cards compared, seconds of each capture by phase) and exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = sorted((ROOT / "configs" / "models").glob("*.toml"))


def _cards(result) -> dict:
    keep = ("op", "signature", "outputs", "calls", "module_paths", "bytes", "output_varies")
    return {c.card_id: tuple(repr(getattr(c, k)) for k in keep) for c in [*result.cards, *result.chains]}


def compare_one(config_path: str) -> bool:
    import torch

    from engine.capture.run import capture_model
    from engine.config import load_config

    config = load_config(config_path, small=True)
    runs = {}
    for now in (True, False):
        with tempfile.TemporaryDirectory(prefix="kforge-wide-") as tmp:
            runs[now] = capture_model(config, torch.device("cpu"), Path(tmp)) if now else \
                capture_model(config, torch.device("cpu"), Path(tmp), samples=0, wide_compute=False)
    same, before = _cards(runs[True]), _cards(runs[False])
    diff = sorted(k for k in same.keys() | before.keys() if same.get(k) != before.get(k))
    sampler = runs[True].notes.get("chain samples")
    ok = not diff and runs[True].skipped == runs[False].skipped and sampler is None
    phases = "; ".join(f"{'now' if w else 'before'}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.phases.items())
                       for w, r in runs.items())
    print(f"{config.name}: {len(before)} cards, {'identical' if not diff else f'{len(diff)} differ: {diff[:5]}'}"
          f"{'' if sampler is None else f'; chain samples: {sampler}'}; {phases}; "
          f"{runs[True].notes.get('cpu compute', '')}", flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="*", default=[str(p) for p in REFERENCE])
    ap.add_argument("--one", help=argparse.SUPPRESS)  # child mode: one config
    args = ap.parse_args(argv)
    if args.one:
        return 0 if compare_one(args.one) else 1
    codes = [subprocess.run([sys.executable, __file__, "--one", c]).returncode for c in args.configs]
    return 1 if any(codes) else 0


if __name__ == "__main__":
    sys.exit(main())
