"""A chain card's member graph as readable PyTorch code: the spec a proposer implements for a chain.

`chain_code(signature)` renders `signature["chain"]` (engine.capture.chains.chain_signature) as the body of
`def chain(in0, in1, ...)`: one line per member, common ops in their usual spelling (`in0.to(torch.float32)`,
`t1.pow(2)`, `t2.mean(dim=[-1], keepdim=True)`, `t3 + 1e-06`), any other as `torch.ops.aten.<op>(...)` with
every argument as captured. The code is exact: exec'd with torch it returns what `run_chain` returns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

CHAIN_OP = "kforge::chain"  # engine.capture.chains.CHAIN_OP


def _py(v: Any) -> str:
    """A Python literal for a decoded argument value (torch dtypes, layouts, devices, special floats)."""
    import torch

    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    if isinstance(v, (torch.dtype, torch.layout, torch.memory_format)):
        return str(v)
    if isinstance(v, float) and not math.isfinite(v):
        return f"float({str(v)!r})"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_py(x) for x in v) + "]"
    return repr(v)


def _names(nodes: list[Mapping[str, Any]]) -> dict[tuple, str]:
    names: dict[tuple, str] = {}
    for j, n in enumerate(nodes):
        for k in range(n["results"]):
            names[("node", j, k)] = f"t{j}" if n["results"] == 1 else f"t{j}_{k}"
    return names


_INFIX = {"aten::add.Tensor": "+", "aten::sub.Tensor": "-", "aten::mul.Tensor": "*", "aten::div.Tensor": "/"}
_METHOD = {"aten::rsqrt": "torch.rsqrt", "aten::silu": "torch.nn.functional.silu", "aten::sigmoid": "torch.sigmoid",
           "aten::tanh": "torch.tanh", "aten::exp": "torch.exp", "aten::neg": "torch.neg"}


def _line(op: str, args: list[tuple[str, Any, bool]], schema_args: list[Any]) -> str:
    """The expression one member computes. `args`: (name, text, is_tensor) in schema order."""
    a = {name: text for name, text, _ in args}
    if op in _INFIX and a.get("alpha", "1") == "1" and set(a) <= {"self", "other", "alpha"}:
        return f"{a['self']} {_INFIX[op]} {a['other']}"
    if op in _METHOD and set(a) == {"self"}:
        return f"{_METHOD[op]}({a['self']})"
    if op == "aten::pow.Tensor_Scalar":
        return f"{a['self']}.pow({a['exponent']})"
    if op == "aten::mean.dim" and a.get("dtype") == "None":
        return f"{a['self']}.mean(dim={a['dim']}, keepdim={a['keepdim']})"
    if op == "aten::gelu":
        return f"torch.nn.functional.gelu({a['self']}, approximate={a['approximate']})"
    if op in ("aten::view", "aten::_unsafe_view", "aten::reshape"):
        return f"{a['self']}.view({a['size']})"
    if op == "aten::_to_copy" and all(a.get(k, "None") in ("None", "False") or k in ("self", "dtype", "device", "layout")
                                      for k in a) and a.get("layout", "None") in ("None", "torch.strided"):
        return f"{a['self']}.to({a['dtype']})" if a.get("dtype", "None") != "None" else f"{a['self']}.clone()"
    # Anything else: the ATen call itself, arguments in schema order (keyword-only ones by name).
    pos, kw = [], []
    for (name, text, _), s in zip(args, schema_args):
        (kw.append(f"{name}={text}") if s.kwarg_only else pos.append(text))
    ns, _, rest = op.partition("::")
    base, _, overload = rest.partition(".")
    return f"torch.ops.{ns}.{base}.{overload or 'default'}({', '.join(pos + kw)})"


def chain_code(signature: Mapping[str, Any]) -> str:
    """`def chain(in0, ...)` computing the chain's outputs, in `signature["chain"]["outputs"]` order."""
    from engine.capture.signature import decode_value
    from engine.ops import resolve_op

    nodes = list(signature["chain"]["nodes"])
    names = _names(nodes)
    inputs = [a["name"] for a in signature["args"]]
    ref = {("in", i): n for i, n in enumerate(inputs)}
    ref.update(names)
    lines = [f"def chain({', '.join(inputs)}):"]
    for j, n in enumerate(nodes):
        schema_args = list(resolve_op(n["op"])._schema.arguments)
        args = []
        for a in n["args"]:
            if "tensor" in a:
                args.append((a["name"], ref[tuple(a["tensor"])], True))
            elif "tensors" in a:
                args.append((a["name"], "[" + ", ".join("None" if r is None else ref[tuple(r)] for r in a["tensors"])
                                        + "]", True))
            else:
                args.append((a["name"], _py(decode_value(a.get("value"))), False))
        by_name = {s.name: s for s in schema_args}
        expr = _line(n["op"], args, [by_name[name] for name, _, _ in args])
        outs = [names[("node", j, k)] for k in range(n["results"])]
        target = outs[0] if n["results"] == 1 else ", ".join(outs)
        if n["results"] == 1 and n["op"] == "aten::split.Tensor":
            target += ","
        lines.append(f"    {target} = {expr}  # {n['op']}")
    outs = [names[("node", int(j), int(k))] for j, k in signature["chain"]["outputs"]]
    lines.append(f"    return {', '.join(outs)}" + ("," if len(outs) == 1 else ""))
    return "\n".join(lines)


def chain_semantics(signature: Mapping[str, Any]) -> str:
    """The prompt's 'what it computes' for a chain card: the code, and how its outputs are named."""
    from engine.capture.chains import chain_written_inputs

    outs = len(signature["chain"]["outputs"])
    named = ", ".join(f"`out{k}`" for k in range(outs))
    written = chain_written_inputs(signature)
    writes = (f" It also writes {', '.join(f'`{n}`' for n in written)} in place, as the code's in-place call does: "
              "your kernel must leave that input as the code leaves it (the verifier compares it)." if written else "")
    return ("one kernel (or a few launches) computing this whole chain of ATen calls, exactly as this PyTorch code "
            f"does (it is eager for the card); it returns {outs} tensor(s), {named} in the launch spec, in the "
            "order of its return." + writes + " Intermediates need not be stored; round to bfloat16/float16 where "
            "the code does (a `.to(...)`, or an op whose inputs are all half precision), accumulate in float32 where "
            "it upcasts.\n\n```python\n" + chain_code(signature) + "\n```")
