"""A third sweep of user models, further down the user's path on a CPU: capture, `run --dry-run`, and what each
says to the user."""

import json
from pathlib import Path

import torch
from test_user_model_sweep import _config


def _capture_json(cli, tmp_path: Path, source: str, params: str = "") -> dict:
    code, out, err = cli("capture", _config(tmp_path, source, params), "--device", "cpu", "--json", "--workspace",
                         tmp_path / "ws")
    assert code == 0, err
    return json.loads(out)


def test_a_cpu_only_pytorch_build_does_not_make_every_op_cpu_only(monkeypatch):
    # A PyTorch built without CUDA (a `+cpu` wheel, a laptop's) registers no CUDA kernel for any op: a dry run there
    # said "cpu-only op: the GPU runs a different op" of relu, batch norm and most of a model, and proposed for none.
    from engine.run.as_gpu import is_cpu_only

    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    assert not is_cpu_only("aten::relu") and not is_cpu_only("aten::native_batch_norm")
    assert is_cpu_only("aten::_scaled_dot_product_flash_attention_for_cpu") and is_cpu_only("aten::mkldnn_rnn_layer")


def test_a_run_stopped_before_it_was_created_names_the_command_as_given(tmp_path):
    # Ctrl-C during a run's capture said "'kforge-tui run CONFIG --device cpu --dry-run --workspace WS' captures
    # again": --iterations, --ops, --provider and --no-tui were gone, so the command it named ran another run.
    import shlex

    from engine.cli import build_parser, run_argv
    from engine.run.command import _stopped_before_the_run

    args = build_parser().parse_args(["run", "m.toml", "--dry-run", "--no-tui", "--device", "cpu", "--iterations",
                                      "2", "--ops", "relu|gelu", "--provider", "builtin", "--workspace", "ws"])
    args.argv_as_given = run_argv(args)  # as engine.cli's dispatch sets it before cmd_run
    line = _stopped_before_the_run({"capturing": "1"}, args, tmp_path, True, False)
    command = shlex.split(line[line.index("'") + 1:line.rindex("' captures again")])
    assert command[:3] == ["kforge-tui", "run", "m.toml"] and command[-2:] == ["--workspace", str(tmp_path)]
    for flag in (["--iterations", "2"], ["--ops", "relu|gelu"], ["--provider", "builtin"], ["--dry-run"],
                 ["--no-tui"], ["--device", "cpu"]):
        assert " ".join(flag) in " ".join(command), (flag, command)
    assert "--debug" not in command   # a flag not given (its parser default is SUPPRESS, its value False)


KV_CACHE = '''
class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.k = self.v = self.table = None

    def forward(self, x):
        if KIND == "setup" and self.table is None:
            self.table = torch.arange(16.0).cos()      # built once, on the first call
        q, k, v = self.qkv(x).chunk(3, -1)
        if KIND == "cache":
            if self.k is not None:                 # the cache grows on every call, as in a generation loop
                k, v = torch.cat([self.k, k], 1), torch.cat([self.v, v], 1)
            self.k, self.v = k, v
        out = torch.softmax(q @ k.transpose(1, 2) / 4, -1) @ v
        return out if self.table is None else out * self.table


def build(kind):
    global KIND
    KIND = kind
    torch.manual_seed(0)
    return Decoder().eval(), (torch.randn(1, 1, 16),)
'''


def test_a_kv_cache_that_grows_on_every_call_is_noted_at_capture(cli, tmp_path):
    # The output of each forward was the same (the same token appended), so the capture said nothing; but the cards
    # were those of a cache of 1 (the second forward), each later forward calls other shapes, and the run and the
    # export's whole-model check call it many times more.
    notes = {kind: _capture_json(cli, tmp_path / kind, KV_CACHE, f'kind = "{kind}"')["notes"]
             for kind in ("cache", "setup", "none")}
    said = notes["cache"].get("calls") or ""
    assert "the model's two forwards on the same inputs made other calls" in said
    assert "aten::cat on [[1,1,16], [1,1,16]]" in said and "KV cache" in said and "rebuild or copy it inside forward" in said
    assert "repeatable" not in notes["cache"]
    assert "calls" not in notes["setup"] and "calls" not in notes["none"]   # a one-time set-up is no state


NOISY = '''
class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return self.lin(x + torch.randn_like(x)).relu()   # fresh noise on every call, as a diffusion step draws it


def build():
    torch.manual_seed(0)
    return Denoiser().eval(), (torch.randn(4, 16),)
'''


def test_a_run_says_the_capture_notes_that_doom_the_whole_model_check(cli, tmp_path):
    # `capture` noted that the output is not repeatable, but `run` (which captures on its own) said nothing: on a GPU
    # it searched for the whole budget (an LLM's tokens spent) before export's whole-model check refused the model.
    code, out, err = cli("run", _config(tmp_path, NOISY), "--dry-run", "--no-tui", "--device", "cpu", "--iterations",
                         "1", "--json", "--workspace", tmp_path / "ws")
    assert code == 0, err
    [said] = json.loads(out)["capture_warnings"]
    assert said.startswith("the capture of user_model notes (repeatable): the model's output is not repeatable")
    assert f"kforge: warning: {said}\n" in err


FORCES = '''
class ForceField(nn.Module):
    def __init__(self):
        super().__init__()
        self.energy = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, pos):
        if GRAD:
            with torch.enable_grad():
                return self.forces(pos.detach().requires_grad_(True))
        return self.forces(pos.requires_grad_(True))

    def forces(self, pos):
        return -torch.autograd.grad(self.energy(pos).sum(), pos)[0]


def build(grad):
    global GRAD
    GRAD = grad
    torch.manual_seed(0)
    return ForceField(), (torch.randn(5, 3),)
'''


def test_a_forward_that_takes_gradients_is_told_to_enable_them(cli, tmp_path):
    # A force field (forces = -dE/dx) runs in plain eager; under the capture's torch.no_grad() it said "the model
    # raised during its warm-up forward: RuntimeError: element 0 of tensors does not require grad ...; fix the
    # model or its [params]", which names neither the cause nor the fix.
    code, out, err = cli("capture", _config(tmp_path, FORCES, "grad = false"), "--device", "cpu", "--workspace",
                         tmp_path / "ws")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "the model's warm-up forward takes gradients" in err and "torch.no_grad()" in err
    assert "`with torch.enable_grad():`" in err and "fix the model or its [params]" not in err
    ops = {c["op"] for c in _capture_json(cli, tmp_path / "grad", FORCES, "grad = true")["cards"]}
    assert {"aten::tanh", "aten::tanh_backward"} <= ops   # what the fix says works, backward calls and all


CLASSIFIER = '''
def build(labels):
    torch.manual_seed(0)
    head = nn.Linear(8, 5)
    model = nn.Sequential(head, nn.Flatten(0)) if not labels else nn.Sequential(head, Argmax())
    return model, (torch.randn(4, 8),)


class Argmax(nn.Module):
    def forward(self, x):
        return x.argmax(-1)
'''


def test_a_model_returning_labels_is_noted_at_capture(cli, tmp_path):
    # The whole-model check compares the first output tensor by relative L2: of argmax labels, one label flipped by
    # a kernel's rounding reads as a large error; the capture said nothing.
    notes = {labels: _capture_json(cli, tmp_path / labels, CLASSIFIER, f"labels = {labels}")["notes"]
             for labels in ("true", "false")}
    assert "holds int64 values (labels, indices or a mask" in notes["true"]["model output"]
    assert "return the float scores they come from first" in notes["true"]["model output"]
    assert "model output" not in notes["false"]


def test_editing_a_module_the_builder_imports_is_a_new_capture(tmp_path):
    # A model split in files (build.py: `from layers import Block`): editing layers.py kept the config's identity, so
    # `run` reused the old capture and searched the old model's cards (relu after the model had moved to sigmoid).
    # (Module names of their own here: an earlier test's builder folder stays on this process's import path.)
    from engine.config import load_config

    (tmp_path / "sweep3_net").mkdir()
    files = {
        "build.py": "import json\nimport torch\nfrom sweep3_layers import Block\nfrom sweep3_net.head import Head\n\n"
                    "def build():\n    return torch.nn.Sequential(Block(), Head()), (torch.randn(2, 8),)\n",
        "sweep3_layers.py": "import torch\n\nclass Block(torch.nn.Linear):\n    def __init__(self):\n"
                            "        super().__init__(8, 8)\n",
        "sweep3_net/__init__.py": "",
        "sweep3_net/head.py": "import torch\nfrom .act import ACT\n\nclass Head(torch.nn.Module):\n"
                              "    def forward(self, x):\n        return ACT(x)\n",
        "sweep3_net/act.py": "import torch\nACT = torch.relu\n",
        "json.py": "# never imported: the standard library's json comes first\n",
        "notes.py": "# imported by nothing\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    cfg = tmp_path / "m.toml"
    cfg.write_text('name = "split"\nbuilder = "build.py:build"\n')
    first = load_config(cfg).sha256
    for name in ("json.py", "notes.py"):
        (tmp_path / name).write_text(files[name] + "# edited\n")
        assert load_config(cfg).sha256 == first, name
    seen = {first}
    for name in ("sweep3_layers.py", "sweep3_net/head.py", "sweep3_net/act.py", "sweep3_net/__init__.py"):
        (tmp_path / name).write_text(files[name] + "# edited\n")
        again = load_config(cfg).sha256
        assert again not in seen, name
        seen.add(again)


FLAT = '''
class Body(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16) * 0.1)

    def forward(self, x):
        for _ in range(4):
            x = torch.tanh(x * self.w + 0.5) - 0.1
        return x


class Wrapped(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = Body()

    def forward(self, x):
        return self.body(x)


def build(wrap):
    torch.manual_seed(0)
    return (Wrapped() if wrap else Body()), (torch.randn(4, 16),)
'''


def test_a_flat_model_is_told_why_it_has_no_chain_cards(cli, tmp_path):
    # The same pointwise run made a chain card inside a submodule and none in the model's own forward, and the
    # capture said nothing of it: chain cards are made only of calls inside submodules.
    flat = _capture_json(cli, tmp_path / "flat", FLAT, "wrap = false")
    wrapped = _capture_json(cli, tmp_path / "wrapped", FLAT, "wrap = true")
    assert flat["chains"] == [] and len(wrapped["chains"]) == 1
    said = flat["notes"]["chains"]
    assert said.startswith("16 of the forward's 16 memory-bound calls") and "outside any submodule" in said
    assert "move that code into a submodule" in said and "chains" not in wrapped["notes"]


FD_PRINTS = '''
import os
import sys


class Loud(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        os.write(1, b"a C extension's printf\\n")      # below sys.stdout, as a C++ extension's logging is
        print("to sys.__stdout__", file=sys.__stdout__)
        return self.lin(x)


def build():
    os.system("echo a subprocess the builder starts")
    return Loud(), (torch.randn(2, 4),)
'''


def test_capture_json_stays_one_document_when_the_model_writes_below_sys_stdout(capfd, tmp_path):
    # Only sys.stdout was sent to stderr: a write to file descriptor 1 (a C extension, a subprocess, sys.__stdout__)
    # came out ahead of the JSON document, and json.loads of stdout failed.
    from kforge_tui.cli import main

    code = main(["capture", str(_config(tmp_path, FD_PRINTS)), "--device", "cpu", "--json", "--workspace",
                 str(tmp_path / "ws")])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert json.loads(out)["model"] == "user_model"
    for said in ("a C extension's printf", "to sys.__stdout__", "a subprocess the builder starts"):
        assert said in err and said not in out


def test_a_config_that_sets_the_device_or_dtype_in_params_or_is_the_py_file_is_one_line(cli, tmp_path):
    # [params] device = "cuda" took the place of the capture's device: on a CPU capture the builder failed with
    # "this machine has no CUDA GPU: give the builder a `device` argument", which it had. A dtype name in [params]
    # reached the builder as a string. And the builder's .py passed as the config read "invalid TOML".
    source = "def build(device, dtype):\n    return nn.Linear(4, 4).to(device, dtype), (torch.randn(2, 4, device=device),)\n"
    for params, key, fix in (('device = "cuda"', "params.device", "take it out of [params]"),
                             ('dtype = "float16"', "params.dtype", 'set it in [dtype] (cuda = "float16"')):
        code, out, err = cli("capture", _config(tmp_path, source, params), "--device", "cpu", "--workspace",
                             tmp_path / "ws")
        assert code == 2 and err.count("\n") == 1 and f"key '{key}'" in err and fix in err, err
    code, out, err = cli("capture", tmp_path / "user_model.py", "--device", "cpu", "--workspace", tmp_path / "ws")
    assert code == 2 and err.count("\n") == 1 and "a Python file, not a config" in err
    assert 'builder = "user_model.py:build"' in err


def test_the_whole_model_checks_compare_a_complex_output_whole():
    # An FFT model's output went through `.double()`, which keeps the real part only (with a warning): a cast that
    # broke only the imaginary part agreed with eager exactly.
    import warnings

    from engine.bench.agreement import compared, rel_l2_err

    eager = torch.randn(64, dtype=torch.complex64)
    broken = torch.complex(eager.real, torch.zeros(64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no "Casting complex values to real discards the imaginary part"
        assert rel_l2_err(compared(broken), compared(eager)) > 0.5
        assert rel_l2_err(compared(eager.conj()), compared(eager)) > 0.5   # a conjugate view is read as it is
        assert compared(eager).dtype == torch.float64 and compared(eager.real).shape == (64,)
    src = (Path(__file__).resolve().parent.parent / "engine" / "export" / "e2e.py").read_text()
    assert ".double()" not in src   # every output compared through compared()


def test_compile_workers_end_when_the_run_that_started_them_is_killed(tmp_path):
    # A `run --dry-run` killed with SIGKILL (the OOM killer, a scheduler, kill -9) left its compile workers and
    # multiprocessing's resource tracker running for good: a worker waits on a queue whose write end it holds.
    import os
    import signal
    import subprocess
    import sys
    import time

    script = ("import os, sys, time\nfrom engine.compile.pool import CompilePool\npool = CompilePool(1)\n"
              "executor, _ = pool._current()\nprint(executor.submit(os.getpid).result(), flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    worker = int(proc.stdout.readline())

    def alive() -> bool:   # a zombie (ended, not yet reaped by init) has ended
        try:
            return Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 60   # a wait, not a timing: it ends once the worker is gone (it looks each second)
        while time.monotonic() < deadline and alive():
            time.sleep(0.1)
        assert not alive(), "the compile worker outlived its parent"
    finally:
        if alive():
            os.kill(worker, signal.SIGKILL)


SCALED = '''
from torch.utils._pytree import tree_map


class Scaled(torch.Tensor):
    """A wrapper tensor subclass (as torchao's quantized weights are): its data lives in a plain tensor it holds."""

    @staticmethod
    def __new__(cls, data, scale):
        t = torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)
        t.data_, t.scale = data, scale
        return t

    def __repr__(self):
        return f"Scaled({self.data_})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def plain(t):
            return t.data_ * t.scale if isinstance(t, Scaled) else t
        return func(*tree_map(plain, args), **tree_map(plain, kwargs or {}))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", Scaled(torch.randn(8, 8), 0.5))   # model state the capture keys by storage
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(x @ self.w) * 2


def build():
    torch.manual_seed(0)
    return Net(), (Scaled(torch.randn(4, 8), 2.0),)
'''


def test_a_model_with_wrapper_tensor_subclasses_captures_the_calls_they_make(cli, tmp_path):
    # A wrapper subclass (torchao's quantized weights, a scaled input) runs in eager; the capture read it as a plain
    # tensor and said "the model raised during its warm-up forward: RuntimeError: Attempted to access the data
    # pointer on an invalid python storage.; fix the model".
    doc = _capture_json(cli, tmp_path, SCALED)
    ops = {c["op"] for c in doc["cards"]}
    assert {"aten::mm", "aten::gelu", "aten::mul.Tensor"} <= ops   # the plain calls, the scale's muls among them
    assert not any("Scaled" in json.dumps(c) for c in doc["cards"] + doc["chains"])


def test_a_torch_export_programs_module_captures_as_it_was_exported(cli, tmp_path):
    # ExportedProgram.module() refuses eval(): the capture said "internal error: NotImplementedError: Calling eval()
    # is not supported yet." (exit 1).
    source = ("def build():\n    torch.manual_seed(0)\n    x = torch.randn(4, 8)\n"
              "    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.ReLU()).eval()\n"
              "    return torch.export.export(model, (x,)).module(), (x,)\n")
    doc = _capture_json(cli, tmp_path, source)
    assert {"aten::addmm", "aten::native_layer_norm", "aten::relu"} <= {c["op"] for c in doc["cards"]}
    said = doc["notes"]["eval mode"]
    assert said.startswith("the model's mode cannot be switched (NotImplementedError: Calling eval() is not supported")
    assert "model.eval() before torch.export.export" in said


def test_run_names_the_config_key_behind_a_bad_provider_or_no_samples(cli, tmp_path):
    # A [run] provider the config named was reported as "--provider nope: unknown provider", a flag never given; and
    # [capture] samples = 0 made a run that proposed nothing ("3 no-samples") and said done.
    source = "def build():\n    return nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),)\n"
    cfg = _config(tmp_path, source)
    for table, said in (('[run]\nprovider = "nope"\n', "user_model.toml: key 'run.provider' nope: unknown provider"),
                        ("[capture]\nsamples = 0\n", "user_model.toml: key 'capture.samples': 0 keeps no input")):
        cfg.write_text('name = "user_model"\nbuilder = "user_model.py:build"\n' + table)
        code, out, err = cli("run", cfg, "--dry-run", "--no-tui", "--device", "cpu", "--workspace", tmp_path / "ws")
        assert code == 2 and err.count("\n") == 1 and said in err and "--provider nope" not in err, err
        assert not (tmp_path / "ws").exists()   # said before anything is made
