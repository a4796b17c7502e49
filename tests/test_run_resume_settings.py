"""`run --resume RUN` with flags: the budgets given again apply to the resumed run (a sitting on the H100,
2026-12-06b, resumed with --wall-time 120 and searched 359 s: the run's first 360 s were kept); the settings that
say what is searched and who proposes are the run's, and another value for one is refused."""

import argparse
import json
import sqlite3

import pytest
from conftest import CONFIGS
from test_bad_input import assert_one_line_error

from engine.errors import UsageError
from engine.run.command import resumed_config

MY_MODEL = CONFIGS / "examples" / "my_model.toml"


def _first_run(cli, tmp_path, *extra):
    code, out, err = cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--iterations", "1", "--json",
                         "--workspace", tmp_path, *extra)
    assert code == 0, err
    return json.loads(out)["run"]


def _config(tmp_path, run_id):
    with sqlite3.connect(tmp_path / "kforge.db") as db:
        (cfg,), = db.execute("SELECT config FROM runs WHERE id = ?", (run_id,)).fetchall()
    return json.loads(cfg)


def test_resume_with_more_iterations_searches_the_cards_on(cli, tmp_path):
    run_id = _first_run(cli, tmp_path)
    code, out, err = cli("run", "--resume", run_id, "--dry-run", "--no-tui", "--json", "--iterations", "2",
                         "--workspace", tmp_path)
    assert code == 0, err
    assert f"resuming {run_id} with --iterations 2; it was started with 1" in err
    doc = json.loads(out)
    worked = [c for c in doc["cards"] if c["candidates"]]
    assert worked and doc["proposals"] > 0
    assert all(c["candidates"] == 2 for c in worked), [(c["op"], c["candidates"]) for c in worked]
    assert doc["stopped_by"] == "iterations"
    assert _config(tmp_path, run_id)["iterations"] == 2   # a later resume without the flag keeps it
    with sqlite3.connect(tmp_path / "kforge.db") as db:
        notes = [json.loads(p)["message"] for (p,) in db.execute("SELECT payload FROM events WHERE kind = 'run_note'")]
    assert any("--iterations 2" in n for n in notes)   # the TUI's event log shows it too


def test_resume_with_a_wall_time_stops_by_it(cli, tmp_path):
    run_id = _first_run(cli, tmp_path, "--wall-time", "3600")
    code, out, err = cli("run", "--resume", run_id, "--dry-run", "--no-tui", "--json", "--iterations", "50",
                         "--wall-time", "0.01", "--workspace", tmp_path)
    assert code == 0, err
    assert "with --wall-time 0.01 (counted from now); it was started with 3600" in err
    assert json.loads(out)["stopped_by"] == "wall_time"   # with the run's own 3600 s it searched on to 50 a card
    assert _config(tmp_path, run_id)["wall_s"] == 0.01


def test_resume_with_the_same_settings_again_is_a_resume(cli, tmp_path):
    run_id = _first_run(cli, tmp_path, "--ops", "relu|gelu", "--strategy", "greedy")
    code, out, err = cli("run", "--resume", run_id, "--dry-run", "--no-tui", "--json", "--ops", "relu|gelu",
                         "--strategy", "greedy", "--provider", "builtin", "--iterations", "1", "--workspace", tmp_path)
    assert code == 0, err
    assert "resuming" not in err   # nothing changed, nothing said
    assert json.loads(out)["run"] == run_id


@pytest.mark.parametrize("flag, value", [("--ops", "softmax"), ("--strategy", "beam"), ("--provider", "replay"),
                                         ("--model", "claude-x")])
def test_resume_that_would_change_what_is_searched_is_refused(cli, tmp_path, flag, value):
    run_id = _first_run(cli, tmp_path, "--ops", "relu|gelu")
    with sqlite3.connect(tmp_path / "kforge.db") as db:
        before = db.execute("SELECT count(*) FROM candidates").fetchone()[0]
    code, out, err = cli("run", "--resume", run_id, "--dry-run", "--no-tui", flag, value, "--workspace", tmp_path)
    assert_one_line_error(code, out, err, f"{flag} {value}", run_id, "new run")
    with sqlite3.connect(tmp_path / "kforge.db") as db:
        assert db.execute("SELECT count(*) FROM candidates").fetchone()[0] == before
        assert db.execute("SELECT count(*) FROM runs").fetchone()[0] == 1


def _args(**given):
    names = ("provider", "model", "base_url", "strategy", "ops", "replay_run", "wall_time", "iterations",
             "max_proposals", "max_cost", "max_tokens", "compile_ref_timeout")
    return argparse.Namespace(**{n: given.get(n) for n in names})


def test_resumed_config_says_each_budget_changed_and_keeps_the_rest():
    run = {"id": "run-1", "provider": "anthropic",
           "config": {"model": "m", "strategy": "mcts", "ops": None, "wall_s": None, "iterations": 50,
                      "max_cost_usd": 2.0, "max_tokens": None}}
    cfg, changes = resumed_config(_args(wall_time=120.0, max_cost=5.0, iterations=50, provider="anthropic",
                                        strategy="mcts"), run)
    assert cfg["wall_s"] == 120.0 and cfg["max_cost_usd"] == 5.0 and cfg["iterations"] == 50 and cfg["model"] == "m"
    assert changes == ["resuming run-1 with --wall-time 120 (counted from now); it was started with none",
                       "resuming run-1 with --max-cost 5; it was started with 2"]
    assert run["config"]["wall_s"] is None   # the stored document is not changed in place
    with pytest.raises(UsageError, match="--ops chain: run run-1 was started with none"):
        resumed_config(_args(ops="chain"), run)
    with pytest.raises(UsageError, match="--provider builtin: run run-1 was started with 'anthropic'"):
        resumed_config(_args(provider="builtin"), run)


def test_the_refusal_comes_before_the_tui_attaches(cli, tmp_path, monkeypatch, capsys):
    # `kforge-tui run --resume RUN --ops X` from a terminal: the TUI attached to the run at once while its detached
    # engine exited 2 into its log
    from engine import cli as cli_mod

    run_id = _first_run(cli, tmp_path, "--ops", "gelu")
    opened = []
    monkeypatch.setattr(cli_mod, "terminal_attached", lambda: True)
    code = cli_mod.main(["run", "--resume", run_id, "--ops", "softmax", "--workspace", str(tmp_path)],
                        open_tui=lambda args: opened.append(args) or 0)
    out, err = capsys.readouterr()
    assert opened == []
    assert_one_line_error(code, out, err, "--ops softmax", run_id)
    code = cli_mod.main(["run", "--resume", run_id, "--ops", "gelu", "--workspace", str(tmp_path)],
                        open_tui=lambda args: opened.append(args) or 0)
    assert code == 0 and len(opened) == 1   # the run's own value: the TUI opens on it
