"""`kforge-tui run CONFIG`: capture (or reuse) cards, measure eager, search, report. Headless."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.capture.hidden import hidden_shares
from engine.cards import card_from_row, foreign_op
from engine.errors import JobError, UsageError
from engine.outcomes import RUN_STOP_REASONS
from engine.progress import StageProgress
from engine.propose.base import Hardware
from engine.propose.factory import make_proposer, provider_config
from engine.propose.hardware_profiles import profile
from engine.propose.providers.config import ProviderConfig, default_provider
from engine.run.as_gpu import CPU_ONLY, gpu_row, gpu_shares
from engine.run.interrupt import (
    Interrupted,
    StopFlag,
    TerminatedStop,
    on_exit_now,
    run_again,
    run_interruptible,
    stopped_before_the_run,
)
from engine.run.orchestrator import Budgets, Orchestrator, RunTotals
from engine.run.plan import CardState, SchedulePolicy
from engine.run.report import Progress, print_final_table, run_document, running_elsewhere
from engine.run.store_recorder import StoreRecorder, load_records
from engine.search.tree import STRATEGIES, SearchParams
from engine.store import Store, db_path, new_id, samples_removed
from engine.userconfig import UserConfig, load_user_config


async def _cards_of(store: Store, workspace: Path, capture_id: str, *,
                    gpu: Hardware | None = None) -> list[CardState]:
    """The capture's cards; with `gpu` (a dry run on a CPU capture) as that GPU calls them: CUDA's outputs,
    shares from a roofline on it, CPU-only ops not proposed (engine.run.as_gpu)."""
    rows, why_not = [], {}
    for c in await store.get_cards(capture_id):
        if gpu is not None:
            converted = gpu_row(c)
            c = converted.row
            if converted.not_proposed:
                why_not[c["card_id"]] = converted.not_proposed
        rows.append(c)
    cards = [card_from_row(c) for c in rows]
    if gpu is not None:
        cards = gpu_shares(cards, gpu)
    cards = hidden_shares(cards)   # a hidden call's share: its part of its maker's, once eager was timed for it
    out = []
    for card in cards:
        samples = [str(workspace / s["path"]) for s in await store.get_samples(capture_id, card.card_id)]
        state = CardState(card, samples)
        why = why_not.get(card.card_id) or foreign_op(card.op, card.signature)
        if why:
            state.done_reason = "declined"
            state.note = why
        out.append(state)
    return out


async def _references(lane, store: Store, capture_id: str, cards: list[CardState], policy: SchedulePolicy,
                      proposer, cfg: dict[str, Any], stages: StageProgress, run_id: str) -> None:
    """After eager, each card's references, timed as eager is: the lane's copy of its bytes and (unless the
    run says compile_ref false) its eager under torch.compile; only for cards eager was timed for."""
    from engine.run.eager import COMPILE_BUDGET_S, COMPILE_TIMEOUT_S, measure_and_store_references
    from engine.run.plan import reference_budget, reference_order

    compile_ref = cfg.get("compile_ref", True)
    # Cards never given references, and (where this run times torch.compile) those whose compile reference an
    # earlier run's budget never reached: it kept a note and no time, and was not tried again until 2026-12-06b.
    todo = [c.ref for c in reference_order(
        [c for c in cards if c.eager_us is not None and c.ref.samples and c.share >= policy.min_share
         and proposer.supports(c.card)
         and ((c.card.copy_us is None and c.card.compile_us is None and c.card.compile_note is None)
              or (compile_ref and c.card.compile_untried))])]
    if not todo:
        return
    what = "the copy of its bytes" + (" and torch.compile" if compile_ref else "")
    budget = reference_budget(cfg.get("wall_s"), COMPILE_BUDGET_S)
    if compile_ref and budget < COMPILE_BUDGET_S:
        what += f" (torch.compile within {budget:.0f} s of the {cfg['wall_s']:.0f} s wall time)"
    await _stage(stages, store, run_id, "references", f"timing {what} for {len(todo)} card(s)")
    got = await measure_and_store_references(lane, store, capture_id, todo, compile=compile_ref, budget_s=budget,
                                             timeout_s=cfg.get("compile_ref_timeout") or COMPILE_TIMEOUT_S,
                                             progress=_card_progress(stages, "references", "references timed",
                                                                     store, run_id))
    compiled = sum(1 for r in got.values() if "median" in (r.get("compile") or {}))
    stages.done("references", f"references timed for {len(todo)} card(s)" +
                (f", torch.compile for {compiled}" if compile_ref else ", torch.compile skipped"))


async def _stage(stages: StageProgress, store: Store, run_id: str, stage: str, message: str,
                 **counts: int) -> None:
    """A step of the run before its search, on the terminal and as a 'stage' event in the run (the TUI's log
    shows it: eager timing and the references take minutes on a large model, with no candidate yet)."""
    if counts:
        stages.update(stage, message=message, **counts)
    else:
        stages.stage(stage, message)
    await store.add_event(run_id, "stage", {"stage": stage, "message": message, **counts})


def _card_progress(stages: StageProgress, stage: str, what: str, store: Store, run_id: str):
    """A per-card progress callback for the eager and reference stages: counts, and what the last card's
    parts took (its samples can be gigabytes; torch.compile of one op can take seconds)."""

    async def report(done: int, total: int, card: Any, seconds: dict[str, float]) -> None:
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
        await _stage(stages, store, run_id, stage,
                     f"{what} for {done}/{total} card(s); {card.op.split('::')[-1]}: {parts}",
                     completed=done, total=total)

    return report


def still_waiting(cards: list[CardState], run_id: str, workspace: Path, wall_s: float | None) -> str | None:
    """When the run's wall time left cards that a search would take unsearched: one line saying how many,
    how much of eager's time they hold (each call counted once) and how to search them (None when none)."""
    from engine.run.plan import count_chains_once

    waiting = [c for c in cards if c.done_reason is None and c.iterations == 0 and c.in_flight == 0]
    if not waiting:
        return None
    count_chains_once(cards)
    share = sum(c.own_share for c in waiting)
    more = f" --wall-time {wall_s:g}" if wall_s else ""
    return (f"the wall time ran out with {len(waiting)} card(s) never searched ({100 * share:.0f} % of eager's "
            f"time): {resume_hint(run_id, workspace)}{more} searches them")


def _config_gpu_dtype(path: str | None) -> str | None:
    """The dtype a run's config gives the model on CUDA (its [dtype] cuda), or None where unreadable now."""
    from engine.capture.signature import dtype_name
    from engine.config import load_config

    try:
        return dtype_name(load_config(path).dtype_for("cuda")) if path else None
    except Exception:  # noqa: BLE001 - a config moved or edited since the run began: nothing to say
        return None


def nothing_proposed(cards: list[CardState]) -> str:
    """One line saying why a run proposed nothing: how many cards stopped for each reason."""
    by: dict[str, int] = {}
    for c in cards:
        why = c.note or c.done_reason or "open"
        by[why] = by.get(why, 0) + 1
    if not cards:
        return "nothing proposed: the capture has no cards (the model's forward ran no op worth a kernel)"
    parts = ", ".join(f"{n} {why}" for why, n in sorted(by.items(), key=lambda kv: -kv[1]))
    return f"nothing proposed: of {len(cards)} card(s), {parts}"


async def _start_lanes(count: int):
    from engine.lane.client import GpuLane, LaneUnavailable, worker_argv

    lanes = []
    for i in range(count):
        lane = GpuLane(worker_argv(i), name=f"lane{i}", timeout_s=120)
        try:
            await lane.start()
        except LaneUnavailable as e:
            raise JobError(str(e)) from None
        lanes.append(lane)
    return lanes


def resume_hint(run_id: str, workspace: Path, *, dry: bool = False) -> str:
    """The command that continues a run (a dry run is resumed as one)."""
    return f"kforge-tui run --resume {run_id}{' --dry-run' if dry else ''} --workspace {workspace}"


@dataclass(frozen=True)
class RunSettings:
    """A run's settings after precedence: CLI flag > the model config's [run] table > user config > default.
    `source` says where each came from ('cli', 'run config', 'user config', 'default')."""

    provider: str
    model: str | None
    base_url: str | None
    iterations: int
    strategy: str
    wall_s: float | None
    max_proposals: int
    max_cost_usd: float | None
    max_tokens: int | None
    ops: str | None = None
    source: dict[str, str] = field(default_factory=dict)


# setting -> (CLI attribute, [run] key, user config attribute or None, default)
_SETTINGS: dict[str, tuple[str, str, str | None, Any]] = {
    "provider": ("provider", "provider", "default_provider", None),
    "model": ("model", "model", None, None),
    "base_url": ("base_url", "base_url", None, None),
    "iterations": ("iterations", "iterations", None, 50),
    "strategy": ("strategy", "strategy", None, "mcts"),
    "wall_s": ("wall_time", "wall_time", None, None),
    "max_proposals": ("max_proposals", "max_proposals", None, 4),
    "max_cost_usd": ("max_cost", "max_cost", "max_cost_usd", None),
    "max_tokens": ("max_tokens", "max_tokens", "max_tokens", None),
    "ops": ("ops", "ops", None, None),
}


def resolve_settings(args: argparse.Namespace, run_table: dict[str, Any], user: UserConfig) -> RunSettings:
    """Each setting from the first layer that gives it: CLI, [run] of the model config, user config, default."""
    values: dict[str, Any] = {}
    source: dict[str, str] = {}
    for name, (flag, key, user_attr, default) in _SETTINGS.items():
        for where, value in (("cli", getattr(args, flag, None)), ("run config", run_table.get(key)),
                             ("user config", getattr(user, user_attr) if user_attr else None),
                             ("default", default)):
            if value is not None:
                values[name], source[name] = value, where
                break
        else:
            values[name], source[name] = None, "default"
    if values["provider"] is None:
        values["provider"] = default_provider()
    return RunSettings(**values, source=source)


def settings_of(args: argparse.Namespace) -> RunSettings:
    """`run`'s settings for a new run (CONFIG given); bad values anywhere are a UsageError naming them."""
    from engine.config import load_config

    run_table = dict(load_config(args.config, small=args.small).run) if args.config else {}
    return resolve_settings(args, run_table, load_user_config())


def provider_for(name: str, model: str | None, base_url: str | None,
                 user: UserConfig | None = None) -> ProviderConfig:
    """The provider `name` with the user config's entry and then --model / --base-url over it."""
    import dataclasses

    from engine.propose.providers.base import Price

    user = user if user is not None else load_user_config()
    mine = user.providers.get(name)
    try:
        cfg = provider_config(name)
    except UsageError:
        if mine is None or mine.type is None:
            raise
        cfg = ProviderConfig(name=name, type=mine.type, path=user.path,
                             api_key_env={"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}.get(mine.type))
    if mine is not None:
        changes: dict[str, Any] = {k: getattr(mine, k) for k in ("model", "base_url", "api_key_env")
                                   if getattr(mine, k) is not None}
        if mine.prices:
            changes["prices"] = {**cfg.prices, **{m: Price(**p) for m, p in mine.prices.items()}}
        cfg = dataclasses.replace(cfg, **changes)
    if (model or base_url) and not cfg.is_llm:
        flag = "--model" if model else "--base-url"
        raise UsageError(f"{flag}: provider {name} is no LLM ({cfg.type}); give it with --provider anthropic, "
                         f"openai or an LLM provider of your config")
    cfg = dataclasses.replace(cfg, **({"model": model} if model else {}), **({"base_url": base_url} if base_url else {}))
    if cfg.is_llm and not cfg.model:
        raise UsageError(f"{user.path}: key 'providers.{name}.model': required for an LLM provider "
                         f"(or give --model NAME)")
    return cfg


async def _proposer(name: str, model: str | None, base_url: str | None, *, store: Store,
                    replay_run: str | None = None, resumed_run: str | None = None):
    """make_proposer, except that an LLM provider gets the user config's and the CLI's overrides."""
    cfg = provider_for(name, model, base_url)
    if not cfg.is_llm:
        return await make_proposer(name, store=store, replay_run=replay_run, resumed_run=resumed_run)
    if replay_run is not None:
        raise UsageError(f"--replay-run {replay_run}: only goes with --provider replay (not --provider {name})")
    from engine.propose.llm import LLMProposer
    from engine.propose.providers.config import make_client

    cfg.check_key()
    return LLMProposer(make_client(cfg), name=name, max_tokens=cfg.max_tokens)


def _ray_of(args: argparse.Namespace) -> str | None:
    """'local', a cluster address, or None (local lanes) from --ray / --ray-address."""
    address = getattr(args, "ray_address", None)
    if address and not getattr(args, "ray", False):
        raise UsageError(f"--ray-address {address}: it names the cluster for --ray; add --ray")
    return (address or "local") if getattr(args, "ray", False) else None


async def run_async(args: argparse.Namespace, workspace: Path,
                    stop: StopFlag | None = None, started: float | None = None) -> tuple[int, dict[str, Any]]:
    """The whole run. With a `stop` flag (Ctrl-C): the search stops through Orchestrator.interrupt, any
    other phase by cancellation; either way the run row says 'stopped' (interrupted) and Interrupted
    carries the one line to show."""
    import torch

    stop = stop or StopFlag()
    dry = bool(args.dry_run)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    started = time.monotonic() if started is None else started
    no_gpu = UsageError("run: no CUDA GPU is visible; use --dry-run to capture, propose and compile only")
    if not args.resume and not dry and gpus == 0 and not _ray_of(args):
        raise no_gpu  # before the workspace is touched
    store = await Store.open(db_path(workspace))
    run = await store.get_run(args.resume) if args.resume else None
    if args.resume and run is None:   # before the GPU's absence: the run named is what is wrong
        await store.close()
        raise _no_such_run(args, workspace)
    if run is not None and not dry and gpus == 0:
        # A dry run resumed where there is no GPU stays a dry run; on a GPU it is evaluated for real
        # (prepare on a laptop, verify and time on the GPU box).
        dry = bool((run.get("config") or {}).get("dry_run"))
    if not dry and gpus == 0 and not (_ray_of(args) or (run is not None and run["config"].get("ray"))):
        await store.close()
        raise no_gpu
    stages = StageProgress(json_lines=True if args.json else None)
    async with store:
        ids: dict[str, str] = {}
        try:
            code, doc = await _run_in(store, args, workspace, stop, ids, dry, gpus, stages, started)
        except asyncio.CancelledError:
            if "run" not in ids:
                said = _stopped_before_the_run(ids, args, workspace, dry, stop.terminated)
                raise (TerminatedStop(said) if stop.terminated else Interrupted(said)) from None
            await _mark_interrupted(store, ids["run"])
            code, doc = 130, {}
        finally:
            stages.close()
            on_exit_now(None)
        if code == 130:
            if stop.terminated:
                raise TerminatedStop(f"terminated: run {ids['run']} stopped (resumable): "
                                     f"{resume_hint(ids['run'], workspace, dry=dry)}")
            raise Interrupted(f"interrupted: run {ids['run']} stopped (resumable): "
                              f"{resume_hint(ids['run'], workspace, dry=dry)}")
        return code, doc


def _stopped_before_the_run(ids: dict[str, str], args: argparse.Namespace, workspace: Path, dry: bool,
                            terminated: bool) -> str:
    """The line for a run stopped before its row was made: what became of the capture (`ids`: "capture" once
    one is stored or reused, "capturing" once this run began one) and how to go on."""
    word = "terminated" if terminated else "interrupted"
    if args.resume:   # stopped before the resumed run's row was claimed: it is as it was
        return stopped_before_the_run(args, workspace, word, dry=dry)
    again = run_again(args, workspace, dry=dry)
    if "capture" in ids:
        how = "captured and stored whole" if ids.get("capturing") else "reused"
        return (f"{word}: stopped before the run was created, nothing to resume; capture {ids['capture']} "
                f"({how}) is kept: '{again}' starts a run on it")
    if ids.get("capturing"):
        return (f"{word}: stopped during the capture, before the run was created: the capture is discarded, "
                f"nothing was kept; '{again}' captures again")
    return stopped_before_the_run(args, workspace, word, dry=dry)


def mark_stopped_now(db: Path, run_id: str, timeout_s: float = 6.0) -> None:
    """The run row as 'stopped' (interrupted), written synchronously: what the second Ctrl-C does before it
    exits without cleanup, so the run is not left 'running' with a dead pid (it stays resumable). The write
    lock is taken up front (BEGIN IMMEDIATE, so the busy timeout applies) and a busy database is tried
    again until `timeout_s`: the run's own store may be writing at that moment."""
    import sqlite3

    end = time.monotonic() + timeout_s
    while True:
        conn = sqlite3.connect(db, timeout=max(0.1, end - time.monotonic()), isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE runs SET status = 'stopped', stopped_by = 'interrupted', updated_at = ? "
                         "WHERE id = ? AND status IN ('created', 'running', 'paused')", (time.time(), run_id))
            conn.execute("COMMIT")
            return
        except sqlite3.OperationalError:
            if time.monotonic() >= end:
                raise
            time.sleep(0.05)
        finally:
            conn.close()


async def _mark_interrupted(store: Store, run_id: str) -> None:
    """The row of a run stopped outside the search (capture done, lanes or eager timing): not 'running'."""
    try:
        await store.update_run(run_id, status="stopped", stopped_by="interrupted")
        await store.add_event(run_id, "run_finished", {"stopped_by": "interrupted"})
    except Exception:  # noqa: BLE001 - a store cut off mid-write: --resume still works (as after a crash)
        pass


async def _check_ops_match(store: Store, capture_id: str, pattern: str, config: str) -> None:
    """`--ops` (or `[run] ops`) that selects no card of the capture is bad input, said before a run is made:
    a run of nothing said "done (stopped by iterations)" with exit 0."""
    from engine.cards import card_from_row, card_selected, chain_ops

    cards = [card_from_row(c) for c in await store.get_cards(capture_id)]
    if any(card_selected(c.op, c.chain, c.signature_text, pattern) for c in cards):
        return
    ops = sorted({c.op for c in cards if c.chain is None} | {o for c in cards for o in chain_ops(c.chain, c.signature_text)})
    shown = ", ".join(ops[:12]) + (f" and {len(ops) - 12} more" if len(ops) > 12 else "")
    raise UsageError(f"--ops {pattern!r}: matches no card of {Path(config).name}'s capture; its cards' ops are "
                     f"{shown or 'none'} (and 'chain', 'module', 'pattern' for chain cards)")


# What a resumed run takes from the command line: its budgets (CLI attribute -> the run config's key). `--wall-time S`
# counts from the resume; --iterations, --max-cost and --max-tokens are the run's in all (its cards' evaluations, its
# cost and tokens so far count).
RESUME_BUDGETS = {"wall_time": ("--wall-time", "wall_s"), "iterations": ("--iterations", "iterations"),
                  "max_proposals": ("--max-proposals", "max_proposals"), "max_cost": ("--max-cost", "max_cost_usd"),
                  "max_tokens": ("--max-tokens", "max_tokens"),
                  "compile_ref_timeout": ("--compile-ref-timeout", "compile_ref_timeout")}
# What a resumed run keeps from its start: given again with the same value it is accepted, another is refused.
RESUME_KEPT = {"provider": ("--provider", None), "model": ("--model", "model"), "base_url": ("--base-url", "base_url"),
               "strategy": ("--strategy", "strategy"), "ops": ("--ops", "ops"), "replay_run": ("--replay-run", "replay_run")}


def resumed_config(args: argparse.Namespace, run: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A resumed run's config: the one it started with, with the budgets given on this command line over it; and
    one line per budget changed. A flag that would change what is searched or who proposes, to a value other than
    the run's, is a UsageError: that is another run."""
    cfg = dict(run["config"])
    for attr, (flag, key) in RESUME_KEPT.items():
        given = getattr(args, attr, None)
        had = run["provider"] if key is None else cfg.get(key)
        if attr == "strategy":
            had = had or "mcts"
        if given is not None and given != had:
            was = f"'{had}'" if had is not None else "none"
            raise UsageError(f"{flag} {given}: run {run['id']} was started with {was}, and a resumed run keeps it; "
                             f"leave {flag} out to resume, or start a new run with kforge-tui run CONFIG {flag} {given}")
    changes = []
    for attr, (flag, key) in RESUME_BUDGETS.items():
        given = getattr(args, attr, None)
        if given is None or given == cfg.get(key):
            continue
        was = f"{cfg[key]:g}" if cfg.get(key) is not None else "none"
        what = " (counted from now)" if attr == "wall_time" else ""
        changes.append(f"resuming {run['id']} with {flag} {given:g}{what}; it was started with {was}")
        cfg[key] = given
    return cfg, changes


def _no_such_run(args: argparse.Namespace, workspace: Path) -> UsageError:
    return UsageError(f"--resume {args.resume}: no such run in {workspace} (`kforge-tui runs` lists them)")


async def _run_in(store: Store, args: argparse.Namespace, workspace: Path, stop: StopFlag, ids: dict[str, str],
                  dry: bool, gpus: int, stages: StageProgress, started: float) -> tuple[int, dict[str, Any]]:
    if args.resume:
        run = await store.get_run(args.resume)
        if run is None:
            raise _no_such_run(args, workspace)
        capture_id, provider, cfg = run["capture_id"], run["provider"], run["config"]
        capture = await store.get_capture(capture_id)
        gone = samples_removed(capture)
        if gone and not await store.count_samples(capture_id):   # every card would be skipped: no-samples
            again = shlex.join(["kforge-tui", "run", cfg.get("config") or "CONFIG"]
                               + (["--small"] if capture and capture["small"] else []))
            raise UsageError(f"--resume {run['id']}: the samples of its capture {capture_id} were {gone}, and a run "
                             f"verifies every kernel on them; start a new run with '{again}' (it captures again)")
        held = None if getattr(args, "takeover", False) else running_elsewhere(run, workspace)
        if held is not None:
            raise held
        run_id = run["id"]
        started_cfg = cfg
        cfg, changes = resumed_config(args, run)
        proposer = await _proposer(provider, cfg.get("model"), cfg.get("base_url"), store=store,
                                   replay_run=cfg.get("replay_run"), resumed_run=run_id)
        cfg = {**cfg, "host": socket.gethostname()}   # the process running it now (`runs` checks it is alive)
        # Claimed only from the row judged free: of two resumes at once, one gets it and the other is refused.
        if not await store.claim_run(run_id, run, status="running", pid=os.getpid(), config=cfg):
            now = await store.get_run(run_id)
            raise running_elsewhere(now, workspace) or UsageError(
                f"--resume {run_id}: another process resumed the run as this one began; `kforge-tui runs` shows it")
        ids["run"] = run_id   # from here a stop marks the run stopped (not before: it may be another process's)
        for line in changes:
            print(f"kforge: {line}", file=sys.stderr)
            await store.add_event(run_id, "run_note", {"message": line})
    else:
        settings = settings_of(args)
        provider = settings.provider
        # Bad --provider or --replay-run is bad input: say so before capturing anything.
        proposer = await _proposer(provider, settings.model, settings.base_url, store=store,
                                   replay_run=args.replay_run)
        if args.replay_run:
            await _check_replay(store, args)
        capture_id = await _capture_for(store, args, workspace, stop, stages, ids)
        if settings.ops:
            await _check_ops_match(store, capture_id, settings.ops, args.config)
        cfg = {"config": str(Path(args.config).resolve()), "iterations": settings.iterations,
               "strategy": settings.strategy, "dry_run": dry, "wall_s": settings.wall_s,
               "max_proposals": settings.max_proposals, "model": settings.model, "base_url": settings.base_url,
               "max_cost_usd": settings.max_cost_usd, "max_tokens": settings.max_tokens, "ops": settings.ops,
               "compile_ref": not getattr(args, "no_compile_ref", False)}
        if getattr(args, "compile_ref_timeout", None):
            cfg["compile_ref_timeout"] = args.compile_ref_timeout
        if args.replay_run:
            cfg["replay_run"] = args.replay_run  # so that --resume replays the same run
        if getattr(args, "gpu", None):
            cfg["gpu"] = args.gpu  # so that --resume prepares for the same GPU
        if _ray_of(args):
            cfg["ray"] = _ray_of(args)  # so that --resume runs on the same lanes
        cfg["host"] = socket.gethostname()   # with the pid: `runs` can tell a run whose process is gone
        capture = await store.get_capture(capture_id)
        run = await store.create_run(capture_id, capture["model"], provider, cfg, pid=os.getpid())
        run_id = ids["run"] = run["id"]
    on_exit_now(lambda: mark_stopped_now(db_path(workspace), run_id))  # a second Ctrl-C exits at once
    capture = await store.get_capture(capture_id)
    warnings = capture_warnings(capture)
    for w in warnings:
        print(f"kforge: warning: {w}", file=sys.stderr)
        if not args.resume:   # the TUI's event log shows it (a run attached to sees no stderr)
            await store.add_event(run_id, "run_note", {"message": f"warning: {w}"})
    target = profile(cfg.get("gpu") or "h200") if dry and capture["device"] == "cpu" else None
    cards = await _cards_of(store, workspace, capture_id, gpu=target)
    if target is not None:
        cpu_only = sorted({c.ref.op for c in cards if c.note == CPU_ONLY})
        print(f"kforge: dry run on a CPU capture: proposing for the {target.name}'s calls (CUDA's outputs, "
              f"shares from a roofline on it)" + (f"; not proposed, cpu-only op: the GPU runs a different op: "
                                                  f"{', '.join(cpu_only)}" if cpu_only else ""), file=sys.stderr)
        gpu_dtype = _config_gpu_dtype(cfg.get("config"))
        if gpu_dtype and gpu_dtype != capture["dtype"]:
            print(f"kforge: warning: the capture is {capture['dtype']} and the config runs the model in {gpu_dtype} "
                  f"on the GPU ([dtype] cuda): these kernels are for {capture['dtype']} cards, which the GPU will "
                  f"not call; set [dtype] cpu = \"{gpu_dtype}\" to prepare the GPU's own", file=sys.stderr)
    recorder = StoreRecorder(store, run_id, progress=stop.quiet(Progress(stages, dry=dry)))
    lanes, pool, ray_lanes = [], None, None
    # Cards named by --ops are searched whatever their share: the user chose them (a module card's share is
    # its GPU time; in a host-bound model its gain is mostly the launches it saves).
    policy = SchedulePolicy(min_share=0.0) if cfg.get("ops") else SchedulePolicy()
    ray = _ray_of(args) or cfg.get("ray")
    ray_address = None if ray in (None, "local") else ray
    try:
        from engine.compile import CompilePool, Compiler, default_cache_dir

        if ray and dry:
            from engine.run.evaluators import start_ray_evaluator

            hardware = profile(cfg.get("gpu") or "h200")
            stages.stage("lanes", "starting compile lanes on Ray")
            evaluate = await start_ray_evaluator(ray_address, dry=True, arch=hardware.arch,
                                                 cache_dir=str(default_cache_dir(workspace)))
            ray_lanes = evaluate.lanes
            stages.done("lanes", f"{len(ray_lanes.names())} Ray compile lane(s) ready")
            await recorder.event("lanes", {"lanes": ray_lanes.names(), "hosts": ray_lanes.by_host()})
        elif ray:
            from engine.run.evaluators import start_ray_evaluator

            stages.stage("lanes", "starting GPU lanes on Ray")
            evaluate = await start_ray_evaluator(ray_address, dry=False, arch="sm_90")
            ray_lanes = evaluate.lanes
            first = ray_lanes.lanes[0]
            hello = (await first.request("hello")).payload
            stages.done("lanes", f"{len(ray_lanes.names())} Ray GPU lane(s) ready{_contention_note(hello)}")
            await recorder.event("lanes", {"lanes": ray_lanes.names(), "hosts": ray_lanes.by_host()})
            hardware = Hardware.from_hello(hello)
            evaluate.compiler = Compiler(default_cache_dir(workspace), "nvrtc", arch=hardware.arch)
            evaluate.pool = pool = CompilePool()
            eager_lane = first
        elif dry:
            from engine.run.evaluators import CompileOnlyEvaluator

            hardware = profile(cfg.get("gpu") or "h200")
            compiler = Compiler(default_cache_dir(workspace), "nvrtc", arch=hardware.arch)
            pool = CompilePool()
            evaluate = CompileOnlyEvaluator(compiler, pool)
        else:
            from engine.run.evaluators import LaneEvaluator

            stages.stage("lanes", f"starting {gpus} GPU lane(s)")
            lanes = await _start_lanes(gpus)
            hello = (await lanes[0].request("hello")).payload
            stages.done("lanes", f"{len(lanes)} lane(s) ready{_contention_note(hello)}")
            await recorder.event("lanes", {"lanes": [lane.name for lane in lanes]})  # for idle/busy views
            hardware = Hardware.from_hello(hello)
            compiler = Compiler(default_cache_dir(workspace), "nvrtc", arch=hardware.arch)
            pool = CompilePool()
            evaluate = LaneEvaluator(lanes, compiler, pool)
            eager_lane = lanes[0]
        from engine.cards import card_selected

        def selected(card) -> bool:  # run --ops: the cards searched (the rest are skipped, never timed)
            return card_selected(card.op, card.chain, card.signature_text, cfg.get("ops"))

        if not dry:
            from engine.run.eager import measure_and_store_eager

            # Eager timing only where it can matter: cards the proposer takes and above the share
            # noise floor (the rest are skipped anyway; on SD3.5 that is half the cards).
            todo = [c.ref for c in cards if c.eager_us is None and c.ref.samples and selected(c.card)
                    and c.share >= policy.min_share and not c.note and proposer.supports(c.card)]
            if todo:
                await _stage(stages, store, run_id, "eager", f"timing eager PyTorch for {len(todo)} card(s)")
                await measure_and_store_eager(eager_lane, store, capture_id, todo,
                                              progress=_card_progress(stages, "eager", "eager timed", store, run_id))
                stages.done("eager", f"eager timed for {len(todo)} card(s)")
                cards = await _cards_of(store, workspace, capture_id)
            await _references(eager_lane, store, capture_id, cards, policy, proposer, cfg, stages, run_id)
            cards = await _cards_of(store, workspace, capture_id)
        for c in cards:
            if not selected(c.card):
                c.done_reason = "not-selected"
            elif not proposer.supports(c.card):
                c.done_reason = "declined"
        records = await load_records(store, run_id)
        totals = RunTotals(run.get("tokens_in", 0), run.get("tokens_out", 0), run.get("cost_usd", 0.0))
        # --wall-time counts the whole run: the search gets what capture and eager timing left of it.
        wall_s = cfg.get("wall_s")
        before_search_s = time.monotonic() - started
        left = None if wall_s is None else max(0.0, wall_s - before_search_s)
        budgets = Budgets(iterations_per_card=cfg.get("iterations") or 50, wall_s=left,
                          tokens=cfg.get("max_tokens"), cost_usd=cfg.get("max_cost_usd"))
        o = Orchestrator(cards=cards, proposer=proposer, evaluate=evaluate, recorder=recorder,
                         new_id=lambda: new_id("cand"), hardware=hardware,
                         strategy=cfg.get("strategy") or "mcts", params=SearchParams(), budgets=budgets,
                         policy=policy, max_proposals=cfg.get("max_proposals") or 4, totals=totals)
        recorder.orchestrator = o
        stop.on_stop(o.interrupt)  # from here Ctrl-C stops the search, not the task
        done = {e["card_id"]: e["payload"].get("reason") or "done"
                for e in await store.events_since(run_id, 0) if e["kind"] == "card_done" and e["card_id"]}
        if args.resume and (cfg.get("iterations") or 50) > (started_cfg.get("iterations") or 50):
            # --iterations raised on resume: the cards that had reached the old cap are searched on to the new one
            done = {card: why for card, why in done.items() if why != "iterations"}
        resume = o.restore(records, done, redo_compiled=not dry)
        try:
            stopped_by = await o.run(resume)
        finally:
            stop.on_stop(None)
    finally:
        # The lanes per host as they stood at the end (`--json`'s "lanes"; Ray lanes are named host/gpuN).
        if ray_lanes is not None:
            try:
                hosts = ray_lanes.by_host()
            except Exception:  # noqa: BLE001 - a cluster gone at the end must not stop the lanes' closing
                hosts = {}
        else:
            hosts = {socket.gethostname(): [lane.name for lane in lanes]} if lanes else {}
        for lane in lanes:
            await lane.close()
        if ray_lanes is not None:
            await ray_lanes.close()
        if pool is not None:
            pool.close()
    if stopped_by == "interrupted":
        return 130, {}
    status = (await store.get_run(run_id))["status"]
    doc = run_document(run_id, status, o)
    doc["lanes"] = {"hosts": hosts, "ray": ray_lanes is not None}
    if warnings:
        doc["capture_warnings"] = warnings
    notes = {c.card_id: c.note for c in cards if c.note}
    for entry in doc["cards"]:
        if entry["id"] in notes:
            entry["note"] = notes[entry["id"]]
    if o.totals.proposals == 0 and not o.records:
        doc["nothing_proposed"] = nothing_proposed(list(o.cards.values()))
        if stopped_by == "wall_time" and wall_s is not None and left is not None and left < 1.0:
            # The whole --wall-time went to capture and timing: say so, and how much would leave a search.
            doc["nothing_proposed"] += (f"; the --wall-time of {wall_s:g} s was spent before the search began "
                                        f"({before_search_s:.0f} s on capture, eager and reference timing): "
                                        f"give it more, e.g. --wall-time {math.ceil(before_search_s) + 120}")
        print(f"kforge: {doc['nothing_proposed']}", file=sys.stderr)
        # The TUI's overview shows it in its event log (a run attached to sees no stderr).
        await store.add_event(run_id, "run_note", {"message": doc["nothing_proposed"]})
    elif stopped_by == "wall_time":
        waiting = still_waiting(list(o.cards.values()), run_id, workspace, wall_s)
        if waiting:
            doc["still_waiting"] = waiting
            print(f"kforge: {waiting}", file=sys.stderr)
            await store.add_event(run_id, "run_note", {"message": waiting})
    return (0 if stopped_by in RUN_STOP_REASONS else 1), doc


# The capture's notes that say export's whole-model check cannot vouch for a cast of this model as it is built: a
# run searches for hours (and spends an LLM's tokens) before that check refuses it, so the run says them first.
MODEL_CHECK_NOTES = ("model output", "repeatable", "calls")


def capture_warnings(capture: dict[str, Any] | None) -> list[str]:
    """The capture's notes that a run says on its start (MODEL_CHECK_NOTES), each as one line."""
    notes = (capture or {}).get("notes") or {}
    return [f"the capture of {capture['model']} notes ({key}): {notes[key]}"
            for key in MODEL_CHECK_NOTES if isinstance(notes, dict) and isinstance(notes.get(key), str)]


async def _check_replay(store: Store, args: argparse.Namespace) -> None:
    """A replay serves recorded answers by card: the recorded run must be of the same model."""
    from engine.config import load_config

    model = load_config(args.config, small=args.small).name
    source = await store.get_run(args.replay_run)
    if source is not None and source["model"] != model:
        raise UsageError(f"--replay-run {args.replay_run}: that run optimised {source['model']}, not {model}; "
                         f"give {source['model']}'s config to replay it")


async def _capture_for(store: Store, args: argparse.Namespace, workspace: Path, stop: StopFlag,
                       stages: StageProgress, ids: dict[str, str]) -> str:
    """Reuse the newest capture with samples of the same config identity (TOML, builder source and the local modules
    it imports: `config._identity`), size and `--device` where given, else capture now.
    `ids` gets "capturing" when a capture begins and "capture" once one is reused or stored (a stop says so)."""
    from engine.config import load_config

    config = load_config(args.config, small=args.small)
    for cap in await store.list_captures(config.name):
        if cap["config_sha256"] == config.sha256 and bool(cap["small"]) == bool(args.small) and \
                (args.device is None or cap["device"] == args.device):
            if config.samples and not await store.count_samples(cap["id"]):
                continue   # a `capture --samples 0` one: a run on it could verify nothing (every card no-samples)
            ids["capture"] = cap["id"]
            return cap["id"]
    from engine.capture.store import capture_into

    stages.stage("capture", f"capturing {config.name}")
    ids["capturing"] = config.name
    result = await capture_into(store, config, args.device, workspace, samples=None,
                                progress=stop.quiet(stages.sink("capture")),
                                on_stored=lambda capture_id: ids.__setitem__("capture", capture_id))
    stages.done("capture", f"{config.name}: captured")
    return result.capture_id


def check_run_args(args: argparse.Namespace) -> None:
    """Bad `run` input as one UsageError before any work (before the TUI starts the engine, too)."""
    if args.config is None and not args.resume:
        raise UsageError("run: give a model CONFIG (e.g. configs/models/resnet50.toml) or --resume RUN")
    if args.config is not None and args.resume:
        raise UsageError(f"run: give a CONFIG or --resume {args.resume}, not both "
                         f"(a resumed run keeps the config it started with)")
    if getattr(args, "takeover", False) and not args.resume:
        raise UsageError("--takeover: goes with --resume RUN (a new run belongs to no other process)")
    _ray_of(args)  # --ray-address without --ray: refused here, not in a detached engine's log
    if getattr(args, "ray", False):
        import importlib.util

        from engine.lane.ray_lanes import INSTALL_HINT

        if importlib.util.find_spec("ray") is None:
            raise UsageError(f"--ray: Ray is not installed; {INSTALL_HINT}")
    if getattr(args, "gpu", None):
        from engine.propose.hardware_profiles import profile

        if not args.dry_run:
            raise UsageError(f"--gpu {args.gpu}: a run on a GPU uses that GPU; --gpu names the target of a "
                             "--dry-run only")
        profile(args.gpu)  # an unknown name: UsageError naming the valid ones
    if args.resume:  # a resumed run keeps its settings, read from the workspace; make_proposer checks them
        if args.strategy is not None and args.strategy not in STRATEGIES:
            raise UsageError(f"--strategy {args.strategy}: use one of {', '.join(STRATEGIES)}")
        return
    s = settings_of(args)
    from engine.config import load_config

    config = load_config(args.config, small=args.small)
    if config.samples == 0:   # every card would end 'no-samples': a run that proposed nothing and said done
        raise UsageError(f"{config.path}: key 'capture.samples': 0 keeps no input samples, and a run verifies every "
                         "kernel on them; set it to 1 or more (default 3), or leave it out")
    if s.strategy not in STRATEGIES:
        where = "--strategy" if s.source["strategy"] == "cli" else f"{args.config}: key 'run.strategy'"
        raise UsageError(f"{where} {s.strategy}: use one of {', '.join(STRATEGIES)}")
    try:
        provider_for(s.provider, s.model, s.base_url).check_key()
    except UsageError as e:
        # A provider the config's [run] or the user config named: the line named a --provider never given.
        flag = f"--provider {s.provider}:"
        where = {"run config": f"{args.config}: key 'run.provider'",
                 "user config": f"{load_user_config().path}: key 'default_provider'"}.get(s.source["provider"])
        if where is None or not str(e).startswith(flag):
            raise
        raise UsageError(f"{where} {s.provider}:{str(e)[len(flag):]}") from None


def cmd_run(args: argparse.Namespace, workspace: Path) -> int:
    """Entry from the CLI: run headless, print the final table (or --json document)."""
    t0 = time.perf_counter()
    started = time.monotonic()  # --wall-time counts from here
    check_run_args(args)
    from engine.progress import json_stdout

    args.run_began = True   # from here a stop says what became of the run (before, engine.cli says it)
    with json_stdout(args.json):  # the model's prints go to stderr: stdout is the one JSON document
        code, doc = run_interruptible(lambda stop: run_async(args, workspace, stop, started),
                                      interrupted=_stopped_before_the_run({}, args, workspace, False, False))
    doc["wall_s"] = round(time.perf_counter() - t0, 3)
    if args.json:
        print(json.dumps(doc, separators=(",", ":"), default=str))
    else:
        print_final_table(doc)
    failed_at_provider = provider_never_answered(doc, workspace)
    if failed_at_provider and code == 0:
        # Not a finished search: the run never got one answer (a wrong --base-url or model, a server down).
        print(f"error: run {doc['run']}: every proposal failed in the provider call, none was answered "
              f"({failed_at_provider}); check the provider's base URL, model and key, then start the run "
              "again", file=sys.stderr)
        return 1
    return code


def provider_never_answered(doc: dict[str, Any], workspace: Path) -> str | None:
    """The first provider error of a run whose every candidate failed in the provider call (None
    otherwise, and for a run that made no proposal)."""
    cards = doc.get("cards") or []
    made = sum(c.get("candidates") or 0 for c in cards)
    at_provider = sum((c.get("failures") or {}).get("provider", 0) for c in cards)
    if not made or at_provider != made:
        return None
    from engine.store import open_readonly

    try:
        conn = open_readonly(db_path(workspace))
        try:
            row = conn.execute("SELECT error FROM candidates WHERE run_id = ? AND category = 'provider' "
                               "ORDER BY created_at LIMIT 1", (doc["run"],)).fetchone()
        finally:
            conn.close()
    except Exception:  # noqa: BLE001 - the line is said without the example
        row = None
    return (row[0] if row and row[0] else "no error recorded").splitlines()[0]


def _contention_note(hello: dict) -> str:
    """What the lanes line adds where the worker found no stream that runs beside the candidate's
    (engine.lane.worker.pick_side_stream): the busy runs then spread the candidate's blocks out (one per SM, in
    waves) with no other work beside them."""
    if hello.get("contention") is False:
        return ("; no stream ran beside the candidate's on this GPU: busy runs spread its blocks one per SM "
                "instead (races between blocks not resident together show; races with other work do not)")
    return ""
