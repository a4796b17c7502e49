"""GPU: each builtin chain template's default kernel verified in a real lane on its toy chain.

Each toy chain card gets sample files of random inputs (`engine.capture.chain_cards.synthetic_chain_card`,
written as a capture writes them). Not run where this was written (no GPU): written to the harness's
contract."""

from __future__ import annotations

import pytest
import torch
from test_builtin_chains import EXPECTED, _cases

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_template_default_verifies_in_a_lane(tmp_path, name):
    from gpu_harness import evaluate_many

    from engine.capture.chain_cards import synthetic_chain_card
    from engine.propose.base import Hardware
    from engine.propose.builtin.proposer import BuiltinProposer

    card = _cases()[name]
    ref = synthetic_chain_card(tmp_path / "samples", card.signature, 2)
    major, minor = torch.cuda.get_device_capability()
    hw = Hardware(arch=f"sm_{major}{minor}", sms=torch.cuda.get_device_properties(0).multi_processor_count)
    template, reasons = BuiltinProposer().template_for(card, hw=hw)
    assert template is not None and template.name == EXPECTED[name], reasons
    r = template.render(card, template.default(card, hw=hw), hw=hw)
    (ev,) = evaluate_many([(ref, r.source, r.spec)], cache_dir=tmp_path / "cache")
    assert ev.status == "verified", (name, ev.category, ev.message, ev.payload)
