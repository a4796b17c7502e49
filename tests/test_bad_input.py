"""Bad input: exit 2, one line on stderr naming the file or key, no traceback, nothing half-written."""

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, ROOT

GOOD_MODEL = '''
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self, fail):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.fail = fail
    def forward(self, x):
        y = torch.relu(self.lin(x))
        if self.fail:
            raise RuntimeError("shape mismatch in block 3\\nsecond line")
        return y

def build(fail=False, explode=False):
    if explode:
        raise ValueError("cannot build with these params")
    return Net(fail), (torch.randn(2, 8),)
'''


def write(tmp_path: Path, toml: str, model: str | None = GOOD_MODEL) -> Path:
    if model is not None:
        (tmp_path / "net.py").write_text(model)
    cfg = tmp_path / "net.toml"
    cfg.write_text(textwrap.dedent(toml))
    return cfg


def assert_one_line_error(code, out, err, *needles):
    assert code == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]


def run_into_closed_pipe(argv, prelude: str = "") -> tuple[int, str]:
    """`kforge-tui ARGV` in a subprocess whose stdout is a pipe the reader has already closed (as
    `| head -c 10` is once head has its bytes); `prelude` runs first (e.g. a fake). Returns (code, stderr)."""
    script = f"import sys\n{prelude}\nfrom kforge_tui.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-c", script, *map(str, argv)], stdout=write_end,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env, timeout=600)
    finally:
        os.close(write_end)
    return proc.returncode, proc.stderr


def assert_quiet_broken_pipe(code: int, err: str) -> None:
    """A closed stdout ends with 141 (128 + SIGPIPE, as a shell reports for `cat` cut off) and no traceback."""
    assert code == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err
    assert "error:" not in err, err


def assert_nothing_written(ws: Path):
    samples = ws / "samples"
    assert not samples.exists() or not any(samples.iterdir())
    db = ws / "kforge.db"
    if db.exists():
        assert sqlite3.connect(db).execute("SELECT count(*) FROM captures").fetchone()[0] == 0


def capture(cli, cfg, ws, *extra):
    return cli("capture", cfg, "--device", "cpu", "--workspace", ws, *extra)


def test_missing_config(cli, tmp_path):
    code, out, err = capture(cli, tmp_path / "nope.toml", tmp_path / "ws")
    assert_one_line_error(code, out, err, "nope.toml", "not found")


def test_invalid_toml(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[params\n')
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "invalid TOML")


def test_unknown_key(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\nbatchsize = 3\n')
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "'batchsize'", "unknown key")


def test_unknown_nested_key(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[capture]\nsample = 3\n')
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "'capture.sample'")


def test_small_override_of_unknown_param(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[small]\nbatch = 1\n')
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "'small.batch'")


def test_builder_module_does_not_import(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "no_such_pkg.models:build"\n', model=None)
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "'builder'", "no_such_pkg.models")
    assert_nothing_written(tmp_path / "ws")


def test_builder_file_with_syntax_error(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n', model="def build(:\n")
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "'builder'", "SyntaxError")


def test_builder_function_missing(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:make"\n')
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "no function 'make'")


def test_param_the_builder_does_not_take(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[params]\nwidth = 3\n')
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "'params.width'")


def test_builder_raises(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[params]\nexplode = true\n')
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "cannot build with these params")
    assert_nothing_written(tmp_path / "ws")


def test_model_raises_during_forward(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[params]\nfail = true\n')
    ws = tmp_path / "ws"
    code, out, err = capture(cli, cfg, ws)
    assert_one_line_error(code, out, err, "net.toml", "RuntimeError: shape mismatch in block 3")
    assert "second line" not in err
    assert_nothing_written(ws)


TRAINING_ONLY = """
import torch
from torch import nn

class Detector(nn.Module):
    \"\"\"Like torchvision's detectors: losses (a dict) in training mode, detections (a list) in eval mode.\"\"\"
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
    def forward(self, x):
        y = self.lin(x)
        return {"loss": y.sum()} if self.training else [y]

class Loss(nn.Module):
    def __init__(self):
        super().__init__()
        self.det = Detector()
    def forward(self, x):
        return sum(self.det(x).values())

def build():
    return Loss().train(), (torch.randn(2, 4),)
"""


def test_a_model_that_runs_only_in_training_mode_is_told_it_runs_in_eval_mode(cli, tmp_path):
    # A Faster R-CNN wrapped to sum its losses failed with "'list' object has no attribute 'values'; fix the model
    # or its [params]": nothing said that Kernel Forge had switched the model the builder returned to eval mode.
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n', TRAINING_ONLY)
    ws = tmp_path / "ws"
    code, out, err = capture(cli, cfg, ws)
    assert_one_line_error(code, out, err, "net.toml", "'list' object has no attribute 'values'", "eval mode",
                          "training mode")
    assert_nothing_written(ws)
    # a model left in training mode that fails in both modes is not told about modes
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n', TRAINING_ONLY.replace("(2, 4)", "(2, 5)"))
    code, out, err = capture(cli, cfg, ws)
    assert_one_line_error(code, out, err, "net.toml", "cannot be multiplied")
    assert "training mode" not in err


def test_debug_shows_the_traceback(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[params]\nfail = true\n')
    code, _, err = capture(cli, cfg, tmp_path / "ws", "--debug")
    assert code == 2 and "Traceback" in err


def test_unknown_multiplicity_path(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[multiplicity]\n"blocks.0" = 4\n')
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "'multiplicity.blocks.0'")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present here")
def test_cuda_device_absent(cli, tmp_path):
    code, out, err = cli("capture", CONFIGS / "models" / "resnet50.toml", "--device", "cuda",
                         "--workspace", tmp_path / "ws")
    assert_one_line_error(code, out, err, "--device cuda", "--device cpu")
    assert_nothing_written(tmp_path / "ws")


def test_bad_option_is_one_line(cli, tmp_path):
    code, out, err = cli("capture", "x.toml", "--frobnicate")
    assert_one_line_error(code, out, err, "--frobnicate")


def test_workspace_is_a_file(cli, tmp_path):
    ws = tmp_path / "ws"
    ws.write_text("not a folder")
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n')
    code, out, err = capture(cli, cfg, ws)
    assert_one_line_error(code, out, err, str(ws))


def test_export_and_audit_refuse_bad_input(cli, tmp_path):
    # No GPU here: export says so; audit of a file that is not there names it.
    code, out, err = cli("export", "--out", tmp_path / "x.cast", "--workspace", tmp_path)
    assert_one_line_error(code, out, err, "export:")
    code, out, err = cli("audit", tmp_path / "missing.cast")
    assert_one_line_error(code, out, err, "missing.cast")


def test_help_lists_every_subcommand(cli, capsys):
    with pytest.raises(SystemExit) as exc:
        cli("--help")
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in ("capture", "run", "export", "audit", "compare", "demo"):
        assert name in out


@pytest.mark.parametrize("command", ["capture", "run", "export", "audit", "runs", "prune", "compare", "demo",
                                     "serve"])
def test_each_commands_help_says_what_it_does(cli, capsys, command):
    # `kforge-tui demo --help` listed only options: what the demo is was in `kforge-tui --help` alone.
    with pytest.raises(SystemExit) as exc:
        cli("--help")
    listing = capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        cli(command, "--help")
    assert exc.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    line = next(ln for ln in listing.splitlines() if ln.strip().startswith(command + " "))
    assert line.split(None, 1)[1].strip().lower() in help_text.lower()


def test_user_model_example_captures(cli, tmp_path):
    import json

    code, out, err = cli("capture", CONFIGS / "examples" / "my_model.toml", "--small", "--json",
                         "--device", "cpu", "--workspace", tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    ops = {c["op"]: c["calls"] for c in doc["cards"]}
    assert ops["aten::native_layer_norm"] == 24  # 2 blocks scaled ×12 each
    assert ops["aten::gelu"] == 24 and "aten::_softmax" in ops



def _pyproject_version() -> str:
    import re

    return re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)


def test_version_prints_the_package_version(cli, monkeypatch):
    code, out, err = cli("--version")
    assert code == 0 and err == ""
    assert out == f"kforge-tui {_pyproject_version()}\n"
    import importlib.metadata

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)  # a source checkout, not installed
    code, out, err = cli("--version")
    assert code == 0 and out == f"kforge-tui {_pyproject_version()}\n"


@pytest.mark.parametrize("argv, needle", [
    (["run", "x.toml", "--no-tui", "--wall-time", "-5"], "--wall-time"),
    (["run", "x.toml", "--no-tui", "--wall-time", "0"], "--wall-time"),
    (["run", "x.toml", "--no-tui", "--max-proposals", "0"], "--max-proposals"),
    (["--refresh", "-1"], "--refresh"),
    (["run", "x.toml", "--refresh", "-1"], "--refresh"),
    (["demo", "--refresh", "0"], "--refresh"),
    # textual-serve took 99999 and failed with "internal error: OverflowError", exit 1; 0 served on a port
    # the OS picked while the printed address said :0.
    (["serve", "--port", "99999"], "--port"),
    (["serve", "--port", "0"], "--port"),
    (["run", "x.toml", "--no-tui", "--iterations", "0"], "--iterations"),
    (["capture", "x.toml", "--samples", "-1"], "--samples"),
    # inf (and 1e400, which overflows to it) was stored in the run's config as Infinity, which is not JSON
    (["run", "x.toml", "--no-tui", "--wall-time", "inf"], "--wall-time"),
    (["run", "x.toml", "--no-tui", "--wall-time", "1e400"], "--wall-time"),
    (["run", "x.toml", "--no-tui", "--compile-ref-timeout", "inf"], "--compile-ref-timeout"),
    (["run", "x.toml", "--no-tui", "--max-cost", "1e400"], "--max-cost"),
])
def test_out_of_range_flags_are_bad_usage(cli, tmp_path, argv, needle):
    code, out, err = cli(*argv, "--workspace", tmp_path / "ws")
    assert_one_line_error(code, out, err, needle, "must be")
    assert not (tmp_path / "ws").exists()  # refused before any work


@pytest.mark.parametrize("argv", [["capture", "x.toml", "--samples", "-1"],
                                  ["run", "x.toml", "--no-tui", "--iterations", "0"]])
def test_a_bad_count_is_refused_before_torch_is_imported(cli, monkeypatch, argv):
    # Both were checked after importing torch (2.5 s on two cores for a one-line refusal).
    for module in ("engine.config", "engine.run.command"):
        monkeypatch.setitem(sys.modules, module, None)  # importing either now fails
    code, out, err = cli(*argv)
    assert_one_line_error(code, out, err, argv[-2], "must be a whole number")


def test_audit_of_a_closed_pipe_ends_quietly(tmp_path):
    from cast_helpers import write_genuine_cast

    cast = tmp_path / "model.cast"
    write_genuine_cast(cast)
    assert_quiet_broken_pipe(*run_into_closed_pipe(["audit", cast, "--json"]))
    assert_quiet_broken_pipe(*run_into_closed_pipe(["audit", cast]))
    assert_quiet_broken_pipe(*run_into_closed_pipe(["--version"]))


def test_export_into_a_closed_pipe_ends_quietly(tmp_path):
    fake = (  # the GPU part of export is tested on the H200; here only what it prints matters
        "import engine.export.package as export\n"
        "export.export_run = lambda ws, run, out, **kw: export.ExportResult(out, [{'id': 'relu-1', "
        "'op': 'aten::relu', 'speedup': 1.1, 'speedup_ci': [1.0, 1.2]}], [], [])\n")
    for extra in (["--json"], []):
        assert_quiet_broken_pipe(*run_into_closed_pipe(
            ["export", "--out", tmp_path / "x.cast", "--workspace", tmp_path / "ws", *extra], prelude=fake))


def test_capture_json_into_a_closed_pipe_ends_quietly(tmp_path):
    assert_quiet_broken_pipe(*run_into_closed_pipe(
        ["capture", CONFIGS / "examples" / "my_model.toml", "--small", "--json", "--device", "cpu",
         "--workspace", tmp_path]))


def test_capture_table_into_a_closed_pipe_ends_quietly(tmp_path):
    # rich's own handling of the closed pipe exited 1; the JSON output already ended with 141
    assert_quiet_broken_pipe(*run_into_closed_pipe(
        ["capture", CONFIGS / "examples" / "my_model.toml", "--small", "--device", "cpu", "--workspace", tmp_path]))


SHAPES_MODEL = '''
import torch
from torch import nn


def build(returns="swapped"):
    net = nn.Linear(8, 8)
    x = torch.randn(2, 8)
    return {"swapped": (x, net), "triple": (net, (x,), {}), "args_kwargs": (net, ((x,), {})),
            "on_cuda": None, "nothing": None}[returns] if returns != "on_cuda" else (net, (x.to("cuda:0"),))
'''


@pytest.mark.parametrize("returns, needles", [
    ("swapped", ["got a tuple of 2 (Tensor, Module): the model comes first", "dict of its keyword inputs"]),
    ("triple", ["got a tuple of 3 (Module, tuple, dict)", "tuple of the forward's positional inputs"]),
    ("args_kwargs", ["(args, kwargs) pair", "(model, kwargs) with a dict of keyword inputs"]),
    ("nothing", ["got None (does it end without `return`?)"]),   # was "got a NoneType"
])
def test_a_builder_return_of_the_wrong_shape_says_what_it_got(cli, tmp_path, returns, needles):
    cfg = write(tmp_path, f'name = "x"\nbuilder = "net.py:build"\n[params]\nreturns = "{returns}"\n', SHAPES_MODEL)
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", *needles)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_builder_that_puts_inputs_on_cuda_without_one_is_told_to_use_its_device_argument(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[params]\nreturns = "on_cuda"\n', SHAPES_MODEL)
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "`device` argument")


def test_an_unknown_dtype_lists_every_accepted_name(cli, tmp_path):
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n[dtype]\ncpu = "int8"\n')
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "'dtype.cpu'", "float64", "bf16")


@pytest.mark.parametrize("toml, needles", [
    ('name = "team/r2"\nbuilder = "net.py:build"\n', ["'name'", "names the workspace's folders"]),
    (f'name = "{"x" * 300}"\nbuilder = "net.py:build"\n', ["'name'", "1 to 100 letters"]),
    ('name = "../up"\nbuilder = "net.py:build"\n', ["'name'"]),
    ('name = "x"\nbuilder = "net.py:build"\n[dtype]\ncpu = ["float32"]\n', ["'dtype.cpu'", "unknown dtype ['float32']"]),
])
def test_config_values_that_would_crash_later_are_bad_input(cli, tmp_path, toml, needles):
    # A name with '/' or 300 characters crashed the capture on its sample folder (and '../x' wrote outside it);
    # a list as a dtype raised TypeError: unhashable type.
    code, out, err = capture(cli, write(tmp_path, toml), tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", *needles)
    assert_nothing_written(tmp_path / "ws")


def test_small_without_a_small_table_is_bad_input(cli, tmp_path):
    # It captured the full size and labelled it "small".
    code, out, err = capture(cli, write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n'), tmp_path / "ws", "--small")
    assert_one_line_error(code, out, err, "net.toml", "'small'", "has none")


def test_a_builder_that_calls_sys_exit_is_bad_input(cli, tmp_path):
    model = "import sys\n\ndef build():\n    sys.exit(3)\n"
    code, out, err = capture(cli, write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n', model), tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "called sys.exit(3)")


EXITING_MODEL = '''
import sys
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, exit_on):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.exit_on, self.calls = exit_on, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.exit_on:
            sys.exit(5)
        return torch.relu(self.lin(x))


def build(exit_on=1):
    return Net(exit_on), (torch.randn(2, 8),)
'''


@pytest.mark.parametrize("exit_on, forward", [(1, "warm-up"), (2, "captured")])
def test_a_forward_that_calls_sys_exit_is_bad_input(cli, tmp_path, exit_on, forward):
    # It ended kforge silently with the model's code (5), as the builder's sys.exit once did.
    cfg = write(tmp_path, f'name = "x"\nbuilder = "net.py:build"\n[params]\nexit_on = {exit_on}\n', EXITING_MODEL)
    code, out, err = capture(cli, cfg, tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", f"the model called sys.exit(5) during its {forward} forward")
    assert_nothing_written(tmp_path / "ws")


STATEFUL = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("cache full")
        return torch.relu(self.lin(x))


def build():
    return Net(), (torch.randn(2, 8),)
'''


def test_a_model_that_fails_on_its_second_forward_is_not_called_a_kforge_bug(cli, tmp_path):
    code, out, err = capture(cli, write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n', STATEFUL),
                             tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "cache full", "changes its state between forwards")
    assert "Kernel Forge bug" not in err


def test_a_config_path_that_is_a_folder_says_so(cli, tmp_path):
    code, out, err = capture(cli, tmp_path, tmp_path / "ws")
    assert_one_line_error(code, out, err, "a folder, not a config file")


def test_a_builder_imports_a_module_next_to_it(cli, tmp_path):
    # A model split over two files: `from tinynet import Net` in the builder failed with "No module named
    # 'tinynet'; install it".
    (tmp_path / "tinynet.py").write_text(GOOD_MODEL)
    (tmp_path / "net.py").write_text("from tinynet import build as _build\n\n\ndef build():\n    return _build()\n")
    (tmp_path / "net.toml").write_text('name = "x"\nbuilder = "net.py:build"\n')
    code, _, err = capture(cli, tmp_path / "net.toml", tmp_path / "ws")
    assert code == 0, err


def test_a_builder_with_a_syntax_error_is_told_to_fix_it_not_to_install_it(cli, tmp_path):
    code, out, err = capture(cli, write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n', "def build(:\n"),
                             tmp_path / "ws")
    assert_one_line_error(code, out, err, "net.toml", "SyntaxError", "fix the module")
    assert "install it" not in err


THREAD_LEAVING_MODEL = '''
import threading
import time
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        threading.Thread(target=time.sleep, args=(600,), daemon=False).start()   # never joined
        return torch.relu(self.lin(x))


def build():
    return Net(), (torch.randn(2, 8),)
'''


@pytest.mark.parametrize("command", [["capture", "--device", "cpu"],
                                     ["run", "--dry-run", "--no-tui", "--iterations", "1", "--device", "cpu"]])
def test_a_thread_the_model_leaves_running_does_not_keep_the_command_alive(tmp_path, command):
    # The command printed its result and then hung in the interpreter's join of the model's thread (a Ctrl-C then
    # printed a traceback from threading._shutdown). The process's own entry point, as a user runs it.
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n', THREAD_LEAVING_MODEL)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "kforge_tui", command[0], str(cfg), *command[1:],
                           "--workspace", str(tmp_path / "ws")], capture_output=True, text=True, env=env,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert "aten::relu" in proc.stdout, proc.stdout   # its result printed whole
    assert "Traceback" not in proc.stderr


BUILDER_LEAVING_A_THREAD = '''
import threading
import time
import torch
from torch import nn


def build():
    threading.Thread(target=time.sleep, args=(600,), daemon=False).start()   # never joined
    return nn.Sequential(nn.Linear(8, 8)), (torch.randn(2, 8),)
'''


def test_exports_fresh_processes_end_when_a_model_leaves_a_thread_running(tmp_path):
    # Export's fresh processes (confirmation, the whole-model check, the route checks, the sanitizer's runs) and the
    # lane's worker end through the same exit as the command line: the layout check, the one of them that runs on
    # the CPU, wrote its result and then waited on the model's thread until export's timeout killed it.
    cfg = write(tmp_path, 'name = "x"\nbuilder = "net.py:build"\n', BUILDER_LEAVING_A_THREAD)
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "engine.export.layout_check", "--config", str(cfg), "--cast",
                           str(tmp_path / "unused.cast"), "--out", str(out), "--device", "cpu"],
                          capture_output=True, text=True, env=env, timeout=90, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert '"chosen": null' in out.read_text()   # no convolutional module: nothing to route, said in full
    assert "Traceback" not in proc.stderr


def test_every_fresh_process_export_and_the_lane_start_ends_through_leave_process():
    # The ones that need a GPU to reach the end of their work, held to the same exit by their source.
    for mod in ("export/e2e", "export/graph_check", "export/layout_check", "export/confirm", "export/sanitize",
                "lane/worker"):
        tail = (ROOT / "engine" / f"{mod}.py").read_text().rsplit('if __name__ == "__main__":', 1)[1]
        assert "sys.exit(leave_process(main()))" in tail, mod
