"""Unusual but legitimate user models (and a few that are not) through `kforge-tui capture` on the CPU: what
a user sees, a capture or one line with exit 2."""

import json
from pathlib import Path


def _config(tmp_path: Path, source: str, params: str = "") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "user_model.py").write_text("import torch\nfrom torch import nn\n\n" + source)
    path = tmp_path / "user_model.toml"
    path.write_text('name = "user_model"\nbuilder = "user_model.py:build"\n' + (f"[params]\n{params}\n" if params else ""))
    return path


def _capture(cli, tmp_path: Path, source: str, params: str = "") -> tuple[int, str, str]:
    return cli("capture", _config(tmp_path, source, params), "--device", "cpu", "--workspace", tmp_path / "ws")


META = '''
class Bump(nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1


def build(where):
    if where == "params":
        return nn.Linear(16, 16, device="meta"), (torch.randn(4, 16),)
    return Bump(), (torch.randn(4, 16, device="meta"),)
'''


def test_a_model_on_meta_is_one_line_naming_the_meta_device(cli, tmp_path):
    # Weights on 'meta' failed as a device mismatch in the warm-up; meta inputs ran the warm-up and then failed
    # in the captured forward as "likely a Kernel Forge bug".
    code, out, err = _capture(cli, tmp_path, META, 'where = "params"')
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "'weight' is on the 'meta' device" in err and "`device` the builder is passed" in err
    code, out, err = _capture(cli, tmp_path, META, 'where = "inputs"')
    assert code == 2 and err.count("\n") == 1
    assert "on the 'meta' device" in err and "example inputs are meta tensors" in err and "Kernel Forge bug" not in err
    assert not any((tmp_path / "ws" / "samples").glob("*"))


SPARSE = '''
class SparseIn(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 8))

    def forward(self, a, x):
        h = torch.sparse.mm(a, self.w)          # a sparse input
        d = (x.relu() * 2).to_sparse().to_dense()   # a sparse tensor made inside
        return (h.relu() * 2 + 1).sum() + d.sum()


def build():
    torch.manual_seed(0)
    return SparseIn(), (torch.randn(8, 16).relu().to_sparse(), torch.randn(4, 4))
'''


def test_a_model_with_sparse_tensors_captures_its_dense_calls(cli, tmp_path):
    # Before, the capture read a sparse tensor's data pointer, and the model "raised during its warm-up forward".
    code, out, err = cli("capture", _config(tmp_path, SPARSE), "--device", "cpu", "--json", "--workspace",
                         tmp_path / "ws")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["skipped"]["sparse"] >= 3   # sparse.mm, to_sparse, to_dense
    assert {"aten::relu", "aten::mul.Tensor", "aten::add.Tensor"} <= {c["op"] for c in doc["cards"]}
    assert not any("sparse" in json.dumps(c) for c in doc["cards"] + doc["chains"])


SCRIPTED = '''
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        return torch.relu(self.norm(self.lin(x))) * 2


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.jit.script(Block())

    def forward(self, x):
        return self.inner(x) + 1


def build(whole):
    torch.manual_seed(0)
    return (torch.jit.script(Block()) if whole else Outer()), (torch.randn(4, 16),)
'''


def test_a_torchscript_model_captures(cli, tmp_path):
    # Before: "internal error: RuntimeError: register_forward_pre_hook is not supported on ScriptModules" (exit 1).
    for whole in ("true", "false"):
        code, out, err = cli("capture", _config(tmp_path, SCRIPTED, f"whole = {whole}"), "--device", "cpu", "--json",
                             "--workspace", tmp_path / "ws")
        assert code == 0, err
        ops = {c["op"] for c in json.loads(out)["cards"]}
        assert {"aten::native_layer_norm", "aten::relu", "aten::addmm"} <= ops


COMPLEX = '''
class Rotate(nn.Module):
    def forward(self, c):
        return (c * 1j + (2 - 3j)).abs()


def build():
    return Rotate(), (torch.randn(4, dtype=torch.complex64),)
'''


def test_a_complex_scalar_reads_as_a_complex_number_in_the_card(cli, tmp_path):
    # Before, `c * 1j`'s card read "other=[0.0, 1.0]": a list of two floats, also in what a proposer is shown.
    code, out, err = cli("capture", _config(tmp_path, COMPLEX), "--device", "cpu", "--workspace", tmp_path / "ws")
    assert code == 0, err
    assert "c64[4], other=1j" in out and "other=(2-3j)" in out
    assert "[0.0, 1.0]" not in out


def test_a_forward_returning_none_is_noted_as_returning_none(cli, tmp_path):
    # Before: "the forward returns a NoneType with no tensor in it".
    source = "class Quiet(nn.Module):\n    def forward(self, x):\n        torch.relu(x)\n\n\ndef build():\n" \
             "    return Quiet(), (torch.randn(4),)\n"
    code, out, err = cli("capture", _config(tmp_path, source), "--device", "cpu", "--json", "--workspace", tmp_path / "ws")
    assert code == 0, err
    assert json.loads(out)["notes"]["model output"].startswith("the forward returns None: export's whole-model check")


INPLACE = '''
class Doubles(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        if self.mutate:
            x.mul_(2)        # changes the builder's example input, so each forward sees another
        return self.lin(x)


def build(mutate):
    torch.manual_seed(0)
    model = Doubles()
    model.mutate = mutate
    return model, (torch.randn(4, 16),)
'''


def test_a_forward_that_changes_its_own_inputs_is_noted_at_capture(cli, tmp_path):
    # Before, only export's whole-model check on a GPU, after a whole run, found the model unrepeatable.
    notes = {}
    for mutate in ("true", "false"):
        code, out, err = cli("capture", _config(tmp_path, INPLACE, f"mutate = {mutate}"), "--device", "cpu", "--json",
                             "--workspace", tmp_path / "ws")
        assert code == 0, err
        notes[mutate] = json.loads(out)["notes"].get("repeatable")
    assert notes["false"] is None
    assert "not repeatable" in notes["true"] and "in-place change of its inputs" in notes["true"]


QUANTIZED = '''
class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def build(static):
    torch.manual_seed(0)
    if not static:   # int8 weights, float activations
        return torch.ao.quantization.quantize_dynamic(Mlp().eval(), {nn.Linear}, dtype=torch.qint8), (torch.randn(4, 64),)
    model = nn.Sequential(torch.ao.quantization.QuantStub(), Mlp(), torch.ao.quantization.DeQuantStub()).eval()
    model.qconfig = torch.ao.quantization.get_default_qconfig("fbgemm")
    torch.ao.quantization.prepare(model, inplace=True)
    model(torch.randn(16, 64))
    torch.ao.quantization.convert(model, inplace=True)
    return model, (torch.randn(4, 64),)
'''


def test_a_quantized_model_makes_no_cards_of_packed_weights_or_quantized_tensors(cli, tmp_path):
    # Before, each quantized::linear call was a card whose signature read "W_prepack=<torch.ScriptObject object at
    # 0x55b06e9d1d00>": a new address at every call, so no two calls (nor two captures) shared a card; and a
    # quint8 relu was a card whose signature had no scale or zero point, which its values depend on.
    code, out, err = cli("capture", _config(tmp_path, QUANTIZED, "static = false"), "--device", "cpu", "--json",
                         "--workspace", tmp_path / "ws")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["skipped"]["packed"] == 2
    assert [c["op"] for c in doc["cards"]] == ["aten::relu"]
    assert "ScriptObject" not in out
    # the ReLU read as 100 % of the model's time, with no word on the linears that are almost all of it
    assert "2 calls take a packed weight" in doc["notes"]["quantized"] and "shares count" in doc["notes"]["quantized"]
    code, out, err = cli("capture", _config(tmp_path, QUANTIZED, "static = true"), "--device", "cpu", "--json",
                         "--workspace", tmp_path / "ws")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["skipped"]["packed"] == 2 and doc["skipped"]["quantized"] >= 2   # quantize_per_tensor, relu, dequantize
    assert not any("int8" in json.dumps(c) for c in doc["cards"] + doc["chains"])
    assert "ScriptObject" not in out and "another signature" not in out


def test_a_model_whose_output_is_degenerate_is_noted_at_capture(cli, tmp_path):
    # A batch of 0 (or a head that starts at zero) captured with no word; only export's whole-model check, after a
    # whole run on the GPU, said that eager's own output was empty and agreement with it said nothing.
    source = ("def build(batch, scale):\n    torch.manual_seed(0)\n    model = nn.Sequential(nn.Linear(16, 16), nn.GELU())\n"
              "    nn.init.constant_(model[0].weight, scale)\n    nn.init.zeros_(model[0].bias)\n"
              "    return model, (torch.randn(batch, 16),)\n")
    notes = {}
    for batch, scale in ((0, 0.1), (4, 0.0), (4, 0.1)):
        code, out, err = cli("capture", _config(tmp_path, source, f"batch = {batch}\nscale = {scale}"), "--device",
                             "cpu", "--json", "--workspace", tmp_path / "ws")
        assert code == 0, err
        notes[batch, scale] = json.loads(out)["notes"].get("model output")
    assert notes[0, 0.1].startswith("the model's output, of shape [0, 16], is empty (no elements): export's whole")
    assert notes[4, 0.0].startswith("the model's output, of shape [4, 16], is all zeros")
    assert notes[4, 0.1] is None


ENCODER = '''
class Encoder(nn.Module):
    def __init__(self, nested):
        super().__init__()
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=nested)

    def forward(self, x, pad):
        return self.enc(x, src_key_padding_mask=pad)


def build(nested):
    torch.manual_seed(0)
    pad = torch.zeros(2, 8, dtype=torch.bool)
    pad[1, 5:] = True
    return Encoder(nested).eval(), (torch.randn(2, 8, 32), pad)
'''


def test_a_transformer_encoder_with_a_padding_mask_captures(cli, tmp_path):
    # nn.TransformerEncoder makes a nested tensor of a padded batch in eval. Before: "the model raised during its
    # warm-up forward: RuntimeError: Internal error: NestedTensorImpl doesn't support sizes" (exit 2, blaming the
    # model), from the capture reading the nested tensor's shape.
    code, out, err = cli("capture", _config(tmp_path, ENCODER, "nested = true"), "--device", "cpu", "--json",
                         "--workspace", tmp_path / "ws")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["skipped"]["nested"] >= 10 and "enable_nested_tensor=False" in doc["notes"]["nested"]
    assert not any('"layout": "nested"' in json.dumps(c["signature"]) for c in doc["cards"] + doc["chains"])
    code, out, err = cli("capture", _config(tmp_path, ENCODER, "nested = false"), "--device", "cpu", "--json",
                         "--workspace", tmp_path / "ws")
    assert code == 0, err
    doc = json.loads(out)
    assert "nested" not in doc["skipped"] and "nested" not in doc["notes"]


def test_a_model_that_prints_leaves_capture_json_one_document(cli, tmp_path):
    # Before, `capture --json` of a model that prints (a builder's "loading", a debug print in forward) wrote those
    # lines on stdout ahead of the JSON document, which `json.loads` of the output then refused.
    source = ("class Chatty(nn.Module):\n    def forward(self, x):\n        print('steps', 3)\n        return x.relu() * 2\n"
              "\n\ndef build():\n    print('loading weights')\n    return Chatty(), (torch.randn(4, 8),)\n")
    code, out, err = cli("capture", _config(tmp_path, source), "--device", "cpu", "--json", "--workspace",
                         tmp_path / "ws")
    assert code == 0, err
    assert json.loads(out)["model"] == "user_model"
    assert "loading weights" in err and "steps 3" in err


RETURNS_AS_IS = '''
class Pair(nn.Module):
    def __init__(self, first):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.first = first

    def forward(self, x):
        y = torch.relu(self.lin(x))
        return {"input": (x, y), "weight": (self.lin.weight, y), "output": (y, x)}[self.first]


def build(first):
    torch.manual_seed(0)
    return Pair(first), {"x": torch.randn(4, 16)}
'''


def test_a_model_returning_its_input_first_is_noted_at_capture(cli, tmp_path):
    # A forward returning (x, y) had x compared by export's whole-model check, with no word at capture: the
    # cast cannot change x, so the check read perfect agreement whatever the cast did.
    notes = {}
    for first in ("input", "weight", "output"):
        code, out, err = cli("capture", _config(tmp_path, RETURNS_AS_IS, f'first = "{first}"'), "--device", "cpu",
                             "--json", "--workspace", tmp_path / "ws")
        assert code == 0, err
        notes[first] = json.loads(out)["notes"].get("model output")
    assert "is one of the builder's example inputs, returned as it is" in notes["input"]
    assert "is the model's 'lin.weight', returned as it is" in notes["weight"]
    assert notes["output"] is None


MASKED = '''
class Masked(nn.Module):
    def forward(self, x, idx):
        kept = x[x > 0]                      # shape depends on the values
        picked = x[idx]                      # shape of idx: a card
        return kept.sum() + picked.sum() + torch.nonzero(x).float().sum()


def build(_):
    torch.manual_seed(0)
    return Masked(), (torch.randn(8, 16), torch.tensor([0, 3, 5]))
'''


def test_calls_whose_output_shape_depends_on_their_values_are_not_cards(cli, tmp_path):
    # x[mask] and nonzero were cards: the lane allocates the captured output shape, every fresh input set asks for
    # another, and no candidate, eager's own included, could pass (found by the honest sweep).
    code, out, err = cli("capture", _config(tmp_path, MASKED, "_ = 0"), "--device", "cpu", "--json",
                         "--workspace", tmp_path / "ws")
    assert code == 0, err
    doc = json.loads(out)
    ops = {c["op"] for c in doc["cards"]}
    assert "aten::nonzero" not in ops and doc["skipped"]["data-dependent"] >= 2, (ops, doc["skipped"])
    assert [c for c in doc["cards"] if c["op"] == "aten::index.Tensor"], ops   # the integer index stays a card
    assert "nonzero" in doc["notes"]["data-dependent"]


RESIZED = '''
class Resized(nn.Module):
    def forward(self, x, y):
        a = torch.add(x, y, out=torch.empty(0))     # eager resizes the buffer: no kernel could
        b = torch.mul(x, y, out=torch.empty_like(x))  # a buffer of the result's shape: a card
        return a + b


def build(_):
    return Resized(), (torch.randn(8, 16), torch.randn(8, 16))
'''


def test_an_out_buffer_eager_must_resize_is_not_a_card(cli, tmp_path):
    # add(x, y, out=torch.empty(0)) was a card whose every candidate, eager's own call included, was rejected as
    # writing outside its buffers: a kernel writes the buffer it is given (found by the honest sweep).
    code, out, err = cli("capture", _config(tmp_path, RESIZED, "_ = 0"), "--device", "cpu", "--json",
                         "--workspace", tmp_path / "ws")
    assert code == 0, err
    doc = json.loads(out)
    ops = {c["op"] for c in doc["cards"]}
    assert "aten::add.out" not in ops and "aten::mul.out" in ops and doc["skipped"]["resized out="] >= 1, \
        (ops, doc["skipped"])
