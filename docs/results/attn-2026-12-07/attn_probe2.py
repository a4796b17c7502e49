"""Issue 20's VAE target, the attention's share: can the decoder's mid-block attention (1 head, 16,384 tokens,
d = 512, bf16) beat the math form the attention routes compile it to (1.478 ms on an H100, 2026-12-07, against
SDPA's 4.642 ms)? Arms, each compiled, CUDA events, medians of 30, rel L2 against float64 on 512 query rows:
the math form (S in float32) whole and over 8/16/32 query chunks (S of a chunk in L2), and FlexAttention's
Triton flash kernel (no score_mod) with its default and a few block shapes (d = 512 holds a large accumulator).
    python attn_probe2.py OUT_DIR"""
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run of the arms on a small N
N, D = (128 * 128 if dev == "cuda" else 512), 512
torch.manual_seed(0)
q, k, v = (torch.randn(1, 1, N, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
scale = D ** -0.5
rows = torch.randperm(N, device=dev)[:512]


def ref64():
    s = (q[0, 0, rows].double() @ k[0, 0].double().T) * scale
    return (s.softmax(-1) @ v[0, 0].double())


def sdpa():
    return F.scaled_dot_product_attention(q, k, v)


def math_f32():
    s = torch.mm(q[0, 0], k[0, 0].T, out_dtype=torch.float32)
    p = torch.softmax(s * scale, -1).to(torch.bfloat16)
    return (p @ v[0, 0])[None, None]


def chunked(n):
    def f():
        outs = []
        for i in range(n):
            sl = slice(i * N // n, (i + 1) * N // n)
            s = torch.mm(q[0, 0, sl], k[0, 0].T, out_dtype=torch.float32)
            outs.append(torch.softmax(s * scale, -1).to(torch.bfloat16) @ v[0, 0])
        return torch.cat(outs)[None, None]
    return f


def flex(opts=None):
    from torch.nn.attention.flex_attention import flex_attention
    fa = torch.compile(flex_attention)

    def f():
        return fa(q, k, v, kernel_options=opts) if opts else fa(q, k, v)
    return f


def timed(fn, reps=30):
    if dev == "cpu":
        return float("nan")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    ref = ref64()
    res = {"gpu": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
           "shape": [1, 1, N, D]}
    arms = {"sdpa (eager's pick)": sdpa, "compiled math f32": torch.compile(math_f32)}
    for n in (8, 16, 32):
        arms[f"compiled math f32, {n} query chunks"] = torch.compile(chunked(n))
    arms["flex, default blocks"] = flex()
    for bm, bn, w, st in ((64, 32, 4, 1), (64, 32, 8, 1), (32, 32, 4, 1), (64, 64, 8, 1), (128, 32, 8, 1),
                          (64, 16, 4, 2)):
        arms[f"flex BLOCK_M={bm} BLOCK_N={bn} warps={w} stages={st}"] = flex(
            {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": st})
    for name, fn in arms.items():
        try:
            with torch.no_grad():
                o = fn()
                err = ((o[0, 0, rows].double() - ref).norm() / ref.norm()).item()
                ms = timed(fn)
            res[name] = {"ms": round(ms, 3), "rel_l2_vs_f64": err}
        except Exception as e:  # an arm this torch or GPU cannot run (shared memory, registers)
            res[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        if dev == "cuda":
            torch.cuda.empty_cache()
        print(name, res[name], flush=True)
        (out / "attn_probe2.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
