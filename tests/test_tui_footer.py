"""The footer shows the screen's keys, and is rebuilt only when they change: Textual's own rebuilt its key
widgets on every focus change, key press and screen switch, about a third of the TUI's CPU."""

from textual.widgets._footer import FooterKey
from tui_fixture import T0, build_store
from tui_helpers import screen_text

from kforge_tui.app import KforgeApp


async def _settle(pilot, *keys):
    for k in keys:
        await pilot.press(k)
        await pilot.pause(0.05)
    await pilot.pause(0.2)


async def test_focus_moves_keep_the_footer_and_a_new_key_rebuilds_it(tmp_path):
    db = tmp_path / "ws" / "kforge.db"
    ids = build_store(db)
    app = KforgeApp(db, ids["runs"][-1], refresh_s=0, clock=lambda: T0)
    async with app.run_test(size=(120, 30)) as pilot:
        await _settle(pilot)
        footer_line = screen_text(app).splitlines()[29]
        assert "p Pause" in footer_line, footer_line
        keys = list(app.screen.query(FooterKey))
        assert keys
        focused = app.focused
        for _ in range(3):  # focus moves through the screen's widgets: the same keys, the same widgets
            await _settle(pilot, "tab")
        assert app.focused is not focused or len(app.screen.focus_chain) < 2
        assert list(app.screen.query(FooterKey)) == keys
        assert all(k.is_attached for k in keys)
        app.update_keymap({"app.pause": "P"})  # a key changed: the footer shows it
        await _settle(pilot)
        footer_line = screen_text(app).splitlines()[29]
        assert "P Paus" in footer_line and "p Pause" not in footer_line, footer_line
        assert list(app.screen.query(FooterKey)) != keys
