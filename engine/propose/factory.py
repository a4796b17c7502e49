"""One door to every proposer `--provider NAME` can name: builtin, replay, and the LLM providers of
configs/providers.toml (`engine.propose.providers.config`).

    proposer = await make_proposer("anthropic")
    proposer = await make_proposer("replay", store=store, replay_run="run-3f9c0a1b2c3d")

Bad input is a UsageError of one line naming the flag and the fix (exit code 2).
"""

from __future__ import annotations

from pathlib import Path

from engine.errors import UsageError
from engine.propose.base import Proposer
from engine.propose.providers.config import (
    ProviderConfig,
    load_providers,
    make_client,
    shipped_providers_path,
)
from engine.store.store import Store

# Known without reading providers.toml: neither has settings.
_BUILTIN_TYPES = ("builtin", "replay")


def _user_config_hint() -> str:
    """Where the user config lives (docs/cli.md, 'The user config')."""
    import os

    base = os.environ.get("XDG_CONFIG_HOME") or "~/.config"
    return f"{base}/kforge/config.toml"


def provider_config(name: str, path: str | Path | None = None) -> ProviderConfig:
    """The validated config of `--provider NAME` (from the shipped providers.toml unless `path` is given)."""
    where = Path(path) if path is not None else shipped_providers_path()
    if name in _BUILTIN_TYPES:  # no settings to read: a broken providers.toml does not stop these
        return ProviderConfig(name=name, type=name, path=where)
    providers = load_providers(where)
    if name not in providers:
        add = (f"add a [{name}] table to {where}" if path is not None
               else f"add [providers.{name}] to your user config, {_user_config_hint()}")
        raise UsageError(f"--provider {name}: unknown provider; use one of "
                         f"{', '.join(sorted({*providers, *_BUILTIN_TYPES}))} (or {add})")
    return providers[name]


async def make_proposer(name: str, *, store: Store | None = None, replay_run: str | None = None,
                        resumed_run: str | None = None, providers_path: str | Path | None = None) -> Proposer:
    """The proposer for `--provider NAME`. A replay needs the workspace `store` and the `replay_run` to
    re-serve; `resumed_run` is the replay's own run when it is resumed (what it already got is not served again)."""
    cfg = provider_config(name, providers_path)
    if replay_run is not None and cfg.type != "replay":
        raise UsageError(f"--replay-run {replay_run}: only goes with --provider replay (not --provider {name})")
    if cfg.type == "builtin":
        from engine.propose.builtin import BuiltinProposer

        return BuiltinProposer()
    if cfg.type == "replay":
        return await _replay(name, store, replay_run, resumed_run)
    from engine.propose.llm import LLMProposer

    cfg.check_key()  # now, not as every proposal rejected later with the cause only in the database
    return LLMProposer(make_client(cfg), name=name, max_tokens=cfg.max_tokens)


async def _replay(name: str, store: Store | None, run_id: str | None, resumed_run: str | None) -> Proposer:
    from engine.propose.replay import ReplayProposer

    if store is None:
        raise ValueError("a replay proposer needs the workspace store")
    if not run_id:
        raise UsageError(f"--provider {name}: say which run to replay with --replay-run RUN "
                         f"(a run of this workspace; {_latest(await store.list_runs())})")
    if await store.get_run(run_id) is None:
        raise UsageError(f"--replay-run {run_id}: no such run in {store.db_path.parent} "
                         f"({_latest(await store.list_runs())})")
    proposer = ReplayProposer(store, run_id, resumed_run=resumed_run)
    if not await proposer.load() and resumed_run is None:
        raise UsageError(f"--replay-run {run_id}: that run recorded no candidates; replay a run that proposed some")
    return proposer


def _latest(runs: list[dict]) -> str:
    ids = [r["id"] for r in runs[:3]]
    return f"latest: {', '.join(ids)}" if ids else "it has no runs yet"
