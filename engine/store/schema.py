"""All SQL DDL of the workspace database, as numbered migrations tracked in `PRAGMA user_version`."""

from __future__ import annotations

import sqlite3

# Conventions: ids are TEXT, timestamps REAL unix seconds, JSON columns TEXT holding canonical JSON
# (see store.JSON_COLUMNS). Children cascade with their run/capture; a capture with runs cannot be
# deleted (runs.capture_id has no cascade) so history is never dropped by accident.
_V1 = """
CREATE TABLE captures (
    id            TEXT PRIMARY KEY,
    model         TEXT NOT NULL,
    config_path   TEXT,
    config_sha256 TEXT,
    device        TEXT NOT NULL,
    dtype         TEXT NOT NULL,
    small         INTEGER NOT NULL DEFAULT 0,
    torch_version TEXT,
    created_at    REAL NOT NULL,
    wall_s        REAL,
    total_calls   REAL,
    notes         TEXT NOT NULL DEFAULT '{}',
    skipped       TEXT NOT NULL DEFAULT '{}',
    sample_dir    TEXT
);
CREATE INDEX captures_model_created ON captures(model, created_at);

CREATE TABLE cards (
    capture_id     TEXT NOT NULL REFERENCES captures(id) ON DELETE CASCADE,
    card_id        TEXT NOT NULL,
    op             TEXT NOT NULL,
    signature      TEXT NOT NULL,
    signature_text TEXT NOT NULL,
    calls          REAL NOT NULL,
    share          REAL NOT NULL,
    bytes          INTEGER NOT NULL DEFAULT 0,
    module_paths   TEXT NOT NULL DEFAULT '[]',
    tolerance      TEXT,
    eager_us       REAL,
    roofline_us    REAL,
    eager_stats    TEXT,
    captured_calls INTEGER NOT NULL DEFAULT 0,
    capture_us     REAL,
    outputs        TEXT NOT NULL DEFAULT '[]',
    output_varies  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (capture_id, card_id)
);

CREATE TABLE samples (
    capture_id TEXT NOT NULL,
    card_id    TEXT NOT NULL,
    idx        INTEGER NOT NULL,
    path       TEXT NOT NULL,
    sha256     TEXT NOT NULL,
    nbytes     INTEGER NOT NULL,
    PRIMARY KEY (capture_id, card_id, idx),
    FOREIGN KEY (capture_id, card_id) REFERENCES cards(capture_id, card_id) ON DELETE CASCADE
);

CREATE TABLE runs (
    id         TEXT PRIMARY KEY,
    capture_id TEXT NOT NULL REFERENCES captures(id),
    model      TEXT NOT NULL,
    config     TEXT NOT NULL DEFAULT '{}',
    provider   TEXT NOT NULL,
    status     TEXT NOT NULL DEFAULT 'created'
               CHECK (status IN ('created', 'running', 'paused', 'stopped', 'done', 'failed')),
    stopped_by TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    pid        INTEGER,
    tokens_in  INTEGER NOT NULL DEFAULT 0,
    tokens_out INTEGER NOT NULL DEFAULT 0,
    cost_usd   REAL NOT NULL DEFAULT 0
);
CREATE INDEX runs_capture ON runs(capture_id);

-- The UNIQUE index also serves lookups by (run_id, card_id), its leading columns, so no second index.
CREATE TABLE candidates (
    id           TEXT PRIMARY KEY,
    run_id       TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    card_id      TEXT NOT NULL,
    parent_id    TEXT REFERENCES candidates(id) ON DELETE SET NULL,
    source       TEXT NOT NULL,
    launch_spec  TEXT NOT NULL DEFAULT '{}',
    source_hash  TEXT NOT NULL,
    proposer     TEXT NOT NULL,
    model_name   TEXT,
    llm_call_id  TEXT,
    status       TEXT NOT NULL,
    category     TEXT,
    compile_log  TEXT,
    error        TEXT,
    verification TEXT,
    timing       TEXT,
    best_us      REAL,
    speedup      REAL,
    eager_us     REAL,
    speedup_low  REAL,
    speedup_high REAL,
    intent       TEXT,
    params       TEXT,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    UNIQUE (run_id, card_id, source_hash)
);

CREATE TABLE search_nodes (
    run_id         TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    card_id        TEXT NOT NULL,
    node_id        TEXT NOT NULL,
    parent_node_id TEXT,
    candidate_id   TEXT REFERENCES candidates(id) ON DELETE SET NULL,
    visits         INTEGER NOT NULL DEFAULT 0,
    value          REAL NOT NULL DEFAULT 0,
    best_value     REAL,
    dead           INTEGER NOT NULL DEFAULT 0,
    created_at     REAL NOT NULL,
    PRIMARY KEY (run_id, node_id),
    FOREIGN KEY (run_id, parent_node_id) REFERENCES search_nodes(run_id, node_id) ON DELETE CASCADE
);
CREATE INDEX search_nodes_card ON search_nodes(run_id, card_id);

CREATE TABLE evaluations (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id       TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    candidate_id TEXT NOT NULL REFERENCES candidates(id) ON DELETE CASCADE,
    lane         TEXT NOT NULL,
    started_at   REAL NOT NULL,
    finished_at  REAL,
    verdict      TEXT,
    category     TEXT
);
CREATE INDEX evaluations_run ON evaluations(run_id, id);
CREATE INDEX evaluations_candidate ON evaluations(candidate_id);

-- llm_call_id on candidates is deliberately not a foreign key: prompts are bulky and may be pruned.
CREATE TABLE llm_calls (
    id         TEXT PRIMARY KEY,
    run_id     TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    card_id    TEXT,
    provider   TEXT NOT NULL,
    model_name TEXT NOT NULL,
    prompt     TEXT NOT NULL,
    response   TEXT,
    tokens_in  INTEGER NOT NULL DEFAULT 0,
    tokens_out INTEGER NOT NULL DEFAULT 0,
    cost_usd   REAL NOT NULL DEFAULT 0,
    latency_s  REAL,
    error      TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX llm_calls_run ON llm_calls(run_id, created_at);

-- AUTOINCREMENT so a seq is never reused: the TUI tails events by "seq > last seen".
CREATE TABLE events (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id  TEXT REFERENCES runs(id) ON DELETE CASCADE,
    ts      REAL NOT NULL,
    kind    TEXT NOT NULL,
    card_id TEXT,
    payload TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX events_run_seq ON events(run_id, seq);
CREATE INDEX events_run_card_seq ON events(run_id, card_id, seq);
CREATE INDEX events_run_kind_seq ON events(run_id, kind, seq);

CREATE TABLE controls (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    ts          REAL NOT NULL,
    command     TEXT NOT NULL CHECK (command IN ('pause', 'resume', 'stop', 'prioritize')),
    card_id     TEXT,
    args        TEXT,
    consumed_at REAL
);
-- Partial index: the engine polls only unconsumed commands, which stay few however long a run lasts.
CREATE INDEX controls_pending ON controls(run_id, seq) WHERE consumed_at IS NULL;
"""

# v2: the engine now fills `evaluations` (one row per lane use); viewers ask every tick which lanes are
# busy, so the open rows get a partial index that stays small however long a run lasts.
_V2 = """
CREATE INDEX evaluations_open ON evaluations(run_id, lane) WHERE finished_at IS NULL;
"""

# v3: `candidates.focus` is the revision intent the orchestrator asked for (engine.propose.intents;
# NULL for a fresh kernel), beside `intent`, which holds what the proposer says it did. `cards.tolerance`
# was never written: an op's tolerance is a fact of engine.verify.tolerance, not of the card. SQLite
# before 3.35 cannot drop a column; there the unused column stays (nothing reads or writes it).
_V3 = "ALTER TABLE candidates ADD COLUMN focus TEXT;\n" + (
    "ALTER TABLE cards DROP COLUMN tolerance;\n" if sqlite3.sqlite_version_info >= (3, 35, 0) else "")

# v4: chain cards (op `kforge::chain`, engine.capture.chains) keep their kind, module class, module paths
# and member card ids in `cards.chain`, JSON text written by OperatorCard.row(); NULL for an op card.
_V4 = "ALTER TABLE cards ADD COLUMN chain TEXT;\n"

# ---- card reference timings (branch cardrefs) ---------------------------------------------------------
# v5: a card's two reference timings beside eager, measured by a lane as eager is: `compile_us`, the
# card's eager compiled by torch.compile (Inductor) alone; `copy_us`, the lane's own device copy of the
# card's floor bytes. `ref_stats` (JSON) holds their stats, the compile mode and seconds, and the reason
# where there is no compile reference ({"compile": {"error": …}}). NULL where not measured (older runs).
_V5_CARD_REFS = """
ALTER TABLE cards ADD COLUMN compile_us REAL;
ALTER TABLE cards ADD COLUMN copy_us REAL;
ALTER TABLE cards ADD COLUMN ref_stats TEXT;
"""
# ---- end card reference timings ------------------------------------------------------------------------

# ---- v6: exports (begin) ---------------------------------------------------------------------------------
# One row per `kforge-tui export` of a run, written once when the export ends (written, failed or
# interrupted), in one transaction: no row is ever half-filled or left "in progress". An export refused
# before it resolved its run (no GPU, no such run) writes none. JSON columns (store.JSON_COLUMNS):
# `targets` the targets asked, in order; `checks` one entry per target asked, in that order: the
# whole-model check as the cast's `source.model_checks` holds it plus the variant ids it kept and those
# it dropped with why; `variants` the variants in the cast (id, op, card, targets, confirmed speedup);
# `excluded` what was left on PyTorch and why; `options` the flags that shaped it; `env` GPU and versions.
_V6_EXPORTS = """
CREATE TABLE exports (
    id          TEXT PRIMARY KEY,
    run_id      TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    started_at  REAL NOT NULL,
    finished_at REAL NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('written', 'failed', 'interrupted')),
    out_path    TEXT NOT NULL,
    cast_sha256 TEXT,
    targets     TEXT NOT NULL DEFAULT '[]',
    checks      TEXT NOT NULL DEFAULT '[]',
    variants    TEXT NOT NULL DEFAULT '[]',
    excluded    TEXT NOT NULL DEFAULT '[]',
    warnings    TEXT NOT NULL DEFAULT '[]',
    options     TEXT NOT NULL DEFAULT '{}',
    env         TEXT NOT NULL DEFAULT '{}',
    error       TEXT
);
CREATE INDEX exports_run ON exports(run_id, finished_at);
"""
# ---- v6: exports (end) -----------------------------------------------------------------------------------

# Append only: never edit a released entry, add (N + 1, "ALTER ...") instead.
MIGRATIONS: list[tuple[int, str]] = [
    (1, _V1),
    (2, _V2),
    (3, _V3),
    (4, _V4),
    (5, _V5_CARD_REFS),
    (6, _V6_EXPORTS),
]


def latest_version(migrations: list[tuple[int, str]] | None = None) -> int:
    """The schema version the code writes (the last migration's number; 0 when there are none)."""
    migrations = MIGRATIONS if migrations is None else migrations
    return migrations[-1][0] if migrations else 0


def split_statements(script: str) -> list[str]:
    """Split an SQL script into complete statements (semicolons inside strings or triggers are kept)."""
    # Not executescript(): in Python < 3.12 it COMMITs any open transaction first, which would break
    # the one-transaction-per-migration guarantee.
    statements: list[str] = []
    buffer = ""
    for piece in script.split(";"):
        buffer += piece + ";"
        if sqlite3.complete_statement(buffer):
            text = buffer.strip()
            if _strip_comments(text).strip(" \n\t;"):
                statements.append(text)
            buffer = ""
    if _strip_comments(buffer).strip(" \n\t;"):
        raise ValueError(f"incomplete SQL statement at end of script: {buffer.strip()[:80]!r}")
    return statements


def _strip_comments(text: str) -> str:
    """Drop `--` line comments so a comment-only chunk is not mistaken for a statement."""
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())
