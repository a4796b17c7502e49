"""The CPU emulation's reading of inline PTX (tests/cuda_emulator.py, `_plain_asm`): a global load or store
with cache qualifiers is a plain memory access to the CPU; other asm is left as written (and fails to
build, so the emulation never runs something it does not understand)."""

from __future__ import annotations

from cuda_emulator import _plain_asm


def test_global_loads_and_stores_with_cache_hints_become_plain_accesses():
    src = ('asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"\n'
           '             : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));\n'
           'asm volatile("st.global.cs.v2.f32 [%0], {%1, %2};" :: "l"(q + i), "f"(a), "f"(b) : "memory");\n'
           'asm("ld.global.b16 %0, [%1];" : "=h"(h) : "l"(src));\n')
    got = _plain_asm(src)
    assert "asm" not in got
    assert "(r.x) = ((const unsigned*)(p))[0];" in got and "(r.w) = ((const unsigned*)(p))[3];" in got
    assert "((float*)(q + i))[0] = (float)(a);" in got and "((float*)(q + i))[1] = (float)(b);" in got
    assert "(h) = ((const unsigned short*)(src))[0];" in got


def test_other_inline_ptx_is_left_as_written():
    src = 'asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));\nasm("bar.sync 0;");\n'
    assert _plain_asm(src) == src


def test_two_runs_of_a_kernel_missing_a_barrier_differ_and_with_it_agree(tmp_path):
    """The emulation runs a block's threads as fibers in a fixed order, and every other run of a program in the
    reverse order: a kernel that reads what another thread writes without a barrier between (a race on the GPU)
    gives its two runs different outputs, where one run in one order would look deterministic."""
    from types import SimpleNamespace

    import cuda_emulator as emu
    import pytest
    import torch

    if not emu.available():
        pytest.skip("g++ is needed for the CUDA-on-CPU emulation")
    src = ('extern "C" __global__ void k(float* out) {\n  __shared__ float s[2];\n  s[threadIdx.x] = threadIdx.x + 1.0f;\n'
           '  SYNC\n  out[threadIdx.x] = s[1 - threadIdx.x];\n}\n')
    launch = SimpleNamespace(args=[SimpleNamespace(ctype="ptr", value=("output", 0))], grid=(1, 1, 1),
                             block=(2, 1, 1), kernel="k", shared=0, cooperative=False)
    spec = SimpleNamespace(launches=[launch], workspaces=[])
    program = emu.build([(src.replace("SYNC", ""), spec), (src.replace("SYNC", "__syncthreads();"), spec)], tmp_path)
    runs = {case: [emu.run(program, case, spec, {}, [torch.full((2,), float("nan"))], tmp_path).outputs[0].tolist()
                   for _ in range(2)] for case in (0, 1)}
    assert runs[0][0] != runs[0][1], runs          # the race shows between the two runs
    assert runs[1] == [[2.0, 1.0], [2.0, 1.0]]     # with the barrier: the same, and right, both times
