"""Issue 20's VAE target: what the decoder's mid-block attention (1 head, 16,384 tokens of d = 512 at a 1024^2
decode, bf16) costs, and what other ways of computing it would. Under torch.compile it is one memory-efficient
attention kernel (fmha_cutlassF, an sm80 kernel): 4.55 ms of the compiled decode's 28.0 ms of kernels on an
H100 (2026-12-06g, where_compiled.py). Flash attention takes d <= 256. Timed here, CUDA events, medians of 30:
SDPA as eager picks it; the math form (S = q k^T in bf16 or float32, softmax in float32, P v) in eager and
compiled; the same over query chunks. Accuracy: rel L2 of each against float64 on 512 query rows.
    python attn_probe.py OUT_DIR"""
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run of the arms on a small N
N, D = (128 * 128 if dev == "cuda" else 1024), 512
torch.manual_seed(0)
q, k, v = (torch.randn(1, 1, N, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
scale = D ** -0.5
rows = torch.randperm(N, device=dev)[:512]


def ref64():
    s = (q[0, 0, rows].double() @ k[0, 0].double().T) * scale
    return (s.softmax(-1) @ v[0, 0].double())


def sdpa():
    return F.scaled_dot_product_attention(q, k, v)


def math_bf16():
    s = (q[0, 0] * scale) @ k[0, 0].T
    return (s.float().softmax(-1).to(torch.bfloat16) @ v[0, 0])[None, None]


def math_f32():
    s = torch.mm(q[0, 0], k[0, 0].T, out_dtype=torch.float32)
    p = torch.softmax(s * scale, -1).to(torch.bfloat16)
    return (p @ v[0, 0])[None, None]


def chunked(n=4):
    def f():
        out = torch.empty_like(q)
        for i in range(n):
            sl = slice(i * N // n, (i + 1) * N // n)
            s = torch.mm(q[0, 0, sl], k[0, 0].T, out_dtype=torch.float32)
            out[0, 0, sl] = torch.softmax(s * scale, -1).to(torch.bfloat16) @ v[0, 0]
        return out
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
    res = {"gpu": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__, "shape": [1, 1, N, D]}
    arms = {"sdpa (eager's pick)": sdpa, "math, S in bf16": math_bf16, "math, S in float32": math_f32,
            "math f32, 4 query chunks": chunked(4), "math f32, 2 query chunks": chunked(2)}
    for name in list(arms):
        if name.startswith("math"):
            arms[f"compiled {name}"] = torch.compile(arms[name])
    arms["compiled sdpa"] = torch.compile(sdpa)
    for name, fn in arms.items():
        try:
            with torch.no_grad():
                o = fn()
                err = ((o[0, 0, rows].double() - ref).norm() / ref.norm()).item()
                ms = timed(fn)
            torch.cuda.empty_cache()
            res[name] = {"ms": round(ms, 3), "rel_l2_vs_f64": err}
        except Exception as e:  # an arm this torch cannot run
            res[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        print(name, res[name], flush=True)
    with torch.no_grad():
        res["sdpa backend note"] = "flash needs d <= 256; eager's pick here is memory-efficient (fmha_cutlassF)"
    (out / "attn_probe.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
