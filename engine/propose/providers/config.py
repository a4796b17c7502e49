"""Provider configs (`configs/providers.toml`): load, validate, and build clients.

Keys never appear in the file: a provider names the environment variable that holds its key
(`api_key_env`), and clients read that variable at call time.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import UsageError
from engine.propose.providers.base import Price
from engine.propose.providers.retry import RateLimiter, RetryPolicy, SDKClient

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

TYPES = ("anthropic", "openai", "builtin", "replay")
LLM_TYPES = ("anthropic", "openai")
_LLM_KEYS = {"type", "description", "model", "api_key_env", "base_url", "max_tokens", "timeout_s",
             "total_timeout_s", "max_attempts", "concurrency", "requests_per_minute", "prices"}
_KEYS = {
    "anthropic": _LLM_KEYS,
    "openai": _LLM_KEYS | {"max_tokens_param"},
    "builtin": {"type", "description"},
    "replay": {"type", "description"},  # the run to replay is given per run: --replay-run RUN
}
_PRICE_KEYS = {"input", "output", "cache_read", "cache_write"}
_DEFAULT_KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ProviderConfig:
    """One validated `[name]` table of providers.toml. Holds the key's variable name, never the key."""

    name: str
    type: str
    path: Path
    model: str = ""
    description: str = ""
    api_key_env: str | None = None
    base_url: str | None = None
    max_tokens: int = 8192
    timeout_s: float = 300.0                  # one attempt
    total_timeout_s: float = 900.0            # one call: every attempt and backoff sleep
    max_attempts: int = 5
    concurrency: int = 4
    requests_per_minute: float = 0.0          # 0: no rate limit
    prices: Mapping[str, Price] = field(default_factory=dict)
    max_tokens_param: str | None = None       # openai only; None: chosen from base_url

    @property
    def is_llm(self) -> bool:
        """True for providers served by an LLM client (anthropic, openai)."""
        return self.type in LLM_TYPES

    def missing_key(self, env: Mapping[str, str] = os.environ) -> str | None:
        """The variable an LLM provider needs but finds empty, else None. With a base_url (a local
        OpenAI-compatible server) no key is needed: the client sends a placeholder."""
        if not self.is_llm or self.base_url or not self.api_key_env or env.get(self.api_key_env):
            return None
        return self.api_key_env

    def check_key(self, env: Mapping[str, str] = os.environ) -> None:
        """Raise UsageError (exit 2) naming the variable and the fix when the API key is missing."""
        var = self.missing_key(env)
        if var is not None:
            raise UsageError(f"--provider {self.name}: needs an API key in the environment variable {var}, "
                             f"which is not set; export {var}=<your key>, or use --provider builtin (no LLM, no key)")


def shipped_providers_path() -> Path:
    """The providers.toml shipped with Kernel Forge."""
    from engine.resources import shipped_dir

    return shipped_dir("configs") / "providers.toml"


def load_providers(path: str | Path | None = None) -> dict[str, ProviderConfig]:
    """Read and validate providers.toml (the shipped one by default); problems are UsageErrors naming the key."""
    p = Path(path) if path is not None else shipped_providers_path()
    if not p.is_file():
        raise UsageError(f"{p}: providers file not found")
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{p}: invalid TOML: {e}") from None
    out = {}
    for name, table in raw.items():
        if not isinstance(table, dict):
            raise UsageError(f"{p}: key '{name}': must be a table ([{name}]) describing one provider")
        out[name] = _provider(p, name, table)
    return out


def _provider(p: Path, name: str, t: dict[str, Any]) -> ProviderConfig:
    def bad(key: str, why: str) -> UsageError:
        return UsageError(f"{p}: key '{name}.{key}': {why}")

    kind = t.get("type", name if name in TYPES else None)
    if kind is None:
        raise bad("type", f"required for a provider not named after its type; one of {', '.join(TYPES)}")
    if kind not in TYPES:
        raise bad("type", f"unknown type '{kind}'; use one of {', '.join(TYPES)}")
    allowed = _KEYS[kind]
    unknown = sorted(set(t) - allowed)
    if unknown:
        raise bad(unknown[0], f"unknown key for a {kind} provider; allowed keys are {', '.join(sorted(allowed))}")
    if "description" in t and not isinstance(t["description"], str):
        raise bad("description", "must be a string")
    common = {"name": name, "type": kind, "path": p, "description": t.get("description", "")}
    if kind in ("builtin", "replay"):
        return ProviderConfig(**common)

    def number(key: str, default: float, *, integer: bool = False, minimum: float = 0.0,
               strict: bool = True) -> Any:
        v = t.get(key, default)
        ok = isinstance(v, int if integer else (int, float)) and not isinstance(v, bool)
        if not ok or v < minimum or (strict and v == minimum):
            what = "an integer" if integer else "a number"
            raise bad(key, f"must be {what} {'>' if strict else '>='} {minimum:g}")
        return v

    model = t.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad("model", "required, a non-empty string (the model name the API expects)")
    key_env = t.get("api_key_env", _DEFAULT_KEY_ENV[kind])
    if not isinstance(key_env, str) or not _ENV_NAME.fullmatch(key_env):
        raise bad("api_key_env", "must be the NAME of an environment variable (never the key itself)")
    base_url = t.get("base_url")
    if base_url is not None and (not isinstance(base_url, str) or not base_url.startswith(("http://", "https://"))):
        raise bad("base_url", "must be an http:// or https:// URL, e.g. http://localhost:8000/v1")
    mtp = t.get("max_tokens_param")
    if mtp is not None and mtp not in ("max_tokens", "max_completion_tokens"):
        raise bad("max_tokens_param", "must be 'max_tokens' or 'max_completion_tokens'")
    prices_raw = t.get("prices", {})
    if not isinstance(prices_raw, dict):
        raise bad("prices", 'must be a table: "model" = { input = 3.0, output = 15.0 } (USD per million tokens)')
    prices = {}
    for m, pr in prices_raw.items():
        if not isinstance(pr, dict):
            raise bad(f"prices.{m}", "must be { input = USD per million input tokens, output = … }")
        unknown = sorted(set(pr) - _PRICE_KEYS)
        if unknown:
            raise bad(f"prices.{m}.{unknown[0]}", f"unknown key; allowed: {', '.join(sorted(_PRICE_KEYS))}")
        for k in ("input", "output"):
            if k not in pr:
                raise bad(f"prices.{m}.{k}", "required (USD per million tokens)")
        for k, v in pr.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise bad(f"prices.{m}.{k}", "must be a non-negative number (USD per million tokens)")
        prices[m] = Price(**{k: float(v) for k, v in pr.items()})
    return ProviderConfig(
        **common, model=model, api_key_env=key_env, base_url=base_url,
        max_tokens=number("max_tokens", 8192, integer=True), timeout_s=float(number("timeout_s", 300.0)),
        total_timeout_s=float(number("total_timeout_s", 900.0)),
        max_attempts=number("max_attempts", 5, integer=True, minimum=1, strict=False),
        concurrency=number("concurrency", 4, integer=True, minimum=1, strict=False),
        requests_per_minute=float(number("requests_per_minute", 0.0, strict=False)),
        prices=prices, max_tokens_param=mtp,
    )


def make_client(cfg: ProviderConfig, *, limiter: RateLimiter | None = None,
                retry: RetryPolicy | None = None) -> SDKClient:
    """The LLM client for an anthropic/openai provider config. Make one per provider and share it:
    its limiter is what bounds concurrency and requests per minute."""
    if not cfg.is_llm:
        raise UsageError(f"{cfg.path}: provider '{cfg.name}' is of type {cfg.type}, not an LLM; "
                         f"it is served by the {cfg.type} proposer, not an LLM client")
    limiter = limiter if limiter is not None else RateLimiter(cfg.concurrency, cfg.requests_per_minute)
    retry = retry if retry is not None else RetryPolicy(max_attempts=cfg.max_attempts,
                                                        total_timeout=cfg.total_timeout_s)
    common: dict[str, Any] = {
        "name": cfg.name, "api_key_env": cfg.api_key_env, "base_url": cfg.base_url,
        "max_tokens_default": cfg.max_tokens, "timeout_s": cfg.timeout_s, "prices": dict(cfg.prices),
        "limiter": limiter, "retry": retry,
    }
    if cfg.type == "anthropic":
        from engine.propose.providers.anthropic_client import AnthropicClient

        return AnthropicClient(cfg.model, **common)
    from engine.propose.providers.openai_client import OpenAIClient

    return OpenAIClient(cfg.model, max_tokens_param=cfg.max_tokens_param, **common)


def default_provider(env: Mapping[str, str] = os.environ) -> str:
    """'anthropic' if ANTHROPIC_API_KEY is set, else 'openai' if OPENAI_API_KEY is, else 'builtin'."""
    if env.get("ANTHROPIC_API_KEY"):
        return "anthropic"
    if env.get("OPENAI_API_KEY"):
        return "openai"
    return "builtin"
