"""Chain cards in the TUI: named by their member ops (`chain: _to_copy → pow → …`) with the dispatch that
serves them (a module card's class and paths, eager; a pattern card under torch.compile), in the cards
table and the card's own view, instead of `kforge::chain` and a signature of `in0..inN`."""

from __future__ import annotations

import json
import sqlite3

import pytest
from tui_fixture import T0, build_store
from tui_helpers import screen_text

from kforge_tui.app import KforgeApp

RMS_OPS = ["_to_copy", "pow", "mean", "add", "rsqrt", "mul", "_to_copy", "mul"]
LABEL = "chain: _to_copy → pow → mean → add → rsqrt → mul → _to_copy → mul"
MODULE = "module card: LlamaRMSNorm at model.layers.0.input_layernorm and 27 more, eager (cast.enabled)"
PATTERN = "pattern card: under torch.compile (cast.compile)"


@pytest.fixture
def store(tmp_path):
    """The fixture store plus two chain cards, the largest shares of the capture: a module card (an
    RMSNorm module in 28 layers) and a pattern card (the residual add before it)."""
    db = tmp_path / "ws" / "kforge.db"
    ids = build_store(db)
    paths = [f"model.layers.{i}.input_layernorm" for i in range(28)]
    rows = [("chain-module0", {"kind": "module", "module_class": "LlamaRMSNorm", "modules": paths,
                               "members": [], "ops": RMS_OPS},
             f"chain[{' '.join(RMS_OPS)}] in0 bf16[2,8,1536] in1 bf16[1536]", 0.9),
            ("chain-pattern", {"kind": "pattern", "module_class": "LlamaDecoderLayer", "modules": [],
                               "members": [], "ops": ["add", *RMS_OPS]},
             f"chain[add {' '.join(RMS_OPS)}] in0 bf16[2,8,1536] in1 bf16[2,8,1536] in2 bf16[1536]", 0.8)]
    with sqlite3.connect(db) as conn:
        for cid, chain, text, share in rows:
            conn.execute("INSERT INTO cards (capture_id, card_id, op, signature, signature_text, calls, share, bytes,"
                         " eager_us, roofline_us, chain) VALUES ('cap-fixture', ?, 'kforge::chain', '{}', ?, 28, ?,"
                         " 65536, 9.0, 2.0, ?)", (cid, text, share, json.dumps(chain)))
    return db, ids


async def settle(pilot, *keys):
    for k in keys:
        await pilot.press(k)
        await pilot.pause(0.05)
    for _ in range(4):
        await pilot.pause(0.05)


async def test_the_cards_table_names_chain_cards_by_their_ops_and_dispatch(store):
    db, ids = store
    app = KforgeApp(db, ids["runs"][-1], refresh_s=0, clock=lambda: T0)
    async with app.run_test(size=(200, 40)) as pilot:
        await settle(pilot, "c")
        text = screen_text(app)
        assert "kforge::chain" not in text
        rows = [line for line in text.splitlines() if "chain:" in line]
        assert len(rows) == 2, text
        module_row, pattern_row = rows  # by share
        assert "chain: _to_copy → pow → mean → add → rsqrt …" in module_row  # cut; the card view has it all
        assert "module card: LlamaRMSNorm at model.layers.0.inp" in module_row
        assert "chain: add → _to_copy → pow → mean → add → …" in pattern_row
        assert "pattern card: under torch.compile (cast.compile" in pattern_row
        assert "a chain card's share is also in its ops' cards" in text   # why the shares sum past 100 %
        await settle(pilot, "slash", *"torch.compile", "enter")  # the filter finds a card by its dispatch
        assert [line for line in screen_text(app).splitlines() if "chain:" in line] == [pattern_row]


async def test_a_chain_cards_own_view_shows_all_its_ops_and_which_dispatch_serves_it(store):
    db, ids = store
    app = KforgeApp(db, ids["runs"][-1], refresh_s=0, clock=lambda: T0)
    async with app.run_test(size=(200, 40)) as pilot:
        await settle(pilot, "c", "enter")  # the top card by share: the module card's search tree
        assert type(app.screen).__name__ == "TreeScreen"
        text = screen_text(app)
        assert LABEL in text and MODULE in text and "in0 bf16[2,8,1536] in1 bf16[1536]" in text
        assert "kforge::chain" not in text
        await settle(pilot, "escape", "down", "enter")
        text = screen_text(app)
        assert f"chain: add → {LABEL.removeprefix('chain: ')}" in text and PATTERN in text


async def test_a_chain_card_is_named_by_its_ops_on_the_overview_the_failures_and_compare(store):
    # Outside the cards table and the card's view a chain card read `kforge::chain`: the overview's best so far,
    # the failures list and compare (found driving the TUI over an unseen model's workspace).
    db, ids = store
    run = ids["runs"][-1]
    with sqlite3.connect(db) as conn:
        for n, (status, category, speedup) in enumerate([("verified", None, 99.0), ("rejected", "mismatch", None)]):
            conn.execute("INSERT INTO candidates (id, run_id, card_id, source, source_hash, proposer, status, category,"
                         " error, best_us, speedup, eager_us, created_at, updated_at) VALUES (?, ?, 'chain-module0',"
                         " 'src', ?, 'builtin', ?, ?, ?, ?, ?, 9.0, ?, ?)",
                         (f"cand-chain-{n}", run, f"h{n}", status, category,
                          "mismatch: 12 of 4096 elements differ" if category else None,
                          4.5 if speedup else None, speedup, T0 - 10 + n, T0 - 10 + n))
    app = KforgeApp(db, run, refresh_s=0, clock=lambda: T0)
    async with app.run_test(size=(200, 50)) as pilot:
        await settle(pilot)
        for keys in ((), ("f",), ("m",)):
            await settle(pilot, *keys)
            text = screen_text(app)
            assert "kforge::chain" not in text, (keys, text)
            assert "chain: _to_copy → pow" in text, (keys, text)
            await settle(pilot, "escape")
