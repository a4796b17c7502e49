"""Prompts rendered for real captured cards, intent variety, and answer extraction on realistic answers."""

import json
from pathlib import Path

import pytest

from engine.cards import OperatorCard
from engine.launch.spec import parse_spec
from engine.propose.answer import Extracted, complete_spec, extract, fenced_blocks, kernel_names
from engine.propose.base import Attempt, Hardware, ProposalRequest
from engine.propose.hardware_profiles import profile
from engine.propose.intents import INTENT_DESCRIPTIONS, INTENTS, choose_intent
from engine.propose.prompting import (
    PromptError,
    build_messages,
    followup_prompt,
    render,
    semantics,
    system_prompt,
    template,
)

ROOT = Path(__file__).resolve().parent.parent
CAPTURES = ROOT / "docs" / "results" / "capture-h200"


def real_card(model: str, card_id: str, **extra) -> OperatorCard:
    """The OperatorCard a proposer sees for a card of a recorded H200 capture."""
    cards = json.loads((CAPTURES / f"{model}.json").read_text())["cards"]
    c = next(c for c in cards if c["id"] == card_id)
    signature = {"op": c["op"], "args": c["args"], "aliases": c["aliases"]}
    return OperatorCard(c["id"], c["op"], signature, c["signature"], c["outputs"], calls=c["calls"],
                     share=c["share"], bytes=c["bytes"], eager_us=c["eager_us"], roofline_us=c["roofline_us"],
                     **extra)


BATCH_NORM = ("resnet50", "a88ee91511dc7668")      # native_batch_norm f16[32,256,14,14], three outputs
RELU_INPLACE = ("resnet50", "77093a82c7fa04cc")    # relu_ f16[32,256,14,14], output aliases self
MUL_BROADCAST = ("qwen35_a3b", "f224aaa6e5380649")  # mul f32 with a [1,32,1,1] operand, 4-byte aligned

RELU_SRC = (ROOT / "scripts" / "kernels" / "resnet_relu_inplace_f16.cu").read_text()
RELU_SPEC = (ROOT / "scripts" / "kernels" / "resnet_relu_inplace_f16.toml").read_text()


def user_text(request: ProposalRequest) -> str:
    _, messages = build_messages(request)
    assert [m.role for m in messages] == ["user"]
    return messages[0].content


# ---------------------------------------------------------------------------------------------- prompts


def test_fresh_prompt_holds_the_exact_card_hardware_and_contract():
    from engine.ops import resolve_op
    from engine.verify.tolerance import tolerance_for

    card = real_card(*BATCH_NORM)
    system, messages = build_messages(ProposalRequest(card, Hardware()))
    text = messages[0].content
    # The exact call: shapes, strides, dtype, alignment, scalar values, every output.
    assert "float16 shape [32, 256, 14, 14] stride [50176, 196, 14, 1] (contiguous), 16-byte aligned" in text
    assert "- `eps` (float) = 1e-05" in text and "- `training` (bool) = False" in text
    assert "`out1`: float32 shape [256] stride [1]" in text and "`out2`" in text
    assert str(resolve_op("aten::native_batch_norm")._schema) in text
    assert card.signature_text in text
    # Tolerance per output from the one table, bytes and the roofline (bytes / bandwidth).
    assert tolerance_for("aten::native_batch_norm", "float16").describe() in text
    assert "6,426,624 B" in text
    assert f"{6426624 / 4.25e12 * 1e6:.2f} µs" in text
    assert "not measured yet" in text
    # Hardware.
    for fact in ("NVIDIA H200", "sm_90", "132 SMs", "60 MiB", "4.25 TB/s", "232,448"):
        assert fact in text
    # The contract, the spec language, the verification rules and the worked example.
    for rule in ('extern "C" __global__', "never write host code", "pre-filled with NaN",
                 "Inputs must be unchanged", "L2 cache flushed", "its FLOPs (at the GPU's peak)", "guard bytes", "NaN/+inf/-inf", "[[launch]]",
                 "[[workspace]]", "`ceil_div(a, b)`", "`T.shape[i]`", "`out0`", "ws.NAME", "fresh random inputs",
                 "edge values", "```cuda", "```toml"):
        assert rule in system, rule
    assert template("example_answer").strip() in system
    assert "{" in system and "{{" not in system  # doubled braces were unescaped by format_map


def test_the_worked_example_is_a_real_compilable_answer():
    example = extract(template("example_answer"))
    assert example.ok, example
    assert kernel_names(example.source)[0] == ["silu"]
    assert (ROOT / "scripts" / "kernels" / "silu_bf16.cu").read_text().strip() == example.source.strip()
    # The spec-language sample of the system prompt parses too.
    sample = [b for b in fenced_blocks(system_prompt()) if b.tag == "toml"][0]
    spec = parse_spec(sample.body)
    assert [ln.kernel for ln in spec.launches] == ["row_partial", "row_finish"]
    assert [w.name for w in spec.workspaces] == ["partial"]
    try:
        from engine.compile import CompilerUnavailable, compile_nvrtc

        result = compile_nvrtc(example.source, arch="sm_90")
    except (ImportError, CompilerUnavailable):
        pytest.skip("NVRTC not available")
    assert result.ok, result.log
    assert "silu" in result.kernels


def test_card_layout_details_inplace_and_broadcast():
    mul = user_text(ProposalRequest(real_card(*MUL_BROADCAST), Hardware()))
    assert "`other` (Tensor): float32 shape [1, 32, 1, 1] stride [1024, 32, 1, 1]" in mul
    assert "4-byte aligned, 32 elements" in mul
    assert "self * other, elementwise with broadcasting" in mul
    relu = user_text(ProposalRequest(real_card(*RELU_INPLACE), Hardware()))
    assert "is the input `self` itself" in relu and "In place" in relu
    assert "`out0` exact" in relu


def test_measured_card_and_other_hardware():
    card = real_card(*RELU_INPLACE)
    card = OperatorCard(**{**card.__dict__, "eager_us": 14.25, "roofline_us": 4.5})
    text = user_text(ProposalRequest(card, profile("dgx-spark")))
    assert "Eager PyTorch time: 14.25 µs" in text and "4.50 µs" in text
    assert "NVIDIA GB10: sm_121 (compute capability 12.1), 48 SMs" in text and "24 MiB" in text
    assert "101,376 bytes per block" in text and "102,400 bytes per SM" in text
    assert "273 GB/s (published peak" in text and "unified memory shared with the CPU" in text
    assert "clusters: not available" in text and "no `wgmma`" in text


def test_hardware_section_states_what_the_gpu_has():
    h200 = user_text(ProposalRequest(real_card(*RELU_INPLACE), Hardware()))
    assert "sm_90 (compute capability 9.0), 132 SMs, at most 2,048 resident threads per SM" in h200
    assert "Thread-block clusters: available" in h200 and "(measured copy bandwidth" in h200
    a100 = user_text(ProposalRequest(real_card(*RELU_INPLACE), profile("a100")))
    assert "sm_80 (compute capability 8.0), 108 SMs" in a100 and "166,912 bytes per block" in a100
    assert "clusters: not available" in a100 and "no `wgmma`, TMA" in a100


def test_unknown_op_gets_a_generic_note():
    card = OperatorCard("c0", "myns::frobnicate.default", {"args": [], "aliases": []}, "", [
        {"kind": "tensor", "dtype": "float32", "shape": [8], "stride": [1], "align": 16}])
    text = user_text(ProposalRequest(card, Hardware()))
    assert "schema not available" in text
    assert "torch.ops.myns.frobnicate.default" in semantics("myns::frobnicate.default")
    assert "In place" in semantics("aten::add_.Tensor")


def test_revision_prompt_has_parent_lineage_siblings_and_one_focus():
    card = real_card(*RELU_INPLACE)
    parent = Attempt("cand-p", RELU_SRC, RELU_SPEC, intent="vectorisation", status="verified", best_us=10.5,
                     speedup=1.35)
    lineage = (Attempt("cand-root", "x", "y", intent="", status="verified", best_us=14.0, speedup=1.01),)
    siblings = (
        Attempt("cand-s1", "x", "y", intent="memory-access", status="rejected", category="mismatch",
                message="out0: max abs err 3.1 at index [0, 4, 1, 2]"),
        Attempt("cand-s2", "x", "y", intent="occupancy", status="verified", best_us=10.9, speedup=1.3),
    )
    request = ProposalRequest(card, Hardware(), parent=parent, lineage=lineage, siblings=siblings,
                              intent="fusing-passes")
    text = user_text(request)
    assert RELU_SRC.strip() in text and RELU_SPEC.strip() in text
    assert "verified, 10.50 µs, 1.35× eager" in text
    assert "cand-root" in text and "(parent)" in text and "14.00 µs" in text
    assert "cand-s1" in text and "rejected (mismatch)" in text and "max abs err 3.1" in text
    # The focus is the one the request asks for (the orchestrator chose it), and only that one.
    assert "Focus of this revision: fusing-passes" in text and INTENT_DESCRIPTIONS["fusing-passes"] in text
    assert not any(f"Focus of this revision: {i}" in text for i in INTENTS if i != "fusing-passes")


def test_repair_prompt_carries_the_failure():
    card = real_card(*RELU_INPLACE)
    diag = 'candidate.cu(4): error: identifier "x" is undefined\n    a[0] = x;\n           ^'
    failed = Attempt("cand-f", RELU_SRC, RELU_SPEC, intent="occupancy", status="rejected", category="compile",
                     diagnostics=diag)
    text = user_text(ProposalRequest(card, Hardware(), failed=failed, attempt=1))
    assert diag in text and "**compile**" in text and "change nothing else" in text
    assert RELU_SRC.strip() in text and "focus: occupancy" in text
    report = "out0: 12 of 1605632 elements differ; max abs err 0.5 at [3, 1, 0, 7]: got 1.5, expected 1.0"
    failed = Attempt("cand-g", RELU_SRC, RELU_SPEC, status="rejected", category="mismatch", message=report)
    text = user_text(ProposalRequest(card, Hardware(), failed=failed, attempt=2))
    assert report in text and "attempt 2" in text and "beyond the tolerance" in text


def test_fresh_prompt_names_a_focus_only_when_asked():
    card = real_card(*RELU_INPLACE)
    assert "Focus:" not in user_text(ProposalRequest(card, Hardware()))
    assert "Focus: **occupancy**" in user_text(ProposalRequest(card, Hardware(), intent="occupancy"))


def test_intents_vary_across_siblings():
    chosen: list[str] = []
    for _ in INTENTS:
        chosen.append(choose_intent(chosen, ["vectorisation"]))
    assert sorted(chosen) == sorted(INTENTS)            # every sibling got a different focus
    assert chosen[0] != "vectorisation"                 # the parent's own focus comes last among equals
    again = choose_intent([*chosen, chosen[0]], ["vectorisation"])
    assert again != chosen[0]                           # least used once all were tried
    # The last two ancestors' intents are avoided; older ones are not.
    assert choose_intent([], ["memory-access", "vectorisation", "decomposition"]) == "memory-access"
    assert choose_intent([], [INTENTS[0], INTENTS[1]]) == INTENTS[2]
    # Seeds rotate ties, so different seeds can start elsewhere, and the same seed is reproducible.
    picks = {choose_intent([], ["vectorisation"], seed=s) for s in range(8)}
    assert len(picks) > 1
    assert choose_intent([], ["vectorisation"], seed=3) == choose_intent([], ["vectorisation"], seed=3)


def test_long_histories_are_cut_with_a_note():
    card = real_card(*RELU_INPLACE)
    parent = Attempt("p", RELU_SRC, RELU_SPEC, status="verified", best_us=10.0)
    note = "x" * 5000
    lineage = tuple(Attempt(f"a{i}", "s", "t", status="rejected", category="mismatch", message=note)
                    for i in range(300))
    siblings = tuple(Attempt(f"s{i}", "s", "t", intent=INTENTS[i % 8], message=note) for i in range(300))
    text = user_text(ProposalRequest(card, Hardware(), parent=parent, lineage=lineage, siblings=siblings))
    assert "293 earlier ancestors left out" in text and "288 earlier siblings left out" in text
    assert len(text) < 20_000
    failed = Attempt("f", RELU_SRC, RELU_SPEC, category="compile", diagnostics="error\n" * 10_000)
    text = user_text(ProposalRequest(card, Hardware(), failed=failed, attempt=1))
    assert "more characters left out" in text and len(text) < 20_000


def test_missing_placeholder_is_reported_clearly():
    with pytest.raises(PromptError, match=r"hardware\.md uses \{arch\}"):
        render("hardware", name="H200", sms=132, l2="60 MiB", bandwidth="4 TB/s", max_shared=1)


def test_followup_prompt_names_the_kernels():
    text = followup_prompt(["row_partial", "row_finish"], "the answer has the kernel but no launch spec.")
    assert "`row_partial`, `row_finish`" in text and "only the TOML launch spec" in text


# -------------------------------------------------------------------------------------------- answers

KERNEL = '''#include <cuda_fp16.h>
extern "C" __global__ void relu8(__half* __restrict__ x, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __hmax(x[i], __float2half(0.f));  // in place
}'''
SPEC = '''[[launch]]
kernel = "relu8"
grid = ["ceil_div(self.numel, 256)"]
block = [256]
args = [{ ptr = "self" }, { i64 = "self.numel" }]'''
JSON_SPEC = json.dumps({"launch": [{"kernel": "relu8", "grid": ["ceil_div(self.numel, 256)"], "block": [256],
                                    "args": [{"ptr": "self"}, {"i64": "self.numel"}]}]}, indent=2)


def answer(*parts: str) -> str:
    return "\n".join(parts)


def fence(body: str, tag: str = "", mark: str = "```") -> str:
    return f"{mark}{tag}\n{body}\n{mark}"


def ok(ex: Extracted) -> Extracted:
    assert ex.ok, ex
    assert ex.category is None
    return ex


def test_prose_around_a_cuda_and_a_toml_fence():
    ex = ok(extract(answer("Here is a vectorised kernel. It reads each element once.", "", fence(KERNEL, "cuda"),
                           "", "And the launch spec:", "", fence(SPEC, "toml"), "", "This should hit ~90% of peak.")))
    assert ex.source == KERNEL and ex.spec == SPEC


def test_uppercase_tags_and_windows_newlines():
    text = answer("Answer:", fence(KERNEL, "CUDA"), fence(SPEC, "TOML")).replace("\n", "\r\n")
    ex = ok(extract(text))
    assert "\r" not in ex.source and ex.source == KERNEL


def test_untagged_fences_are_sniffed():
    ex = ok(extract(answer(fence(KERNEL), "Spec:", fence(SPEC))))
    assert ex.spec == SPEC


def test_cpp_tag_and_json_spec():
    ex = ok(extract(answer("Kernel:", fence(KERNEL, "cpp"), "Spec as JSON:", fence(JSON_SPEC, "json"))))
    assert json.loads(ex.spec)["launch"][0]["kernel"] == "relu8"


def test_tilde_fences_and_an_untagged_json_spec():
    ok(extract(answer(fence(KERNEL, "c++", "~~~"), fence(JSON_SPEC, "", "~~~"))))


def test_helper_and_kernel_fences_are_joined():
    helper = "#include <cuda_fp16.h>\n__device__ __forceinline__ __half relu1(__half v) { return __hmax(v, __float2half(0.f)); }"
    kernel = ('extern "C" __global__ void relu8(__half* __restrict__ x, long long n) {\n'
              "  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
              "  if (i < n) x[i] = relu1(x[i]);\n}")
    ex = ok(extract(answer("First a helper:", fence(helper, "cuda"), "Then the kernel:", fence(kernel, "cuda"),
                           fence(SPEC, "toml"))))
    assert ex.source.index("relu1(__half v)") < ex.source.index("void relu8")


def test_a_corrected_second_version_replaces_the_first():
    first = KERNEL.replace("__hmax", "__hmin")
    ex = ok(extract(answer(fence(first, "cuda"), "Wait, that is wrong; corrected:", fence(KERNEL, "cuda"),
                           fence(SPEC, "toml"))))
    assert ex.source == KERNEL


def test_an_illustrative_host_snippet_is_left_out():
    host = "// how it would be launched\nrelu8<<<blocks, 256>>>(x, n);\ncudaDeviceSynchronize();"
    ex = ok(extract(answer(fence(KERNEL, "cuda"), "Usage:", fence(host, "cpp"), fence(SPEC, "toml"))))
    assert "<<<" not in ex.source


def test_host_code_in_the_kernel_file():
    src = KERNEL + "\nint main() {\n  __half* d; cudaMalloc(&d, 1024);\n  relu8<<<4, 256>>>(d, 512);\n  return 0;\n}"
    ex = extract(answer(fence(src, "cuda"), fence(SPEC, "toml")))
    assert ex.category == "host-code" and "int main(" in ex.reason
    stream = extract(fence(KERNEL + "\ncudaStream_t s;", "cuda"))
    assert stream.category == "host-code"
    torch_inc = extract(answer(fence("#include <torch/extension.h>\n" + KERNEL, "cuda"), fence(SPEC, "toml")))
    assert torch_inc.category == "host-code"
    # A comment that mentions a launch is not host code.
    ok(extract(answer(fence("// launched like relu8<<<grid, block>>>\n" + KERNEL, "cuda"), fence(SPEC, "toml"))))


def test_missing_spec():
    ex = extract(answer("The kernel:", fence(KERNEL, "cuda"), "Launch it with 256 threads per block."))
    assert ex.category == "no-spec" and ex.source == KERNEL and ex.spec is None


def test_spec_naming_a_missing_kernel():
    ex = extract(answer(fence(KERNEL, "cuda"), fence(SPEC.replace('"relu8"', '"relu_vec"'), "toml")))
    assert ex.category == "bad-spec"
    assert "'relu_vec'" in ex.reason and "relu8" in ex.reason


def test_kernel_without_extern_c_is_a_bad_spec():
    src = KERNEL.replace('extern "C" ', "")
    ex = extract(answer(fence(src, "cuda"), fence(SPEC, "toml")))
    assert ex.category == "bad-spec" and "not extern \"C\"" in ex.reason


def test_spec_that_does_not_parse():
    ex = extract(answer(fence(KERNEL, "cuda"), fence(SPEC.replace("block = [256]", "block = [256 * threads]"), "toml")))
    assert ex.category == "bad-spec" and "invalid TOML" in ex.reason and ex.source == KERNEL
    power = extract(answer(fence(KERNEL, "cuda"), fence(SPEC.replace("block = [256]", 'block = ["2 ** 8"]'), "toml")))
    assert power.category == "bad-spec" and "launch[0].block[0]: operator '**' is not allowed" in power.reason
    bad = extract(answer(fence(KERNEL, "cuda"), fence(SPEC.replace("grid", "grids"), "toml")))
    assert bad.category == "bad-spec" and "does not parse" in bad.reason and "grids" in bad.reason


def test_truncated_inside_the_kernel():
    cut = KERNEL[: KERNEL.index("if (i < n)")]
    ex = extract(answer("Here it is:", "```cuda", cut))
    assert ex.category == "truncated" and ex.source is None


def test_truncated_inside_the_spec_asks_for_the_spec():
    ex = extract(answer(fence(KERNEL, "cuda"), "```toml", SPEC[:40]))
    assert ex.category == "no-spec" and ex.source == KERNEL and "cut off" in ex.reason


def test_unterminated_but_complete_kernel():
    ex = extract(answer("```cuda", KERNEL))
    assert ex.category == "no-spec" and ex.source == KERNEL


def test_forgotten_closing_fence_before_the_spec():
    ex = ok(extract(answer("```cuda", KERNEL, "```toml", SPEC, "```")))
    assert ex.source == KERNEL and ex.spec == SPEC


def test_python_and_triton_are_not_cuda():
    triton = ("import triton\nimport triton.language as tl\n\n@triton.jit\ndef relu_kernel(x_ptr, n, BLOCK: tl.constexpr):\n"
              "    pid = tl.program_id(0)\n")
    assert extract(answer("Triton is simpler:", fence(triton, "python"))).category == "not-cuda"
    assert extract(fence(triton)).category == "not-cuda"
    inline = ('import torch\nfrom torch.utils.cpp_extension import load_inline\nsrc = """\n' + KERNEL + '\n"""\n'
              "mod = load_inline('m', cpp_sources='', cuda_sources=src)\n")
    assert extract(fence(inline)).category == "not-cuda"


def test_empty_and_prose_only():
    assert extract("").category == "empty"
    assert extract("  \r\n \n").category == "empty"
    ex = extract("I would use a grid-stride loop with 256 threads per block and __hmax2 on half2 pairs.")
    assert ex.category == "no-code"
    assert extract(fence("float x = 1;", "cuda")).category == "no-code"


def test_unfenced_answer():
    ok(extract(answer(KERNEL, "", SPEC)))


def test_extern_c_block_and_launch_bounds():
    src = ('#include <cuda_fp16.h>\nextern "C" {\n__global__ void __launch_bounds__(256) a(float* x) { x[0] = 1.f; }\n'
           "__global__ void b(float* x) { x[1] = 2.f; }\n}\n"
           'extern "C" __global__ __launch_bounds__(128, 4) void c(float* x) { x[2] = 3.f; }\n'
           "template <int N> __global__ void t(float* x) { x[N] = 0.f; }\n")
    assert kernel_names(src) == (["a", "b", "c"], ["t"])


def test_complete_spec_merges_a_follow_up():
    first = extract(fence(KERNEL, "cuda"))
    assert first.category == "no-spec"
    ok(complete_spec(first, answer("Sure:", fence(SPEC, "toml"))))
    ok(complete_spec(first, SPEC))                       # bare TOML
    ok(complete_spec(first, JSON_SPEC))                  # bare JSON
    assert complete_spec(first, "Sorry, I cannot.").category == "no-spec"
    assert complete_spec(first, "").category == "no-spec"
    wrong = complete_spec(first, fence(SPEC.replace('"relu8"', '"relu"'), "toml"))
    assert wrong.category == "bad-spec" and wrong.source == KERNEL
    # A follow-up that resends everything is taken whole.
    whole = ok(complete_spec(first, answer(fence(KERNEL.replace("n)", "n )", 1), "cuda"), fence(SPEC, "toml"))))
    assert whole.spec == SPEC
