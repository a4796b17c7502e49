"""SVG snapshots of every screen at 80×24 and 160×48, on the fixture store with a frozen clock.

pytest-textual-snapshot pins pytest < 9, so this is our own comparison: Textual's SVG export, stored
under tests/snapshots/. A missing snapshot is written and the test fails once (review, then commit it);
`KFORGE_UPDATE_SNAPSHOTS=1` rewrites them after an intended change.
"""

import os
from pathlib import Path

import pytest
from tui_fixture import T0, build_store
from tui_helpers import svg_text

from kforge_tui.app import KforgeApp

SNAPSHOTS = Path(__file__).parent / "snapshots"
SIZES = [(80, 24), (160, 48)]


async def _open(app, pilot, screen):
    ids = app._fixture_ids
    if screen == "cards":
        await pilot.press("c")
    elif screen == "tree":
        await pilot.press("c", "enter", "b")
    elif screen == "candidate":
        app.open_candidate(ids["failed"]["compile"])
    elif screen == "failures":
        await pilot.press("f")
    elif screen == "compare":
        await pilot.press("m")
    elif screen == "latency":
        await pilot.press("c", "l")
    await pilot.pause(0.2)


@pytest.fixture(scope="module")
def fixture_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("snap") / "ws" / "kforge.db"
    return db, build_store(db)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("screen", ["overview", "cards", "tree", "candidate", "failures", "compare", "latency"])
async def test_snapshot(fixture_db, screen, size, tmp_path):
    db, ids = fixture_db
    app = KforgeApp(db, ids["runs"][-1], refresh_s=0, clock=lambda: T0, compare_runs=ids["runs"])
    app._fixture_ids = ids
    app.animation_level = "none"  # tab underlines slide; a loaded machine would catch them mid-way
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.1)
        await _open(app, pilot, screen)
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.1)
        svg = app.export_screenshot()
    path = SNAPSHOTS / f"{screen}_{size[0]}x{size[1]}.svg"
    if os.environ.get("KFORGE_UPDATE_SNAPSHOTS") == "1" or not path.exists():
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(svg)
        pytest.fail(f"snapshot written: {path.name}; review it and rerun") if not os.environ.get(
            "KFORGE_UPDATE_SNAPSHOTS") else None
        return
    expected = path.read_text()
    if svg != expected:
        actual = tmp_path / path.name
        actual.write_text(svg)
        # Compare what a user sees first: a text diff is readable in the failure message.
        assert svg_text(svg) == svg_text(expected), f"{screen} at {size} changed; new render in {actual}"
        pytest.fail(f"{screen} at {size}: same text, different styling; new render in {actual}")
