"""A kernel that computes only where its output buffer looks poisoned (the lane's NaN or sentinel) and otherwise
trusts what the buffer holds: in a model, whose buffers hold earlier results, it returns stale values.
Verification's third run per input set prefills the outputs with another set's answer, and timed calls are
sometimes prefilled with eager's last answer (to its own values), so the trust shows as `cheating`.

The kernels are the adversarial suite's CUDA source, run on the CPU by the emulation (tests/cuda_emulator.py)."""

import cuda_emulator as emu
import pytest
import torch
from adversarial_kernels import CORRECT_ADD, SKIPS_FILLED_OUTPUT

from engine.launch import Env, parse_spec, resolve
from engine.launch.launcher import per_output, prefill_
from engine.ops import call_op, resolve_op

ADD = resolve_op("aten::add.Tensor")
N = 1024


@pytest.fixture(scope="module")
def add_card(tmp_path_factory):
    from engine.capture.single import capture_samples

    cards, _ = capture_samples(lambda: torch.add(torch.randn(N, device="meta"), torch.randn(N, device="meta")),
                               tmp_path_factory.mktemp("add"), 0)
    return cards[0]


def _emulated(adv, card, workdir):
    if not emu.available():
        pytest.skip("g++ is needed for the CUDA-on-CPU emulation")
    res = resolve(parse_spec(adv.spec), Env.from_card(card.signature, card.outputs))
    program = emu.build([(adv.source, res)], workdir)

    def kernel(bound, prefill):
        outs = []
        for i, d in enumerate(card.outputs):
            o = emu.output_like(d, 0.0)
            prefill_(o, per_output(prefill, i))   # as the lane's launcher fills a fresh output
            outs.append(o)
        run = emu.run(program, 0, res, dict(bound), outs, workdir)
        assert run.error is None, run.error
        return run.outputs
    return kernel


def _check(seed=0):
    from engine.verify.pipeline import CardCheck

    gen = torch.Generator().manual_seed(seed)
    samples = [[("self", torch.randn(N, generator=gen)), ("other", torch.randn(N, generator=gen)), ("alpha", 1)]
               for _ in range(2)]
    return CardCheck("aten::add.Tensor", samples, lambda b: call_op(ADD, b), race_reps=0)


def test_a_kernel_that_trusts_an_unpoisoned_output_buffer_is_cheating(add_card, tmp_path):
    v = _check().check(_emulated(SKIPS_FILLED_OUTPUT, add_card, tmp_path))
    assert not v.ok and v.category == "cheating", (v.category, v.message)
    assert v.input_set == "sample 1"   # the first set with a set before it
    assert "another input set's answer" in v.message and "trusts what the buffer held" in v.message


def test_a_correct_kernel_passes_with_stale_answers_in_its_buffers(add_card, tmp_path):
    v = _check().check(_emulated(CORRECT_ADD, add_card, tmp_path))
    assert v.ok, v.message


def test_prefill_copies_a_stale_answer_of_the_outputs_shape_only():
    t = torch.empty(4)
    prefill_(t, torch.arange(4.0))
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
    prefill_(t, torch.arange(5.0))   # another shape: the sentinel
    assert t.tolist() == [-1234.5] * 4
    prefill_(t, "nan")
    assert bool(t.isnan().all())
    assert per_output("nan", 3) == "nan"
    stale = [torch.zeros(2), torch.ones(2)]
    assert per_output(stale, 1) is stale[1] and per_output(stale, 2) == "sentinel"


def test_workspaces_are_poisoned_unlike_between_checked_runs():
    # Fresh device memory often reads zeros: a kernel that accumulates into a workspace it never asked zeroed
    # passed, and in a model (blocks the allocator hands back) it adds onto the last call's sums.
    from engine.launch.launcher import WORKSPACE_NAN, CandidateLauncher

    launcher = object.__new__(CandidateLauncher)   # the allocation half only: no module, no GPU
    launcher.output_specs, launcher.aliases, launcher.write_only = [], [], []
    launcher.canaries, launcher.device = None, torch.device("cpu")
    launcher.workspaces = [("acc", 4096, False), ("zeroed", 16, True)]
    launcher._launch = lambda args, outs, ws: ws
    stale = torch.randn(100)
    first = launcher.prepare([], "nan")()
    second = launcher.prepare([], "sentinel")()
    third = launcher.prepare([], "sentinel")()
    fourth = launcher.prepare([], [stale])()
    assert set(first["acc"][0].tolist()) == {WORKSPACE_NAN}
    for ws in (second, third):
        assert len(set(ws["acc"][0].tolist())) > 200   # 4096 random bytes: nearly every value of a byte
    assert not torch.equal(second["acc"][0], third["acc"][0])
    # Stale answers in the outputs: the workspace holds the first one's bytes, repeated (a model's leftovers,
    # values a tensor holds, not bytes that look poisoned)
    assert torch.equal(fourth["acc"][0], stale.view(torch.uint8).repeat(11)[:4096])


def test_a_kernel_counting_from_its_workspaces_first_entry_fails_where_entries_differ():
    """A split-K style kernel that skips zeroing its arrival counters and counts from whatever entry 0 holds
    (every entry started equal under a one-byte poison) finishes only where every counter reads as entry 0 did.
    In a model, whose workspace holds what the last call left, it would skip the final reduction."""
    from engine.launch.launcher import CandidateLauncher

    launcher = object.__new__(CandidateLauncher)
    launcher.output_specs, launcher.aliases, launcher.write_only = [], [], []
    launcher.canaries, launcher.device = None, torch.device("cpu")
    launcher.workspaces = [("counters", 64, False)]
    launcher._launch = lambda args, outs, ws: ws

    def finishes(ws) -> bool:   # each of 64 tiles sees its counter reach entry 0's start + 1 after one arrival
        c = ws["counters"][0]
        base = int(c[0])
        return all((int(v) + 1) % 256 == (base + 1) % 256 for v in c.tolist())

    assert finishes(launcher.prepare([], "nan")())          # 0xFF everywhere: it would pass this run
    assert not finishes(launcher.prepare([], "sentinel")())  # random bytes: the run where it fails
