"""CPU tests of scripts/probe_template_params.py: the instance list a user's --sweep/--extra make, its
report, and a one-line error (exit 2) on malformed arguments. The GPU run itself is in
docs/results/reproduce-h200/builtin/."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, load_script

probe = load_script("probe_template_params")


def test_sweep_is_the_product_over_keys_then_each_extra_without_duplicates():
    default = {"strategy": "split", "block": 512, "stash": "all"}
    sweep = probe.parse_sweep(["strategy=cluster,split", "block=512,1024"])
    assert sweep == {"strategy": ["cluster", "split"], "block": [512, 1024]}
    got = probe.instances(default, sweep, [{"block": 512}, {"stash": "none"}])
    assert got == [
        {"strategy": "cluster", "block": 512, "stash": "all"},
        {"strategy": "cluster", "block": 1024, "stash": "all"},
        {"strategy": "split", "block": 512, "stash": "all"},
        {"strategy": "split", "block": 1024, "stash": "all"},
        {"strategy": "split", "block": 512, "stash": "none"},  # {"block": 512} is the default: already there
    ]
    assert probe.instances(default, {}, []) == [default]


@pytest.mark.parametrize("bad", ["block", "block=", "=1,2"])
def test_malformed_sweep_items_are_refused(bad):
    with pytest.raises(ValueError, match="KEY=V1,V2"):
        probe.parse_sweep([bad])


def test_cli_exits_2_with_one_line_on_bad_arguments(tmp_path):
    for extra in (["--sweep", "nokey"], ["--extra", "[1, 2]"], ["--extra", "{not json"]):
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "probe_template_params.py"), "--out",
                               str(tmp_path), "--case", "softmax", *extra], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr


def test_report_lists_fastest_first_with_floors_and_failures():
    d = {"case": "group_norm fp16 [1,256,512,512] g32 (SD3.5 VAE)", "template": "group_norm", "gpu": "H200",
         "torch": "2.11", "target": "≥ 8× eager", "clone_us": 68.3, "floor_us": 5.1,
         "rows": [{"intent": "cluster 16", "us": 90.0, "eager_us": 1836.0, "speedup": 20.4,
                   "speedup_ci": [20.1, 20.6], "copy_frac": 0.70, "status": "verified"},
                  {"intent": "cluster 4", "us": 95.0, "eager_us": 1836.0, "speedup": 19.3,
                   "speedup_ci": [19.1, 19.5], "copy_frac": None, "status": "verified"},
                  {"intent": "cluster 2", "params": {}, "status": "rejected", "category": "incorrect"}]}
    text = probe.report(d)
    assert "clone of the main input: 68.30 µs" in text and "4 bytes (the protocol's floor): 5.10 µs" in text
    assert "| cluster 16 | 90.00 | 1836.00 | 20.40× (20.10–20.60) | 70 % | verified |" in text
    assert "| cluster 4 | 95.00 | 1836.00 | 19.30× (19.10–19.50) | – | verified |" in text  # no clone timed
    assert "| cluster 2 | – | – | – | – | rejected [incorrect] |" in text


def test_an_instance_is_rated_against_the_lanes_own_copy_not_a_fixed_bandwidth():
    """The H100's lane cloned the VAE's largest input (536,870,912 bytes moved) in 180.99 µs; the channels-last
    group norm moving 536,871,552 bytes in 323.20 µs read 39 % of the H200's copy figure there, and is 56 % of
    that GPU's own copy (2026-12-06g). Nothing timed: no fraction."""
    assert probe.copy_frac(536_871_552, 323.20, 536_870_912, 180.99) == pytest.approx(0.560, abs=0.001)
    assert probe.copy_frac(536_871_552, 323.20, 536_870_912, None) is None


def test_twin_ref_is_the_cards_channels_last_twin_on_the_same_samples(tmp_path):
    """--twin: the VAE's group norm card as torch.compile or a layout route hands it over (channels-last input),
    on the captured card's own sample files; a card without a twin exits with one line."""
    import torch
    import torch.nn.functional as F
    from card_helpers import cudaify

    from engine.capture.single import capture_card
    from engine.cards import OperatorCard
    from engine.propose.builtin import BuiltinProposer

    x, w, b = torch.randn(1, 16, 6, 6), torch.randn(16), torch.randn(16)
    ref = capture_card(tmp_path / "gn", lambda: F.group_norm(x, 4, w, b, 1e-6), samples=1)
    twin = probe.twin_ref(ref)
    assert twin.op == ref.op and twin.samples == ref.samples and twin.card_id != ref.card_id
    assert twin.signature["args"][0]["stride"] == [576, 1, 96, 16] and twin.signature["twin_of"] == ref.card_id
    brief = OperatorCard(twin.card_id, twin.op, cudaify(twin.signature), "",   # as a GPU capture has it
                         [{**o, "device": "cuda"} for o in twin.outputs])
    assert BuiltinProposer().template_for(brief)[0].name == "group_norm_cl"
    relu = capture_card(tmp_path / "relu", lambda: torch.relu(x), samples=1)
    with pytest.raises(SystemExit, match="^error: --twin: .* has no channels-last twin"):
        probe.twin_ref(relu)


def test_a_case_bench_builtin_has_too_is_listed_once():
    """--case "VAE, largest" matched bench_builtin's card and the probe's own extra one of the same label:
    exit 2 instead of a probe."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_builtin import _cases

    labels = [c.label for c in probe.all_cases(_cases())]
    assert len(labels) == len(set(labels))
    assert sum("VAE, largest" in label for label in labels) == 1
