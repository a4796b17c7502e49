"""scripts/run_table.py says why each card that was not searched was not: skipped before the search (by
reason) or still waiting its turn when the run stopped. The H200 VAE run of 2026-12-02 left 7 group_norm
cards with templates waiting when its wall time ran out; the table said 'no builtin template, or below the
noise floor' of them."""

from conftest import load_script


def test_unsearched_cards_are_counted_by_why():
    rt = load_script("run_table")
    cards = {c: {} for c in ("a", "b", "c", "d", "e", "f")}
    searched = {"a": []}
    skipped = {"b": "not-selected", "c": "not-selected", "d": "declined", "e": "noise"}
    assert rt._unsearched(cards, searched, skipped, "wall_time") == (
        "the rest: 2 not selected by --ops, 1 no template (declined), 1 below the noise floor, "
        "1 still waiting when the run stopped (wall_time)")
    assert rt._unsearched({"a": {}}, searched, {}, "iterations") == "every card"
