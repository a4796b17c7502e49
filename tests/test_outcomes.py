"""One outcome vocabulary: the store, the TUI and the reports allow and show exactly engine.outcomes'
values, and 'faster with confidence' is one decision."""

import math
import re
import sqlite3

import pytest
from conftest import load_script
from tui_fixture import FAIL_CATEGORIES, create_schema

from engine import outcomes
from engine.outcomes import faster_with_confidence, slower_with_confidence


def _check_values(table: str, column: str) -> tuple[str, ...]:
    """The values a CHECK (column IN (...)) of the migrated schema allows."""
    conn = sqlite3.connect(":memory:")
    create_schema(conn)
    ddl = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()[0]
    conn.close()
    found = re.search(rf"CHECK \({column} IN \(([^)]*)\)\)", ddl)
    assert found, f"{table}.{column} has no CHECK"
    return tuple(v.strip().strip("'") for v in found.group(1).split(","))


def test_the_schema_allows_exactly_the_outcome_values():
    assert _check_values("runs", "status") == outcomes.RUN_STATUSES
    assert _check_values("controls", "command") == outcomes.CONTROL_COMMANDS


async def test_the_store_accepts_every_run_status_and_control_and_refuses_others(tmp_path):
    from engine.store import Store

    async with await Store.open(tmp_path / "kforge.db") as store:
        await store.save_capture({"id": "cap-1", "model": "m", "device": "cpu", "dtype": "float32"}, [], [])
        run = (await store.create_run("cap-1", "m", "builtin"))["id"]
        for status in outcomes.RUN_STATUSES:
            await store.update_run(run, status=status)
        for command in outcomes.CONTROL_COMMANDS:
            await store.add_control(run, command)
        with pytest.raises(ValueError, match="status must be one of"):
            await store.update_run(run, status="exploded")
        with pytest.raises(ValueError, match="command must be one of"):
            await store.add_control(run, "explode")


def test_the_tui_knows_every_candidate_status_and_only_those():
    from kforge_tui import format as fmt

    assert set(fmt.STATUS_GLYPH) == set(fmt.STATUS_STYLE) == set(outcomes.CANDIDATE_STATUSES)
    assert outcomes.IN_FLIGHT | outcomes.FINISHED == set(outcomes.CANDIDATE_STATUSES)
    assert not outcomes.IN_FLIGHT & outcomes.FINISHED


def test_every_category_a_list_names_is_an_outcome_category():
    from engine.propose.answer import UNUSABLE
    from engine.propose.prompting import CATEGORY_MEANING
    from engine.propose.repair import REPAIRABLE, RETRY_SAME
    from engine.run.report import UNCOMPILED

    known = set(outcomes.FAILURE_CATEGORIES)
    assert set(UNUSABLE) | {"provider"} == set(outcomes.PROPOSAL_FAILURES)
    for name, values in [("prompting.CATEGORY_MEANING", CATEGORY_MEANING), ("repair.REPAIRABLE", REPAIRABLE),
                         ("repair.RETRY_SAME", RETRY_SAME), ("run.report.UNCOMPILED", UNCOMPILED),
                         ("tests/tui_fixture", FAIL_CATEGORIES),
                         ("make_demo_db", load_script("make_demo_db").StandInLane.FAILURES)]:
        assert set(values) <= known, (name, set(values) - known)
    assert outcomes.NUMERIC_REJECTIONS <= set(outcomes.REJECTION_CATEGORIES)
    assert outcomes.CARD_SKIP_REASONS <= set(outcomes.CARD_DONE_REASONS)


def test_every_category_has_a_one_line_description():
    for name, text in outcomes.FAILURE_CATEGORIES.items():
        assert text and "\n" not in text and len(text) <= 100, name
        assert outcomes.describe_failure(name) == text
    assert "not one this version knows" in outcomes.describe_failure("gremlins")
    assert outcomes.describe_failure(None) == outcomes.describe_failure("unknown") == "rejected without a category"


@pytest.mark.parametrize("ci, faster, slower", [
    ((1.02, 1.10), True, False),
    ((1.00, 1.10), False, False),      # a lower bound of exactly 1 is not faster
    ((0.97, 1.03), False, False),
    ((0.80, 0.99), False, True),
    ((0.90, 1.00), False, False),      # an upper bound of exactly 1 is not slower
    ((1.2, math.inf), True, False),    # the lower bound decides 'faster'
    ((math.nan, math.nan), False, False),
    ((None, None), False, False),
    (None, False, False),
    ([1.5], False, False),
])
def test_faster_and_slower_with_confidence(ci, faster, slower):
    assert faster_with_confidence(ci) is faster
    assert slower_with_confidence(ci) is slower


def test_export_keeps_only_cards_faster_with_confidence():
    from engine.export.package import select_winners

    cards = [{"card_id": c, "op": "aten::gelu"} for c in ("a", "b")]
    cands = [{"card_id": "a", "status": "verified", "best_us": 5.0, "speedup_low": 1.0, "speedup_high": 1.4},
             {"card_id": "a", "status": "verified", "best_us": 6.0, "speedup_low": 1.01, "speedup_high": 1.2},
             {"card_id": "b", "status": "verified", "best_us": 4.0, "speedup_low": 0.9, "speedup_high": 1.5}]
    chosen, excluded = select_winners(cards, cands)
    assert [(card["card_id"], c["best_us"]) for card, c in chosen] == [("a", 6.0)]
    assert [e["card_id"] for e in excluded] == ["b"] and "faster with confidence" in excluded[0]["reason"]
