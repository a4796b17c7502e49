"""Record what a `--small` CPU capture found, and compare two such records: a speed-up of the capture must
leave every op and chain card as it was.

    python scripts/card_fingerprint.py record CONFIG OUT.json   # capture (capture_and_store) and record
    python scripts/card_fingerprint.py compare BEFORE.json AFTER.json

A record holds, per card id: op, signature, outputs, calls, captured calls, module paths, bytes, samples,
output_varies and the chain description; plus the skipped counts and the notes (timings and ids left
out; the "cpu compute" note counts calls over all of a capture's forwards and is not compared).
`compare` prints each difference and exits 1 if there is one.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

_KEEP = ("op", "signature", "outputs", "calls", "captured_calls", "module_paths", "bytes", "samples",
         "output_varies", "chain")


# Notes about how the capture ran, not what it found ("cpu compute" counts widened calls over all forwards).
_PROCESS_NOTES = {"cpu compute"}


def record(config_path: str) -> dict:
    """Capture `config_path` `--small` on the CPU in a temp workspace; its cards as plain JSON data."""
    from engine.capture.store import capture_and_store
    from engine.config import load_config
    from engine.store.workspace import ensure_workspace

    config = load_config(config_path, small=True)
    with tempfile.TemporaryDirectory(prefix="kforge-fp-") as tmp:
        t0 = time.perf_counter()
        result = capture_and_store(config, "cpu", ensure_workspace(Path(tmp)), samples=None,
                                   progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
        wall = time.perf_counter() - t0
    cards = {c.card_id: {k: getattr(c, k) for k in _KEEP} for c in [*result.cards, *result.chains]}
    return {"model": result.model, "cards": cards, "skipped": result.skipped, "notes": result.notes,
            "wall_s": round(wall, 1), "phases": {k: round(v, 1) for k, v in result.phases.items()}}


def differences(before: dict, after: dict) -> list[str]:
    """One line per card (or skipped count / note) that is not the same in both records."""
    out = []
    for cid in sorted(before["cards"].keys() | after["cards"].keys()):
        b, a = before["cards"].get(cid), after["cards"].get(cid)
        if b is None or a is None:
            out.append(f"card {cid}: only {'after' if b is None else 'before'}")
        elif b != a:
            out.append(f"card {cid}: " + ", ".join(k for k in _KEEP if b.get(k) != a.get(k)) + " differ")
    if before["skipped"] != after["skipped"]:
        out.append(f"skipped: {before['skipped']} -> {after['skipped']}")
    for key in sorted(before["notes"].keys() | after["notes"].keys()):
        if key not in _PROCESS_NOTES and before["notes"].get(key) != after["notes"].get(key):
            out.append(f"note {key!r}: {before['notes'].get(key)!r} -> {after['notes'].get(key)!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("config")
    rec.add_argument("out", type=Path)
    cmp = sub.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "record":
        data = record(args.config)
        args.out.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))
        print(f"{data['model']}: {len(data['cards'])} cards, {data['wall_s']} s ({data['phases']})")
        return 0
    before, after = (json.loads(p.read_text()) for p in (args.before, args.after))
    diff = differences(before, after)
    for line in diff:
        print(line)
    print(f"{before['model']}: {len(before['cards'])} cards before, {len(after['cards'])} after, "
          f"{'identical' if not diff else f'{len(diff)} differences'}; "
          f"wall {before['wall_s']} s -> {after['wall_s']} s")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
