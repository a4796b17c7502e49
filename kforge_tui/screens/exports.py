"""The run's exports (`kforge-tui export`, recorded in the store): per export the targets asked, per target
the whole-model check (speedup with its 95% CI, eager and cast ms, output agreement, or why it was refused),
which variants serve which target and which the check dropped, and why an export failed."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Header, Static

from engine.outcomes import faster_with_confidence
from kforge_tui import format as fmt
from kforge_tui import keymap as keys
from kforge_tui.readmodel import Snapshot
from kforge_tui.widgets import KeyFooter, KforgeScreen, LiveBar, LiveTable, literal

SUMMARY_CHARS = 50  # the list's last column at 80 columns (the details below say it all)
STATUS_STYLE = {"written": "green", "failed": "red", "interrupted": "yellow"}


class ExportsScreen(KforgeScreen):
    BINDINGS = keys.EXPORTS

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, Any]] = []

    def compose(self) -> ComposeResult:
        yield Header()
        yield LiveBar(id="exports-bar", classes="bar")
        yield LiveTable(id="exports", cursor_type="row")
        with VerticalScroll(id="export-detail"):
            yield Static(id="export-text")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#exports", LiveTable).add_columns("finished (UTC)", "status", "whole model per target")
        self.rebuild()

    def on_screen_resume(self) -> None:
        self.rebuild()

    def apply_snapshot(self, snap: Snapshot) -> None:
        self.rebuild()  # a handful of rows, read only while this screen shows: an export may end any time

    def rebuild(self) -> None:
        run_id = self.app.run_id
        rows = self.app.model.exports(run_id)
        if [(r["id"], r["finished_at"]) for r in rows] == [(r["id"], r["finished_at"]) for r in self.rows] \
                and self.rows:
            return
        self.rows = rows
        table = self.query_one("#exports", LiveTable)
        table.display = bool(rows)
        bar = self.query_one("#exports-bar", LiveBar)
        if not rows:
            bar.show(f"exports of {run_id}: none recorded")
            self.query_one("#export-text", Static).update(empty_text(run_id))
            return
        bar.show(f"{len(rows)} export{'s' if len(rows) != 1 else ''} of {run_id} · newest first · "
                 "tab: to the details")
        cur = table.cursor_row or 0
        table.clear()
        for r in rows:
            table.add_row(stamp(r["finished_at"]), Text(r["status"], style=STATUS_STYLE.get(r["status"], "")),
                          summary(r), key=r["id"])
        table.move_cursor(row=min(cur, len(rows) - 1))
        self.show_detail(min(cur, len(rows) - 1))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self.show_detail(event.cursor_row)

    def show_detail(self, index: int) -> None:
        if 0 <= index < len(self.rows):
            self.query_one("#export-text", Static).update(detail(self.rows[index]))

    def action_back(self) -> None:
        self.app.pop_screen()


def empty_text(run_id: str) -> Text:
    return Text.assemble(
        (f"No export of {run_id} is recorded.\n\n", "bold"),
        "Package the run's winners as a .cast, each checked on the whole model per target:\n\n",
        (f"  kforge-tui export {run_id} --out model.cast --target eager,cuda-graphs\n\n", "bold"),
        "Targets: eager, cuda-graphs, compile, compile:max-autotune-no-cudagraphs, compile:reduce-overhead, "
        "or all (docs/cast.md, \"Targets\"). Exports made before Kernel Forge recorded them are not listed.",
        style="", end="")


def stamp(ts: float | None) -> str:
    return fmt.DASH if ts is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts))


def summary(row: dict[str, Any]) -> str:
    """One line per export: each target's whole-model speedup, or why there is none."""
    if row["status"] != "written" and not any(c.get("speedup") is not None for c in _checks(row)):
        text = (row.get("error") or row["status"]).removeprefix("export: ")
    else:
        text = " · ".join(f"{c['target']} {_short(c)}" for c in _checks(row))
    return text if len(text) <= SUMMARY_CHARS else text[:SUMMARY_CHARS - 1] + "…"


def _short(check: dict[str, Any]) -> str:
    if check.get("refused"):
        return "refused"
    if check.get("speedup") is not None:
        return f"{check['speedup']:.2f}×"
    return "not measured"


def _checks(row: dict[str, Any]) -> list[dict[str, Any]]:
    checks = row.get("checks")
    return [c for c in checks if isinstance(c, dict)] if isinstance(checks, list) else []


def check_text(check: dict[str, Any]) -> Text:
    """A target's whole-model result: speedup with its CI, eager -> cast ms, output agreement; or why none."""
    if check.get("refused"):
        return Text(f"refused: {str(check['refused']).removeprefix('export: ')}", style="red")
    if check.get("mode") == "not reached":
        return Text("not reached: the export ended before this check", style="yellow")
    if check.get("speedup") is None:
        why = check.get("reason") or check.get("mode") or "no result"
        return Text(f"not measured ({str(why).removeprefix('export: ')})", style="yellow")
    ci = check.get("speedup_ci") or [None, None]
    sure = ci[0] is not None and faster_with_confidence(ci)
    text = Text(f"{check['speedup']:.3f}×", style="bold green" if sure else "bold yellow")
    if ci[0] is not None:
        text.append(f" (95% CI {ci[0]:.3f}–{ci[1]:.3f})")
    if check.get("eager_ms") is not None and check.get("cast_ms") is not None:
        text.append(f" · {check['eager_ms']:.2f} → {check['cast_ms']:.2f} ms")
    if check.get("degenerate_eager"):
        text.append(" · eager's own output is degenerate: agreement says nothing", style="yellow")
    elif check.get("rel_l2_err") is not None:
        text.append(f" · output vs eager {check['rel_l2_err']:.1e} (rel. L2)")
    if ci[0] is not None and not sure:
        text.append(" · not faster with confidence", style="yellow")
    return text


def detail(row: dict[str, Any]) -> Group:
    """Everything recorded of one export, at 80 columns: what it asked, per target the numbers and the
    variants kept and dropped, the variants in the cast and whom they serve, what was left on PyTorch."""
    status = row["status"]
    head = Text.assemble((status, f"bold {STATUS_STYLE.get(status, '')}"), f" {stamp(row.get('finished_at'))} UTC")
    env = row.get("env") if isinstance(row.get("env"), dict) else {}
    if env.get("gpu"):
        head.append(f" on {env['gpu']}" + (f" ({env['arch']})" if env.get("arch") else ""))
    head.append(f"\n{'cast' if status == 'written' else 'asked for'} {row.get('out_path')}")
    parts: list[Any] = [head]
    if row.get("error"):
        parts.append(Text(f"why: {row['error'].removeprefix('export: ')}", style="red"))
    parts.append(Text(f"targets asked: {', '.join(row.get('targets') or []) or fmt.DASH}", style="bold"))
    grid = Table.grid(padding=(0, 1), expand=True)
    grid.add_column(no_wrap=True, style="bold")
    grid.add_column(ratio=1)
    for c in _checks(row):
        grid.add_row(literal(c.get("target", "?")), literal(check_text(c)))
        kept, dropped = c.get("kept") or [], c.get("dropped") or []
        if kept or (status == "written" and not c.get("refused")):
            grid.add_row("", Text(f"kept {len(kept)}: {', '.join(kept) or fmt.DASH}", style="dim"))
        if c.get("refused") and dropped:  # one reason for all of them, said above
            grid.add_row("", Text(f"dropped {len(dropped)}: {', '.join(str(d.get('id')) for d in dropped)}",
                                  style="dim"))
            continue
        for d in dropped:
            grid.add_row("", Text(f"dropped {d.get('id')}: {str(d.get('reason')).removeprefix('export: ')}",
                                  style="dim"))
    parts.append(grid)
    variants = row.get("variants") or []
    if variants:
        parts.append(Text(f"\nin the cast: {len(variants)} variant(s), the targets each serves", style="bold"))
        vt = Table.grid(padding=(0, 1), expand=True)
        vt.add_column(no_wrap=True)
        vt.add_column(no_wrap=True, justify="right")
        vt.add_column(ratio=1)
        for v in variants:
            serves = ", ".join(v["targets"]) if v.get("targets") is not None else \
                "every target (none recorded: not checked on the whole model)"
            vt.add_row(literal(str(v.get("id"))), fmt.speedup(v.get("speedup")), literal(serves))
        parts.append(vt)
    excluded = row.get("excluded") or []
    if excluded:
        parts.append(Text(f"\nleft on PyTorch: {len(excluded)}", style="bold"))
        for e in excluded:
            parts.append(Text(f"  {str(e.get('op', '')).removeprefix('aten::')} {str(e.get('card_id', ''))[:8]}: "
                              f"{e.get('reason')}", style="dim"))
    for w in row.get("warnings") or []:
        parts.append(Text(f"warning: {w}", style="yellow"))
    return Group(*parts)
