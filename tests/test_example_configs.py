"""The example configs (configs/examples/, docs/examples.md) work as a user's would: each loads, and each
model family's builder builds at its [small] size and runs one forward on the CPU, giving an output the
whole-model check can compare (not all zeros, not NaN). `capture --small` and the dry run of each are
recorded in docs/examples.md (3.3–10.4 s per capture and 3.2–9.5 s per dry run on two cores); they are not repeated
here."""

import dataclasses
import json
import re
import subprocess
import sys

import pytest
import torch
from conftest import CONFIGS, ROOT

from engine.config import build_target, load_config
from engine.export.e2e import degenerate
from engine.models.forwards import output_tensor

EXAMPLES = sorted((CONFIGS / "examples").glob("*.toml"))
# name: the output's shape at [small] size (batch 1)
FAMILIES = {
    "vit_b16": (1, 1000),
    "convnext_tiny": (1, 1000),
    "whisper_encoder": (1, 100, 768),
    "deeplabv3": (1, 21, 64, 64),
}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_config_loads_at_both_sizes(path):
    full, small = load_config(path), load_config(path, small=True)
    assert full.name == path.stem and full.description
    assert small.small and set(small.params) == set(full.params)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_builds_small_and_runs_one_forward_on_the_cpu(name):
    config = load_config(CONFIGS / "examples" / f"{name}.toml", small=True)
    assert config.dtype_for("cpu") in (torch.float16, torch.bfloat16)  # the GPU's dtype, for a dry run's cards
    # Built as `capture --small` builds it, but in float32: CPU half-precision convolutions take seconds more.
    config = dataclasses.replace(config, dtypes={**config.dtypes, "cpu": "float32"})
    target = build_target(config, torch.device("cpu"))
    with torch.no_grad():
        out = output_tensor(target.forward())
    assert tuple(out.shape) == FAMILIES[name]
    assert degenerate(out) is None, f"{name}: the output is {degenerate(out)}; the whole-model check needs more"


def test_the_gpu_script_runs_every_family_example():
    script = (ROOT / "scripts" / "run_examples_gpu.sh").read_text()
    names = re.search(r"names=\$\{\*:-([^}]*)\}", script).group(1).split()
    assert sorted(names) == sorted(FAMILIES)


def test_the_gpu_scripts_summary_gives_the_exports_reason_when_no_cast_was_written(tmp_path):
    # ViT-B/16 on the H200: the export refused its kernels by measurement; the summary said only "no model check".
    script = (ROOT / "scripts" / "run_examples_gpu.sh").read_text()
    summary = script.split("<<'PY' | tee \"$out/summary.txt\"\n", 1)[1].split("\nPY\n", 1)[0]
    d = tmp_path / "vit_b16"
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"status": "done", "stopped_by": "wall_time", "evaluations": 15,
                                            "cards": [{"verified": 2}, {"verified": 0}]}))
    (d / "export.json").write_text("")
    (d / "export.log").write_text("error: export: vit_b16 is slower with the cast in eager forwards (0.947x); "
                                  "nothing written\n")
    r = subprocess.run([sys.executable, "-c", summary, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ("vit_b16: run done (wall_time), 2 cards, 15 evaluations, 1 cards with a verified "
                                "kernel; cast 0 variants, 0 left on PyTorch; no model check (export: vit_b16 is "
                                "slower with the cast in eager forwards (0.947x); nothing written)")
