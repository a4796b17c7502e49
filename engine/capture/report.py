"""The capture table a user sees on a terminal (rich; plain text when stdout is not a terminal)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from engine.capture.hidden import makers_of
from engine.capture.run import CaptureResult
from engine.progress import stdout_console


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _share(result: CaptureResult, c: Any) -> str:
    """A card's share, or "twin" for a channels-last twin (its calls are its original's, counted there), or
    "inside" for a hidden call (part of the call that makes it)."""
    if c.card_id in result.twins:
        return "twin"
    return "inside" if c.card_id in result.hidden else f"{100 * c.share:.1f}%"


def _twin(result: CaptureResult, c: Any) -> str:
    orig = result.twins.get(c.card_id)
    if orig:
        return f"  (channels-last twin of {orig[:8]}, for torch.compile)"
    if c.card_id not in result.hidden:
        return ""
    makers = makers_of(c.signature)
    return (f"  (the bias add inside convolution{'s' if len(makers) > 1 else ''} "
            f"{', '.join(m[:8] for m in makers)})")


def _derived_chain(result: CaptureResult, c: Any) -> str:
    """What a chain card derived by the capture stands for: a channels-last twin's or a conv-bias fold's original
    (their calls are its calls, their share part of its share)."""
    orig = result.twins.get(c.card_id)
    if orig:
        return f"  (channels-last twin of {orig[:8]}, for torch.compile)"
    orig = result.folded.get(c.card_id)
    if orig:
        return f"  (the convolution's bias add in front of {orig[:8]}, for torch.compile)"
    return ""


def print_cards(result: CaptureResult, workspace: Path, console: Console | None = None) -> None:
    """Header lines, then one row per card: op, signature, calls, share, bytes, id."""
    console = console or stdout_console(soft_wrap=False)
    skipped = ", ".join(f"{v} {k}" for k, v in sorted(result.skipped.items())) or "none"
    console.print(f"[bold]{result.model}[/] on {result.device} ({result.dtype}"
                  f"{', small' if result.small else ''}): {len(result.cards)} cards, "
                  f"{result.total_calls} calls per forward, captured in {result.wall_s:.1f} s",
                  highlight=False, soft_wrap=True)
    console.print(f"capture {result.capture_id} in {workspace}; not cards: {skipped}",
                  highlight=False, soft_wrap=True)
    for k, v in result.notes.items():
        console.print(f"  {k}: {v}", highlight=False, markup=False, soft_wrap=True)
    if not console.is_terminal:
        # Piped or redirected: one plain line per card, full signature, easy to grep and diff.
        console.print(f"{'#':>3}  {'op':32}  {'calls':>6}  {'share':>6}  {'bytes':>10}  {'id':16}  signature",
                      highlight=False, markup=False, soft_wrap=True)
        for i, c in enumerate(result.cards, 1):
            console.print(f"{i:>3}  {c.op:32}  {c.calls:>6}  {_share(result, c):>6}  "
                          f"{human_bytes(c.bytes):>10}  {c.card_id:16}  {c.signature_text}{_twin(result, c)}",
                          highlight=False, markup=False, soft_wrap=True)
    else:
        table = Table(pad_edge=False, expand=False)
        table.add_column("#", justify="right", no_wrap=True)
        table.add_column("op", no_wrap=True, style="bold")
        table.add_column("calls", justify="right", no_wrap=True)
        table.add_column("share", justify="right", no_wrap=True)
        table.add_column("bytes", justify="right", no_wrap=True)
        table.add_column("signature", overflow="fold", ratio=1, min_width=24)
        table.add_column("id", no_wrap=True, style="dim")
        for i, c in enumerate(result.cards, 1):
            table.add_row(str(i), c.op, str(c.calls), _share(result, c), human_bytes(c.bytes),
                          c.signature_text + _twin(result, c), c.card_id)
        console.print(table)
    _print_chains(result, console)
    console.print("share: of the op time measured during this capture on "
                  f"{result.device}; the GPU lane measures eager latency properly later.",
                  highlight=False, soft_wrap=True)


def _print_chains(result: CaptureResult, console: Console) -> None:
    """Chain cards after the op cards: kind (module or pattern), where, calls, share, member ops."""
    if not result.chains:
        return
    console.print(f"{len(result.chains)} chain cards (memory-bound calls one kernel could do; their calls are "
                  "also counted in the op cards above):", highlight=False, soft_wrap=True)
    rows = []
    for i, c in enumerate(result.chains, 1):
        info = c.chain or {}
        kind = info.get("kind", "?")
        where = info.get("module_class", "")
        rows.append((str(i), kind, where, str(c.calls), f"{100 * c.share:.1f}%", human_bytes(c.bytes),
                     c.card_id, c.signature_text + _derived_chain(result, c)))
    if not console.is_terminal:
        console.print(f"{'#':>3}  {'kind':7}  {'module':20}  {'calls':>6}  {'share':>6}  {'bytes':>10}  "
                      f"{'id':16}  chain", highlight=False, markup=False, soft_wrap=True)
        for i, kind, where, calls, share, nbytes, cid, text in rows:
            console.print(f"{i:>3}  {kind:7}  {where:20}  {calls:>6}  {share:>6}  {nbytes:>10}  {cid:16}  {text}",
                          highlight=False, markup=False, soft_wrap=True)
        return
    table = Table(pad_edge=False, expand=False)
    for name, kw in (("#", {"justify": "right"}), ("kind", {}), ("module", {}), ("calls", {"justify": "right"}),
                     ("share", {"justify": "right"}), ("bytes", {"justify": "right"})):
        table.add_column(name, no_wrap=True, **kw)
    table.add_column("chain", overflow="fold", ratio=1, min_width=24)
    table.add_column("id", no_wrap=True, style="dim")
    for i, kind, where, calls, share, nbytes, cid, text in rows:
        table.add_row(i, kind, where, calls, share, nbytes, Text(text), cid)  # `chain[add …]` is no markup
    console.print(table)
