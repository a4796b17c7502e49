"""engine/bench/chart.py: the SVG a reader looks at instead of a table."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from engine.bench.chart import PALETTE, Bar, bars_svg

NS = "{http://www.w3.org/2000/svg}"


def _svg(groups, **kw):
    return ET.fromstring(bars_svg(groups, title=kw.pop("title", "t"), axis=kw.pop("axis", "x"), **kw))


def test_each_bar_is_drawn_to_scale_with_its_colour_kept_across_groups():
    root = _svg([("resnet50", [Bar("eager + cast", 1.2, (1.1, 1.3)), Bar("torch.compile", 2.4)]),
                 ("vae", [Bar("torch.compile", 2.4), Bar("torch.compile + cast", 3.1)])])
    bars = [r for r in root.iter(f"{NS}rect") if r.get("class") == "bar"]
    assert [b.get("data-label") for b in bars] == ["eager + cast", "torch.compile", "torch.compile",
                                                   "torch.compile + cast"]
    widths = [float(b.get("width")) for b in bars]
    assert widths[1] == pytest.approx(2 * widths[0], rel=0.01) and widths[1] == widths[2]
    # a label and its "+ cast" share a hue, light and dark; a label alone in its family is dark
    assert bars[1].get("fill") == bars[2].get("fill") == PALETTE[1][0] and bars[3].get("fill") == PALETTE[1][1]
    assert bars[0].get("fill") == PALETTE[0][1]
    texts = [t.text for t in root.iter(f"{NS}text")]
    assert "resnet50" in texts and "vae" in texts and "3.10×" in texts and "1.20×" in texts


def test_only_a_bar_with_an_interval_gets_a_whisker_and_the_reference_line_sits_at_one():
    root = _svg([("m", [Bar("a", 1.5, (1.4, 1.6)), Bar("b", 0.8)])], reference_label="eager")
    assert len([p for p in root.iter(f"{NS}path") if p.get("class") == "ci"]) == 1
    ref = next(ln for ln in root.iter(f"{NS}line") if ln.get("class") == "reference")
    bar = next(r for r in root.iter(f"{NS}rect") if r.get("data-label") == "a")
    left, w = float(bar.get("x")), float(bar.get("width"))
    assert float(ref.get("x1")) - left == pytest.approx(w / 1.5, rel=0.01)  # 1.0 is two thirds of a 1.5 bar
    assert "eager" in [t.text for t in root.iter(f"{NS}text")]


def test_names_are_escaped_and_an_empty_chart_is_refused():
    root = _svg([("a<b & c", [Bar("x > y", 1.0)])], title="<t>")
    assert "a<b & c" in [t.text for t in root.iter(f"{NS}text")]
    with pytest.raises(ValueError, match="nothing to draw"):
        bars_svg([("m", [])], title="t", axis="x")
