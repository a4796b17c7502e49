"""The example configs (configs/examples/, docs/examples.md) work as a user's would: each loads, and each
model family's builder builds at its [small] size and runs one forward on the CPU, giving an output the
whole-model check can compare (not all zeros, not NaN). `capture --small` and the dry run of each are
recorded in docs/examples.md; they take a minute each on two cores, so they are not repeated here."""

import dataclasses
import re

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
