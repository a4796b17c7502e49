"""Export a run's winners: select, compile, package a candidate cast, confirm it in a fresh process,
and write the final cast with only the variants the confirmation kept.

`package` is a pure function (variants + environment -> manifest, files, report), testable on a CPU;
`export_run` is the whole job and needs the GPU the cast is for.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.cards import chain_ops
from engine.cast.format import (
    CHAIN_OP,
    FORMAT,
    FORMAT_VERSION,
    CastError,
    check_manifest,
    file_entry,
    write_cast,
)
from engine.errors import JobError, KforgeError
from engine.export.checkpoint import FOLDER, Checkpoints, digest, file_digest, source_digest
from engine.export.confirm import CONFIRMED_KEYS
from engine.export.report import markdown_report
from engine.outcomes import faster_with_confidence


@dataclass
class ExportVariant:
    """One winner to package: its card, its candidate, its compiled images and its evidence."""

    card: dict[str, Any]           # store row: card_id, op, signature, signature_text, outputs, calls, share
    candidate: dict[str, Any]      # store row: id, source, launch_spec, proposer, speedup, …
    cubin: bytes | None
    ptx: str | None
    arch: str
    samples: list[str] = field(default_factory=list)
    confirmed: dict[str, Any] | None = None
    sanitizer: dict[str, Any] | None = None  # `export --sanitize`: the compute-sanitizer tools it passed
    targets: list[str] | None = None  # the targets (eager, cuda-graphs, compile…) whose whole-model check kept it
    extra_cubins: dict[str, bytes] = field(default_factory=dict)  # `export --also-arch`: compiled, not proven
    inductor: str | None = None  # why the run's references say Inductor's own code is as fast in context

    @property
    def vid(self) -> str:
        return f"{_short_op(self.card['op'])}-{self.card['card_id'][:8]}"


def _short_op(op: str) -> str:
    return op.split("::", 1)[-1].replace(".", "_")[:40]


def _kernels(spec: Any) -> list[str]:
    from engine.launch import parse_spec

    return list(dict.fromkeys(ln.kernel for ln in parse_spec(spec).launches))


def _tolerances(op: str, outputs: list[dict[str, Any]], signature: dict[str, Any] | None = None) -> list[str]:
    from engine.verify.tolerance import card_family, tolerance_for

    family = card_family(op, signature)
    return [tolerance_for(op, o["dtype"], family=family).describe() for o in outputs]


# What a module card's `chain` record may say about how the cast finds and feeds the module
# (engine.cast.format: the `module` entry; engine.cast.modules.module_binding makes args/params).
_MODULE_KEYS = ("class", "class_path", "paths", "args", "params", "autocast", "training", "states", "returns", "held")


def _chain_of(card: Any) -> dict[str, Any] | None:
    """A chain card's `chain` record (kind 'module' or 'pattern', and for a module its class and paths):
    from a store row or an OperatorCard."""
    chain = card.get("chain") if isinstance(card, dict) else getattr(card, "chain", None)
    if isinstance(chain, str) and chain:  # a store row holds it as JSON text (schema v4)
        try:
            chain = json.loads(chain)
        except ValueError:
            return None
    return chain if isinstance(chain, dict) else None


def _only_compiled(card: dict[str, Any]) -> bool:
    """A pattern card's variant: it runs only where torch.compile replaces its chain (never in eager)."""
    return card["op"] == CHAIN_OP and "pattern" in _chain_entries(card)


def _chain_entries(card: dict[str, Any]) -> dict[str, Any]:
    """The manifest keys a chain card's variant adds: `chain` (its kind) and, for a module card, the
    `module` entry the loader patches the module's forward by."""
    if card["op"] != CHAIN_OP:
        return {}
    chain = _chain_of(card) or {}
    kind = chain.get("kind", "pattern")
    if kind == "module" and not all(k in chain for k in ("class", "paths", "args")):
        # The capture could not bind the module's forward to the chain (engine.capture.chain_cards: keyword
        # arguments, instances that bind differently; or a card captured before it recorded bindings):
        # without the binding the loader cannot serve the module, so it ships as a pattern.
        kind = "pattern"
    # Its member ops, views left out: what `audit` and the report name the variant by.
    out: dict[str, Any] = {"chain": {"kind": kind, "ops": chain_ops(chain, card.get("signature_text") or "")}}
    if kind == "module":
        out["module"] = {k: chain[k] for k in _MODULE_KEYS if k in chain}
    else:  # replaced inside compiled graphs (engine.cast.patterns)
        out["pattern"] = {}
    return out


def format_problem(v: ExportVariant, env: dict[str, Any], source: dict[str, Any]) -> str | None:
    """Why the cast format refuses this variant's entry (e.g. a chain kind no loader reads yet), else None."""
    manifest, _, _ = package([v], env, source)
    try:
        check_manifest(manifest)
    except CastError as e:
        return str(e).removeprefix("manifest.json: ")
    return None


def package(variants: list[ExportVariant], env: dict[str, Any], source: dict[str, Any],
            excluded: list[dict[str, Any]] | None = None, created: str | None = None
            ) -> tuple[dict[str, Any], dict[str, bytes], str]:
    """Manifest, kernel files and report for these variants (no GPU, no I/O)."""
    files: dict[str, bytes] = {}
    entries = []
    for v in variants:
        vid, c = v.vid, v.candidate
        vf: dict[str, Any] = {}
        if v.cubin:
            name = f"kernels/{vid}.{v.arch}.cubin"
            files[name] = v.cubin
            vf["cubin"] = file_entry(name, v.cubin, arch=v.arch)
        for arch, image in sorted(v.extra_cubins.items()):  # for other GPUs: compiled here, proven there
            name = f"kernels/{vid}.{arch}.cubin"
            files[name] = image
            vf[f"cubin:{arch}"] = {**file_entry(name, image, arch=arch), "proven": False}
        if v.ptx:
            name = f"kernels/{vid}.ptx"
            data = v.ptx.encode()
            files[name] = data
            vf["ptx"] = file_entry(name, data)
        name = f"kernels/{vid}.cu"
        files[name] = c["source"].encode()
        vf["source"] = file_entry(name, files[name])
        lane = {"speedup": c.get("speedup"), "speedup_ci": [c.get("speedup_low"), c.get("speedup_high")],
                "eager_us": c.get("eager_us"), "cast_us": c.get("best_us"), "timing": c.get("timing"),
                # The card's references, timed in the lane as eager is (absent where not measured).
                **{k: v.card[k] for k in ("compile_us", "copy_us") if v.card.get(k) is not None}}
        entries.append({
            "id": vid, "card_id": v.card["card_id"], "op": v.card["op"], "signature": v.card["signature"],
            "signature_text": v.card.get("signature_text", ""), "outputs": v.card["outputs"],
            "launch_spec": c["launch_spec"], "kernels": _kernels(c["launch_spec"]), "files": vf,
            "category": "custom CUDA",
            "tolerance": _tolerances(v.card["op"], v.card["outputs"], v.card["signature"]),
            "calls": v.card.get("calls"), "share": v.card.get("share"), **_chain_entries(v.card),
            **({"targets": list(v.targets)} if v.targets is not None else {}),
            "evidence": {"lane": lane, "confirmed": v.confirmed,
                         **({"sanitizer": v.sanitizer} if v.sanitizer is not None else {})},
            "provenance": {"run": source.get("run"), "candidate_id": c.get("id"), "parent_id": c.get("parent_id"),
                           "proposer": c.get("proposer"), "model_name": c.get("model_name"),
                           "llm_call_id": c.get("llm_call_id"), "intent": c.get("intent"),
                           "params": c.get("params"), "created_at": c.get("created_at")},
        })
    import engine

    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "kforge": engine.__version__,
                "created": created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "env": env, "source": source, "variants": entries}
    return manifest, files, markdown_report(manifest, excluded)


# ------------------------------------------------------------------------------------------ the job


@dataclass
class ExportResult:
    out: Path | None
    included: list[dict[str, Any]]
    excluded: list[dict[str, Any]]
    # What the user must hear even with stderr redirected and --json: the cast was written, but the whole
    # model is not faster with confidence, or was not checked at all.
    warnings: list[str] = field(default_factory=list)
    # The whole-model check as the cast's report records it: mode, speedup, speedup_ci, rel_l2_err, tried.
    model_check: dict[str, Any] | None = None
    # The whole-model check per target (`--target`), as the manifest's `source.model_checks`.
    model_checks: dict[str, Any] | None = None
    # The targets asked but not checked (the export was interrupted after others finished): the cast is partial.
    unchecked: list[str] = field(default_factory=list)
    # `export --graph-routes`: the manifest's `source.graph_routes` (the class chosen, or what was tried).
    graph_routes: dict[str, Any] | None = None
    # `export --layout-routes`: the manifest's `source.layout_routes` (the class chosen, or what was tried).
    layout_routes: dict[str, Any] | None = None
    # Where the export has a compile target and an SDPA card that could qualify (has_attention): the
    # manifest's `source.attention_routes`.
    attention_routes: dict[str, Any] | None = None


EXIT_PARTIAL = 75  # a partial cast was written (sysexits' EX_TEMPFAIL: the same command again finishes it)


class NothingKept(JobError):
    """No variant made it into the cast (none faster, none confirmed, none kept by a whole-model check): where
    graph routes may be tried, the export tries them alone before it gives up (`_routes_only`)."""


class ExportPartial(KforgeError):
    """The export was interrupted during its whole-model checks after some target kept variants: the cast is
    written with the finished targets only (`result`); the same export again checks only the others."""

    exit_code = EXIT_PARTIAL

    def __init__(self, result: ExportResult, run_id: str, targets: list[str], checkpoints: Path) -> None:
        self.result, self.run_id, self.targets = result, run_id, targets
        done = [t for t in targets if t not in result.unchecked]
        routes = [t for t in result.unchecked if t not in targets]   # 'graph routes', 'layout routes'
        proven = f"proven for {', '.join(done)}" + ("" if len(done) == len(targets) else " only") + (
            f", without {' or '.join(routes)}" if routes else "")
        super().__init__(f"interrupted: wrote a partial cast {result.out}, {proven}; "
                         f"not checked: {', '.join(result.unchecked)}; the same export again checks only those "
                         f"(the finished checks are kept in {checkpoints})")


def select_winners(cards: list[dict[str, Any]], candidates: list[dict[str, Any]]
                   ) -> tuple[list[tuple[dict, dict]], list[dict[str, Any]]]:
    """Per card the fastest verified candidate whose lane CI lower bound is above 1; and why others not."""
    by_card: dict[str, list[dict]] = {}
    for c in candidates:
        by_card.setdefault(c["card_id"], []).append(c)
    chosen, excluded = [], []
    for card in cards:
        cands = by_card.get(card["card_id"], [])
        good = [c for c in cands if c["status"] == "verified" and c.get("best_us") and
                faster_with_confidence((c.get("speedup_low"), c.get("speedup_high")))]
        if good:
            chosen.append((card, min(good, key=lambda c: c["best_us"])))
        elif cands:
            verified = [c for c in cands if c["status"] == "verified"]
            why = ("no verified candidate" if not verified else
                   "no verified candidate faster with confidence (CI lower bound ≤ 1)")
            excluded.append({"card_id": card["card_id"], "op": card["op"], "reason": why})
    return chosen, excluded


def _load_run(workspace: Path, run_id: str | None):
    """The run (its capture row added), its cards, candidates and sample paths, read without writing: export needs
    only to read the workspace, which may be read-only (another user's, an archived run); its `exports` row is
    written at the end where the workspace takes it (_record), and where not export warns."""
    from engine.store import db_path, open_readonly
    from engine.store import read as store_read

    conn = open_readonly(db_path(workspace))
    try:
        run = store_read.run(conn, run_id) if run_id is not None else store_read.latest_run(conn)
        if run is None:
            return None, [], [], {}
        run = {**run, "capture_row": store_read.capture(conn, run["capture_id"])}
        cards = store_read.cards_of_capture(conn, run["capture_id"])
        cands = store_read.candidates(conn, run["id"])
        samples = {c["card_id"]: [str(workspace / p) for p in store_read.sample_paths(conn, run["capture_id"],
                                                                                       c["card_id"])] for c in cards}
        return run, cards, cands, samples
    finally:
        conn.close()


TARGETS = ("eager", "cuda-graphs", "compile", "compile:max-autotune-no-cudagraphs", "compile:reduce-overhead")


def parse_targets(text: str) -> list[str]:
    """`--target` as a list: names from TARGETS separated by commas, or 'all'; UsageError otherwise."""
    from engine.errors import UsageError

    names = list(TARGETS) if text.strip() == "all" else [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in TARGETS]
    if bad or not names:
        raise UsageError(f"--target {text}: use one or more of {', '.join(TARGETS)} (comma-separated), or all")
    return list(dict.fromkeys(names))


@dataclass
class ExportLog:
    """What an export has done so far, for its row in the store (`exports`, written once when it ends)."""

    out: Path
    targets: list[str]
    options: dict[str, Any]
    started_at: float = field(default_factory=time.time)
    run_id: str | None = None  # set once the run is resolved: an export refused before that is not recorded
    env: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)  # the manifest's `source`, model checks included
    excluded: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)  # ids of the variants the whole-model check started from
    kept: list[ExportVariant] = field(default_factory=list)  # the variants in the written cast
    cast_sha256: str | None = None  # set only once the cast is on disk
    unchecked: list[str] = field(default_factory=list)  # targets an interruption left unchecked (a partial cast)
    config: str | None = None  # the run's model config (its path), once the run is resolved
    small: bool = False        # the run's capture was of the --small build
    convolutional: bool = False  # the run has a convolution card: layout routes are worth a check
    attention: bool = False  # an SDPA card that could qualify (has_attention): worth a check under compile targets


def export_run(workspace: Path, run_id: str | None, out: Path, *, timing: dict[str, Any] | None = None,
               progress: Callable[[str], None] = lambda m: None, model_check: bool = True,
               cuda_graphs: bool = False, sanitize: bool = False,
               sanitize_timeout_s: float | None = None, targets: list[str] | None = None,
               also_archs: list[str] | None = None, fresh: bool = False,
               graph_routes: bool = False, layout_routes: bool = False) -> ExportResult:
    """The whole export; raises engine.errors.UsageError / JobError with a one-line reason. `sanitize`: run
    compute-sanitizer (memcheck, racecheck, synccheck) on each confirmed variant and drop any it faults,
    `sanitize_timeout_s` per variant and tool (default 300). `targets` (TARGETS; default eager, or
    cuda-graphs with `cuda_graphs`): the whole-model check runs once per target, and a variant is kept
    where some target's check keeps it; the manifest says which targets each variant was proven for.
    `also_archs` (e.g. ['sm_121']): each kept kernel is also compiled for these GPUs and shipped as an
    unproven cubin, which a loader there uses only after `audit --verify` and `load(…, unproven_ok=True)`.
    `graph_routes`: where the cast is kept for eager, also try graph routes on the model's repeated classes
    (engine.export.graph_check) and record the first class whose routes make the model faster with
    confidence, with an output equal bit for bit; a cast's install with the model then routes it.
    `layout_routes`: likewise, where the run's model ran convolutions, try running its convolutional modules
    channels-last (engine.export.layout_check) and record the first class that makes the model faster with
    confidence with an output that agrees with eager's.

    The confirmation and each target's whole-model check are checkpointed in the workspace (engine.export.
    checkpoint) and reused by a later export with the same inputs, unless `fresh`. Interrupted (Ctrl-C, or
    SIGTERM where the caller raises it as KeyboardInterrupt) during the checks of several targets after one
    kept variants, it writes the cast of the finished targets and raises ExportPartial.

    Once the run is resolved, the export is recorded in the workspace when it ends (`exports`): written,
    failed (with why) or interrupted, in one row written in one transaction."""
    targets = list(targets or ["cuda-graphs" if cuda_graphs else "eager"])
    log = ExportLog(out, targets, {"model_check": model_check, "sanitize": sanitize,
                                   "also_archs": list(also_archs or []), "fresh": fresh,
                                   **({"graph_routes": True} if graph_routes else {}),
                                   **({"layout_routes": True} if layout_routes else {})})
    try:
        result = _export_run(workspace, run_id, out, log, timing=timing, progress=progress,
                             model_check=model_check, sanitize=sanitize, sanitize_timeout_s=sanitize_timeout_s,
                             also_archs=also_archs, fresh=fresh, graph_routes=graph_routes,
                             layout_routes=layout_routes)
    except KeyboardInterrupt:
        # Written means written: a Ctrl-C after the cast was on disk does not undo it.
        _record(workspace, log, "written" if log.cast_sha256 else "interrupted",
                None if log.cast_sha256 else "interrupted (Ctrl-C or SIGTERM) before the cast was written")
        raise
    except BaseException as e:
        _record(workspace, log, "written" if log.cast_sha256 else "failed", None if log.cast_sha256 else
                str(e) or type(e).__name__)
        raise
    why = _record(workspace, log, "written", None)
    if why:
        result.warnings.append(why)
    if result.unchecked:
        raise ExportPartial(result, str(log.run_id), targets, workspace / FOLDER)
    return result


def export_record(log: ExportLog, status: str, error: str | None) -> dict[str, Any]:
    """The `exports` row of an export as `log` holds it (pure: the tests build it without a GPU)."""
    checks_by_target = log.source.get("model_checks") or {}
    overall = log.source.get("model_check")  # the one check that stands for every target (none, failed)
    in_cast = log.kept if status == "written" else []
    checks = []
    for t in log.targets:
        check = checks_by_target.get(t) if checks_by_target else overall
        if check is None and not log.options.get("model_check", True):
            check = {"mode": "none", "reason": "--no-model-check"}
        kept = [v.vid for v in in_cast if v.targets is None or t in v.targets]
        dropped = [{"id": vid, "reason": _dropped_reason(vid, check)} for vid in log.checked if vid not in kept]
        checks.append({"target": t, **(check or {"mode": "not reached"}), "kept": kept, "dropped": dropped})
    variants = [{"id": v.vid, "op": v.card["op"], "card_id": v.card["card_id"], "targets": v.targets,
                 **{k: (v.confirmed or {}).get(k) for k in ("speedup", "speedup_ci", "net_us")}} for v in in_cast]
    return {"run_id": log.run_id, "started_at": log.started_at, "finished_at": time.time(), "status": status,
            "out_path": str(Path(log.out).absolute()), "cast_sha256": log.cast_sha256 if status == "written" else None,
            "targets": list(log.targets), "checks": checks, "variants": variants, "excluded": list(log.excluded),
            "warnings": list(log.warnings), "options": dict(log.options),
            "env": {k: log.env.get(k) for k in ("gpu", "arch", "torch", "cuda") if k in log.env},
            "error": error}


def _dropped_reason(vid: str, check: dict[str, Any] | None) -> str:
    """Why a target's whole-model check did not keep a variant that entered it."""
    if not check or (check.get("speedup") is None and not check.get("tried") and not check.get("refused")):
        return "the check did not run to the end"
    if check.get("refused"):
        return str(check["refused"])
    with_it = [t for t in check.get("tried") or [] if vid in (t.get("variants") or [])]
    if not with_it:
        return "in no variant set the check tried"
    try:
        smallest = tried_summary(with_it[-1])
    except (KeyError, TypeError, IndexError):
        smallest = f"{len(with_it[-1].get('variants') or [])} variant(s)"
    return f"the model was slower (or its output rejected) with every set that held it; the smallest: {smallest}"


def _record(workspace: Path, log: ExportLog, status: str, error: str | None) -> str | None:
    """Write the export's row; None when written, else why not (the export's own outcome stands)."""
    if log.run_id is None:
        return None
    row = export_record(log, status, error)

    async def write() -> None:
        from engine.store import Store, db_path

        async with await Store.open(db_path(workspace)) as store:
            await store.add_export(row)
    try:
        asyncio.run(write())
    except Exception as e:  # a locked or read-only workspace must not turn a written cast into an error
        return f"the export was not recorded in the workspace ({type(e).__name__}: {e})"
    return None


def _export_run(workspace: Path, run_id: str | None, out: Path, log: ExportLog, *, timing: dict[str, Any] | None,
                progress: Callable[[str], None], model_check: bool, sanitize: bool,
                sanitize_timeout_s: float | None, also_archs: list[str] | None, fresh: bool,
                graph_routes: bool = False, layout_routes: bool = False) -> ExportResult:
    try:
        return _export_variants(workspace, run_id, out, log, timing=timing, progress=progress,
                                model_check=model_check, sanitize=sanitize, sanitize_timeout_s=sanitize_timeout_s,
                                also_archs=also_archs, fresh=fresh, graph_routes=graph_routes,
                                layout_routes=layout_routes)
    except NothingKept as e:
        layouts = layout_routes and log.convolutional and bool({"eager", "cuda-graphs"} & set(log.targets))
        attention = compile_modes(log.targets) if log.attention else []
        if not ((graph_routes and "eager" in log.targets or layouts or attention) and model_check and log.config
                and Path(log.config).is_file()):
            raise
        return _routes_only(out, log, e, progress, graph_routes and "eager" in log.targets, layouts, attention)


def compile_modes(targets: list[str]) -> list[str]:
    """The torch.compile modes among export targets ('compile' is the default mode)."""
    return [t.partition(":")[2] or "default" for t in targets if t == "compile" or t.startswith("compile:")]


def _routes_only(out: Path, log: ExportLog, why: NothingKept, progress: Callable[[str], None],
                 graph_routes: bool = True, layout_routes: bool = False,
                 attention_modes: list[str] | None = None) -> ExportResult:
    """A cast of routes alone, where no variant was kept: a convolutional model may still gain from running its
    convolutions channels-last, a host-bound one from having its layers (or its whole forward) replayed from
    CUDA graphs. Written only where a check keeps a class (faster with confidence; the layout's output agreeing
    with eager's, the graphs' equal bit for bit); otherwise `why` is raised, with what was tried."""
    from engine.export.report import attention_routes_text, graph_routes_text, layout_routes_text

    progress(f"{why}: trying routes alone")
    source, warnings = log.source, log.warnings
    said = []
    if layout_routes:
        layouts = _layout_routes_check([], log.env, source, log.config, log.small, progress, warnings.append)
        if layouts.get("classes"):
            source["layout_routes"] = layouts
        said.append(layout_routes_text({"layout_routes": layouts}))
    routes: dict[str, Any] = {}
    if graph_routes:
        routes = _graph_routes_check([], log.env, source, log.config, log.small, progress, warnings.append)
        if routes.get("classes"):
            source["graph_routes"] = routes
        said.append(graph_routes_text({"graph_routes": routes}))
    if attention_modes:
        att = _attention_routes_check([], log.env, source, log.config, log.small, attention_modes, progress,
                                      warnings.append)
        if att.get("targets"):
            source["attention_routes"] = att
        said.append(attention_routes_text({"attention_routes": att}))
    if not routes.get("classes") and not (source.get("layout_routes") or {}).get("classes") \
            and not (source.get("attention_routes") or {}).get("targets"):
        raise NothingKept("; ".join([str(why)] + [s for s in said if s])) from why
    manifest, files, report = package([], log.env, source, log.excluded)
    log.kept = []
    data = write_cast(out, manifest, files, report)
    log.cast_sha256 = hashlib.sha256(data).hexdigest()
    return ExportResult(out, [], log.excluded, warnings, source.get("model_check"), source.get("model_checks"),
                        list(log.unchecked), source.get("graph_routes"), source.get("layout_routes"),
                        source.get("attention_routes"))


def _export_variants(workspace: Path, run_id: str | None, out: Path, log: ExportLog, *,
                     timing: dict[str, Any] | None, progress: Callable[[str], None], model_check: bool,
                     sanitize: bool, sanitize_timeout_s: float | None, also_archs: list[str] | None, fresh: bool,
                     graph_routes: bool = False, layout_routes: bool = False) -> ExportResult:
    import torch

    from engine.cast.compat import current_env
    from engine.compile import Compiler, default_cache_dir
    from engine.errors import JobError, UsageError

    sanitizer = None
    if sanitize:  # before any work: a missing tool is the user's to fix
        from engine.export.sanitize import require_sanitizer

        sanitizer = require_sanitizer()
    from engine.store import db_path, samples_removed

    found = _load_run(workspace, run_id) if db_path(workspace).is_file() else (None, [], [], {})
    run, cards, cands, samples = found
    if run is None and not db_path(workspace).is_file():   # a mistyped --workspace, or another folder's .kforge/
        raise UsageError(f"export: no Kernel Forge workspace at {workspace} (no runs there): give the --workspace DIR "
                         "the run was made in, or export from the folder whose .kforge/ holds it")
    if run is None:   # said first (no workspace made): a wrong run id is the input to fix, on any machine
        raise UsageError(f"export: {'no run ' + repr(run_id) if run_id else 'no runs'} in {workspace}")
    if (run.get("config") or {}).get("dry_run"):
        raise UsageError(f"export: run {run['id']} is a dry run (proposed and compiled, nothing verified or "
                         f"timed): resume it on a GPU first (kforge-tui run --resume {run['id']})")
    if not torch.cuda.is_available():
        raise UsageError("export: no CUDA GPU is visible; a cast's speedups are confirmed on the GPU it is for")
    log.run_id = run["id"]
    env = log.env = current_env()
    cap = run.get("capture_row") or {}
    log.config, log.small = cap.get("config_path"), bool(cap.get("small"))
    from engine.capture.twins import CONVOLUTIONS

    log.convolutional = any(c.get("op") in CONVOLUTIONS for c in cards)
    log.attention = has_attention(cards)
    gone = samples_removed(cap)
    if gone and not any(samples.values()):
        log.warnings.append(f"the samples of capture {run['capture_id']} were {gone}: each variant is confirmed on "
                            "inputs synthesised from its card's signature instead of the captured ones")
    log.source.update({"run": run["id"], "model": run["model"], "provider": run["provider"],
                       "capture": run["capture_id"]})
    chosen, excluded = select_winners(cards, cands)
    log.excluded = excluded
    if not chosen:
        raise NothingKept(f"export: run {run['id']} has no verified candidate faster than eager with confidence; "
                          "nothing to export")
    compiler = Compiler(default_cache_dir(workspace), "nvrtc", arch=env["arch"])
    variants = []
    warnings = log.warnings
    for card, cand in chosen:
        res = compiler.compile(cand["source"])
        if not res.ok:
            excluded.append({"card_id": card["card_id"], "op": card["op"],
                             "reason": f"does not compile for {env['arch']}: {res.summary()}"})
            continue
        v = ExportVariant(card, cand, res.cubin, res.ptx, env["arch"], samples.get(card["card_id"], []))
        for arch in also_archs or []:
            if arch == env["arch"]:
                continue
            extra = Compiler(default_cache_dir(workspace), "nvrtc", arch=arch).compile(cand["source"])
            if extra.ok and extra.cubin:
                v.extra_cubins[arch] = extra.cubin
            else:
                warnings.append(f"{card['op']} {card['card_id'][:8]}: does not compile for {arch} "
                                      f"({extra.summary()}); the cast carries no cubin for it")
        why = format_problem(v, env, {})
        if why:
            excluded.append({"card_id": card["card_id"], "op": card["op"], "reason": f"the cast format: {why}"})
            continue
        variants.append(v)
    as_fast = inductor_as_fast(variants, cards)
    for v in variants:
        v.inductor = as_fast.get(v.vid)
    checkpoints = Checkpoints(workspace / FOLDER, {"run": run["id"], "env": {
        k: env.get(k) for k in ("gpu", "arch", "torch", "cuda", "driver", "nvrtc")}, "kforge": source_digest()},
        fresh=fresh)
    source = log.source
    variants = one_per_call(variants, excluded, progress)
    if model_check and log.config and Path(log.config).is_file():
        variants = _only_where_they_serve(variants, log.targets, excluded, progress)
    results = _confirmation(variants, env, source, timing or {}, checkpoints, progress)
    kept = []
    for v in variants:
        r = results.get(v.vid, {})
        if r.get("ok"):
            v.confirmed = {k: r.get(k) for k in CONFIRMED_KEYS}
            v.confirmed["gpu"] = r.get("gpu")
            kept.append(v)
        else:
            excluded.append({"card_id": v.card["card_id"], "op": v.card["op"],
                             "reason": "fresh-process confirmation: " + str(r.get("reason", "no result"))})
        progress(f"{v.vid}: {'kept' if r.get('ok') else 'left out'} "
                 f"({r.get('speedup', float('nan')):.2f}x)" if r.get("speedup") else f"{v.vid}: {r.get('reason')}")
    if not kept:
        raise NothingKept(f"export: no variant kept its speedup through the public op in a fresh process "
                          f"({len(variants)} tried); nothing written")
    if sanitizer is not None:
        n, before = len(kept), len(excluded)
        kept = sanitize_kept(kept, env, source, excluded, sanitizer, sanitize_timeout_s, progress, warnings.append)
        if not kept:
            why = "; ".join(e["reason"] for e in excluded[before:][:3])
            raise NothingKept(f"export: compute-sanitizer left out every confirmed variant ({n} tried: {why}); "
                              "nothing written")
    config = log.config
    targets = log.targets
    if model_check and config and Path(config).is_file():
        log.checked = [v.vid for v in kept]
    if model_check and config and Path(config).is_file() and len(targets) == 1:
        try:
            kept = _target_check(kept, env, source, excluded, config, bool(cap.get("small")), targets[0], progress,
                                 warnings.append, checkpoints)
        except JobError as e:  # the check refused every set: the record says so for its target
            source["model_checks"] = {targets[0]: {**(source.get("model_check") or {"mode": targets[0]}),
                                                   "refused": str(e)}}
            raise
        for v in kept:
            v.targets = list(targets)
        source["model_checks"] = {targets[0]: source.get("model_check")}
    elif model_check and config and Path(config).is_file():
        kept = _model_checks(kept, env, source, excluded, config, bool(cap.get("small")), targets, progress,
                             warnings.append, checkpoints=checkpoints, unchecked=log.unchecked)
    elif model_check:
        warnings.append(f"no whole-model check: the run's config {config!r} is not readable here")
        source["model_check"] = {"mode": "none", "reason": f"config {config!r} not readable at export"}
    def optional(what: str, check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """A route check, which only adds to a cast whose targets are checked: interrupted (Ctrl-C, or a time
        limit's SIGINT: the SD3.5 VAE's export lost its four finished targets in its graph-route check, H100
        2026-12-05g), the cast is written without those routes, as a partial cast the same export finishes."""
        if log.unchecked:   # interrupted already (a target's check, or a route check): this one is not started
            return {"classes": [], "interrupted": "not reached: the export was interrupted"}
        try:
            return check()
        except KeyboardInterrupt:
            log.unchecked.append(what)
            progress(f"{what}: interrupted; the cast is written without them")
            return {"classes": [], "interrupted": "interrupted (Ctrl-C or SIGTERM) before its check ended"}

    if layout_routes and log.convolutional and model_check and config and Path(config).is_file() \
            and any(t in (v.targets or []) for v in kept for t in ("eager", "cuda-graphs")):
        source["layout_routes"] = optional("layout routes", lambda: _layout_routes_check(
            kept, env, source, config, bool(cap.get("small")), progress, warnings.append))
    modes = compile_modes(targets)
    if modes and model_check and config and Path(config).is_file() and log.attention:
        source["attention_routes"] = optional("attention routes", lambda: _attention_routes_check(
            kept, env, source, config, bool(cap.get("small")), modes, progress, warnings.append))
    if graph_routes and model_check and config and Path(config).is_file() \
            and any("eager" in (v.targets or []) for v in kept):
        why = gpu_bound(source.get("model_checks"))
        if why:
            progress(f"graph routes: {why}")
            source["graph_routes"] = {"classes": [], "skipped": why}
        else:
            source["graph_routes"] = optional("graph routes", lambda: _graph_routes_check(
                kept, env, source, config, bool(cap.get("small")), progress, warnings.append))
    if checkpoints.not_written:
        warnings.append(checkpoints.not_written)
    manifest, files, report = package(kept, env, source, excluded)
    log.kept = kept
    data = write_cast(out, manifest, files, report)
    log.cast_sha256 = hashlib.sha256(data).hexdigest()
    return ExportResult(out, [{"id": v.vid, "op": v.card["op"], **(v.confirmed or {}), "targets": v.targets}
                              for v in kept], excluded, warnings, source.get("model_check"),
                        source.get("model_checks"), list(log.unchecked), source.get("graph_routes"),
                        source.get("layout_routes"), source.get("attention_routes"))


def _confirmation(variants: list[ExportVariant], env: dict[str, Any], source: dict[str, Any], timing: dict[str, Any],
                  checkpoints: Checkpoints, progress: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Each variant's fresh-process confirmation (its result, with the GPU it ran on as "gpu"): reused from its own
    checkpoint where one holds the same variant, samples and timing, else run, all the rest in one fresh process
    (every variant installed, as in use), each checkpointed as the process finishes it: an export stopped part way
    (Ctrl-C, a time limit) keeps the variants it confirmed. (Until 2026-12-06b one checkpoint held them all, and
    an export stopped after confirming 26 of 27 variants in 146 s confirmed all 27 again.)"""
    keys = {v.vid: checkpoints.key(timing=timing, variant={**_variant_key(v), "samples": [[s, _size(s)]
                                                                                           for s in v.samples]})
            for v in variants}
    results: dict[str, dict[str, Any]] = {}
    stamps = []
    for v in variants:
        done = checkpoints.load("confirm", keys[v.vid])
        if done is not None:
            results[v.vid] = done["result"]
            stamps.append(done["at"])
    if stamps:
        progress(f"the fresh-process confirmation of {len(stamps)} of {len(variants)} variant(s) reused "
                 f"(checkpoints of {min(stamps)}" + (f" to {max(stamps)}" if max(stamps) != min(stamps) else "")
                 + f" in {FOLDER})")
    todo = [v.vid for v in variants if v.vid not in results]
    if not todo:
        return results
    progress(f"confirming {len(todo)} variant(s) in a fresh process")

    def finished(vid: str, r: dict[str, Any], child_env: dict[str, Any]) -> None:
        if vid in results or vid not in keys:
            return
        results[vid] = {**r, "gpu": child_env.get("gpu")}
        checkpoints.save("confirm", keys[vid], results[vid])
        n = sum(1 for x in todo if x in results)
        progress(f"confirmed {n}/{len(todo)}: {vid} " + (f"({r['speedup']:.2f}x)" if r.get("speedup") else
                                                          f"left out ({r.get('reason', 'no result')})"))

    with tempfile.TemporaryDirectory(prefix="kforge-export-") as tmp:
        cand_path = Path(tmp) / "candidate.cast"
        manifest, files, report = package(variants, env, source)
        write_cast(cand_path, manifest, files, report)
        doc = run_confirm(cand_path, {v.vid: v.samples for v in variants if v.vid in todo}, timing, Path(tmp),
                          only=todo if len(todo) < len(variants) else None, on_variant=finished)
    for vid, r in doc.get("variants", {}).items():   # what the process finished and no poll saw
        finished(vid, r, doc.get("env") or {})
    return results


def _variant_key(v: ExportVariant) -> dict[str, Any]:
    """A variant as a checkpoint's key holds it: its id, card and candidate, and digests of its code."""
    c = v.candidate
    return {"id": v.vid, "card_id": v.card["card_id"], "op": v.card["op"], "candidate_id": c.get("id"),
            "source": digest(c["source"]), "launch_spec": digest(json.dumps(c["launch_spec"], sort_keys=True,
                                                                            default=str)),
            "cubin": digest(v.cubin) if v.cubin else None, "ptx": digest(v.ptx) if v.ptx else None}


def _size(path: str) -> int | None:
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def sanitize_kept(kept: list[ExportVariant], env: dict[str, Any], source: dict[str, Any], excluded: list[dict],
                  sanitizer: str, timeout_s: float | None, progress: Callable[[str], None],
                  warn: Callable[[str], None] = lambda m: None) -> list[ExportVariant]:
    """compute-sanitizer on each kept variant, running its own samples: the variants it finds no fault in
    (their evidence says which tools passed); the others go to `excluded` with the finding."""
    from engine.export import sanitize

    timeout_s = timeout_s or sanitize.TIMEOUT_S
    progress(f"compute-sanitizer ({', '.join(sanitize.TOOLS)}) on {len(kept)} variant(s), "
             f"up to {timeout_s:g} s per tool and variant")
    clean = []
    with tempfile.TemporaryDirectory(prefix="kforge-sanitize-") as tmp:
        cand = Path(tmp) / "candidate.cast"
        manifest, files, report = package(kept, env, source)
        write_cast(cand, manifest, files, report)
        for v in kept:
            r = sanitize.check_variant(sanitizer, cand, v.vid, _kernels(v.candidate["launch_spec"]), v.samples,
                                       Path(tmp), _child_env(), timeout_s, progress=progress)
            for w in r["warnings"]:
                warn(f"{v.vid}: {w}")
            if r["ok"]:
                v.sanitizer = {"tools": r["tools"], "inputs": "captured samples" if v.samples else
                               "synthesised from the signature"}
                clean.append(v)
            else:
                excluded.append({"card_id": v.card["card_id"], "op": v.card["op"], "reason": r["reason"]})
            progress(f"{v.vid}: {'no fault found' if r['ok'] else 'left out: ' + str(r['reason'])}")
    source["sanitizer"] = {"tools": list(sanitize.TOOLS), "timeout_s": timeout_s}
    return clean


def _model_checks(kept: list[ExportVariant], env: dict[str, Any], source: dict[str, Any], excluded: list[dict],
                  config: str, small: bool, targets: list[str], progress: Callable[[str], None],
                  warn: Callable[[str], None] = lambda m: None, *, checkpoints: Checkpoints | None = None,
                  unchecked: list[str] | None = None) -> list[ExportVariant]:
    """One whole-model check per target over the same confirmed variants: each variant is kept where some
    target keeps it, with the list of those targets; a target none of them helps is reported, and only
    when no target keeps anything is the export refused. Interrupted (KeyboardInterrupt) after a finished
    target kept variants, with `unchecked` given: the finished targets stand alone and `unchecked` gets
    the others (a partial cast); otherwise the interruption goes on up."""
    from engine.errors import JobError

    per: dict[str, set[str]] = {}
    checks: dict[str, Any] = {}
    try:
        for t in targets:
            src, excl = dict(source), []
            try:
                chosen = _target_check(list(kept), env, src, excl, config, small, t, progress, warn, checkpoints)
                per[t] = {v.vid for v in chosen}
            except JobError as e:
                per[t] = set()
                src.setdefault("model_check", {"mode": t})
                src["model_check"] = {**src["model_check"], "refused": str(e)}
                # said now too: warnings are printed when the export ends, and one stopped by a time limit never
                # did (the SD3.5 VAE's reduce-overhead check left no line, H100 2026-12-05g)
                progress(f"target {t}: nothing kept: {e}")
                warn(f"target {t}: {e}")
            checks[t] = src.get("model_check")
    except KeyboardInterrupt:
        if unchecked is None or not any(per.get(t) for t in checks):
            raise
        unchecked[:] = [t for t in targets if t not in checks]  # the record shows them as 'not reached'
    done = list(checks)
    source["model_checks"] = checks
    source["model_check"] = checks[done[0]]
    out = []
    for v in kept:
        v.targets = [t for t in done if v.vid in per[t]]
        if v.targets:
            out.append(v)
        else:
            excluded.append({"card_id": v.card["card_id"], "op": v.card["op"],
                             "reason": f"whole-model check: kept for none of {', '.join(done)}"})
    if not out:
        raise NothingKept(f"export: no variant passed the whole-model check for any of {', '.join(targets)}; "
                          "nothing written")
    return out


# How a target's whole-model check decides, in its checkpoints' key: a check made under an earlier rule is
# made again, not reused. 2: under a compile target the chosen set is measured again in a second process.
# 3: each timed forward comes right after an untimed one of its arm (engine.bench.forward.time_steady).
# 4: the second process only where the first one's CI starts below REPLICATE_BELOW.
MODEL_CHECK_RULE = 4

# Under torch.compile, the chosen set is measured again in a second process, compiled afresh, only where the first
# process's CI starts below this: two processes' compiles of one model moved its speedup by up to 4.5 % (Gemma under
# reduce-overhead on the H200: 1.021x in one, 0.977x in another), twice that is the margin. A set whose CI starts
# above it (the SD3.5 VAE's GroupNorms, 1.21x with a CI 0.01 wide on an H100) is not kept by luck, and the second
# process cost two more compiles of the model in every compile target's check (the VAE's export ran past 495 s).
REPLICATE_BELOW = 1.10


def _target_check(kept: list[ExportVariant], env: dict[str, Any], source: dict[str, Any], excluded: list[dict],
                  config: str, small: bool, target: str, progress: Callable[[str], None],
                  warn: Callable[[str], None], checkpoints: Checkpoints | None) -> list[ExportVariant]:
    """`_model_check` of one target, reused from its checkpoint where one holds the same inputs, else run and
    checkpointed once it finishes (a set kept, or refused; not a check that broke, which runs again)."""
    from engine.errors import JobError

    if checkpoints is None:
        return _model_check(kept, env, source, excluded, config, small, target, progress, warn)
    key = checkpoints.key(target=target, rule=MODEL_CHECK_RULE, config=str(config), config_sha256=file_digest(config),
                          small=small,
                          variants=[{**_variant_key(v), "net_us": (v.confirmed or {}).get("net_us")}
                                    for v in kept])
    done = checkpoints.load(f"check-{target}", key)
    if done is not None:
        r = done["result"]
        mc = r["model_check"] or {}
        outcome = (f"refused ({r['refused']})" if r["refused"] else f"kept {len(r['kept'])} variant(s)" + (
            f": {mc['speedup']:.3f}x (95% CI {mc['speedup_ci'][0]:.3f}-{mc['speedup_ci'][1]:.3f})"
            if mc.get("speedup") is not None and mc.get("speedup_ci") else ""))
        progress(f"target {target}: the whole-model check of {done['at']} reused "
                 f"(checkpoint {checkpoints.shown(done['path'])}): {outcome}")
        if r["model_check"] is not None:
            source["model_check"] = r["model_check"]
        excluded.extend(r["excluded"])
        for w in r["warnings"]:
            warn(w)
        if r["refused"]:
            raise JobError(r["refused"])
        return [v for v in kept if v.vid in r["kept"]]
    excl: list[dict] = []
    said: list[str] = []

    def tell(msg: str) -> None:
        said.append(msg)
        warn(msg)
    try:
        chosen = _model_check(kept, env, source, excl, config, small, target, progress, tell)
    except JobError as e:
        excluded.extend(excl)
        checkpoints.save(f"check-{target}", key, {"model_check": source.get("model_check"), "kept": None,
                                                  "refused": str(e), "excluded": excl, "warnings": said})
        raise
    excluded.extend(excl)
    if (source.get("model_check") or {}).get("mode") != "failed":  # the check itself broke: not a result
        checkpoints.save(f"check-{target}", key, {"model_check": source.get("model_check"),
                                                  "kept": [v.vid for v in chosen], "refused": None,
                                                  "excluded": excl, "warnings": said})
    return chosen


def _call_key(v: ExportVariant) -> tuple | None:
    """What a cast's guard tells a variant's calls by (engine.cast.loader: the key and the memory formats
    PyTorch takes its tensors for), for an op variant; None for a chain or an op this torch does not have."""
    from engine.cast.guard import layout_of, proven_formats, signature_key
    from engine.ops import resolve_op

    sig = v.card["signature"]
    if not isinstance(sig, dict) or v.card["op"] == "kforge::chain":
        return None
    try:
        layout = layout_of(resolve_op(v.card["op"]))
        return (layout.op_name, signature_key(layout, sig, 0), proven_formats(layout, sig))
    except Exception:  # noqa: BLE001 - not an op the guard keys: confirmation says what is wrong with it
        return None


def one_per_call(variants: list[ExportVariant], excluded: list[dict],
                 progress: Callable[[str], None] = lambda m: None) -> list[ExportVariant]:
    """One variant per call the guard tells apart, the fastest in the lane: two cards can be one call (two
    convolutions adding a bias into the same tensor shape made two bias-add cards before 8555308, and runs
    before it hold such pairs), and a cast routes only the first of a key, so the other was confirmed for
    nothing and left out as "no hit" (10 of sd35_medium's 47, H100 2026-12-06e)."""
    best: dict[tuple, ExportVariant] = {}
    for v in variants:
        k = _call_key(v)
        if k is not None and (k not in best or (v.candidate.get("speedup") or 0) > (best[k].candidate.get("speedup") or 0)):
            best[k] = v
    out = []
    for v in variants:
        k = _call_key(v)
        if k is None or best[k] is v:
            out.append(v)
            continue
        w = best[k]
        excluded.append({"card_id": v.card["card_id"], "op": v.card["op"],
                         "reason": f"the same call as {w.vid} ({(w.candidate.get('speedup') or 0):.2f}x in the lane "
                                   f"against {(v.candidate.get('speedup') or 0):.2f}x), which serves it"})
    if len(out) < len(variants):
        progress(f"{len(variants) - len(out)} variant(s) left out: the same call as a faster one of another card")
    return out


def _pattern_left_out(card: dict[str, Any], target: str) -> dict[str, Any]:
    return {"card_id": card["card_id"], "op": card["op"],
            "reason": f"a pattern card runs only inside torch.compile graphs, not under {target} (export --target "
                      "compile)"}


def _only_where_they_serve(variants: list[ExportVariant], targets: list[str], excluded: list[dict],
                           progress: Callable[[str], None]) -> list[ExportVariant]:
    """Without a torch.compile target, the variants less the pattern cards, before the confirmation: every
    whole-model check would leave them out (`_model_check`), and confirming them cost sd35_medium's eager export
    about half its two minutes of confirmation (14 of 29 variants, H100 2026-12-06c). JobError where nothing
    else is left, as the check would say."""
    from engine.errors import JobError

    if any(t.startswith("compile") for t in targets):
        return variants
    out = [v for v in variants if not _only_compiled(v.card)]
    if len(out) == len(variants):
        return variants
    if not out:
        raise JobError(f"export: every variant is a pattern card, which runs only under torch.compile; "
                       f"export with --target compile (asked: {','.join(targets)})")
    for v in variants:
        if v not in out:
            excluded.append(_pattern_left_out(v.card, ",".join(targets)))
    progress(f"{len(variants) - len(out)} pattern card(s) left out: they run only under torch.compile, and the "
             f"export is for {', '.join(targets)}")
    return out


def _model_check(kept: list[ExportVariant], env: dict[str, Any], source: dict[str, Any], excluded: list[dict],
                 config: str, small: bool, target: str, progress: Callable[[str], None],
                 warn: Callable[[str], None] = lambda m: None) -> list[ExportVariant]:
    """Keep the largest set of variants (best net gain first) with which the run's own model is not slower;
    record the check in `source`; raise JobError when even one variant makes the model slower or its output
    degenerate (all zeros, constant, NaN/Inf where eager's is not); `warn` gets what the user must hear
    although the cast is written (also: eager's own output is degenerate, so agreement proves nothing)."""
    from engine.errors import JobError
    from engine.export.e2e import subsets

    if not target.startswith("compile"):  # eager and CUDA graphs: a pattern card has nothing to replace
        runs = [v for v in kept if not _only_compiled(v.card)]
        for v in kept:
            if v not in runs:
                excluded.append(_pattern_left_out(v.card, target))
        if not runs:
            raise JobError(f"export: every variant is a pattern card, which runs only under torch.compile; "
                           f"export with --target compile (asked: {target})")
        kept = runs
    sets = subsets([(v.vid, (v.confirmed or {}).get("net_us")) for v in kept])
    lead = [v.vid for v in kept if v.inductor is None]
    if target.startswith("compile") and lead and len(lead) < len(kept):
        # What the run measured says Inductor's own code is as fast for some variants in their context:
        # the set without them is tried first (all of them after it, should it not be faster).
        sets = [[vid for vid in sets[0] if vid in lead]] + sets
    graphs = target == "cuda-graphs"
    mode = {"eager": "eager forwards", "cuda-graphs": "CUDA-graph replays"}.get(
        target, f"compiled forwards (torch.compile, {target.partition(':')[2] or 'default'} mode)")
    progress(f"whole-model check: {source.get('model')} with and without the cast ({mode}), "
             f"up to {len(sets)} variant set(s)")
    with tempfile.TemporaryDirectory(prefix="kforge-e2e-") as tmp:
        cand = Path(tmp) / "candidate.cast"
        manifest, files, report = package(kept, env, source)
        write_cast(cand, manifest, files, report)
        compiled = target.startswith("compile")
        overlaps = pattern_overlaps(kept) if compiled else {}
        # Under torch.compile each check compiles afresh (caches of its own): what it measures is then one
        # compile's luck, which the second check below draws again.
        fresh = {"caches": Path(tmp) / "caches-1"} if compiled else {}
        try:
            result = run_model_check(cand, sets, config, small, graphs, Path(tmp), target=target,
                                     **({"overlaps": overlaps} if overlaps else {}), **fresh)
            chosen = result.get("chosen")
            again = run_model_check(cand, [chosen["variants"]], config, small, graphs, Path(tmp), target=target,
                                    caches=Path(tmp) / "caches-2") \
                if compiled and chosen and chosen["speedup_ci"][0] < REPLICATE_BELOW else None
        except JobError as e:  # the check itself broke (not: the model was slower): say so, keep the variants
            progress(f"whole-model check ({mode}) broke: {e}")
            warn(f"{e}; the cast is written without a whole-model check")
            source["model_check"] = {"mode": "failed", "reason": str(e)}
            return kept
    tried = result.get("tried", [])
    summary = [tried_summary(t) for t in tried]
    eager_bad = result.get("degenerate_eager")
    one_process = None
    if compiled and chosen and again is None:
        one_process = (f"one process: its CI starts at {chosen['speedup_ci'][0]:.3f}x, above {REPLICATE_BELOW:.2f}x, "
                       "beyond what two processes' compiles differ by")
        progress(f"whole-model check: no second process ({one_process})")
    if again is not None:
        second = (again.get("tried") or [None])[0]
        progress(f"whole-model check, again in a second process compiled afresh: "
                 f"{tried_summary(second) if second else 'no result'}")
        if again.get("chosen") is None:
            told = tried_summary(second) if second else "no result"
            source["model_check"] = {"mode": result.get("mode"), "tried": tried, "replicate": again.get("tried")}
            raise NothingKept(f"export: {source.get('model')} was faster with the cast in one process "
                              f"({tried_summary(chosen)}) but not in a second one, compiled afresh ({told}): two "
                              "processes' compiles of one model differ by a few per cent (Gemma under reduce-overhead "
                              "on the H200: 1.021x in one, 0.977x in another), so under torch.compile a set is kept "
                              f"only where both show it faster with confidence; nothing written for {target}")
        # The figure reported is the lower of the two: what the cast gives in the less lucky process.
        chosen = min(chosen, {**chosen, **again["chosen"], "variants": chosen["variants"]},
                     key=lambda t: t["speedup_ci"][0])
    source["model_check"] = {"mode": result.get("mode"), "tried": tried,
                             **({"replicate": again.get("tried")} if again is not None else {}),
                             **({"one_process": one_process} if one_process else {}),
                             **({"degenerate_eager": eager_bad} if eager_bad else {}),
                             **({k: chosen[k] for k in ("speedup", "speedup_ci", "eager_ms", "cast_ms", "rel_l2_err",
                                                        "reference", "reference_err", "reference_err_without")
                                 if k in chosen} if chosen else {})}
    if chosen is None:
        hint = "" if target != "eager" else ("; its kernels may still pay off under CUDA graphs: export again "
                                             "with --target cuda-graphs to check that instead")
        if any(t.get("rejected") for t in tried):
            raise NothingKept(f"export: no variant set passed the whole-model check of {source.get('model')} in "
                              f"{mode} ({'; '.join(summary)}); nothing written")
        if target.startswith("compile"):  # there a set must be faster with confidence (e2e.check)
            # "slower" where every set tried was slower with confidence (a host-bound pattern op: 0.43x)
            slower = bool(tried) and all((t.get("speedup_ci") or [0.0, 1.0])[1] < 1.0 for t in tried)
            verdict = "is slower with the cast in" if slower else "is not faster with the cast with confidence in"
            raise NothingKept(f"export: {source.get('model')} {verdict} {mode} ({'; '.join(summary)}): under "
                              "torch.compile a variant is kept only where the compiled model is faster with it; "
                              "nothing written")
        raise NothingKept(f"export: {source.get('model')} is slower with the cast in {mode} "
                          f"({'; '.join(summary)}){hint}; nothing written")
    if eager_bad:
        from engine.export.e2e import eager_caveat

        warn(f"whole-model check: {eager_caveat(eager_bad)} about the cast's correctness (each variant's own "
             "confirmation still holds)")
    keep_ids = set(chosen["variants"])
    # The set the check chose before weighing pattern cards against op variants (e2e.check's alternative).
    base = next(t for t in tried if not t.get("alternative") and not t.get("rejected")
                and t["variants"] != chosen["variants"] and faster_with_confidence(t["speedup_ci"])) \
        if chosen.get("alternative") else chosen
    culprits = {t["culprit"]: t["rejected"] for t in tried if t.get("culprit")}
    for v in kept:
        if v.vid in culprits:
            excluded.append({"card_id": v.card["card_id"], "op": v.card["op"],
                             "reason": f"whole-model check: the model's output with this variant is less accurate "
                                       f"than without the cast ({culprits[v.vid]}); its kernel passed its op's checks "
                                       "in the lane, so in the model it computes otherwise, or its error within the "
                                       "op's tolerance grows through the model"})
        elif v.vid not in keep_ids and v.vid in base["variants"]:
            excluded.append({"card_id": v.card["card_id"], "op": v.card["op"],
                             "reason": f"whole-model check: the compiled model was faster without this pattern "
                                       f"card, its ops served by their op variants ({chosen['speedup']:.3f}x "
                                       f"against {base['speedup']:.3f}x with it)"})
        elif v.vid not in keep_ids and v.inductor and base["variants"] == tried[0]["variants"] \
                and target.startswith("compile"):
            excluded.append({"card_id": v.card["card_id"], "op": v.card["op"],
                             "reason": f"whole-model check: left to torch.compile's own code ({v.inductor}); "
                                       f"the compiled model was faster with confidence without it "
                                       f"({base['speedup']:.3f}x)"})
        elif v.vid not in keep_ids:
            first = ("the set with it was rejected" if tried[0].get("rejected") else
                     "the compiled model was not faster with it with confidence" if target.startswith("compile")
                     else "the model was slower with it")
            excluded.append({"card_id": v.card["card_id"], "op": v.card["op"],
                             "reason": f"whole-model check: {first} ({summary[0]}); "
                                       f"kept the {len(keep_ids)} with the most net gain "
                                       f"({chosen['speedup']:.3f}x)"})
    progress(f"whole-model check: kept {len(keep_ids)} of {len(kept)} variant(s)"
             + (f" ({chosen['alternative']})" if chosen.get("alternative") else "") + f": {chosen['speedup']:.3f}x "
             f"(95% CI {chosen['speedup_ci'][0]:.3f}-{chosen['speedup_ci'][1]:.3f})"
             + ("" if eager_bad else f"; output moved {chosen['rel_l2_err']:.1e} (relative L2)"
                if chosen.get("rel_l2_err") is not None else "")
             + (f"; {chosen['reference_err']:.1e} from the model in {chosen['reference']} "
                f"({chosen['reference_err_without']:.1e} without the cast)" if chosen.get("reference") else ""))
    caveat = not_faster_caveat(chosen, graphs)
    if caveat:
        warn(caveat)
    return [v for v in kept if v.vid in keep_ids]


def inductor_as_fast(variants: list[ExportVariant], cards: list[dict[str, Any]]) -> dict[str, str]:
    """The variants whose run measured Inductor's own code as fast in their context: {variant id: why}.
    A pattern card whose chain, compiled alone by torch.compile (the run's `compile_us`), took no longer
    than its kernel (the run's `best_us`); and an op variant every call of which sits in such chains (our
    fused kernel moves less memory than our op kernel plus Inductor's separate pass for the rest of the
    chain, so Inductor's fused chain is faster than that too). Under a torch.compile target the export
    tries the set without them first (`_model_check`)."""
    from types import SimpleNamespace

    from engine.cards import chain_cover

    rows = {c["card_id"]: c for c in cards}
    as_fast: dict[str, str] = {}  # chain card id -> why
    out: dict[str, str] = {}
    for v in variants:
        ref, mine = v.card.get("compile_us"), v.candidate.get("best_us")
        if _only_compiled(v.card) and ref and mine and ref <= mine:
            as_fast[v.card["card_id"]] = out[v.vid] = (
                f"torch.compile's code for the chain took {ref:.1f} µs alone, the kernel {mine:.1f} µs")
    if not as_fast:
        return out
    shared = [SimpleNamespace(card_id=c["card_id"], calls=c.get("calls") or 0, share=c.get("share") or 0.0,
                              chain=_chain_of(c)) for c in rows.values()]
    cover = chain_cover(shared)
    for v in variants:
        held = cover.get(v.card["card_id"], {})
        share = rows.get(v.card["card_id"], {}).get("share") or 0.0
        if v.card["op"] == CHAIN_OP or not held or share <= 0:
            continue
        if set(held) <= set(as_fast) and sum(held.values()) >= 0.999 * share:
            out[v.vid] = ("every call of it sits in a chain whose torch.compile code was as fast as our fused "
                          f"kernel ({as_fast[next(iter(held))]})")
    return out


def pattern_overlaps(kept: list[ExportVariant]) -> dict[str, list[str]]:
    """Pattern variant -> the op variants (in `kept`) of its chain's member op cards: under torch.compile
    either can serve those ops, and which composition is faster is measured (e2e.composition_alternative)."""
    by_card: dict[str, list[str]] = {}
    for v in kept:
        if v.card["op"] != CHAIN_OP:
            by_card.setdefault(v.card["card_id"], []).append(v.vid)
    out = {}
    for v in kept:
        if _only_compiled(v.card):
            ops = [vid for m in (_chain_of(v.card) or {}).get("members", []) for vid in by_card.get(m, [])]
            if ops:
                out[v.vid] = ops
    return out


def tried_summary(t: dict[str, Any]) -> str:
    """One variant set's outcome in the whole-model check, for messages and exclusion reasons."""
    if t.get("rejected"):
        return (f"{len(t['variants'])} variant(s): {t['rejected']}"
                + (f" (variant {t['culprit']} makes it so by itself; left out of the sets tried after)"
                   if t.get("culprit") else ""))
    from engine.cast.compose import describe_layout_copies

    idle = t.get("never_ran") or []
    copies = describe_layout_copies(t.get("layout_copies"))
    return (f"{len(t['variants'])} variant(s): {t['speedup']:.3f}x "
            f"(95% CI {t['speedup_ci'][0]:.3f}-{t['speedup_ci'][1]:.3f})"
            + (f"; {len(idle)} never ran in the forward ({', '.join(idle[:4])}{', …' if len(idle) > 4 else ''})"
               if idle else "") + (f"; {copies}" if copies else ""))


def not_faster_caveat(chosen: dict[str, Any], graphs: bool) -> str | None:
    """What to tell the user when the kept set is not slower but not faster with confidence either: every
    kernel in it was proven faster on its own, the model as a whole was not (a host-bound forward)."""
    low, high = chosen["speedup_ci"]
    if faster_with_confidence((low, high)):
        return None
    hint = ("" if graphs else "; where the host sets the pace, the kernels may pay off under CUDA graphs "
            "(export again with --cuda-graphs to check that)")
    return (f"the model is not faster with this cast with confidence ({chosen['speedup']:.3f}x, 95% CI "
            f"{low:.3f}-{high:.3f}); it is written because no variant set made it slower" + hint)


def run_model_check(cast_path: Path, sets: list[list[str]], config: str, small: bool, graphs: bool, tmp: Path,
                    timeout_s: float = 1800, target: str | None = None,
                    overlaps: dict[str, list[str]] | None = None, caches: Path | None = None) -> dict[str, Any]:
    """`python -m engine.export.e2e` in a fresh process; its JSON result. `target` 'compile[:MODE]' checks
    the model under torch.compile (`graphs` is then ignored); `overlaps` (pattern variant -> op variants of
    its member ops) lets it measure the chosen set without such pattern cards too (e2e.check); `caches`: a
    folder for Inductor's and Triton's on-disk caches (empty: every graph compiled and tuned afresh)."""

    job, out = tmp / "subsets.json", tmp / "model_check.json"
    job.write_text(json.dumps({"sets": sets, "overlaps": overlaps} if overlaps else sets))
    argv = [sys.executable, "-m", "engine.export.e2e", "--config", config, "--cast", str(cast_path),
            "--subsets", str(job), "--out", str(out)] + (["--small"] if small else []) + \
        (["--graphs"] if graphs and not (target or "").startswith("compile") else []) + \
        (["--compile", target.partition(":")[2] or "default"] if (target or "").startswith("compile") else [])
    env = None
    if caches is not None:
        (caches / "triton").mkdir(parents=True, exist_ok=True)
        env = {"TORCHINDUCTOR_CACHE_DIR": str(caches), "TRITON_CACHE_DIR": str(caches / "triton")}
    proc = _run_child(argv, timeout_s, env)
    return _child_result(proc, out, "export: the whole-model check failed")


def _child_result(proc: subprocess.CompletedProcess, out: Path, what: str) -> dict[str, Any]:
    """A fresh-process job's JSON result (engine.export.confirm.run_job), or JobError naming `what` failed and
    why: the job's own error, else the last line the process printed."""
    from engine.errors import JobError

    if not out.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise JobError(f"{what} (exit {proc.returncode}): {tail[0]}")
    result = json.loads(out.read_text())
    if "error" in result:
        raise JobError(f"{what}: {result['error']}")
    return result


POLL_S = 1.0  # how often a waiting exporter calls `on_poll` (reads what the child has finished so far)


def _run_child(argv: list[str], timeout_s: float, env: dict[str, str] | None = None,
               on_poll: Callable[[], None] | None = None) -> subprocess.CompletedProcess:
    """`argv` in a fresh process (importing the same engine as this one) in a process group of its own, its
    output captured; `env`: variables to set in it. Whatever ends the wait (Ctrl-C, SIGTERM raised as
    KeyboardInterrupt, `timeout_s`) kills the group first, so that neither the child nor what it started
    (torch.compile's workers) outlives it. `on_poll` is called every POLL_S seconds while it runs, once more
    when it has ended, and once after it was stopped (what it finished by then is kept)."""
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as out, \
            tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as err:
        # files, not pipes: nothing reads them while the child runs, and a full pipe would block it
        with subprocess.Popen(argv, stdout=out, stderr=err, text=True, env={**_child_env(), **(env or {})},
                              start_new_session=True) as proc:
            try:
                while True:
                    try:
                        proc.wait(timeout=max(0.0, min(deadline - time.monotonic(),
                                                       POLL_S if on_poll else timeout_s)))
                        break
                    except subprocess.TimeoutExpired:
                        if time.monotonic() >= deadline:
                            raise subprocess.TimeoutExpired(argv, timeout_s) from None
                        if on_poll is not None:
                            on_poll()
            except BaseException:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):  # the group is gone already
                    pass
                proc.wait()
                if on_poll is not None:
                    with contextlib.suppress(Exception):
                        on_poll()
                raise
        if on_poll is not None:
            on_poll()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, proc.returncode, out.read(), err.read())


def _child_env() -> dict[str, str]:
    """This process's environment, with the engine it imported first on the child's path."""
    import engine

    root = str(Path(engine.__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


_ROUTE_KIND = {"graphs": "graph", "attention": "attention"}   # _in_child's `what` -> its warning's words


def _in_child(kept: list[ExportVariant], env: dict[str, Any], source: dict[str, Any], what: str,
              run: Callable[[Path, str, bool, Path], dict[str, Any]], warn: Callable[[str], None],
              progress: Callable[[str], None], saying: str, config: str, small: bool) -> dict[str, Any]:
    """A route check (`run`: run_graph_check or run_layout_check) in a fresh process on a cast of what is kept
    so far: its JSON result, or {"error": why} after a warning when the process failed."""
    from engine.errors import JobError

    progress(saying)
    with tempfile.TemporaryDirectory(prefix=f"kforge-{what}-") as tmp:
        path = Path(tmp) / "candidate.cast"
        manifest, files, report = package(kept, env, source)
        write_cast(path, manifest, files, report)
        try:
            return run(path, config, small, Path(tmp))
        except JobError as e:
            warn(f"{_ROUTE_KIND.get(what, 'layout')} routes: {e}")
            return {"error": str(e)}


GRAPH_CHECK_TIMEOUT_S = 900

# Graph routes replay parts of the forward from CUDA graphs, which saves at most what replaying the whole forward
# saves: the host's time. Below this share of the eager forward (with the cast and without it, as the eager and
# cuda-graphs targets' checks measured them) they are not tried: the GPU sets the pace (the SD3.5 VAE).
GRAPH_ROUTES_MIN_SAVING = 0.03


def gpu_bound(checks: dict[str, Any] | None) -> str | None:
    """Why graph routes are not worth their check, from the eager and cuda-graphs targets' whole-model checks:
    replaying the whole forward saved under GRAPH_ROUTES_MIN_SAVING of its eager time both with the cast and
    without it. None (try them) where either check has no times."""
    e, g = (checks or {}).get("eager") or {}, (checks or {}).get("cuda-graphs") or {}
    pairs = [(e.get(k), g.get(k)) for k in ("eager_ms", "cast_ms")]
    if not all(a and b for a, b in pairs):
        return None
    saving = max(1.0 - b / a for a, b in pairs)
    if saving >= GRAPH_ROUTES_MIN_SAVING:
        return None
    (a0, b0), (a1, b1) = pairs
    return (f"not tried: replaying the whole forward from a CUDA graph saves at most {max(saving, 0.0):.1%} of its "
            f"eager time ({a0:.2f} -> {b0:.2f} ms without the cast, {a1:.2f} -> {b1:.2f} ms with it), under "
            f"{GRAPH_ROUTES_MIN_SAVING:.0%}: the GPU, not the host, sets the pace, and routes replay only parts of it")


def _graph_routes_check(kept: list[ExportVariant], env: dict[str, Any], source: dict[str, Any], config: str,
                        small: bool, progress: Callable[[str], None], warn: Callable[[str], None]) -> dict[str, Any]:
    """Graph routes for the cast kept so far, checked in a fresh process (engine.export.graph_check): the
    manifest's `source.graph_routes`, {"classes": [the class chosen] or [], "targets": ["eager"], the chosen
    trial's speedup and CI, "tried": one line per class}."""
    result = _in_child(kept, env, source, "graphs", run_graph_check, warn, progress,
                       "trying graph routes on the model's repeated classes (a fresh process)", config, small)
    if "error" in result:
        return {"classes": [], "error": result["error"]}
    tried = [_trial_line(t) for t in result.get("tried", [])]
    for line in tried:
        progress(f"graph routes: {line}")
    chosen = result.get("chosen")
    if not chosen:
        return {"classes": [], "tried": tried}
    return {"classes": [chosen["class"]], "targets": ["eager"], "speedup": chosen["speedup"],
            "speedup_ci": chosen["speedup_ci"], "modules": chosen["modules"], "tried": tried}


LAYOUT_CHECK_TIMEOUT_S = 900


def _layout_routes_check(kept: list[ExportVariant], env: dict[str, Any], source: dict[str, Any], config: str,
                         small: bool, progress: Callable[[str], None], warn: Callable[[str], None]) -> dict[str, Any]:
    """Layout routes for the cast kept so far, checked in a fresh process (engine.export.layout_check): the
    manifest's `source.layout_routes`, {"classes": [the class chosen] or [], "targets": ["eager"],
    "memory_format", "signatures" (by class), the chosen trial's speedup, CI and output drift, "tried": one
    line per class}."""
    from engine.cast.layouts import MEMORY_FORMAT

    result = _in_child(kept, env, source, "layouts", run_layout_check, warn, progress,
                       "trying the model's convolutional modules channels-last (layout routes, a fresh process)",
                       config, small)
    if "error" in result:
        return {"classes": [], "error": result["error"]}
    tried = [_layout_line(t) for t in result.get("tried", [])]
    for line in tried:
        progress(f"layout routes: {line}")
    chosen = result.get("chosen")
    if not chosen:
        return {"classes": [], "tried": tried}
    graphs = chosen.get("graphs") or {}
    if graphs:
        progress("layout routes under CUDA graphs: " + (f"{graphs['speedup']:.3f}x ({graphs['speedup_ci'][0]:.3f}-"
                                                          f"{graphs['speedup_ci'][1]:.3f})" if "speedup" in graphs
                                                          else "not timed")
                 + (f", not kept there: {graphs['why']}" if graphs.get("why") else ", kept there"))
    return {"classes": [chosen["class"]], "targets": list(chosen.get("targets") or ["eager"]),
            "memory_format": MEMORY_FORMAT, "signatures": chosen["signatures"], "speedup": chosen["speedup"],
            "speedup_ci": chosen["speedup_ci"], "rel_l2_err": chosen["rel_l2_err"], "modules": chosen["modules"],
            **({"graphs": graphs} if graphs else {}),
            **({"eager_why": chosen["eager_why"]} if chosen.get("eager_why") else {}), "tried": tried}


ATTENTION_CHECK_TIMEOUT_S = 900


def _attention_routes_check(kept: list[ExportVariant], env: dict[str, Any], source: dict[str, Any], config: str,
                            small: bool, modes: list[str], progress: Callable[[str], None],
                            warn: Callable[[str], None]) -> dict[str, Any]:
    """Attention routes for the cast kept so far, checked in a fresh process (engine.export.attention_check): the
    manifest's `source.attention_routes`, {"signatures", "targets": the compile targets where the model compiled
    with them was faster with confidence and as accurate (empty: none), "tried": one line per mode}."""
    result = _in_child(kept, env, source, "attention", functools.partial(run_attention_check, modes=modes), warn,
                       progress,
                       "trying attention of large head dimension in its math form under torch.compile "
                       "(attention routes, a fresh process)", config, small)
    if "error" in result:
        return {"signatures": [], "targets": [], "error": result["error"]}
    tried = [_attention_line(t) for t in result.get("tried", [])]
    for line in tried:
        progress(f"attention routes: {line}")
    targets = list(result.get("targets") or [])
    return {"signatures": result.get("signatures", []) if targets else [], "targets": targets, "tried": tried}


def run_attention_check(cast_path: Path, config: str, small: bool, tmp: Path, modes: list[str],
                        timeout_s: float = ATTENTION_CHECK_TIMEOUT_S) -> dict[str, Any]:
    """`python -m engine.export.attention_check` in a fresh process for compile `modes`; its JSON result."""
    out = tmp / "attention_check.json"
    proc = _run_child([sys.executable, "-m", "engine.export.attention_check", "--config", config, "--cast",
                       str(cast_path), "--out", str(out), "--modes", ",".join(modes)] + (["--small"] if small else []),
                      timeout_s)
    return _child_result(proc, out, "the attention-route check failed")


def has_attention(cards: list[dict[str, Any]]) -> bool:
    """Whether the run captured an SDPA op (any backend's) the attention-route check may find something in: its
    query 4-D with a head dimension above flash's and at most MAX_HEADS batch x head matrices
    (engine.cast.attention.query_may_qualify). The check is a fresh process that traces the model; most attention
    (d <= 256: SD3.5's MMDiT, ViT, Whisper, Qwen) never qualifies. A card whose query cannot be read is tried."""
    from engine.cast.attention import query_may_qualify

    for c in cards:
        if "scaled_dot_product" not in str(c.get("op")):
            continue
        sig = c.get("signature")
        if isinstance(sig, str):
            try:
                sig = json.loads(sig)
            except ValueError:
                return True
        args = sig.get("args") if isinstance(sig, dict) else None
        q = next((a for a in args or [] if isinstance(a, dict) and a.get("kind") == "tensor"), None)
        shape = q.get("shape") if q else None
        if not isinstance(shape, list) or not all(isinstance(n, int) for n in shape):
            return True
        if query_may_qualify(shape):
            return True
    return False


def _attention_line(t: dict[str, Any]) -> str:
    return _route_line(f"compile mode {t.get('mode')} ({t.get('rewritten', 0)} call(s) in the math form)", t)


def _layout_line(t: dict[str, Any]) -> str:
    return _route_line(f"{t.get('class')} ({t.get('modules', 0)} module(s))", t)


def _route_line(what: str, t: dict[str, Any]) -> str:
    """One line of a route trial: what was tried, its speedup and CI, its output's drift, and whether it was kept."""
    if "speedup" in t:
        what += f": {t['speedup']:.3f}x ({t['speedup_ci'][0]:.3f}-{t['speedup_ci'][1]:.3f})"
    if "rel_l2_err" in t:
        what += f", output rel. L2 {t['rel_l2_err']:.1e}"
    return what + (f", not kept: {t['why']}" if t.get("why") else ", kept")


def run_layout_check(cast_path: Path, config: str, small: bool, tmp: Path,
                     timeout_s: float = LAYOUT_CHECK_TIMEOUT_S) -> dict[str, Any]:
    """`python -m engine.export.layout_check` in a fresh process; its JSON result."""

    out = tmp / "layout_check.json"
    proc = _run_child([sys.executable, "-m", "engine.export.layout_check", "--config", config, "--cast",
                       str(cast_path), "--out", str(out)] + (["--small"] if small else []), timeout_s)
    return _child_result(proc, out, "the layout-route check failed")


def _trial_line(t: dict[str, Any]) -> str:
    what = f"{t.get('class')} ({t.get('modules', 0)} module(s), {t.get('replaying', 0)} replaying)"
    if "speedup" in t:
        what += f": {t['speedup']:.3f}x ({t['speedup_ci'][0]:.3f}-{t['speedup_ci'][1]:.3f})"
    return what + (f", not kept: {t['why']}" if t.get("why") else ", kept")


def run_graph_check(cast_path: Path, config: str, small: bool, tmp: Path,
                    timeout_s: float = GRAPH_CHECK_TIMEOUT_S) -> dict[str, Any]:
    """`python -m engine.export.graph_check` in a fresh process; its JSON result."""

    out = tmp / "graph_check.json"
    proc = _run_child([sys.executable, "-m", "engine.export.graph_check", "--config", config, "--cast", str(cast_path),
                       "--out", str(out)] + (["--small"] if small else []), timeout_s)
    return _child_result(proc, out, "the graph-route check failed")


def run_confirm(cast_path: Path, samples: dict[str, list[str]], timing: dict[str, Any], tmp: Path,
                timeout_s: float = 1800, only: list[str] | None = None,
                on_variant: Callable[[str, dict[str, Any], dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """`python -m engine.export.confirm` in a fresh process; its JSON result. `only`: the variants to check (all
    of the cast's by default). `on_variant(id, result, env)` is called here, in this process, for each variant as
    the child finishes it (also when the wait is then cut short)."""
    from engine.export.confirm import partial_path

    job, out = tmp / "job.json", tmp / "result.json"
    job.write_text(json.dumps({"samples": samples, "timing": timing, **({"only": only} if only is not None else {})}))
    partial, seen = partial_path(out), set()

    def poll() -> None:
        try:
            doc = json.loads(partial.read_text())
        except (OSError, ValueError):   # none yet
            return
        for vid, r in doc.get("variants", {}).items():
            if vid not in seen:
                seen.add(vid)
                on_variant(vid, r, doc.get("env") or {})

    proc = _run_child([sys.executable, "-m", "engine.export.confirm", "--cast", str(cast_path), "--job", str(job),
                       "--out", str(out)], timeout_s, on_poll=poll if on_variant is not None else None)
    return _child_result(proc, out, "export: the confirmation process failed")
