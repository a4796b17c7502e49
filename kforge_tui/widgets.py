"""Widgets for live views: a table whose updates repaint only the rows they touch, and a bar that
repaints only when its text changes. A refresh tick must cost little CPU and few bytes over SSH."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual._two_way_dict import TwoWayDict
from textual.geometry import Region
from textual.screen import ActiveBinding, Screen
from textual.widgets import DataTable, Footer, Static
from textual.widgets.data_table import RowKey

from kforge_tui.keymap import ESSENTIAL

try:  # Textual's footer key widget (private module): without it the footer's keys are styled as Textual does
    from textual.widgets._footer import FooterKey
except ImportError:  # pragma: no cover - another Textual layout
    FooterKey = None


def same_content(a: Any, b: Any) -> bool:
    """Equal as the terminal shows them (rich's Text.__eq__ ignores the base style)."""
    if isinstance(a, Text) and isinstance(b, Text):
        return a.plain == b.plain and a.style == b.style and a.spans == b.spans
    return type(a) is type(b) and a == b


def literal(value: Any) -> Any:
    """A cell or bar's text as it reads, never as markup: Textual parses a plain str as rich markup, so a user's
    filter `[/`, an error text `at [/tmp/k.cu:12]` or a palette entry `Filter [/]` crashed the app (MarkupError),
    and `out0[idx] = [nan]` lost its brackets. Styled text is a rich Text, made so on purpose."""
    return Text(value) if isinstance(value, str) else value


class KforgeScreen(Screen):
    """A screen whose footer (and help panel) lists help, theme and quit first, so a narrow terminal,
    which cuts the footer on the right, always shows them; binding ids in `FOOTER_LAST` come after the
    app's keys (a screen key that must not push `g` charts off an 80-column footer)."""

    FOOTER_LAST: tuple[str, ...] = ()

    @property
    def active_bindings(self) -> dict[str, ActiveBinding]:
        active = super().active_bindings
        first = {k: a for k, a in active.items() if a.binding.id in ESSENTIAL}
        last = {k: a for k, a in active.items() if a.binding.id in self.FOOTER_LAST and k not in first}
        return {**first, **{k: a for k, a in active.items() if k not in first and k not in last}, **last}


class KeyFooter(Footer):
    """Textual's Footer, rebuilt only when the keys it shows change. Textual's rebuilds its key widgets on
    every bindings signal, and one fires on each focus change, key press and screen switch: in a test session
    four fifths of the widgets the TUI made were footer keys, built again to show the same keys, at about a
    third of its CPU."""

    _shown: tuple | None = None

    def _keys(self) -> tuple:
        """What the footer would show: each key with its display, description, state and tooltip."""
        app = self.app
        return tuple((b.key, app.get_key_display(b), b.description, b.action, getattr(b, "group", None), enabled,
                      tooltip)
                     for (_, b, enabled, tooltip) in self.screen.active_bindings.values()
                     if b.show or b.key == app.COMMAND_PALETTE_BINDING)

    def compose(self):
        self._shown = self._keys() if self._bindings_ready else None
        for widget in super().compose():
            # Each key starts in the style it will have: a new key's `compact` (True until its binding to the
            # footer's runs) flipped its class twice as it mounted, each a restyle of the screen's rules.
            for key in (widget, *getattr(widget, "_pending_children", ())):
                if FooterKey is not None and isinstance(key, FooterKey) and hasattr(FooterKey, "compact"):
                    compact = self.compact or key.has_class("-command-palette")  # that key is not bound
                    key.set_reactive(FooterKey.compact, compact)
                    key.set_class(compact, "-compact", update=False)
            yield widget

    def bindings_changed(self, screen: Screen) -> None:
        if self._bindings_ready and self.is_attached and screen is self.screen and self._keys() == self._shown:
            return
        super().bindings_changed(screen)


class LiveBar(Static):
    """A one-line Static that repaints only when its content changes, and never asks for a relayout."""

    _last: Any = None

    def show(self, content: Any) -> None:
        content = literal(content)
        if self._last is not None and same_content(self._last, content):
            return
        self._last = content
        self.update(content, layout=False)


class LiveTable(DataTable):
    """A DataTable for data that changes a few rows at a time.

    DataTable.update_cell invalidates every render cache of the table (a global update counter is part
    of each cache key) and repaints the whole widget, so a tick that changes five cells of a 500-row
    table re-renders every visible cell. Here a changed row drops only its own cache entries and repaints
    only its own line; `reorder` moves rows without clearing and re-adding them. Both fall back to the
    stock (slower, always correct) path if Textual's internals are not what this was written against.
    Rows are one line high.
    """

    def add_row(self, *cells: Any, **kwargs: Any) -> RowKey:
        return super().add_row(*map(literal, cells), **kwargs)

    def update_cell(self, row_key: Any, column_key: Any, value: Any, **kwargs: Any) -> None:
        super().update_cell(row_key, column_key, literal(value), **kwargs)

    def set_row(self, key: str, cells: Sequence[Any]) -> bool:
        """Put `cells` in the row with `key` (added at the end if new); True when anything changed."""
        return bool(self.set_rows({key: cells}))

    def set_rows(self, rows: Mapping[str, Sequence[Any]]) -> set[str]:
        """Update (or append) several rows at once; returns the keys whose cells changed."""
        changed: set[str] = set()
        columns = [c.key for c in self.ordered_columns]
        widen = False
        for key, cells in rows.items():
            rk = RowKey(key)
            data = self._data.get(rk)
            if data is None:
                self.add_row(*cells, key=key)
                changed.add(key)
                continue
            dirty = False
            for col, value in zip(columns, map(literal, cells)):
                if not same_content(data.get(col), value):
                    data[col] = value
                    dirty = True
                    column = self.columns[col]
                    if _width(value) > column.content_width:
                        column.content_width = _width(value)
                        widen = True
            if dirty:
                changed.add(key)
        if not changed:
            return changed
        if widen or not self._fast_path_ok():
            self._update_count += 1  # the stock path: every cache is stale, the whole table repaints
            self._require_update_dimensions = widen or self._require_update_dimensions
            self.refresh(layout=widen)
            return changed
        self._forget_rows({RowKey(k) for k in changed})
        for key in changed:
            idx = self._row_locations.get(RowKey(key))
            if idx is not None:
                self._refresh_lines(idx)
        return changed

    def reorder(self, keys: Sequence[str]) -> None:
        """Show the existing rows in this order (the same keys); repaints only rows that moved.

        The cursor stays on its line; the screen decides whether it follows a row."""
        new = [RowKey(k) for k in keys]
        old = self._row_locations
        where = [old.get(k) for k in new]
        if len(new) != len(old) or None in where:
            raise ValueError("reorder needs exactly the table's current row keys")
        moved = [i for i, j in enumerate(where) if j != i]
        if not moved:
            return
        self._row_locations = TwoWayDict({k: i for i, k in enumerate(new)})
        if not self._fast_path_ok() or len(moved) > 2 * self.size.height:
            # Most rows moved (say, new ones on top): they all repaint anyway; drop every cache at once.
            self._update_count += 1
            self.refresh()
        else:
            # Row indices are baked into these (and into cell segments, for mouse clicks).
            self._row_renderable_cache.clear()
            self._offset_cache.clear()
            self._ordered_row_cache.clear()
            self._forget_rows({new[i] for i in moved})
            for i in moved:
                self._refresh_lines(i)

    def remove_rows(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.remove_row(key)

    # ---- internals -------------------------------------------------------------------------------------

    def _fast_path_ok(self) -> bool:
        # Rows are one line each (add_row's default, the only height these screens use).
        return self.fixed_rows == 0 and all(
            hasattr(self, name) for name in ("_cell_render_cache", "_row_render_cache", "_row_renderable_cache",
                                             "_line_cache", "_offset_cache", "_ordered_row_cache", "_data"))

    def _forget_rows(self, stale: set[RowKey]) -> None:
        for cache in (self._cell_render_cache, self._row_render_cache):
            for k in [k for k in cache.keys() if k[0] in stale]:
                cache.discard(k)
        count = self._update_count
        for k in stale:
            idx = self._row_locations.get(k)
            if idx is not None:
                self._row_renderable_cache.discard((count, idx))
        self._line_cache.clear()  # keyed by line number; only the refreshed lines are rendered again

    def _refresh_lines(self, row_index: int) -> None:
        y = row_index + (self.header_height if self.show_header else 0)
        self._refresh_region(Region(0, y, max(self.size.width, self.virtual_size.width), 1))


def _width(value: Any) -> int:
    return value.cell_len if isinstance(value, Text) else cell_len(str(value))
