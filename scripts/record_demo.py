"""Record the demo run: written answers served as an LLM, through the real pipeline, on this machine's GPU.

    python scripts/record_demo.py [--out demo-record] [--iterations 4] [--wall-time 200]   # on the H200
    python scripts/record_demo.py --dry-run --device cpu                                   # here: compile only

Starts scripts/serve_answers.py on a free port of 127.0.0.1, runs
`kforge-tui run scripts/demo/mlp_block.toml --small --no-tui --provider anthropic --base-url …` in a fresh
workspace (a dummy key in ANTHROPIC_API_KEY; nothing leaves the machine), then copies the run's kforge.db
to OUT as one file (journal_mode DELETE) and prints its candidates by status and category, and each written
answer's recorded outcome beside the one the fixture expects. Copy OUT/kforge.db over
kforge_tui/demo/kforge.db to ship it. The answers were written by an AI assistant acting as the model (the
fixture says so), some of them deliberately flawed to exercise failure inspection (labelled so); the run's
model name says both.

One request at a time (`--max-proposals 1`): each card's prompts then come in one order (a first kernel,
its repair if it failed, a second first kernel, its repair, then revisions), the order the fixture's answers
are listed for; with several in flight, which prompt takes which answer would depend on timing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.store import pack_single_file  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "recorded_answers" / "mlp_block.json"
CONFIG = ROOT / "scripts" / "demo" / "mlp_block.toml"
# What the store and the TUI show as the model: written answers, some deliberately flawed.
MODEL_NAME = "assistant-written-answers-some-deliberately-flawed"


def start_server(fixture: Path, work: Path) -> tuple[subprocess.Popen, int]:
    """serve_answers.py in a child process; returns it and its port once it listens."""
    port_file = work / "port"
    server = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "serve_answers.py"), str(fixture),
                               "--port-file", str(port_file), "--log", str(work / "served.jsonl")])
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise SystemExit("record_demo: serve_answers.py did not start (see its error above)")
        time.sleep(0.1)
    return server, int(port_file.read_text())


def summary(db: Path) -> str:
    """Candidates of the database by status and category, and the served answers' ids."""
    conn = sqlite3.connect(db)
    try:
        runs = conn.execute("SELECT id, status, stopped_by FROM runs").fetchall()
        rows = conn.execute("SELECT c.status, COALESCE(c.category, '-'), COUNT(*) FROM candidates c "
                            "GROUP BY 1, 2 ORDER BY 1, 3 DESC").fetchall()
        per_card = conn.execute("SELECT cards.op, c.status, COALESCE(c.category, '-'), c.speedup "
                                "FROM candidates c JOIN cards ON cards.card_id = c.card_id "
                                "ORDER BY cards.op, c.created_at").fetchall()
    finally:
        conn.close()
    out = [f"run {r[0]}: {r[1]} (stopped by {r[2]})" for r in runs]
    out.append("candidates by status / category:")
    out += [f"  {status:<10} {cat:<15} {n}" for status, cat, n in rows]
    out.append("candidates by card (in order):")
    for op, status, cat, speedup in per_card:
        speed = f"  {speedup:.2f}x eager" if speedup is not None else ""
        out.append(f"  {op:<24} {status:<10} {cat}{speed}")
    return "\n".join(out)


def answer_outcomes(db: Path, fixture: Path) -> list[tuple[str, str, str, str]]:
    """(op, answer id, expected, recorded) for every answer of the fixture: recorded is the status
    ('verified', 'compiled') or failure category of the candidate with the answer's source and spec, or
    'not served' when the run stored no such candidate."""
    doc = json.loads(fixture.read_text(encoding="utf-8"))
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT cards.op, c.source, c.launch_spec, c.status, c.category FROM candidates c "
                            "JOIN cards ON cards.card_id = c.card_id").fetchall()
    finally:
        conn.close()
    recorded = {}
    for op, source, spec, status, category in rows:
        spec = json.loads(spec) if spec and spec.startswith('"') else spec
        recorded[(op, source.strip(), str(spec).strip())] = category if status == "rejected" else status
    return [(card["op"], a["id"], a.get("expect", "?"),
             recorded.get((card["op"], a["cuda"].strip(), a["toml"].strip()), "not served"))
            for card in doc["cards"] for a in card["answers"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("demo-record"), help="folder for kforge.db and the logs")
    ap.add_argument("--fixture", type=Path, default=FIXTURE)
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--iterations", type=int, default=4, help="evaluations per card (default 4)")
    ap.add_argument("--max-proposals", type=int, default=1,
                    help="requests in flight at once (default 1: each card's prompts in the fixture's order)")
    ap.add_argument("--wall-time", type=float, default=200, help="seconds for the whole run (default 200)")
    ap.add_argument("--compile-ref-timeout", type=float, default=30,
                    help="seconds for each card's torch.compile reference (default 30; the charts' compile line)")
    ap.add_argument("--dry-run", action="store_true", help="compile only (no GPU): check the answers here")
    ap.add_argument("--device", choices=("cpu", "cuda"), help="where to capture (default: the run's default)")
    args = ap.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kforge-demo-"))
    workspace = work / "workspace"
    server, port = start_server(args.fixture, work)
    cmd = [sys.executable, "-m", "kforge_tui", "run", str(args.config), "--small", "--no-tui", "--json",
           "--provider", "anthropic", "--base-url", f"http://127.0.0.1:{port}", "--model", MODEL_NAME,
           "--iterations", str(args.iterations), "--max-proposals", str(args.max_proposals),
           "--wall-time", f"{args.wall_time:g}", "--compile-ref-timeout", f"{args.compile_ref_timeout:g}",
           "--workspace", str(workspace)]
    if args.dry_run:
        cmd.append("--dry-run")
    if args.device:
        cmd += ["--device", args.device]
    env = {**os.environ, "ANTHROPIC_API_KEY": "dummy-key-for-the-local-answer-server"}
    env.pop("ANTHROPIC_BASE_URL", None)
    print("record_demo: " + " ".join(cmd), file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        with (args.out / "run.json").open("w") as out:
            rc = subprocess.run(cmd, env=env, stdout=out).returncode
    finally:
        server.terminate()
        server.wait(timeout=10)
    db = workspace / "kforge.db"
    if not db.exists():
        print(f"record_demo: the run wrote no database (exit {rc})", file=sys.stderr)
        return rc or 1
    target = args.out / "kforge.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{target}{suffix}").unlink(missing_ok=True)
    conn = sqlite3.connect(db)  # a consistent copy even if a WAL is left next to it
    try:
        conn.execute("VACUUM INTO ?", (str(target),))
    finally:
        conn.close()
    pack_single_file(target)
    shutil.copy(work / "served.jsonl", args.out / "served.jsonl")
    print(summary(target))
    served = [json.loads(line) for line in (args.out / "served.jsonl").read_text().splitlines()]
    written = [s for s in served if s["answer"] != "fallback"]
    print(f"answers served: {len(written)} written, {len(served) - len(written)} fallback "
          f"({', '.join(s['answer'] for s in written) or 'none'})")
    print("answers: expected on an H200 -> recorded" + (" (a dry run only compiles)" if args.dry_run else ""))
    for op, answer, expected, got in answer_outcomes(target, args.fixture):
        flag = "" if got == expected or args.dry_run else "   <- differs"
        print(f"  {op:<24} {answer:<13} {expected:<10} -> {got}{flag}")
    if served and not written:
        print("record_demo: no prompt matched a card of the fixture (op and exact-call text): the capture's "
              "signatures differ from the fixture's", file=sys.stderr)
    print(f"record_demo: exit {rc}, {time.monotonic() - started:.0f} s; wrote {target} "
          f"(copy it over kforge_tui/demo/kforge.db), {args.out / 'run.json'}, {args.out / 'served.jsonl'}")
    shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
