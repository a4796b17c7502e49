"""The user config ($XDG_CONFIG_HOME/kforge/config.toml) and the precedence of a run's settings:
CLI > the model config's [run] table > user config > defaults (issue 25)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine.errors import UsageError
from engine.run.command import provider_for, resolve_settings
from engine.userconfig import UserConfig, load_user_config, user_config_path

ROOT = Path(__file__).resolve().parents[1]
MY_MODEL = str(ROOT / "configs/examples/my_model.toml")

GOOD = """
default_provider = "local"

[providers.local]
type = "openai"
model = "qwen-coder"
base_url = "http://localhost:8000/v1"
prices = { "qwen-coder" = { input = 0.5, output = 1.5 } }

[providers.anthropic]
model = "claude-haiku-4-5"

[limits]
max_cost_usd = 5
max_tokens = 100000

[tui]
theme = "kforge-light"
keymap = { quit = "ctrl+q" }
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "kforge" / "config.toml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_path_follows_xdg_config_home(tmp_path):
    assert user_config_path({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "kforge" / "config.toml"
    assert user_config_path({"HOME": str(tmp_path)}) == tmp_path / ".config" / "kforge" / "config.toml"


def test_no_file_is_an_empty_config(tmp_path):
    cfg = load_user_config(env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert cfg.providers == {} and cfg.default_provider is None and cfg.max_cost_usd is None and not cfg.exists


def test_a_full_config_loads_typed(tmp_path):
    _write(tmp_path, GOOD)
    cfg = load_user_config(env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert cfg.default_provider == "local"
    assert cfg.providers["local"].base_url == "http://localhost:8000/v1"
    assert cfg.providers["local"].prices == {"qwen-coder": {"input": 0.5, "output": 1.5}}
    assert (cfg.max_cost_usd, cfg.max_tokens) == (5.0, 100000)
    assert cfg.theme == "kforge-light" and cfg.keymap == {"quit": "ctrl+q"}


@pytest.mark.parametrize("text, names", [
    ("colour = 1", "'colour'"),
    ("[limits]\nmax_cost_usd = -1", "'limits.max_cost_usd'"),
    ("[limits]\nmax_cost_usd = inf", "'limits.max_cost_usd'"),
    ("[providers.x]\nprices = { m = { input = 1, output = inf } }", "'providers.x.prices.m.output'"),
    ("[limits]\nmax_tokens = 0", "'limits.max_tokens'"),
    ("[providers.x]\ntype = 'gpt'", "'providers.x.type'"),
    ("[providers.x]\nbase_url = 'localhost:8000'", "'providers.x.base_url'"),
    ("[providers.x]\nprices = { m = { input = 1 } }", "'providers.x.prices.m.output'"),
    ("[tui]\nkeymap = { quit = 3 }", "'tui.keymap.quit'"),
    ("not toml [", "invalid TOML"),
])
def test_bad_values_are_one_line_naming_the_key(tmp_path, text, names):
    p = _write(tmp_path, text)
    with pytest.raises(UsageError) as e:
        load_user_config(p)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg and names in msg


def _args(**kw) -> argparse.Namespace:
    base = dict(provider=None, model=None, base_url=None, iterations=None, strategy=None, wall_time=None,
                max_proposals=None, max_cost=None, max_tokens=None)
    return argparse.Namespace(**{**base, **kw})


def test_precedence_cli_over_run_config_over_user_config_over_defaults(tmp_path):
    user = UserConfig(path=tmp_path / "c.toml", default_provider="builtin", max_cost_usd=9.0, max_tokens=500)
    run_table = {"max_cost": 3.0, "iterations": 7}
    s = resolve_settings(_args(max_cost=1.0), run_table, user)
    assert (s.max_cost_usd, s.source["max_cost_usd"]) == (1.0, "cli")
    s = resolve_settings(_args(), run_table, user)
    assert (s.max_cost_usd, s.source["max_cost_usd"]) == (3.0, "run config")
    assert (s.iterations, s.source["iterations"]) == (7, "run config")
    assert (s.max_tokens, s.source["max_tokens"]) == (500, "user config")
    assert (s.provider, s.source["provider"]) == ("builtin", "user config")
    assert (s.strategy, s.max_proposals, s.source["strategy"]) == ("mcts", 4, "default")
    s = resolve_settings(_args(provider="anthropic"), {"provider": "openai"}, user)
    assert s.provider == "anthropic"


def test_user_provider_and_cli_overrides_reach_the_provider_config(tmp_path):
    p = _write(tmp_path, GOOD)
    user = load_user_config(p)
    cfg = provider_for("local", None, None, user)
    assert (cfg.type, cfg.model, cfg.base_url) == ("openai", "qwen-coder", "http://localhost:8000/v1")
    assert cfg.prices["qwen-coder"].output == 1.5
    assert provider_for("anthropic", None, None, user).model == "claude-haiku-4-5"
    cfg = provider_for("local", "other", "http://127.0.0.1:9000/v1", user)
    assert (cfg.model, cfg.base_url) == ("other", "http://127.0.0.1:9000/v1")
    assert cfg.missing_key({}) is None  # a base URL needs no key


def test_model_flag_on_a_non_llm_provider_is_bad_usage(tmp_path):
    with pytest.raises(UsageError, match="--model"):
        provider_for("builtin", "x", None, UserConfig(path=tmp_path / "none.toml"))


def test_run_table_of_a_model_config_is_validated_and_not_part_of_its_identity(tmp_path):
    from engine.config import load_config

    (tmp_path / "my_model.py").write_text((Path(MY_MODEL).parent / "my_model.py").read_text())
    a = tmp_path / "a.toml"
    a.write_text(Path(MY_MODEL).read_text())
    b = tmp_path / "b.toml"
    b.write_text(a.read_text() + "\n[run]\nmax_cost = 2.5\n")
    c = tmp_path / "c.toml"
    c.write_text(a.read_text() + "\n[run]\nmax_cost = 4\niterations = 3\n")
    assert load_config(b).run == {"max_cost": 2.5}
    assert load_config(b).sha256 == load_config(c).sha256
    bad = tmp_path / "bad.toml"
    for value in ("-1", "nan", "inf"):   # TOML's inf was stored in the run's config as Infinity (not JSON)
        bad.write_text(a.read_text() + f"\n[run]\nmax_cost = {value}\nwall_time = 60\n")
        with pytest.raises(UsageError, match="run.max_cost': must be a finite number > 0"):
            load_config(bad)
    bad.write_text(a.read_text() + "\n[run]\nwall_time = inf\n")
    with pytest.raises(UsageError, match="run.wall_time"):
        load_config(bad)


def test_bad_cli_values_exit_2_naming_the_flag(cli, tmp_path):
    for flag, value in (("--max-cost", "-3"), ("--max-tokens", "0"), ("--base-url", "localhost"),
                        ("--wall-time", "abc")):
        code, out, err = cli("run", MY_MODEL, "--dry-run", "--no-tui", flag, value, "--workspace", tmp_path)
        assert code == 2 and flag in err and len(err.strip().splitlines()) == 1, err
