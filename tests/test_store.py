"""Workspace resolution, schema migrations and the async Store."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sqlite3
from pathlib import Path

import pytest

from engine.store import (
    Store,
    StoreError,
    WorkspaceError,
    db_path,
    ensure_workspace,
    latest_version,
    open_readonly,
    resolve_workspace,
    schema,
)

# ---- fixtures ---------------------------------------------------------------------------------------


def _capture(capture_id: str = "cap-1", model: str = "resnet50", created_at: float = 1000.0) -> dict:
    return {
        "id": capture_id,
        "model": model,
        "config_path": "configs/models/resnet50.toml",
        "config_sha256": "ab" * 32,
        "device": "cuda:0",
        "dtype": "bfloat16",
        "small": True,
        "torch_version": "2.6.0",
        "created_at": created_at,
        "wall_s": 3.5,
        "total_calls": 161.0,
        "notes": {"attention": "sdpa"},
    }


def _card(card_id: str, share: float, **extra) -> dict:
    return {
        "card_id": card_id,
        "op": "aten::addmm",
        "signature": {"args": [{"shape": [64, 128], "dtype": "bf16"}], "kwargs": {"beta": 1}},
        "signature_text": "addmm(bf16[64,128])",
        "calls": 12.0,
        "share": share,
        "bytes": 4096,
        "module_paths": ["fc", "layer1.0.fc"],
        **extra,
    }


def _sample(card_id: str, idx: int) -> dict:
    return {
        "card_id": card_id,
        "idx": idx,
        "path": f"samples/cap-1/{card_id}/{idx}.pt",
        "sha256": "cd" * 32,
        "nbytes": 10,
    }


@pytest.fixture
async def store(tmp_path: Path):
    async with await Store.open(tmp_path / "kforge.db") as s:
        yield s


@pytest.fixture
async def run_id(store: Store) -> str:
    await store.save_capture(_capture(), [_card("c0", 0.5)], [])
    return (await store.create_run("cap-1", "resnet50", "anthropic", {"budget": 10}))["id"]


# ---- workspace --------------------------------------------------------------------------------------


def test_workspace_flag_beats_env_beats_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KFORGE_HOME", raising=False)
    assert resolve_workspace(None) == tmp_path / ".kforge"

    monkeypatch.setenv("KFORGE_HOME", str(tmp_path / "from-env"))
    assert resolve_workspace(None) == tmp_path / "from-env"

    assert resolve_workspace(str(tmp_path / "from-flag")) == tmp_path / "from-flag"
    # A relative flag is taken relative to the current directory and returned absolute.
    assert resolve_workspace("rel") == tmp_path / "rel"

    monkeypatch.setenv("KFORGE_HOME", "")
    assert resolve_workspace(None) == tmp_path / ".kforge"


def test_ensure_workspace_creates_samples_dir(tmp_path: Path) -> None:
    ws = ensure_workspace(tmp_path / "a" / "b")
    assert (ws / "samples").is_dir()
    assert db_path(ws) == tmp_path / "a" / "b" / "kforge.db"
    assert ensure_workspace(ws) == ws  # idempotent


def test_ensure_workspace_rejects_a_file(tmp_path: Path) -> None:
    target = tmp_path / "ws"
    target.write_text("not a directory")
    with pytest.raises(WorkspaceError, match=r"ws exists and is not a directory; pass --workspace"):
        ensure_workspace(target)
    with pytest.raises(WorkspaceError, match="cannot create workspace"):
        ensure_workspace(target / "inner")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_ensure_workspace_rejects_read_only_dir(tmp_path: Path) -> None:
    target = tmp_path / "ro"
    target.mkdir()
    target.chmod(0o555)
    try:
        with pytest.raises(WorkspaceError, match="not writable|cannot create"):
            ensure_workspace(target)
    finally:
        target.chmod(0o755)


# ---- schema and migrations --------------------------------------------------------------------------


async def test_pragmas_and_version(store: Store) -> None:
    conn = store._conn
    assert (await (await conn.execute("PRAGMA journal_mode")).fetchone())[0] == "wal"
    assert (await (await conn.execute("PRAGMA foreign_keys")).fetchone())[0] == 1
    assert (await (await conn.execute("PRAGMA synchronous")).fetchone())[0] == 1  # NORMAL
    assert (await (await conn.execute("PRAGMA busy_timeout")).fetchone())[0] == 5000
    assert (await (await conn.execute("PRAGMA user_version")).fetchone())[0] == latest_version()
    assert latest_version() == schema.MIGRATIONS[-1][0]


def test_split_statements_keeps_semicolons_in_strings() -> None:
    script = (
        "CREATE TABLE t (x TEXT DEFAULT 'a;b');\n-- comment; with semicolon\nINSERT INTO t VALUES ('c;d');\n"
    )
    assert schema.split_statements(script) == [
        "CREATE TABLE t (x TEXT DEFAULT 'a;b');",
        "-- comment; with semicolon\nINSERT INTO t VALUES ('c;d');",
    ]


async def test_migration_upgrades_and_keeps_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kforge.db"
    sqlite3.connect(path).close()  # a v0 (empty) database file
    v1_only = [(1, schema.MIGRATIONS[0][1])]
    monkeypatch.setattr(schema, "MIGRATIONS", v1_only)
    async with await Store.open(path) as s:
        await s.save_capture(_capture(), [_card("c0", 0.7)], [_sample("c0", 0)])

    # Version 2 adds a column and backfills it from existing rows, the shape real migrations take.
    v2 = "ALTER TABLE captures ADD COLUMN label TEXT;\nUPDATE captures SET label = model || '/' || dtype;"
    monkeypatch.setattr(schema, "MIGRATIONS", [*v1_only, (2, v2)])
    async with await Store.open(path) as s:
        assert (await (await s._conn.execute("PRAGMA user_version")).fetchone())[0] == 2
        captures = await s.list_captures()
        assert [c["id"] for c in captures] == ["cap-1"]
        assert captures[0]["label"] == "resnet50/bfloat16"
        assert [c["card_id"] for c in await s.get_cards("cap-1")] == ["c0"]
        assert len(await s.get_samples("cap-1", "c0")) == 1
        # The new column is accepted on insert because columns are read from the live schema.
        await s.save_capture({**_capture("cap-2"), "label": "x"}, [], [])


async def test_v3_upgrades_a_v2_workspace(tmp_path: Path) -> None:
    """A workspace written before v3 opens: cards lose the never-written tolerance, candidates gain focus."""
    path = tmp_path / "kforge.db"
    conn = sqlite3.connect(path)  # a v2 database as released, written without today's code
    for version, script in schema.MIGRATIONS[:2]:
        assert version <= 2
        for statement in schema.split_statements(script):
            conn.execute(statement)
    conn.executescript("""
        PRAGMA user_version = 2;
        INSERT INTO captures (id, model, device, dtype, created_at) VALUES ('cap-1', 'resnet50', 'cuda:0', 'bf16', 1);
        INSERT INTO cards (capture_id, card_id, op, signature, signature_text, calls, share, tolerance)
            VALUES ('cap-1', 'c0', 'aten::addmm', '{}', 'addmm', 1, 0.7, NULL);
        INSERT INTO samples VALUES ('cap-1', 'c0', 0, 'samples/cap-1/c0/0.pt', 'cd', 10);
        INSERT INTO runs (id, capture_id, model, provider, created_at, updated_at)
            VALUES ('run-1', 'cap-1', 'resnet50', 'builtin', 1, 1);
        INSERT INTO candidates (id, run_id, card_id, source, source_hash, proposer, status, intent, created_at,
                                updated_at)
            VALUES ('cand-1', 'run-1', 'c0', '// k', 'h', 'builtin', 'verified', 'vectorise by 4', 1, 1);
    """)
    conn.close()
    run, old = "run-1", "cand-1"
    async with await Store.open(path) as s:
        assert (await (await s._conn.execute("PRAGMA user_version")).fetchone())[0] == latest_version() >= 3
        card = (await s.get_cards("cap-1"))[0]
        dropped = sqlite3.sqlite_version_info >= (3, 35, 0)  # older SQLite cannot drop; the column stays unused
        assert ("tolerance" not in card) == dropped and card["share"] == 0.7
        assert len(await s.get_samples("cap-1", "c0")) == 1
        row = await s.get_candidate(old)
        assert row["intent"] == "vectorise by 4" and row["focus"] is None  # kept, and nothing was asked then
        new, _ = await s.add_candidate(run, "c0", parent_id=old, source="// k2", launch_spec="[[launch]]",
                                       proposer="builtin", status="proposed", intent="vec 8", focus="vectorisation")
        assert (await s.get_candidate(new))["focus"] == "vectorisation"
    conn = open_readonly(path)  # the TUI's reader opens it too
    conn.close()


async def test_failed_migration_rolls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kforge.db"
    v1_only = [(1, schema.MIGRATIONS[0][1])]
    monkeypatch.setattr(schema, "MIGRATIONS", v1_only)
    await (await Store.open(path)).close()

    broken = "CREATE TABLE extra (x INTEGER);\nINSERT INTO no_such_table VALUES (1);"
    monkeypatch.setattr(schema, "MIGRATIONS", [*v1_only, (2, broken)])
    with pytest.raises(sqlite3.OperationalError, match="no_such_table"):
        await Store.open(path)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'extra'").fetchone() is None
    finally:
        conn.close()


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "kforge.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {latest_version() + 5}")
    conn.close()
    expected = (
        rf"workspace {re.escape(str(tmp_path))} was written by a newer Kernel Forge "
        rf"\(schema {latest_version() + 5} > {latest_version()}\); upgrade kernel-forge"
    )
    with pytest.raises(StoreError, match=expected):
        await Store.open(path)
    with pytest.raises(StoreError, match=expected):
        open_readonly(path)


# ---- captures and cards -----------------------------------------------------------------------------


async def test_save_capture_is_atomic(store: Store) -> None:
    duplicate = [_card("c0", 0.6), _card("c0", 0.4)]  # second row violates PRIMARY KEY(capture_id, card_id)
    with pytest.raises(sqlite3.IntegrityError):
        await store.save_capture(_capture(), duplicate, [])
    assert await store.list_captures() == []
    assert await store.get_cards("cap-1") == []
    # The connection is usable again afterwards (no transaction left open).
    await store.save_capture(_capture(), [_card("c0", 0.6)], [_sample("c0", 0)])
    assert len(await store.list_captures()) == 1


async def test_save_capture_rejects_bad_rows(store: Store) -> None:
    with pytest.raises(ValueError, match="unknown column"):
        await store.save_capture(_capture(), [_card("c0", 0.5, bogus=1)], [])
    with pytest.raises(ValueError, match="relative to the workspace"):
        await store.save_capture(_capture(), [_card("c0", 0.5)], [{**_sample("c0", 0), "path": "/abs/x.pt"}])
    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
        await store.save_capture(_capture(), [_card("c0", 0.5)], [_sample("missing", 0)])
    assert await store.list_captures() == []


async def test_cards_round_trip(store: Store) -> None:
    cards = [
        _card("small", 0.1),
        _card("big", 0.8),
        _card("mid", 0.3),
    ]
    samples = [_sample("big", 1), _sample("big", 0), _sample("mid", 0)]
    await store.save_capture(_capture(), cards, samples)

    got = await store.get_cards("cap-1")
    assert [c["card_id"] for c in got] == ["big", "mid", "small"]
    big = got[0]
    assert big["signature"] == cards[1]["signature"]
    assert big["module_paths"] == ["fc", "layer1.0.fc"]
    assert big["eager_stats"] is None

    await store.update_card_eager("cap-1", "big", 12.5, 3.0, {"median_us": 12.5, "runs": [12.4, 12.6]})
    big = (await store.get_cards("cap-1"))[0]
    assert (big["eager_us"], big["roofline_us"]) == (12.5, 3.0)
    assert big["eager_stats"] == {"median_us": 12.5, "runs": [12.4, 12.6]}
    with pytest.raises(KeyError):
        await store.update_card_eager("cap-1", "nope", 1.0, 1.0, {})

    assert [s["idx"] for s in await store.get_samples("cap-1", "big")] == [0, 1]
    capture = await store.latest_capture()
    assert capture is not None
    assert capture["small"] is True and capture["notes"] == {"attention": "sdpa"}


async def test_list_and_latest_capture(store: Store) -> None:
    await store.save_capture(_capture("old", created_at=1.0), [], [])
    await store.save_capture(_capture("new", created_at=2.0), [], [])
    await store.save_capture(_capture("other", model="llama", created_at=3.0), [], [])
    assert [c["id"] for c in await store.list_captures()] == ["other", "new", "old"]
    assert [c["id"] for c in await store.list_captures("resnet50")] == ["new", "old"]
    assert (await store.latest_capture("resnet50"))["id"] == "new"
    assert await store.latest_capture("nope") is None


# ---- runs, events, controls -------------------------------------------------------------------------


async def test_runs(store: Store, run_id: str) -> None:
    run = await store.get_run(run_id)
    assert run is not None
    assert run["status"] == "created" and run["config"] == {"budget": 10} and run["tokens_in"] == 0

    await store.update_run(run_id, status="running", pid=1234, tokens_in=50, config={"budget": 20})
    run = await store.get_run(run_id)
    assert (run["status"], run["pid"], run["tokens_in"], run["config"]) == (
        "running",
        1234,
        50,
        {"budget": 20},
    )
    assert run["updated_at"] >= run["created_at"]

    with pytest.raises(ValueError, match="cannot set id"):
        await store.update_run(run_id, id="hijack")
    with pytest.raises(ValueError, match="cannot set"):
        await store.update_run(run_id, **{"status = 'done'; --": 1})
    with pytest.raises(ValueError, match="status must be one of"):
        await store.update_run(run_id, status="exploded")
    with pytest.raises(KeyError):
        await store.update_run("run-missing", status="done")
    assert await store.get_run("run-missing") is None


async def test_events_since_in_order(store: Store, run_id: str) -> None:
    other = (await store.create_run("cap-1", "resnet50", "openai"))["id"]
    seqs = [await store.add_event(run_id, "candidate", {"n": i}, card_id="c0") for i in range(3)]
    await store.add_event(other, "candidate", {"n": 99})
    seqs.append(await store.add_event(run_id, "done", {}))
    assert seqs == sorted(seqs)

    events = await store.events_since(run_id, 0)
    assert [e["seq"] for e in events] == seqs
    assert [e["payload"] for e in events] == [{"n": 0}, {"n": 1}, {"n": 2}, {}]
    assert events[0]["card_id"] == "c0" and events[-1]["kind"] == "done"
    assert [e["seq"] for e in await store.events_since(run_id, seqs[1])] == seqs[2:]
    assert [e["seq"] for e in await store.events_since(run_id, 0, limit=2)] == seqs[:2]
    assert await store.events_since(run_id, seqs[-1]) == []


async def test_controls_consumed(store: Store, run_id: str) -> None:
    pause = await store.add_control(run_id, "pause")
    prio = await store.add_control(run_id, "prioritize", card_id="c0", args={"weight": 2})
    pending = await store.pending_controls(run_id)
    assert [c["seq"] for c in pending] == [pause, prio]
    assert pending[1]["args"] == {"weight": 2} and pending[0]["args"] is None

    assert await store.consume_control(pause) is True
    assert await store.consume_control(pause) is False  # a command acts once
    assert [c["seq"] for c in await store.pending_controls(run_id)] == [prio]
    with pytest.raises(ValueError, match="command must be one of"):
        await store.add_control(run_id, "explode")


async def test_concurrent_writers_share_one_connection(store: Store, run_id: str) -> None:
    # Many tasks writing at once must not interleave inside each other's transactions.
    seqs = await asyncio.gather(*(store.add_event(run_id, "tick", {"i": i}) for i in range(50)))
    assert len(set(seqs)) == 50
    assert len(await store.events_since(run_id, 0)) == 50


# ---- read-only reader -------------------------------------------------------------------------------


async def test_readonly_reader_sees_commits_while_writer_open(store: Store, run_id: str) -> None:
    reader = open_readonly(store.db_path)
    try:
        assert reader.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        seq = await store.add_event(run_id, "hello", {"x": 1})
        row = reader.execute("SELECT * FROM events WHERE seq = ?", (seq,)).fetchone()
        assert row is not None and row["kind"] == "hello"
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader.execute("DELETE FROM events")
        # The reader does not block the writer (WAL): a write after the read still commits.
        await store.add_event(run_id, "after", {})
        assert reader.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 2
    finally:
        reader.close()


def test_open_readonly_missing_file(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no Kernel Forge database"):
        open_readonly(tmp_path / "kforge.db")


async def test_readonly_after_writer_closed(tmp_path: Path) -> None:
    path = tmp_path / "kforge.db"
    async with await Store.open(path) as s:
        await s.save_capture(_capture(), [], [])
    reader = open_readonly(path)
    try:
        assert reader.execute("SELECT id FROM captures").fetchone()["id"] == "cap-1"
    finally:
        reader.close()


async def test_deleting_a_run_cascades(store: Store, run_id: str) -> None:
    conn = store._conn
    now = 1.0
    await conn.execute(
        "INSERT INTO candidates (id, run_id, card_id, source, source_hash, proposer, status, created_at, updated_at)"
        " VALUES ('k1', ?, 'c0', 'src', 'h', 'llm', 'ok', ?, ?)",
        (run_id, now, now),
    )
    await conn.execute(
        "INSERT INTO search_nodes (run_id, card_id, node_id, candidate_id, created_at) VALUES (?, 'c0', 'n0', 'k1', ?)",
        (run_id, now),
    )
    await conn.execute(
        "INSERT INTO search_nodes (run_id, card_id, node_id, parent_node_id, created_at)"
        " VALUES (?, 'c0', 'n1', 'n0', ?)",
        (run_id, now),
    )
    await store.add_event(run_id, "x", {})
    await store.add_control(run_id, "stop")
    # A capture still referenced by a run cannot be deleted (runs are history, never cascaded away).
    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
        await conn.execute("DELETE FROM captures WHERE id = 'cap-1'")
    await conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))
    for table in ("candidates", "search_nodes", "events", "controls"):
        assert (await (await conn.execute(f"SELECT COUNT(*) FROM {table}")).fetchone())[0] == 0
    # With no runs left the capture can go, taking its cards and samples with it.
    await conn.execute("DELETE FROM captures WHERE id = 'cap-1'")
    assert await store.get_cards("cap-1") == []


# ---- the synchronous read side (engine.store.read) ---------------------------------------------------


async def test_read_side_hands_out_what_the_store_wrote(store: Store, run_id: str) -> None:
    from engine.store import read

    await store.save_capture(_capture("cap-2", created_at=2000.0), [_card("a", 0.2), _card("b", 0.7)],
                             [_sample("a", 1), _sample("a", 0)])
    second = (await store.create_run("cap-2", "resnet50", "builtin", {"iterations": 3}, status="running",
                                     pid=4242))["id"]
    first, _ = await store.add_candidate(second, "b", parent_id=None, source="k1", launch_spec={"x": 1},
                                         proposer="builtin", status="evaluating")
    await store.add_candidate(second, "a", parent_id=first, source="k2", launch_spec=None, proposer="builtin",
                              status="rejected", category="mismatch", error="mismatch: out0\nmore detail")
    await store.add_event(second, "card_done", {"reason": "plateau"}, card_id="b")
    conn = open_readonly(store.db_path)
    try:
        assert read.runs(conn) == await store.list_runs()
        assert read.latest_run(conn) == await store.get_run(second)
        assert read.run(conn, run_id) == await store.get_run(run_id) and read.run(conn, "run-nope") is None
        assert read.run_of_process(conn, 4242)["id"] == second
        assert read.capture(conn, "cap-2") == await store.get_capture("cap-2")
        assert read.latest_capture(conn, "resnet50")["id"] == "cap-2"
        assert read.cards_of_capture(conn, "cap-2") == await store.get_cards("cap-2")  # largest share first
        assert read.sample_paths(conn, "cap-2", "a") == ["samples/cap-1/a/0.pt", "samples/cap-1/a/1.pt"]
        assert read.candidates(conn, second) == await store.candidates(second)
        assert read.candidate(conn, first) == await store.get_candidate(first)
        assert read.candidate_source(conn, first) == "k1"
        assert read.events_since(conn, second, 0) == await store.events_since(second, 0)
        assert read.status_counts(conn, second) == {"evaluating": 1, "rejected": 1}
        assert read.failure_counts(conn, second) == {"mismatch": 1}
        heads = read.candidate_heads_added(conn, second)
        assert [h.status for h in heads] == ["evaluating", "rejected"]
        assert heads[1].error_head == "mismatch: out0", "only the first line of the error"
        assert read.candidate_heads_added(conn, second, heads[0].order) == heads[1:]
        assert read.candidate_heads(conn, [first, "cand-nope"]) == heads[:1]
    finally:
        conn.close()


async def test_read_side_shows_a_column_that_is_not_json_as_text(store: Store, run_id: str) -> None:
    from engine.store import read

    await store._conn.execute("UPDATE runs SET config = 'not json' WHERE id = ?", (run_id,))
    conn = open_readonly(store.db_path)
    try:
        assert read.run(conn, run_id)["config"] == "not json"  # a viewer shows it rather than crash
    finally:
        conn.close()


async def test_add_control_queues_a_command_the_engine_sees(store: Store, run_id: str) -> None:
    from engine.store import read

    seq = read.add_control(store.db_path, run_id, "prioritize", "c0", {"boost": 2.0})
    pending = await store.pending_controls(run_id)
    assert [(c["seq"], c["command"], c["card_id"], c["args"]) for c in pending] == [(seq, "prioritize", "c0",
                                                                                     {"boost": 2.0})]
    with pytest.raises(ValueError, match="unknown control command 'explode'"):
        read.add_control(store.db_path, run_id, "explode")


async def test_a_write_cancelled_while_it_begins_leaves_no_transaction_open(store: Store) -> None:
    """Ctrl-C cancels whatever is awaiting: a transaction cancelled at BEGIN must not stay open (the next
    write would then fail, or commit the cancelled one's half)."""
    import asyncio

    for delay in (0, 0.0005, 0.002):
        async def write() -> None:
            async with store._transaction() as conn:
                await conn.execute("SELECT 1")

        task = asyncio.ensure_future(write())
        await asyncio.sleep(delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert not store._conn.in_transaction
        async with store._transaction() as conn:  # the next write still works
            await conn.execute("SELECT 1")


async def test_a_finished_candidate_and_its_event_are_written_together(store: Store, run_id: str) -> None:
    # kill -9 between the two writes left a finished candidate without its 'evaluated' event (a resumed run's
    # record then missed it): one transaction now, so an event that cannot be written undoes the result too.
    cand, _ = await store.add_candidate(run_id, "c0", parent_id=None, source="k1", launch_spec=None,
                                        proposer="builtin", status="evaluating")
    with pytest.raises(TypeError):
        await store.finish_candidate(cand, {"status": "compiled"}, run_id, "evaluated", {"bad": object()}, "c0")
    assert (await store.get_candidate(cand))["status"] != "compiled"
    assert [e for e in await store.events_since(run_id, 0) if e["kind"] == "evaluated"] == []
    await store.finish_candidate(cand, {"status": "compiled"}, run_id, "evaluated", {"candidate": cand}, "c0")
    assert (await store.get_candidate(cand))["status"] == "compiled"
    (ev,) = [e for e in await store.events_since(run_id, 0) if e["kind"] == "evaluated"]
    assert ev["payload"] == {"candidate": cand} and ev["card_id"] == "c0"


async def test_a_write_cancelled_while_it_commits_ends_quietly(store: Store) -> None:
    """A cancellation that lands while the COMMIT is queued: the COMMIT still runs on aiosqlite's thread, so a
    ROLLBACK queued behind it found no transaction and raised 'cannot rollback' (seen once in CI). The write is
    either committed or rolled back, the only error is the cancellation, and the next write works."""
    import asyncio

    await store._conn.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
    for i in range(120):
        async def write(i=i) -> None:
            async with store._transaction() as conn:
                await conn.execute("INSERT INTO t VALUES (?)", (i,))

        task = asyncio.ensure_future(write())
        for _ in range(i % 12):  # land the cancel at a different point of BEGIN / INSERT / COMMIT each time
            await asyncio.sleep(0)
        await asyncio.sleep(0.0001 * (i // 12))
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        assert not store._conn.in_transaction
    async with store._transaction() as conn:
        await conn.execute("INSERT INTO t VALUES (-1)")
