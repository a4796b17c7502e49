"""The capture's dispatch modes load no Dynamo of their own (engine/capture/dispatch_mode.py): PyTorch's wrapping of
a mode's `__torch_dispatch__` imported torch._dynamo on the first captured call, 2.5-3 s of CPU in every capture
process. A model that compiles still captures as before, Dynamo loaded before the capture or during it."""

import subprocess
import sys

from conftest import ROOT

PROBE = r'''
import pathlib, sys, tempfile
import torch
from engine.capture.single import capture_samples

x = torch.randn(64)
cards, _ = capture_samples(lambda: torch.relu(x), pathlib.Path(tempfile.mkdtemp()), 1)
print("plain", [c.op for c in cards], "torch._dynamo" in sys.modules)
got = []
def forward():  # a model that compiles on its first call: Dynamo is imported while the capture's mode is active
    got.append(torch.compile(lambda t: torch.sin(t) + 1, backend="eager")(x))
cards, _ = capture_samples(forward, pathlib.Path(tempfile.mkdtemp()), 1)
print("compiled inside", sorted(c.op for c in cards), torch.equal(got[0], torch.sin(x) + 1))
f = torch.compile(lambda t: torch.cos(t) * 2, backend="eager")  # Dynamo loaded before the capture
cards, _ = capture_samples(lambda: got.append(f(x)), pathlib.Path(tempfile.mkdtemp()), 1)
print("compiled before", sorted(c.op for c in cards), torch.equal(got[1], torch.cos(x) * 2))
'''


def test_a_capture_imports_no_dynamo_and_compiled_models_still_capture():
    p = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.splitlines() == [
        "plain ['aten::relu'] False",
        "compiled inside ['aten::add.Tensor', 'aten::sin'] True",
        "compiled before ['aten::cos', 'aten::mul.Tensor'] True",
    ]
