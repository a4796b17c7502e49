"""Eager itself, as the candidate of a chain card, is never rejected (the honest sweep of chain cards): small models
whose forwards hold real models' chains and user-written variations (tests/chain_sweep_models.py) captured with the
real capture on the CPU, each chain card verified with its own eager (`run_chain`) as the kernel, timed with audits
(`ab_time` replaced by test_timed_protocol's plain alternation) and re-checked in place as the lane does; and the
same through the lane's `CandidateLauncher` (no kernels), eager's values copied into the outputs it allocates and
poisons. A rejection of either is a false rejection.

The whole sweep (every pattern of chain_sweep_models.PATTERNS x 10 seeds: 80 patterns, 800 captures) is
scripts/chain_honest_sweep.py; the parametrized test keeps a representative subset, and each bug it found has its
own test below: chain inputs written in place held read-only; random calls and calls whose output shape depends on
values inside chains; a chain with no outputs (a false acceptance)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_timed_protocol import _alternating_ab

from engine.bench.timing import TimingConfig
from engine.capture.chains import CHAIN_OP, chain_written_inputs, run_chain
from engine.capture.samples import load_sample
from engine.launch import ResolvedSpec
from engine.launch.launcher import CandidateLauncher
from engine.ops import resolve_op
from engine.verify.guard import Canaries
from engine.verify.pipeline import as_list, card_check

CFG = TimingConfig(min_reps=32, batch=16, audit_every=8, min_audits=3)
SOURCE = "from chain_sweep_models import build\n"


def captured_chains(tmp_path: Path, name: str, seed: int, dtype: str = "float32") -> tuple[Any, list]:
    """The chain cards of PATTERNS[name] at `seed`, captured as a model's are: (the CaptureResult, [(card, samples)])
    with each card's samples loaded as the lane loads them."""
    from engine.capture.run import capture_model
    from engine.config import load_config

    # as card_helpers.capture_source, with channels-last twins and conv-bias folds on (a CUDA capture's default
    # after a convolution)
    (tmp_path / "sweep.py").write_text(SOURCE)
    (tmp_path / "sweep.toml").write_text(
        f'name = "sweep"\nbuilder = "sweep.py:build"\n[params]\nname = "{name}"\nseed = {seed}\n[dtype]\n'
        f'cpu = "{dtype}"\ncuda = "{dtype}"\n[capture]\nsamples = 2\nlayout_twins = true\n'
        'conv_bias_folds = true\n')
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    result = capture_model(load_config(tmp_path / "sweep.toml"), torch.device("cpu"), ws)
    out = []
    for card in result.chains:
        files = sorted((ws / result.sample_dir).glob(f"{card.card_id}.*.safetensors"))
        if not files:   # a twin's or a fold's: the files of the card they derive from
            files = [ws / result.sample_dir / f"{result.shares_samples_of(card.card_id)}.{i}.safetensors"
                     for i in range(card.samples)]
        samples = [load_sample(f, "cpu", card.signature).args for f in files]
        out.append((card, samples))
    return result, out


def eager_candidate(check):
    return lambda bound, prefill: (lambda: as_list(check.eager(bound)))


def launched_candidate(check, outputs):
    """An honest launched kernel: the lane's launcher allocates (and poisons) the chain's outputs, eager's values
    go in."""
    launcher = CandidateLauncher(None, ResolvedSpec((), ()), CHAIN_OP, outputs, torch.device("cpu"),
                                 canaries=Canaries("cpu"))

    def prepare(bound, prefill):
        outs = launcher.allocate_outputs(dict(bound), prefill)

        def call():
            for o, r in zip(outs, as_list(check.eager(bound))):
                o.copy_(r)
            return outs
        return call
    return prepare


def verify_and_time(monkeypatch, card, samples, how: str, seed: int) -> str | None:
    """What rejects the honest candidate `how` ('eager' or 'launched') of a chain card, or None."""
    from engine.verify import timed

    monkeypatch.setattr(timed, "ab_time", _alternating_ab)
    check = card_check(CHAIN_OP, card.signature, samples, seed=1234 + 7 * seed, race_reps=2)
    prepare = eager_candidate(check) if how == "eager" else launched_candidate(check, card.outputs)

    def run(b, prefill):
        return as_list(prepare(b, prefill)())

    v = check.check(run)
    if not v.ok:
        return f"verification: {v.category}: {v.message}"
    got = timed.audited_ab(check, timed.TimedCandidate(prepare), lambda: None, CFG, seed=100 + seed)
    if got.category is not None or got.audited < CFG.min_audits:
        return f"timed: {got.category}: {got.message}"
    again = check.recheck_in_place(run, got.slot)
    if not again.ok:
        return f"re-check: {again.category}: {again.message}"
    return None


def replay_problem(card, tmp_path: Path, result) -> str | None:
    """Whether the card's samples replay through run_chain exactly (the capture's own promise)."""
    ws = tmp_path / "ws"
    for f in sorted((ws / result.sample_dir).glob(f"{card.card_id}.*.safetensors")):
        s = load_sample(f, "cpu", card.signature)
        got = run_chain(card.signature, [t for _, t in s.args])
        want = as_list(s.outputs)
        if len(got) != len(want):
            return f"{f.name}: {len(got)} outputs, sample has {len(want)}"
        for i, (a, b) in enumerate(zip(got, want)):
            if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a.nan_to_num(0), b.nan_to_num(0)):
                return f"{f.name}: out{i} differs from the sample's"
    return None


def sweep_one(monkeypatch, tmp_path: Path, name: str, seed: int, seen: list | None = None) -> list[str]:
    """Every problem found for PATTERNS[name] at `seed` (capture, replay, each card x each candidate); the cards
    checked are appended to `seen`."""
    result, cards = captured_chains(tmp_path, name, seed)
    if seen is not None:
        seen += [card.signature_text for card, _ in cards]
    problems = []
    for card, samples in cards:
        label = f"{card.signature_text[:90]}"
        if not samples:
            problems.append(f"{label}: no samples ({result.notes.get('chain samples', '')})")
            continue
        if (why := replay_problem(card, tmp_path, result)) is not None:
            problems.append(f"{label}: replay: {why}")
        for how in ("eager", "launched"):
            try:
                why = verify_and_time(monkeypatch, card, samples, how, seed)
            except Exception as e:   # noqa: BLE001 - a crash of the checks is a finding too
                why = f"raised {type(e).__name__}: {e}"
            if why is not None:
                problems.append(f"{label} [{how}]: {why}")
    return problems


SUBSET = ["llama_rms bf16", "gemma_rms fp32", "add+rms bf16", "add+layernorm fp32", "groupnorm+silu fp32",
          "groupnorm+silu bf16 channels-last", "swiglu chunk bf16", "adaln modulate bf16", "rotary bf16",
          "masked softmax fp32", "transposed input", "output a view of an input", "outputs alias each other",
          "fp16 x fp32 weight", "int chain", "gate/up views of one storage", "expanded mask and offset slice",
          "positions gather", "softmax fully masked row", "quantize dequantize"]


@pytest.mark.parametrize("name", SUBSET)
def test_eager_as_the_candidate_of_a_chain_card_is_never_rejected(tmp_path, monkeypatch, name):
    problems = sweep_one(monkeypatch, tmp_path, name, seed=1)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", ["in-place on an input", "residual add_ then norm bf16",
                                  "in-place through a view made inside", "relu_ on the input, returned"])
def test_a_chain_that_writes_its_input_in_place_must_leave_it_as_eager_does(tmp_path, monkeypatch, name):
    # `x.mul_(y)`, a residual stream's `h.add_(x)` (through the `_unsafe_view` of a Linear's output), `x.view(-1).mul_`,
    # `x.relu_()`: a member writes an input of the chain, and `run_chain` writes it, as the model's forward did. The
    # check held every chain input read-only, and every honest kernel (eager's own chain, and eager's values through
    # the launcher) was rejected in verification: 'input in0 was modified by the candidate'.
    _, cards = captured_chains(tmp_path, name, 0)
    card, samples = next((c, s) for c, s in cards if any(_in_place(n["op"]) for n in c.signature["chain"]["nodes"]))
    assert chain_written_inputs(card.signature) == ["in0"]
    for how in ("eager", "launched"):
        assert verify_and_time(monkeypatch, card, samples, how, 0) is None, how
    # A kernel that computes the outputs on a copy and leaves the input as it was is still caught.
    check = card_check(CHAIN_OP, card.signature, samples, race_reps=0)

    def on_a_copy(b, prefill):
        return as_list(check.eager([(n, t.clone()) for n, t in b]))

    v = check.check(on_a_copy)
    assert not v.ok and "mutated argument in0" in v.message, v.message


def _in_place(op: str) -> bool:
    base = op.split("::")[1].split(".")[0]
    return base.endswith("_") and not base.endswith("__")


def test_a_chain_that_writes_only_its_own_intermediates_writes_no_input(tmp_path):
    # `h = x * 2; h.mul_(0.5); tanh(h).add_(1)`: in-place members on values the chain made; its input stays read-only.
    _, cards = captured_chains(tmp_path, "in-place on an intermediate", 0)
    (card, _), = cards
    assert [n["op"] for n in card.signature["chain"]["nodes"]] == [
        "aten::mul.Tensor", "aten::mul_.Tensor", "aten::tanh", "aten::add_.Tensor"]
    assert chain_written_inputs(card.signature) == []


def test_a_random_call_ends_a_chain(tmp_path, monkeypatch):
    # StyleGAN's noise injection, `leaky_relu(x + w * torch.randn(...))`, in eval too: the chain held `randn`, and its
    # eager drew other noise on every run: eager's own chain was rejected ('100 of 100 elements differ') and its
    # samples did not replay. The draw is now the chain's input, as the capture saw it.
    _, cards = captured_chains(tmp_path, "noise injection", 0)
    assert cards
    for card, samples in cards:
        ops = [n["op"] for n in card.signature["chain"]["nodes"]]
        assert not any(torch.Tag.nondeterministic_seeded in resolve_op(op).tags for op in ops), ops
        assert verify_and_time(monkeypatch, card, samples, "eager", 0) is None
    assert [n["op"] for n in cards[0][0].signature["chain"]["nodes"]] == [
        "aten::mul.Tensor", "aten::add.Tensor", "aten::leaky_relu"]


@pytest.mark.parametrize("name", ["boolean mask indexing", "nonzero rows", "unique", "repeat_interleave by values"])
def test_a_call_whose_output_shape_depends_on_values_ends_a_chain(tmp_path, monkeypatch, name):
    # `sigmoid(x[x > 0]) * 2`, rows picked by nonzero, unique, repeat_interleave by counts: such a call is no op card
    # (engine.capture.filters.data_dependent), but it was a chain member. Eager's own chain passed, as its outputs
    # take the shape of each input set's answer; a launched kernel, whose outputs have the card's shape, could never
    # (every fresh set's answer has another: 'The size of tensor a (34) must match the size of tensor b (32)').
    _, cards = captured_chains(tmp_path, name, 0)
    assert cards
    for card, samples in cards:
        nodes = card.signature["chain"]["nodes"]
        assert not any(torch.Tag.dynamic_output_shape in resolve_op(n["op"]).tags and n["op"] != "aten::index.Tensor"
                       for n in nodes), [n["op"] for n in nodes]
        for how in ("eager", "launched"):
            assert verify_and_time(monkeypatch, card, samples, how, 0) is None, (card.signature_text, how)


def test_a_chain_that_makes_nothing_a_kernel_could_write_is_no_chain_card(tmp_path):
    # `tanh(x) / (x.abs().amax().item() + 1)`: abs and amax feed only the host read, and were a chain card of their
    # own with no outputs, `chain[abs amax _local_scalar_dense]`: a kernel writing nothing passed every check, and an
    # empty one would have timed faster than eager.
    _, cards = captured_chains(tmp_path, "item() inside", 0)
    assert cards and all(card.outputs and card.signature["chain"]["outputs"] for card, _ in cards), \
        [(card.signature_text, card.outputs) for card, _ in cards]


def test_the_prompt_of_a_chain_that_writes_its_input_says_so(tmp_path):
    # The verifier holds an input the chain writes in place to eager's (12f7bae): the LLM's spec says which.
    from engine.propose.chain_code import chain_semantics

    _, cards = captured_chains(tmp_path, "in-place on an intermediate", 0)
    (card, _), = cards
    assert "in place" not in chain_semantics(card.signature)
    _, cards = captured_chains(tmp_path, "in-place on an input", 0)
    card = next(c for c, _ in cards if any(_in_place(n["op"]) for n in c.signature["chain"]["nodes"]))
    assert "It also writes `in0` in place, as the code's in-place call does: your kernel must leave that input as " \
           "the code leaves it" in chain_semantics(card.signature)
