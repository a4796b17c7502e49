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
    from engine.launch.launcher import WORKSPACE_POISON, CandidateLauncher

    launcher = object.__new__(CandidateLauncher)   # the allocation half only: no module, no GPU
    launcher.output_specs, launcher.aliases, launcher.write_only = [], [], []
    launcher.canaries, launcher.device = None, torch.device("cpu")
    launcher.workspaces = [("acc", 32, False), ("zeroed", 16, True)]
    launcher._launch = lambda args, outs, ws: ws
    first = launcher.prepare([], "nan")()
    second = launcher.prepare([], [torch.zeros(1)])()   # stale answers: the sentinel's pattern
    assert set(first["acc"][0].tolist()) == {0xFF} and set(second["acc"][0].tolist()) == {WORKSPACE_POISON[0]}
    assert WORKSPACE_POISON[0] != 0xFF
