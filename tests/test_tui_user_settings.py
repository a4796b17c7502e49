"""The TUI's settings from the user config and what it remembers: keys from `[tui.keymap]` (a tui.toml or
--keymap over them), the theme from --theme, else the config, else the one last chosen with T."""

import argparse

import pytest

from kforge_tui.app import KforgeApp
from kforge_tui.launcher import tui_settings
from kforge_tui.state import read_state


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "config" / "kforge").mkdir(parents=True)
    return tmp_path


def _args(**kw):
    return argparse.Namespace(**{"keymap": None, "theme": None, **kw})


def _config(home, text):
    (home / "config" / "kforge" / "config.toml").write_text(text)


def test_theme_and_keys_from_the_user_config(home):
    _config(home, '[tui]\ntheme = "kforge-light"\n[tui.keymap]\n"app.quit" = "ctrl+q"\n')
    keymap, theme, state = tui_settings(_args())
    assert theme == "kforge-light" and keymap == {"app.quit": "ctrl+q"}
    assert state == home / "state" / "kforge" / "tui-state.json"
    keymap, theme, _ = tui_settings(_args(theme="kforge-high-contrast"))
    assert theme == "kforge-high-contrast"  # the flag wins


def test_an_unknown_binding_in_the_user_config_is_one_line(home):
    from engine.errors import UsageError

    _config(home, '[tui.keymap]\n"app.explode" = "x"\n')
    with pytest.raises(UsageError, match="config.toml: unknown binding id"):
        tui_settings(_args())


async def test_the_theme_chosen_with_t_is_remembered(home, tmp_path):
    from tui_fixture import build_store

    db = tmp_path / "ws" / "kforge.db"
    ids = build_store(db)
    state = home / "state" / "kforge" / "tui-state.json"
    app = KforgeApp(db, ids["runs"][-1], state_file=state)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(0.2)
        await pilot.press("T")
        await pilot.pause(0.2)
        chosen = app.theme
    assert read_state(state)["theme"] == chosen
    _, theme, _ = tui_settings(_args())
    assert theme == chosen  # the next session starts with it
    _config(home, '[tui]\ntheme = "kforge-dark"\n')
    assert tui_settings(_args())[1] == "kforge-dark"  # a configured theme is a decision; it wins
