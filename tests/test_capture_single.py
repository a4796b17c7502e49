"""capture_card: one call captured as a card with its samples on disk (used by benchmarks, GPU tests)."""

import pytest
import torch

from engine.capture.samples import load_sample
from engine.capture.single import capture_card


def test_one_call_becomes_a_card_with_replayable_samples(tmp_path):
    x = torch.randn(4, 8)
    ref = capture_card(tmp_path, lambda: torch.relu(x), samples=2)
    assert ref.op == "aten::relu"
    assert len(ref.samples) == 2
    s = load_sample(ref.samples[0], "cpu")
    assert torch.equal(s.outputs, torch.relu(x))


def test_more_than_one_card_is_refused(tmp_path):
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="expected one card"):
        capture_card(tmp_path, lambda: torch.relu(x) + 1)
