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
                   "speedup_ci": [20.1, 20.6], "bandwidth_frac": 0.70, "status": "verified"},
                  {"intent": "cluster 2", "params": {}, "status": "rejected", "category": "incorrect"}]}
    text = probe.report(d)
    assert "clone of the main input: 68.30 µs" in text and "4 bytes (the protocol's floor): 5.10 µs" in text
    assert "| cluster 16 | 90.00 | 1836.00 | 20.40× (20.10–20.60) | 70 % | verified |" in text
    assert "| cluster 2 | – | – | – | – | rejected [incorrect] |" in text
