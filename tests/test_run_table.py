"""scripts/run_table.py says why each card that was not searched was not: skipped before the search (by
reason) or still waiting its turn when the run stopped. The H200 VAE run of 2026-12-02 left 7 group_norm
cards with templates waiting when its wall time ran out; the table said 'no builtin template, or below the
noise floor' of them."""

from conftest import load_script


def test_unsearched_cards_are_counted_by_why():
    rt = load_script("run_table")
    cards = {c: {} for c in ("a", "b", "c", "d", "e", "f")}
    searched = {"a": []}
    skipped = {"b": "not-selected", "c": "not-selected", "d": "declined", "e": "noise"}
    assert rt._unsearched(cards, searched, skipped, "wall_time") == (
        "the rest: 2 not selected by --ops, 1 no template (declined), 1 below the noise floor, "
        "1 still waiting when the run stopped (wall_time)")
    assert rt._unsearched({"a": {}}, searched, {}, "iterations") == "every card"


def test_replay_planner_refuses_a_missing_store_in_one_line(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    r = subprocess.run([sys.executable, "scripts/replay_planner.py", str(tmp_path / "none.db")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "none.db" in r.stderr


def test_the_vae_runs_outcomes_replayed_give_every_group_norm_card_a_turn():
    """The H200 VAE run of 2026-12-02 (its store is kept with its results): replayed through today's planner,
    its 47 evaluations reach all 7 group_norm op cards (the run itself reached 1) and still every chain."""
    from conftest import ROOT

    rp = load_script("replay_planner")
    db = ROOT / "docs/results/reproduce-h200/2026-12-02e/sd35_vae/kforge.db"
    text = rp.replay(db, None, None, "group_norm")
    assert "47 evaluations" in text and "Op cards with a kernel after the replay: 7 of 7." in text
    rows = [line.split("|") for line in text.splitlines() if line.startswith("| `kforge::chain`")]
    assert rows and all(int(r[-2]) > 0 for r in rows if float(r[4].strip(" %")) >= 4.0)


def test_each_card_is_set_against_the_copy_of_its_bytes_and_torch_compile():
    """The run table shows what the hardware allows (the lane's copy of the card's bytes) and what
    torch.compile does with the same op beside each best kernel (issue 21's per-card tables); the demo store
    was recorded on the H200 with both references (addmm's compile timed out)."""
    from conftest import ROOT

    rt = load_script("run_table")
    table = rt.render(ROOT / "kforge_tui" / "demo" / "kforge.db")
    assert "| copy µs | best at % of copy | torch.compile µs | best vs compile |" in table
    gelu = next(line for line in table.splitlines() if line.startswith("| `aten::gelu`"))
    assert "| 6.4 | 1.03× (1.00–1.05) | 6.3 | 98 % | 7.5 | 1.16× |" in gelu
    addmm = next(line for line in table.splitlines() if line.startswith("| `aten::addmm`"))
    assert "| 10.1 | 33 % | – | – |" in addmm
    assert "Before the search" not in table  # recorded before the stages' seconds were stored


def test_the_time_before_the_search_is_summed_from_the_cards_stats():
    rt = load_script("run_table")
    cards = [{"eager_stats": {"median": 1.0, "seconds": {"load": 2.5, "measure": 1.0}},
              "ref_stats": {"copy": {"median": 1.0, "seconds": {"load": 0.0, "measure": 0.5}},
                            "compile": {"median": 1.0, "seconds": 4.0}}},
             {"eager_stats": {"median": 1.0, "seconds": {"load": 3.5, "measure": 1.0}},
              "ref_stats": {"copy": {"error": "no bytes"}, "compile": {"error": "failed", "seconds": 2.0}}},
             {"eager_stats": None, "ref_stats": None}]
    assert rt._before_search(cards) == [
        "Before the search: eager timed for 2 card(s) in 8 s (loading their samples 6 s, timing 2 s); "
        "references for 2 card(s): the copy 0 s, torch.compile 6 s."]


def test_a_run_whose_cards_all_finished_early_does_not_say_stopped_by_iterations():
    from engine.run.report import _stop_words

    doc = {"stopped_by": "iterations", "cards": [{"stopped": "exhausted"}, {"stopped": "exhausted"},
                                                 {"stopped": "declined"}]}
    assert _stop_words(doc) == "every card finished before its iterations: 2 exhausted, 1 declined"
    doc["cards"].append({"stopped": "iterations"})
    assert _stop_words(doc) == "stopped by iterations"
    assert _stop_words({"stopped_by": "wall_time", "cards": []}) == "stopped by wall_time"


def test_a_card_none_of_whose_candidates_verified_says_why(tmp_path):
    """The run table names why a searched card kept nothing: the lane's message per failure category (an H100 run's
    largest GroupNorm card failed 9 of 9 as "launch" and the table said no more, 2026-12-06)."""
    import shutil
    import sqlite3

    from conftest import ROOT

    rt = load_script("run_table")
    db = tmp_path / "kforge.db"
    shutil.copy(ROOT / "kforge_tui" / "demo" / "kforge.db", db)
    conn = sqlite3.connect(db)
    card = conn.execute("SELECT card_id FROM candidates WHERE status = 'verified' LIMIT 1").fetchone()[0]
    conn.execute("UPDATE candidates SET status = 'rejected', category = 'launch', best_us = NULL, "
                 "error = 'out of GPU memory: Tried to allocate 2.00 GiB | more\nsecond line' WHERE card_id = ?",
                 (card,))
    conn.commit()
    conn.close()
    table = rt.render(db)
    line = next(x for x in table.splitlines() if x.startswith("- ") and card[:8] in x)
    assert line.endswith("no candidate verified; launch: out of GPU memory: Tried to allocate 2.00 GiB \\| more")
    assert sum(x.startswith("- ") for x in table.splitlines()) == 1  # the demo's other cards verified


def test_a_hidden_calls_share_is_its_part_of_its_makers():
    """A convolution's bias add (engine/capture/hidden.py) has its convolution's share in the store (an upper
    bound); the table shows its part of it once eager was timed, and names the convolution."""
    import json

    rt = load_script("run_table")
    conv = {"card_id": "conv0000", "op": "aten::convolution", "signature": json.dumps({"op": "aten::convolution",
            "args": []}), "share": 0.04, "capture_us": 100.0, "eager_us": None}
    add = {"card_id": "add00000", "op": "aten::add_.Tensor", "share": 0.04, "capture_us": 0.0, "eager_us": 40.0,
           "signature": json.dumps({"op": "aten::add_.Tensor", "args": [],
                                    "hidden_in": {"card": "conv0000", "how": "convolution bias"}})}
    texts = rt.share_texts({"conv0000": conv, "add00000": add})
    assert texts == {"conv0000": "4.0 %", "add00000": "1.6 % in conv0000"}
