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
