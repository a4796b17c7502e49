"""`kforge-tui prune`: what a workspace holds on disk, and removing the capture samples no run needs.

A capture keeps up to K real input samples per card: gigabytes at full size (SD3.5 19 GB, Gemma 13 GB), while
the database (captures, cards, runs, candidates, exports) stays small. Only sample files are ever removed, and
only with --delete; the database keeps every card, run and export. For each capture's samples:

- never while a run still going uses the capture (created, paused, or running with its process alive; a
  run on another host counts as alive);
- kept unless --newest: the newest capture with samples of each model, size (full or --small) and device,
  the one the next `kforge-tui run` of that config reuses;
- kept unless --run-captures: a capture that a finished, stopped or crashed run used. That run still lists,
  compares and exports (its export confirms each kernel on inputs synthesised from the card's signature
  instead of the captured ones) but can no longer be resumed, and says so;
- otherwise removed: an older capture that no run used.

The database forgets a capture's sample rows (and records when, `engine.store.SAMPLES_REMOVED`) before its
files go, so nothing ever names a file that is not there. Folders under samples/ that no capture names (one
killed before it finished, `.partial-*`, or one whose storing failed) are removed unless a capture is writing or
storing them now: its process holds the folder's lock (engine.store.sample_folders.capture_writing, which the
TUI and the next capture ask too; a folder without a lock file waits until unchanged for 15 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import JobError, UsageError
from engine.store import DB_FILENAME, capture_writing

RUN_CAPTURES = "--run-captures"
NEWEST = "--newest"
FLAGS = (RUN_CAPTURES, NEWEST)
LIVE_STATUSES = ("created", "running", "paused")

# What each top-level entry of a workspace is, and why prune leaves it alone.
_PARTS = {
    "cache": "compiled kernels, rebuilt when needed (not removed by prune)",
    "export-checkpoints": "finished export checks, reused by the next export of a run (not removed by prune)",
    "logs": "logs of engines the TUI started (not removed by prune)",
}


@dataclass(frozen=True)
class RunUse:
    """A run of a capture: `live` while it is still going (it may read the samples at any moment)."""

    id: str
    status: str
    pid: int | None
    live: bool
    process_gone: bool = False

    def words(self) -> str:
        return f"{self.id} ({self.status}{', process gone' if self.process_gone else ''})"


@dataclass(frozen=True)
class CaptureSamples:
    """One capture's samples: the rows the database holds and the folder on disk."""

    id: str
    model: str
    small: bool
    device: str
    dtype: str
    created_at: float
    folder: str                  # relative to the workspace, e.g. samples/<capture id>
    files: int                   # sample files the database names
    missing: int                 # of those, how many are not on disk (removed by hand?)
    bytes: int                   # disk the folder takes (0 when it is not there)
    files_here: int              # files in the folder (none for a `capture --samples 0`)
    runs: tuple[RunUse, ...]
    removed: str | None          # engine.store.samples_removed: how its samples went, if they did

    @property
    def kind(self) -> tuple[str, bool, str]:
        """What a new run reuses the newest of: model, size, device."""
        return (self.model, self.small, self.device)

    def kind_words(self) -> str:
        return f"{'--small' if self.small else 'full size'}, {self.device}, {self.dtype}"


@dataclass(frozen=True)
class Leftover:
    """A folder (or file) under samples/ that no capture names."""

    path: str                    # relative to the workspace
    bytes: int
    changed_at: float            # the newest mtime in it
    writer: str | None = None    # why a capture may be writing or storing it now (capture_writing), if one may

    def what(self) -> str:
        if Path(self.path).name.startswith(".partial-"):
            return "a capture that never finished"
        return "in no capture"


@dataclass(frozen=True)
class Part:
    """A top-level entry of the workspace and the disk it takes."""

    path: str
    bytes: int
    what: str


@dataclass(frozen=True)
class WorkspaceSurvey:
    """What a workspace holds, read from its database and its disk at `taken_at`."""

    workspace: Path
    parts: tuple[Part, ...]
    captures: tuple[CaptureSamples, ...]     # newest first
    leftovers: tuple[Leftover, ...]          # newest first
    runs: int
    taken_at: float

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.parts)


@dataclass(frozen=True)
class Hold:
    """A reason to keep something, and the flag that lets prune remove it anyway (None: nothing does)."""

    why: str
    flag: str | None = None

    def words(self) -> str:
        return self.why + (f" [{self.flag}]" if self.flag else "")


@dataclass(frozen=True)
class Entry:
    """Something prune can remove (a capture's sample folder, a leftover) and what holds it back."""

    path: str
    bytes: int
    holds: tuple[Hold, ...]
    capture: CaptureSamples | None = None
    leftover: Leftover | None = None

    def removable(self, flags: Iterable[str]) -> bool:
        given = set(flags)
        return all(h.flag is not None and h.flag in given for h in self.holds)


# ---- reading the workspace ------------------------------------------------------------------------------


def disk_usage(path: Path) -> tuple[int, int, float]:
    """(bytes on disk, files, newest mtime) of a file or folder tree: allocated blocks where the file system
    reports them, each inode once, symlinks not followed; what vanishes while it is read counts as gone."""
    seen: set[tuple[int, int]] = set()
    total = files = 0
    newest = 0.0
    todo = [path]
    while todo:
        p = todo.pop()
        try:
            st = os.lstat(p)
        except OSError:   # gone since it was listed, or not ours to read
            continue
        newest = max(newest, st.st_mtime)
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            blocks = getattr(st, "st_blocks", None)
            total += blocks * 512 if blocks is not None else st.st_size
        if stat.S_ISDIR(st.st_mode):
            try:
                todo += [Path(e.path) for e in os.scandir(p)]
            except OSError:
                continue
        elif stat.S_ISREG(st.st_mode):
            files += 1
    return total, files, newest


def run_is_live(run: dict[str, Any]) -> tuple[bool, bool]:
    """(still going, its process is gone) for a run row: a run marked created, paused or running is going
    unless its process on this host is known to be gone (engine.run.report.process_gone)."""
    from engine.run.report import process_gone

    gone = process_gone(run)
    return run.get("status") in LIVE_STATUSES and not gone, gone


def survey(workspace: Path, *, live: Callable[[dict[str, Any]], tuple[bool, bool]] = run_is_live) -> WorkspaceSurvey:
    """Read the workspace's database and measure its disk (the database only read, never written)."""
    from engine.store import db_path, open_readonly, samples_dir, samples_removed
    from engine.store import read as store_read

    taken_at = time.time()
    conn = open_readonly(db_path(workspace))
    try:
        rows = store_read.captures(conn)
        files = store_read.sample_files(conn)
        runs = store_read.runs(conn)
    finally:
        conn.close()
    uses: dict[str, list[RunUse]] = {}
    for r in runs:
        going, gone = live(r)
        uses.setdefault(r["capture_id"], []).append(RunUse(r["id"], r["status"], r.get("pid"), going, gone))
    captures = []
    for c in rows:
        folder = Path(c.get("sample_dir") or f"samples/{c['id']}")
        named = files.get(c["id"], [])
        missing = sum(1 for f in named if not (workspace / f).is_file())
        size, here, _ = disk_usage(workspace / folder)
        captures.append(CaptureSamples(
            c["id"], c["model"], bool(c["small"]), c["device"], c["dtype"], c["created_at"], folder.as_posix(),
            len(named), missing, size, here, tuple(uses.get(c["id"], [])), samples_removed(c)))
    leftovers = []
    root, folders = samples_dir(workspace), {c.folder for c in captures}
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        rel = p.relative_to(workspace).as_posix()
        if rel not in folders:
            size, _, changed = disk_usage(p)
            leftovers.append(Leftover(rel, size, changed, capture_writing(p, now=taken_at)))
    parts = []
    for p in sorted(workspace.iterdir()):
        if p.name.startswith(f"{DB_FILENAME}-"):
            continue   # its -wal and -shm count with the database
        size = disk_usage(p)[0]
        if p.name == DB_FILENAME:
            size += sum(disk_usage(x)[0] for x in workspace.glob(f"{DB_FILENAME}-*"))
            what = f"the database: captures, cards, {len(runs)} run(s), candidates, exports (never removed)"
        elif p.name == "samples":
            what = (f"the samples of {len(captures)} capture(s) of {len({c.model for c in captures})} model(s)"
                    + (f", and {len(leftovers)} entries of no capture" if leftovers else ""))
        else:
            what = _PARTS.get(p.name, "not known to Kernel Forge (not removed by prune)")
        parts.append(Part(p.name + ("/" if p.is_dir() else ""), size, what))
    return WorkspaceSurvey(workspace, tuple(sorted(parts, key=lambda p: -p.bytes)),
                           tuple(captures),   # newest first, as the database orders them
                           tuple(sorted(leftovers, key=lambda x: -x.changed_at)), len(runs), taken_at)


# ---- the rule --------------------------------------------------------------------------------------------


def decide(s: WorkspaceSurvey, named: set[str] | None = None) -> list[Entry]:
    """Every capture folder and leftover with what holds it back, newest first (pure: no disk, no database).

    `named`: only these capture ids (--capture); everything else is held."""
    newest: dict[tuple[str, bool, str], str] = {}
    for c in s.captures:   # newest first: the first of each kind with samples is the one a new run reuses
        if c.files:
            newest.setdefault(c.kind, c.id)
    out = []
    for c in s.captures:
        holds: list[Hold] = []
        if named is not None and c.id not in named:
            holds.append(Hold("not named by --capture"))
        if c.files:   # rows with nothing held are removable; a folder whose rows went holds nothing at all
            holds += [Hold(f"{r.id} is {r.status}: it reads these samples") for r in c.runs if r.live]
            if newest.get(c.kind) == c.id:
                holds.append(Hold(f"the newest {c.model} capture ({'--small' if c.small else 'full size'}, {c.device}): "
                                  "the next run reuses it",
                                  NEWEST))
            done = [r for r in c.runs if not r.live]
            if done:
                holds.append(Hold(f"used by {', '.join(r.words() for r in done)}", RUN_CAPTURES))
        # An empty folder (a capture without samples) is nothing to free.
        out.append(Entry(c.folder, c.bytes if c.files_here else 0, tuple(holds), capture=c))
    for x in s.leftovers:
        holds = [Hold("not named by --capture")] if named is not None else []
        if x.writer is not None:
            holds.append(Hold(x.writer))
        out.append(Entry(x.path, x.bytes, tuple(holds), leftover=x))
    return out


def freed(entries: list[Entry], flags: Iterable[str]) -> tuple[int, list[Entry]]:
    """The bytes the removable entries take, and those entries (only those with something on disk)."""
    gone = [e for e in entries if e.bytes and e.removable(flags)]
    return sum(e.bytes for e in gone), gone


def named_captures(s: WorkspaceSurvey, refs: list[str]) -> set[str]:
    """--capture ids or unique prefixes as capture ids; UsageError naming the one that matches none or many."""
    ids = [c.id for c in s.captures]
    out = set()
    for ref in refs:
        hits = [i for i in ids if i == ref] or [i for i in ids if i.startswith(ref)]
        if len(hits) != 1:
            why = "no such capture" if not hits else f"{len(hits)} captures start so; give more of the id"
            raise UsageError(f"prune --capture {ref}: {why} in {s.workspace} "
                             f"(newest: {', '.join(ids[:3]) or 'none'}; 'kforge-tui prune' lists them)")
        out.add(hits[0])
    return out


# ---- removing --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Removal:
    """What one removal did: the path, the bytes freed, and why it did not happen where it did not."""

    path: str
    bytes: int
    error: str | None = None


def remove(s: WorkspaceSurvey, entries: list[Entry]) -> list[Removal]:
    """Remove these entries: a capture's rows are forgotten first (only while its runs are as surveyed), then
    its folder goes; a leftover goes only if still no capture writes it and none names it (asked in that
    order: a capture lets go of its folder's lock only once it has stored the folder's rows)."""
    out: list[Removal] = []
    captures = [e for e in entries if e.capture is not None]
    forgotten = asyncio.run(_forget(s.workspace, [e.capture for e in captures if e.capture.files])) \
        if any(e.capture.files for e in captures if e.capture is not None) else {}
    for e in captures:
        assert e.capture is not None
        if e.capture.files and not forgotten.get(e.capture.id):
            out.append(Removal(e.path, 0, "a run started or resumed on it since it was listed: kept"))
            continue
        out.append(_rmtree(s.workspace, e))
    leftovers = [e for e in entries if e.leftover is not None]
    writing = {e.path: capture_writing(s.workspace / e.path) for e in leftovers}
    named = _capture_folders(s.workspace) if leftovers else set()
    for e in leftovers:
        if e.path in named:
            out.append(Removal(e.path, 0, "a capture stored it since it was listed: kept"))
        elif writing[e.path] is not None:
            out.append(Removal(e.path, 0, f"{writing[e.path]}: kept"))
        else:
            out.append(_rmtree(s.workspace, e))
    return out


async def _forget(workspace: Path, captures: list[CaptureSamples]) -> dict[str, bool]:
    from engine.store import Store, db_path

    store = await Store.open(db_path(workspace))
    async with store:
        return {c.id: await store.forget_samples(c.id, {r.id: (r.status, r.pid) for r in c.runs})
                for c in captures}


def _capture_folders(workspace: Path) -> set[str]:
    from engine.store import db_path, open_readonly
    from engine.store import read as store_read

    conn = open_readonly(db_path(workspace))
    try:
        return {Path(c.get("sample_dir") or f"samples/{c['id']}").as_posix() for c in store_read.captures(conn)}
    finally:
        conn.close()


def _rmtree(workspace: Path, e: Entry) -> Removal:
    """Remove one entry directly under samples/ (never anything outside it, never through a link)."""
    from engine.store import samples_dir

    path = workspace / e.path
    if path.parent.resolve() != samples_dir(workspace).resolve():
        return Removal(e.path, 0, "not directly under samples/: kept")
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path)
    except OSError as err:
        return Removal(e.path, 0, f"could not remove it: {err.strerror or err}")
    return Removal(e.path, e.bytes)


# ---- the command -----------------------------------------------------------------------------------------


def size_text(n: int) -> str:
    """Bytes in decimal units, as `capture` reports them: 512 B, 5.6 MB, 19.0 GB."""
    value, unit = float(n), "B"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            break
        value /= 1000
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def _consequences(new: list[Entry], after: list[Entry], entries: list[Entry]) -> list[str]:
    """What removing the `new` entries means for the runs that used them and for the next run of a model, once
    every entry of `after` is removed."""
    def with_samples(es: list[Entry]) -> list[CaptureSamples]:
        return [e.capture for e in es if e.capture is not None and e.capture.files]

    runs = sorted({r.id for c in with_samples(new) for r in c.runs})
    gone = {c.id for c in with_samples(after)}
    newest = {c.kind for e in new if e.capture is not None and any(h.flag == NEWEST for h in e.holds)
              for c in [e.capture]}
    left = {c.kind for c in with_samples(entries) if c.id not in gone}
    out = []
    if runs:
        verbs = "lists, compares and exports" if len(runs) == 1 else "list, compare and export"
        out.append(f"{', '.join(runs)} still {verbs} (on inputs synthesised from each card's signature) but "
                   "cannot be resumed")
    for model, small, device in sorted(newest):
        kind = f"{model} ({'--small' if small else 'full size'}, {device})"
        out.append(f"the next 'kforge-tui run' of {kind} captures again" if (model, small, device) not in left else
                   f"the next 'kforge-tui run' of {kind} reuses the newest older capture that keeps its samples "
                   "if it is of the same config, else captures again")
    return out


def prune_document(s: WorkspaceSurvey, entries: list[Entry], flags: set[str],
                   removed: list[Removal] | None) -> dict[str, Any]:
    """The `prune --json` document."""
    by_path = {e.path: e for e in entries}
    would, gone = freed(entries, flags)
    more = {" ".join(f for f in FLAGS if f in more_flags): freed(entries, flags | more_flags)[0] - would
            for more_flags in _flag_sets(flags)}
    models: dict[str, dict[str, int]] = {}
    for c in s.captures:
        m = models.setdefault(c.model, {"captures": 0, "bytes": 0})
        m["captures"] += 1
        m["bytes"] += c.bytes

    def holds(path: str) -> list[dict[str, Any]]:
        return [{"why": h.why, "flag": h.flag} for h in by_path[path].holds]

    return {
        "workspace": str(s.workspace), "bytes": s.bytes, "deleted": removed is not None,
        "parts": [{"path": p.path, "bytes": p.bytes, "what": p.what} for p in s.parts],
        "models": models,
        "captures": [{
            "id": c.id, "model": c.model, "small": c.small, "device": c.device, "dtype": c.dtype,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(c.created_at)),
            "folder": c.folder, "bytes": c.bytes, "sample_files": c.files, "missing_files": c.missing,
            "samples_removed": c.removed,
            "runs": [{"id": r.id, "status": r.status, "live": r.live, "process_gone": r.process_gone} for r in c.runs],
            "remove": by_path[c.folder] in gone, "kept_because": holds(c.folder),
        } for c in s.captures],
        "leftovers": [{"path": x.path, "bytes": x.bytes, "what": x.what(),
                       "changed": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(x.changed_at)),
                       "remove": by_path[x.path] in gone, "kept_because": holds(x.path)}
                      for x in s.leftovers],
        "removable_bytes": would, "more_with": more, "consequences": _consequences(gone, gone, entries),
        "removed": None if removed is None else [
            {"path": r.path, "bytes": r.bytes, "error": r.error} for r in removed],
        "freed_bytes": None if removed is None else sum(r.bytes for r in removed if r.error is None),
    }


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def prune_text(s: WorkspaceSurvey, entries: list[Entry], flags: set[str], removed: list[Removal] | None) -> str:
    """What `prune` prints: the workspace's parts, its captures newest first, what is (or was) removed."""
    by_path = {e.path: e for e in entries}
    lines = [f"workspace {s.workspace}: {size_text(s.bytes)} on disk" + (" before" if removed is not None else "")]
    if removed is None:
        lines += _table([[p.path, size_text(p.bytes), p.what] for p in s.parts]) if s.parts else []

    done = {r.path: r for r in removed or []}

    def verdict(e: Entry) -> str:
        if not e.bytes:
            return "–"
        if e.path in done:
            return "removed" if done[e.path].error is None else f"kept: {done[e.path].error}"
        if e.removable(flags):
            return "remove"
        return "keep: " + "; ".join(h.words() for h in e.holds if h.flag is None or h.flag not in flags)

    if s.captures:
        lines += ["", "captures, newest first ([flag]: what removes it anyway):"]
        rows = [["capture", "kind", "created", "samples", "runs", "prune"]]
        for c in s.captures:
            size = size_text(c.bytes) if c.bytes else "none on disk" if c.files else c.removed or "–"
            size += f" ({c.removed})" if c.removed and c.bytes and not c.files else ""
            if c.missing:
                size += f" ({c.missing} of its {c.files} sample files missing: runs on it cannot verify those cards)"
            rows.append([c.id, c.kind_words(), _when(c.created_at), size,
                         ", ".join(r.words() for r in c.runs) or "–", verdict(by_path[c.folder])])
        lines += _table(rows)
        models: dict[str, list[int]] = {}
        for c in s.captures:
            models.setdefault(c.model, []).append(c.bytes)
        lines.append("samples per model: " + ", ".join(
            f"{m} {size_text(sum(b))} ({len(b)} capture{'s' if len(b) > 1 else ''})"
            for m, b in sorted(models.items(), key=lambda kv: -sum(kv[1]))))
    if s.leftovers:
        lines += ["", "in samples/ but in no capture, newest first:"]
        lines += _table([[x.path, size_text(x.bytes), x.what(), f"changed {_when(x.changed_at)}",
                          verdict(by_path[x.path])] for x in s.leftovers])
    would, gone = freed(entries, flags)
    lines.append("")
    if removed is None:
        if would:
            lines.append(f"would free {size_text(would)} ({_count(gone)}): 'kforge-tui prune --delete"
                         + "".join(f" {f}" for f in FLAGS if f in flags) + "' removes it")
            lines += [f"  then {c}" for c in _consequences(gone, gone, entries)]
        else:
            lines.append("nothing to remove" + (" with " + " ".join(sorted(flags)) if flags else ""))
        for more_flags in _flag_sets(flags):
            more, extra = freed(entries, flags | more_flags)
            # flags together: said only where they free more than each alone (a capture both hold back)
            if more > would and (len(more_flags) == 1 or all(freed(entries, flags | {f})[0] < more
                                                             for f in more_flags)):
                why = "; ".join(_consequences([e for e in extra if e not in gone], extra, entries))
                lines.append(f"{' '.join(f for f in FLAGS if f in more_flags)} would free {size_text(more - would)} "
                             "more" + (f": {why}" if why else ""))
        lines.append("nothing was removed: --delete removes what is marked 'remove'")
    else:
        ok = [r for r in removed if r.error is None]
        lines.append(f"removed {size_text(sum(r.bytes for r in ok))}: " + (", ".join(r.path for r in ok) or "nothing"))
        really = [e for e in gone if e.path in {r.path for r in ok}]
        lines += [f"  {c}" for c in _consequences(really, really, entries)]
        lines += [f"not removed: {r.path}: {r.error}" for r in removed if r.error is not None]
        now = sum(disk_usage(p)[0] for p in s.workspace.iterdir())   # as the parts count it: not the folder itself
        lines.append(f"workspace {s.workspace}: {size_text(now)} on disk now")
    return "\n".join(lines)


def _flag_sets(given: set[str]) -> list[set[str]]:
    """The flags not given, one at a time, then together: what each would add to the removal."""
    rest = [f for f in FLAGS if f not in given]
    return [{f} for f in rest] + ([set(rest)] if len(rest) > 1 else [])


def _count(entries: list[Entry]) -> str:
    caps = sum(1 for e in entries if e.capture is not None)
    left = len(entries) - caps
    parts = ([f"the samples of {caps} capture{'s' if caps > 1 else ''}"] if caps else []) + \
        ([f"{left} folder{'s' if left > 1 else ''} of no capture"] if left else [])
    return " and ".join(parts)


def cmd_prune(args: argparse.Namespace, workspace: Path) -> int:
    """`kforge-tui prune [--delete] [--run-captures] [--newest] [--capture ID] [--json]`."""
    from engine.store import db_path, samples_dir, writable

    flags = ({RUN_CAPTURES} if args.run_captures else set()) | ({NEWEST} if args.newest else set())
    s = survey(workspace)
    named = named_captures(s, args.capture) if args.capture else None
    entries = decide(s, named)
    removed = None
    if args.delete:
        root = samples_dir(workspace)
        if not writable(db_path(workspace)) or (root.is_dir() and not os.access(root, os.W_OK | os.X_OK)):
            raise UsageError(f"prune --delete: the workspace {workspace} is not writable by this user; "
                             "run it as the workspace's owner")
        removed = remove(s, freed(entries, flags)[1])
    if args.json:
        print(json.dumps(prune_document(s, entries, flags, removed), separators=(",", ":"), default=str))
    else:
        print(prune_text(s, entries, flags, removed))
    failed = [r for r in removed or [] if r.error and r.error.startswith("could not")]
    if failed:
        raise JobError(f"prune: could not remove {failed[0].path}: {failed[0].error.removeprefix('could not remove it: ')}"
                       + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""))
    return 0
