"""The synchronous read side of the workspace database, for viewers (the TUI, scripts): named queries.

Open the connection with `engine.store.open_readonly`; every function here takes it first. Rows come
back as dicts with JSON columns decoded (as `Store` hands them out), except on the TUI's per-tick path,
where `CandidateHead` keeps each of thousands of rows light. The one write a viewer makes, a control
row for the engine, is `add_control`. No asyncio: the TUI reads from a worker thread.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.outcomes import CONTROL_COMMANDS, UNKNOWN_CATEGORY
from engine.store.store import encode_json, row_to_dict

_BUSY_TIMEOUT_S = 5.0
_ERROR_HEAD_CHARS = 160
_IN_CHUNK = 500  # ids per `IN (...)`: far below SQLite's bound-parameter limit


def _json(text: Any) -> Any:
    """Decode a JSON column; text that is not JSON comes back as it is (a viewer must not crash on it)."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _row(table: str, row: sqlite3.Row | None) -> dict[str, Any] | None:
    return row_to_dict(table, row, decode=_json)  # a viewer shows text that is not JSON, never raises


def _rows(table: str, rows: Iterable[sqlite3.Row]) -> list[dict[str, Any]]:
    return [_row(table, r) for r in rows]  # type: ignore[misc]


# ---- runs ------------------------------------------------------------------------------------------------


def runs(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every run in the workspace, newest first."""
    return _rows("runs", conn.execute("SELECT * FROM runs ORDER BY created_at DESC, id DESC"))


def run(conn: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
    """One run by id, or None."""
    return _row("runs", conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone())


def latest_run(conn: sqlite3.Connection) -> dict[str, Any] | None:
    """The newest run, or None in a workspace without runs."""
    return _row("runs", conn.execute("SELECT * FROM runs ORDER BY created_at DESC, id DESC LIMIT 1").fetchone())


def run_of_process(conn: sqlite3.Connection, pid: int) -> dict[str, Any] | None:
    """The newest run whose engine is (or was) process `pid`, or None."""
    return _row("runs", conn.execute("SELECT * FROM runs WHERE pid = ? ORDER BY created_at DESC LIMIT 1",
                                     (pid,)).fetchone())


# ---- captures, cards, samples ------------------------------------------------------------------------------


def capture(conn: sqlite3.Connection, capture_id: str) -> dict[str, Any] | None:
    """One capture by id, or None."""
    return _row("captures", conn.execute("SELECT * FROM captures WHERE id = ?", (capture_id,)).fetchone())


def captures(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every capture in the workspace, newest first."""
    return _rows("captures", conn.execute("SELECT * FROM captures ORDER BY created_at DESC, id DESC"))


def sample_files(conn: sqlite3.Connection) -> dict[str, list[str]]:
    """Per capture id with sample rows: its sample files, each once (a channels-last twin shares its
    original's), relative to the workspace."""
    out: dict[str, list[str]] = {}
    for capture_id, path in conn.execute("SELECT DISTINCT capture_id, path FROM samples ORDER BY capture_id, path"):
        out.setdefault(capture_id, []).append(path)
    return out


def latest_capture(conn: sqlite3.Connection, model: str) -> dict[str, Any] | None:
    """The newest capture of `model`, or None."""
    return _row("captures", conn.execute(
        "SELECT * FROM captures WHERE model = ? ORDER BY created_at DESC, id DESC LIMIT 1", (model,)).fetchone())


def cards_of_capture(conn: sqlite3.Connection, capture_id: str) -> list[dict[str, Any]]:
    """Cards of a capture, largest share of the model first."""
    return _rows("cards", conn.execute(
        "SELECT * FROM cards WHERE capture_id = ? ORDER BY share DESC, card_id", (capture_id,)))


def sample_paths(conn: sqlite3.Connection, capture_id: str, card_id: str) -> list[str]:
    """A card's sample files in index order, relative to the workspace."""
    return [r[0] for r in conn.execute(
        "SELECT path FROM samples WHERE capture_id = ? AND card_id = ? ORDER BY idx", (capture_id, card_id))]


# ---- candidates ----------------------------------------------------------------------------------------------


def candidates(conn: sqlite3.Connection, run_id: str, card_id: str | None = None) -> list[dict[str, Any]]:
    """Candidates of a run (optionally of one card), every column, in the order they were added."""
    if card_id is None:
        rows = conn.execute("SELECT * FROM candidates WHERE run_id = ? ORDER BY rowid", (run_id,))
    else:
        rows = conn.execute("SELECT * FROM candidates WHERE run_id = ? AND card_id = ? ORDER BY rowid",
                            (run_id, card_id))
    return _rows("candidates", rows)


def candidate(conn: sqlite3.Connection, candidate_id: str) -> dict[str, Any] | None:
    """One candidate by id, every column, or None."""
    return _row("candidates", conn.execute("SELECT * FROM candidates WHERE id = ?", (candidate_id,)).fetchone())


def candidate_source(conn: sqlite3.Connection, candidate_id: str) -> str | None:
    """Only the CUDA source of a candidate (a parent, shown beside its child), or None."""
    row = conn.execute("SELECT source FROM candidates WHERE id = ?", (candidate_id,)).fetchone()
    return row[0] if row else None


@dataclass(frozen=True)
class CandidateHead:
    """A candidate without its bulk (source, logs, reports): what trees and tables show of it."""

    id: str
    card_id: str
    parent_id: str | None
    status: str
    category: str | None
    best_us: float | None
    eager_us: float | None
    speedup: float | None
    error_head: str  # first line of the error, at most 160 characters
    order: int  # rowid: proposal order within the run
    updated_at: float


_HEAD = ("SELECT rowid, id, card_id, parent_id, status, category, best_us, eager_us, speedup, "
         f"substr(coalesce(error, ''), 1, {_ERROR_HEAD_CHARS}) AS error_head, updated_at FROM candidates ")


def _heads(rows: Iterable[sqlite3.Row]) -> list[CandidateHead]:
    return [CandidateHead(r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9].split("\n", 1)[0], r[0], r[10])
            for r in rows]


def candidate_heads_added(conn: sqlite3.Connection, run_id: str, after_order: int = 0) -> list[CandidateHead]:
    """Candidates of a run added after the one with rowid `after_order`, in proposal order."""
    return _heads(conn.execute(_HEAD + "WHERE run_id = ? AND rowid > ? ORDER BY rowid", (run_id, after_order)))


def candidate_heads(conn: sqlite3.Connection, ids: Iterable[str]) -> list[CandidateHead]:
    """These candidates as they are now (ids not found are left out)."""
    ids = list(ids)
    out: list[CandidateHead] = []
    for i in range(0, len(ids), _IN_CHUNK):
        chunk = ids[i:i + _IN_CHUNK]
        out += _heads(conn.execute(_HEAD + f"WHERE id IN ({', '.join('?' * len(chunk))})", chunk))
    return out


def candidate_heads_updated(conn: sqlite3.Connection, run_id: str, since: float) -> list[CandidateHead]:
    """Candidates of a run whose row changed after `since` (unix seconds)."""
    return _heads(conn.execute(_HEAD + "WHERE run_id = ? AND updated_at > ?", (run_id, since)))


def status_counts(conn: sqlite3.Connection, run_id: str) -> dict[str, int]:
    """Candidates of a run per status."""
    return dict(conn.execute("SELECT status, count(*) FROM candidates WHERE run_id = ? GROUP BY status",
                             (run_id,)).fetchall())


def failure_counts(conn: sqlite3.Connection, run_id: str) -> dict[str, int]:
    """Rejected candidates of a run per category ('unknown' for none)."""
    return dict(conn.execute("SELECT coalesce(category, ?), count(*) FROM candidates "
                             "WHERE run_id = ? AND status = 'rejected' GROUP BY 1",
                             (UNKNOWN_CATEGORY, run_id)).fetchall())


def best_speedups(conn: sqlite3.Connection, run_id: str) -> dict[str, tuple[float | None, str | None]]:
    """Per card with a verified candidate in the run: (its best speedup, the card's op)."""
    return {r[0]: (r[1], r[2]) for r in conn.execute(
        "SELECT c.card_id, max(c.speedup), k.op FROM candidates c JOIN runs r ON r.id = c.run_id "
        "LEFT JOIN cards k ON k.capture_id = r.capture_id AND k.card_id = c.card_id "
        "WHERE c.run_id = ? AND c.status = 'verified' GROUP BY c.card_id", (run_id,))}


# ---- lanes, proposer calls, events -------------------------------------------------------------------------


def lanes_used_since(conn: sqlite3.Connection, run_id: str, after_id: int = 0) -> list[tuple[int, str]]:
    """(evaluation id, lane) of the run's lane uses after `after_id`, oldest first."""
    return [(r[0], r[1]) for r in conn.execute(
        "SELECT id, lane FROM evaluations WHERE run_id = ? AND id > ? ORDER BY id", (run_id, after_id))]


def busy_lanes(conn: sqlite3.Connection, run_id: str) -> dict[str, tuple[str, float]]:
    """Lanes evaluating right now: lane -> (candidate id, started at)."""
    return {r[0]: (r[1], r[2]) for r in conn.execute(
        "SELECT lane, candidate_id, started_at FROM evaluations WHERE run_id = ? AND finished_at IS NULL "
        "ORDER BY id", (run_id,))}


def llm_calls_since(conn: sqlite3.Connection, run_id: str, after_rowid: int = 0) -> list[tuple[int, bool]]:
    """(rowid, failed) of the run's proposer calls recorded after `after_rowid`."""
    return [(r[0], r[1] is not None) for r in conn.execute(
        "SELECT rowid, error FROM llm_calls WHERE run_id = ? AND rowid > ?", (run_id, after_rowid))]


def llm_call(conn: sqlite3.Connection, call_id: str) -> dict[str, Any] | None:
    """One proposer call (prompt and answer) by id, or None (calls may have been pruned)."""
    return _row("llm_calls", conn.execute("SELECT * FROM llm_calls WHERE id = ?", (call_id,)).fetchone())


def events_since(conn: sqlite3.Connection, run_id: str | None, seq: int = 0,
                 limit: int | None = None) -> list[dict[str, Any]]:
    """Events of a run (run_id None: events of no run) with seq > `seq`, oldest first."""
    sql, params = "SELECT * FROM events WHERE run_id IS ? AND seq > ? ORDER BY seq", [run_id, seq]
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return _rows("events", conn.execute(sql, params))


def last_event_ts(conn: sqlite3.Connection, run_id: str) -> float | None:
    """When the run's newest event was written, or None."""
    return conn.execute("SELECT max(ts) FROM events WHERE run_id = ?", (run_id,)).fetchone()[0]


# ---- exports ----------------------------------------------------------------------------------------------------


def exports(conn: sqlite3.Connection, run_id: str) -> list[dict[str, Any]]:
    """A run's recorded exports (`kforge-tui export`), newest first; [] in a workspace whose schema
    predates them (a viewer never migrates)."""
    if not _has_table(conn, "exports"):
        return []
    return _rows("exports", conn.execute(
        "SELECT * FROM exports WHERE run_id = ? ORDER BY finished_at DESC, rowid DESC", (run_id,)))


def latest_export(conn: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
    """The run's newest recorded export, or None."""
    if not _has_table(conn, "exports"):
        return None
    return _row("exports", conn.execute(
        "SELECT * FROM exports WHERE run_id = ? ORDER BY finished_at DESC, rowid DESC LIMIT 1", (run_id,)).fetchone())


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() \
        is not None


# ---- the one write of a viewer --------------------------------------------------------------------------------


def add_control(db_path: str | os.PathLike[str], run_id: str, command: str, card_id: str | None = None,
                args: Mapping[str, Any] | None = None) -> int:
    """Queue a command for the run's engine in its own short transaction; returns the row's seq.

    ValueError for a command not in CONTROL_COMMANDS; sqlite3.OperationalError when the file cannot be
    written (a read-only workspace).
    """
    if command not in CONTROL_COMMANDS:
        raise ValueError(f"unknown control command {command!r}; one of {', '.join(CONTROL_COMMANDS)}")
    conn = sqlite3.connect(Path(db_path), timeout=_BUSY_TIMEOUT_S, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
        cur = conn.execute("INSERT INTO controls (run_id, ts, command, card_id, args) VALUES (?, ?, ?, ?, ?)",
                           (run_id, time.time(), command, card_id, encode_json(None if args is None else dict(args))))
        return int(cur.lastrowid or 0)
    finally:
        conn.close()
