"""A variant made ready to launch: everything resolvable at install time is resolved once.

The launch spec is resolved against the variant's exact signature (grid, block, shared memory, scalar
parameters), the module is loaded and checked by the lane's own `CandidateLauncher`, and the packed
parameter buffers are kept. A hit then only allocates outputs, writes pointers into the buffers and
calls `cuLaunchKernel` on the current raw stream (through ctypes on libcuda: the cheapest call Python
has; cuda.bindings when libcuda cannot be opened).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import torch

from engine.cast.guard import OpLayout
from engine.cast.runtime import Plan

_grad_enabled = torch.is_grad_enabled


class _Driver:
    """cuLaunchKernel as a plain C call, set up once per process."""

    fn: Any = None
    # ctypes without argtypes: the pointer arguments are passed as ready c_void_p objects and the
    # unsigned ones as small Python ints; converting all eleven through argtypes on every call cost
    # 2.1 µs against 0.8 µs (measured on this project's CPU with a stand-in C function).
    raw: bool = False

    @classmethod
    def launcher(cls) -> Any:
        if cls.fn is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
                f = lib.cuLaunchKernel
                f.restype = ctypes.c_int
                cls.fn, cls.raw = f, True
            except (OSError, AttributeError):
                from cuda.bindings import driver as cu

                def via_bindings(fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
                    return int(cu.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, shared, stream, params, 0)[0])
                cls.fn = via_bindings
        return cls.fn

    coop: Any = None

    @classmethod
    def cooperative_launcher(cls) -> Any:
        """cuLaunchCooperativeKernel with cuLaunchKernel's arguments (its `extra` unused): every block of the
        grid resident at once, or an error. Packed as `launcher()` packs (call that first)."""
        if cls.coop is None:
            if cls.raw:
                f = ctypes.CDLL("libcuda.so.1").cuLaunchCooperativeKernel
                f.restype = ctypes.c_int

                def raw_coop(fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
                    return f(fn, gx, gy, gz, bx, by, bz, shared, stream, params)
                cls.coop = raw_coop
            else:
                from cuda.bindings import driver as cu

                def coop_bindings(fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
                    return int(cu.cuLaunchCooperativeKernel(fn, gx, gy, gz, bx, by, bz, shared, stream, params)[0])
                cls.coop = coop_bindings
        return cls.coop


class KernelPlan(Plan):
    """One variant on one device: `plan(bound)` launches its kernels and returns the op's result."""

    def __init__(self, vid: str, launcher: Any, layout: OpLayout, device: torch.device, n_returns: int,
                 returns_list: bool):
        super().__init__(vid)
        self.module = launcher.module  # kept alive as long as the plan
        index = {n: i for i, n in enumerate(layout.names)}
        self.device = device
        self.device_index = device.index if device.index is not None else 0
        # Outputs: (shape, stride, dtype) to allocate, or the index of the argument a return aliases.
        self.outputs: list[tuple] = []
        for spec, alias in zip(launcher.output_specs, launcher.aliases):
            if alias is not None:
                self.outputs.append((index[alias],))
            else:
                self.outputs.append((tuple(spec["shape"]), tuple(spec["stride"]), getattr(torch, spec["dtype"])))
        self.workspaces = [(max(1, n), zero) for _, n, zero in launcher.workspaces]
        self.launcher_workspaces = list(launcher.workspaces)
        ws_index = {name: j for j, (name, _, _) in enumerate(launcher.workspaces)}
        self.launch = _Driver.launcher()  # first: it decides how the launch arguments are packed (raw)
        self._stream_int: int | None = None
        self._stream_arg: Any = None
        self.launches = []
        for ln in launcher.launches:
            ptrs = []
            for v, ref in zip(ln.values, ln.refs):
                if ref is None:
                    continue
                kind = ref[0]
                if kind == "input":
                    ptrs.append((v, 0, index[ref[1]], 0))
                elif kind == "list":
                    ptrs.append((v, 1, index[ref[1]], ref[2]))
                elif kind == "output":
                    ptrs.append((v, 2, ref[1], 0))
                elif kind == "workspace":
                    ptrs.append((v, 3, ws_index[ref[1]], 0))
                # ('null',) stays 0
            fn = ctypes.c_void_p(int(ln.fn)) if _Driver.raw else int(ln.fn)
            params = ctypes.addressof(ln.params)
            head = (fn, *(int(x) for x in ln.grid), *(int(x) for x in ln.block), int(ln.shared))
            how = _Driver.cooperative_launcher() if ln.cooperative else self.launch
            self.launches.append((head, ptrs, ctypes.c_void_p(params) if _Driver.raw else params, ln, how))
        self.n_returns = n_returns
        self.returns_list = returns_list
        self._empty: list[Any] | None = None  # made on first use (on the device, inside the caller's context)
        self._no_empty = [None] * len(self.outputs)
        self.prefill: Any = None  # confirm/--verify only: poison fresh outputs (or stale answers: per_output)
        self.lock = threading.Lock()  # the parameter buffers are shared: one launch sequence at a time
        self.raw_stream = torch._C._cuda_getCurrentRawStream
        self.current_device = torch._C._cuda_getDevice

    def _empty_outputs(self) -> list[Any]:
        """Per output: a zero-element tensor made once (nothing to write, e.g. batch_norm's saved
        statistics in inference), else None (allocated per call)."""
        cache = []
        for o in self.outputs:
            if len(o) == 3 and 0 in o[0]:
                cache.append(torch.empty_strided(o[0], o[1], dtype=o[2], device=self.device))
            else:
                cache.append(None)
        return cache

    def __call__(self, bound: Any) -> Any:
        if self.current_device() != self.device_index:
            # The launch runs in the calling thread's current context: make it this variant's device
            # (a model on cuda:1 called while cuda:0 is current), as PyTorch's own kernels do.
            with torch.cuda.device(self.device_index):
                return self(bound)
        dev = self.device
        # Shared zero-element outputs only where autograd cannot attach history to them.
        empty = self._empty if not _grad_enabled() else self._no_empty
        if empty is None:
            empty = self._empty = self._empty_outputs()
        outs = [e if e is not None else torch.empty_strided(o[0], o[1], dtype=o[2], device=dev) if len(o) == 3
                else bound[o[0]] for o, e in zip(self.outputs, empty)]
        if self.prefill is not None:
            from engine.launch.launcher import per_output, prefill_

            for i, (o, t) in enumerate(zip(self.outputs, outs)):
                if len(o) == 3:
                    prefill_(t, per_output(self.prefill, i))
        ws = []
        for n, zero in self.workspaces:
            buf = torch.empty(n, dtype=torch.uint8, device=dev)
            if zero:
                buf.zero_()
            ws.append(buf)
        stream = self.raw_stream(self.device_index)
        if _Driver.raw:  # one c_void_p per stream handle, reused while the stream stays the same
            if stream != self._stream_int:
                self._stream_int, self._stream_arg = stream, ctypes.c_void_p(stream)
            stream = self._stream_arg
        with self.lock:
            for head, ptrs, params, _, launch in self.launches:
                for v, kind, i, j in ptrs:
                    if kind == 0:
                        t = bound[i]
                        v.value = 0 if t is None else t.data_ptr()
                    elif kind == 1:
                        t = bound[i][j]
                        v.value = 0 if t is None else t.data_ptr()
                    elif kind == 2:
                        v.value = outs[i].data_ptr()
                    else:
                        v.value = ws[i].data_ptr()
                err = launch(*head, stream, params, None)
                if err:
                    raise RuntimeError(f"kforge cast: the kernel launch failed for variant {self.vid} "
                                       f"(CUresult {err})")
        if self.returns_list:
            return outs
        return outs[0] if self.n_returns == 1 else tuple(outs)


def make_plan(vid: str, variant: dict[str, Any], image: bytes, layout: OpLayout, device: torch.device,
              max_shared: int) -> KernelPlan:
    """Load the module, resolve the spec for the variant's signature, and prepare the launches.

    Raises engine.launch.SpecError, engine.launch.launcher.LaunchRejected or a driver error.
    """
    from engine.launch import Env, SpecError, parse_spec, resolve
    from engine.launch import cuda_driver as drv
    from engine.launch.launcher import CandidateLauncher

    spec = parse_spec(variant["launch_spec"])
    named = variant.get("kernels") or []
    for i, ln in enumerate(spec.launches):  # the manifest's kernels are what a sanitizer finding is held against
        if ln.kernel not in named:
            raise SpecError(f"launches kernel {ln.kernel!r}, which the variant's kernels ({', '.join(named) or 'none'})"
                            f" do not name", f"launch[{i}].kernel")
    resolved = resolve(spec, Env.from_card(variant["signature"], variant["outputs"]), max_shared=max_shared)
    module = drv.Module(image)
    launcher = CandidateLauncher(module, resolved, variant["op"], variant["outputs"], device, max_shared=max_shared)
    if launcher.op is None:  # a chain card: its outputs, as a list (what module and pattern routes take)
        return KernelPlan(vid, launcher, layout, device, len(variant["outputs"]), True)
    returns = launcher.op._schema.returns
    returns_list = len(returns) == 1 and str(returns[0].type).startswith("List[")
    return KernelPlan(vid, launcher, layout, device, len(returns), returns_list)
