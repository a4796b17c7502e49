"""Models named with overrides of their config's [params] (`NAME@key=value[,key=value]`) in the whole-model
scripts, and `config_model(..., params=...)` building them."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import CONFIGS, ROOT, load_script

from engine.config import (
    ModelSpec,
    config_model,
    load_config,
    override_params,
    parse_model_list,
    parse_model_spec,
)
from engine.errors import UsageError

MY_MODEL = CONFIGS / "examples" / "my_model.toml"


@pytest.mark.parametrize("text, expected", [
    ("gemma4_e2b", [("gemma4_e2b", {}, "gemma4_e2b")]),
    ("gemma4_e2b@full_depth=true", [("gemma4_e2b", {"full_depth": True}, "gemma4_e2b@full_depth=true")]),
    ("configs/models/qwen35_a3b.toml@full_depth=true,seq_len=512,experts_implementation=\"eager\"",
     [("configs/models/qwen35_a3b.toml", {"full_depth": True, "seq_len": 512, "experts_implementation": "eager"},
       'qwen35_a3b@full_depth=true,seq_len=512,experts_implementation="eager"')]),
    # A key=value after NAME@... is one more override; a plain name is the next model.
    ("resnet50,sd35_medium@full_depth=true,timestep=250.0,sd35_vae",
     [("resnet50", {}, "resnet50"),
      ("sd35_medium", {"full_depth": True, "timestep": 250.0}, "sd35_medium@full_depth=true,timestep=250.0"),
      ("sd35_vae", {}, "sd35_vae")]),
    ("a@x=false, y = -3,", [("a", {"x": False, "y": -3}, "a@x=false,y=-3")]),
])
def test_models_with_overrides_parse_to_toml_values(text, expected):
    specs = parse_model_list(text)
    assert [(s.name, dict(s.params), s.label) for s in specs] == expected
    for s in specs:  # a label's overrides read back as the same values
        assert dict(parse_model_spec(f"{s.name}@{s.overrides}").params if s.params else {}) == dict(s.params)


@pytest.mark.parametrize("text, needle", [
    ("gemma4_e2b@full_depth", "'full_depth' is not key=value"),
    ("gemma4_e2b@", "'' is not key=value"),
    ("@full_depth=true", "no model name before '@'"),
    ("gemma4_e2b@full_depth=True", "'True' is not a TOML value"),
    ("gemma4_e2b@full_depth=yes", "'yes' is not a TOML value"),
    ("qwen35_a3b@experts_implementation=eager", "quoted string"),
    ("gemma4_e2b@seq_len=[1]", "'[1]' is not a TOML value"),
    ("gemma4_e2b@seq_len={a=1}", "is not a TOML value"),
    ("gemma4_e2b@seq_len=1,seq_len=2", "'seq_len' is given twice"),
    ("gemma4_e2b,seq_len=64", "'seq_len=64' follows no NAME@"),
    ("gemma4_e2b@2x=1", "'2x=1' is not key=value"),
])
def test_a_malformed_model_is_a_one_line_usage_error_naming_it(text, needle):
    with pytest.raises(UsageError) as e:
        parse_model_list(text)
    msg = str(e.value)
    assert needle in msg and repr(text) in msg and "\n" not in msg


def test_overrides_reach_the_builder():
    module, forward = config_model(str(MY_MODEL), "cpu", params={"depth": 3, "batch": 1})
    assert len(module.blocks) == 3
    with torch.no_grad():
        assert forward().shape == (1, 64, 10)
    assert len(config_model(str(MY_MODEL), "cpu")[0].blocks) == 2  # the config's own depth


def test_an_override_the_builder_does_not_take_is_build_targets_error():
    config = load_config(MY_MODEL)
    with pytest.raises(UsageError) as e:
        override_params(config, {"dpth": 3})
    assert str(e.value) == f"{config.path}: key 'params.dpth': builder my_model.py:build takes no such argument"


def test_overrides_are_part_of_the_config_identity():
    config = load_config(MY_MODEL)
    assert override_params(config, {}) is config
    deeper = override_params(config, {"depth": 3})
    assert deeper.params["depth"] == 3 and deeper.params["width"] == config.params["width"]
    assert deeper.sha256 != config.sha256 and deeper.sha256 == override_params(config, {"depth": 3}).sha256


def _script(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv, needles", [
    (["scripts/bench_e2e.py", "--out", "{tmp}", "--models", "resnet50,gemma4_e2b@full_depth"],
     ["--models", "gemma4_e2b@full_depth"]),
    (["scripts/bench_e2e.py", "--out", "{tmp}", "--models", "gemma4_e2b@fulldepth=true"],
     ["--models", "params.fulldepth", "gemma4_e2b"]),
    (["scripts/bench_e2e.py", "--out", "{tmp}", "--models", "sd35_vae@full_depth=true"],
     ["sd35_vae takes no overrides"]),
    (["scripts/bench_compose.py", "--out", "{tmp}", "--model", "gemma4_e2b@full_depth=yes"],
     ["--model", "gemma4_e2b@full_depth=yes", "'yes' is not a TOML value"]),
    (["scripts/cast_profile.py", "--out", "{tmp}", "--cast", "x.cast", "--config", "gemma4_e2b@nokey=true"],
     ["--config", "params.nokey", "gemma4_e2b"]),
])
def test_whole_model_scripts_refuse_a_bad_model_with_exit_2_before_needing_a_gpu(tmp_path, argv, needles):
    p = _script(*(a.format(tmp=tmp_path) for a in argv))
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith("error: "), p.stderr
    assert all(n in p.stderr for n in needles), p.stderr


def test_bench_e2e_append_keeps_the_other_models_rows():
    bench = load_script("bench_e2e")
    shrunk, full = ModelSpec("configs/models/gemma4_e2b.toml"), ModelSpec("gemma4_e2b", {"full_depth": True})
    earlier = {"gpu": "G", "torch": "t", "host_cost": {"op": "x"},
               "models": [{"model": "gemma4_e2b"}, {"model": "gemma4_e2b@full_depth=true", "old": True}],
               "failures": {"resnet50": "boom", "gemma4_e2b@full_depth=true": "old failure"}}
    doc = bench.earlier_rows(earlier, {"gpu": "G", "torch": "t2", "models": []}, [full], ["auto"])
    # The full-depth row is measured again; the shrunk row, its host cost and other failures stay.
    assert doc["models"] == [{"model": "gemma4_e2b"}] and doc["failures"] == {"resnet50": "boom"}
    assert doc["host_cost"] == {"op": "x"} and doc["torch"] == "t2"
    assert bench.row_label(shrunk, "cpp", ["python", "cpp"]) == "gemma4_e2b [cpp router]"
    with pytest.raises(UsageError, match="measured on 'G'"):
        bench.earlier_rows(earlier, {"gpu": "other", "models": []}, [full], ["auto"])


def test_bench_e2e_says_what_the_host_did_while_the_eager_pair_was_timed():
    bench = load_script("bench_e2e")
    row = {"model": "vit_b16", "eager_ms": 5.43, "cast_ms": 3.77, "speedup": 1.441, "speedup_ci": [1.417, 1.479],
           "rel_l2_err": 0.0, "variants_hit": 1, "variants": 4, "near_misses": {}, "restored_bit_exact": True,
           "hits": {}, "misses": {},
           "host_load": {"seconds": 2.0, "cores": 16, "other_cores": 3.2, "steal_cores": 0.0, "own_cores": 1.0,
                         "launch_us_before": 9.0, "launch_us_after": 9.5},
           "settled": {"seconds": 4.1, "calls": 900, "first_ms": 5.3, "last_ms": 3.52, "settled": True}}
    text = bench.markdown({"gpu": "G", "torch": "t", "models": [row, dict(row, model="quiet", host_load={
        **row["host_load"], "other_cores": 0.05})]})
    assert ("- vit_b16: other processes 3.20 cores, steal 0.00, this process 1.00 (of 16) over 2.0 s; 9.00 → 9.50 µs "
            "to issue a tiny kernel. **Busy**: other processes used 3.2 of 16 cores; eager settled first: 900 forwards "
            "over 4.1 s, 5.30 → 3.52 ms a forward") in text
    assert "- quiet: other processes 0.05 cores" in text and text.count("**Busy**") == 1
