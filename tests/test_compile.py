"""The compiler (engine.compile): NVRTC and nvcc to cubin + PTX, diagnostics, cache, pool. CPU only."""

import asyncio
import json
from functools import cache

import pytest

from engine.compile import (
    CompilePool,
    Compiler,
    CompilerUnavailable,
    compile_nvcc,
    compile_nvrtc,
    find_headers,
    normalize_arch,
    nvrtc_headers,
    parse_log,
    summarize,
)
from engine.compile import cache as cache_mod
from engine.compile import nvcc as nvcc_mod
from engine.compile import nvrtc as nvrtc_mod

ARCH = "sm_90"
ELF = b"\x7fELF"

FP32 = r'''
extern "C" __global__ void add_f32(const float* __restrict__ a, const float* __restrict__ b,
                                   float* __restrict__ out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
'''

FP16 = r'''
#include <cuda_fp16.h>
extern "C" __global__ void scale_add_h2(const __half2* a, const __half2* b, __half2* out, float s, int n2) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n2) out[i] = __hfma2(a[i], __float2half2_rn(s), b[i]);
}
'''

BF16 = r'''
#include <cuda_bf16.h>
extern "C" __global__ void mul_bf162(const __nv_bfloat162* a, const __nv_bfloat162* b,
                                     __nv_bfloat162* out, int n2) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n2) out[i] = __hmul2(a[i], b[i]);
}
'''

CUB = r'''
#include <cub/cub.cuh>
extern "C" __global__ void row_sum(const float* x, float* out, int cols) {
  using BlockReduce = cub::BlockReduce<float, 256>;
  __shared__ typename BlockReduce::TempStorage tmp;
  const float* row = x + (size_t)blockIdx.x * cols;
  float acc = 0.f;
  for (int c = threadIdx.x; c < cols; c += 256) acc += row[c];
  float total = BlockReduce(tmp).Sum(acc);
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}
'''

DYN_SMEM = r'''
extern "C" __global__ void reverse_block(const float* in, float* out, int n) {
  extern __shared__ float buf[];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  buf[threadIdx.x] = i < n ? in[i] : 0.f;
  __syncthreads();
  int j = blockIdx.x * blockDim.x + (blockDim.x - 1 - threadIdx.x);
  if (j < n) out[j] = buf[threadIdx.x];
}
'''

KERNELS = {"fp32": (FP32, ("add_f32",)), "fp16": (FP16, ("scale_add_h2",)), "bf16": (BF16, ("mul_bf162",)),
           "cub": (CUB, ("row_sum",)), "dyn_smem": (DYN_SMEM, ("reverse_block",))}

TWO_PLUS_MANGLED = r'''
__device__ __noinline__ float twice(float v) { return 2.f * v; }
extern "C" __global__ void first(float* a) { a[0] = twice(a[1]); }
extern "C" __global__ void second(float* a) { a[0] = twice(a[2]); }
__global__ void cpp_linkage(float* a) { a[0] = 3.f; }
'''

SYNTAX_ERROR = '''extern "C" __global__ void k(float* a, int n) {
  int i = threadIdx.x;
  if (i < n) {
    a[i] = a[i] * 2.0f
  }
}
'''  # the missing ';' is reported at the '}' on line 5

UNDEFINED = '''#include <cuda_fp16.h>

extern "C" __global__ void k(__half* a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] = __float2half(scale * __half2float(a[i]));
}
'''

BAD_ASM = '''extern "C" __global__ void k(float* a) {
  float x;
  asm volatile("mov.b32 %0, %1, %1;" : "=f"(x) : "f"(a[0]));
  a[1] = x;
}
'''

TOO_MUCH_SMEM = '''extern "C" __global__ void k(float* a) {
  __shared__ float s[70000];
  s[threadIdx.x] = a[threadIdx.x];
  __syncthreads();
  a[threadIdx.x] = s[threadIdx.x + 1];
}
'''

STD_HEADERS = r'''
#include <cstdint>
#include <type_traits>
#include <limits>
#include <cmath>
#include <cfloat>
#include <algorithm>
extern "C" __global__ void clampk(float* a, int64_t n) {
  static_assert(std::is_same<int32_t, std::int32_t>::value, "");
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] = std::min(std::max(a[i], -FLT_MAX), std::numeric_limits<float>::max()) + (float)M_PI;
}
'''


@cache
def nvrtc_result(key):
    return compile_nvrtc(KERNELS[key][0], arch=ARCH)


@cache
def nvcc_result(key):
    return compile_nvcc(KERNELS[key][0], arch=ARCH)


def _have_nvcc():
    try:
        nvcc_mod.find_nvcc()
        return True
    except CompilerUnavailable:
        return False


needs_nvcc = pytest.mark.skipif(not _have_nvcc(), reason="nvcc not installed")


def _check_artifacts(res, expected):
    assert res.ok, res.log
    assert res.cubin is not None and res.cubin.startswith(ELF)
    assert res.ptx is not None and ".target sm_90" in res.ptx
    for name in expected:
        assert f".entry {name}(" in res.ptx
    assert res.kernels == expected
    assert res.arch == ARCH and len(res.source_hash) == 64 and not res.cached


# ------------------------------------------------------------------------------------------------- NVRTC

@pytest.mark.parametrize("key", list(KERNELS))
def test_nvrtc_compiles_representative_kernels(key):
    res = nvrtc_result(key)
    _check_artifacts(res, KERNELS[key][1])
    assert res.compiler == "nvrtc"
    assert not [d for d in res.diagnostics if d.severity == "error"]


def test_nvrtc_kernels_lists_only_extern_c_entries():
    res = compile_nvrtc(TWO_PLUS_MANGLED, arch=ARCH)
    assert res.ok, res.log
    assert res.kernels == ("first", "second")
    remarks = [d for d in res.diagnostics if d.code == "not-extern-c"]
    assert len(remarks) == 1 and "extern \"C\"" in remarks[0].message
    # the cubin's own symbol table agrees with the PTX
    assert set(nvrtc_mod.entry_points(None, res.cubin)) == {"first", "second"}


def test_no_launchable_kernel_warns():
    res = compile_nvrtc("__global__ void only_cpp(float* a) { a[0] = 1.f; }\n", arch=ARCH)
    assert res.ok and res.kernels == ()
    assert [d.code for d in res.diagnostics] == ["not-extern-c", "no-kernel"]
    assert "nothing can be launched" in res.summary()


def test_nvrtc_syntax_error_line():
    res = compile_nvrtc(SYNTAX_ERROR, arch=ARCH)
    assert not res.ok and res.cubin is None and res.kernels == ()
    (err,) = res.errors
    assert (err.file, err.line, err.severity) == ("candidate.cu", 5, "error")
    assert 'expected a ";"' in err.message
    assert "^" in err.context


def test_nvrtc_undefined_identifier_line():
    res = compile_nvrtc(UNDEFINED, arch=ARCH, name="op.cu")
    assert not res.ok
    (err,) = res.errors
    assert (err.file, err.line) == ("op.cu", 5)
    assert 'identifier "scale" is undefined' in err.message
    assert "__float2half(scale" in err.context
    assert "op.cu:5: error: identifier \"scale\" is undefined" in res.summary()


def test_nvrtc_inline_asm_error_maps_to_source_line():
    res = compile_nvrtc(BAD_ASM, arch=ARCH)
    assert not res.ok
    (err,) = res.errors
    assert (err.file, err.line, err.code) == ("candidate.cu", 3, "ptxas")
    assert "Arguments mismatch" in err.message and "mov.b32" in err.message


def test_nvrtc_ptxas_resource_error():
    res = compile_nvrtc(TOO_MUCH_SMEM, arch=ARCH)
    assert not res.ok
    (err,) = res.errors
    assert err.file == "ptxas" and err.line is None
    assert "too much shared data" in err.message


def test_nvrtc_std_headers_forward_to_libcudacxx():
    res = compile_nvrtc(STD_HEADERS, arch=ARCH)
    assert res.ok, res.log
    assert res.kernels == ("clampk",)


def test_nvrtc_warning_and_bad_option():
    res = compile_nvrtc('extern "C" __global__ void k(float* a) {\n  int unused = 3;\n  a[0] = 1;\n}\n', arch=ARCH)
    assert res.ok and res.warnings[0].line == 2 and res.warnings[0].code == "177-D"
    bad = compile_nvrtc(FP32, arch=ARCH, options=["--no-such-option"])
    assert not bad.ok and bad.errors[0].code == "invalid-option"


def test_nvrtc_other_archs_and_ptx_only():
    sm121 = compile_nvrtc(FP32, arch="sm_121")
    assert sm121.ok and sm121.cubin.startswith(ELF) and ".target sm_121" in sm121.ptx
    ptx_only = compile_nvrtc(FP32, arch="compute_90")
    assert ptx_only.ok and ptx_only.cubin is None and ptx_only.kernels == ("add_f32",)
    no_ptx = compile_nvrtc(FP32, arch=ARCH, want_ptx=False)
    assert no_ptx.ok and no_ptx.ptx is None and no_ptx.kernels == ("add_f32",)


def test_normalize_arch():
    assert normalize_arch("sm_90") == normalize_arch("90") == normalize_arch("9.0") == normalize_arch((9, 0)) == "sm_90"
    assert normalize_arch("sm_90a") == "sm_90a" and normalize_arch("sm121") == "sm_121"
    with pytest.raises(ValueError):
        normalize_arch("hopper")


def test_missing_nvrtc_is_compiler_unavailable(monkeypatch):
    def boom():
        raise ImportError("libnvrtc.so.13: cannot open shared object file")

    monkeypatch.setattr(nvrtc_mod, "_module", None)
    monkeypatch.setattr(nvrtc_mod, "_load_nvrtc", boom)
    with pytest.raises(CompilerUnavailable, match="nvidia-cuda-nvrtc"):
        compile_nvrtc(FP32, arch=ARCH)


def test_headers_found():
    hs = nvrtc_headers()
    assert hs.runtime_dir is not None and (hs.runtime_dir / "cuda_bf16.h").is_file()
    assert (hs.runtime_dir / "cuda_fp8.h").is_file()
    assert hs.cccl_dir is not None and (hs.cccl_dir / "cub" / "block" / "block_reduce.cuh").is_file()
    assert hs.problems == ()
    assert find_headers(nvrtc_mod.nvrtc_version()) == hs


# ------------------------------------------------------------------------------- state kept between calls

# A candidate that remembers (a memo, a call counter) or reads when and how it was launched can tell verification,
# timing and a user's model apart (red team, 2026-12-06g): refused at compile time, by both compilers.
REFUSED_STATE = {
    "call counter": ('__device__ unsigned int calls;\nextern "C" __global__ void k(float* o) '
                     '{ o[threadIdx.x] = (float)atomicAdd(&calls, 1u); }', "'calls'"),
    "memo": ('__device__ float memo[16];\nextern "C" __global__ void k(float* o, const float* x) '
             '{ if (x[0] == 1.f) o[0] = memo[0]; else { memo[0] = x[0] * 2; o[0] = memo[0]; } }', "'memo'"),
    "through a pointer": ('__device__ float memo[16];\nextern "C" __global__ void k(float* o, const float* x, int i) '
                          '{ float* p = memo + (i & 7); p[threadIdx.x & 7] += x[0]; o[0] = p[1]; }', "'memo'"),
    "through a call": ('__device__ float memo[16];\n__device__ __noinline__ void w(float* p, float v) { p[0] = v; }\n'
                       'extern "C" __global__ void k(float* o, const float* x) { w(memo, x[0]); o[0] = 1; }', "'memo'"),
    "pointer handed out": ('__device__ float memo[16];\nextern "C" __global__ void k(float** o) { o[0] = memo; }',
                           "'memo'"),
    "clocks": ('extern "C" __global__ void k(float* o) { unsigned long long t; '
               'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); o[threadIdx.x] = (float)(clock64() + t); }',
               "%clock64, %globaltimer"),
    "shared memory size": ('extern "C" __global__ void k(float* o) { unsigned d; '
                           'asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(d)); o[0] = d; }', "%dynamic_smem_size"),
}
ALLOWED_STATE = {
    "constant and read-only tables": '__device__ const float tab[4] = {1, 2, 3, 4};\n__constant__ float c[4] = '
                                     '{1, 2, 3, 4};\n__device__ float t2[4] = {1, 2, 3, 4};\nextern "C" __global__ '
                                     'void k(float* o, int i) { o[threadIdx.x] = c[threadIdx.x & 3] + tab[i & 3] '
                                     '* t2[(i + 1) & 3]; }',
}


@pytest.mark.parametrize("compiler", ["nvrtc", pytest.param("nvcc", marks=needs_nvcc)])
@pytest.mark.parametrize("case", list(REFUSED_STATE))
def test_a_kernel_that_keeps_state_between_calls_or_reads_clocks_does_not_compile(case, compiler):
    src, named = REFUSED_STATE[case]
    res = (compile_nvrtc if compiler == "nvrtc" else compile_nvcc)(src, arch=ARCH)
    assert not res.ok and res.cubin is None and res.kernels == ()
    (err,) = [d for d in res.errors if d.code == "forbidden"]
    assert named in err.message, err.message
    assert "workspace" in err.message or "launched" in err.message   # what to do instead, for a repair


@pytest.mark.parametrize("case", list(ALLOWED_STATE))
def test_tables_a_kernel_only_reads_and_cubs_own_constants_compile(case):
    res = compile_nvrtc(ALLOWED_STATE[case], arch=ARCH)
    assert res.ok, res.log + str(res.errors)
    assert nvrtc_result("cub").ok   # CUB and libcu++ declare hundreds of .global constants they never touch


# -------------------------------------------------------------------------------------------------- nvcc

@needs_nvcc
@pytest.mark.parametrize("key", list(KERNELS))
def test_nvcc_compiles_representative_kernels(key):
    res = nvcc_result(key)
    _check_artifacts(res, KERNELS[key][1])
    assert res.compiler == "nvcc"


@needs_nvcc
def test_nvcc_errors_have_source_lines():
    res = compile_nvcc(SYNTAX_ERROR, arch=ARCH)
    assert not res.ok and res.cubin is None
    (err,) = res.errors
    assert (err.file, err.line) == ("candidate.cu", 5)
    res = compile_nvcc(UNDEFINED, arch=ARCH)
    (err,) = res.errors
    assert (err.file, err.line) == ("candidate.cu", 5) and '"scale" is undefined' in err.message
    res = compile_nvcc(BAD_ASM, arch=ARCH)
    (err,) = res.errors
    assert (err.file, err.line, err.code) == ("candidate.cu", 3, "ptxas")


@needs_nvcc
def test_nvcc_timeout():
    res = compile_nvcc(FP32, arch=ARCH, timeout=0.001)
    assert not res.ok and res.errors[-1].code == "timeout"


def test_missing_nvcc_is_compiler_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(nvcc_mod, "FALLBACK_NVCC", ())
    with pytest.raises(CompilerUnavailable, match="nvcc not found"):
        compile_nvcc(FP32, arch=ARCH)


# ------------------------------------------------------------------------------------------- diagnostics

def test_parse_log_formats():
    log = (
        "/tmp/kforge-nvcc-x/candidate.cu(12): error #20: identifier \"x\" is undefined\n"
        "      y = x;\n"
        "          ^\n"
        "\n"
        "candidate.cu(3, 7): warning #177-D: variable \"u\" was declared but never referenced\n"
        "\n"
        "/usr/local/cuda/include/cccl/cub/block/block_reduce.cuh(400): error: no instance of overloaded function\n"
        "          detected during instantiation of \"T f<T>()\" at line 9 of candidate.cu\n"
        "\n"
        "ptxas error   : Entry function 'k' uses too much shared data (0x40000 bytes, 0xc000 max)\n"
        "ptxas info    : Used 10 registers\n"
        "nvlink error   : Undefined reference to '_Z3foov' in 'candidate.o'\n"
        "candidate.cu:4:2: error: #error \"boom\"\n"
        "2 errors detected in the compilation of \"candidate.cu\".\n"
    )
    ds = parse_log(log, source_name="candidate.cu")
    assert [(d.file, d.line, d.column, d.severity, d.code) for d in ds] == [
        ("candidate.cu", 12, None, "error", "20"),
        ("candidate.cu", 3, 7, "warning", "177-D"),
        ("/usr/local/cuda/include/cccl/cub/block/block_reduce.cuh", 400, None, "error", None),
        ("ptxas", None, None, "error", None),
        ("nvlink", None, None, "error", None),
        ("candidate.cu", 4, 2, "error", None),
    ]
    assert ds[0].context.splitlines()[-1].strip() == "^"
    assert "at line 9 of candidate.cu" in ds[2].context


def test_summarize_orders_and_limits():
    log = "".join(f"candidate.cu({i}): warning #177-D: unused {i}\n\n" for i in range(1, 4))
    log += "".join(f"candidate.cu({i}): error: bad {i}\n    code\n    ^\n\n" for i in range(10, 20))
    text = summarize(parse_log(log), limit=4)
    lines = text.splitlines()
    assert lines[0] == "candidate.cu:10: error: bad 10"
    assert text.count("error: bad") == 4 and "warning" not in text
    assert lines[-1] == "... and 9 more (6 errors)"
    assert summarize(()) == "no errors"


# ------------------------------------------------------------------------------------------------- cache

def _counting(monkeypatch):
    calls = []
    real = cache_mod.compile_source

    def counted(*a, **kw):
        calls.append(kw.get("arch"))
        return real(*a, **kw)

    monkeypatch.setattr(cache_mod, "compile_source", counted)
    return calls


def test_cache_hit_memory_and_disk(tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    cc = Compiler(tmp_path / "cache" / "compile", "nvrtc", arch=ARCH)
    first = cc.compile(FP32)
    assert first.ok and not first.cached and len(calls) == 1
    second = cc.compile(FP32)
    assert second.cached and second.cubin == first.cubin and len(calls) == 1
    assert cc.stats.memory_hits == 1
    # a fresh Compiler on the same dir reads the disk entry
    cc2 = Compiler(tmp_path / "cache" / "compile", "nvrtc", arch=ARCH)
    third = cc2.compile(FP32)
    assert third.cached and third.cubin == first.cubin and third.kernels == ("add_f32",)
    assert third.ptx == first.ptx and len(calls) == 1 and cc2.stats.disk_hits == 1
    key = cc.key(FP32)
    assert {p.name for p in (tmp_path / "cache" / "compile").iterdir()} == {f"{key}.cubin", f"{key}.ptx", f"{key}.json"}


def test_cache_failed_compile_is_cached(tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    cc = Compiler(tmp_path, "nvrtc", arch=ARCH)
    a = cc.compile(UNDEFINED)
    b = Compiler(tmp_path, "nvrtc", arch=ARCH).compile(UNDEFINED)
    assert not a.ok and not b.ok and b.cached and len(calls) == 1
    assert b.diagnostics == a.diagnostics


@pytest.mark.parametrize("damage", ["truncate_cubin", "garbage_json", "missing_cubin"])
def test_cache_corrupt_entry_recompiles(tmp_path, monkeypatch, damage):
    calls = _counting(monkeypatch)
    good = Compiler(tmp_path, "nvrtc", arch=ARCH).compile(FP32)
    key = Compiler(tmp_path, "nvrtc", arch=ARCH).key(FP32)
    if damage == "truncate_cubin":
        (tmp_path / f"{key}.cubin").write_bytes(good.cubin[:100])
    elif damage == "garbage_json":
        (tmp_path / f"{key}.json").write_text("{not json")
    else:
        (tmp_path / f"{key}.cubin").unlink()
    cc = Compiler(tmp_path, "nvrtc", arch=ARCH)
    again = cc.compile(FP32)
    assert again.ok and not again.cached and again.cubin == good.cubin
    assert len(calls) == 2 and cc.stats.corrupt == 1
    assert json.loads((tmp_path / f"{key}.json").read_text())["ok"] is True  # rewritten
    assert Compiler(tmp_path, "nvrtc", arch=ARCH).compile(FP32).cached


def test_cache_key_depends_on_arch_options_compiler(tmp_path):
    a = Compiler(tmp_path, "nvrtc", arch="sm_90")
    b = Compiler(tmp_path, "nvrtc", arch="sm_121")
    assert a.key(FP32) != b.key(FP32)
    assert a.key(FP32) != a.key(FP32, ["-use_fast_math"])
    assert a.key(FP32) != a.key(FP32 + " ")
    assert cache_mod.cache_key(FP32, arch="sm_90", compiler="nvrtc", options=(), version="v1") != \
        cache_mod.cache_key(FP32, arch="sm_90", compiler="nvcc", options=(), version="v1")
    assert cache_mod.cache_key(FP32, arch="sm_90", compiler="nvrtc", options=(), version="v1") != \
        cache_mod.cache_key(FP32, arch="sm_90", compiler="nvrtc", options=(), version="v2")


def test_cache_does_not_keep_transient_failures(tmp_path):
    cc = Compiler(tmp_path, "nvrtc", arch=ARCH)
    fake = compile_nvrtc(FP32, arch=ARCH)
    from dataclasses import replace

    from engine.compile.diagnostics import failure
    timed_out = replace(fake, ok=False, cubin=None, diagnostics=(failure("nvrtc", "timed out", "timeout"),))
    cc.store(FP32, (), timed_out)
    assert cc.lookup(FP32) is None and not list(tmp_path.iterdir())


# -------------------------------------------------------------------------------------------------- pool

# asyncio.run rather than async tests: pytest-asyncio is a dev extra that not every box has.

def test_pool_concurrent_compiles(tmp_path):
    asyncio.run(_pool_concurrent_compiles(tmp_path))


async def _pool_concurrent_compiles(tmp_path):
    sources = [FP32, FP16, BF16, DYN_SMEM]
    async with CompilePool(max_workers=2) as pool:
        results = await asyncio.gather(*(pool.compile(s, arch=ARCH) for s in sources))
        assert all(r.ok for r in results), [r.log for r in results]
        assert [r.kernels for r in results] == [KERNELS[k][1] for k in ("fp32", "fp16", "bf16", "dyn_smem")]
        assert all(r.cubin.startswith(ELF) for r in results)
        # through the cache: the second round never reaches the pool
        cc = Compiler(tmp_path, "nvrtc", arch=ARCH)
        first = await asyncio.gather(*(cc.compile_async(s, pool=pool) for s in sources[:2]))
        again = await asyncio.gather(*(cc.compile_async(s, pool=pool) for s in sources[:2]))
        assert [r.cached for r in first] == [False, False] and [r.cached for r in again] == [True, True]
        assert cc.stats.compiles == 2
        bad = await pool.compile(UNDEFINED, arch=ARCH)
        assert not bad.ok and bad.errors[0].line == 5


def test_pool_timeout_kills_and_recovers():
    asyncio.run(_pool_timeout_kills_and_recovers())


async def _pool_timeout_kills_and_recovers():
    async with CompilePool(max_workers=1) as pool:
        # the FP32 compile queues behind the runaway one on the single worker; killing that worker must
        # not fail it: it is retried on the fresh pool
        slow, queued = await asyncio.gather(pool.compile(CUB, arch=ARCH, timeout=0.3),
                                            pool.compile(FP32, arch=ARCH))
        assert not slow.ok and slow.errors[0].code == "timeout"
        assert queued.ok and queued.kernels == ("add_f32",)
        fine = await pool.compile(FP16, arch=ARCH)
        assert fine.ok and fine.kernels == ("scale_add_h2",)
