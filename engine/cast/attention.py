"""Attention routes: scaled-dot-product attention whose head dimension no flash kernel takes, computed by
torch.compile in its math form.

Why. PyTorch's flash attention takes head dimensions up to 256. Above that, SDPA runs its memory-efficient
kernel (cutlass, built for sm80). The VAE decoders of SD3/FLUX-style models have one such attention, one head of
d = 512 over 16,384 tokens at 1024²: 4.64 ms on an H100. Its math form takes 1.48 ms there once Inductor compiles
it (two cuBLAS GEMMs and one fused softmax), at the same accuracy: rel L2 from float64 2.34e-3 against SDPA's
2.30e-3. The math form is S = q kᵀ as a 16-bit GEMM with float32 output, softmax in float32, P v. In the
compiled SD3.5 VAE decode with its cast this took 1.352× to 1.536× over torch.compile alone, with the output
as far from the float32 model as before (docs/results/vae-split-2026-12-06h/, attn_probe.py and
attn_vae_probe.py).

How. The cast's compile backend (engine.cast.compose.CastBackend) rewrites the graph Dynamo hands it, before
AOTAutograd traces it. A call of `F.scaled_dot_product_attention` is replaced by `sdpa_math` only where it
matches one of the cast's proven signatures exactly. A signature is the shapes and dtype of q, k and v, and
the scale. The call must also pass no mask, no dropout, not be causal, and not use grouped KV heads. Sizes
must be static: a symbolic size never matches, and that call stays SDPA. Dynamo guards the compiled graph on
its shapes, so the rewritten graph runs only at the proven shapes. Inference only: a graph traced with grad
enabled is not rewritten (the backend keeps Inductor's own code there).

Not covered (a call keeps SDPA): masks (Gemma 4's d = 512 global layers are causal), more than
`MAX_HEADS` (batch x heads) matrices per call (the per-matrix GEMMs are unrolled into the graph), 32-bit
inputs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

FLASH_MAX_HEAD_DIM = 256   # PyTorch's flash attention takes head dims up to this; above, no flash kernel serves
MAX_HEADS = 8              # batch x heads per call: each is one GEMM pair unrolled into the graph
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
_SDPA = (torch._C._nn.scaled_dot_product_attention, F.scaled_dot_product_attention)
_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}


def sdpa_math(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None = None
              ) -> torch.Tensor:
    """softmax(q kᵀ · scale) v for 4-D 16-bit q, k, v of one batch x heads layout, the scores in float32.
    On a GPU the scores come from a 16-bit GEMM with float32 output; elsewhere from a float32 GEMM of the same
    values (their products are exact in float32 either way)."""
    b, h, n, d = query.shape
    m, e = key.shape[-2], value.shape[-1]
    s = scale if scale is not None else d ** -0.5
    q, k, v = query.reshape(b * h, n, d), key.reshape(b * h, m, d), value.reshape(b * h, m, e)
    outs = []
    # Autocast off: under it a float32 GEMM would run in 16 bits, and the scores lose what this form keeps
    # (review 2026-12-07: 1.22e-2 from float64 under CPU autocast against SDPA's 1.76e-3).
    with torch.autocast(query.device.type, enabled=False):
        for i in range(b * h):
            if query.is_cuda:
                scores = torch.mm(q[i], k[i].t(), out_dtype=torch.float32)
            else:
                scores = torch.mm(q[i].float(), k[i].float().t())
            p = torch.softmax(scores * s, dim=-1).to(query.dtype)
            outs.append(torch.mm(p, v[i]))
    return torch.stack(outs).reshape(b, h, n, e)


def bind(args: tuple, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The arguments of one SDPA call by name (None where they do not bind)."""
    if len(args) > len(_PARAMS) or any(k not in _PARAMS for k in kwargs):
        return None
    bound = dict(zip(_PARAMS, args))
    if any(k in bound for k in kwargs):
        return None
    bound.update(kwargs)
    if not all(p in bound for p in _PARAMS[:3]):
        return None
    return {**_DEFAULTS, **bound}


def _static_shape(t: Any) -> list[int] | None:
    shape = getattr(t, "shape", None)
    if shape is None or not all(type(s) is int for s in shape):
        return None
    return list(shape)


def query_may_qualify(shape: list[int]) -> bool:
    """Whether a query of this shape may be served by the math form: 4-D, a head dimension above flash's, at most
    MAX_HEADS batch x head matrices, nothing empty (what the export reads off a captured card before it traces
    the model; `signature_of` asks the rest)."""
    return (len(shape) == 4 and shape[3] > FLASH_MAX_HEAD_DIM and shape[0] * shape[1] <= MAX_HEADS
            and 0 not in shape)


def signature_of(q: Any, k: Any, v: Any, scale: Any) -> dict[str, Any] | None:
    """A call's signature where the math form may serve it: 4-D 16-bit q, k, v of static sizes, one dtype and
    device, a head dimension above flash's, at most MAX_HEADS matrices, keys and values of one length; None
    otherwise."""
    shapes = [_static_shape(t) for t in (q, k, v)]
    if any(s is None or len(s) != 4 for s in shapes):
        return None
    qs, ks, vs = shapes
    dtype = str(q.dtype).removeprefix("torch.")
    if dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return None
    if not (q.device == k.device == v.device):
        return None
    if not query_may_qualify(qs) or qs[:2] != ks[:2] or ks[:3] != vs[:3] or qs[3] != ks[3]:
        return None
    if 0 in ks or 0 in vs:
        return None
    if scale is not None and type(scale) not in (int, float):
        return None
    return {"q": qs, "k": ks, "v": vs, "dtype": dtype, "scale": None if scale is None else float(scale)}


def call_signature(bound: dict[str, Any]) -> dict[str, Any] | None:
    """The signature of a bound SDPA call whose options the math form computes (no mask, no dropout, not
    causal, no grouped KV heads); None otherwise."""
    if bound["attn_mask"] is not None or bound["is_causal"] is not False or bound["enable_gqa"] is not False:
        return None
    if type(bound["dropout_p"]) not in (int, float) or bound["dropout_p"] != 0:
        return None
    return signature_of(bound["query"], bound["key"], bound["value"], bound["scale"])


def _example(node: Any) -> Any:
    if isinstance(node, torch.fx.Node):
        return node.meta.get("example_value")
    return node


def _calls(gm: torch.fx.GraphModule) -> list[tuple[Any, dict[str, Any], dict[str, Any]]]:
    """The SDPA calls of a Dynamo graph the math form may serve: (node, its bound arguments, its signature).
    A call whose options are computed in the graph (not known at compile time) is none."""
    calls = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SDPA:
            continue
        bound = bind(tuple(node.args), dict(node.kwargs))
        if bound is None or any(isinstance(bound[p], torch.fx.Node) for p in _PARAMS[3:]):
            continue
        sig = call_signature({p: _example(bound[p]) for p in _PARAMS})
        if sig is not None:
            calls.append((node, bound, sig))
    return calls


def rewrite(gm: torch.fx.GraphModule, signatures: list[dict[str, Any]]) -> int:
    """Replace, in a Dynamo graph, each SDPA call whose signature is among `signatures` by `sdpa_math`; the
    number of calls replaced (the graph is recompiled where any was)."""
    if not signatures:
        return 0
    n = 0
    for node, bound, sig in _calls(gm):
        if sig not in signatures:
            continue
        with gm.graph.inserting_after(node):
            new = gm.graph.call_function(sdpa_math, (bound["query"], bound["key"], bound["value"]),
                                         {"scale": bound["scale"]})
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        n += 1
    if n:
        gm.graph.lint()
        gm.recompile()
    return n


def signatures_seen(gm: torch.fx.GraphModule) -> list[dict[str, Any]]:
    """The signatures of the SDPA calls in a Dynamo graph that the math form could serve (what an export
    tries)."""
    seen: list[dict[str, Any]] = []
    for _, _, sig in _calls(gm):
        if sig not in seen:
            seen.append(sig)
    return seen


def valid_signature(sig: Any) -> bool:
    """A manifest's signature entry as `signature_of` makes them (anything else is ignored by the loader)."""
    if not isinstance(sig, dict) or set(sig) != {"q", "k", "v", "dtype", "scale"}:
        return False
    shapes = [sig[x] for x in ("q", "k", "v")]
    if not all(isinstance(s, list) and len(s) == 4 and all(type(i) is int and i > 0 for i in s) for s in shapes):
        return False
    return sig["dtype"] in _DTYPES and (sig["scale"] is None or type(sig["scale"]) is float)
