"""Chain cards and the planner: a chain's calls are also its members' op cards' calls, so each call is
counted once, for the chain while the chain can still serve it (engine.cards.chain_cover,
engine.run.plan.count_chains_once), in the order of work and in the estimated whole-model speedup."""

from __future__ import annotations

import dataclasses

import pytest

from engine.cards import OperatorCard, chain_cover, model_speedup
from engine.propose.hardware_profiles import profile
from engine.run.as_gpu import gpu_shares
from engine.run.plan import CardState, SchedulePolicy, count_chains_once, expected_gain, next_card

CHAIN = "kforge::chain"


def op(cid, name, calls, share, **kw):
    return OperatorCard(cid, name, {"op": name, "args": [], "aliases": []}, calls=calls, share=share, bytes=4096,
                        **kw)


def capture():
    """A hand-made capture of a 4-layer model: per layer one matmul and one RMSNorm chain (upcast, pow, mean,
    add, rsqrt, mul, downcast, weight mul), plus 4 more `mul` calls of the same signature outside any chain
    (a residual scale). Op shares sum to 1; the chain's share is its calls' time: the members' part."""
    cards = [
        op("mm", "aten::mm", 4, 0.40),
        op("to", "aten::_to_copy", 8, 0.16),
        op("pow", "aten::pow.Tensor_Scalar", 4, 0.06),
        op("mean", "aten::mean.dim", 4, 0.08),
        op("add", "aten::add.Tensor", 4, 0.04),
        op("rsqrt", "aten::rsqrt", 4, 0.04),
        op("mul", "aten::mul.Tensor", 12, 0.22),  # 8 calls in the chains, 4 outside: 2/3 covered
    ]
    members = ["to", "pow", "mean", "add", "rsqrt", "mul", "to", "mul"]
    chain = OperatorCard("rms", CHAIN, {"op": CHAIN, "args": [], "aliases": []}, calls=4,
                         share=0.16 + 0.06 + 0.08 + 0.04 + 0.04 + 0.22 * 2 / 3, bytes=4096,
                         chain={"kind": "module", "module_class": "RMSNorm", "members": members,
                                "ops": ["_to_copy", "pow", "mean", "add", "rsqrt", "mul", "_to_copy", "mul"]})
    return [*cards, chain]


def states(cards):
    return [CardState(c, ["s0"]) for c in cards]


def test_chain_cover_gives_each_member_card_the_part_of_its_share_the_chain_holds():
    cover = chain_cover(capture())
    assert set(cover) == {"to", "pow", "mean", "add", "rsqrt", "mul"}  # the matmul is in no chain
    assert cover["to"] == {"rms": pytest.approx(0.16)}  # 2 of its calls per instance, 4 instances: all 8
    assert cover["mul"] == {"rms": pytest.approx(0.22 * 2 / 3)}  # 8 of 12 calls
    assert sum(s for held in cover.values() for s in held.values()) == pytest.approx(capture()[-1].share)


def test_calls_inside_a_chain_in_play_count_for_the_chain_only():
    cards = states(capture())
    by_id = {c.card_id: c for c in cards}
    assert sum(c.own_share for c in cards) == pytest.approx(1.0 + by_id["rms"].share)  # before: counted twice
    count_chains_once(cards)
    assert sum(c.own_share for c in cards) == pytest.approx(1.0)
    assert by_id["to"].own_share == pytest.approx(0.0) and by_id["mul"].own_share == pytest.approx(0.22 / 3)
    assert by_id["mm"].own_share == 0.40 and by_id["rms"].own_share == by_id["rms"].share
    assert by_id["to"].share == 0.16  # the card's captured share itself is unchanged (report, skip rules)


def test_the_order_of_work_no_longer_puts_member_cards_ahead_of_cards_outside_chains():
    policy = SchedulePolicy()
    cards = states(capture())
    by_id = {c.card_id: c for c in cards}
    by_id["mm"].done_reason = "plateau"  # the matmul is done; what comes next among the rest?
    cards.append(CardState(op("gelu", "aten::gelu", 4, 0.10), ["s0"]))
    # Counted twice, the weight-multiply card (0.22, 2/3 of it inside the chains) went before the gelu (0.10).
    first = [next_card(cards, policy, 50).card_id]
    by_id["rms"].in_flight = 50  # the chain out of the way: its budget in flight
    first.append(next_card(cards, policy, 50).card_id)
    assert first == ["rms", "mul"]
    count_chains_once(cards)
    order = []
    by_id["rms"].in_flight = 0
    order.append(next_card(cards, policy, 50).card_id)
    by_id["rms"].in_flight = 50
    order.append(next_card(cards, policy, 50).card_id)
    assert order == ["rms", "gelu"]  # the members' calls are the chain's while it searches
    assert expected_gain(by_id["to"]) == 0.0
    # A chain that cannot serve its calls (declined, or done without a kernel faster than eager) gives
    # them back to its members.
    by_id["rms"].done_reason = "declined"
    count_chains_once(cards)
    assert next_card(cards, policy, 50).card_id == "mul" and by_id["to"].own_share == pytest.approx(0.16)
    by_id["rms"].done_reason, by_id["rms"].best_us = "plateau", 5.0
    by_id["rms"].card = dataclasses.replace(by_id["rms"].card, eager_us=10.0)
    count_chains_once(cards)
    assert by_id["to"].own_share == 0.0  # done with a 2x kernel: it serves those calls
    by_id["rms"].best_us = 12.0
    count_chains_once(cards)
    assert by_id["to"].own_share == pytest.approx(0.16)  # done, slower than eager: it does not


def test_the_estimated_model_speedup_counts_each_call_once():
    cards = capture()
    chain_share = cards[-1].share
    assert model_speedup(cards, {}) == pytest.approx(1.0)
    # The chain at 2x: its calls take half their time, the rest as eager.
    assert model_speedup(cards, {"rms": 2.0}) == pytest.approx(1 / (1 - chain_share / 2))
    # Its members at 1.5x as well: the chain's calls go the better way, never both.
    assert model_speedup(cards, {"rms": 2.0, "to": 1.5, "pow": 1.5, "mean": 1.5, "add": 1.5, "rsqrt": 1.5,
                                 "mul": 1.5}) == pytest.approx(1 / (1 - chain_share / 2 - 0.22 / 3 * (1 - 1 / 1.5)))
    # Members faster than the chain: theirs.
    assert model_speedup(cards, {"rms": 1.2, "to": 4.0, "pow": 4.0, "mean": 4.0, "add": 4.0, "rsqrt": 4.0,
                                 "mul": 4.0}) == pytest.approx(1 / (0.40 + 0.60 / 4))
    assert model_speedup(cards, {"mm": 2.0}) == pytest.approx(1 / 0.8)


def test_a_dry_runs_gpu_shares_leave_chain_cards_out_of_the_models_time():
    cards = gpu_shares(capture(), profile("h200"))
    ops = [c for c in cards if c.chain is None]
    assert sum(c.share for c in ops) == pytest.approx(1.0)
    (chain,) = [c for c in cards if c.chain is not None]
    by_id = {c.card_id: c for c in ops}
    expected = sum(by_id[m].share for m in ("to", "pow", "mean", "add", "rsqrt")) + by_id["mul"].share * 2 / 3
    assert chain.share == pytest.approx(expected)


def test_a_card_with_a_large_win_gives_way_to_cards_nobody_has_tried():
    """The H200 VAE run of 2026-12-02: the GroupNorm → SiLU chain at 1024² (20 % of eager's time) went from
    3,884 µs to 259 µs on its first candidates and then took 21 candidates in all, while GroupNorms of other
    shapes (a few % each, ~17× to win) were never searched before the wall time ran out."""
    policy = SchedulePolicy()
    big = CardState(op("big", "aten::native_group_norm", 5, 0.20, eager_us=3884.0, roofline_us=128.0), ["s0"])
    fresh = CardState(op("fresh", "aten::native_group_norm", 11, 0.02, eager_us=200.0, roofline_us=12.0), ["s0"])
    cards = [big, fresh]
    count_chains_once(cards)
    assert next_card(cards, policy, 50) is big  # untried, the bigger card goes first
    big.record(259.0, policy)
    # What is left of the big card: 20 % × (259 − 128) / 3884 ≈ 0.7 % of the model; the fresh one ≈ 1.9 %.
    assert expected_gain(big) == pytest.approx(0.20 * (259.0 - 128.0) / 3884.0)
    assert next_card(cards, policy, 50) is fresh
    # A card that has not won anything yet keeps the whole of its headroom.
    big2 = CardState(op("big2", "aten::native_group_norm", 5, 0.20, eager_us=3884.0, roofline_us=128.0), ["s0"])
    big2.record(None, policy)
    assert expected_gain(big2) == pytest.approx(0.20 * (1 - 128.0 / 3884.0) / 2 ** 0.5)
    # A kernel slower than eager does not raise the card's claim above its untried one.
    big2.record(5000.0, policy)
    assert expected_gain(big2) <= 0.20 * (1 - 128.0 / 3884.0)


def test_a_pattern_chain_leaves_its_members_calls_to_their_op_cards():
    """The H200 VAE run of 2026-12-02: GroupNorm → SiLU chains inside ResNet blocks (pattern cards, which
    run only under torch.compile) held all the calls of the group_norm op cards of their shapes, so those had
    no share of their own and were never searched, and in eager nothing served those GroupNorms."""
    policy = SchedulePolicy()
    gn = op("gn", "aten::native_group_norm", 5, 0.10, eager_us=1900.0, roofline_us=120.0)
    silu = op("silu", "aten::silu", 5, 0.05, eager_us=300.0, roofline_us=120.0)
    pattern = OperatorCard("gn_silu", CHAIN, {"op": CHAIN, "args": [], "aliases": []}, calls=5, share=0.15,
                           bytes=4096, eager_us=2200.0, roofline_us=120.0,
                           chain={"kind": "pattern", "module_class": "ResnetBlock2D", "members": ["gn", "silu"],
                                  "ops": ["native_group_norm", "silu"]})
    cards = states([gn, silu, pattern])
    by_id = {c.card_id: c for c in cards}
    count_chains_once(cards)
    assert by_id["gn"].own_share == 0.10 and by_id["silu"].own_share == 0.05
    by_id["gn_silu"].record(140.0, policy)  # the chain won 15x: the GroupNorm op card comes next
    count_chains_once(cards)
    assert next_card(cards, policy, 50).card_id == "gn"
    # The same chain as a module card (the whole forward of a module, served in eager) holds them.
    by_id["gn_silu"].card = dataclasses.replace(pattern, chain={**pattern.chain, "kind": "module"})
    count_chains_once(cards)
    assert by_id["gn"].own_share == 0.0 and by_id["silu"].own_share == 0.0


def test_a_run_cut_short_by_its_wall_time_names_the_cards_it_never_reached(tmp_path):
    """The H200 VAE run of 2026-12-02 stopped with 7 group_norm cards never searched and said nothing of
    them; the run now says how many, how much of eager's time they hold, and the command that searches them."""
    from engine.run.command import still_waiting

    cards = states(capture())
    by_id = {c.card_id: c for c in cards}
    for c in cards:
        c.done_reason = "declined"
    by_id["mm"].done_reason = None  # searched: not waiting
    by_id["mm"].iterations = 3
    by_id["rms"].done_reason = None  # never reached
    by_id["mul"].done_reason = None  # never reached; 2/3 of its calls are the chain's
    line = still_waiting(cards, "run-1", tmp_path, 480.0)
    assert line == (f"the wall time ran out with 2 card(s) never searched (60 % of eager's time): kforge-tui run "
                    f"--resume run-1 --workspace {tmp_path} --wall-time 480 searches them")
    by_id["rms"].in_flight = 1
    by_id["mul"].iterations = 1
    assert still_waiting(cards, "run-1", tmp_path, 480.0) is None


def test_a_pattern_card_is_weighed_against_torch_compiles_code_for_its_chain():
    """A pattern card serves only inside compiled graphs, where torch.compile's own code for its chain is the
    alternative: on the H200 VAE (2026-12-02f) Inductor fused the 1024² GroupNorm → SiLU to 308 µs against
    eager's 3,787 µs, so untried, that chain has about a tenth of the gain its eager time suggests and gives
    way to a group_norm op card of a few % (which serves eager too). A module card keeps eager's measure."""
    policy = SchedulePolicy()
    chain = {"kind": "pattern", "members": ["gn", "silu"], "ops": ["native_group_norm", "silu"]}
    pattern = OperatorCard("gn_silu", CHAIN, {"op": CHAIN, "args": [], "aliases": []}, calls=5, share=0.20,
                           bytes=4096, eager_us=3787.0, roofline_us=132.5, compile_us=307.8, chain=chain)
    gn = op("gn", "aten::native_group_norm", 6, 0.06, eager_us=932.8, roofline_us=39.2, compile_us=71.8)
    cards = states([pattern, gn])
    count_chains_once(cards)
    by_id = {c.card_id: c for c in cards}
    assert expected_gain(by_id["gn_silu"]) == pytest.approx(0.20 * (307.8 - 132.5) / 3787.0)
    assert next_card(cards, policy, 50).card_id == "gn"
    # Once our kernel beats torch.compile's, its own time is what is left to improve.
    by_id["gn_silu"].record(255.1, policy)
    assert expected_gain(by_id["gn_silu"]) == pytest.approx(0.20 * (255.1 - 132.5) / 3787.0)
    # The same chain as a module card serves eager: eager's time is its measure.
    module = CardState(dataclasses.replace(pattern, chain={**chain, "kind": "module"}), ["s0"])
    assert expected_gain(module) == pytest.approx(0.20 * (1 - 132.5 / 3787.0))


def test_a_channels_last_twin_is_weighed_against_torch_compiles_code_for_its_op():
    """A twin serves only inside compiled graphs: its eager time (PyTorch's copy to contiguous, the op, the
    outputs laid out again: 7,133 µs for the VAE's largest GroupNorm on the H200) is not its alternative there,
    Inductor's code for the op is (`compile_us`). Untried, it gives way to its original, which serves eager too."""
    policy = SchedulePolicy()
    orig = op("gn", "aten::native_group_norm", 6, 0.06, eager_us=3746.0, roofline_us=133.6, compile_us=300.0)
    twin = dataclasses.replace(orig, card_id="gn_cl", eager_us=7133.0, compile_us=310.0,
                               signature={**orig.signature, "twin_of": "gn"})
    cards = states([orig, twin])
    count_chains_once(cards)
    by_id = {c.card_id: c for c in cards}
    assert expected_gain(by_id["gn_cl"]) == pytest.approx(0.06 * (310.0 - 133.6) / 7133.0)
    assert expected_gain(by_id["gn"]) == pytest.approx(0.06 * (1 - 133.6 / 3746.0))
    assert next_card(cards, policy, 50).card_id == "gn"


def test_references_go_first_to_the_cards_that_serve_only_under_compile_and_take_a_quarter_of_the_wall():
    """The SD3.5 VAE's 360 s run spent 182 s on 27 cards' torch.compile references and searched 99 s (H100,
    2026-12-06). Under --wall-time they get a quarter of it (30 s at least); twins and pattern cards are timed
    first, since the planner weighs them by Inductor's time (`expected_gain`), then the rest by share."""
    from engine.run.plan import reference_budget, reference_order

    assert reference_budget(None, 900.0) == 900.0
    assert reference_budget(360.0, 900.0) == 90.0
    assert reference_budget(60.0, 900.0) == 30.0
    assert reference_budget(7200.0, 900.0) == 900.0
    chain = {"kind": "pattern", "members": ["gn", "silu"], "ops": ["native_group_norm", "silu"]}
    gn = op("gn", "aten::native_group_norm", 6, 0.20)
    small = op("small", "aten::native_group_norm", 6, 0.02)
    twin = dataclasses.replace(small, card_id="small_cl", signature={**small.signature, "twin_of": "small"})
    pattern = OperatorCard("gn_silu", CHAIN, {"op": CHAIN, "args": [], "aliases": []}, calls=5, share=0.10,
                           bytes=4096, chain=chain)
    module = OperatorCard("rms", CHAIN, {"op": CHAIN, "args": [], "aliases": []}, calls=5, share=0.30,
                          bytes=4096, chain={**chain, "kind": "module"})
    order = [c.card_id for c in reference_order(states([small, gn, twin, module, pattern]))]
    assert order == ["gn_silu", "small_cl", "rms", "gn", "small"]
