"""group_norm_cl template: aten::native_group_norm on channels-last input ([N, C, *spatial] with C innermost),
for one card.

Where this input comes from: a convolution's output wherever the model runs channels-last, and under
torch.compile on any convolutional model (Inductor's layout optimization). Eager CUDA GroupNorm copies such an
input to contiguous and returns contiguous output; this template reads it where it is. Its output is
written in the layout the card records: contiguous (CUDA eager: the tile is transposed through shared
memory on the way out) or channels-last (a straight pass; a twin's, whose outputs are what compiled code
asserts for a held channels-last input under torch 2.11).

Two launches:
  gncl_stats  P blocks per image read chunks of pixels, all C channels of each (coalesced along C); each
              keeps exact per-vector Welford moments for the groups its channels belong to, the block
              merges them per group in a fixed order and writes one partial per (image, block, group). The
              last block of an image to finish (a counter) merges the image's partials and writes mean and
              rstd, rounded once to their dtype as eager's RowwiseMoments does.
  gncl_apply  tiles of TP pixels x TC channels: y = x * a[c] + b[c] with a = rstd * w, b = bias - a * mean
              from the ROUNDED mean/rstd (eager's ComputeFusedParams).
  gncl_apply_flat  (channels-last output, `apply = "flat"`) the same y as one elementwise pass over the
              image's [HW * C] values, all C coefficients in shared memory, U vectors in flight per thread.

Order (`order`, searched): "chunks" (each statistics block reads one contiguous chunk of pixels; the apply
pass runs front to back) or "sweep": the statistics blocks stride through the image together, front to back,
so that the last bytes they read are its tail, and the apply pass runs back to front, so that its first reads
find that tail still in L2. An input larger than the L2 is read from memory twice either way (every pixel's
statistics come before any output); "sweep" takes back what the L2 still holds between the passes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from engine.cards import OperatorCard
from engine.propose.base import Hardware
from engine.propose.builtin import cuda_common as cc
from engine.propose.builtin.group_norm import gn_args_problem
from engine.propose.builtin.template import H200, Rendered, Template

_BODY = r"""
typedef $T T;
typedef $TW TW;
typedef $TB TB;
typedef $TS TS;
constexpr int V = $V;                        // channels per vector (and pixels per vector on the way out)
constexpr int BLOCK = $BLOCK;
constexpr int U = $U;
constexpr int C = $C;
constexpr int G = $G;
constexpr int CG = C / G;
constexpr long long HW = $HW;                // pixels per image
constexpr bool HAS_W = $HAS_W, HAS_B = $HAS_B;
constexpr int LANES = C / V;                 // threads across one pixel's channels
constexpr int ROWS = BLOCK / LANES;          // pixels a block reads per step
constexpr int VG = V >= CG ? V / CG : 1;     // groups in one vector
constexpr int VC = V >= CG ? CG : V;         // channels of one group in one vector
constexpr int LPG = V >= CG ? 1 : CG / V;    // lanes holding one group's channels of a pixel
constexpr int P = $P;                        // statistics blocks per image
constexpr long long CHUNK = $CHUNK;          // pixels per statistics block
constexpr int TPG = $TPG;                    // threads merging one group's partials at the end
constexpr bool SWEEP = $SWEEP;               // order "sweep": statistics strided front to back, apply back to front
$IB_DECL
// Statistics: Welford partials per (image, block, group); the image's last block merges them.
extern "C" __global__ void __launch_bounds__(BLOCK)
gncl_stats(const T* __restrict__ x, ${IB_PARAM}float* __restrict__ part, unsigned int* __restrict__ ctr,
           TS* __restrict__ mean_out, TS* __restrict__ rstd_out, float eps) {
  __shared__ float sh[3 * BLOCK];
  __shared__ unsigned int is_last;
  const long long n = blockIdx.x / P;
  const int p = (int)(blockIdx.x % P);
  const int lane = (int)threadIdx.x % LANES, row = (int)threadIdx.x / LANES;
  const long long lo = (long long)p * CHUNK;
  const long long hi = lo + CHUNK < HW ? lo + CHUNK : HW;
  const T* __restrict__ xn = x + n * HW * C + lane * V;
  KfWf s[VG];
#pragma unroll
  for (int k = 0; k < VG; ++k) s[k] = {0.f, 0.f, 0.f};
$IB_STATS_REG  // chunks: [lo, hi) one step of ROWS * U pixels after another; sweep: every P-th step of the image
  const long long first = SWEEP ? (long long)p * ROWS * U : lo, end = SWEEP ? HW : hi;
  const long long stride = SWEEP ? (long long)P * ROWS * U : (long long)ROWS * U;
  if (row < ROWS) {
    for (long long px = first + row; px < end; px += stride) {
      float f[U][V];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const long long q = px + (long long)u * ROWS;
        if (q < end) kf_load<T, V, 0>(xn + q * C, f[u]);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (px + (long long)u * ROWS < end) {
$IB_STATS_ADD#pragma unroll
          for (int k = 0; k < VG; ++k) kf_wf_add<VC>(s[k], f[u] + k * VC);
        }
      }
    }
  }
  float* __restrict__ pn = part + ((long long)n * P + p) * G * 3;
#pragma unroll
  for (int k = 0; k < VG; ++k) {
    if (k) __syncthreads();
    sh[threadIdx.x] = s[k].n;
    sh[BLOCK + threadIdx.x] = s[k].mean;
    sh[2 * BLOCK + threadIdx.x] = s[k].m2;
    __syncthreads();
    for (int gl = threadIdx.x; gl < G / VG; gl += BLOCK) {
      const int g = V >= CG ? gl * VG + k : gl;
      KfWf t = {0.f, 0.f, 0.f};
      for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int j = 0; j < LPG; ++j) {
          const int i = r * LANES + (V >= CG ? gl : gl * LPG + j);
          kf_wf_merge(t, sh[i], sh[BLOCK + i], sh[2 * BLOCK + i]);
        }
      }
      pn[3 * g] = t.n;
      pn[3 * g + 1] = t.mean;
      pn[3 * g + 2] = t.m2;
    }
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(ctr + n, 1u) == (unsigned int)(P - 1);
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  // The image's P partials per group: TPG threads each merge a strided share, then one of them the TPG
  // results in order (the same bits whichever block is last).
  constexpr int GPP = BLOCK / TPG;           // groups per pass
  const int gi = (int)threadIdx.x / TPG, ti = (int)threadIdx.x % TPG;
  const float* __restrict__ pimg = part + (long long)n * P * G * 3;
  for (int g0 = 0; g0 < G; g0 += GPP) {
    const int g = g0 + gi;
    KfWf t = {0.f, 0.f, 0.f};
    if (g < G) {
      // Eight partials' loads in flight before they are merged, in the same order: each merge waits on
      // the last, and a thread merges P / TPG partials (128 where P is 1024), so loads issued one merge at
      // a time would wait one L2 round trip each.
      constexpr int IN_FLIGHT = 8;
      for (int q0 = ti; q0 < P; q0 += TPG * IN_FLIGHT) {
        float e[IN_FLIGHT][3];
#pragma unroll
        for (int k = 0; k < IN_FLIGHT; ++k) {
          const int q = q0 + k * TPG;
          const float* src = pimg + ((long long)(q < P ? q : q0) * G + g) * 3;
          e[k][0] = __ldcg(src);
          e[k][1] = __ldcg(src + 1);
          e[k][2] = __ldcg(src + 2);
        }
#pragma unroll
        for (int k = 0; k < IN_FLIGHT; ++k) {
          if (q0 + k * TPG < P) kf_wf_merge(t, e[k][0], e[k][1], e[k][2]);
        }
      }
    }
    __syncthreads();
    sh[threadIdx.x] = t.n;
    sh[BLOCK + threadIdx.x] = t.mean;
    sh[2 * BLOCK + threadIdx.x] = t.m2;
    __syncthreads();
    if (ti == 0 && g < G) {
      KfWf r = {0.f, 0.f, 0.f};
      for (int j = 0; j < TPG; ++j) {
        const int i = gi * TPG + j;
        kf_wf_merge(r, sh[i], sh[BLOCK + i], sh[2 * BLOCK + i]);
      }
      const float var = r.m2 / ((float)CG * (float)HW);
      mean_out[n * G + g] = kf_from_float<TS>(r.mean);
      rstd_out[n * G + g] = kf_from_float<TS>(rsqrtf(var + eps));
    }
  }
}


// Channel c's apply coefficients for image n: y = x * a + b with a = rstd * w, b = bias - a * mean, from the
// ROUNDED mean/rstd (eager's ComputeFusedParams).
__device__ __forceinline__ float2 gncl_coef(int c, long long n, const TS* __restrict__ mean_in,
                                            const TS* __restrict__ rstd_in, const TW* w, const TB* bias) {
  const int g = c / CG;
  const float m = kf_to_float(mean_in[n * G + g]), rs = kf_to_float(rstd_in[n * G + g]);
  float a = rs;
  if constexpr (HAS_W) a = rs * kf_to_float(w[c]);
  float sft = -a * m;
  if constexpr (HAS_B) sft = fmaf(-a, m, kf_to_float(bias[c]));
  return make_float2(a, sft);
}
"""

_TILE = r"""
constexpr int TP = $TP;                      // pixels per apply tile (a multiple of V)
constexpr int TC = $TC;                      // channels per apply tile (divides C, a multiple of V)
constexpr bool OUT_CL = $OUT_CL;             // output channels-last (else contiguous: transposed tiles)
constexpr long long PT = (HW + TP - 1) / TP;
constexpr int CT = C / TC;
// Apply: one tile of TP pixels x TC channels per block. Reads are coalesced along the channels; a
// contiguous output is written through a transposed tile in shared memory, coalesced along the pixels.
extern "C" __global__ void __launch_bounds__(BLOCK)
gncl_apply(const T* __restrict__ x, $IB_PARAM$WB_PARAMS T* __restrict__ y, const TS* __restrict__ mean_in,
           const TS* __restrict__ rstd_in) {
$WB_LOCALS
  __shared__ float2 ab[TC];
  __shared__ float tile[OUT_CL ? 1 : TC][OUT_CL ? 1 : TP + 1];
  const long long b = blockIdx.x;
  const int ct = (int)(b % CT);
  const long long pt = SWEEP ? PT - 1 - (b / CT) % PT : (b / CT) % PT;   // sweep: the image's tail first
  const long long n = b / ((long long)CT * PT);
  const int c0 = ct * TC;
  const long long p0 = pt * TP;
  for (int c = threadIdx.x; c < TC; c += BLOCK) ab[c] = gncl_coef(c0 + c, n, mean_in, rstd_in, w, bias);
$IB_TILE_COEF  __syncthreads();
  constexpr int LT = TC / V;                 // threads across one pixel's tile channels
  // A thread keeps its channels where BLOCK is a multiple of LT: it holds their coefficients in registers
  // (read from shared memory once, not once per pixel, where the reads of a warp hit few banks).
  constexpr bool FIXED = BLOCK % LT == 0;
  float2 kr[V];
  if (FIXED) {
#pragma unroll
    for (int j = 0; j < V; ++j) kr[j] = ab[((int)threadIdx.x % LT) * V + j];
  }
$IB_TILE_REG  const T* __restrict__ xn = x + n * HW * C + c0;
  for (int i = threadIdx.x; i < TP * LT; i += BLOCK) {
    const int pl = i / LT, l = i % LT;
    const long long px = p0 + pl;
    if (px >= HW) continue;
    float f[V];
    kf_load<T, V, 1>(xn + px * C + l * V, f);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float2 k = FIXED ? kr[j] : ab[l * V + j];
$IB_TILE_APPLY      f[j] = fmaf(f[j], k.x, k.y);
    }
    if constexpr (OUT_CL) {
      kf_store<T, V, 1>(y + (n * HW + px) * C + c0 + l * V, f);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) tile[l * V + j][pl] = f[j];
    }
  }
  if constexpr (!OUT_CL) {
    __syncthreads();
    constexpr int LP = TP / V;               // threads across one channel's tile pixels
    T* __restrict__ yn = y + (n * C + c0) * HW;
    for (int i = threadIdx.x; i < TC * LP; i += BLOCK) {
      const int c = i / LP, l = i % LP;
      const long long px = p0 + (long long)l * V;
      if (px >= HW) continue;                // HW % V == 0: a vector is in or out whole
      float f[V];
#pragma unroll
      for (int j = 0; j < V; ++j) f[j] = tile[c][l * V + j];
      kf_store<T, V, 1>(yn + (long long)c * HW + px, f);
    }
  }
}
"""

_FLAT = r"""
// Apply, flat (channels-last output only): input and output are the same [N, HW * C] array, so the pass is
// an elementwise one with per-channel coefficients. AB blocks per image, each with the image's C
// coefficients in shared memory, stride through its vectors U at a time (U loads in flight per thread).
constexpr int AB = $AB;
constexpr long long NVEC = HW * C / V;       // vectors per image
extern "C" __global__ void __launch_bounds__(BLOCK)
gncl_apply_flat(const T* __restrict__ x, $IB_PARAM$WB_PARAMS T* __restrict__ y, const TS* __restrict__ mean_in,
                const TS* __restrict__ rstd_in) {
$WB_LOCALS
  __shared__ float2 ab[C];
  const long long n = blockIdx.x / AB;
  const int pb = (int)(blockIdx.x % AB);
  for (int c = threadIdx.x; c < C; c += BLOCK) ab[c] = gncl_coef(c, n, mean_in, rstd_in, w, bias);
$IB_FLAT_COEF  __syncthreads();
  // Vector i holds channels (i % LANES) * V on. Where BLOCK is a multiple of LANES a thread's vectors all hold
  // the same channels (i steps by multiples of BLOCK), and it keeps their coefficients in registers: read per
  // vector from shared memory, a warp's float2 reads 64 bytes apart fall on two bank pairs (8-way conflicts,
  // eight reads per vector), which cost more than the vector's own load and store.
  constexpr bool FIXED = BLOCK % LANES == 0;
  float2 kr[V];
  // Sweep: vector NVEC - 1 - i instead of i (the image's tail first); NVEC is a multiple of LANES, so a thread's
  // vectors still all hold the same channels, LANES - 1 - its own.
  if (FIXED) {
    const int mine = SWEEP ? LANES - 1 - (int)threadIdx.x % LANES : (int)threadIdx.x % LANES;
#pragma unroll
    for (int j = 0; j < V; ++j) kr[j] = ab[mine * V + j];
  }
$IB_FLAT_REG  const T* __restrict__ xn = x + n * HW * C;
  T* __restrict__ yn = y + n * HW * C;
  for (long long i0 = (long long)pb * BLOCK * U + threadIdx.x; i0 < NVEC; i0 += (long long)AB * BLOCK * U) {
    float fu[U][V];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long k = i0 + (long long)u * BLOCK, i = SWEEP ? NVEC - 1 - k : k;
      if (k < NVEC) kf_load<T, V, 1>(xn + i * V, fu[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long k = i0 + (long long)u * BLOCK, i = SWEEP ? NVEC - 1 - k : k;
      if (k < NVEC) {
        const int c0 = (int)(i % LANES) * V;
        float* f = fu[u];
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float2 k = FIXED ? kr[j] : ab[c0 + j];
$IB_FLAT_APPLY          f[j] = fmaf(f[j], k.x, k.y);
        }
        kf_store<T, V, 1>(yn + i * V, f);
      }
    }
  }
}
"""

# An input bias (`input_bias`, a chain's per-channel add before the GroupNorm: a convolution's bias Inductor split
# off, engine/propose/builtin/chains.py ConvBiasGroupNormSiluChainTemplate): y = GN(x + b[c]). "stored": x + b
# rounded to the input's dtype before anything reads it, bit for bit the tensor eager stores before its
# GroupNorm; "fp32": not rounded (the apply step folds b into its coefficients, no cost per element). Each
# fragment is empty without an input bias, so every other card's kernels are the same source as before.
_IB_STORED = {
    "IB_STATS_ADD": "#pragma unroll\n          for (int j = 0; j < V; ++j) f[u][j] = kf_to_float(kf_from_float<T>(f[u][j] + ibr[j]));\n",
    "IB_TILE_COEF": "  __shared__ float ibs[TC];\n  for (int c = threadIdx.x; c < TC; c += BLOCK) ibs[c] = kf_to_float(ib[c0 + c]);\n",
    "IB_TILE_REG": "  float ibk[V];\n  if (FIXED) {\n#pragma unroll\n    for (int j = 0; j < V; ++j) ibk[j] = ibs[((int)threadIdx.x % LT) * V + j];\n  }\n",
    "IB_TILE_APPLY": "      f[j] = kf_to_float(kf_from_float<T>(f[j] + (FIXED ? ibk[j] : ibs[l * V + j])));\n",
    "IB_FLAT_COEF": "  __shared__ float ibs[C];\n  for (int c = threadIdx.x; c < C; c += BLOCK) ibs[c] = kf_to_float(ib[c]);\n",
    "IB_FLAT_REG": ("  float ibk[V];\n  if (FIXED) {\n    const int mine = SWEEP ? LANES - 1 - (int)threadIdx.x % LANES : (int)threadIdx.x % LANES;\n"
                    "#pragma unroll\n    for (int j = 0; j < V; ++j) ibk[j] = ibs[mine * V + j];\n  }\n"),
    "IB_FLAT_APPLY": "          f[j] = kf_to_float(kf_from_float<T>(f[j] + (FIXED ? ibk[j] : ibs[c0 + j])));\n",
}
_IB_FP32 = {
    "IB_STATS_ADD": "#pragma unroll\n          for (int j = 0; j < V; ++j) f[u][j] += ibr[j];\n",
    "IB_TILE_COEF": "  for (int c = threadIdx.x; c < TC; c += BLOCK) ab[c].y = fmaf(ab[c].x, kf_to_float(ib[c0 + c]), ab[c].y);\n",
    "IB_TILE_REG": "", "IB_TILE_APPLY": "",
    "IB_FLAT_COEF": "  for (int c = threadIdx.x; c < C; c += BLOCK) ab[c].y = fmaf(ab[c].x, kf_to_float(ib[c]), ab[c].y);\n",
    "IB_FLAT_REG": "", "IB_FLAT_APPLY": "",
}
INPUT_BIAS_FORMS = ("stored", "fp32")


def _input_bias_fragments(form: str | None, tib: str) -> dict[str, str]:
    """The $IB_* fragments of the kernels for an input bias of C type `tib` in `form`; all empty for None."""
    if form is None:
        return {k: "" for k in ("IB_DECL", "IB_PARAM", "IB_STATS_REG", *_IB_STORED)}
    return {"IB_DECL": f"typedef {tib} TIB;                          // the input bias's type\n",
            "IB_PARAM": "const TIB* __restrict__ ib, ",
            "IB_STATS_REG": ("  float ibr[V];                              // the input bias of this thread's channels\n"
                             "#pragma unroll\n  for (int j = 0; j < V; ++j) ibr[j] = kf_to_float(ib[lane * V + j]);\n"),
            **(_IB_STORED if form == "stored" else _IB_FP32)}


TILE_P = (64, 32, 128)
TILE_C = (64, 32, 128, 16, 8)
SMEM_STATIC = 48 * 1024  # a block's static shared memory


channels_last = cc.channels_last   # (chains.py imports it from here)


class GroupNormChannelsLastTemplate(Template):
    """aten::native_group_norm on channels-last input: statistics over chunks of pixels (all channels of
    each), then an apply pass over pixel x channel tiles writing the card's output layout."""

    name = "group_norm_cl"
    ops = frozenset({"aten::native_group_norm"})

    def _geometry(self, card: OperatorCard) -> dict[str, Any]:
        x = cc.raw_arg(card, "input")
        assert x is not None
        n, c, hw, g = (int(cc.raw_value(card, k)) for k in ("N", "C", "HxW", "group"))
        out_cl = channels_last(card.outputs[0]["shape"], card.outputs[0]["stride"]) and not cc.is_contiguous(
            card.outputs[0]["shape"], card.outputs[0]["stride"])
        return {"x": x, "N": n, "C": c, "HW": hw, "G": g, "CG": c // g, "out_cl": out_cl}

    def _vecs(self, card: OperatorCard, geo: Mapping[str, Any]) -> list[int]:
        """Vector widths: dividing C (and the pixels, for a transposed write), on one group or whole groups,
        with no more than 256 lanes across a pixel's channels, every access aligned."""
        x = geo["x"]
        divides = geo["C"] if geo["out_cl"] else math.gcd(geo["C"], geo["HW"])
        return [v for v in cc.vec_choices(cc.itemsize(x["dtype"]), divides, [x, card.outputs[0]])
                if (v % geo["CG"] == 0 or geo["CG"] % v == 0) and geo["C"] // v <= 256]

    def accepts(self, card: OperatorCard, *, hw: Hardware = H200) -> str | None:
        if card.op not in self.ops:
            return f"op {card.op} is not group_norm"
        x = cc.tensor_arg(card, "input")
        why = cc.check_tensor(x, "input")
        if why:
            return why
        assert x is not None
        shape, stride = [int(s) for s in x["shape"]], [int(s) for s in x["stride"]]
        if cc.is_contiguous(shape, stride):
            return "input is contiguous (the group_norm template's)"
        if not channels_last(shape, stride):
            return f"input is not channels-last (strides {stride} for shape {shape})"
        why = gn_args_problem(card, x)
        if why:
            return why
        geo = self._geometry(card)
        why = cc.affine_problem(card, [geo["C"]])
        if why:
            return why
        out = card.outputs[0]
        if out.get("dtype") != x["dtype"] or [int(s) for s in out["shape"]] != shape:
            return f"output 0 is {out.get('dtype')} {out.get('shape')}, expected {x['dtype']} {shape}"
        if not (cc.is_contiguous(out["shape"], out["stride"]) or geo["out_cl"]):
            return f"output 0 is neither contiguous nor channels-last (strides {out['stride']})"
        why = (cc.output_problem(card, 1, None, None, numel=geo["N"] * geo["G"])
               or cc.output_problem(card, 2, None, None, numel=geo["N"] * geo["G"]))
        if why:
            return why
        if card.outputs[1]["dtype"] != card.outputs[2]["dtype"]:
            return "mean and rstd outputs differ in dtype"
        if not self._vecs(card, geo):
            return "no aligned access width (C and the pixels must share a vector width)"
        ib = cc.raw_arg(card, "input_bias")
        if ib is not None and not ib.get("absent"):
            why = cc.check_tensor(cc.tensor_arg(card, "input_bias"), "input_bias")
            if why:
                return why
            if [int(s) for s in ib["shape"]] != [geo["C"]] or [int(s) for s in ib["stride"]] != [1]:
                return f"input_bias is {ib['shape']} with strides {ib['stride']}, expected [{geo['C']}] dense"
        return None

    @staticmethod
    def _input_bias(card: OperatorCard) -> dict[str, Any] | None:
        """The card's input bias (a chain's sub-card carries one; an ATen group_norm card never does)."""
        return cc.tensor_arg(card, "input_bias")

    def space(self, card: OperatorCard, *, hw: Hardware = H200) -> Mapping[str, Sequence[Any]]:
        geo = self._geometry(card)
        vecs = self._vecs(card, geo)
        n, c, pixels = geo["N"], geo["C"], geo["HW"]
        lanes = c // vecs[-1]  # the most lanes any vector width needs
        blocks = [b for b in (256, 512, 1024, 128) if b >= lanes] or [1024]
        # Statistics blocks per image: about 4 per SM over the images, each reading at least one step.
        rows = max(1, blocks[0] // (c // vecs[0]))
        p = 1
        while n * p < 4 * hw.sms and p < 4096 and -(-pixels // (2 * p)) >= rows:
            p *= 2
        ps = [q for q in (p, p * 2, p // 2, p * 4) if 1 <= q <= 4096 and n * q <= cc.MAX_I32]
        tile_c = [t for t in cc.ordered(min(c, 64), (*TILE_C, c)) if c % t == 0 and all(t % v == 0 for v in vecs)]
        tile_c = [t for t in tile_c if t * (max(TILE_P) + 1) * 4 + 8 * t <= SMEM_STATIC] or [min(tile_c)]
        tile_p = [t for t in TILE_P if all(t % v == 0 for v in vecs)
                  and (geo["out_cl"] or max(tile_c) * (t + 1) * 4 + 8 * max(tile_c) <= SMEM_STATIC)]
        space = {
            "block": blocks,
            "vec": vecs,
            "unroll": [2, 4, 1],
            "blocks_per_image": cc.ordered(ps[0], ps),
            "tile_p": tile_p or [max(vecs)],
            "tile_c": tile_c,
            "order": ["chunks", "sweep"],
        }
        ib = self._input_bias(card) is not None
        if geo["out_cl"] and c * (12 if ib else 8) <= SMEM_STATIC:
            space["apply"] = ["flat", "tile"]   # flat: the coefficients of all C channels in shared memory
        if ib:
            space["input_bias"] = list(INPUT_BIAS_FORMS)
        return space

    def render(self, card: OperatorCard, params: Mapping[str, Any], *, hw: Hardware = H200) -> Rendered:
        geo = self._geometry(card)
        x = geo["x"]
        w, b = cc.tensor_arg(card, "weight"), cc.tensor_arg(card, "bias")
        has_w, has_b = w is not None, b is not None
        v, block, u = int(params["vec"]), int(params["block"]), int(params["unroll"])
        flat = params.get("apply", "tile") == "flat"
        ib = self._input_bias(card)
        ib_form = params.get("input_bias", "stored") if ib is not None else None
        sweep = params.get("order", "chunks") == "sweep"   # (a candidate from before the parameter: chunks)
        p, tp, tc = int(params["blocks_per_image"]), int(params["tile_p"]), int(params["tile_c"])
        n, c, g, pixels = geo["N"], geo["C"], geo["G"], geo["HW"]
        if v not in self._vecs(card, geo) or c // v > block or c % tc or tc % v or tp % v \
                or (flat and (not geo["out_cl"] or c * (12 if ib is not None else 8) > SMEM_STATIC)) \
                or (ib_form is not None and ib_form not in INPUT_BIAS_FORMS) \
                or params.get("order", "chunks") not in ("chunks", "sweep"):
            raise ValueError(f"params {dict(params)} do not fit this card (C={c}, {pixels} pixels)")
        # flat apply: about 8 blocks per SM over the images, none without a full step of vectors
        steps = -(-(pixels * c // v) // (block * u))
        ab = max(1, min(steps, -(-8 * hw.sms // n)))
        chunk = -(-pixels // p)
        tpg = 1
        while tpg * 2 <= block // g and tpg * 2 <= p:
            tpg *= 2
        tw = cc.ctype(w["dtype"]) if w is not None else "float"
        tb = cc.ctype(b["dtype"]) if b is not None else "float"
        wb_params, wb_locals = cc.ptr_params([(has_w, "TW", "w", "const "), (has_b, "TB", "bias", "const ")])
        body = cc.substitute(_BODY + (_FLAT if flat else _TILE), T=cc.ctype(x["dtype"]), TW=tw, TB=tb, TS=cc.ctype(card.outputs[1]["dtype"]),
                             V=v, BLOCK=block, U=u, C=c, G=g, HW=pixels, HAS_W=cc.cbool(has_w),
                             HAS_B=cc.cbool(has_b), P=p, CHUNK=chunk, TPG=tpg, TP=tp, TC=tc, SWEEP=cc.cbool(sweep),
                             OUT_CL=cc.cbool(geo["out_cl"]), AB=ab, WB_PARAMS=wb_params + ", " if wb_params else "",
                             WB_LOCALS=wb_locals,
                             **_input_bias_fragments(ib_form, cc.ctype(ib["dtype"]) if ib is not None else ""))
        wb_args = [("ptr", "weight")] * has_w + [("ptr", "bias")] * has_b
        ib_args = [("ptr", "input_bias")] if ib is not None else []
        tiles = n * ab if flat else n * (-(-pixels // tp)) * (c // tc)
        if n * p > cc.MAX_I32 or tiles > cc.MAX_I32:
            raise ValueError(f"{max(n * p, tiles)} blocks do not fit one grid")
        spec = "\n".join([
            f"# group_norm channels-last: {p} statistics blocks per image, then "
            + (f"{ab} flat apply blocks per image" if flat else f"{tp} x {tc} apply tiles")
            + (" (transposed to contiguous output)" if not geo["out_cl"] else "")
            + (", statistics swept front to back and applied back to front" if sweep else ""),
            "[[workspace]]", 'name = "part"', f'bytes = "{n * p * g * 12}"', "",
            "[[workspace]]", 'name = "ctr"', f'bytes = "{n * 4}"', "zero = true", "",
            "[[launch]]", 'kernel = "gncl_stats"', f'grid = ["{n * p}"]', f"block = [{block}]",
            "args = " + cc.spec_args([("ptr", "input"), *ib_args, ("ptr", "ws.part"), ("ptr", "ws.ctr"), ("ptr", "out1"),
                                      ("ptr", "out2"), ("f32", "eps")]), "",
            "[[launch]]", f'kernel = "{"gncl_apply_flat" if flat else "gncl_apply"}"', f'grid = ["{tiles}"]', f"block = [{block}]",
            "args = " + cc.spec_args([("ptr", "input"), *ib_args, *wb_args, ("ptr", "out0"), ("ptr", "out1"),
                                      ("ptr", "out2")]), ""])
        dtypes = [x["dtype"], card.outputs[1]["dtype"], *(t["dtype"] for t in (w, b, ib) if t is not None)]
        prelude = cc.prelude(dtypes, hinted=True, welford=True)
        source = f"// aten::native_group_norm, {card.signature_text}: channels-last\n" + prelude + body
        intent = (f"group_norm channels-last: {n} x {g} groups over {pixels} pixels, {p} statistics blocks per "
                  f"image, " + (f"flat apply ({ab} blocks per image)" if flat else f"{tp} x {tc} tiles")
                  + f", block {block}, vec {v}, unroll {u}" + (", swept (apply from the tail, in L2)" if sweep else "")
                  + (f", input bias ({ib_form})" if ib_form else ""))
        return Rendered(source=source, spec=spec, params=dict(params), intent=intent)


TEMPLATES: list[Template] = [GroupNormChannelsLastTemplate()]
