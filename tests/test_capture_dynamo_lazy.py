"""The capture's dispatch modes load no Dynamo of their own (engine/capture/dispatch_mode.py): PyTorch's wrapping of
a mode's `__torch_dispatch__` imported torch._dynamo on the first captured call, 2.5-3 s of CPU in every capture
process. A model that compiles, or calls torch.cond (Dynamo traces its branches with the mode active), captures as before,
Dynamo loaded before the capture or during it."""

import subprocess
import sys

from conftest import ROOT

PROBE = r'''
import pathlib, sys, tempfile
import torch
from engine.capture.single import capture_samples

x = torch.randn(64).abs()  # x.sum() > 0: the relu branch
cards, _ = capture_samples(lambda: torch.relu(x), pathlib.Path(tempfile.mkdtemp()), 1)
print("plain", [c.op for c in cards], "torch._dynamo" in sys.modules)
got = []
def gate():  # torch.cond compiles its branches with Dynamo: imported here, while the capture's mode is active
    got.append(torch.cond(x.sum() > 0, lambda v: v.relu(), lambda v: v.tanh(), (x,)))
cards, _ = capture_samples(gate, pathlib.Path(tempfile.mkdtemp()), 1)
print("cond", "torch._dynamo" in sys.modules, "aten::relu" in {c.op for c in cards}, torch.equal(got[0], x.relu()))
f = torch.compile(lambda t: torch.cos(t) * 2, backend="eager")
cards, _ = capture_samples(lambda: got.append(f(x)), pathlib.Path(tempfile.mkdtemp()), 1)
print("compiled", sorted(c.op for c in cards), torch.equal(got[1], torch.cos(x) * 2))
'''


def test_a_capture_imports_no_dynamo_and_compiled_models_still_capture():
    p = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.splitlines() == [
        "plain ['aten::relu'] False",
        "cond True True True",
        "compiled ['aten::cos', 'aten::mul.Tensor'] True",
    ]


def test_a_call_while_dynamo_is_still_importing_runs_the_method_as_is(monkeypatch):
    """A mode's call can come while torch._dynamo's own import runs (sys.modules holds it, unfinished): the method
    runs as is then, where asking the half-imported Dynamo for `disable` raised AttributeError."""
    import types

    from engine.capture.dispatch_mode import DynamoLazyMode

    importing = types.ModuleType("torch._dynamo")
    importing.__spec__ = types.SimpleNamespace(_initializing=True)
    monkeypatch.setitem(sys.modules, "torch._dynamo", importing)

    class Echo(DynamoLazyMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return ("as is", func)

    assert Echo().__torch_dispatch__("f", ()) == ("as is", "f")
