"""Chain cards through the lane's pieces, on the CPU: the launcher and spec resolution take a chain
card, CardCheck verifies candidates against `run_chain` with the members' tolerances, the physics floor
is the chain's own traffic, and the exporter writes module cards the cast format accepts."""

from __future__ import annotations

import json

import torch
from test_chains import Model

from engine.bench.floor import chain_bytes, physics_floor
from engine.capture.chains import CHAIN_OP, chain_signature, container_paths, find_chains, patterns, run_chain
from engine.capture.chains import trace_forward as trace
from engine.capture.signature import describe_tensor
from engine.cast.format import check_manifest
from engine.cast.modules import module_binding
from engine.export.package import ExportVariant, format_problem, package
from engine.export.report import audit_document, audit_text
from engine.launch import Env, ResolvedSpec, parse_spec, resolve
from engine.launch.launcher import CandidateLauncher
from engine.verify.inputs import clone_bound
from engine.verify.pipeline import card_check, chain_in_float64
from engine.verify.tolerance import card_family, chain_family, tolerance_for

D = 32

# The toy RMSNorm chain (tests/test_chains.py's RMS) as one kernel: a warp per row, statistics and the
# scale in float32, one rounding to bfloat16 at the end, as eager's chain does. bf16 travels as raw bits.
RMS_CHAIN_CU = r'''
__device__ __forceinline__ float bf2f(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ unsigned short f2bf(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                                  // nearest even
  return (unsigned short)(u >> 16);
}
extern "C" __global__ void kf_rms_chain(const unsigned short* __restrict__ x, const unsigned short* __restrict__ w,
                                        unsigned short* __restrict__ out, int rows, int d) {
  int row = blockIdx.x;
  if (row >= rows) return;
  const unsigned short* xr = x + (long long)row * d;
  unsigned short* orow = out + (long long)row * d;
  float s = 0.f;
  for (int i = threadIdx.x; i < d; i += 32) { float h = bf2f(xr[i]); s += h * h; }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  float r = rsqrtf(s / (float)d + 1e-6f);
  for (int i = threadIdx.x; i < d; i += 32) orow[i] = f2bf((bf2f(xr[i]) * r) * (1.f + bf2f(w[i])));
}
'''
RMS_CHAIN_SPEC = """
[[launch]]
kernel = "kf_rms_chain"
grid = ["in0.numel // in0.shape[2]"]
block = [32]
args = [{ ptr = "in0" }, { ptr = "in1" }, { ptr = "out0" }, { i32 = "in0.numel // in0.shape[2]" },
        { i32 = "in0.shape[2]" }]
"""


def rms_chain(dtype=torch.bfloat16, rows=(2, 5)):
    """The toy model's RMSNorm module chain: its card signature, eager's output descriptions, a sample."""
    torch.manual_seed(0)
    model = Model(d=D).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.normal_(0, 0.1)  # a norm weight of zeros would hide what (1 + w) does
    x = torch.randn(*rows, D, dtype=dtype)
    t = trace(model, lambda: model(x))
    (norm,) = [p for p in patterns(find_chains(t.calls, container_paths(model), unknown=t.unknown))
               if p.kind == "module"]
    sig = chain_signature(norm.instances[0])
    rms = model.layers[0].norm1
    sample = [("in0", x), ("in1", rms.weight.detach().clone())]
    outputs = [describe_tensor(o) for o in run_chain(sig, [x, rms.weight.detach()])]
    return sig, outputs, sample, rms


# ---------------------------------------------------------------------------------------- launching


def test_a_chain_kernel_compiles_and_its_spec_resolves_against_the_chain_card():
    from engine.compile import compile_nvrtc

    sig, outputs, _, _ = rms_chain()
    compiled = compile_nvrtc(RMS_CHAIN_CU, arch="sm_90")
    assert compiled.ok, compiled.summary()
    (ln,) = resolve(parse_spec(RMS_CHAIN_SPEC), Env.from_card(sig, outputs)).launches
    assert (ln.kernel, ln.grid, ln.block) == ("kf_rms_chain", (10, 1, 1), (32, 1, 1))
    assert [a.value for a in ln.args] == [("input", "in0"), ("input", "in1"), ("output", 0), 10, D]


def test_the_launcher_takes_a_chain_card_outputs_from_its_descriptions_and_no_aliases():
    sig, outputs, sample, _ = rms_chain()
    launcher = CandidateLauncher(None, ResolvedSpec((), ()), CHAIN_OP, outputs, torch.device("cpu"))
    assert launcher.op is None and launcher.aliases == [None] and launcher.write_only == []
    (out,) = launcher.allocate_outputs(dict(sample), prefill="nan")  # what run() launches into
    assert out.dtype == torch.bfloat16 and list(out.shape) == outputs[0]["shape"]
    assert list(out.stride()) == outputs[0]["stride"] and bool(out.isnan().all())
    assert all(out.data_ptr() != t.data_ptr() for _, t in sample)  # a fresh buffer, never an input


# ------------------------------------------------------------------------------------- verification


def test_run_chain_itself_passes_every_check_of_a_chain_card():
    sig, _, sample, _ = rms_chain()
    check = card_check(CHAIN_OP, sig, [sample])
    assert check.family == "reduction"
    labels = [label for label, _ in check.sets]
    assert "edge nonfinite" in labels and "fresh 0" in labels
    v = check.check(lambda b, prefill: run_chain(sig, [t for _, t in b]))
    assert v.ok, v.message
    assert v.sets_checked == len(check.sets)


def test_a_chain_candidate_that_maps_nan_to_zero_is_caught_by_the_edge_sets():
    sig, _, sample, _ = rms_chain()
    check = card_check(CHAIN_OP, sig, [sample])

    def nan_to_zero(b, prefill):
        (out,) = run_chain(sig, [t for _, t in b])
        return [torch.where(out.isnan(), torch.zeros_like(out), out)]

    v = check.check(nan_to_zero)
    assert not v.ok and v.input_set == "edge nonfinite", v.message
    assert "expected nan" in v.message


def _rms_in_bf16(b, prefill):
    """The RMSNorm in bfloat16 throughout, no float upcast: squares summed one by one in bf16."""
    h, w = b[0][1], b[1][1]
    acc = torch.zeros(h.shape[:-1] + (1,), dtype=h.dtype)
    for i in range(h.shape[-1]):
        acc = acc + h[..., i:i + 1] * h[..., i:i + 1]
    return [h * torch.rsqrt(acc / h.shape[-1] + 1e-6) * (1 + w)]


def test_a_chain_candidate_computing_in_bf16_is_caught_by_the_float64_reference():
    # Eager's chain upcasts, so its error against the exact answer is one final rounding. On rows of 32,
    # bf16 arithmetic errs 2-4x that, inside the bf16 reduction tolerance (two ulp): only the precision
    # check tells, within the chain factor (1.5x; tests/test_chain_precision.py sweeps row sizes and
    # seeds). This sample (seed 5, 8 rows) errs 4.3x under torch 2.14 and 2.6x under 2.11 (other random
    # draws): either way past the chain factor.
    sig, _, sample, _ = rms_chain(rows=(8,))
    torch.manual_seed(5)
    sample = [("in0", torch.randn(8, D, dtype=torch.bfloat16)), sample[1]]
    check = card_check(CHAIN_OP, sig, [sample])
    v = check.check(_rms_in_bf16)
    assert not v.ok and v.input_set == "sample 0", v.message
    assert "float64 reference" in v.message and v.details["precision"]["ratio"] > 1.5


def test_the_float64_reference_of_a_chain_runs_its_casts_in_float64():
    sig, _, sample, _ = rms_chain()
    wide = chain_in_float64(sig)
    casts = [a["value"] for n in wide["chain"]["nodes"] if n["op"] == "aten::_to_copy"
             for a in n["args"] if a["name"] == "dtype"]
    assert casts == [{"dtype": "float64"}] * 3
    (ref,) = run_chain(wide, [t.double() for _, t in clone_bound(sample)])
    (eager,) = run_chain(sig, [t for _, t in sample])
    assert ref.dtype == torch.float64 and ref.shape == eager.shape
    assert float((ref - eager.double()).abs().max()) < 2 * 2**-8 * float(ref.abs().max())
    assert sig["chain"]["nodes"][0]["args"][1]["value"] == {"dtype": "float32"}  # the card is unchanged


def _chain(*ops):
    return {"op": CHAIN_OP, "args": [], "aliases": [], "chain": {"nodes": [{"op": op, "args": [], "results": 1}
                                                                       for op in ops], "outputs": [[0, 0]]}}


def test_chain_family_is_the_loosest_members_family():
    assert chain_family(_chain("aten::silu", "aten::mul.Tensor")) == "elementwise"
    assert chain_family(_chain("aten::_to_copy", "aten::pow.Tensor_Scalar", "aten::mean.dim", "aten::rsqrt",
                               "aten::mul.Tensor", "aten::_to_copy")) == "reduction"
    assert chain_family(_chain("aten::add.Tensor", "aten::native_layer_norm")) == "normalization"
    assert chain_family(_chain("aten::native_group_norm", "aten::silu", "aten::_softmax")) == "normalization"
    assert chain_family(_chain("aten::clone", "aten::_to_copy", "aten::cat")) == "exact"
    # An op the table does not know (here a view) is held to elementwise strictness, never looser.
    assert chain_family(_chain("aten::clone", "aten::_unsafe_view")) == "default"
    assert chain_family(_chain("aten::relu", "aten::some_new_op")) == "default"
    sig, _, _, _ = rms_chain()
    assert card_family(CHAIN_OP, sig) == "reduction" and card_family("aten::gelu") == "elementwise"


# --------------------------------------------------------------------------------------- the floor


def test_the_floor_names_the_chain_op_as_the_capture_does():
    from engine.bench import floor

    assert floor.CHAIN_OP == CHAIN_OP  # kept as a literal there: bench sits below capture


def test_a_chain_cards_floor_is_its_inputs_and_outputs_at_the_bandwidth():
    sig, outputs, _, _ = rms_chain()
    nbytes = chain_bytes(sig, outputs)
    assert nbytes == (2 * 5 * D + D) * 2 + 2 * 5 * D * 2  # x and the weight read, the output written
    floor = physics_floor(CHAIN_OP, sig, nbytes, bandwidth=1e12, peak=1e15)
    assert floor.binding == "memory" and floor.flops is None and floor.compute_us == 0
    assert abs(floor.us - nbytes / 1e12 * 1e6) < 1e-12
    broadcast = {**sig, "args": [sig["args"][0], {**sig["args"][1], "shape": [2, 5, D], "stride": [0, 0, 1]}]}
    assert chain_bytes(broadcast, outputs) == nbytes  # a broadcast weight is read once


# ---------------------------------------------------------------------------------------- exporting


ENV = {"torch": torch.__version__, "gpu": "NVIDIA H200", "arch": "sm_90", "compute_capability": [9, 0]}


RMS_OPS = ["_to_copy", "pow", "mean", "add", "rsqrt", "mul", "_to_copy", "add", "mul", "_to_copy"]


def _variant(chain: dict | str | None, card_id: str = "c" * 16) -> ExportVariant:
    sig, outputs, _, _ = rms_chain()
    card = {"card_id": card_id, "op": CHAIN_OP, "signature": sig, "signature_text": "rms chain",
            "outputs": outputs, "calls": 3, "share": 0.1, **({"chain": chain} if chain is not None else {})}
    cand = {"id": "cand-1", "source": RMS_CHAIN_CU, "launch_spec": RMS_CHAIN_SPEC, "proposer": "test",
            "status": "verified"}
    return ExportVariant(card, cand, None, "// ptx", "sm_90")


def test_an_exported_module_card_carries_its_module_entry_and_passes_the_format_check():
    sig, _, sample, rms = rms_chain()
    binding = module_binding(rms, (sample[0][1],), [sample[0][1], rms.weight])
    assert binding == {"args": [{"input": 0}], "params": [{"name": "weight", "input": 1}]}
    chain = {"kind": "module", "class": "RMS", "paths": ["layers.0.norm1", "layers.1.norm1"], **binding,
             "autocast": [], "ops": RMS_OPS}
    v = _variant(chain)
    manifest, files, _ = package([v], ENV, {"run": "run-1"}, created="2020-01-01T00:00:00Z")
    check_manifest(manifest)
    assert format_problem(v, ENV, {}) is None
    (entry,) = manifest["variants"]
    assert entry["op"] == CHAIN_OP and entry["signature"] == sig
    assert entry["chain"] == {"kind": "module", "ops": RMS_OPS}  # what audit and the report name it by
    assert entry["module"] == {"class": "RMS", "paths": ["layers.0.norm1", "layers.1.norm1"],
                               "args": [{"input": 0}], "params": [{"name": "weight", "input": 1}],
                               "autocast": []}
    assert entry["kernels"] == ["kf_rms_chain"] and entry["id"] == "chain-cccccccc"
    assert entry["tolerance"] == [tolerance_for("aten::mean.dim", "bfloat16").describe()]  # reduction rows


def test_a_module_card_from_a_store_row_stays_a_module_card():
    # The store keeps a card's chain facts as JSON text (schema v4); export reads its cards from there.
    _, _, sample, rms = rms_chain()
    chain = {"kind": "module", "module_class": "RMS", "class": "RMS", "paths": ["layers.0.norm1"],
             **module_binding(rms, (sample[0][1],), [sample[0][1], rms.weight]), "autocast": [], "ops": RMS_OPS}
    manifest, _, _ = package([_variant(json.dumps(chain))], ENV, {"run": "run-1"})
    (entry,) = manifest["variants"]
    assert entry["chain"] == {"kind": "module", "ops": RMS_OPS} and entry["module"]["class"] == "RMS"
    check_manifest(manifest)
    # A module card as the capture writes it: its facts, and the binding its sampling forward recorded.
    captured = {"kind": "module", "module_class": "RMS", "modules": ["layers.0.norm1"], "members": [],
                "ops": RMS_OPS}
    bound = {**captured, "class": "RMS", "paths": ["layers.0.norm1"], "args": [{"input": 0}],
             "params": [{"name": "weight", "input": 1}], "autocast": []}
    manifest, _, _ = package([_variant(json.dumps(bound))], ENV, {"run": "run-1"})
    (entry,) = manifest["variants"]
    assert entry["chain"] == {"kind": "module", "ops": RMS_OPS}
    assert entry["module"] == {k: bound[k] for k in ("class", "paths", "args", "params", "autocast")}
    check_manifest(manifest)
    # One the capture could not bind (a forward called with keyword arguments, instances that bind
    # differently): the loader could not serve the module, so it ships as what serves it, a pattern card.
    manifest, _, _ = package([_variant(json.dumps(captured))], ENV, {"run": "run-1"})
    (entry,) = manifest["variants"]
    assert entry["chain"] == {"kind": "pattern", "ops": RMS_OPS} and "module" not in entry
    check_manifest(manifest)


def test_the_report_and_audit_name_a_chain_card_by_its_ops_and_the_dispatch_that_serves_it():
    _, _, sample, rms = rms_chain()
    binding = module_binding(rms, (sample[0][1],), [sample[0][1], rms.weight])
    module = _variant({"kind": "module", "class": "RMS", "paths": ["layers.0.norm1", "layers.1.norm1"], **binding,
                       "autocast": [], "ops": RMS_OPS})
    pattern = _variant({"kind": "pattern", "ops": ["add", *RMS_OPS]}, card_id="d" * 16)
    manifest, _, report = package([module, pattern], ENV, {"run": "run-1"})
    label = "chain: _to_copy → pow → mean → add → rsqrt → mul → _to_copy → add → mul → _to_copy"
    served_module = "module card: RMS at layers.0.norm1 and 1 more, eager (cast.enabled)"
    served_pattern = "pattern card: under torch.compile (cast.compile)"
    assert f"## chain-cccccccc — `{label}`" in report and f"- served by: {served_module}" in report
    assert f"## chain-dddddddd — `chain: add → {label.removeprefix('chain: ')}`" in report
    assert f"- served by: {served_pattern}" in report
    assert f"| chain-cccccccc | `{label}` ({served_module}) |" in report
    assert "kforge::chain" not in report
    text = audit_text(audit_document(manifest, {}), "x.cast")
    assert f"chain-cccccccc {label}" in text and f"served by: {served_module}" in text
    assert f"served by: {served_pattern}" in text and "kforge::chain" not in text


def test_an_exported_pattern_card_says_it_is_a_pattern_and_has_no_module_entry():
    manifest, _, _ = package([_variant({"kind": "pattern"})], ENV, {"run": "run-1"})
    (entry,) = manifest["variants"]
    assert entry["chain"] == {"kind": "pattern", "ops": []} and "module" not in entry
    assert entry["pattern"] == {}  # what the loader reads as a pattern card
    check_manifest(manifest)  # the cast format takes it
