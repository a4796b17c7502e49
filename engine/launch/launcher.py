"""Turns a compiled candidate plus its resolved launch spec into a callable op: our host code, not theirs.

Outputs are allocated to eager's exact shape, strides and dtype (pre-filled so unwritten elements
show); returns that alias an input (in-place `self`, `out=`) are that input. A chain card
(`engine.capture.chains.CHAIN_OP`) has no schema: its inputs are `in0..inN`, its outputs `out0..` in the
order of the chain's outputs, each a buffer of its own (an input a member writes in place, `relu_` on an activation,
is the kernel's to write as eager does; engine.capture.chains.chain_written_inputs). Every call fetches the
current raw stream, so the kernels run where the caller's work runs (also under CUDA-graph capture).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.capture.chains import CHAIN_OP
from engine.launch import ResolvedSpec, StaleWorkspacesKept, WorkspacesKept
from engine.launch import cuda_driver as drv
from engine.ops import resolve_op, return_aliases, write_only_args, written_aliases

_CTYPES = {"ptr": ctypes.c_void_p, "i32": ctypes.c_int32, "i64": ctypes.c_int64, "u32": ctypes.c_uint32,
           "u64": ctypes.c_uint64, "f32": ctypes.c_float, "f64": ctypes.c_double}


class LaunchRejected(Exception):
    """The candidate cannot be launched as specified (missing kernel, too many threads, too much
    shared memory, a launch the driver refuses). The context stays healthy."""


def prefill_(t: torch.Tensor, how: Any) -> None:
    """Fill with NaN (floats) or a byte pattern (integers), or a finite sentinel for the second pass; a tensor
    `how` (a stale answer: an output of another input set) is copied in where its shape and dtype are the
    output's, else the sentinel."""
    if t.numel() == 0:
        return
    if isinstance(how, torch.Tensor):
        if how.shape == t.shape and how.dtype == t.dtype:
            t.copy_(how)
            return
        how = "sentinel"
    if how == "nan" and (t.is_floating_point() or t.is_complex()):
        t.fill_(float("nan"))
    elif how == "nan":
        t.fill_(-1 if t.dtype != torch.bool else True)
    elif t.is_floating_point():
        t.fill_(-1234.5 if t.dtype != torch.float16 else -123.25)
    else:
        t.fill_(7 if t.dtype != torch.bool else False)


# A workspace's bytes before a checked or timed call that does not ask for it zeroed: 0xFF (NaN in every float
# format) with the NaN prefill; with a stale prefill (another input set's answers in the outputs, as a model's
# buffers hold earlier results) the bytes of the first stale answer, repeated, as a model's workspace holds some
# earlier tensor's values; random bytes otherwise (a generator of the launcher's own, seeded from the OS). Two
# runs on one input set find different contents, and no run finds every entry alike: a kernel that relies on
# its entries starting equal (counting arrivals from entry 0's value instead of zeroing the counters) fails, as
# it would in a model, whose workspaces hold what the last call left. A kernel that computes honestly only where
# its workspace looks poisoned (NaN, or bytes no tensor of values holds) is met with one that does not, on the
# calls whose outputs hold stale answers, which every check and the audits of timed calls have.
WORKSPACE_NAN = 0xFF
_POISON_GENERATORS: dict[torch.device, torch.Generator] = {}


def poison_workspace_(buf: torch.Tensor, nan: bool, like: torch.Tensor | None = None) -> None:
    """Fill a workspace (uint8) with 0xFF where `nan`, else with the bytes of `like` repeated (a tensor of
    values, e.g. a stale answer), else with random bytes."""
    if nan:
        buf.fill_(WORKSPACE_NAN)
        return
    if like is not None and like.numel() and like.device == buf.device:
        src, n = like.detach().contiguous().view(-1).view(torch.uint8), buf.numel()
        k = min(src.numel(), n)
        buf[:k].copy_(src[:k])
        while k < n:   # doubling: log2(n / k) copies, no temporary
            m = min(k, n - k)
            buf[k:k + m].copy_(buf[:m])
            k += m
        return
    gen = _POISON_GENERATORS.get(buf.device)
    if gen is None:
        gen = torch.Generator(device=buf.device).manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        _POISON_GENERATORS[buf.device] = gen
    # int64 draws over the whole range (no modulo: a uint8 draw costs an emulated 64-bit modulo per byte on the
    # GPU, several times a fill), the few bytes past the last whole 8 as bytes
    n8 = buf.numel() // 8 if buf.is_contiguous() and buf.data_ptr() % 8 == 0 else 0
    if n8:
        buf[:8 * n8].view(torch.int64).random_(-2 ** 63, None, generator=gen)
    if buf.numel() > 8 * n8:
        buf[8 * n8:].random_(0, 256, generator=gen)


def per_output(prefill: Any, i: int) -> Any:
    """Output i's prefill: the string for every output, or item i of a list of stale answers (the sentinel
    past its end)."""
    if isinstance(prefill, str):
        return prefill
    return prefill[i] if i < len(prefill) else "sentinel"


@dataclass
class _Launch:
    fn: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    values: list[Any]  # ctypes objects, pointer ones updated per call
    refs: list[tuple | None]  # pointer reference per value, None for scalars
    params: Any  # ctypes array of void* to `values`
    cooperative: bool = False
    spread_shared: int = 0  # dynamic shared memory of a spread launch (CandidateLauncher.spread); 0: none


def spread_shared(dynamic: int, static: int, per_sm: int, per_block: int, blocks_per_sm: int = 1) -> int:
    """Dynamic shared memory for a launch of which at most `blocks_per_sm` blocks fit on an SM at once: each block
    takes the largest share of the SM's shared memory of which that many fit (1 KB of each reserved by the GPU,
    the kernel's static part counted, rounded down to 128 B, at most a block's). Never less than `dynamic`, the
    launch's own (its blocks may already be that few)."""
    share = min(per_block, per_sm // max(1, blocks_per_sm) - 1024) // 128 * 128
    return max(dynamic, share - static)


class CandidateLauncher:
    """Callable candidate for one card: `run(args) -> outputs` with the op's argument list (a chain
    card's `in0..inN`). `op` is the resolved ATen overload, None for a chain card."""

    def __init__(self, module: drv.Module, spec: ResolvedSpec, op_name: str, outputs: Sequence[dict],
                 device: torch.device, max_shared: int | None = None, canaries: Any = None,
                 shared_per_sm: int | None = None):
        self.module = module
        self.device = device
        # While set, launches run spread out: one block per SM at most (padded with dynamic shared memory the kernel
        # does not use), so a grid larger than the SMs runs in waves and a block that waits a fixed time for
        # another block's result reads it before it exists, as on a GPU other work holds. Cooperative launches
        # and clusters (whose blocks must be resident together) run as asked. Where shared_per_sm is unknown: none.
        self.spread = False
        # When set (an engine.verify.guard.Canaries), outputs and workspaces are guarded buffers from it.
        self.canaries = canaries
        self.output_specs = list(outputs)
        if op_name == CHAIN_OP:
            self.op = None  # no ATen schema: nothing aliases an input, nothing is write-only
            self.aliases: list[str | None] = [None] * len(self.output_specs)
            self.write_only: list[str] = []
        else:
            self.op = resolve_op(op_name)
            self.aliases = return_aliases(self.op)
            if len(self.aliases) != len(self.output_specs) and not any(self.aliases):
                # a `Tensor[]` return (unsafe_split, an LSTM cell's gates; _foreach_mul): one output per tensor of the
                # list, none an input. Zipped with the one return, every such candidate returned one output of many.
                self.aliases = [None] * len(self.output_specs)
            self.write_only = write_only_args(self.op)
        self.workspaces = spec.workspaces
        self._kept: dict[str, tuple[torch.Tensor, Any]] | None = None   # (prepare: WorkspacesKept)
        self.launches: list[_Launch] = []
        for i, rl in enumerate(spec.launches):
            try:
                fn = module.function(rl.kernel)
            except drv.DriverError as e:
                raise LaunchRejected(f"launch[{i}]: kernel '{rl.kernel}' not found in the compiled module "
                                     f"(is it extern \"C\" __global__?): {e.name}") from None
            threads = rl.block[0] * rl.block[1] * rl.block[2]
            limit = drv.function_attribute(fn, "CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK")
            if threads > limit:
                regs = drv.function_attribute(fn, "CU_FUNC_ATTRIBUTE_NUM_REGS")
                raise LaunchRejected(f"launch[{i}] ({rl.kernel}): {threads} threads per block, but with "
                                     f"{regs} registers per thread at most {limit} fit")
            static = drv.function_attribute(fn, "CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES")
            if max_shared is not None and rl.shared + static > max_shared:
                raise LaunchRejected(f"launch[{i}] ({rl.kernel}): {rl.shared} B dynamic + {static} B static "
                                     f"shared memory exceed the {max_shared} B per block this GPU has")
            if rl.shared > 48 * 1024:
                try:
                    drv.set_max_dynamic_shared(fn, rl.shared)
                except drv.DriverError as e:
                    raise LaunchRejected(f"launch[{i}] ({rl.kernel}): cannot use {rl.shared} B of dynamic "
                                         f"shared memory: {e.name}") from None
            cluster = _allow_large_cluster(fn)
            spread = 0
            # (a launch whose blocks cannot share an SM already runs as asked)
            if shared_per_sm and max_shared and not rl.cooperative and cluster == 1 \
                    and 2 * (static + rl.shared + 1024) <= shared_per_sm:
                spread = spread_shared(rl.shared, static, shared_per_sm, max_shared)
            values, refs = [], []
            for a in rl.args:
                if a.ctype == "ptr":
                    values.append(ctypes.c_void_p(0))
                    refs.append(a.value)
                else:
                    values.append(_CTYPES[a.ctype](a.value))
                    refs.append(None)
            params = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
            self.launches.append(_Launch(fn, rl.grid, rl.block, rl.shared, values, refs, params, rl.cooperative,
                                         spread if spread > rl.shared else 0))

    def allocate_outputs(self, args: dict[str, Any], prefill: Any) -> list[torch.Tensor]:
        outs = []
        for i, (spec, alias) in enumerate(zip(self.output_specs, self.aliases)):
            if alias is not None:
                outs.append(args[alias])
                continue
            dtype = getattr(torch, spec["dtype"])
            if self.canaries is not None:
                t = self.canaries.empty_strided(spec["shape"], spec["stride"], dtype, name=f"out{i}")
            else:
                t = torch.empty_strided(spec["shape"], spec["stride"], dtype=dtype, device=self.device)
            if prefill is not None and len(prefill):
                prefill_(t, per_output(prefill, i))
            outs.append(t)
        if prefill is not None and len(prefill):
            for name in self.write_only:
                # not an `out=` that shares bytes with an input (`torch.add(a, b, out=a)`): poisoned, it held the
                # input's values no more, and an honest kernel read NaN where it read `a`
                if isinstance(args.get(name), torch.Tensor) and not written_aliases(list(args.items()), {name}):
                    prefill_(args[name], prefill if isinstance(prefill, str) else "sentinel")
        return outs

    def prepare(self, bound: Sequence[tuple[str, Any]], prefill: Any = None) -> Callable[[], list[torch.Tensor]]:
        """Allocate (and pre-fill) the outputs and workspaces; returns the launch of every kernel in order
        on the current stream (workspaces marked `zero` are zeroed there: that is part of the work)."""
        args = dict(bound)
        # WorkspacesKept: the workspaces the last call so marked held, as it left them (canaries tracked
        # again); any other prefill lets them go
        keep = isinstance(prefill, (WorkspacesKept, StaleWorkspacesKept))
        kept = self._kept if keep else None
        self._kept = {} if keep else None
        try:
            outs = self.allocate_outputs(args, prefill)
            ws = {}
            for name, nbytes, zero in self.workspaces:
                if kept and name in kept:
                    buf, region = kept[name]
                    if region is not None and self.canaries is not None:
                        self.canaries.regions.append(region)
                    ws[name] = (buf, zero)
                    self._kept[name] = (buf, region)
                    continue
                region = None
                if self.canaries is not None:
                    buf = self.canaries.buffer(max(1, nbytes), name=f"workspace {name!r}")
                    region = self.canaries.regions[-1]
                else:
                    buf = torch.empty(max(1, nbytes), dtype=torch.uint8, device=self.device)
                if self._kept is not None:
                    self._kept[name] = (buf, region)
                if prefill is not None and not zero:
                    # What the kernel finds there is not its to rely on: fresh memory from the driver often
                    # reads zeros (a kernel accumulating into a workspace it never zeroed passed), and a block
                    # the allocator hands back holds the last call's state. Poisoned unlike from call to call, and unlike from entry to entry.
                    stale = next((t for t in prefill if isinstance(t, torch.Tensor)), None) \
                        if isinstance(prefill, (list, tuple)) else None
                    poison_workspace_(buf, isinstance(prefill, str) and prefill == "nan", like=stale)
                ws[name] = (buf, zero)
        except RuntimeError as e:  # torch.OutOfMemoryError is one
            if not _out_of_memory(e):
                raise
            sizes = ", ".join(f"{name} = {nbytes} B" for name, nbytes, _ in self.workspaces) or "none"
            raise LaunchRejected(f"out of memory allocating the outputs and workspaces (workspaces: {sizes}): "
                                 f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        return lambda: self._launch(args, outs, ws)

    def _launch(self, args: dict[str, Any], outs: list[torch.Tensor], ws: dict[str, tuple[torch.Tensor, bool]]
                ) -> list[torch.Tensor]:
        for buf, zero in ws.values():
            if zero:
                buf.zero_()
        stream = torch._C._cuda_getCurrentRawStream(self.device.index)
        for ln in self.launches:
            for v, ref in zip(ln.values, ln.refs):
                if ref is not None:
                    v.value = _pointer(ref, args, outs, ws)
            if self.spread and ln.spread_shared and _spread_launch(ln, stream):
                continue
            try:
                drv.launch(ln.fn, ln.grid, ln.block, ln.shared, stream, ctypes.addressof(ln.params), ln.cooperative)
            except drv.DriverError as e:
                if e.name in drv.STICKY:
                    raise
                how = "cuLaunchCooperativeKernel" if ln.cooperative else "cuLaunchKernel"
                raise LaunchRejected(f"{how} refused the launch: {e.name} ({e.text})") from None
        return outs

    def run(self, bound: Sequence[tuple[str, Any]], prefill: Any = None) -> list[torch.Tensor]:
        """Allocate outputs and workspaces, then launch every kernel in order on the current stream."""
        return self.prepare(bound, prefill)()


def _out_of_memory(e: BaseException) -> bool:
    """An allocation that failed for want of memory (CUDA's caching allocator, or the host's)."""
    text = str(e)
    return isinstance(e, torch.OutOfMemoryError) or any(
        s in text for s in ("out of memory", "can't allocate memory", "not enough memory"))


def _allow_large_cluster(fn: object) -> int:
    """A kernel compiled with __cluster_dims__ of more than 8 blocks (sm_90's portable limit) launches
    only once it opts in to non-portable cluster sizes; the launch itself reports a size that does not fit.
    The cluster's size in blocks (1: none; 0: unknown, older drivers and bindings)."""
    try:
        size = 1
        for axis in ("WIDTH", "HEIGHT", "DEPTH"):
            size *= max(1, drv.function_attribute(fn, f"CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_{axis}"))
        if size > 8:
            drv.set_function_attribute(fn, "CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED", 1)
        return size
    except (drv.DriverError, AttributeError):
        return 0  # older drivers/bindings: the launch reports what does not work


def _spread_launch(ln: _Launch, stream: int) -> bool:
    """`ln` launched with `ln.spread_shared` bytes of dynamic shared memory, its limit raised for that launch and
    put back after it. False where the driver refused (nothing launched): the caller launches it as asked, so a
    spread run never rejects a kernel the GPU would run."""
    try:
        # the limit as it stands (a kernel launched twice with different amounts has the larger one's)
        limit = drv.function_attribute(ln.fn, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES")
        drv.set_max_dynamic_shared(ln.fn, ln.spread_shared)
        try:
            drv.launch(ln.fn, ln.grid, ln.block, ln.spread_shared, stream, ctypes.addressof(ln.params), False)
        finally:
            drv.set_max_dynamic_shared(ln.fn, limit)
        return True
    except drv.DriverError as e:
        if e.name in drv.STICKY:
            raise
        return False


def _pointer(ref: tuple, args: dict[str, Any], outs: list[torch.Tensor], ws: dict[str, tuple[torch.Tensor, bool]]
             ) -> int:
    kind = ref[0]
    if kind == "input":
        t = args[ref[1]]
        return 0 if t is None else t.data_ptr()
    if kind == "output":
        return outs[ref[1]].data_ptr()
    if kind == "workspace":
        return ws[ref[1]][0].data_ptr()
    if kind == "list":
        t = args[ref[1]][ref[2]]
        return 0 if t is None else t.data_ptr()
    return 0  # ("null",)
