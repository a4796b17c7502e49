"""Prompts for LLM proposers: templates in `prompts/*.md`, filled from a ProposalRequest.

Templates use `str.format_map` placeholders (`{name}`); a literal brace in a template is doubled
(`{{`). Values are inserted verbatim, so sources and specs need no escaping. `example_answer.md` is
inserted raw (never formatted), so the worked example stays real, compilable code.

    system, messages = build_messages(request)     # system text, [Message('user', ...)]

The focus of a request is `request.intent`, chosen by the orchestrator (`engine.propose.intents`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from engine.cards import OperatorCard
from engine.launch.expr import FUNCTIONS, INDEXED_ATTRS, SCALAR_ATTRS
from engine.launch.spec import CTYPES, MAX_ARGS, MAX_LAUNCHES, MAX_THREADS, MAX_WORKSPACES
from engine.propose.base import Attempt, Hardware, ProposalRequest
from engine.propose.chain_code import CHAIN_OP, chain_semantics
from engine.propose.intents import INTENT_DESCRIPTIONS, INTENTS
from engine.propose.providers.base import Message

# Bounds that keep a prompt a few thousand tokens however long a search runs.
MAX_LINEAGE_ROWS = 8
MAX_SIBLING_ROWS = 12
MAX_NOTE_CHARS = 140
MAX_REPORT_CHARS = 4000
MAX_DIAGNOSTICS_CHARS = 6000
MAX_SOURCE_CHARS = 60_000


# What each rejection category means, for repair prompts.
CATEGORY_MEANING: dict[str, str] = {
    "compile": "it did not compile (NVRTC diagnostics below; line numbers refer to candidate.cu, the source "
               "exactly as you wrote it).",
    "launch": "the launcher refused to launch it as specified (spec values versus the kernel's signature and "
              "the device limits).",
    "runtime-fault": "it raised a CUDA error while running (illegal or misaligned address, trap): check "
                     "bounds, alignment of vector accesses and index overflow.",
    "timeout": "it did not finish in time: an endless loop, a spin wait, or __syncthreads() in divergent code.",
    "mismatch": "its results differ from eager PyTorch beyond the tolerance.",
    "nan": "outputs hold NaN where eager has numbers: elements left unwritten (outputs are pre-filled with "
           "NaN), or NaN produced by the arithmetic.",
    "mutation": "an input tensor changed; inputs are read-only unless the op itself writes them.",
    "nondeterminism": "two runs on the same inputs gave different results: a race, uninitialised shared "
                      "memory, atomics in varying order, or state kept between calls.",
    "suspicious": "it measured faster than its bytes, FLOPs or a launch physically allow, which is impossible.",
    "overrun": "it wrote outside its buffers (past the end or before the start of an output, workspace or input): "
               "check the bounds of every store, including vector stores at the tail.",
    "cheating": "its outputs in timed calls differ from eager's on the same inputs (it behaves differently when "
                "timed), or it returned what its output buffer held before the call: compute every output, always.",
    "bad-spec": "its launch spec is invalid.",
    "host-code": "it contains host code, which the contract forbids.",
    "no-spec": "the answer had no launch spec.",
    "truncated": "the answer was cut off.",
}

# One line of semantics for common ops (base name without a trailing '_'); others get a generic line.
SEMANTICS: dict[str, str] = {
    "add": "self + alpha * other, elementwise with broadcasting.",
    "sub": "self - alpha * other, elementwise with broadcasting.",
    "rsub": "other - alpha * self, elementwise with broadcasting.",
    "mul": "self * other, elementwise with broadcasting.",
    "div": "self / other elementwise with broadcasting (true division unless rounding_mode is given).",
    "neg": "-x elementwise.", "abs": "|x| elementwise.", "exp": "e^x elementwise.",
    "log": "natural logarithm elementwise.", "sqrt": "square root elementwise.",
    "rsqrt": "1 / sqrt(x) elementwise.", "reciprocal": "1 / x elementwise.",
    "pow": "self ** exponent elementwise.", "square": "x * x elementwise.",
    "sin": "sin(x) elementwise.", "cos": "cos(x) elementwise.", "tanh": "tanh(x) elementwise.",
    "erf": "the error function elementwise.",
    "relu": "max(x, 0) elementwise (NaN stays NaN).",
    "sigmoid": "1 / (1 + exp(-x)) elementwise.",
    "silu": "x * sigmoid(x) elementwise.",
    "gelu": "0.5 * x * (1 + erf(x / sqrt(2))) elementwise; with approximate='tanh': "
            "0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))).",
    "hardtanh": "clamp(x, min_val, max_val) elementwise.",
    "leaky_relu": "x if x > 0 else negative_slope * x, elementwise.",
    "clamp": "min(max(x, min), max) elementwise (a missing bound is not applied).",
    "where": "condition ? self : other, elementwise with broadcasting.",
    "masked_fill": "self with value wherever mask is true (mask broadcasts).",
    "clone": "a copy of self, laid out as the output below.",
    "copy": "copies src into self (broadcasting, converting the dtype); self is the result.",
    "_to_copy": "a copy of self converted to the requested dtype, laid out as the output below.",
    "fill": "every element set to value.", "zero": "every element set to 0.",
    "cat": "the tensors concatenated along dim.",
    "constant_pad_nd": "self padded with value by pad (pairs from the last dim backwards; negative pads crop).",
    "index_select": "the slices of self at index along dim.",
    "embedding": "out[..., :] = weight[indices[...], :] (rows of weight gathered by indices).",
    "sum": "the sum over dim (keepdim as given), accumulated in float32 for reduced-precision inputs.",
    "mean": "the mean over dim (keepdim as given), accumulated in float32 for reduced-precision inputs.",
    "amax": "the maximum over dim (keepdim as given).",
    "_softmax": "softmax along dim: exp(x - max) / sum(exp(x - max)); half_to_float asks for a float32 result.",
    "_log_softmax": "x - max - log(sum(exp(x - max))) along dim.",
    "native_layer_norm": "normalises over the trailing normalized_shape dims: y = (x - mean) / sqrt(var + eps) "
                         "* weight + bias (biased variance); returns (y, mean, rstd).",
    "native_group_norm": "splits C into `group` groups and normalises each (n, group) over C/group * HxW "
                         "elements: y = (x - mean) * rstd * weight[c] + bias[c]; returns (y, mean, rstd).",
    "native_batch_norm": "per channel (dim 1): y = (x - mean) / sqrt(var + eps) * weight + bias, with the "
                         "running statistics when training=False and the batch statistics when training=True; "
                         "returns (y, save_mean, save_invstd) — write every output as eager does.",
    "rms_norm": "x / sqrt(mean(x^2 over normalized_shape) + eps) * weight.",
    "mm": "the matrix product self @ mat2.",
    "bmm": "the batched matrix product self[b] @ mat2[b].",
    "addmm": "beta * self + alpha * (mat1 @ mat2), self broadcast over the rows.",
    "baddbmm": "beta * self + alpha * (batch1[b] @ batch2[b]).",
    "linear": "input @ weight^T + bias.",
    "convolution": "N-d convolution of input with weight (+ bias) with the given stride, padding, dilation and "
                   "groups (a transposed convolution when transposed=True).",
    "max_pool2d_with_indices": "2-D max pooling; returns (values, int64 indices into each flattened H*W plane).",
    "avg_pool2d": "2-D average pooling with the given window, stride and padding rules.",
    "adaptive_avg_pool2d": "2-D average pooling to the given output size.",
    "_scaled_dot_product_flash_attention": "softmax(q @ k^T * scale, causal if asked) @ v per batch and head; "
                                           "also returns the logsumexp and bookkeeping outputs listed below.",
    "_scaled_dot_product_efficient_attention": "softmax(q @ k^T * scale + attn_bias, causal if asked) @ v per "
                                               "batch and head; also returns the outputs listed below.",
}


class PromptError(KeyError):
    """A template uses a placeholder that no value was given for."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class _Values(dict):
    """format_map mapping that names the template and the missing placeholder."""

    def __init__(self, template: str, values: Mapping[str, Any]) -> None:
        super().__init__(values)
        self.template = template

    def __missing__(self, key: str) -> Any:
        raise PromptError(f"prompt template {self.template}.md uses {{{key}}} but no value was given "
                          f"(given: {', '.join(sorted(self)) or 'nothing'})")


@functools.cache
def template(name: str) -> str:
    """The text of prompts/NAME.md (package data)."""
    path = resources.files("engine.propose").joinpath("prompts").joinpath(f"{name}.md")
    return path.read_text(encoding="utf-8")


def render(template_name: str, /, **values: Any) -> str:
    """prompts/NAME.md with its placeholders filled; PromptError names any missing one."""
    return template(template_name).format_map(_Values(template_name, values)).strip() + "\n"


# -------------------------------------------------------------------------------------------- messages


def build_messages(request: ProposalRequest) -> tuple[str, list[Message]]:
    """The system prompt and the conversation for one request (fresh kernel, revision or repair)."""
    parts = [card_section(request.card, request.hardware), hardware_section(request.hardware)]
    if request.failed is not None:
        parts.append(repair_section(request))
    elif request.parent is not None:
        parts.append(revise_section(request))
    else:
        parts.append(fresh_section(request))
    return system_prompt(), [Message("user", "\n".join(parts))]


@functools.lru_cache(maxsize=1)
def system_prompt() -> str:
    """The role, the candidate contract, the spec language, the verification rules and the worked example."""
    return render(
        "system",
        ctypes=", ".join(f"`{c}`" for c in CTYPES),
        functions=", ".join(f"`{f}(a, b)`" for f in FUNCTIONS),
        scalar_attrs=", ".join(SCALAR_ATTRS), indexed_attrs=", ".join(INDEXED_ATTRS),
        max_launches=MAX_LAUNCHES, max_workspaces=MAX_WORKSPACES, max_args=MAX_ARGS, max_threads=MAX_THREADS,
        example_answer=template("example_answer").strip(),
    )


def followup_prompt(kernels: Sequence[str], reason: str) -> str:
    """The targeted follow-up when an answer had the kernel but no usable spec."""
    names = ", ".join(f"`{k}`" for k in kernels) or "(the extern \"C\" __global__ kernels of your source)"
    return render("followup_spec", kernels=names, reason=reason.rstrip("."))


# ---------------------------------------------------------------------------------------------- card


def card_section(card: OperatorCard, hardware: Hardware) -> str:
    """The card: schema, semantics, exact arguments, outputs and the numbers that bound the kernel."""
    if card.op == CHAIN_OP and "chain" in card.signature:
        n = len(card.signature["chain"]["nodes"])
        schema, arg_types, aliases, write_only = f"{CHAIN_OP}: a chain of {n} ATen calls, one card", {}, [], []
        what = chain_semantics(card.signature)
    else:
        schema, arg_types, aliases, write_only = _schema_info(card.op)
        what = semantics(card.op)
    roofline = card.roofline_us
    if roofline is None and card.bytes and hardware.bandwidth_bps:
        roofline = card.bytes / hardware.bandwidth_bps * 1e6
    return render(
        "card",
        op=card.op, card_id=card.card_id, schema=schema, semantics=what,
        signature_text=card.signature_text or "(not given)",
        arguments="\n".join(_argument_lines(card.signature, arg_types)) or "- none",
        outputs="\n".join(_output_lines(card.outputs, aliases, write_only)),
        tolerance=_tolerance_text(card),
        calls=f"{card.calls:g}", share=f"{card.share:.1%}",
        eager=f"{card.eager_us:.2f} µs" if card.eager_us is not None else "not measured yet",
        bytes=_bytes_text(card.bytes) if card.bytes else "unknown",
        roofline=f"{roofline:.2f} µs" if roofline is not None else "unknown",
    )


def hardware_section(hw: Hardware) -> str:
    """The GPU the kernel will run on: its limits, and the features it has and lacks."""
    cc = hw.capability
    return render(
        "hardware", name=hw.name, arch=hw.arch, capability=f"{cc[0]}.{cc[1]}" if cc else "unknown",
        sms=hw.sms, threads_per_sm=f"{hw.max_threads_per_sm:,}", l2=f"{hw.l2_bytes / 2**20:.0f} MiB",
        bandwidth=_bandwidth_text(hw.bandwidth_bps),
        bandwidth_kind=("measured copy bandwidth, bytes read + written per second" if hw.measured
                        else "published peak; a copy reaches less"),
        memory_note="; unified memory shared with the CPU" if hw.integrated else "",
        max_shared=f"{hw.max_shared_per_block:,}", shared_per_sm=f"{hw.shared_per_sm:,}",
        clusters=("available (`__cluster_dims__`, at most 8 blocks portably)" if hw.clusters
                  else "not available on this GPU: do not use `__cluster_dims__` or cluster barriers"),
        instructions=_instructions(cc, hw.arch),
    )


def _instructions(cc: tuple[int, int] | None, arch: str) -> str:
    """The tensor-core and copy instructions this arch has, and the ones it lacks or that do not compile."""
    if cc is None:
        return "unknown arch: portable CUDA C++ only"
    if cc >= (12, 0):
        return ("tensor cores through `mma.sync` (this GPU has no `wgmma`, no `tcgen05`/TMEM, no distributed "
                "shared memory and no TMA multicast); `cp.async` for asynchronous copies")
    if cc >= (10, 0):
        return (f"`mma.sync`, `ldmatrix`, `cp.async`, TMA (`cp.async.bulk`); `wgmma` is Hopper only, and "
                f"`tcgen05` needs the `sm_{cc[0]}{cc[1]}a` target: neither compiles for `{arch}`")
    if cc >= (9, 0):
        return (f"`mma.sync`, `ldmatrix`, `cp.async`, TMA (`cp.async.bulk`); `wgmma` and `setmaxnreg` need "
                f"the `sm_90a` target and do not compile for `{arch}`")
    if cc >= (8, 0):
        return "`mma.sync`, `ldmatrix`, `cp.async`; no `wgmma`, TMA or `setmaxnreg` (those are sm_90 and up)"
    return "pre-Ampere: no `cp.async`, no bf16 tensor cores, no `wgmma` or TMA"


def _bandwidth_text(bps: float) -> str:
    return f"{bps / 1e12:.2f} TB/s" if bps >= 1e12 else f"{bps / 1e9:.0f} GB/s"


def semantics(op: str) -> str:
    """A one-line note of what `op` computes (a generic line for ops the table lacks)."""
    ns, _, rest = op.partition("::")
    base, _, overload = rest.partition(".")
    name = base[:-1] if base.endswith("_") and not base.endswith("__") else base
    line = SEMANTICS.get(name) or SEMANTICS.get(name.lstrip("_"))
    if line is None:
        family = _family(op)
        line = (f"exactly what torch.ops.{ns or 'aten'}.{base}.{overload or 'default'} computes for these "
                f"arguments (see the schema; tolerance family: {family}).")
    if name != base:
        line += " In place: the result is written into `self`."
    return line


def _family(op: str) -> str:
    try:
        from engine.verify.tolerance import op_family

        return op_family(op)
    except Exception:  # a note in a prompt must never fail the prompt
        return "unknown"


def _schema_info(op: str) -> tuple[str, dict[str, str], list[str | None], list[str]]:
    """(schema text, argument name -> schema type, per-return aliased argument, out= arguments)."""
    try:
        from engine.ops import resolve_op, return_aliases, write_only_args

        overload = resolve_op(op)
        schema = overload._schema
        types = {a.name: str(a.type) for a in schema.arguments}
        return str(schema), types, return_aliases(overload), write_only_args(overload)
    except Exception:  # unknown to this PyTorch: the card alone still describes the call
        return f"{op} (schema not available in this PyTorch)", {}, [], []


def _contiguous(shape: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return strides[::-1]


def _layout(shape: Sequence[int], stride: Sequence[int]) -> str:
    # Strides of size-1 dims never matter for addressing, so they do not break contiguity.
    if all(n == 1 or s == c for n, s, c in zip(shape, stride, _contiguous(shape))):
        return "contiguous"
    notes = []
    broadcast = [i for i, (n, s) in enumerate(zip(shape, stride)) if s == 0 and n > 1]
    if broadcast:
        notes.append(f"broadcast along dim {', '.join(map(str, broadcast))} (stride 0)")
    if len(shape) == 4 and list(stride) == [shape[1] * shape[2] * shape[3], 1, shape[3] * shape[1], shape[1]]:
        notes.append("channels-last (NHWC in memory)")
    return "non-contiguous" + (": " + "; ".join(notes) if notes else "")


def tensor_text(d: Mapping[str, Any]) -> str:
    """'float16 shape [32, 64] stride [64, 1] (contiguous), 16-byte aligned, 2,048 elements'."""
    shape, stride = list(d["shape"]), list(d["stride"])
    text = (f"{d['dtype']} shape {shape} stride {stride} ({_layout(shape, stride)}), "
            f"{d.get('align', 16)}-byte aligned, {math.prod(shape):,} elements")
    if d.get("neg"):
        text += ", lazily negated (neg bit set)"
    if d.get("conj"):
        text += ", lazily conjugated (conj bit set)"
    return text


def _value_text(v: Any) -> str:
    if isinstance(v, dict) and len(v) == 1:
        ((kind, x),) = v.items()
        return f"torch.{x}" if kind in ("dtype", "memory_format", "layout") else str(x)
    if isinstance(v, list):
        return "[" + ", ".join(_value_text(x) for x in v) + "]"
    return repr(v)


def _argument_lines(signature: Mapping[str, Any], types: Mapping[str, str]) -> list[str]:
    lines = []
    for a in signature.get("args", []):
        name, kind = a["name"], a.get("kind")
        typ = f" ({types[name]})" if name in types else ""
        if kind == "tensor" and a.get("absent"):
            lines.append(f"- `{name}`{typ}: None — absent; `{{ ptr = \"{name}\" }}` passes NULL")
        elif kind == "tensor":
            lines.append(f"- `{name}`{typ}: {tensor_text(a)}")
        elif kind == "tensor_list":
            items = a.get("items", [])
            lines.append(f"- `{name}`{typ}: a list of {len(items)} tensors, named `{name}_0` … "
                         f"`{name}_{len(items) - 1}` in the spec")
            for j, d in enumerate(items):
                lines.append(f"  - `{name}_{j}`: " + ("None" if d is None else tensor_text(d)))
        else:
            lines.append(f"- `{name}`{typ} = {_value_text(a.get('value'))}")
    for group in signature.get("aliases", []):
        lines.append(f"- aliasing: {' and '.join(f'`{p}`' for p in group)} share one storage")
    return lines


def _output_lines(outputs: Sequence[Mapping[str, Any]], aliases: Sequence[str | None],
                  write_only: Sequence[str]) -> list[str]:
    lines = []
    for k, d in enumerate(outputs):
        label = f"`out{k}`" + (" (also `out`)" if k == 0 else "")
        alias = aliases[k] if k < len(aliases) else None
        if alias is not None:
            lines.append(f"- {label}: is the input `{alias}` itself ({tensor_text(d)}); the op writes its "
                         f"result into `{alias}`, so write it there")
        elif d.get("kind", "tensor") == "tensor" and "shape" in d:
            lines.append(f"- {label}: {tensor_text(d)}")
        else:
            lines.append(f"- {label}: {d}")
    for name in write_only:
        lines.append(f"- `{name}` (an out= argument): pre-filled like an output; every element must be written")
    return lines or ["- none"]


def _tolerance_text(card: OperatorCard) -> str:
    rule = ("per element |actual - expected| <= atol + rtol * |expected| (+ rms_rtol * RMS of the expected "
            "output); 'exact' means bit-identical")
    from engine.verify.tolerance import tolerance_for

    per_output = [f"`out{k}` {tolerance_for(card.op, d['dtype']).describe()}"
                  for k, d in enumerate(card.outputs) if "dtype" in d]
    return ("; ".join(per_output) or "see the op's family") + f" ({rule})"


def _bytes_text(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n:,} B ({n / size:.2f} {unit})"
    return f"{n:,} B"


# ------------------------------------------------------------------------------------ task sections


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters with a note saying how much was left out."""
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[:limit].rstrip() + f"\n… [{len(text) - limit:,} more characters left out]"


def _first_line(text: str, limit: int = MAX_NOTE_CHARS) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = line.replace("|", "/")  # keeps the markdown table intact
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _result(a: Attempt) -> str:
    status = a.status or "?"
    return f"{status} ({a.category})" if a.category else status


def attempt_table(attempts: Sequence[Attempt], limit: int, *, what: str, marks: Mapping[int, str] | None = None,
                  keep: str = "last") -> str:
    """A markdown table of attempts (at most `limit` rows, with a note of how many were left out)."""
    if not attempts:
        return f"(no {what} yet)"
    rows = list(enumerate(attempts))
    omitted = max(0, len(rows) - limit)
    if omitted:
        rows = rows[-limit:] if keep == "last" else rows[:limit]
    out = ["| # | candidate | intent | result | time | speedup | note |", "|---|---|---|---|---|---|---|"]
    for i, a in rows:
        mark = (marks or {}).get(i, "")
        time = f"{a.best_us:.2f} µs" if a.best_us is not None else "—"
        speed = f"{a.speedup:.2f}×" if a.speedup is not None else "—"
        note = _first_line(a.message) if a.message else (_first_line(a.diagnostics) if a.diagnostics else "")
        out.append(f"| {i + 1}{mark} | {a.candidate_id or '—'} | {a.intent or '—'} | {_result(a)} | {time} "
                   f"| {speed} | {note} |")
    if omitted:
        where = "earlier" if keep == "last" else "later"
        out.append(f"\n({omitted} {where} {what} left out to keep this prompt short)")
    return "\n".join(out)


def _verdict(a: Attempt) -> str:
    if a.best_us is not None and not a.category:
        speed = f", {a.speedup:.2f}× eager" if a.speedup is not None else ""
        return f"{a.status or 'verified'}, {a.best_us:.2f} µs{speed}"
    text = a.status or "not evaluated"
    if a.category:
        text += f", rejected as {a.category}"
    if a.message:
        text += f": {_first_line(a.message, 400)}"
    return text


def _spec_lang(spec: str) -> str:
    return "json" if spec.lstrip().startswith("{") else "toml"


def fresh_section(request: ProposalRequest) -> str:
    """The task of a first kernel for the card (varied against siblings when there are some)."""
    intent = request.intent
    variety = ""
    if request.siblings:
        variety = ("\nOther first versions were already written for this card:\n\n"
                   + attempt_table(request.siblings, MAX_SIBLING_ROWS, what="siblings") + "\n\n"
                   "Take a different approach from them.")
    if intent:
        variety += f"\nFocus: **{intent}** — {INTENT_DESCRIPTIONS.get(intent, intent)}\n"
    card = request.card
    return render("fresh", bytes=_bytes_text(card.bytes) if card.bytes else "an unknown number of bytes",
                  variety=variety)


def revise_section(request: ProposalRequest) -> str:
    """The task of revising the parent along one intent, with its lineage and siblings."""
    parent = request.parent
    assert parent is not None
    # A request built without the orchestrator's choice still gets one focus (the template needs one).
    intent = request.intent or INTENTS[0]
    chain = [*request.lineage, parent]
    lineage = attempt_table(chain, MAX_LINEAGE_ROWS, what="ancestors", marks={len(chain) - 1: " (parent)"})
    return render(
        "revise",
        parent_id=parent.candidate_id or "parent", parent_verdict=_verdict(parent),
        parent_source=clip(parent.source, MAX_SOURCE_CHARS), parent_spec=parent.spec.strip(),
        parent_spec_lang=_spec_lang(parent.spec),
        lineage=lineage,
        siblings=attempt_table(request.siblings, MAX_SIBLING_ROWS, what="siblings"),
        intent=intent, intent_description=INTENT_DESCRIPTIONS.get(intent, ""),
    )


def repair_section(request: ProposalRequest) -> str:
    """The task of fixing one failed attempt, with its category and feedback; nothing else changes."""
    failed = request.failed
    assert failed is not None
    feedback = []
    if failed.diagnostics:
        feedback.append("Compiler diagnostics:\n```text\n" + clip(failed.diagnostics, MAX_DIAGNOSTICS_CHARS)
                        + "\n```")
    if failed.message:
        feedback.append("Report:\n```text\n" + clip(failed.message, MAX_REPORT_CHARS) + "\n```")
    category = failed.category or "failed"
    focus = request.intent or failed.intent
    return render(
        "repair",
        attempt_number=max(1, request.attempt), intent_note=f", focus: {focus}" if focus else "",
        category=category, category_meaning=CATEGORY_MEANING.get(category, "see the report below."),
        source=clip(failed.source, MAX_SOURCE_CHARS) or "(none)", spec=failed.spec.strip() or "(none)",
        spec_lang=_spec_lang(failed.spec), feedback="\n\n".join(feedback) or "(no further details were recorded)",
    )
