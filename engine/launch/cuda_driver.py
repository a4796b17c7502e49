"""Thin, checked access to the CUDA driver API through `cuda.bindings` (modules, functions, launches)."""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver as cu


class DriverError(RuntimeError):
    """A CUDA driver call failed; `name` is the CUresult name (e.g. CUDA_ERROR_ILLEGAL_ADDRESS)."""

    def __init__(self, call: str, code: Any):
        err, name = cu.cuGetErrorName(code)
        self.name = name.decode() if err == cu.CUresult.CUDA_SUCCESS else str(code)
        err, text = cu.cuGetErrorString(code)
        self.text = text.decode() if err == cu.CUresult.CUDA_SUCCESS else ""
        self.code = int(code)
        super().__init__(f"{call}: {self.name} ({self.text})")


# Errors after which the context is unusable: the worker must be replaced.
STICKY = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ASSERT", "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_ECC_UNCORRECTABLE", "CUDA_ERROR_CONTAINED", "CUDA_ERROR_TENSOR_MEMORY_LEAK",
    "CUDA_ERROR_UNKNOWN",
})


def check(call: str, result: tuple | Any) -> Any:
    """Unpack a cuda.bindings result tuple, raising DriverError on failure."""
    if isinstance(result, tuple):
        code, rest = result[0], result[1:]
    else:
        code, rest = result, ()
    if code != cu.CUresult.CUDA_SUCCESS:
        raise DriverError(call, code)
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def init() -> None:
    check("cuInit", cu.cuInit(0))


class Module:
    """A loaded cubin (or PTX, JIT-compiled by the driver when the cubin's arch does not match)."""

    def __init__(self, image: bytes):
        self.handle = check("cuModuleLoadData", cu.cuModuleLoadData(image))
        self._functions: dict[str, Any] = {}

    def function(self, name: str) -> Any:
        f = self._functions.get(name)
        if f is None:
            f = check(f"cuModuleGetFunction({name})", cu.cuModuleGetFunction(self.handle, name.encode()))
            self._functions[name] = f
        return f

    def unload(self) -> None:
        if self.handle is not None:
            cu.cuModuleUnload(self.handle)
            self.handle = None


def function_attribute(f: Any, attr: str) -> int:
    return check("cuFuncGetAttribute", cu.cuFuncGetAttribute(getattr(cu.CUfunction_attribute, attr), f))


def set_max_dynamic_shared(f: Any, nbytes: int) -> None:
    check("cuFuncSetAttribute", cu.cuFuncSetAttribute(
        f, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes))


def set_function_attribute(f: Any, attr: str, value: int) -> None:
    check("cuFuncSetAttribute", cu.cuFuncSetAttribute(f, getattr(cu.CUfunction_attribute, attr), value))


def launch(f: Any, grid: tuple[int, int, int], block: tuple[int, int, int], shared: int, stream: int,
           params_address: int, cooperative: bool = False) -> None:
    if cooperative:  # every block resident at once, or CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
        check("cuLaunchCooperativeKernel",
              cu.cuLaunchCooperativeKernel(f, *grid, *block, shared, stream, params_address))
        return
    check("cuLaunchKernel", cu.cuLaunchKernel(f, *grid, *block, shared, stream, params_address, 0))


def nonblocking_stream() -> int:
    """A new stream of the current context that never waits for the legacy default stream (stream 0, where
    torch's default stream runs) nor makes it wait: work on the two may run at the same time. Lives as long as
    the process."""
    return int(check("cuStreamCreate", cu.cuStreamCreate(int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))))


def device_attribute(attr: str, device: int) -> int:
    return check("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(getattr(cu.CUdevice_attribute, attr), device))
