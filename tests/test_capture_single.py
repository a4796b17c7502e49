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


def test_signature_text_folds_repeated_list_items(tmp_path):
    # Mamba's scan stacked 32 steps: the card's line listed 32 entries (about 30 kB at 2048 tokens).

    from engine.capture.signature import signature_text
    from engine.capture.single import capture_samples

    xs = [torch.randn(1, 4, device="meta") for _ in range(32)]
    (card,), _ = capture_samples(lambda: torch.stack(xs), tmp_path / "stack", 0)
    assert signature_text(card.signature).startswith("[f32[1,4]×32]")
    ys = [torch.randn(2, device="meta"), torch.randn(3, device="meta")]
    (card,), _ = capture_samples(lambda: torch.cat(ys * 2), tmp_path / "cat", 0)
    assert signature_text(card.signature).startswith("[f32[2],f32[3],f32[2],f32[3]]")   # no runs: as before
