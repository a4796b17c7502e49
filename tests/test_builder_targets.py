"""What a user's builder hands over and how the tool takes it: eval mode, and which output tensor is compared."""

import dataclasses
from pathlib import Path

import pytest
import torch
from card_helpers import capture_source

from engine.capture.run import capture_model
from engine.config import build_target, load_config
from engine.models.forwards import output_tensor

MODEL = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, returns):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.returns = returns

    def forward(self, x):
        y = self.drop(self.bn(torch.relu(self.lin(x))))
        return {"tensor": y, "none_first": (None, y), "numbers": (None, 3.0, "s")}[self.returns]


def build(returns="tensor", train=False):
    torch.manual_seed(0)
    net = Net(returns)
    return (net.train() if train else net.eval()), (torch.randn(4, 8),)
'''


def _config(tmp_path: Path, params: str = "") -> Path:
    (tmp_path / "net.py").write_text(MODEL)
    path = tmp_path / "net.toml"
    path.write_text(f'name = "net"\nbuilder = "net.py:build"\n[params]\n{params}\n'
                    '[dtype]\ncpu = "float32"\ncuda = "float32"\n[capture]\nsamples = 1\n')
    return path


def test_a_model_left_in_training_mode_runs_in_eval_mode_and_is_told(tmp_path):
    # Capture used to switch it to eval silently while export's whole-model check ran it in training mode:
    # dropout noise was reported as the cast's output agreement.
    target = build_target(load_config(_config(tmp_path, "train = true")), torch.device("cpu"))
    assert not any(m.training for m in target.module.modules())
    assert "training mode" in target.notes["eval mode"] and "dropout off" in target.notes["eval mode"]
    with torch.no_grad():
        assert torch.equal(target.forward(), target.forward())   # no dropout: the same output twice
    quiet = build_target(load_config(_config(tmp_path)), torch.device("cpu"))
    assert "eval mode" not in quiet.notes


QUANTIZED_IN_EVAL = """
import torch
from torch import nn


def build():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    model = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    return model, (torch.randn(2, 4),)
"""


def test_the_eval_mode_note_names_a_submodule_as_a_module(tmp_path):
    # A model put in eval mode before torch.ao's quantize_dynamic, whose new Linear is in training mode, read
    # "the builder returned 0 and 1 more module(s) in training mode": '0' was that module's name, bare.
    (tmp_path / "net.py").write_text(QUANTIZED_IN_EVAL)
    path = tmp_path / "net.toml"
    path.write_text('name = "net"\nbuilder = "net.py:build"\n')
    note = build_target(load_config(path), torch.device("cpu")).notes["eval mode"]
    assert note.startswith("the builder returned module '0' and 1 more module(s) in training mode"), note


COMPILED = """
import torch
from torch import nn


def build(how):
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.GELU())).eval()
    if how == "submodule":
        model[1] = torch.compile(model[1])
    elif how == "in place":
        model[1].compile()
    elif how == "whole":
        model = torch.compile(model)
    return model, (torch.randn(2, 4),)
"""


def test_a_model_compiled_by_torch_compile_is_told_a_cast_does_not_reach_it(tmp_path):
    # Before, a builder returning a model with a torch.compile'd submodule captured its ops as eager runs them, with
    # no word that in the model Inductor's code runs there and a cast's kernels are not called.
    (tmp_path / "net.py").write_text(COMPILED)
    path = tmp_path / "net.toml"
    notes = {}
    for how in ("submodule", "in place", "whole", "none"):
        path.write_text(f'name = "net"\nbuilder = "net.py:build"\n[params]\nhow = "{how}"\n')
        notes[how] = build_target(load_config(path), torch.device("cpu")).notes.get("torch.compile")
    assert notes["submodule"].startswith("module '1' is compiled by torch.compile")
    assert notes["in place"].startswith("module '1' is compiled by torch.compile")
    assert notes["whole"].startswith("the model is compiled by torch.compile")
    assert "a cast's kernels do not reach" in notes["whole"] and "cast.compile(model)" in notes["whole"]
    assert notes["none"] is None


def test_output_tensor_is_the_first_tensor_depth_first():
    t = torch.ones(2)
    assert output_tensor((None, t)) is t
    assert output_tensor({"loss": None, "rest": [1.0, ("x", t)]}) is t
    assert output_tensor([[], t]) is t
    with pytest.raises(TypeError, match="no output tensor in a tuple"):
        output_tensor((None, 3.0, "s"))


def test_output_tensor_looks_into_a_dataclass_output():
    # A forward returning its own @dataclass record: the capture said "no tensor in it" and the whole-model
    # check had nothing to compare.
    @dataclasses.dataclass
    class Out:
        loss: object = None
        logits: torch.Tensor | None = None

    t = torch.ones(2)
    assert output_tensor(Out(None, t)) is t
    assert output_tensor((Out(), [t])) is t


@pytest.mark.parametrize("returns, note", [("none_first", False), ("numbers", True)])
def test_capture_says_when_the_output_holds_nothing_to_compare(tmp_path, returns, note):
    ws = tmp_path / "ws"
    ws.mkdir()
    result = capture_model(load_config(_config(tmp_path, f'returns = "{returns}"')), torch.device("cpu"), ws)
    assert ("model output" in result.notes) == note
    if note:
        assert "no tensor in it" in result.notes["model output"] and "whole-model check" in result.notes["model output"]


def test_the_capture_says_the_dtype_the_builder_made_not_the_one_the_config_asked(tmp_path):
    # A builder that takes no dtype argument builds float32; the header said "(bfloat16)" over float32 cards.
    result = capture_source(tmp_path, "net", MODEL, dtype="bfloat16")
    assert result.dtype == "float32"
    assert "asks bfloat16" in result.notes["dtype"] and "`dtype` argument" in result.notes["dtype"]
