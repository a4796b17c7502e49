"""A card's search tree: lazily loaded (children are added when their parent is expanded), updated in
batches, with jumps to the best node and to the next failed one."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Header, Static, Tree
from textual.widgets.tree import TreeNode

from engine.outcomes import FINISHED, describe_failure
from engine.store.read import CandidateHead
from kforge_tui import format as fmt
from kforge_tui import keymap as keys
from kforge_tui.charts import Chart, card_series, draw_card_us
from kforge_tui.readmodel import Snapshot
from kforge_tui.widgets import KeyFooter, KforgeScreen, literal

ROOT = "__root__"
# v counts what the search's backup counts: finished candidates in the node's subtree (its visits).
# ○ is a dry run's end: compiled, never verified or timed. It did not fail, so it is neither red nor ✗.
LEGEND = ("✓ verified · ✗ failed · ○ compiled, not timed (dry run)\n"
          "vN: N finished tries in this subtree · [N]: N children · ? keys")
# The side pane (the card's chart and the failure preview) shows from this width; below it, `l` opens
# the chart full screen and the line under the tree names the failure.
SIDE_MIN_WIDTH = 110
PREVIEW_LINES, PREVIEW_CHARS = 6, 160  # the first lines of a reason, each cut at this length


class CandidateTree(Tree[str]):
    """A Tree whose labels end in an ellipsis at the screen's edge: it never scrolls sideways."""

    def render_label(self, node: TreeNode[str], base_style: Style, style: Style) -> Text:
        text = super().render_label(node, base_style, style)
        depth = 0
        cur = node.parent
        while cur is not None:
            depth += 1
            cur = cur.parent
        room = self.scrollable_content_region.width - depth * self.guide_depth
        if room > 1 and text.cell_len > room:
            text.truncate(room, overflow="ellipsis")
        return text


class TreeScreen(KforgeScreen):
    BINDINGS = keys.TREE

    def __init__(self, card_id: str) -> None:
        super().__init__()
        self.card_id = card_id
        self.rows: dict[str, CandidateHead] = {}
        self.kids: dict[str, list[str]] = {ROOT: []}
        self.visits: dict[str, int] = {}
        self.tnodes: dict[str, TreeNode] = {}
        self.loaded: set[str] = set()

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="tree-bar", classes="bar")
        yield Static(Text(LEGEND), id="tree-legend", classes="muted")
        tree = CandidateTree(self._card_title(), data=ROOT, id="tree")
        tree.show_root = True
        tree.auto_expand = False
        with Horizontal(id="tree-main"):
            yield tree
            with Vertical(id="tree-side"):
                yield Chart("best µs over evaluations", id="tree-chart")
                yield Static(id="tree-preview")
        yield Static(id="tree-node", classes="bar")
        yield KeyFooter()

    def _card_title(self) -> Text:
        card = self.app.model.cards.get(self.card_id)
        if card is None:
            return Text(self.card_id)
        refs = ""
        if card.compile_us:
            refs += f"  torch.compile {fmt.us(card.compile_us)} µs"
        if card.copy_us:
            refs += f"  copy {fmt.us(card.copy_us)} µs"
        return Text.assemble((card.label if card.chain is not None else card.op, "bold"),
                             f"  eager {fmt.us(card.eager_us)} µs{refs}  {card.detail}")

    def on_mount(self) -> None:
        tree = self.query_one("#tree", Tree)
        self.tnodes[ROOT] = tree.root
        self.ingest(self.app.model.nodes_of(self.card_id))
        self._load_children(ROOT)
        tree.root.expand()
        tree.focus()
        self._bar()
        self._side_fits(self.app.size.width)

    def on_screen_resume(self) -> None:
        self.ingest(self.app.model.nodes_of(self.card_id))
        self._bar()

    def on_resize(self, event: events.Resize) -> None:
        self._side_fits(event.size.width)

    def _side_fits(self, width: int) -> None:
        side = self.query_one("#tree-side", Vertical)
        shown = side.has_class("visible")
        side.set_class(width >= SIDE_MIN_WIDTH, "visible")
        if side.has_class("visible") and not shown:
            self._preview(self.current())

    def apply_snapshot(self, snap: Snapshot) -> None:
        mine = [n for n in snap.changed_nodes if n.card_id == self.card_id]
        if mine:
            self.ingest(mine)
            self._bar()

    # ---- model -------------------------------------------------------------------------------------------

    def ingest(self, rows: list[CandidateHead]) -> None:
        """Apply new or changed candidates; only nodes already shown are touched on screen."""
        relabel: set[str] = set()
        for row in sorted(rows, key=lambda r: r.order):
            old = self.rows.get(row.id)
            if old == row:
                continue
            self.rows[row.id] = row
            parent = row.parent_id if row.parent_id in self.rows else ROOT
            if old is None:
                self.kids.setdefault(parent, []).append(row.id)
                self.kids.setdefault(row.id, [])
                self.visits.setdefault(row.id, 0)
                self._show_child(parent, row.id)
            newly_done = row.status in FINISHED and (old is None or old.status not in FINISHED)
            if newly_done:  # one visit for the node and each ancestor, as the search's backup counts them
                cur: str | None = row.id
                while cur is not None and cur in self.rows:
                    self.visits[cur] += 1
                    relabel.add(cur)
                    p = self.rows[cur].parent_id
                    cur = p if p in self.rows else None
            relabel.add(row.id)
        for nid in relabel:
            tn = self.tnodes.get(nid)
            if tn is not None:
                tn.set_label(self._label(nid))

    def _show_child(self, parent: str, nid: str) -> None:
        ptn = self.tnodes.get(parent)
        if ptn is None:
            return
        if parent in self.loaded:
            self.tnodes[nid] = ptn.add(self._label(nid), data=nid, allow_expand=False)
        ptn.allow_expand = True

    def _load_children(self, nid: str) -> None:
        if nid in self.loaded:
            return
        self.loaded.add(nid)
        tn = self.tnodes[nid]
        for child in self.kids.get(nid, []):
            self.tnodes[child] = tn.add(self._label(child), data=child,
                                        allow_expand=bool(self.kids.get(child)))

    def _label(self, nid: str) -> Text:
        r = self.rows[nid]
        glyph = fmt.STATUS_GLYPH.get(r.status, "?")
        style = fmt.STATUS_STYLE.get(r.status, "")
        text = Text.assemble((glyph + " ", style), (r.id, "bold" if r.status == "verified" else ""),
                             f"  v{self.visits.get(nid, 0)}")
        if r.status == "verified":
            text.append(f"  {fmt.us(r.best_us)} µs  ")
            text.append(fmt.speedup(r.speedup), style="bold green" if (r.speedup or 0) > 1 else "yellow")
        elif r.status == "rejected":
            text.append(f"  {r.category or 'unknown'}", style="red")
        else:
            text.append(f"  {r.status}", style=style)
        n = len(self.kids.get(nid, []))
        if n:
            text.append(f"  [{n}]", style="dim")
        return text

    def _bar(self) -> None:
        n = len(self.rows)
        failed = sum(1 for r in self.rows.values() if r.status == "rejected")
        best = self._best()
        card = self.app.model.cards.get(self.card_id)
        best_txt = f"best {best.id} {fmt.us(best.best_us)} µs {fmt.speedup(best.speedup)}" if best else \
            f"no verified node{fmt.still(card)}"
        self.query_one("#tree-bar", Static).update(literal(f"{self.card_id} · {n} nodes, {failed} failed · {best_txt}"))
        self.query_one("#tree-chart", Chart).set_draw(
            draw_card_us(card_series(self.rows.values()), card.eager_us if card else None,
                         card.compile_us if card else None))

    def _best(self) -> CandidateHead | None:
        ok = [r for r in self.rows.values() if r.status == "verified" and r.best_us]
        return min(ok, key=lambda r: r.best_us, default=None)

    # ---- navigation --------------------------------------------------------------------------------------

    def on_tree_node_expanded(self, event: Tree.NodeExpanded) -> None:
        self._load_children(event.node.data)

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted) -> None:
        self._node_line(event.node.data)
        self._preview(event.node.data)

    def _preview(self, nid: str | None) -> None:
        """Beside the tree: the failed node's category, what it means, and the first lines of its reason."""
        if not self.query_one("#tree-side", Vertical).has_class("visible"):
            return  # too narrow to show it: no need to read the reason
        pane = self.query_one("#tree-preview", Static)
        row = self.rows.get(nid) if nid else None
        if row is None or row.status != "rejected":
            hint = "○ compiled in a dry run: not verified, not timed" if row and row.status == "compiled" \
                else "n / N: next / previous failed node"
            pane.update(Text(hint, style="dim"))
            return
        detail = self.app.model.candidate(row.id)
        reason = (detail.row.get("error") if detail else None) or row.error_head or "(no reason stored)"
        lines = reason.splitlines() or [reason]
        cat = row.category or "unknown"
        text = Text.assemble((f"✗ {row.id} ", "bold"), (cat, "bold red"), "\n",
                             (describe_failure(row.category), "dim"), "\n\n")
        text.append("\n".join(line if len(line) <= PREVIEW_CHARS else line[:PREVIEW_CHARS - 1] + "…"
                               for line in lines[:PREVIEW_LINES]))
        if len(lines) > PREVIEW_LINES:
            text.append(f"\n… {len(lines) - PREVIEW_LINES} more lines: enter", style="dim")
        pane.update(text)

    def _node_line(self, nid: str | None) -> None:
        """Under the tree: what the node under the cursor changed against its parent."""
        line = self.query_one("#tree-node", Static)
        if nid is None or nid == ROOT or nid not in self.rows:
            card = self.app.model.cards.get(self.card_id)
            line.update(Text(card.detail if card else self.card_id, overflow="ellipsis", no_wrap=True))
            return
        parent = self.rows[nid].parent_id
        change = self.app.model.change_vs_parent(nid) or "(nothing stored about the change)"
        head = f"{nid} vs {parent}: " if parent else f"{nid} "
        line.update(Text(head + change, overflow="ellipsis", no_wrap=True))

    def reveal(self, nid: str) -> None:
        """Expand the path to `nid` and put the cursor on it."""
        path = []
        cur: str | None = nid
        while cur is not None and cur in self.rows:
            path.append(cur)
            p = self.rows[cur].parent_id
            cur = p if p in self.rows else None
        for anc in [ROOT, *reversed(path[1:])]:
            self._load_children(anc)
            self.tnodes[anc].expand()
        # Lines of freshly expanded nodes exist only after the next layout.
        self.call_after_refresh(self._cursor_to, nid)

    def _cursor_to(self, nid: str) -> None:
        tree = self.query_one("#tree", Tree)
        tn = self.tnodes[nid]
        tree.move_cursor(tn)
        tree.scroll_to_node(tn, animate=False)

    def current(self) -> str | None:
        node = self.query_one("#tree", Tree).cursor_node
        return None if node is None or node.data == ROOT else node.data

    def action_best(self) -> None:
        best = self._best()
        if best is None:
            self.notify("no verified candidate in this card yet")
            return
        self.reveal(best.id)

    def _step_failure(self, direction: int) -> None:
        failed = sorted((r for r in self.rows.values() if r.status == "rejected"), key=lambda r: r.order)
        if not failed:
            self.notify("no failed candidate in this card")
            return
        cur = self.current()
        order = self.rows[cur].order if cur else (-1 if direction > 0 else 1 << 62)
        after = [r for r in failed if (r.order > order if direction > 0 else r.order < order)]
        target = (after[0] if direction > 0 else after[-1]) if after else (failed[0] if direction > 0 else failed[-1])
        self.reveal(target.id)

    def action_next_failure(self) -> None:
        self._step_failure(1)

    def action_prev_failure(self) -> None:
        self._step_failure(-1)

    def action_expand(self) -> None:
        """Like a file tree: → opens a closed node, and moves into an open one."""
        tree = self.query_one("#tree", Tree)
        node = tree.cursor_node
        if node is None:
            return
        self._load_children(node.data)
        if node.is_expanded and node.children:
            tree.move_cursor(node.children[0])
        elif node.allow_expand:
            node.expand()

    def action_collapse(self) -> None:
        tree = self.query_one("#tree", Tree)
        node = tree.cursor_node
        if node is None:
            return
        if node.is_expanded and node.children:
            node.collapse()
        elif node.parent is not None:
            tree.move_cursor(node.parent)

    def on_tree_node_selected(self, event: Tree.NodeSelected) -> None:
        # The tree has focus, so its own enter binding fires: enter opens the detail, space expands.
        event.stop()
        self.action_open_detail()

    def action_open_detail(self) -> None:
        nid = self.current()
        if nid:
            self.app.open_candidate(nid)

    def action_latency(self) -> None:
        self.app.open_latency(self.card_id)

    def action_prioritize(self) -> None:
        self.app.action_control("prioritize", self.card_id)

    def action_back(self) -> None:
        self.app.pop_screen()
