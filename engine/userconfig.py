"""The user's own settings, `$XDG_CONFIG_HOME/kforge/config.toml` (default ~/.config/kforge/config.toml).

    default_provider = "local"          # used when neither --provider nor the run config names one

    [providers.local]                   # a provider of configs/providers.toml (or a new one of `type`)
    type = "openai"                     # needed only for a name providers.toml does not have
    model = "qwen2.5-coder-32b"
    base_url = "http://localhost:8000/v1"
    prices = { "qwen2.5-coder-32b" = { input = 0.0, output = 0.0 } }   # USD per million tokens

    [limits]                            # spend caps of a run (--max-cost, --max-tokens win over these)
    max_cost_usd = 5.0
    max_tokens = 2000000

    [tui]
    theme = "kforge-light"
    [tui.keymap]                        # binding id = keys, as in --keymap FILE
    "app.quit" = "ctrl+q"

Plain data only: the run turns a provider entry into its client (`engine.run.command`), the TUI reads
`tui`. Every problem is one UsageError naming the file, the key and the fix (exit 2).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

_TOP_KEYS = {"default_provider", "providers", "limits", "tui"}
_PROVIDER_KEYS = {"type", "model", "base_url", "api_key_env", "prices"}
_PROVIDER_TYPES = ("anthropic", "openai", "builtin", "replay")
_PRICE_KEYS = {"input", "output", "cache_read", "cache_write"}
_LIMIT_KEYS = {"max_cost_usd", "max_tokens"}
_TUI_KEYS = {"theme", "keymap"}


@dataclass(frozen=True)
class UserProvider:
    """One `[providers.NAME]` table: what it overrides of providers.toml's entry of that name."""

    name: str
    type: str | None = None
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    prices: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # model -> {input, output, …}


@dataclass(frozen=True)
class UserConfig:
    """The validated user config; an absent file is this with every field empty."""

    path: Path
    default_provider: str | None = None
    providers: Mapping[str, UserProvider] = field(default_factory=dict)
    max_cost_usd: float | None = None
    max_tokens: int | None = None
    theme: str | None = None
    keymap: Mapping[str, str] = field(default_factory=dict)

    @property
    def exists(self) -> bool:
        return self.path.is_file()


def user_config_path(env: Mapping[str, str] = os.environ) -> Path:
    """`$XDG_CONFIG_HOME/kforge/config.toml`, else `~/.config/kforge/config.toml`."""
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base) / "kforge" / "config.toml"


def load_user_config(path: str | Path | None = None, env: Mapping[str, str] = os.environ) -> UserConfig:
    """Read and validate the user config (the default path unless `path` is given); no file: empty config."""
    p = Path(path) if path is not None else user_config_path(env)
    if not p.is_file():
        if path is not None:
            raise UsageError(f"{p}: user config not found")
        return UserConfig(path=p)
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{p}: invalid TOML: {e}; fix the file or move it away") from None
    except OSError as e:
        raise UsageError(f"{p}: cannot read the user config ({e.strerror or e}); fix its permissions") from None

    def bad(key: str, why: str) -> UsageError:
        return UsageError(f"{p}: key '{key}': {why}")

    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise bad(unknown[0], f"unknown key; allowed keys are {', '.join(sorted(_TOP_KEYS))}")
    default = raw.get("default_provider")
    if default is not None and (not isinstance(default, str) or not default.strip()):
        raise bad("default_provider", "must be a provider name, e.g. \"anthropic\" or \"builtin\"")
    providers = {}
    tables = raw.get("providers", {})
    if not isinstance(tables, dict):
        raise bad("providers", "must be a table of [providers.NAME] tables")
    for name, t in tables.items():
        providers[name] = _provider(bad, name, t)
    limits = _table(bad, raw, "limits", _LIMIT_KEYS)
    cost = limits.get("max_cost_usd")
    if cost is not None and (not _number(cost) or not cost > 0):
        raise bad("limits.max_cost_usd", "must be a number of US dollars > 0")
    tokens = limits.get("max_tokens")
    if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1):
        raise bad("limits.max_tokens", "must be a whole number of tokens >= 1")
    tui = _table(bad, raw, "tui", _TUI_KEYS)
    theme = tui.get("theme")
    if theme is not None and (not isinstance(theme, str) or not theme.strip()):
        raise bad("tui.theme", "must be a theme name, e.g. \"kforge-light\"")
    keymap = tui.get("keymap", {})
    if not isinstance(keymap, dict):
        raise bad("tui.keymap", "must be a table: binding id = \"keys\"")
    for k, v in keymap.items():
        if not isinstance(v, str) or not v.strip():
            raise bad(f"tui.keymap.{k}", "must be a string of keys, e.g. \"ctrl+q\"")
    return UserConfig(path=p, default_provider=default, providers=providers,
                      max_cost_usd=None if cost is None else float(cost), max_tokens=tokens,
                      theme=theme, keymap=dict(keymap))


def _number(v: Any) -> bool:
    """A finite int or float (TOML has inf and nan; neither is a limit)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _table(bad, raw: dict[str, Any], key: str, allowed: set[str]) -> dict[str, Any]:
    t = raw.get(key, {})
    if not isinstance(t, dict):
        raise bad(key, f"must be a table ([{key}])")
    unknown = sorted(set(t) - allowed)
    if unknown:
        raise bad(f"{key}.{unknown[0]}", f"unknown key; allowed keys are {', '.join(sorted(allowed))}")
    return t


def _provider(bad, name: str, t: Any) -> UserProvider:
    where = f"providers.{name}"
    if not isinstance(t, dict):
        raise bad(where, f"must be a table ([{where}])")
    unknown = sorted(set(t) - _PROVIDER_KEYS)
    if unknown:
        raise bad(f"{where}.{unknown[0]}", f"unknown key; allowed keys are {', '.join(sorted(_PROVIDER_KEYS))}")
    kind = t.get("type")
    if kind is not None and kind not in _PROVIDER_TYPES:
        raise bad(f"{where}.type", f"unknown type '{kind}'; use one of {', '.join(_PROVIDER_TYPES)}")
    for key in ("model", "api_key_env"):
        if key in t and (not isinstance(t[key], str) or not t[key].strip()):
            raise bad(f"{where}.{key}", "must be a non-empty string")
    base_url = t.get("base_url")
    if base_url is not None and (not isinstance(base_url, str) or not base_url.startswith(("http://", "https://"))):
        raise bad(f"{where}.base_url", "must be an http:// or https:// URL, e.g. http://localhost:8000/v1")
    prices_raw = t.get("prices", {})
    if not isinstance(prices_raw, dict):
        raise bad(f"{where}.prices", 'must be a table: "model" = { input = 3.0, output = 15.0 } (USD per million)')
    prices: dict[str, dict[str, float]] = {}
    for m, pr in prices_raw.items():
        key = f"{where}.prices.{m}"
        if not isinstance(pr, dict):
            raise bad(key, "must be { input = USD per million input tokens, output = … }")
        unknown = sorted(set(pr) - _PRICE_KEYS)
        if unknown:
            raise bad(f"{key}.{unknown[0]}", f"unknown key; allowed: {', '.join(sorted(_PRICE_KEYS))}")
        for k in ("input", "output"):
            if k not in pr:
                raise bad(f"{key}.{k}", "required (USD per million tokens)")
        for k, v in pr.items():
            if not _number(v) or v < 0:
                raise bad(f"{key}.{k}", "must be a non-negative number (USD per million tokens)")
        prices[m] = {k: float(v) for k, v in pr.items()}
    return UserProvider(name=name, type=kind, model=t.get("model"), base_url=base_url,
                        api_key_env=t.get("api_key_env"), prices=prices)
