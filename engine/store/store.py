"""Async access to the workspace database (aiosqlite, WAL) plus a sync read-only opener for the TUI."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path, PurePath
from types import TracebackType
from typing import Any

import aiosqlite

from engine.errors import UsageError
from engine.outcomes import CONTROL_COMMANDS, EXPORT_STATUSES, RUN_STATUSES
from engine.store import schema

# Columns holding JSON text; encoded/decoded only by `row_from_dict` / `row_to_dict`.
JSON_COLUMNS: dict[str, frozenset[str]] = {
    "captures": frozenset({"notes", "skipped"}),
    "cards": frozenset({"signature", "module_paths", "eager_stats", "outputs", "ref_stats"}),
    "runs": frozenset({"config"}),
    "candidates": frozenset({"launch_spec", "verification", "timing", "params"}),
    "evaluations": frozenset({"verdict"}),
    "events": frozenset({"payload"}),
    "controls": frozenset({"args"}),
    "exports": frozenset({"targets", "checks", "variants", "excluded", "warnings", "options", "env"}),
}
# INTEGER 0/1 columns handed back as bool.
BOOL_COLUMNS: dict[str, frozenset[str]] = {
    "captures": frozenset({"small"}),
    "search_nodes": frozenset({"dead"}),
    "cards": frozenset({"output_varies"}),
}

# Columns update_run may set; ids, capture, model and created_at are fixed once a run exists.
RUN_UPDATABLE = frozenset(
    {"status", "stopped_by", "pid", "tokens_in", "tokens_out", "cost_usd", "config", "provider"}
)

# Columns update_candidate may set; identity, code and provenance are fixed once a candidate exists.
CANDIDATE_UPDATABLE = frozenset(
    {"status", "category", "compile_log", "error", "verification", "timing", "best_us", "speedup",
     "llm_call_id", "model_name", "eager_us", "speedup_low", "speedup_high"}
)

_BUSY_TIMEOUT_MS = 5000


class StoreError(UsageError, RuntimeError):
    """The workspace database cannot be used by this version of Kernel Forge (bad input: exit code 2)."""


# The key of a capture's `notes` that records its sample files were removed (`kforge-tui prune`): {"at": unix
# seconds, "files": how many, "bytes": their size as stored}. Its sample rows go with them, so nothing names a
# file that is not there; the cards stay.
SAMPLES_REMOVED = "samples_removed"


def samples_removed(capture: Mapping[str, Any] | None) -> str | None:
    """How a capture's samples went, in words ("removed by 'kforge-tui prune' on 2026-12-05 14:02"), or None
    while it has them."""
    notes = (capture or {}).get("notes")
    note = notes.get(SAMPLES_REMOVED) if isinstance(notes, dict) else None
    if not isinstance(note, dict):
        return None
    at = note.get("at")
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if isinstance(at, (int, float)) else "an unknown date"
    return f"removed by 'kforge-tui prune' on {when}"


def unusable_database(path: str | os.PathLike[str], exc: sqlite3.DatabaseError | str) -> StoreError:
    """The one-line error for a file that is not a valid SQLite database (random bytes, a truncated copy, pages
    scrambled by a torn write) or holds no Kernel Forge tables (a 0-byte file); `exc` is SQLite's error or the
    reason in words."""
    return StoreError(f"workspace database {Path(path).absolute()} is not a valid SQLite database ({exc}); "
                      "move it aside (a new run creates a fresh one) or use another --workspace")


def is_corruption(exc: BaseException) -> bool:
    """A damaged or foreign file ("file is not a database", "database disk image is malformed"), as opposed to a
    locked or read-only one (OperationalError)."""
    return type(exc) is sqlite3.DatabaseError


def new_id(prefix: str) -> str:
    """A fresh short id such as `run-3f9c0a1b2c3d` (48 random bits: ample within one workspace)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def candidate_hash(source: str, launch_spec: str | Mapping[str, Any] | None) -> str:
    """sha256 of the source and spec with whitespace runs collapsed: reformatting is not a new candidate."""
    spec = launch_spec if isinstance(launch_spec, str) else encode_json(launch_spec) or ""
    text = " ".join(source.split()) + "\n--- launch spec ---\n" + " ".join(spec.split())
    return hashlib.sha256(text.encode()).hexdigest()


def encode_json(value: Any) -> str | None:
    """Canonical JSON text (sorted keys, no spaces) so equal values compare equal as text; None stays NULL."""
    if value is None:
        return None
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def decode_json(text: str | None) -> Any:
    """Inverse of `encode_json`."""
    return None if text is None else json.loads(text)


def row_from_dict(table: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """Python values -> column values for `table` (JSON columns encoded, bools and paths made plain)."""
    json_cols = JSON_COLUMNS.get(table, frozenset())
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key in json_cols:
            value = encode_json(value)
        elif isinstance(value, bool):
            value = int(value)
        elif isinstance(value, PurePath):
            value = value.as_posix()
        out[key] = value
    return out


def row_to_dict(table: str, row: sqlite3.Row | None,
                decode: Callable[[str | None], Any] | None = None) -> dict[str, Any] | None:
    """Column values of `table` -> Python values (JSON decoded by `decode`, default `decode_json`; 0/1 flags
    as bool); None passes through."""
    decode = decode or decode_json
    if row is None:
        return None
    json_cols = JSON_COLUMNS.get(table, frozenset())
    bool_cols = BOOL_COLUMNS.get(table, frozenset())
    out: dict[str, Any] = {}
    for key in row.keys():
        value = row[key]
        if key in json_cols:
            value = decode(value)
        elif key in bool_cols and value is not None:
            value = bool(value)
        out[key] = value
    return out


def _check_version(found: int, db_file: Path) -> None:
    latest = schema.latest_version()
    if found > latest:
        raise StoreError(
            f"workspace {db_file.parent} was written by a newer Kernel Forge (schema {found} > {latest}); "
            f"upgrade kernel-forge to open {db_file}, or use another --workspace"
        )


def open_readonly(db_path: str | os.PathLike[str], *, threads: bool = False) -> sqlite3.Connection:
    """Sync read-only connection (Row factory) for `engine.store.read`; never writes or migrates.

    `threads`: the connection may be used from several threads (the caller serialises them).
    """
    path = Path(db_path).absolute()
    if not path.is_file():
        raise StoreError(f"no Kernel Forge database at {path}; run `kforge capture` in that workspace first")
    try:
        return _open_readonly(path, threads, immutable=False)
    except sqlite3.OperationalError as e:
        # A WAL database in a folder this user cannot write (another user's workspace, a read-only
        # mount, an archived run): SQLite cannot create the -shm file readers need. No writer has the
        # database open then (it would have created that file), so the file as it is holds every
        # committed row: read it as immutable.
        if "unable to open" not in str(e) or Path(f"{path}-shm").exists() or writable(path):
            raise StoreError(f"cannot read the workspace database {path} ({e})") from None
        try:
            return _open_readonly(path, threads, immutable=True)
        except sqlite3.OperationalError as e2:
            raise StoreError(f"cannot read the workspace database {path} ({e2})") from None


def writable(path: Path) -> bool:
    """Whether this process may write the database file and create files beside it (its -wal, -shm)."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def _open_readonly(path: Path, threads: bool, *, immutable: bool) -> sqlite3.Connection:
    # as_uri() percent-encodes, so spaces, '?' or '#' in the path cannot break the URI.
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro{'&immutable=1' if immutable else ''}", uri=True,
                           timeout=_BUSY_TIMEOUT_MS / 1000, check_same_thread=not threads)
    try:
        conn.row_factory = sqlite3.Row
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        _check_version(version, path)
        if version == 0 and conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
            # A 0-byte kforge.db (a crash or a full disk as it was created): `runs` said "internal error:
            # OperationalError: no such table: runs". A writer (Store.open) makes its tables; a reader cannot.
            raise unusable_database(path, "it holds no tables: an empty file")
    except sqlite3.DatabaseError as e:
        conn.close()
        if is_corruption(e):
            raise unusable_database(path, e) from None
        raise
    except BaseException:
        conn.close()
        raise
    return conn


def pack_single_file(db_path: str | os.PathLike[str]) -> None:
    """Rewrite a database as one self-contained file (rollback journal, vacuumed): to ship it, e.g. the demo."""
    conn = sqlite3.connect(Path(db_path))
    try:
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("VACUUM")
    finally:
        conn.close()


class Store:
    """The workspace database. Open with `async with await Store.open(path) as store:`."""

    def __init__(self, conn: aiosqlite.Connection, db_path: Path) -> None:
        """Use `Store.open`; this only wraps an already configured connection."""
        self._conn = conn
        self.db_path = db_path
        # One aiosqlite connection is shared by every coroutine; without this lock a statement from
        # one task could land inside another task's open transaction and commit or roll back with it.
        self._lock = asyncio.Lock()
        self._columns: dict[str, frozenset[str]] = {}

    # ---- lifecycle -------------------------------------------------------------------------------

    @classmethod
    async def open(cls, db_path: str | os.PathLike[str]) -> Store:
        """Connect, set the PRAGMAs, apply pending migrations (refusing a newer schema)."""
        path = Path(db_path)
        # isolation_level=None: the sqlite3 module never opens transactions implicitly; _transaction does.
        conn = await aiosqlite.connect(path, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            # busy_timeout first so the WAL switch itself waits for another process holding a lock.
            await conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            await conn.execute("PRAGMA journal_mode = WAL")
            await conn.execute("PRAGMA synchronous = NORMAL")
            await conn.execute("PRAGMA foreign_keys = ON")
            store = cls(conn, path)
            await store._migrate()
            await store._load_columns()
        except sqlite3.DatabaseError as e:
            await conn.close()
            if is_corruption(e):
                raise unusable_database(path, e) from None
            raise
        except BaseException:
            await conn.close()
            raise
        return store

    async def close(self) -> None:
        """Close the connection (idempotent)."""
        await self._conn.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _migrate(self) -> None:
        migrations = schema.MIGRATIONS
        versions = [version for version, _ in migrations]
        if versions != sorted(set(versions)) or (versions and versions[0] < 1):
            raise StoreError(f"schema migrations must have increasing versions >= 1, got {versions}")
        _check_version(await self._user_version(), self.db_path)
        for version, script in migrations:
            async with self._transaction():
                # Re-read inside the write lock: another process may have migrated while we waited.
                if await self._user_version() >= version:
                    continue
                for statement in schema.split_statements(script):
                    await self._conn.execute(statement)
                # user_version lives in the database header, so it commits or rolls back with the DDL.
                await self._conn.execute(f"PRAGMA user_version = {int(version)}")

    async def _user_version(self) -> int:
        async with self._conn.execute("PRAGMA user_version") as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def _load_columns(self) -> None:
        # Read from the live schema so columns added by later migrations are accepted automatically.
        tables = await self._conn.execute_fetchall(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
        for (name,) in tables:
            info = await self._conn.execute_fetchall(f"PRAGMA table_info({name})")
            self._columns[name] = frozenset(col["name"] for col in info)

    # ---- plumbing ----------------------------------------------------------------------------------

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """BEGIN IMMEDIATE ... COMMIT under the lock; any exception rolls everything back."""
        async with self._lock:
            # IMMEDIATE takes the write lock up front, so busy_timeout applies here rather than a
            # SQLITE_BUSY surfacing mid-transaction when a read lock cannot be upgraded.
            await self._to_the_end("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                # Statements of the body still queued run first (one queue, in order), then this.
                if self._conn.in_transaction:
                    await asyncio.shield(self._conn.execute("ROLLBACK"))
                raise
            await self._to_the_end("COMMIT")

    async def _to_the_end(self, sql: str) -> None:
        """Run BEGIN or COMMIT. It runs on aiosqlite's thread whatever happens to this await, so a cancellation
        (Ctrl-C) while it is queued waits for it, then ends a transaction it leaves open (a BEGIN that ran, a
        COMMIT that failed) and re-raises. A ROLLBACK queued behind a COMMIT that succeeded would find no
        transaction and raise; one behind a BEGIN nobody ends would leave the next write inside it."""
        step = asyncio.ensure_future(self._conn.execute(sql))
        try:
            await asyncio.shield(step)
        except BaseException:
            with contextlib.suppress(BaseException):
                await step  # its own error (a failed COMMIT) is the one raised below
            with contextlib.suppress(BaseException):
                if self._conn.in_transaction:
                    await asyncio.shield(self._conn.execute("ROLLBACK"))
            raise

    async def _fetchall(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        async with self._lock:
            return list(await self._conn.execute_fetchall(sql, tuple(params)))

    async def _fetchone(self, sql: str, params: Iterable[Any] = ()) -> sqlite3.Row | None:
        rows = await self._fetchall(sql, params)
        return rows[0] if rows else None

    def _insert_sql(self, table: str, row: Mapping[str, Any]) -> tuple[str, list[Any]]:
        unknown = set(row) - self._columns[table]
        if unknown:
            raise ValueError(f"unknown column(s) for {table}: {', '.join(sorted(unknown))}")
        cols = list(row)
        sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})"
        return sql, [row[c] for c in cols]

    async def _insert(self, conn: aiosqlite.Connection, table: str, values: Mapping[str, Any]) -> int:
        """Insert one row inside an open transaction; returns its rowid."""
        sql, params = self._insert_sql(table, row_from_dict(table, values))
        cursor = await conn.execute(sql, params)
        rowid = cursor.lastrowid
        await cursor.close()
        return int(rowid or 0)

    # ---- captures, cards, samples ------------------------------------------------------------------

    async def save_capture(
        self, capture: Mapping[str, Any], cards: list[Mapping[str, Any]], samples: list[Mapping[str, Any]]
    ) -> None:
        """Insert a capture with its cards and sample rows in one transaction (all or nothing)."""
        capture_id = capture.get("id")
        if not capture_id:
            raise ValueError("capture needs an 'id' (see engine.store.new_id)")
        capture_row = {"created_at": time.time(), **capture}
        card_rows = [_with_capture_id(card, capture_id, "card") for card in cards]
        sample_rows = [_with_capture_id(sample, capture_id, "sample") for sample in samples]
        for sample in sample_rows:
            # Relative paths keep a workspace relocatable (copied to another machine, renamed).
            if PurePath(sample.get("path", "")).is_absolute():
                raise ValueError(f"sample path must be relative to the workspace, got {sample['path']}")
        async with self._transaction() as conn:
            await self._insert(conn, "captures", capture_row)
            for card in card_rows:
                await self._insert(conn, "cards", card)
            for sample in sample_rows:
                await self._insert(conn, "samples", sample)

    async def list_captures(self, model: str | None = None) -> list[dict[str, Any]]:
        """Captures, newest first, optionally of one model."""
        if model is None:
            rows = await self._fetchall("SELECT * FROM captures ORDER BY created_at DESC, id DESC")
        else:
            rows = await self._fetchall(
                "SELECT * FROM captures WHERE model = ? ORDER BY created_at DESC, id DESC", (model,)
            )
        return [_decoded("captures", r) for r in rows]

    async def latest_capture(self, model: str | None = None) -> dict[str, Any] | None:
        """The newest capture (of `model` if given), or None."""
        captures = await self.list_captures(model)
        return captures[0] if captures else None

    async def get_capture(self, capture_id: str) -> dict[str, Any] | None:
        """One capture by id, or None."""
        row = await self._fetchone("SELECT * FROM captures WHERE id = ?", (capture_id,))
        return row_to_dict("captures", row)

    async def get_cards(self, capture_id: str) -> list[dict[str, Any]]:
        """Cards of a capture, largest share of the model first."""
        rows = await self._fetchall(
            "SELECT * FROM cards WHERE capture_id = ? ORDER BY share DESC, card_id", (capture_id,)
        )
        return [_decoded("cards", r) for r in rows]

    async def count_samples(self, capture_id: str) -> int:
        """Sample files stored for a capture, over all its cards."""
        rows = await self._fetchall("SELECT COUNT(*) AS n FROM samples WHERE capture_id = ?", (capture_id,))
        return int(rows[0]["n"]) if rows else 0

    async def get_samples(self, capture_id: str, card_id: str) -> list[dict[str, Any]]:
        """Sample rows of one card in index order (paths relative to the workspace)."""
        rows = await self._fetchall(
            "SELECT * FROM samples WHERE capture_id = ? AND card_id = ? ORDER BY idx", (capture_id, card_id)
        )
        return [_decoded("samples", r) for r in rows]

    async def forget_samples(self, capture_id: str, runs_seen: Mapping[str, tuple[str, int | None]]) -> bool:
        """Drop a capture's sample rows and note it (SAMPLES_REMOVED), in one transaction, if its runs are still
        exactly `runs_seen` (id -> (status, pid)); False, nothing changed, when a run started or resumed on it
        since. The caller removes the files after: the database never names a sample file that is gone."""
        async with self._transaction() as conn:
            cursor = await conn.execute("SELECT id, status, pid FROM runs WHERE capture_id = ?", (capture_id,))
            runs = {r["id"]: (r["status"], r["pid"]) for r in await cursor.fetchall()}
            await cursor.close()
            cursor = await conn.execute("SELECT notes FROM captures WHERE id = ?", (capture_id,))
            row = await cursor.fetchone()
            await cursor.close()
            if row is None:
                raise KeyError(f"no capture {capture_id!r}")
            if runs != dict(runs_seen):
                return False
            # A channels-last twin's rows name its original's files: each file counts once.
            cursor = await conn.execute(
                "SELECT COUNT(*) AS files, COALESCE(SUM(nbytes), 0) AS nbytes FROM (SELECT MAX(nbytes) AS nbytes "
                "FROM samples WHERE capture_id = ? GROUP BY path)", (capture_id,))
            size = await cursor.fetchone()
            await cursor.close()
            notes = decode_json(row["notes"]) or {}
            notes[SAMPLES_REMOVED] = {"at": time.time(), "files": size["files"], "bytes": size["nbytes"]}
            await conn.execute("DELETE FROM samples WHERE capture_id = ?", (capture_id,))
            await conn.execute("UPDATE captures SET notes = ? WHERE id = ?", (encode_json(notes), capture_id))
        return True

    async def update_card_eager(
        self,
        capture_id: str,
        card_id: str,
        eager_us: float | None,
        roofline_us: float | None,
        eager_stats: Mapping[str, Any] | None,
    ) -> None:
        """Record the eager baseline timing of a card; KeyError if the card does not exist."""
        values = row_from_dict("cards", {"eager_stats": eager_stats})
        async with self._transaction() as conn:
            cursor = await conn.execute(
                "UPDATE cards SET eager_us = ?, roofline_us = ?, eager_stats = ? "
                "WHERE capture_id = ? AND card_id = ?",
                (eager_us, roofline_us, values["eager_stats"], capture_id, card_id),
            )
            changed = cursor.rowcount
            await cursor.close()
        if changed == 0:
            raise KeyError(f"no card {card_id!r} in capture {capture_id!r}")

    async def update_card_refs(
        self,
        capture_id: str,
        card_id: str,
        *,
        compile_us: float | None,
        copy_us: float | None,
        ref_stats: Mapping[str, Any] | None,
    ) -> None:
        """Record a card's reference timings (torch.compile, the lane's copy of its bytes) and their stats;
        KeyError if the card does not exist."""
        values = row_from_dict("cards", {"ref_stats": ref_stats})
        async with self._transaction() as conn:
            cursor = await conn.execute(
                "UPDATE cards SET compile_us = ?, copy_us = ?, ref_stats = ? WHERE capture_id = ? AND card_id = ?",
                (compile_us, copy_us, values["ref_stats"], capture_id, card_id),
            )
            changed = cursor.rowcount
            await cursor.close()
        if changed == 0:
            raise KeyError(f"no card {card_id!r} in capture {capture_id!r}")

    # ---- runs --------------------------------------------------------------------------------------

    async def create_run(
        self,
        capture_id: str,
        model: str,
        provider: str,
        config: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
        status: str = "created",
        pid: int | None = None,
    ) -> dict[str, Any]:
        """Insert a run (id from `new_id('run')` unless given) and return its row."""
        _check_choice("status", status, RUN_STATUSES)
        now = time.time()
        row = {
            "id": run_id or new_id("run"),
            "capture_id": capture_id,
            "model": model,
            "provider": provider,
            "config": dict(config or {}),
            "status": status,
            "pid": pid,
            "created_at": now,
            "updated_at": now,
        }
        async with self._transaction() as conn:
            await self._insert(conn, "runs", row)
        run = await self.get_run(row["id"])
        assert run is not None  # just inserted under the same connection
        return run

    async def get_run(self, run_id: str) -> dict[str, Any] | None:
        """One run by id, or None."""
        return row_to_dict("runs", await self._fetchone("SELECT * FROM runs WHERE id = ?", (run_id,)))

    async def list_runs(self, capture_id: str | None = None) -> list[dict[str, Any]]:
        """Runs, newest first, optionally of one capture."""
        if capture_id is None:
            rows = await self._fetchall("SELECT * FROM runs ORDER BY created_at DESC, id DESC")
        else:
            rows = await self._fetchall(
                "SELECT * FROM runs WHERE capture_id = ? ORDER BY created_at DESC, id DESC", (capture_id,)
            )
        return [_decoded("runs", r) for r in rows]

    async def update_run(self, run_id: str, **fields: Any) -> None:
        """Set whitelisted run columns (RUN_UPDATABLE) and bump updated_at; ValueError on others."""
        if "status" in fields and not (set(fields) - RUN_UPDATABLE):
            _check_choice("status", fields["status"], RUN_STATUSES)
        await self._update_row("runs", "run", RUN_UPDATABLE, run_id, fields)

    async def claim_run(self, run_id: str, seen: Mapping[str, Any], **fields: Any) -> bool:
        """update_run, only while the row still has the status and pid it had in `seen` (a row read before): of two
        processes that resume one run at once, the first claims it (True) and the other finds it changed (False)."""
        unknown = set(fields) - RUN_UPDATABLE
        if unknown:
            raise ValueError(f"claim_run cannot set {', '.join(sorted(unknown))}")
        if "status" in fields:
            _check_choice("status", fields["status"], RUN_STATUSES)
        values = row_from_dict("runs", {**fields, "updated_at": time.time()})
        assignments = ", ".join(f"{col} = ?" for col in values)   # column names from the whitelist only
        async with self._transaction() as conn:
            cursor = await conn.execute(f"UPDATE runs SET {assignments} WHERE id = ? AND status = ? AND pid IS ?",
                                        [*values.values(), run_id, seen["status"], seen.get("pid")])
            changed = cursor.rowcount
            await cursor.close()
        return changed == 1

    async def _update_row(self, table: str, what: str, allowed: frozenset[str] | set[str], row_id: str,
                          fields: dict[str, Any], event: dict[str, Any] | None = None) -> None:
        """UPDATE one row by id: only whitelisted columns, updated_at bumped; KeyError when no such row.
        `event` (an events row): inserted in the same transaction, so both are on disk or neither."""
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"update_{what} cannot set {', '.join(sorted(unknown))}; "
                             f"allowed: {', '.join(sorted(allowed))}")
        values = row_from_dict(table, {**fields, "updated_at": time.time()})
        # Column names come from the whitelist above, never from the caller unchecked.
        assignments = ", ".join(f"{col} = ?" for col in values)
        async with self._transaction() as conn:
            cursor = await conn.execute(f"UPDATE {table} SET {assignments} WHERE id = ?", [*values.values(), row_id])
            changed = cursor.rowcount
            await cursor.close()
            if changed and event is not None:
                await self._insert(conn, "events", event)
        if changed == 0:
            raise KeyError(f"no {what} {row_id!r}")

    # ---- LLM calls and candidates ------------------------------------------------------------------

    async def add_llm_call(
        self,
        run_id: str,
        card_id: str | None,
        provider: str,
        model_name: str,
        prompt: str,
        response: str | None,
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost_usd: float = 0.0,
        latency_s: float | None = None,
        error: str | None = None,
    ) -> str:
        """Record one provider exchange (prompt as sent, never a key); returns its id (`llm-…`)."""
        row = {
            "id": new_id("llm"),
            "run_id": run_id,
            "card_id": card_id,
            "provider": provider,
            "model_name": model_name,
            "prompt": prompt,
            "response": response,
            "tokens_in": tokens_in,
            "tokens_out": tokens_out,
            "cost_usd": cost_usd,
            "latency_s": latency_s,
            "error": error,
            "created_at": time.time(),
        }
        async with self._transaction() as conn:
            await self._insert(conn, "llm_calls", row)
        return row["id"]

    async def llm_calls(self, run_id: str, card_id: str | None = None) -> list[dict[str, Any]]:
        """LLM calls of a run (optionally of one card) in the order they were recorded."""
        if card_id is None:
            rows = await self._fetchall("SELECT * FROM llm_calls WHERE run_id = ? ORDER BY rowid", (run_id,))
        else:
            rows = await self._fetchall(
                "SELECT * FROM llm_calls WHERE run_id = ? AND card_id = ? ORDER BY rowid", (run_id, card_id)
            )
        return [_decoded("llm_calls", r) for r in rows]

    async def get_llm_call(self, call_id: str) -> dict[str, Any] | None:
        """One LLM call by id, or None (calls may have been pruned)."""
        return row_to_dict("llm_calls", await self._fetchone("SELECT * FROM llm_calls WHERE id = ?", (call_id,)))

    async def add_candidate(
        self,
        run_id: str,
        card_id: str,
        *,
        parent_id: str | None,
        source: str,
        launch_spec: str | Mapping[str, Any] | None,
        proposer: str,
        model_name: str | None = None,
        llm_call_id: str | None = None,
        status: str,
        category: str | None = None,
        compile_log: str | None = None,
        error: str | None = None,
        verification: Any = None,
        timing: Any = None,
        best_us: float | None = None,
        speedup: float | None = None,
        candidate_id: str | None = None,
        intent: str | None = None,
        params: Mapping[str, Any] | None = None,
        focus: str | None = None,
    ) -> tuple[str, bool]:
        """Insert a candidate; returns `(id, created)`.

        Duplicates (same run and card, same `candidate_hash` of source and spec) are not inserted again:
        the existing candidate's id comes back with `created=False`, and the caller should not evaluate it
        again. `launch_spec` is kept as given (spec text as a JSON string, or a dict). A candidate with no
        source (an unusable answer kept for the record) never counts as a duplicate.
        """
        digest = candidate_hash(source, launch_spec)
        if not source.strip():
            digest = hashlib.sha256(f"{digest}:{llm_call_id or new_id('none')}".encode()).hexdigest()
        now = time.time()
        row = {
            "id": candidate_id or new_id("cand"),
            "run_id": run_id,
            "card_id": card_id,
            "parent_id": parent_id,
            "intent": intent,
            "focus": focus,
            "params": dict(params) if params is not None else None,
            "source": source,
            "launch_spec": launch_spec if launch_spec is not None else {},
            "source_hash": digest,
            "proposer": proposer,
            "model_name": model_name,
            "llm_call_id": llm_call_id,
            "status": status,
            "category": category,
            "compile_log": compile_log,
            "error": error,
            "verification": verification,
            "timing": timing,
            "best_us": best_us,
            "speedup": speedup,
            "created_at": now,
            "updated_at": now,
        }
        async with self._transaction() as conn:
            # Inside BEGIN IMMEDIATE: no other writer can insert the same hash between check and insert.
            cursor = await conn.execute(
                "SELECT id FROM candidates WHERE run_id = ? AND card_id = ? AND source_hash = ?",
                (run_id, card_id, digest),
            )
            existing = await cursor.fetchone()
            await cursor.close()
            if existing is not None:
                return str(existing[0]), False
            await self._insert(conn, "candidates", row)
        return row["id"], True

    async def update_candidate(self, candidate_id: str, **fields: Any) -> None:
        """Set whitelisted candidate columns (CANDIDATE_UPDATABLE) and bump updated_at; ValueError on others."""
        await self._update_row("candidates", "candidate", CANDIDATE_UPDATABLE, candidate_id, fields)

    async def finish_candidate(self, candidate_id: str, fields: dict[str, Any], run_id: str, kind: str,
                               payload: Mapping[str, Any], card_id: str | None = None) -> None:
        """`update_candidate(candidate_id, **fields)` and `add_event(run_id, kind, payload, card_id)` in one
        transaction: a process killed in between leaves neither (a finished candidate always has its event)."""
        event = {"run_id": run_id, "ts": time.time(), "kind": kind, "card_id": card_id, "payload": dict(payload)}
        await self._update_row("candidates", "candidate", CANDIDATE_UPDATABLE, candidate_id, fields, event=event)

    async def get_candidate(self, candidate_id: str) -> dict[str, Any] | None:
        """One candidate by id, or None."""
        row = await self._fetchone("SELECT * FROM candidates WHERE id = ?", (candidate_id,))
        return row_to_dict("candidates", row)

    async def candidates(self, run_id: str, card_id: str | None = None) -> list[dict[str, Any]]:
        """Candidates of a run (optionally of one card) in the order they were added."""
        if card_id is None:
            rows = await self._fetchall("SELECT * FROM candidates WHERE run_id = ? ORDER BY rowid", (run_id,))
        else:
            rows = await self._fetchall(
                "SELECT * FROM candidates WHERE run_id = ? AND card_id = ? ORDER BY rowid", (run_id, card_id)
            )
        return [_decoded("candidates", r) for r in rows]

    # ---- lane use ------------------------------------------------------------------------------------

    async def start_evaluation(self, run_id: str, candidate_id: str, lane: str) -> int:
        """A lane began evaluating a candidate; returns the evaluations row id for `finish_evaluation`."""
        row = {"run_id": run_id, "candidate_id": candidate_id, "lane": lane, "started_at": time.time()}
        async with self._transaction() as conn:
            return await self._insert(conn, "evaluations", row)

    async def finish_evaluation(self, evaluation_id: int, verdict: str, category: str | None = None) -> None:
        """The lane let go of the candidate (`verdict` is the candidate's status, or 'interrupted')."""
        async with self._transaction() as conn:
            await conn.execute(
                "UPDATE evaluations SET finished_at = ?, verdict = ?, category = ? WHERE id = ?",
                (time.time(), encode_json(verdict), category, evaluation_id),
            )

    async def close_open_evaluations(self, run_id: str) -> int:
        """Mark evaluations a dead engine left open as interrupted (on resume); returns how many."""
        async with self._transaction() as conn:
            cursor = await conn.execute(
                "UPDATE evaluations SET finished_at = ?, verdict = ? WHERE run_id = ? AND finished_at IS NULL",
                (time.time(), encode_json("interrupted"), run_id),
            )
            changed = cursor.rowcount
            await cursor.close()
        return changed

    # ---- search trees ------------------------------------------------------------------------------

    async def save_search_nodes(self, run_id: str, card_id: str, nodes: list[Mapping[str, Any]]) -> None:
        """Insert or update a card's search-tree nodes (parents before children): visits, value, best value
        and dead flag as the search's backup left them."""
        now = time.time()
        async with self._transaction() as conn:
            for n in nodes:
                await conn.execute(
                    "INSERT INTO search_nodes (run_id, card_id, node_id, parent_node_id, candidate_id, visits, value,"
                    " best_value, dead, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT(run_id, node_id) DO UPDATE SET visits = excluded.visits, value = excluded.value,"
                    " best_value = excluded.best_value, dead = excluded.dead",
                    (run_id, card_id, n["node_id"], n.get("parent_node_id"), n.get("candidate_id"),
                     int(n.get("visits", 0)), float(n.get("value", 0.0)), n.get("best_value"),
                     int(bool(n.get("dead"))), now))

    async def search_nodes(self, run_id: str, card_id: str | None = None) -> list[dict[str, Any]]:
        """A run's search-tree nodes (one card's with card_id), in the order they were created."""
        sql, params = "SELECT * FROM search_nodes WHERE run_id = ?", [run_id]
        if card_id is not None:
            sql += " AND card_id = ?"
            params.append(card_id)
        rows = await self._fetchall(sql + " ORDER BY created_at, rowid", params)
        return [_decoded("search_nodes", r) for r in rows]

    async def evaluations(self, run_id: str) -> list[dict[str, Any]]:
        """Lane uses of a run, oldest first."""
        rows = await self._fetchall("SELECT * FROM evaluations WHERE run_id = ? ORDER BY id", (run_id,))
        return [_decoded("evaluations", r) for r in rows]

    # ---- events and controls -----------------------------------------------------------------------

    async def add_event(
        self, run_id: str | None, kind: str, payload: Mapping[str, Any], card_id: str | None = None
    ) -> int:
        """Append an event; returns its seq (monotonic, never reused)."""
        row = {
            "run_id": run_id,
            "ts": time.time(),
            "kind": kind,
            "card_id": card_id,
            "payload": dict(payload),
        }
        async with self._transaction() as conn:
            return await self._insert(conn, "events", row)

    async def events_since(
        self, run_id: str | None, seq: int, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Events of a run (run_id None: events of no run) with seq > `seq`, oldest first."""
        # `IS` rather than `=` so run_id None matches run-less events; SQLite still uses the index.
        sql = "SELECT * FROM events WHERE run_id IS ? AND seq > ? ORDER BY seq"
        params: list[Any] = [run_id, seq]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [_decoded("events", r) for r in await self._fetchall(sql, params)]

    async def add_control(
        self,
        run_id: str,
        command: str,
        card_id: str | None = None,
        args: Mapping[str, Any] | None = None,
    ) -> int:
        """Queue a command for a running search; returns its seq."""
        _check_choice("command", command, CONTROL_COMMANDS)
        row = {
            "run_id": run_id,
            "ts": time.time(),
            "command": command,
            "card_id": card_id,
            "args": None if args is None else dict(args),
        }
        async with self._transaction() as conn:
            return await self._insert(conn, "controls", row)

    async def pending_controls(self, run_id: str) -> list[dict[str, Any]]:
        """Unconsumed commands of a run, oldest first."""
        rows = await self._fetchall(
            "SELECT * FROM controls WHERE run_id = ? AND consumed_at IS NULL ORDER BY seq", (run_id,)
        )
        return [_decoded("controls", r) for r in rows]

    async def consume_control(self, seq: int) -> bool:
        """Mark a command consumed; False if it was already consumed or does not exist."""
        async with self._transaction() as conn:
            cursor = await conn.execute(
                "UPDATE controls SET consumed_at = ? WHERE seq = ? AND consumed_at IS NULL",
                (time.time(), seq),
            )
            changed = cursor.rowcount
            await cursor.close()
        return changed == 1


    # ---- exports ---------------------------------------------------------------------------------------------

    async def add_export(self, export: Mapping[str, Any]) -> str:
        """Record one finished export of a run (schema v6 `exports`) in one transaction; returns its id."""
        _check_choice("status", export.get("status", ""), EXPORT_STATUSES)
        row = {"id": export.get("id") or new_id("export"), **{k: v for k, v in export.items() if k != "id"}}
        async with self._transaction() as conn:
            await self._insert(conn, "exports", row)
        return row["id"]

    async def exports(self, run_id: str) -> list[dict[str, Any]]:
        """A run's recorded exports, newest first."""
        rows = await self._fetchall(
            "SELECT * FROM exports WHERE run_id = ? ORDER BY finished_at DESC, rowid DESC", (run_id,))
        return [_decoded("exports", r) for r in rows]


def _decoded(table: str, row: sqlite3.Row) -> dict[str, Any]:
    out = row_to_dict(table, row)
    assert out is not None
    return out


def _with_capture_id(values: Mapping[str, Any], capture_id: str, what: str) -> dict[str, Any]:
    """Fill in capture_id, refusing a row that names a different capture."""
    given = values.get("capture_id", capture_id)
    if given != capture_id:
        raise ValueError(f"{what} has capture_id {given!r} but the capture is {capture_id!r}")
    return {**values, "capture_id": capture_id}


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
