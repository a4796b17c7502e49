"""A deterministic workspace database for the TUI tests, snapshots and the refresh benchmark.

Synthetic test data (fixed ids, fixed timestamps, seeded RNG): never a measurement. Written with
plain sqlite3 over the real schema so every byte is reproducible.
"""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

from engine.store.schema import MIGRATIONS, latest_version, split_statements

T0 = 1_750_000_000.0  # frozen "now" of the fixture (the TUI is given the same clock in tests)

OPS = [
    ("aten::native_group_norm", "f16[8,512,64,64] groups=32 eps=1e-06", 48.0, 0.31, 412.0, 96.0),
    ("aten::gelu", "f16[8,4096,1024] approximate='tanh'", 24.0, 0.22, 188.0, 61.0),
    ("aten::_softmax", "f16[8,16,1024,1024] dim=-1", 12.0, 0.17, 350.0, 118.0),
    ("aten::native_layer_norm", "f16[8,4096,1024] [1024] eps=1e-05", 24.0, 0.12, 121.0, 40.0),
    ("aten::add.Tensor", "f16[8,512,64,64] + f16[8,512,64,64]", 96.0, 0.10, 55.0, 24.0),
    ("aten::mean.dim", "f16[8,2048,7,7] dim=[-1,-2] keepdim=True", 1.0, 0.08, 19.0, 6.5),
]
FAIL_CATEGORIES = ["compile", "mismatch", "runtime-fault", "timeout", "nan", "suspicious", "launch"]

SOURCE = """#include <cuda_fp16.h>
// {intent}
extern "C" __global__ void {name}(const __half* __restrict__ x, __half* __restrict__ y, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {{
        float v = __half2float(x[i]);
        y[i] = __float2half(v * {scale}f);
    }}
}}
"""


def create_schema(conn: sqlite3.Connection) -> None:
    for _, script in MIGRATIONS:
        for stmt in split_statements(script):
            conn.execute(stmt)
    conn.execute(f"PRAGMA user_version = {latest_version()}")


def build_store(path: Path, *, cards: int = 6, per_card: int = 14, runs: int = 2, seed: int = 7,
                status: str = "running", big_card_nodes: int = 0) -> dict:
    """Write a workspace db at `path`; returns the ids a test needs (run ids, a failed candidate, …)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    create_schema(conn)
    rng = random.Random(seed)
    conn.execute("INSERT INTO captures (id, model, device, dtype, created_at) VALUES "
                 "('cap-fixture', 'sd35_medium', 'cuda', 'float16', ?)", (T0 - 600,))
    card_ids = []
    for i in range(cards):
        op, sig, calls, share, eager, roof = OPS[i % len(OPS)]
        cid = f"card-{i:04d}"
        card_ids.append(cid)
        conn.execute("INSERT INTO cards (capture_id, card_id, op, signature, signature_text, calls, share, bytes,"
                     " eager_us, roofline_us) VALUES ('cap-fixture', ?, ?, '{}', ?, ?, ?, 1048576, ?, ?)",
                     (cid, op, sig if i < len(OPS) else f"{sig} #{i}", calls, share / (1 + i // len(OPS)),
                      eager, roof))
    out: dict = {"runs": [], "cards": card_ids, "failed": {}, "verified": []}
    for r in range(runs):
        run_id = f"run-fixture{r}"
        provider = ["builtin", "anthropic", "openai"][r % 3]
        run_status = status if r == runs - 1 else "done"
        conn.execute("INSERT INTO runs (id, capture_id, model, config, provider, status, stopped_by, created_at,"
                     " updated_at, tokens_in, tokens_out, cost_usd) VALUES (?, 'cap-fixture', 'sd35_medium', ?, ?,"
                     " ?, ?, ?, ?, ?, ?, ?)",
                     (run_id, json.dumps({"iterations": per_card, "label": "fixture (synthetic test data)"}),
                      provider, run_status, None if run_status == "running" else "iterations", T0 - 300 + r,
                      T0 - 1, 0, 0, 0.0))
        out["runs"].append(run_id)
        tick = [T0 - 290 + r]
        tokens = [0, 0, 0.0]

        def now(tick: list[float] = tick) -> float:
            tick[0] += 0.5
            return tick[0]

        event(conn, run_id, now(), "run_started", None, {"cards": cards, "resumed": 0})
        for ci, cid in enumerate(card_ids):
            n_nodes = big_card_nodes if (big_card_nodes and ci == 0) else per_card
            eager = OPS[ci % len(OPS)][4]
            ids: list[str] = []
            for k in range(n_nodes):
                nid = f"cand-r{r}c{ci:03d}n{k:05d}"
                parent = None if k < 2 else ids[rng.randrange(max(1, len(ids) // 2), len(ids))] \
                    if rng.random() < 0.6 else ids[rng.randrange(len(ids))]
                roll = rng.random()
                if status == "running" and r == runs - 1 and k == n_nodes - 1 and ci < 2:
                    st, cat = "evaluating", None
                elif roll < 0.55 - 0.1 * r:
                    st, cat = "verified", None
                else:
                    st, cat = "rejected", FAIL_CATEGORIES[(k + ci + r) % len(FAIL_CATEGORIES)]
                call_id = None
                if provider != "builtin":
                    call_id = f"llm-r{r}c{ci:03d}n{k:05d}"
                    ti, to = 2400 + 10 * k, 600 + 5 * k
                    tokens[0] += ti
                    tokens[1] += to
                    tokens[2] += ti * 3e-6 + to * 15e-6
                    conn.execute("INSERT INTO llm_calls (id, run_id, card_id, provider, model_name, prompt, response,"
                                 " tokens_in, tokens_out, cost_usd, latency_s, created_at) VALUES"
                                 " (?, ?, ?, ?, 'model-x', ?, ?, ?, ?, ?, ?, ?)",
                                 (call_id, run_id, cid, provider,
                                  f"Write a faster CUDA kernel for {OPS[ci % len(OPS)][0]} (card {cid}).\n"
                                  f"Parent: {parent or 'none'}.",
                                  f"Here is a vectorised version (variant {k}).\n```cuda\n...\n```",
                                  ti, to, ti * 3e-6 + to * 15e-6, 4.0 + k % 5, now()))
                scale = 1 + k / 100
                src = SOURCE.format(intent=f"variant {k}: vectorise by {2 ** (k % 4)}", name=f"k{k}",
                                    scale=f"{scale:.2f}")
                spec = {"launches": [{"kernel": f"k{k}", "grid": ["ceil_div(n, 256)", 1, 1],
                                      "block": [256, 1, 1], "shared": 0, "args": ["in0", "out0", "n"]}]}
                row = {"id": nid, "run_id": run_id, "card_id": cid, "parent_id": parent, "source": src,
                       "launch_spec": json.dumps(spec), "source_hash": f"h-{nid}",
                       "proposer": provider, "model_name": None if provider == "builtin" else "model-x",
                       "llm_call_id": call_id, "status": st, "category": cat, "intent": f"variant {k}",
                       "created_at": now()}
                if st == "verified":
                    t = eager / (0.8 + rng.random() * 3.0)
                    row.update(best_us=round(t, 3), eager_us=eager, speedup=round(eager / t, 4),
                               speedup_low=round(eager / t * 0.97, 4), speedup_high=round(eager / t * 1.03, 4),
                               verification=json.dumps({"ok": True, "sets_checked": 5, "details": {}}),
                               timing=json.dumps({
                                   "eager": {"n": 200, "median": eager, "iqr": eager * 0.02, "min": eager * 0.97},
                                   "candidate": {"n": 200, "median": round(t, 3), "iqr": t * 0.02,
                                                 "min": t * 0.98},
                                   "speedup": eager / t, "speedup_ci": [eager / t * 0.97, eager / t * 1.03],
                                   "reps": 200, "throttled": False}))
                    out["verified"].append(nid)
                elif st == "rejected":
                    row.update(_failure(cat, k))
                    out["failed"].setdefault(cat, nid) if r == runs - 1 else None
                row["updated_at"] = now()
                cols = ", ".join(row)
                conn.execute(f"INSERT INTO candidates ({cols}) VALUES ({', '.join('?' * len(row))})",
                             list(row.values()))
                ids.append(nid)
                if st != "evaluating":
                    event(conn, run_id, row["updated_at"], "evaluated", cid,
                          {"candidate": nid, "status": st, "category": cat, "best_us": row.get("best_us"),
                           "speedup": row.get("speedup")})
            if run_status != "running" or ci >= 2:
                event(conn, run_id, now(), "card_done", cid, {"reason": "budget"})
        conn.execute("UPDATE runs SET tokens_in = ?, tokens_out = ?, cost_usd = ? WHERE id = ?",
                     (tokens[0], tokens[1], round(tokens[2], 6), run_id))
        if run_status != "running":
            event(conn, run_id, now(), "run_finished", None, {"stopped_by": "iterations"})
    conn.commit()
    conn.close()
    return out


def _failure(cat: str, k: int) -> dict:
    if cat == "compile":
        log = ('kernel.cu(6): error: identifier "blockDim_x" is undefined\n'
               '        int i = blockIdx.x * blockDim_x + threadIdx.x;\n'
               '                             ^\n1 error detected in the compilation of "kernel.cu".')
        return {"error": f'kernel.cu(6): error: identifier "blockDim_x" is undefined (variant {k})',
                "compile_log": log}
    if cat in ("mismatch", "nan"):
        rep = {"name": "out0", "category": cat, "max_abs_err": 0.0625 if cat == "mismatch" else float("nan"),
               "max_rel_err": 0.031 if cat == "mismatch" else float("nan"), "mismatches": 4096,
               "numel": 16777216, "first_bad_index": [0, 3, 17, 5], "got": 1.4375, "expected": 1.375}
        return {"error": f"{cat}: 4096 of 16777216 elements differ in out0 (max abs 0.0625)",
                "verification": json.dumps({"ok": False, "category": cat, "message": f"{cat} in out0",
                                            "input_set": "captured[1]", "details": {"reports": [rep]},
                                            "sets_checked": 2}, allow_nan=True)}
    if cat == "runtime-fault":
        return {"error": "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered; lane restarted"}
    if cat == "timeout":
        return {"error": "no answer from the lane within 120 s; worker killed and respawned"}
    if cat == "suspicious":
        return {"error": "1.2 us is below bytes moved / peak bandwidth (3.1 us): rejected as suspicious"}
    return {"error": "cuLaunchKernel: CUDA_ERROR_INVALID_VALUE (block 2048 > 1024 threads)"}


def event(conn: sqlite3.Connection, run_id: str, ts: float, kind: str, card_id: str | None, payload: dict) -> None:
    conn.execute("INSERT INTO events (run_id, ts, kind, card_id, payload) VALUES (?, ?, ?, ?, ?)",
                 (run_id, ts, kind, card_id, json.dumps(payload, sort_keys=True)))
