"""CPU tests of the search ablation's two halves (scripts/search_landscape.py, bench_search.py --landscape
and --replay): enumerating a card's kernels, measuring them into a landscape file, replaying searches.

The cards are real (a softmax and a layer_norm captured on CPU tensors, described as the same calls on
CUDA); the measurements are NOT: `invented_lane` makes up a speedup, a CI and some failures from each
kernel's digest, so these tests check the mechanism, never a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import statistics
import sys

import pytest
import torch
import torch.nn.functional as F
from card_helpers import brief, captured
from conftest import load_script

from engine.lane.evaluate import Evaluation
from engine.propose.base import Hardware
from engine.propose.builtin import BuiltinProposer

bench = load_script("bench_search")  # puts scripts/ on the path: search_landscape is the module it imports
import search_landscape as land  # noqa: E402

HELLO = {"name": "NVIDIA H200", "arch": "sm_90", "sms": 132, "l2_bytes": 60 << 20, "copy_bw": 4.25e12,
         "max_shared_per_block": 232448, "cluster_launch": True}
HW = Hardware.from_hello(HELLO)


def _card(fn, keep, card_id):
    c = captured(fn, keep)
    return brief(c.op, c.signature, c.outputs, card_id=card_id)


@pytest.fixture(scope="module")
def cards():
    """(label, card, sample paths): two cards the builtin templates accept, with small parameter spaces."""
    softmax = _card(lambda: torch.softmax(torch.randn(64, 256), -1), lambda op: "softmax" in op, "card-softmax")
    norm = _card(lambda: F.layer_norm(torch.randn(8, 256), (256,)), lambda op: "norm" in op, "card-layer-norm")
    return [("softmax f32 [64,256]", softmax, ["/samples/softmax-0.safetensors"]),
            ("layer_norm f32 [8,256]", norm, ["/samples/layer_norm-0.safetensors"])]


def _invented_timing(speedup: float, half_width: float) -> dict:
    """A timing payload shaped as the lane's (engine.bench.timing ABResult.to_json); every number invented."""
    eager = 20.0
    cand = eager / speedup

    def stats(median: float) -> dict:
        return {"n": 50, "median": median, "iqr": 0.02 * median, "q1": 0.99 * median, "q3": 1.01 * median,
                "min": 0.97 * median, "max": 1.2 * median, "mean": 1.01 * median, "rel_err_median": 0.004}

    return {"eager": stats(eager), "candidate": stats(cand), "speedup": speedup,
            "speedup_ci": [speedup * (1 - half_width), speedup * (1 + half_width)], "reps": 50,
            "throttled": 0, "seconds": 0.1, "starved": False, "lead_us": 80.0, "audited": 3, "problem": None,
            "message": ""}


class invented_lane:  # noqa: N801 — a stand-in for LaneEvaluator, called like it
    """Invented outcomes keyed by the kernel: a speedup in [0.6, 3.1), a ±2 % CI, one kernel in 7 a mismatch."""

    def __init__(self, fail_internal: set[str] = frozenset()):
        self.calls: list[str] = []
        self.fail_internal = fail_internal

    async def __call__(self, card, proposal) -> Evaluation:
        d = land.kernel_digest(proposal.source, proposal.spec)
        self.calls.append(d)
        if d in self.fail_internal:
            raise RuntimeError("invented lane failure")
        h = int(d[:8], 16)
        if h % 7 == 0:
            return Evaluation("rejected", "mismatch", "invented mismatch", 0.05, payload={"verdict": {"ok": False}})
        speedup = 0.6 + (h % 1000) / 400
        return Evaluation("verified", None, "invented", 0.05, payload={"verdict": {"ok": True},
                                                                        "timing": _invented_timing(speedup, 0.02)})


def _measure(cards, path, evaluate=None, **kw) -> dict:
    doc = land.new_landscape(HELLO, torch="invented", commit="0" * 40, created="invented")
    return asyncio.run(land.measure(doc, path, cards, HW, evaluate or invented_lane(), log=lambda _: None, **kw))


@pytest.fixture(scope="module")
def landscape(cards, tmp_path_factory):
    path = tmp_path_factory.mktemp("landscape") / "landscape.json"
    _measure(cards, path)
    return path


def _replay_args(path, **kw) -> argparse.Namespace:
    return argparse.Namespace(**{"replay": path, "only": None, "budget": 8, "seeds": 3, "noise_scale": 1.0,
                                 "strategies": "mcts,greedy,beam", **kw})


@pytest.fixture(scope="module")
def replayed(landscape):
    return asyncio.run(bench.replay_async(_replay_args(landscape)))


# ------------------------------------------------------------------------------------------ enumeration


def test_enumeration_is_the_space_deduplicated_by_rendered_kernel(cards):
    for _, card, _ in cards:
        template = BuiltinProposer().template_for(card, hw=HW)[0]
        enum = land.enumerate_instances(template, card, HW)
        space = template.space(card, hw=HW)
        rendered = [template.render(card, dict(zip(space, v)), hw=HW) for v in itertools.product(*space.values())]
        assert enum.combinations == template.instances(card, hw=HW) == len(rendered)
        assert enum.sources == len({r.source for r in rendered}) < enum.combinations  # params that change nothing
        # These templates render one launch spec per source: a kernel is a source.
        assert len(enum.instances) == enum.sources and enum.unlaunchable == 0
        assert sum(i.combinations for i in enum.instances) == enum.combinations
        for inst in enum.instances:  # keyed by what was rendered, with the params the render kept
            again = template.render(card, inst.rendered.params, hw=HW)
            assert land.kernel_digest(again.source, again.spec) == inst.digest


def test_a_kernel_is_its_source_and_its_launch_spec():
    """The elementwise template renders one source with several specs (block, waves): different kernels,
    so a landscape keyed by source alone would give them one outcome."""
    card = _card(lambda: torch.randn(4, 64, 12, 12).relu_(), lambda op: op == "aten::relu_", "card-relu")
    template = BuiltinProposer().template_for(card, hw=HW)[0]
    enum = land.enumerate_instances(template, card, HW)
    assert enum.template == "elementwise" and len(enum.instances) > enum.sources


def test_card_record_round_trips_through_json(cards):
    for _, card, samples in cards:
        rec = json.loads(json.dumps(land.card_record(card, samples)))
        assert land.card_of(rec) == (card, samples)


def test_a_stored_evaluation_is_what_the_evaluator_returned(cards):
    template = BuiltinProposer().template_for(cards[0][1], hw=HW)[0]
    for inst in land.enumerate_instances(template, cards[0][1], HW).instances[:10]:
        ev = asyncio.run(invented_lane()(None, land.instance_proposal(template, inst)))
        rec = json.loads(json.dumps(land.instance_record(inst, ev)))
        assert land.evaluation_of(rec) == ev
        assert rec["speedup"] == ev.speedup if ev.status == "verified" else rec["speedup"] is None


# ------------------------------------------------------------------------------------------ measuring


def test_landscape_holds_every_kernel_once_with_the_card_and_gpu(cards, landscape):
    doc = land.load_landscape(landscape)
    assert doc["gpu"] == "NVIDIA H200" and doc["hardware"] == HELLO and doc["commit"] == "0" * 40
    for (label, card, samples), entry in zip(cards, doc["cards"]):
        enum = land.enumerate_instances(BuiltinProposer().template_for(card, hw=HW)[0], card, HW)
        assert entry["label"] == label and land.card_of(entry["card"]) == (card, samples)
        assert entry["complete"] and entry["distinct"] == len(enum.instances) == len(entry["instances"])
        assert {i["digest"] for i in entry["instances"]} == {i.digest for i in enum.instances}
        statuses = {i["status"] for i in entry["instances"]}
        assert statuses == {"verified", "rejected"}
        for i in entry["instances"]:
            if i["status"] == "verified":
                assert i["speedup"] and i["speedup_ci"][0] < i["speedup"] < i["speedup_ci"][1] and i["time_us"]
            else:
                assert i["category"] == "mismatch" and i["speedup"] is None


def test_landscape_is_written_after_every_kernel_and_resumes(cards, tmp_path):
    path = tmp_path / "l.json"
    seen_on_disk = []

    class Watching(invented_lane):
        async def __call__(self, card, proposal):
            if path.exists():
                doc = json.loads(path.read_text())
                seen_on_disk.append(sum(len(e["instances"]) for e in doc["cards"]))
            return await super().__call__(card, proposal)

    _measure(cards, path, Watching(), max_instances=4, concurrency=1)
    doc = land.load_landscape(path)
    assert [len(e["instances"]) for e in doc["cards"]] == [4, 4] and not any(e["complete"] for e in doc["cards"])
    assert seen_on_disk == [0, 1, 2, 3, 4, 5, 6, 7]  # a kill after any kernel keeps the ones before it
    with pytest.raises(land.LandscapeError, match=r"card-softmax .*4 of 24 kernels measured.*--resume"):
        land.replay_cards(doc)

    lane = invented_lane()
    asyncio.run(land.measure(doc, path, cards, HW, lane, log=lambda _: None))
    doc = land.load_landscape(path)
    assert all(e["complete"] for e in doc["cards"])
    assert len(lane.calls) == sum(e["distinct"] for e in doc["cards"]) - 8  # the measured ones are not redone
    land.replay_cards(doc)


def test_evaluator_errors_are_measured_again_on_resume_and_stop_a_dead_lane(cards, tmp_path):
    path = tmp_path / "l.json"
    enum = land.enumerate_instances(BuiltinProposer().template_for(cards[0][1])[0], cards[0][1], HW)
    flaky = {enum.instances[2].digest}
    doc = _measure(cards[:1], path, invented_lane(flaky))
    internal = [i for i in doc["cards"][0]["instances"] if i["category"] == "internal"]
    assert len(internal) == 1 and "invented lane failure" in internal[0]["evaluation"]["message"]
    lane = invented_lane()
    asyncio.run(land.measure(doc, path, cards[:1], HW, lane, log=lambda _: None))
    assert lane.calls == [enum.instances[2].digest]

    dead = invented_lane({i.digest for i in enum.instances})
    with pytest.raises(land.MeasureStopped, match="3 evaluator errors in a row"):
        _measure(cards[:1], tmp_path / "dead.json", dead, concurrency=1)
    assert len(json.loads((tmp_path / "dead.json").read_text())["cards"][0]["instances"]) == 3


# ------------------------------------------------------------------------------------------ replaying


def test_replay_runs_every_strategy_and_seed_with_equal_evaluations(replayed, cards):
    assert [(r["strategy"], r["seed"]) for r in replayed["runs"]] == [
        (s, k) for s in ("mcts", "greedy", "beam") for k in range(3)]
    for r in replayed["runs"]:
        assert set(r["cards"]) == {c.card_id for _, c, _ in cards}
        for outcome in r["cards"].values():
            assert outcome["evaluations"] == 8 and len(outcome["curve"]) == 8
    for v in replayed["summary"]["strategies"].values():
        assert v["evaluations"] == [8, 8] and v["seeds"] == 3


def test_replay_values_are_landscape_outcomes_and_the_report_has_cis(replayed, landscape):
    doc = land.load_landscape(landscape)
    speedups = {i["digest"]: i["speedup"] for e in doc["cards"] for i in e["instances"]}
    for r in replayed["runs"]:
        for outcome in r["cards"].values():
            assert outcome["kept"] is None or outcome["curve"][-1] == speedups[outcome["kept"]]
    summ = replayed["summary"]
    best = [c["best_speedup"] for c in replayed["cards"]]
    assert summ["optimum"] == pytest.approx(statistics.geometric_mean(best))
    for v in summ["strategies"].values():
        lo, hi = v["final"]["ci"]
        assert lo <= v["final"]["mean"] <= hi <= summ["optimum"] + 1e-9
    assert set(summ["differences"]) == {"mcts-greedy", "mcts-beam"}
    for diff in summ["differences"].values():
        assert diff["seeds"] == 3 and diff["ci"][0] <= diff["mean"] <= diff["ci"][1]
    md = land.replay_report(replayed)
    first = md.splitlines()[0]
    assert "replays over a landscape measured once on NVIDIA H200" in first and "not fresh GPU timings" in first
    assert "mcts − greedy" in md and "mcts − beam" in md and "95 % CI" in md and "cannot say" in md


def test_replay_is_reproducible(landscape, replayed):
    again = asyncio.run(bench.replay_async(_replay_args(landscape)))
    assert again["runs"] == replayed["runs"]


def test_a_kernel_missing_from_the_landscape_fails_loudly(cards, landscape):
    doc = land.load_landscape(landscape)
    entry = doc["cards"][1]
    template = BuiltinProposer().template_for(cards[1][1], hw=HW)[0]
    default = template.render(cards[1][1], template.default(cards[1][1], hw=HW), hw=HW)  # every run proposes it
    gone = next(i for i in entry["instances"] if i["digest"] == land.kernel_digest(default.source, default.spec))
    entry["instances"].remove(gone)
    # Up front: the landscape is checked against what the templates render now.
    with pytest.raises(land.LandscapeError, match=r"card-layer-norm .*kernels measured"):
        land.replay_cards(doc)
    entry["distinct"] -= 1  # a file that claims to be complete: the enumeration still finds the gap
    with pytest.raises(land.LandscapeError, match=r"card-layer-norm .*1 kernels missing, e\.g\. params \{"):
        land.replay_cards(doc)
    # During a search: the proposal is named (card, params), the run fails instead of inventing a result.
    evaluate = land.ReplayEvaluator(land.outcomes_of(doc["cards"]), seed=0)
    asyncio.run(bench.search_once([(c, s) for _, c, s in cards], evaluate, HW, "mcts", 0, 4,
                                  land.ReplayRecorder()))
    assert evaluate.misses and "card card-layer-norm" in evaluate.misses[0]
    assert f"params {({**default.params, 'template': 'layer_norm'})}" in evaluate.misses[0]
    assert "not in the landscape" in evaluate.misses[0]


def test_a_replay_that_meets_a_missing_kernel_stops_with_its_name(cards, landscape, tmp_path, monkeypatch):
    doc = land.load_landscape(landscape)
    doc["cards"][0]["instances"] = doc["cards"][0]["instances"][1:]  # the first kernel: the default
    land.save(doc, tmp_path / "holed.json")
    monkeypatch.setattr(land, "replay_cards", lambda doc, only: doc["cards"])  # a file the up-front check missed
    with pytest.raises(land.LandscapeMiss, match=r"^mcts, seed 0: card card-softmax .*params \{.*'template': 'softmax'"):
        asyncio.run(bench.replay_async(_replay_args(tmp_path / "holed.json")))


def test_cli_refuses_an_incomplete_landscape_naming_the_card(cards, tmp_path, monkeypatch, capsys):
    path = tmp_path / "l.json"
    _measure(cards, path, max_instances=3)
    monkeypatch.setattr(sys, "argv", ["bench_search.py", "--replay", str(path), "--out", str(tmp_path / "o")])
    assert bench.main() == 2
    assert "card-softmax" in capsys.readouterr().err and not (tmp_path / "o").exists()
    # --landscape never overwrites a measured file (checked before any GPU work)
    monkeypatch.setattr(sys, "argv", ["bench_search.py", "--landscape", str(path)])
    assert bench.main() == 2 and "--resume" in capsys.readouterr().err


def test_cli_replay_writes_json_and_markdown(landscape, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["bench_search.py", "--replay", str(landscape), "--seeds", "2", "--budget", "5",
                                      "--strategies", "mcts,greedy", "--only", "softmax", "--out", str(out)])
    assert bench.main() == 0
    d = json.loads((out / "bench_search_replay.json").read_text())
    assert [c["label"] for c in d["cards"]] == ["softmax f32 [64,256]"] and len(d["runs"]) == 4
    assert (out / "bench_search_replay.md").read_text().startswith("# Search ablation: replays over a landscape")


def test_a_replay_takes_several_landscapes_of_one_gpu_and_their_cards_together(cards, tmp_path, monkeypatch,
                                                                                 capsys):
    """Landscapes are measured a few cards a sitting: a replay over two files searches every card of both, the
    same as over one file holding them all; files of two GPUs, or one card in two files, are refused."""
    one, two, both = tmp_path / "softmax.json", tmp_path / "norm.json", tmp_path / "both.json"
    _measure(cards[:1], one)
    _measure(cards[1:], two)
    _measure(cards, both)
    merged = asyncio.run(bench.replay_async(_replay_args([one, two], seeds=2)))
    whole = asyncio.run(bench.replay_async(_replay_args(both, seeds=2)))
    assert [c["label"] for c in merged["cards"]] == [c["label"] for c in whole["cards"]] == [lb for lb, _, _ in cards]
    assert merged["runs"] == whole["runs"] and merged["summary"] == whole["summary"]
    assert merged["landscape"]["path"] == f"{one}, {two}"
    # another GPU's file
    other = json.loads(two.read_text())
    other["hardware"] = {**other["hardware"], "name": "NVIDIA GB10", "arch": "sm_121"}
    gb10 = tmp_path / "gb10.json"
    gb10.write_text(json.dumps(other))
    monkeypatch.setattr(sys, "argv", ["bench_search.py", "--replay", str(one), str(gb10), "--out", str(tmp_path / "o")])
    assert bench.main() == 2
    assert "measured on NVIDIA GB10 and NVIDIA H200; a replay takes landscapes of one GPU" in capsys.readouterr().err
    with pytest.raises(land.LandscapeError, match="is in both"):
        asyncio.run(bench.replay_async(_replay_args([one, both])))


# ------------------------------------------------------------------------------------------ noise


def test_noise_is_lognormal_with_sigma_from_the_measured_ci():
    ev = Evaluation("verified", None, "", 0.0, payload={"timing": _invented_timing(2.0, 0.1)})
    sigma = math.log(1.1 / 0.9) / (2 * 1.959963984540054)
    draws = [land.noisy(ev, random.Random(k)) for k in range(4000)]
    logs = [math.log(d.speedup) for d in draws]
    assert statistics.mean(logs) == pytest.approx(math.log(2.0), abs=0.005)
    assert statistics.stdev(logs) == pytest.approx(sigma, rel=0.05)
    for d in draws[:20]:  # the candidate's times move with the speedup, eager's stay
        t = d.payload["timing"]
        assert t["eager"]["median"] / t["candidate"]["median"] == pytest.approx(t["speedup"])
        assert t["speedup_ci"][0] < t["speedup"] < t["speedup_ci"][1]
    assert land.noisy(ev, random.Random(0), scale=0) is ev
    failed = Evaluation("rejected", "mismatch", "", 0.0)
    assert land.noisy(failed, random.Random(0)) is failed


def test_the_same_seed_reads_the_same_value_for_a_kernel_whatever_the_strategy(landscape, cards):
    doc = land.load_landscape(landscape)
    outcomes = land.outcomes_of(doc["cards"])
    template = BuiltinProposer().template_for(cards[0][1], hw=HW)[0]
    inst = land.enumerate_instances(template, cards[0][1], HW).instances[0]
    proposal = land.instance_proposal(template, inst)
    state = bench.CardState(cards[0][1], cards[0][2])

    def read(seed):
        return asyncio.run(land.ReplayEvaluator(outcomes, seed)(state, proposal))

    assert read(1) == read(1) and read(1).speedup != read(2).speedup
    exact = asyncio.run(land.ReplayEvaluator(outcomes, 1, noise_scale=0)(state, proposal))
    assert exact == land.evaluation_of(outcomes[cards[0][1].card_id][inst.digest])


# ------------------------------------------------------------------------------------------ the GPU paths


@pytest.fixture
def stand_in_lane(cards, monkeypatch):
    """bench_search's lane session with the invented lane in place of capture + GPU lane (the rest is real)."""
    import contextlib

    lane = invented_lane()

    @contextlib.asynccontextmanager
    async def session(args):
        yield [(label, c, list(s)) for label, c, s in cards], HELLO, HW, lane

    monkeypatch.setattr(bench, "lane_session", session)
    return lane


def _gpu_args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"model": "targets", "only": None, "timing_s": 0.3, "budget": 6, "seeds": 2,
                                 "strategies": "mcts,greedy", "landscape": None, "resume": False,
                                 "max_instances": None, **kw})


def test_landscape_mode_measures_through_the_session_evaluator_and_resumes(stand_in_lane, tmp_path, monkeypatch):
    path = tmp_path / "l.json"
    doc = asyncio.run(bench.landscape_async(_gpu_args(landscape=path, max_instances=5)))
    assert doc["gpu"] == HELLO["name"] and doc["torch"] == torch.__version__ and doc["timing"] == {"max_seconds": 0.3}
    assert len(stand_in_lane.calls) == 10 and land.load_landscape(path) == doc
    doc = asyncio.run(bench.landscape_async(_gpu_args(landscape=path, resume=True)))
    assert len(stand_in_lane.calls) == sum(e["distinct"] for e in doc["cards"])
    land.replay_cards(doc)
    monkeypatch.setitem(HELLO, "name", "NVIDIA GB10")  # another GPU's lane may not continue the file
    with pytest.raises(land.LandscapeError, match="measured on NVIDIA H200"):
        asyncio.run(bench.landscape_async(_gpu_args(landscape=path, resume=True)))


def test_the_gpu_search_mode_runs_the_same_searches(stand_in_lane, cards):
    d = asyncio.run(bench.main_async(_gpu_args()))
    assert [(r["strategy"], r["seed"]) for r in d["runs"]] == [("mcts", 0), ("mcts", 1), ("greedy", 0), ("greedy", 1)]
    assert all(len(curve) == 6 for r in d["runs"] for curve in r["curves"].values())
    assert "| mcts |" in bench.report(d)


def test_a_noiseless_replay_is_the_live_search_over_the_same_outcomes(stand_in_lane, tmp_path):
    """With the lane's outcomes fixed (the invented lane) and no noise, replaying the landscape reproduces
    the live searches kernel for kernel: the replay evaluator returns what the lane returned."""
    path = tmp_path / "l.json"
    asyncio.run(bench.landscape_async(_gpu_args(landscape=path)))
    live = asyncio.run(bench.main_async(_gpu_args(budget=10, seeds=3, strategies="mcts,greedy,beam")))
    replay = asyncio.run(bench.replay_async(_replay_args(path, budget=10, noise_scale=0.0)))
    for a, b in zip(live["runs"], replay["runs"], strict=True):
        assert (a["strategy"], a["seed"]) == (b["strategy"], b["seed"])
        for card_id, curve in a["curves"].items():
            assert [v or 1.0 for v in curve] == b["cards"][card_id]["curve"]  # live: 0 until one verifies


def test_a_landscape_says_each_cards_best_against_the_lanes_copy_of_its_bytes(cards, tmp_path):
    """Issue 21 measures memory-bound kernels against the lane's own copy of the same bytes: a card that has
    its copy time gets one line with its best verified kernel's share of copy bandwidth; one without, none."""
    import dataclasses

    (label, card, samples) = cards[0]
    lines: list[str] = []
    doc = land.new_landscape(HELLO, torch="invented", commit="0" * 40, created="invented")
    asyncio.run(land.measure(doc, tmp_path / "l.json", [(label, dataclasses.replace(card, copy_us=10.0), samples),
                                                        cards[1]], HW, invented_lane(), log=lines.append))
    best = land.best_instance(doc["cards"][0])
    said = [line for line in lines if "copy of the same bytes" in line]
    assert said == [f"[1/2 {label}] best verified kernel {best['time_us']:.2f} us; the lane's copy of the same "
                    f"bytes 10.00 us: {100 * 10.0 / best['time_us']:.0f} % of copy bandwidth ({best['params']})"]
    assert doc["cards"][0]["card"]["copy_us"] == 10.0 and land.copy_line(doc["cards"][1]) is None
