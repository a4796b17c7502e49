"""`kforge-tui run`: dry run end to end on the CPU (capture, builtin proposals, NVRTC), bad input, resume."""

import json
import sqlite3

import pytest
import torch
from conftest import CONFIGS
from test_bad_input import assert_one_line_error

MY_MODEL = CONFIGS / "examples" / "my_model.toml"


def test_dry_run_proposes_and_compiles_builtin_kernels(cli, tmp_path):
    code, out, err = cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--iterations", "2", "--json",
                         "--workspace", tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["status"] == "done" and doc["stopped_by"] == "iterations" and doc["tokens"] == 0
    cards = {c["op"]: c for c in doc["cards"]}
    worked = [c for c in doc["cards"] if c["candidates"]]
    assert worked, "the builtin proposer should handle some of this model's cards"
    for c in worked:
        assert c["candidates"] == 2 and c["compiled"] == 2 and c["verified"] == 0  # nothing verified dry
    assert cards["aten::addmm"]["candidates"] == 0  # matmuls stay on eager (no template)
    db = sqlite3.connect(tmp_path / "kforge.db")
    statuses = {s for (s,) in db.execute("SELECT status FROM candidates")}
    assert statuses == {"compiled"}
    events = [k for (k,) in db.execute("SELECT kind FROM events ORDER BY seq")]
    assert events[0] == "card_skipped" or "run_started" in events
    assert events[-1] == "run_finished"


def test_resume_of_a_finished_run_does_nothing_more(cli, tmp_path):
    code, out, _ = cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--iterations", "1", "--json",
                       "--workspace", tmp_path)
    run_id = json.loads(out)["run"]
    code, out, err = cli("run", "--resume", run_id, "--dry-run", "--no-tui", "--json", "--workspace", tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["run"] == run_id and doc["proposals"] == 0
    assert sum(c["candidates"] for c in doc["cards"]) > 0  # the first session's candidates are still there


def test_run_needs_a_config_or_resume(cli, tmp_path):
    assert_one_line_error(*cli("run", "--no-tui", "--workspace", tmp_path), "CONFIG", "--resume")


def test_unknown_run_to_resume(cli, tmp_path):
    assert_one_line_error(*cli("run", "--resume", "run-nope", "--dry-run", "--no-tui", "--workspace", tmp_path),
                          "--resume run-nope")


def test_unknown_run_to_resume_without_a_gpu_says_so_before_the_gpu(cli, tmp_path):
    # Without --dry-run on a machine with no GPU it said 'no CUDA GPU is visible; use --dry-run'.
    import asyncio

    from engine.store import Store, db_path

    # a folder that holds no workspace says so, and is left as it was (it was made an empty workspace)
    code, out, err = cli("run", "--resume", "run-nope", "--no-tui", "--workspace", tmp_path / "ws")
    assert_one_line_error(code, out, err, "--resume run-nope", f"no Kernel Forge workspace at {tmp_path / 'ws'}")
    assert "GPU" not in err and not (tmp_path / "ws").exists()

    async def make() -> None:
        await (await Store.open(db_path(tmp_path))).close()

    asyncio.run(make())
    code, out, err = cli("run", "--resume", "run-nope", "--no-tui", "--workspace", tmp_path)
    assert_one_line_error(code, out, err, "--resume run-nope", "no such run")
    assert "GPU" not in err


def test_ray_without_ray_installed_is_refused_before_any_run_is_made(cli, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert_one_line_error(*cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--ray", "--workspace", tmp_path),
                          "--ray", "pip install")
    assert not (tmp_path / "kforge.db").exists() or not sqlite3.connect(tmp_path / "kforge.db").execute(
        "SELECT count(*) FROM runs").fetchone()[0]


def test_unknown_provider(cli, tmp_path):
    assert_one_line_error(*cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--provider", "nope",
                               "--workspace", tmp_path), "--provider nope")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present here")
def test_run_without_gpu_says_use_dry_run(cli, tmp_path):
    assert_one_line_error(*cli("run", MY_MODEL, "--small", "--no-tui", "--workspace", tmp_path), "--dry-run")


def test_bad_provider_captures_nothing(cli, tmp_path):
    cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--provider", "nope", "--workspace", tmp_path)
    db = tmp_path / "kforge.db"
    assert not db.exists() or sqlite3.connect(db).execute("SELECT count(*) FROM captures").fetchone()[0] == 0


def _sources(db: sqlite3.Connection, run_id: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for card_id, source in db.execute("SELECT card_id, source FROM candidates WHERE run_id = ? ORDER BY rowid",
                                      (run_id,)):
        out.setdefault(card_id, []).append(source)
    return out


def test_replay_serves_a_recorded_run_again_and_resumes(cli, tmp_path):
    base = ("--small", "--dry-run", "--no-tui", "--iterations", "2", "--json", "--workspace", tmp_path)
    code, out, err = cli("run", MY_MODEL, "--provider", "builtin", *base)
    assert code == 0, err
    recorded = json.loads(out)["run"]
    code, out, err = cli("run", MY_MODEL, "--provider", "replay", "--replay-run", recorded, *base)
    assert code == 0, err
    doc = json.loads(out)
    replayed = doc["run"]
    assert replayed != recorded and doc["tokens"] == 0
    db = sqlite3.connect(tmp_path / "kforge.db")
    want = _sources(db, recorded)
    assert want and _sources(db, replayed) == want  # the same candidates, card by card, in the same order
    assert {p for (p,) in db.execute("SELECT proposer FROM candidates WHERE run_id = ?", (replayed,))} == {"replay"}
    assert db.execute("SELECT provider FROM runs WHERE id = ?", (replayed,)).fetchone() == ("replay",)

    # As if the replay had been killed before its second proposals were stored: --resume serves what
    # the run lacks (not the first answers again), and the replayed run ends up whole.
    with db:
        db.execute("DELETE FROM candidates WHERE id IN (SELECT id FROM candidates c WHERE run_id = ? AND rowid ="
                   " (SELECT max(rowid) FROM candidates WHERE run_id = c.run_id AND card_id = c.card_id))",
                   (replayed,))
        db.execute("DELETE FROM events WHERE run_id = ? AND kind = 'card_done'", (replayed,))
        db.execute("UPDATE runs SET status = 'running', stopped_by = NULL WHERE id = ?", (replayed,))
    assert _sources(db, replayed) != want
    code, out, err = cli("run", "--resume", replayed, "--dry-run", "--no-tui", "--json", "--workspace", tmp_path)
    assert code == 0, err
    assert json.loads(out)["proposals"] == len(want)  # one per card, each the one answer it lacked
    assert _sources(db, replayed) == want


def test_replay_needs_a_run_of_this_workspace(cli, tmp_path):
    base = ("--small", "--dry-run", "--no-tui", "--workspace", tmp_path)
    assert_one_line_error(*cli("run", MY_MODEL, "--provider", "replay", *base), "--provider replay", "--replay-run")
    assert_one_line_error(*cli("run", MY_MODEL, "--provider", "replay", "--replay-run", "run-nope", *base),
                          "--replay-run run-nope", "no such run")
    assert_one_line_error(*cli("run", MY_MODEL, "--provider", "builtin", "--replay-run", "run-nope", *base),
                          "--replay-run run-nope", "--provider replay")
    db = tmp_path / "kforge.db"  # bad input: nothing was captured
    assert sqlite3.connect(db).execute("SELECT count(*) FROM captures").fetchone()[0] == 0


@pytest.mark.parametrize("provider, env", [("anthropic", "ANTHROPIC_API_KEY"), ("openai", "OPENAI_API_KEY")])
def test_paid_provider_without_its_key_is_refused_before_capture(cli, tmp_path, monkeypatch, provider, env):
    monkeypatch.delenv(env, raising=False)
    code, out, err = cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--provider", provider,
                         "--workspace", tmp_path)
    assert_one_line_error(code, out, err, f"--provider {provider}", env, "--provider builtin")
    db = tmp_path / "kforge.db"  # refused before any work: nothing captured, no run recorded
    assert not db.exists() or sqlite3.connect(db).execute("SELECT count(*) FROM captures").fetchone()[0] == 0


async def test_local_server_needs_no_key(monkeypatch):
    """A local OpenAI-compatible server (a base_url) works with its key variable unset."""
    from engine.propose.factory import make_proposer, provider_config

    cfg = provider_config("local")
    assert cfg.base_url and cfg.api_key_env
    monkeypatch.delenv(cfg.api_key_env, raising=False)
    assert cfg.missing_key() is None
    assert (await make_proposer("local")).name == "local"


def test_config_and_resume_together_is_bad_usage(cli, tmp_path):
    assert_one_line_error(*cli("run", MY_MODEL, "--resume", "run-1", "--dry-run", "--no-tui",
                               "--workspace", tmp_path), "--resume run-1", "not both")


def test_run_json_into_a_closed_pipe_ends_quietly(tmp_path):
    from test_bad_input import assert_quiet_broken_pipe, run_into_closed_pipe

    assert_quiet_broken_pipe(*run_into_closed_pipe(
        ["run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--iterations", "1", "--json", "--workspace", tmp_path]))
    # and the final table (rich's own handling exited 1)
    assert_quiet_broken_pipe(*run_into_closed_pipe(
        ["run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--iterations", "1", "--workspace", tmp_path]))


def test_ops_searches_only_the_cards_it_matches(cli, tmp_path):
    code, out, err = cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--iterations", "1", "--json",
                         "--workspace", tmp_path, "--ops", "layer_norm|gelu")
    assert code == 0, err
    doc = json.loads(out)
    worked = {c["op"] for c in doc["cards"] if c["candidates"]}
    assert worked and worked <= {"aten::native_layer_norm", "aten::gelu"}, worked
    # the selection is the run's: a resume searches the same cards
    db = sqlite3.connect(tmp_path / "kforge.db")
    (config,) = db.execute("SELECT config FROM runs").fetchone()
    assert json.loads(config)["ops"] == "layer_norm|gelu"


def test_ops_must_be_a_regular_expression(cli, tmp_path):
    assert_one_line_error(*cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--ops", "gelu(",
                               "--workspace", tmp_path), "--ops")


def test_card_selected_by_op_member_or_kind():
    from engine.cards import card_selected

    rms = {"kind": "module", "ops": ["_to_copy", "pow", "mean", "add", "rsqrt", "mul"]}
    assert card_selected("aten::gelu", None, "f16[8]", None)
    assert card_selected("aten::gelu", None, "f16[8]", "gelu|softmax")
    assert not card_selected("aten::mul.Tensor", None, "f16[8]", "gelu")
    assert card_selected("kforge::chain", rms, "chain[_to_copy pow] in0", "chain")
    assert card_selected("kforge::chain", rms, "chain[_to_copy pow] in0", "^rsqrt$")
    assert card_selected("kforge::chain", rms, "chain[_to_copy pow] in0", "module")
    assert not card_selected("kforge::chain", rms, "chain[_to_copy pow] in0", "^pattern$")


def test_ops_searches_a_chosen_card_below_the_share_floor(cli, tmp_path):
    # A wide matmul and a GELU of 8 numbers: the GELU holds far less than the 0.1 % share floor. Unchosen,
    # it is skipped as noise; chosen by --ops, it is searched (the user named it).
    (tmp_path / "tiny.py").write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(2048, 2048)\n"
        "    def forward(self, x, y):\n"
        "        return self.fc(x), torch.nn.functional.gelu(y)\n"
        "def build(device, dtype, small=False, **_):\n"
        "    m = M().to(device=device, dtype=dtype)\n"
        "    return m, (torch.randn(512, 2048, device=device, dtype=dtype), torch.randn(8, device=device, dtype=dtype))\n")
    (tmp_path / "tiny.toml").write_text('name = "tiny"\nbuilder = "tiny.py:build"\n[dtype]\ncpu = "float32"\n')

    def gelu_card(*extra):
        code, out, err = cli("run", tmp_path / "tiny.toml", "--dry-run", "--no-tui", "--iterations", "1", "--json",
                             "--workspace", tmp_path / "ws", *extra)
        assert code == 0, err
        (card,) = [c for c in json.loads(out)["cards"] if c["op"] == "aten::gelu"]
        return card

    unchosen = gelu_card()
    assert unchosen["share"] < 0.001 and unchosen["candidates"] == 0 and unchosen["stopped"] == "noise", unchosen
    assert gelu_card("--ops", "gelu")["candidates"] >= 1


@pytest.fixture
def no_backoff(monkeypatch):
    """The provider's retries without their backoff sleeps (up to 0.5 + 1 + 2 + 4 s per proposal): every
    attempt still goes to the closed port and fails, one after another, as many as the policy allows."""
    from engine.propose.providers.retry import RetryPolicy

    monkeypatch.setattr(RetryPolicy, "backoff", lambda self, attempt: 0.0)


def test_a_provider_that_never_answers_is_an_error_not_a_finished_run(cli, tmp_path, monkeypatch, no_backoff):
    # A wrong --base-url: every proposal failed in the provider call, and the run said 'done', exit 0.
    import socket

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = cli("run", CONFIGS / "examples" / "my_model.toml", "--small", "--dry-run", "--no-tui",
                         "--device", "cpu", "--iterations", "1", "--provider", "openai", "--base-url",
                         f"http://127.0.0.1:{port}/v1", "--model", "m", "--workspace", tmp_path)
    assert code == 1, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: run run-") and "every proposal failed in the provider call" in last, last
    assert "connection" in last and "base URL" in last, last
    assert "provider" in out  # the table still shows what was tried



def test_a_provider_that_never_answers_stops_the_run_early_and_resumable(cli, tmp_path, monkeypatch,
                                                                     no_backoff):
    # With a budget of many proposals the run spent every one of them failing at the closed port: now it stops
    # after PROVIDER_GIVE_UP failures in a row before any answer, says so, and the run can be resumed.
    import socket
    import sqlite3

    from engine.run.orchestrator import PROVIDER_GIVE_UP

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = cli("run", CONFIGS / "examples" / "my_model.toml", "--small", "--dry-run", "--no-tui",
                         "--device", "cpu", "--iterations", "50", "--max-proposals", "1", "--provider", "openai",
                         "--base-url", f"http://127.0.0.1:{port}/v1", "--model", "m", "--workspace", tmp_path)
    assert code == 1, err[-2000:]
    assert "every proposal failed in the provider call" in err.strip().splitlines()[-1]
    db = sqlite3.connect(tmp_path / "kforge.db")
    status, stopped_by = db.execute("SELECT status, stopped_by FROM runs").fetchone()
    made = db.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
    assert (status, stopped_by) == ("stopped", "provider")
    assert made == PROVIDER_GIVE_UP, made  # one at a time: exactly the failures it allows


CUSTOM_OP_MODEL = '''
import torch
from torch import nn


@torch.library.custom_op("kftestns::myscale", mutates_args=())
def myscale(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s


@myscale.register_fake
def _(x, s):
    return torch.empty_like(x)


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(myscale(self.lin(x), 3.0))


def build(device, dtype):
    torch.manual_seed(0)
    return M().to(device=device, dtype=dtype).eval(), (torch.randn(2, 8, device=device, dtype=dtype),)
'''


def test_a_custom_op_card_is_shown_and_never_searched(cli, tmp_path):
    # A torch.library op of the model's own code became a card that the lane's worker, which does not import
    # the model, could not resolve: with an LLM proposer the eager timing raised on it.
    (tmp_path / "m.py").write_text(CUSTOM_OP_MODEL)
    cfg = tmp_path / "m.toml"
    cfg.write_text('name = "m"\nbuilder = "m.py:build"\n[dtype]\ncpu = "float32"\ncuda = "float32"\n'
                   '[capture]\nsamples = 1\n')
    code, out, err = cli("run", cfg, "--dry-run", "--no-tui", "--device", "cpu", "--iterations", "1", "--json",
                         "--workspace", tmp_path)
    assert code == 0, err[-2000:]
    cards = {c["op"]: c for c in json.loads(out)["cards"]}
    assert "kftestns::myscale" in cards and cards["kftestns::myscale"]["candidates"] == 0
    db = sqlite3.connect(tmp_path / "kforge.db")
    skipped = [json.loads(p) for (p,) in db.execute("SELECT payload FROM events WHERE kind = 'card_skipped'")]
    assert any("custom op kftestns::myscale" in p.get("detail", "") and "not load" in p.get("detail", "")
               for p in skipped), skipped


def test_foreign_op_names_the_custom_op_of_a_card_or_a_chain_member():
    from engine.cards import foreign_op

    assert foreign_op("aten::add.Tensor") is None and foreign_op("kforge::chain") is None
    assert "custom op torchvision::nms" in foreign_op("torchvision::nms")
    chain = {"chain": {"nodes": [{"op": "aten::mul.Tensor"}, {"op": "mylib::fused.default"}]}}
    assert "custom op mylib::fused" in foreign_op("kforge::chain", chain)


def test_ops_that_match_no_card_is_bad_input_and_makes_no_run(cli, tmp_path):
    # It said "done (stopped by iterations)" with exit 0 and an empty table.
    code, out, err = cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--ops", "no_such_op",
                         "--workspace", tmp_path)
    assert code == 2 and out == "" and "Traceback" not in err
    last = err.strip().splitlines()[-1]   # after the capture's progress lines (stderr is not a terminal)
    for needle in ("--ops 'no_such_op'", "matches no card", "aten::native_layer_norm"):
        assert needle in last, last
    db = sqlite3.connect(tmp_path / "kforge.db")
    assert db.execute("SELECT count(*) FROM runs").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM captures").fetchone() == (1,)   # the capture is kept for the next try


def test_a_skipped_card_is_said_once_with_its_reason(cli, tmp_path):
    code, out, err = cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--iterations", "1",
                         "--workspace", tmp_path)
    assert code == 0, err
    db = sqlite3.connect(tmp_path / "kforge.db")
    ids = [c for (c,) in db.execute("SELECT card_id FROM events WHERE kind = 'card_skipped'")]
    assert ids and len(ids) == len(set(ids))


def test_a_run_does_not_reuse_a_capture_without_samples(cli, tmp_path):
    # `capture --samples 0` then `run`: the run reused it and searched nothing ("1 no-samples"), exit 0.
    code, _, err = cli("capture", MY_MODEL, "--small", "--device", "cpu", "--samples", "0", "--workspace", tmp_path)
    assert code == 0, err
    code, out, err = cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--iterations", "1", "--json",
                         "--workspace", tmp_path)
    assert code == 0, err
    assert any(c["candidates"] for c in json.loads(out)["cards"])
    db = sqlite3.connect(tmp_path / "kforge.db")
    assert db.execute("SELECT count(*) FROM captures").fetchone() == (2,)


def test_nothing_proposed_of_no_cards_is_a_sentence():
    from engine.run.command import nothing_proposed

    assert nothing_proposed([]) == ("nothing proposed: the capture has no cards (the model's forward ran no op "
                                    "worth a kernel)")


def test_a_dry_run_says_when_the_capture_is_not_the_gpus_dtype(cli, tmp_path):
    # my_model captures float32 on a CPU and runs bfloat16 on the GPU: its dry-run kernels are for cards the
    # GPU never calls, said nowhere before.
    code, _, err = cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--iterations", "1", "--json",
                       "--workspace", tmp_path)
    assert code == 0, err
    assert "warning: the capture is float32 and the config runs the model in bfloat16 on the GPU" in err
    assert '[dtype] cpu = "bfloat16"' in err


def test_runs_says_when_a_running_runs_process_is_gone(cli, tmp_path):
    # kill -9 (or a reboot) leaves the row 'running' for ever: `runs` now says its process is gone.
    import os
    import subprocess
    import sys

    code, out, err = cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--iterations", "1", "--json",
                         "--workspace", tmp_path)
    assert code == 0, err
    run_id = json.loads(out)["run"]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    db = sqlite3.connect(tmp_path / "kforge.db")
    db.execute("UPDATE runs SET status = 'running', pid = ? WHERE id = ?", (dead.pid, run_id))
    db.commit()
    code, out, _ = cli("runs", "--json", "--workspace", tmp_path)
    (row,) = json.loads(out)["runs"]
    assert row["status"] == "running" and row["process_gone"] is True and row["dry_run"] is True
    code, out, _ = cli("runs", "--workspace", tmp_path)
    assert "running (process gone: --resume it), dry run" in out   # a dry run looked like a run that found nothing
    db.execute("UPDATE runs SET pid = ? WHERE id = ?", (os.getpid(), run_id))   # alive: running, as it says
    db.commit()
    code, out, _ = cli("runs", "--json", "--workspace", tmp_path)
    assert json.loads(out)["runs"][0]["process_gone"] is False


@pytest.fixture
def finished_dry_run(cli, tmp_path):
    code, out, err = cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--iterations", "1", "--json",
                         "--workspace", tmp_path)
    assert code == 0, err
    return json.loads(out)["run"]


def _set_run(ws, run_id, **columns):
    db = sqlite3.connect(ws / "kforge.db")
    for key, value in columns.items():
        if key == "host":
            db.execute("UPDATE runs SET config = json_set(config, '$.host', ?) WHERE id = ?", (value, run_id))
        else:
            db.execute(f"UPDATE runs SET {key} = ? WHERE id = ?", (value, run_id))
    db.commit()
    return db


def test_resume_of_a_run_another_live_process_runs_is_refused(cli, tmp_path, finished_dry_run):
    # Two processes searched one run: the second re-set its budgets, pid and host under the first (red team F4).
    import socket
    import subprocess
    import sys

    run_id = finished_dry_run
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for status in ("running", "paused", "created"):
            db = _set_run(tmp_path, run_id, status=status, pid=other.pid, host=socket.gethostname())
            code, out, err = cli("run", "--resume", run_id, "--dry-run", "--no-tui", "--iterations", "3",
                                 "--workspace", tmp_path)
            assert_one_line_error(code, out, err, f"--resume {run_id}", f"is {status} in process {other.pid}",
                                  socket.gethostname(), f"kill {other.pid}")
            assert db.execute("SELECT pid, status, json_extract(config, '$.iterations') FROM runs").fetchone() == \
                (other.pid, status, 1), "the refused resume changed the run's row"
    finally:
        other.kill()
        other.wait()
    # Its process gone (kill -9, a reboot): the stale row is resumed, as after a crash.
    code, out, err = cli("run", "--resume", run_id, "--dry-run", "--no-tui", "--json", "--workspace", tmp_path)
    assert code == 0, err
    assert json.loads(out)["run"] == run_id


def test_resume_of_a_run_whose_process_is_on_another_host_needs_takeover(cli, tmp_path, finished_dry_run):
    run_id = finished_dry_run
    _set_run(tmp_path, run_id, status="running", pid=4242, host="gpu-box-7")
    code, out, err = cli("run", "--resume", run_id, "--dry-run", "--no-tui", "--workspace", tmp_path)
    assert_one_line_error(code, out, err, f"--resume {run_id}", "process 4242 on host gpu-box-7", "cannot check",
                          "--takeover")
    code, out, err = cli("run", "--resume", run_id, "--dry-run", "--no-tui", "--json", "--takeover",
                         "--workspace", tmp_path)
    assert code == 0, err
    code, out, err = cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--takeover", "--workspace", tmp_path)
    assert_one_line_error(code, out, err, "--takeover", "--resume")


async def test_of_two_resumes_at_once_one_claims_the_run(tmp_path):
    # Both read the row free before either wrote it: the claim is one conditional UPDATE, so the second finds the
    # row changed and is refused, where check-then-write let both run.
    from engine.store import Store

    path = tmp_path / "kforge.db"
    first, second = await Store.open(path), await Store.open(path)
    try:
        await first.save_capture({"id": "cap-1", "model": "m", "config_path": "m.toml", "config_sha256": "ab" * 32,
                                  "device": "cpu", "dtype": "float32", "small": True, "torch_version": "2",
                                  "created_at": 1.0, "wall_s": 1.0, "total_calls": 1.0, "notes": {}}, [], [])
        run = await first.create_run("cap-1", "m", "builtin", status="stopped", pid=11)
        seen_a, seen_b = await first.get_run(run["id"]), await second.get_run(run["id"])
        assert await first.claim_run(run["id"], seen_a, status="running", pid=100)
        assert not await second.claim_run(run["id"], seen_b, status="running", pid=200)
        now = await second.get_run(run["id"])
        assert (now["status"], now["pid"]) == ("running", 100)
    finally:
        await first.close()
        await second.close()
