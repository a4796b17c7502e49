"""A second sweep of user models through `kforge-tui capture` on the CPU: what a user sees."""

import json
from pathlib import Path

from test_user_model_sweep import _config


def _capture_json(cli, tmp_path: Path, source: str, params: str = "") -> dict:
    code, out, err = cli("capture", _config(tmp_path, source, params), "--device", "cpu", "--json", "--workspace",
                         tmp_path / "ws")
    assert code == 0, err
    return json.loads(out)


HIGHER_ORDER = '''
class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        if LOOP == "scan":
            from torch._higher_order_ops.scan import scan

            def step(h, xt):
                h = torch.tanh(self.a(xt) + h)
                return h, h * 2
            return scan(step, torch.zeros(x.shape[1]), x)[1]
        if LOOP:
            _, y = torch._higher_order_ops.while_loop(
                lambda i, v: i < 3, lambda i, v: (i + 1, torch.tanh(self.a(v))), (torch.tensor(0), x))
        else:
            y = torch.cond(x.sum() > 0, lambda v: self.a(v).relu(), lambda v: self.b(v).tanh(), (x,))
        return y * 2


def build(loop):
    global LOOP
    LOOP = loop
    torch.manual_seed(0)
    return Gate().eval(), (torch.randn(4, 8).abs(),)
'''


def test_torch_cond_and_while_loop_capture_the_calls_eager_makes(cli, tmp_path):
    # Before, every capture mode refused the higher-order operator and the capture said "the model raised
    # during its warm-up forward: NotImplementedError: There was no rule registered for HigherOrderOperator
    # cond and mode <engine.capture.chain_cards.MemberTrace object at 0x...>".
    doc = _capture_json(cli, tmp_path / "cond", HIGHER_ORDER, "loop = false")
    calls = {c["op"]: c["calls"] for c in doc["cards"]}
    # the branch these inputs take (x.sum() > 0): the Linear as eager runs it, addmm, never a composite
    # aten::linear card no kernel could serve; the other branch's tanh is not run
    assert calls.get("aten::addmm") == 1 and "aten::relu" in calls and "aten::mul.Tensor" in calls
    assert "aten::linear" not in calls and "aten::tanh" not in calls
    doc = _capture_json(cli, tmp_path / "loop", HIGHER_ORDER, "loop = true")
    calls = {c["op"]: c["calls"] for c in doc["cards"]}
    assert calls.get("aten::addmm") == 3 and calls.get("aten::tanh") == 3 and "aten::linear" not in calls


def test_a_scan_captures_its_steps(cli, tmp_path):
    # scan's eager kernel refuses to run under a dispatch mode: the capture said "the model raised during its
    # warm-up forward: AssertionError: Mode should never be enabled for CPU/CUDA key"
    doc = _capture_json(cli, tmp_path, HIGHER_ORDER, 'loop = "scan"')
    calls = {c["op"]: c["calls"] for c in doc["cards"]}
    assert calls.get("aten::tanh") == 4 and calls.get("aten::addmm") == 4 and "aten::linear" not in calls


HARDCODED_CUDA = '''
class Biased(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x) + torch.zeros(8, device="cuda")


def build():
    return Biased().eval(), (torch.randn(4, 8),)
'''


def test_a_forward_with_cuda_written_in_it_says_so_on_a_cpu_capture(cli, tmp_path):
    # Before: "the model raised during its warm-up forward: RuntimeError: Found no NVIDIA driver on your system
    # ...; fix the model or its [params]", which names neither the device nor the fix.
    code, out, err = cli("capture", _config(tmp_path, HARDCODED_CUDA), "--device", "cpu", "--workspace",
                         tmp_path / "ws")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "user_model.toml: the model's warm-up forward asks for CUDA while it runs on cpu" in err
    assert '(device="cuda", .cuda())' in err and "x.device" in err and "--device cuda" in err
