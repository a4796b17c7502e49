"""Physics floors: the least device time a correct kernel for a card can take on a given GPU.

A timed median below the floor means the candidate cannot have done the work (it skipped it, or the
timing did not see it). Three bounds, the largest binds:

- memory: the card's minimum traffic (`card.bytes`) at an upper bound on the GPU's bandwidth; for a
  chain card, its inputs read once and its outputs written once (`chain_bytes`): a fused kernel keeps
  the members' intermediates on chip (an input a member writes in place, `chains.chain_written_inputs`, is
  written as well, which this leaves out: the floor stays a lower bound);
- compute: the floating-point operations a matmul-like op must do (`card_flops`) at the GPU's dense
  peak for the operands' dtype (`peak_flops`), tensor cores included;
- launch: one kernel launch, timed between CUDA events as the timing protocol times calls
  (`launch_floor_us`); every launch spec launches at least one kernel.

Every number here errs toward a LOWER floor: the FLOP count never counts work a correct kernel may skip
(padding taps, causally masked scores, groups whose sizes live in tensor data), and the peak is an
upper bound on what the GPU can do. An overestimate would reject a correct fast kernel; an
underestimate only lets a cheat through that the other checks (verification, re-check in place) see.

Peak table (dense FLOP per clock per SM, 2 FLOP per fused multiply-add), from NVIDIA's published dense
tensor-core throughputs divided by SM count and boost clock:

    arch          fp16/bf16   tf32    fp8     fp64   int8
    sm_80 (A100)     2048     1024     -       128   4096   312 TF fp16 = 108 SMs × 1.41 GHz × 2048
    sm_86/87/89      2048     1024    4096*    128   4096   consumer Ampere/Ada run 1024 fp16; taken
                                                             ×2 so workstation/pro parts stay below;
                                                             *fp8 on sm_89 only (Ada)
    sm_90 (H100/200) 4096     2048    8192     256   8192   989 TF fp16 = 132 SMs × 1.83 GHz × 4096
    sm_100/103       8192     4096   16384     256  16384   B200/GB300: 2.25 PF fp16, 4.5 PF fp8
    sm_12x           2048     1024    4096     128   4096   RTX 50xx / RTX PRO / GB10 (sm_121) run
                                                             ~1024 fp16: taken ×2

fp64 and int8 entries on consumer parts are far above what they do (their fp64 is not on tensor cores);
that is deliberate: a generous peak only weakens the floor. A format an arch has no unit for (fp8 before
sm_89) gets the row's fastest rate, since a kernel could emulate it on any unit.

Which rate applies to an input dtype: float32 takes the TF32 rate (the verification tolerance for fp32
matmul-like ops rejects TF32, fp16 or bf16 computation, and the split-precision schemes that pass it run
several tensor-core passes, slower than one TF32 pass); float16/bfloat16 the fp16 rate; float8 types the
fp8 rate; float64 the fp64 rate; int8/uint8 the int8 rate; any other dtype has no peak (None). The peak
is multiplied by the SM count, the MAXIMUM SM clock (boost, not the current clock) and `PEAK_MARGIN`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

# On top of the table: clocks a little above the reported maximum, rounding in the published numbers.
PEAK_MARGIN = 1.10

_RATES: dict[tuple[int, int], dict[str, int]] = {}


def _rates(archs: list[tuple[int, int]], **row: int) -> None:
    for a in archs:
        _RATES[a] = dict(row)


_rates([(8, 0)], fp16=2048, tf32=1024, fp64=128, int8=4096)
_rates([(8, 6), (8, 7)], fp16=2048, tf32=1024, fp64=128, int8=4096)
_rates([(8, 9)], fp16=2048, tf32=1024, fp8=4096, fp64=128, int8=4096)
_rates([(9, 0)], fp16=4096, tf32=2048, fp8=8192, fp64=256, int8=8192)
_rates([(10, 0), (10, 3)], fp16=8192, tf32=4096, fp8=16384, fp64=256, int8=16384)
_rates([(12, m) for m in range(10)], fp16=2048, tf32=1024, fp8=4096, fp64=128, int8=4096)

_UNIT_OF_DTYPE = {
    "float32": "tf32", "float16": "fp16", "bfloat16": "fp16", "float64": "fp64", "int8": "int8",
    "uint8": "int8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
}
_ARCH = re.compile(r"(?:sm|compute)_(\d+)[a-z]?")


def _arch_key(arch: str) -> tuple[int, int] | None:
    m = _ARCH.fullmatch(arch.strip().lower())
    if not m or len(m.group(1)) < 2:
        return None
    digits = m.group(1)
    return int(digits[:-1]), int(digits[-1])


def peak_flops(arch: str, sms: int, clock_hz: float, dtype: str) -> float | None:
    """Upper bound on the dense FLOP/s a GPU of `arch` reaches for inputs of `dtype` (None: unknown)."""
    row = _RATES.get(_arch_key(arch) or (-1, -1))
    unit = _UNIT_OF_DTYPE.get(dtype.removeprefix("torch."))
    if row is None or unit is None or not sms or sms < 0 or not (clock_hz > 0 and math.isfinite(clock_hz)):
        return None
    per_clock = row.get(unit, max(row.values()))
    return per_clock * sms * clock_hz * PEAK_MARGIN


@dataclass(frozen=True)
class GpuCompute:
    """What the compute bound needs of the lane's GPU: arch ('sm_90'), SM count, maximum SM clock in Hz."""

    arch: str
    sms: int
    clock_hz: float

    def peak(self, dtype: str) -> float | None:
        """`peak_flops` for this GPU."""
        return peak_flops(self.arch, self.sms, self.clock_hz, dtype)


# ------------------------------------------------------------------------------------------- FLOPs


class _Unreadable(Exception):
    """The signature does not have the shapes this op needs (the card gets no compute bound)."""


class _Args:
    def __init__(self, signature: dict[str, Any]):
        args = signature.get("args")
        if not isinstance(args, list):
            raise _Unreadable
        self.by_name = {a.get("name"): a for a in args if isinstance(a, dict)}

    def shape(self, name: str, ndims: tuple[int, ...] | None = None) -> list[int]:
        a = self.by_name.get(name)
        if not a or a.get("kind") != "tensor" or a.get("absent"):
            raise _Unreadable
        shape = a.get("shape")
        if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
            raise _Unreadable
        if ndims is not None and len(shape) not in ndims:
            raise _Unreadable
        return shape

    def dtype(self, name: str) -> str:
        a = self.by_name.get(name) or {}
        dtype = a.get("dtype")
        if not isinstance(dtype, str):
            raise _Unreadable
        return dtype

    def present(self, name: str) -> bool:
        """A tensor argument that is given (not absent, not missing)."""
        a = self.by_name.get(name)
        return bool(a) and a.get("kind") in ("tensor", "tensor_list") and not a.get("absent")

    def value(self, name: str, default: Any = None) -> Any:
        a = self.by_name.get(name)
        if a is None:
            return default
        if a.get("kind") != "value":
            raise _Unreadable
        return a.get("value")

    def ints(self, name: str, n: int, default: list[int] | None = None) -> list[int]:
        v = self.value(name, default)
        if type(v) is int:
            v = [v]
        if not isinstance(v, list) or not all(type(x) is int for x in v):
            raise _Unreadable
        if len(v) == 1 and n > 1:
            v = v * n
        if len(v) != n:
            raise _Unreadable
        return v


def _is_zero(v: Any) -> bool:
    if isinstance(v, bool):
        return not v
    if isinstance(v, (int, float)):
        return v == 0
    if isinstance(v, dict) and isinstance(v.get("complex"), list):
        return all(x == 0 for x in v["complex"])
    return False


def _gemm(m: int, n: int, k: int, batch: int = 1) -> int:
    return 2 * batch * m * n * k


def _mm(a: _Args, x: str, y: str) -> int:
    m, k = a.shape(x, (2,))
    k2, n = a.shape(y, (2,))
    if k != k2:
        raise _Unreadable
    return _gemm(m, n, k)


def _bmm(a: _Args, x: str, y: str) -> int:
    b, m, k = a.shape(x, (3,))
    b2, k2, n = a.shape(y, (3,))
    if k != k2 or b != b2:
        raise _Unreadable
    return _gemm(m, n, k, b)


def _scaled(a: _Args, flops: int) -> int:
    """addmm-style ops: with alpha = 0 the product is not needed at all."""
    return 0 if _is_zero(a.value("alpha", 1)) else flops


def _matmul(a: _Args) -> int:
    x, y = a.shape("self"), a.shape("other")
    if not x or not y:
        raise _Unreadable
    if len(x) == 1 and len(y) == 1:
        if x != y:
            raise _Unreadable
        return 2 * x[0]
    xb, (m, k) = (x[:-2], x[-2:]) if len(x) >= 2 else ([], [1, x[0]])
    yb, (k2, n) = (y[:-2], y[-2:]) if len(y) >= 2 else ([], [y[0], 1])
    if k != k2:
        raise _Unreadable
    batch = []
    for p, q in zip(reversed(xb), reversed(yb)):
        if p != q and 1 not in (p, q):
            raise _Unreadable
        batch.append(max(p, q) if 0 not in (p, q) else 0)
    longer = xb if len(xb) > len(yb) else yb
    batch += list(reversed(longer[: len(longer) - len(batch)]))
    return _gemm(m, n, k, math.prod(batch))


def _pairwise(a: _Args) -> int:
    """cdist: every row of x1 [..., M, D] against every row of x2 [..., N, D], at least a subtract and an add per
    feature (a multiply-add for the euclidean form, which runs as a matmul)."""
    x, y = a.shape("x1"), a.shape("x2")
    if len(x) < 2 or len(y) < 2 or x[-1] != y[-1]:
        raise _Unreadable
    batch = []
    for p, q in zip(reversed(x[:-2]), reversed(y[:-2])):
        if p != q and 1 not in (p, q):
            raise _Unreadable
        batch.append(max(p, q) if 0 not in (p, q) else 0)
    longer = x[:-2] if len(x) > len(y) else y[:-2]
    batch += list(reversed(longer[: len(longer) - len(batch)]))
    return _gemm(x[-2], y[-2], x[-1], math.prod(batch))


def _pdist(a: _Args) -> int:
    n, d = a.shape("self", (2,))
    return 2 * (n * (n - 1) // 2) * d


def _linear(a: _Args) -> int:
    x = a.shape("input")
    w = a.shape("weight", (1, 2))
    if not x:
        raise _Unreadable
    n, k = (1, w[0]) if len(w) == 1 else w
    if x[-1] != k:
        raise _Unreadable
    return _gemm(math.prod(x[:-1]), n, k)


def _mv(a: _Args, mat: str, vec: str) -> int:
    m, n = a.shape(mat, (2,))
    if a.shape(vec, (1,)) != [n]:
        raise _Unreadable
    return 2 * m * n


def _dot(a: _Args, x: str, y: str) -> int:
    n = a.shape(x, (1,))
    if a.shape(y, (1,)) != n:
        raise _Unreadable
    return 2 * n[0]


def _taps(positions: int, bound: int, k: int, s: int, d: int, p: int) -> int:
    """Pairs (position o in [0, positions), tap j in [0, k)) with 0 <= o*s + j*d - p < bound: the
    multiply-adds along one dimension that touch real data rather than padding."""
    total = 0
    for j in range(k):
        off = j * d - p
        lo = max(0, -(off // s))  # smallest o with o*s + off >= 0
        hi = min(positions - 1, (bound - 1 - off) // s)  # largest o with o*s + off < bound
        total += max(0, hi - lo + 1)
    return total


_MAX_TAPS = 1 << 16  # a kernel dimension longer than this is not a convolution we time


def _conv(a: _Args, *, x: str = "input", transposed: bool | None = None, padding: str = "padding",
          output_padding: str | None = "output_padding") -> int:
    w = a.shape("weight")
    dims = len(w) - 2
    if dims < 1:
        raise _Unreadable
    inp = a.shape(x)
    if len(inp) == len(w):
        n, c, spatial = inp[0], inp[1], inp[2:]
    elif len(inp) == len(w) - 1:  # unbatched conv1d/2d/3d input
        n, c, spatial = 1, inp[0], inp[1:]
    else:
        raise _Unreadable
    if transposed is None:
        transposed = a.value("transposed", False)
        if not isinstance(transposed, bool):
            raise _Unreadable
    groups = a.value("groups", 1)
    if type(groups) is not int or groups < 1:
        raise _Unreadable
    stride = a.ints("stride", dims, [1])
    dilation = a.ints("dilation", dims, [1])
    kernel = w[2:]
    if any(s < 1 for s in stride) or any(d < 1 for d in dilation) or any(k > _MAX_TAPS for k in kernel):
        raise _Unreadable
    pad_value = a.value(padding, [0])
    if pad_value == "valid":
        pads = [0] * dims
    elif pad_value == "same":
        if transposed or any(s != 1 for s in stride):
            raise _Unreadable
        pads = [d * (k - 1) // 2 for d, k in zip(dilation, kernel)]
    else:
        pads = a.ints(padding, dims, [0])
    if any(p < 0 for p in pads):
        raise _Unreadable
    per_dim = []
    if not transposed:
        if c != w[1] * groups or w[0] % groups:
            raise _Unreadable
        for size, k, s, d, p in zip(spatial, kernel, stride, dilation, pads):
            out = size if pad_value == "same" else (size + 2 * p - d * (k - 1) - 1) // s + 1
            if out < 1:
                raise _Unreadable
            per_dim.append(_taps(out, size, k, s, d, p))
    else:
        outpad = a.ints(output_padding, dims, [0]) if output_padding else [0] * dims
        if c != w[0] or c % groups:
            raise _Unreadable
        for size, k, s, d, p, op in zip(spatial, kernel, stride, dilation, pads, outpad):
            out = (size - 1) * s - 2 * p + d * (k - 1) + op + 1
            if out < 1:
                raise _Unreadable
            per_dim.append(_taps(size, out, k, s, d, p))
    # weight is [Cout, Cin/groups, *k] (forward) or [Cin, Cout/groups, *k] (transposed): either way one
    # multiply-add per weight element, batch item and in-bounds tap position.
    return 2 * n * w[0] * w[1] * math.prod(per_dim)


def _ramp(n: int, a: int, cap: int) -> int:
    """sum over i in [0, n) of clip(i + a, 0, cap)."""
    if n <= 0 or cap <= 0:
        return 0
    first, last = a, a + n - 1
    lo, hi = max(first, 1), min(last, cap)
    inside = (lo + hi) * (hi - lo + 1) // 2 if hi >= lo else 0
    above = max(0, last - max(cap, first - 1))
    return inside + cap * above


def _attention(a: _Args, mask: str | None) -> int:
    if mask is not None and a.present(mask):
        return 0  # an arbitrary mask (sliding window, padding) may leave almost nothing to compute
    q, k, v = a.shape("query"), a.shape("key"), a.shape("value")
    if min(len(q), len(k), len(v)) < 2 or k[-1] != q[-1] or v[-2] != k[-2]:
        raise _Unreadable
    lq, lk, d, dv = q[-2], k[-2], q[-1], v[-1]
    if a.value("is_causal", False) is True:
        # Top-left (j <= i) or bottom-right (j <= i + lk - lq) alignment: count the smaller.
        pairs = min(_ramp(lq, 1, lk), _ramp(lq, lk - lq + 1, lk))
    else:
        pairs = lq * lk
    dropout = a.value("dropout_p", 0.0)
    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool):
        raise _Unreadable
    # Every unmasked score is needed by the softmax; with dropout, dropped probabilities need no P@V.
    per_pair = d + (dv if dropout == 0 else 0)
    return 2 * math.prod(q[:-2]) * pairs * per_pair


def _mha(a: _Args) -> int:
    """nn.MultiheadAttention's fused inference path: the q/k/v and output projections, and the attention
    between them (only the projections where a mask may leave the scores almost empty)."""
    q, k = a.shape("query"), a.shape("key")
    e = a.value("embed_dim")
    if len(q) != 3 or len(k) != 3 or not isinstance(e, int) or isinstance(e, bool) or e <= 0:
        raise _Unreadable
    b, lq, lk = q[0], q[1], k[1]
    proj = 2 * b * (lq + 2 * lk) * e * e + 2 * b * lq * e * e
    return proj + (0 if a.present("mask") else 2 * 2 * b * lq * lk * e)


def _grouped(a: _Args) -> int:
    if a.present("offs"):
        return 0  # group sizes are tensor data, not in the signature: no safe count
    return _bmm(a, "self", "mat2")


# op base name -> (its FLOP count, the operands whose dtypes pick the peak rate)
_OPS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "mm": (lambda a: _mm(a, "self", "mat2"), ("self", "mat2")),
    "_int_mm": (lambda a: _mm(a, "self", "mat2"), ("self", "mat2")),
    "_scaled_mm": (lambda a: _mm(a, "self", "mat2"), ("self", "mat2")),
    "addmm": (lambda a: _scaled(a, _mm(a, "mat1", "mat2")), ("mat1", "mat2")),
    "_addmm_activation": (lambda a: _scaled(a, _mm(a, "mat1", "mat2")), ("mat1", "mat2")),
    "bmm": (lambda a: _bmm(a, "self", "mat2"), ("self", "mat2")),
    "baddbmm": (lambda a: _scaled(a, _bmm(a, "batch1", "batch2")), ("batch1", "batch2")),
    "addbmm": (lambda a: _scaled(a, _bmm(a, "batch1", "batch2")), ("batch1", "batch2")),
    "matmul": (_matmul, ("self", "other")),
    "linear": (_linear, ("input", "weight")),
    "mv": (lambda a: _mv(a, "self", "vec"), ("self", "vec")),
    "addmv": (lambda a: _scaled(a, _mv(a, "mat", "vec")), ("mat", "vec")),
    "dot": (lambda a: _dot(a, "self", "tensor"), ("self", "tensor")),
    "vdot": (lambda a: _dot(a, "self", "other"), ("self", "other")),
    "convolution": (_conv, ("input", "weight")),
    "_convolution": (_conv, ("input", "weight")),
    "convolution_overrideable": (_conv, ("input", "weight")),
    "conv1d": (lambda a: _conv(a, transposed=False), ("input", "weight")),
    "conv2d": (lambda a: _conv(a, transposed=False), ("input", "weight")),
    "conv3d": (lambda a: _conv(a, transposed=False), ("input", "weight")),
    "_convolution_mode": (lambda a: _conv(a, transposed=False), ("input", "weight")),
    "conv_transpose1d": (lambda a: _conv(a, transposed=True), ("input", "weight")),
    "conv_transpose2d": (lambda a: _conv(a, transposed=True), ("input", "weight")),
    "conv_transpose3d": (lambda a: _conv(a, transposed=True), ("input", "weight")),
    "cudnn_convolution": (lambda a: _conv(a, x="self", transposed=False), ("self", "weight")),
    "cudnn_convolution_relu": (lambda a: _conv(a, x="self", transposed=False), ("self", "weight")),
    "mkldnn_convolution": (lambda a: _conv(a, x="self", transposed=False), ("self", "weight")),
    "cudnn_convolution_transpose": (lambda a: _conv(a, x="self", transposed=True), ("self", "weight")),
    "scaled_dot_product_attention": (lambda a: _attention(a, "attn_mask"), ("query", "key")),
    "_scaled_dot_product_attention_math": (lambda a: _attention(a, "attn_mask"), ("query", "key")),
    "_scaled_dot_product_flash_attention": (lambda a: _attention(a, None), ("query", "key")),
    "_scaled_dot_product_flash_attention_for_cpu": (lambda a: _attention(a, "attn_mask"), ("query", "key")),
    "_scaled_dot_product_efficient_attention": (lambda a: _attention(a, "attn_bias"), ("query", "key")),
    "_scaled_dot_product_cudnn_attention": (lambda a: _attention(a, "attn_bias"), ("query", "key")),
    "_scaled_dot_product_fused_attention_overrideable": (lambda a: _attention(a, "attn_bias"),
                                                         ("query", "key")),
    "_native_multi_head_attention": (_mha, ("query", "qkv_weight")),
    # pairwise distances (torch.cdist, pdist): a matmul's work, which VQ codebook lookups do per latent
    "_euclidean_dist": (_pairwise, ("x1", "x2")),
    "_cdist_forward": (_pairwise, ("x1", "x2")),
    "_pdist_forward": (_pdist, ("self",)),
    "_grouped_mm": (_grouped, ("self", "mat2")),
    "_scaled_grouped_mm": (_grouped, ("self", "mat2")),
    # Recurrent layers: a matmul per time step inside one op (their weights are tensor lists; no count is
    # claimed), compute ops all the same, so a chain of small ops never runs through one.
    **{name: (lambda a: 0, ("input",)) for name in (
        "_cudnn_rnn", "miopen_rnn", "mkldnn_rnn_layer", "lstm", "gru", "rnn_tanh", "rnn_relu",
        "quantized_lstm", "quantized_gru")},
}


def _base(op_name: str) -> str | None:
    ns, sep, rest = op_name.partition("::")
    if not sep or ns != "aten":
        return None
    return rest.partition(".")[0]


def is_compute_op(op_name: str) -> bool:
    """A matmul-like op (matmul, convolution, attention, grouped mm): one whose floor is its FLOPs."""
    return (_base(op_name) or "") in _OPS


def card_flops(op_name: str, signature: dict[str, Any]) -> float | None:
    """Floating-point operations (2 per multiply-add) any correct kernel for this matmul-like card
    does, a lower bound; None for other ops, unreadable shapes, or nothing to count."""
    entry = _OPS.get(_base(op_name) or "")
    if entry is None:
        return None
    try:
        flops = entry[0](_Args(signature))
    except (_Unreadable, TypeError, ValueError, IndexError, KeyError):
        return None
    return float(flops) if flops > 0 else None


def operand_dtypes(op_name: str, signature: dict[str, Any]) -> tuple[str, ...] | None:
    """The dtypes of the card's matmul operands (what picks the peak rate), or None when unknown."""
    entry = _OPS.get(_base(op_name) or "")
    if entry is None:
        return None
    try:
        a = _Args(signature)
        return tuple(a.dtype(name) for name in entry[1])
    except _Unreadable:
        return None


# ----------------------------------------------------------------------------------- launch floor


LAUNCH_FLOOR_SHARE = 0.5  # of the fastest one-element kernel: a backstop, never above a real kernel's time


def launch_floor_us(device: Any, tries: int = 50) -> float:
    """Half the smallest device time, in µs, of a one-element kernel (a fill) timed between CUDA events
    the way the timing protocol times a call (the GPU kept busy before the start event, so launch
    latency is not in it). No kernel that does anything is faster than such a kernel.

    Needs a CUDA device. The GPU is kept busy for ~10 ms first so its clocks are up (an idle-clock
    measurement would be too high a floor). `torch.cuda._sleep(0)` is not used: it spins for a while
    even when asked for no cycles (6 µs on an H200, above real small kernels).
    """
    import torch

    with torch.cuda.device(device):
        one = torch.empty(1, device=device)
        for _ in range(100):
            torch.cuda._sleep(200_000)  # ~0.1 ms each: clocks ramp up, the context is warm
        one.fill_(0.0)
        torch.cuda.synchronize()
        pairs = []
        for _ in range(tries):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            # The lead (~100 µs): the host has queued the fill before the start event runs, whatever
            # Python costs (10 µs of lead measured the host: 17 µs for a one-element fill).
            torch.cuda._sleep(200_000)
            s.record()
            one.fill_(1.0)
            e.record()
            pairs.append((s, e))
        torch.cuda.synchronize()
        return LAUNCH_FLOOR_SHARE * min(s.elapsed_time(e) for s, e in pairs) * 1e3


# ---------------------------------------------------------------------------------------- the floor

CHAIN_OP = "kforge::chain"  # engine.capture.chains.CHAIN_OP (this layer is below capture)


def _distinct_bytes(d: dict[str, Any]) -> int:
    """Bytes of the distinct elements a tensor description names (a broadcast dimension, stride 0,
    holds one element); 0 for an absent or unreadable one."""
    try:
        shape, stride = d["shape"], d["stride"]
        n = 1
        for size, st in zip(shape, stride):
            if size == 0:
                return 0
            n *= size if st != 0 else 1
        return n * _itemsize(d["dtype"])
    except (KeyError, TypeError, ValueError):
        return 0


def _itemsize(dtype: str) -> int:
    import torch

    return getattr(torch, dtype).itemsize


def chain_bytes(signature: dict[str, Any], outputs: list[dict[str, Any]]) -> int:
    """A chain card's minimum traffic: every input read once and every output written once."""
    reads = sum(_distinct_bytes(a) for a in signature.get("args", [])
                if a.get("kind") == "tensor" and not a.get("absent"))
    return reads + sum(_distinct_bytes(o) for o in outputs)


@dataclass(frozen=True)
class Floor:
    """A card's physics floor on one GPU: `us` is the largest of its three bounds."""

    us: float
    memory_us: float
    compute_us: float
    launch_us: float
    nbytes: int = 0
    bandwidth: float = 0.0
    flops: float | None = None
    peak: float | None = None
    peak_label: str = ""  # e.g. "bfloat16 on sm_90"

    @property
    def binding(self) -> str:
        """Which bound sets the floor: 'memory', 'compute' or 'launch' ('none' when all are 0)."""
        if self.us <= 0:
            return "none"
        return max((self.memory_us, "memory"), (self.compute_us, "compute"), (self.launch_us, "launch"),
                   key=lambda t: t[0])[1]

    def reason(self) -> str:
        """One sentence naming the binding bound and its numbers."""
        b = self.binding
        if b == "memory":
            return (f"moving {self.nbytes} bytes takes {_num(self.memory_us)} µs at "
                    f"{self.bandwidth / 1e12:.3g} TB/s")
        if b == "compute":
            label = f" ({self.peak_label})" if self.peak_label else ""
            return (f"{_num((self.flops or 0) / 1e9)} GFLOP take {_num(self.compute_us)} µs at "
                    f"{_num((self.peak or 0) / 1e12)} TFLOP/s{label}")
        if b == "launch":
            return f"one kernel launch takes {_num(self.launch_us)} µs on this GPU"
        return "no bound applies"

    def to_json(self) -> dict[str, Any]:
        """The floor and its parts, for the timing payload."""
        return {"us": self.us, "memory_us": self.memory_us, "compute_us": self.compute_us,
                "launch_us": self.launch_us, "binding": self.binding, "flops": self.flops, "peak": self.peak,
                "reason": self.reason()}


def _num(x: float) -> str:
    """Three significant digits, without exponent for the magnitudes floors have (137.4, 10.4, 2.13)."""
    if x >= 100:
        return f"{x:.1f}" if x < 1000 else f"{x:.0f}"
    return f"{x:.3g}"


def physics_floor(op_name: str, signature: dict[str, Any], nbytes: int, *, bandwidth: float,
                  peak: GpuCompute | float | None, launch_us: float = 0.0) -> Floor:
    """The card's floor: max(nbytes / bandwidth, card_flops / peak, launch_us), in µs.

    `bandwidth` is an upper bound on bytes/s (0: no memory bound); `peak` the GPU (its rate is looked up
    for the card's operand dtypes), or a FLOP/s number, or None (no compute bound).
    """
    memory_us = nbytes / bandwidth * 1e6 if nbytes > 0 and bandwidth > 0 else 0.0
    flops = card_flops(op_name, signature)
    rate, label = None, ""
    if isinstance(peak, GpuCompute):
        dtypes = operand_dtypes(op_name, signature)
        rates = [peak.peak(d) for d in dtypes] if dtypes else []
        if rates and all(r is not None for r in rates):
            rate = max(r for r in rates if r is not None)
            label = f"{dtypes[0]} on {peak.arch}"
    elif isinstance(peak, (int, float)) and peak > 0:
        rate = float(peak)
    compute_us = flops / rate * 1e6 if flops and rate else 0.0
    launch_us = max(0.0, float(launch_us))
    return Floor(max(memory_us, compute_us, launch_us), memory_us, compute_us, launch_us, int(nbytes),
                 float(bandwidth), flops, rate, label)
