"""The C++ router (`csrc/router.cpp`): guarded dispatch without entering Python on a call.

The Python router (`runtime.py`) pays a boxed call into Python, the key build and Python-side output
allocation and launch on every call of an overridden op; inside a host-bound model (ResNet-50 at batch 32
on an H200 host) that cost exceeded what the kernels saved on the GPU (0.83x end to end), while this
router made the same cast 1.21x faster (docs/results/cast-h200). It does the same exact-signature guard and
launch in a boxed C++ kernel, compiled on first use with `torch.utils.cpp_extension` (a C++ compiler and the
CUDA headers are needed; the build is cached per torch version).

`KFORGE_CAST_ROUTER` picks the router: `auto` (the default: C++ where it builds and passes its self-test on
this GPU, else Python with one warning), `cpp` (C++ without the self-test), `python` (never build it).
The self-test (`engine.export.router_selftest`) runs once per build and GPU model in a child process: on
2026-11-30 the router crashed its process on guard misses on an H200, which its CPU-key tests never saw.

Supported: ops whose arguments are tensors, absent optionals and plain values (no tensor lists); an op
that writes an argument (batch norm's running statistics) where no two arguments share storage.
Everything else stays with the Python router.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from engine.errors import signal_name

SOURCE = Path(__file__).resolve().parent / "csrc" / "router.cpp"
_LOCK = threading.Lock()
_EXT: Any = None
_WHY: str | None = None  # why the router could not be built
_NAME: str | None = None
_UNTRUSTED: str | None = None  # why `auto` does not use it on this GPU ("" once its self-test passed)


def extension() -> Any:
    """The compiled router module, or None (then `why_not()` says why). In `auto` mode on a GPU, only once
    the router passed its self-test here (`cpp` skips that test)."""
    global _UNTRUSTED
    ext = _build()
    if ext is None or mode() != "auto" or not torch.cuda.is_available():
        return ext
    with _LOCK:
        if _UNTRUSTED is None:
            _UNTRUSTED = _verdict(_NAME) or ""
    return None if _UNTRUSTED else ext


def _build() -> Any:
    global _EXT, _WHY, _NAME
    with _LOCK:
        if _EXT is not None or _WHY is not None:
            return _EXT
        try:
            from torch.utils.cpp_extension import load

            if not torch.cuda.is_available():  # building without a GPU (tests): the arch list cannot be probed
                os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
            _find_cuda_headers()

            # Without a GPU the router serves no call (it sits at the CUDA key): such a build is for the tests,
            # whose CPU CI paid 108 s for -O2 -g on a loaded core; -O0 builds in half the time.
            flags = ["-O2", "-g"] if torch.cuda.is_available() else ["-O0"]
            tag = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode()
                                 + " ".join(flags).encode()).hexdigest()[:12]
            _NAME = f"kforge_router_{tag}"
            if not _built(_NAME):
                print("kforge: building the C++ dispatch router of casts (once per torch version, about a "
                      "minute)...", file=sys.stderr, flush=True)
            _EXT = load(name=_NAME, sources=[str(SOURCE)], extra_cflags=flags,
                        with_cuda=True, verbose=os.environ.get("KFORGE_DEBUG") == "1")
            if os.environ.get("KFORGE_ROUTER_BACKTRACE") == "1":  # a crash prints the native stack
                _EXT.install_crash_backtrace()
                print(f"kforge: C++ router {_EXT.__file__} (crash backtraces on)", file=sys.stderr, flush=True)
            if not _ACTIVE:  # built inside runtime.suspended()
                _EXT.set_active(False)
        except Exception as e:  # no compiler, no CUDA headers, an incompatible torch: stay in Python
            _WHY = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
        return _EXT


def _find_cuda_headers() -> None:
    """torch guesses CUDA_HOME from nvcc's location; where that guess has no headers, use the toolkit's."""
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    if home and (Path(home) / "include" / "cuda.h").is_file():
        return
    for cand in (os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if cand and (Path(cand) / "include" / "cuda.h").is_file():
            cpp_extension.CUDA_HOME = cand
            os.environ.setdefault("CUDA_HOME", cand)
            return


def _verdict(name: str, cache_dir: Path | None = None, run: Any = None) -> str | None:
    """None when the router passed its self-test on this GPU (once per build and GPU model, remembered
    beside the build), else why not."""
    if cache_dir is None:
        from torch.utils.cpp_extension import _get_build_directory

        cache_dir = Path(_get_build_directory(name, verbose=False))
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    mark = Path(cache_dir) / f"selftest-{hashlib.sha256(gpu.encode()).hexdigest()[:10]}.txt"
    text = mark.read_text().strip() if mark.is_file() else ""
    if text:  # an empty file (another process mid-write, a full disk) is no verdict: test again
        return None if text == "passed" else text
    print("kforge: testing the C++ dispatch router on this GPU in a child process (once per build)...",
          file=sys.stderr, flush=True)
    failed = run() if run else _self_test(log_path=mark.with_suffix(".log"))
    try:
        mark.parent.mkdir(parents=True, exist_ok=True)
        tmp = mark.with_name(f"{mark.name}.{os.getpid()}.tmp")  # written whole, then renamed into place: a
        tmp.write_text((failed or "passed") + "\n")           # process testing at the same time reads all or none
        os.replace(tmp, mark)
    except OSError:
        pass  # a read-only build cache: test again next time
    return failed


def _self_test(cmd: list[str] | None = None, timeout_s: float = 300.0, log_path: Path | None = None) -> str | None:
    """Run engine.export.router_selftest (or `cmd`) in a child process: None when it passed, else why not.
    A child, because what it guards against is the router taking its process down. Its output (with the
    native stack of a crash) goes to `log_path` when given."""
    import subprocess

    cmd = cmd or [sys.executable, "-m", "engine.export.router_selftest"]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the engine package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return f"its self-test on this GPU did not finish in {timeout_s:.0f} s"
    saved = ""
    if log_path is not None:
        try:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            Path(log_path).write_text(f"$ {' '.join(cmd)}\nexit {r.returncode}\n{r.stdout}\n{r.stderr}")
            saved = f" (its output: {log_path})"
        except OSError:
            pass
    if r.returncode == 0:
        return None
    if r.returncode < 0:
        how = f"crashed with {signal_name(r.returncode)}"
    else:
        how = f"failed with exit code {r.returncode}"
    steps = [ln for ln in r.stdout.splitlines() if ln.startswith("router self-test: ")]
    at = f" at '{steps[-1][len('router self-test: '):]}'" if steps else ""
    return (f"its self-test on this GPU {how}{at}{saved}; `python -m engine.export.router_selftest` shows it, "
            "KFORGE_CAST_ROUTER=cpp uses the router anyway")


def _built(name: str) -> bool:
    try:
        from torch.utils.cpp_extension import _get_build_directory

        return (Path(_get_build_directory(name, verbose=False)) / f"{name}.so").is_file()
    except Exception:
        return False


def why_not() -> str | None:
    return _WHY or _UNTRUSTED or None


def supported(layout: Any, signature: dict[str, Any]) -> bool:
    """The router takes ops without tensor-list arguments whose every argument it can compare (tensors,
    absent optionals, plain values, int or float numbers in Tensor slots); an op that writes an argument
    only where the captured call had no two arguments sharing storage (then the router checks that per
    call). Everything else stays with the Python router."""
    if "tensor_list" in layout.kinds or (layout.writes and signature.get("aliases")):
        return False
    try:
        return all(d["kind"] != 3 for d in arg_descriptors(layout, signature, 0))
    except (ValueError, KeyError, TypeError):
        return False


def _empty(dtype: str) -> torch.Tensor:
    return torch.empty(0, dtype=getattr(torch, dtype))


def arg_descriptors(layout: Any, signature: dict[str, Any], device_index: int) -> list[dict[str, Any]]:
    """Per schema argument what a matching call must pass (the same facts as guard.signature_key)."""
    from engine.capture.signature import decode_value

    out = []
    for kind, a in zip(layout.kinds, signature["args"]):
        if kind == "tensor":
            if a.get("kind") != "tensor":  # a Python number in a Tensor slot (x + 1e-6): a wrapped 0-dim tensor
                v = decode_value(a.get("value"))
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= 2 ** 53  # exact as a double
                out.append({"kind": 4, "value": float(v), "integral": isinstance(v, int)} if ok else {"kind": 3})
            elif a.get("absent"):
                out.append({"kind": 0})
            else:
                out.append({"kind": 1, "dtype": _empty(a["dtype"]), "sizes": list(a["shape"]),
                            "strides": list(a["stride"]), "align": int(a.get("align", 16)),
                            "device": -1 if a.get("device") == "cpu" else device_index,
                            "neg": bool(a.get("neg")), "conj": bool(a.get("conj"))})
        elif kind == "tensor_list":
            raise ValueError("tensor-list arguments are not routed in C++")
        else:
            out.append(_value_descriptor(decode_value(a.get("value"))))
    return out


def _value_descriptor(v: Any) -> dict[str, Any]:
    if v is None:
        return {"kind": 0}
    if isinstance(v, bool):
        return {"kind": 2, "tag": "bool", "value": v}
    if isinstance(v, int):
        return {"kind": 2, "tag": "int", "value": v}
    if isinstance(v, float):
        return {"kind": 2, "tag": "float", "value": v}
    if isinstance(v, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return {"kind": 2, "tag": "ints", "value": list(v)}
    if isinstance(v, str):
        return {"kind": 2, "tag": "str", "value": v}
    return {"kind": 3}  # anything else is not compared in C++: such a variant never hits there


def make_plan(ext: Any, device: str, args: list[dict], outputs: list[dict], workspaces: list[tuple[int, bool]],
              launches: list[dict], writes: bool = False) -> Any:
    return ext.make_plan(device, args, outputs, workspaces, launches, writes)


def install(ext: Any, op_name: str, dispatch_key: str, plans: list[Any],
            held: list[tuple[tuple[int, ...], tuple[int, ...], tuple | None]] = ()) -> None:
    """Route the op through the C++ router; `held`: (shape, strides, output strides) of the first tensors
    compiled code passes it as Inductor holds them (runtime.held), which a call that goes to PyTorch's kernel
    gets made contiguous, and whose outputs it gets in those strides."""
    from engine.ops import resolve_op

    name, _, overload = _split(op_name)
    ext.install(name, overload, dispatch_key, plans)
    with _LOCK:
        _INSTALLED[(op_name, dispatch_key)] = _INSTALLED.get((op_name, dispatch_key), 0) + 1
    for shape, stride, outs in held:
        note_held(resolve_op(op_name), shape, stride, outs, ext)


def note_held(op: Any, shape: tuple[int, ...], stride: tuple[int, ...], outputs: tuple | None = None,
              ext: Any = None) -> None:
    """Tell the router (`ext`, else the one built, if any) that compiled code passes `op` (an OpOverload)
    this first tensor as Inductor holds it, and asserts `outputs` (strides per tensor output; None: not
    known) of the result (runtime.mark_held)."""
    ext = ext if ext is not None else _EXT
    if ext is None or not hasattr(ext, "set_held"):
        return
    outs = [[] if o is None else [int(s) for s in o] for o in (outputs or ())]
    ext.set_held(op._schema.name, op._schema.overload_name, list(shape), list(stride), outs)


def uninstall(ext: Any, op_name: str, dispatch_key: str) -> None:
    name, _, overload = _split(op_name)
    ext.uninstall(name, overload, dispatch_key)
    with _LOCK:
        left = _INSTALLED.pop((op_name, dispatch_key), 0) - 1
        if left > 0:
            _INSTALLED[(op_name, dispatch_key)] = left


# (op name, dispatch key) -> installs not yet undone: what the router takes now, whichever cast installed it
_INSTALLED: dict[tuple[str, str], int] = {}


def installed_ops() -> list[str]:
    """The ops the C++ router takes now (any cast's), as 'aten::op.overload' names."""
    with _LOCK:
        return sorted({op for op, _key in _INSTALLED})


def stats(ext: Any, op_name: str, dispatch_key: str) -> dict[str, Any]:
    name, _, overload = _split(op_name)
    return dict(ext.stats(name, overload, dispatch_key))


def reset(ext: Any, op_name: str, dispatch_key: str) -> None:
    name, _, overload = _split(op_name)
    ext.reset(name, overload, dispatch_key)


def _split(op_name: str) -> tuple[str, str, str]:
    """'aten::add.Tensor' -> ('aten::add', '.', 'Tensor'); 'aten::relu' -> ('aten::relu', '', '')."""
    ns, _, rest = op_name.partition("::")
    base, dot, overload = rest.partition(".")
    return f"{ns}::{base}", dot, overload


# ------------------------------------------------------------------------------ a cast's variants


def mode() -> str:
    """`KFORGE_CAST_ROUTER`: auto (default), cpp or python."""
    m = os.environ.get("KFORGE_CAST_ROUTER", "auto").strip().lower() or "auto"
    return m if m in ("auto", "cpp", "python") else "auto"


def wanted() -> bool:
    """Whether casts should try the C++ router (everything but KFORGE_CAST_ROUTER=python)."""
    return mode() != "python"


_ACTIVE = True


def set_active(on: bool) -> bool:
    """Switch every C++-routed op to PyTorch (False) or back; returns the previous state. A no-op until
    the router has been built (nothing is routed then)."""
    global _ACTIVE
    previous, _ACTIVE = _ACTIVE, on
    if _EXT is not None:
        _EXT.set_active(on)
    return previous


# One bit per target in a plan's target mask (router.cpp's kEagerBit/kGraphsBit are the first two). A compile
# mode that is none of these gets a bit no mask holds: a variant with targets recorded never runs there.
TARGET_BITS = ("eager", "cuda-graphs", "compile", "compile:max-autotune-no-cudagraphs", "compile:reduce-overhead")
_OTHER_BIT = 31


def target_mask(targets: Any) -> int:
    """A plan's target mask: one bit per target it may run under; 0 (any target) for None."""
    if targets is None:
        return 0
    return sum(1 << TARGET_BITS.index(t) for t in set(targets) if t in TARGET_BITS) or (1 << 30)  # 1 << 30: none


def set_target(target: str | None) -> None:
    """The target of calls this thread makes from now on (None: eager, or CUDA graphs while capturing)."""
    if _EXT is not None:
        _EXT.set_target(-1 if target is None else
                        TARGET_BITS.index(target) if target in TARGET_BITS else _OTHER_BIT)


def set_plan_targets(ext: Any, plan: Any, targets: Any) -> None:
    """Restrict a C++ plan to `targets` (None: any)."""
    ext.set_plan_targets(plan, target_mask(targets))


def set_plan_reorders(ext: Any, plan: Any, reorders: bool) -> None:
    """Whether the plan's kernels may round otherwise from run to run: its hits go to PyTorch while
    torch.use_deterministic_algorithms(True) is on."""
    ext.set_plan_reorders(plan, bool(reorders))


_PREFILL = {None: 0, "nan": 1, "sentinel": 2}


@contextmanager
def prefill(how: Any) -> Iterator[None]:
    """Confirmation only: fresh outputs of C++-routed hits are poisoned as the lane poisons them
    (engine.launch.launcher.prefill_: 'nan', anything else a finite sentinel), so an output a kernel leaves
    unwritten cannot pass by inheriting eager's freed memory. The router has no stale answers to fill in
    (a list of tensors): those calls get the sentinel (the lane gave the kernel its stale answers)."""
    if _EXT is None or how is None:
        yield
        return
    _EXT.set_prefill(_PREFILL.get(how, 2) if isinstance(how, str) else 2)
    try:
        yield
    finally:
        _EXT.set_prefill(0)


def plan_for(ext: Any, kernel_plan: Any, layout: Any, signature: dict[str, Any]) -> Any:
    """The C++ plan of a prepared KernelPlan (engine.cast.kernels): the same launches, resolved the same."""
    index = {n: i for i, n in enumerate(layout.names)}
    outs = []
    for o in kernel_plan.outputs:
        if len(o) == 1:
            outs.append({"alias": int(o[0])})
        else:
            outs.append({"alias": -1, "dtype": torch.empty(0, dtype=o[2]), "sizes": list(o[0]),
                         "strides": list(o[1])})
    ws_names = [name for name, _, _ in kernel_plan.launcher_workspaces]
    launches = []
    for _head, _ptrs, _params, ln, _how in kernel_plan.launches:
        params = []
        for v, ref in zip(ln.values, ln.refs):
            if ref is None:
                params.append((0, bytes(v)))
            elif ref[0] == "input":
                params.append((1, index[ref[1]]))
            elif ref[0] == "output":
                params.append((2, int(ref[1])))
            elif ref[0] == "workspace":
                params.append((3, ws_names.index(ref[1])))
            elif ref[0] == "list":
                params.append((4, index[ref[1]], int(ref[2])))
            else:  # ('null',): a null pointer
                params.append((0, bytes(8)))
        launches.append({"fn": int(ln.fn), "grid": list(ln.grid), "block": list(ln.block), "shared": int(ln.shared),
                         "cooperative": bool(ln.cooperative), "params": params})
    device = f"cuda:{kernel_plan.device_index}"
    return make_plan(ext, device, arg_descriptors(layout, signature, kernel_plan.device_index), outs,
                     list(kernel_plan.workspaces), launches, layout.writes)
