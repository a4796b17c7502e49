"""Candidate detail: source, diff against the parent, launch spec, compile log, runtime error,
verification report, timing statistics, and the proposer call that produced it."""

from __future__ import annotations

import json
import math
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Header, Static, TabbedContent, TabPane

from engine.outcomes import NUMERIC_REJECTIONS, describe_failure
from kforge_tui import format as fmt
from kforge_tui import keymap as keys
from kforge_tui.highlight import diff_text, highlight_cuda, highlighter_name
from kforge_tui.readmodel import CandidateDetail
from kforge_tui.widgets import KeyFooter, KforgeScreen

# Short titles so all eight tabs fit in 80 columns.
TITLES = {"source": "Source", "diff": "Diff", "launch": "Spec", "compile": "Log", "error": "Error",
          "verify": "Verify", "timing": "Timing", "proposer": "Prompt"}


# Prose and one-line JSON wrap at the screen's edge (a cut reason hides its end); code keeps its lines.
WRAPPED = frozenset({"launch", "compile", "error", "verify", "proposer"})


class CandidateScreen(KforgeScreen):
    BINDINGS = keys.DETAIL

    def __init__(self, candidate_id: str) -> None:
        super().__init__()
        self.candidate_id = candidate_id
        self.detail: CandidateDetail | None = None

    def compose(self) -> ComposeResult:
        self.detail = self.app.model.candidate(self.candidate_id)
        yield Header()
        yield Static(self._summary(), id="cand-bar", classes="bar")
        with TabbedContent(initial=self._initial_tab(), id="tabs"):
            for i, (tab, title) in enumerate(TITLES.items()):
                with TabPane(f"{i + 1} {title}", id=tab):
                    with VerticalScroll(id=f"scroll-{tab}"):
                        if tab in ("source", "launch"):
                            yield Static(self._signature(), classes="signature")
                        yield Static(self._body(tab), id=f"body-{tab}",
                                     classes="wrap" if tab in WRAPPED else "code")
        yield KeyFooter()

    def on_mount(self) -> None:
        self._focus_body(self.query_one("#tabs", TabbedContent).active)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self._focus_body(event.pane.id)

    def _focus_body(self, tab: str | None) -> None:
        """The shown tab's text takes the keys at once: arrows, PageUp/PageDown, Home/End scroll it."""
        if tab:
            self.query_one(f"#scroll-{tab}", VerticalScroll).focus(scroll_visible=False)

    def _initial_tab(self) -> str:
        d = self.detail
        if d is None or d.row["status"] != "rejected":
            return "source"
        cat = d.row.get("category")
        if cat == "compile":
            return "compile"
        v = d.row.get("verification")
        # The report explains a failed verification; a kernel that passed it and was caught later (a
        # cheat found while timing) is explained by its error, not by a report that reads 'passed'.
        if cat in NUMERIC_REJECTIONS and v and not (isinstance(v, dict) and v.get("ok")):
            return "verify"
        return "error"

    def _summary(self) -> Text:
        d = self.detail
        if d is None:
            return Text(f"{self.candidate_id}: not found in this run", style="red")
        r = d.row
        style = fmt.STATUS_STYLE.get(r["status"], "")
        text = Text.assemble((f"{fmt.STATUS_GLYPH.get(r['status'], '?')} {r['id']}", f"bold {style}"),
                             f"  {r['status']}", (f" {r['category']}" if r.get("category") else "", "red"),
                             f"  card {r['card_id']}")
        if d.card:
            text.append(f" {d.card.label if d.card.chain is not None else d.card.op}")
        if r.get("best_us") is not None:
            text.append(f"  {fmt.us(r['best_us'])} µs {fmt.speedup(r.get('speedup'))}")
        text.append(f"  parent {r.get('parent_id') or '(root)'}", style="dim")
        return text

    def _signature(self) -> Text:
        """The card's full signature, wrapped (tables cut it), and what this candidate changed."""
        d = self.detail
        if d is None or d.card is None:
            return Text("")
        if d.card.chain is not None:
            text = Text.assemble((d.card.label, "bold"), "\n", d.card.detail)
        else:
            text = Text.assemble(("signature ", "dim"), f"{d.card.op} {d.card.signature}")
        change = self.app.model.change_vs_parent(self.candidate_id)
        if change:
            text.append("\nchanged vs parent ", style="dim")
            text.append(change)
        return text

    def _body(self, tab: str):
        d = self.detail
        if d is None:
            return Text("candidate not found")
        r = d.row
        if tab == "source":
            src = r.get("source") or ""
            if not src.strip():
                return Text("(no source: the proposer's answer had no usable code; see Proposer)", style="italic")
            return Group(Text(f"highlighting: {highlighter_name()}", style="dim"), _numbered(highlight_cuda(src)))
        if tab == "diff":
            return diff_text(d.parent_source, r.get("source") or "")
        if tab == "launch":
            spec = r.get("launch_spec")
            if isinstance(spec, str):
                try:
                    spec = json.loads(spec)
                except ValueError:
                    return Text(spec)
            return Text(_compact_json(spec) if spec else "(no launch spec)")
        if tab == "compile":
            if r.get("compile_log"):
                return Text(r["compile_log"])
            if r.get("category") == "compile" and r.get("error"):
                return Text.assemble(("compile diagnostics (summary as stored by the engine):\n", "dim"),
                                     (r["error"], "red"))
            return Text("(compiled cleanly)" if r["status"] in ("verified", "compiled") or
                        (r["status"] == "rejected" and r.get("category") != "compile")
                        else "(not compiled yet)", style="italic")
        if tab == "error":
            if r["status"] == "compiled":  # a dry run's note, not a failure
                return Text(f"○ {r.get('error') or 'compiled (dry run: not verified, not timed)'}"
                            "\n\nNot an error: a dry run compiles candidates and stops there.", style="italic")
            if r.get("error"):
                text = Text.assemble((f"{r.get('category') or 'error'}: ", "bold red"), r["error"])
                if r["status"] == "rejected":  # what the category means, for a reader new to it
                    text.append(f"\n\n{r.get('category') or 'unknown'}: {describe_failure(r.get('category'))}",
                                style="dim")
                return text
            return Text("(no error)", style="italic")
        if tab == "verify":
            report = _verification(r.get("verification"), r["status"])
            v = r.get("verification")
            if r["status"] == "rejected" and isinstance(v, dict) and v.get("ok"):
                return Group(Text(f"Verification passed; the candidate was rejected after it "
                                  f"({r.get('category') or 'unknown'}): why is on 5 Error.", style="bold yellow"),
                             report)
            return report
        if tab == "timing":
            return _timing(r.get("timing"), r)
        if tab == "proposer":
            return _proposer(d, r)
        return Text("")

    def action_tab(self, tab: str) -> None:
        self.query_one("#tabs", TabbedContent).active = tab

    def action_back(self) -> None:
        self.app.pop_screen()


def _compact_json(v: Any, indent: int = 0) -> str:
    """JSON with one key per line but lists of plain values on one line (`"grid": [1, 1, 1]`), so a
    launch spec fits a screen."""
    pad = " " * indent
    if isinstance(v, dict) and v:
        items = [f"{pad}  {json.dumps(k)}: {_compact_json(val, indent + 2)}" for k, val in v.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v):
        items = [f"{pad}  {_compact_json(x, indent + 2)}" for x in v]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(v, default=str)


def _numbered(text: Text) -> Text:
    lines = text.split("\n", allow_blank=True)
    width = len(str(len(lines)))
    out = Text()
    for i, line in enumerate(lines, 1):
        out.append(f"{i:>{width}} │ ", style="dim")
        out.append_text(line)
        out.append("\n")
    return out


def _verification(v: Any, status: str):
    if not v:
        return Text("(no verification report: the candidate never reached the GPU check)"
                    if status == "rejected" else "(not verified yet)", style="italic")
    if not isinstance(v, dict):
        return Text(str(v))
    head = Text.assemble(("passed" if v.get("ok") else "FAILED", "bold green" if v.get("ok") else "bold red"),
                         f"  category {v.get('category') or '–'}  input set {v.get('input_set') or '–'}"
                         f"  sets checked {v.get('sets_checked', '–')}")
    parts: list[Any] = [head]
    if v.get("message"):
        parts.append(Text(v["message"]))
    reports = (v.get("details") or {}).get("reports") or []
    if reports:
        t = Table("output", "max abs err", "max rel err", "bad / total", "first bad index", "got", "expected",
                  box=None, pad_edge=False)
        for rep in reports:
            t.add_row(str(rep.get("name")), _g(rep.get("max_abs_err")), _g(rep.get("max_rel_err")),
                      f"{rep.get('mismatches')}/{rep.get('numel')}", str(tuple(rep.get("first_bad_index") or ())),
                      str(rep.get("got")), str(rep.get("expected")))
        parts.append(t)
    other = {k: val for k, val in (v.get("details") or {}).items() if k != "reports"}
    if other:
        parts.append(Text(json.dumps(other, indent=2, default=str)))
    return Group(*parts)


def _g(x: Any) -> str:
    if x is None:
        return fmt.DASH
    try:
        f = float(x)
    except (TypeError, ValueError):
        return str(x)
    return "nan" if math.isnan(f) else f"{f:.3g}"


def _timing(t: Any, r: dict[str, Any]):
    if not t:
        return Text("(no timing: only verified candidates are timed)", style="italic")
    table = Table("", "median µs", "IQR", "min", "n", box=None, pad_edge=False)
    for side in ("eager", "candidate"):
        s = t.get(side) or {}
        table.add_row(side, fmt.us(s.get("median")), fmt.us(s.get("iqr")), fmt.us(s.get("min")), str(s.get("n", "–")))
    ci = t.get("speedup_ci") or [r.get("speedup_low"), r.get("speedup_high")]
    lines = Text(f"speedup {fmt.speedup(t.get('speedup'))}  95% CI [{_g(ci[0])}, {_g(ci[1])}]  reps {t.get('reps', '–')}"
                 f"{'  THROTTLED during timing' if t.get('throttled') else ''}")
    return Group(table, lines)


def _proposer(d: CandidateDetail, r: dict[str, Any]):
    head = Text(f"proposer {r.get('proposer')}  model {r.get('model_name') or '–'}  intent {r.get('intent') or '–'}")
    if r.get("params"):
        head.append(f"\nparams {json.dumps(r['params'], sort_keys=True)}")
    call = d.llm_call
    if call is None:
        return Group(head, Text("\n(no proposer call recorded: the builtin proposer fills templates offline)"
                                if not r.get("llm_call_id") else f"\n(call {r['llm_call_id']} was pruned)",
                                style="italic"))
    meta = Text(f"\ncall {call['id']}  tokens {call['tokens_in']} in / {call['tokens_out']} out  "
                f"${call['cost_usd']:.4f}  {fmt.num(call.get('latency_s'))} s")
    if call.get("error"):
        meta.append(f"\nerror: {call['error']}", style="red")
    return Group(head, meta, Text("\n── prompt ──", style="bold"), Text(call.get("prompt") or ""),
                 Text("\n── answer ──", style="bold"), Text(call.get("response") or "(no answer)"))
