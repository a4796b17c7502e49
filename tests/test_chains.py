"""Chain detection (engine.capture.chains) on small models built here: what a chain card would hold."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.capture.chains import container_paths, find_chains, patterns, trace_forward


class RMS(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (h * (1 + self.weight.float())).to(x.dtype)


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.gate, self.up, self.down = (nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False),
                                         nn.Linear(2 * d, d, bias=False))

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Layer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = RMS(d), nn.Linear(d, d), RMS(d), MLP(d)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Model(nn.Module):
    def __init__(self, d=32, n=3):
        super().__init__()
        self.layers = nn.ModuleList([Layer(d) for _ in range(n)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _patterns(model, x):
    trace = trace_forward(model, lambda: model(x))
    return trace, patterns(find_chains(trace.calls, container_paths(model), unknown=trace.unknown))


def _heavy_ops(p):
    return [c.op.split("::")[1].split(".")[0] for c in p.instances[0].calls if not c.view]


def test_rmsnorm_modules_are_module_chains_counted_over_layers():
    torch.manual_seed(0)
    model = Model().to(torch.bfloat16)
    _, pats = _patterns(model, torch.randn(2, 5, 32, dtype=torch.bfloat16))
    norm = [p for p in pats if p.kind == "module"]
    assert len(norm) == 1, [(_heavy_ops(p), p.kind) for p in pats]
    p = norm[0]
    # norm1 of each layer is a chain of its own; norm2 lies inside the residual add + norm2 pattern and is a
    # module chain too (module_subchains), the same structure: six instances of one module card.
    assert p.calls == 6 and [ch.module for ch in p.instances] == [f"layers.{i}.norm{j}" for i in range(3)
                                                                    for j in (1, 2)]
    assert _heavy_ops(p) == ["_to_copy", "pow", "mean", "add", "rsqrt", "mul", "_to_copy", "add", "mul", "_to_copy"]
    ch = p.instances[0]
    assert len(ch.inputs) == 2 and len(ch.outputs) == 1  # x and the weight in; the normalised x out


def test_a_module_inside_a_pattern_is_also_a_module_chain():
    """Eager can only replace a module's forward: the norm inside add + norm must be a module chain too,
    with the add's result as its input and the pattern kept whole for torch.compile."""
    model = Model().to(torch.bfloat16)
    _, pats = _patterns(model, torch.randn(2, 5, 32, dtype=torch.bfloat16))
    add_norm = next(p for p in pats if _heavy_ops(p)[:2] == ["add", "_to_copy"])
    norm = next(p for p in pats if p.kind == "module")
    for outer in add_norm.instances:
        inner = next(ch for ch in norm.instances if ch.module == outer.scope + ".norm2")
        assert {c.index for c in inner.calls} < {c.index for c in outer.calls}
        made_outside = {v for c in outer.calls if c.index not in {i.index for i in inner.calls} for v in c.writes}
        assert inner.inputs[0] in made_outside  # the residual sum (made by the pattern's add) goes in
        assert inner.outputs == [outer.calls[-1].writes[0]]


def test_residual_add_joins_the_next_norm_but_never_the_next_layer():
    model = Model().to(torch.bfloat16)
    _, pats = _patterns(model, torch.randn(2, 5, 32, dtype=torch.bfloat16))
    add_norm = [p for p in pats if _heavy_ops(p)[:2] == ["add", "_to_copy"]]
    assert len(add_norm) == 1 and add_norm[0].calls == 3
    for i, ch in enumerate(add_norm[0].instances):
        assert ch.scope == f"layers.{i}" and ch.module is None  # a pattern: layer i's add and norm2
        # The residual sum is an output (the second residual add reads it) beside the norm's result.
        assert len(ch.outputs) == 2
    # The add after the MLP reads the residual sum too, but waits on the MLP, which waits on the norm:
    # it cannot join their kernel, so the chain ends with the norm's downcast.
    assert _heavy_ops(add_norm[0])[-1] == "_to_copy"
    assert _heavy_ops(add_norm[0]).count("add") == 3  # the residual add, + eps, 1 + weight


def test_gated_activation_is_a_pattern_between_matmuls():
    model = Model().to(torch.bfloat16)
    _, pats = _patterns(model, torch.randn(2, 5, 32, dtype=torch.bfloat16))
    glu = [p for p in pats if _heavy_ops(p) == ["silu", "mul"]]
    assert len(glu) == 1 and glu[0].calls == 3 and glu[0].kind == "pattern"
    assert all(ch.scope == f"layers.{i}.mlp" for i, ch in enumerate(glu[0].instances))


def test_layers_of_different_shapes_are_different_structures():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = RMS(16), RMS(32)
            self.proj = nn.Linear(16, 32)

        def forward(self, x):
            return self.b(self.proj(self.a(x)))

    _, pats = _patterns(Two(), torch.randn(3, 16))
    mods = sorted(ch.module for p in pats for ch in p.instances)
    assert mods == ["a", "b"] and len(pats) == 2


def test_in_place_ops_and_values_of_unknown_origin():
    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Identity()

        def forward(self, x):
            y = x * 2
            y.add_(1)          # an in-place write: a new value of y, still in the chain
            v = y[0]
            v.mul_(3)          # writes y through a view: y's next read has no recorded maker
            return torch.relu(y) - 1

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = InPlace()

        def forward(self, x):
            return self.body(x)

    trace, pats = _patterns(Wrap(), torch.randn(4, 8))
    ops = [_heavy_ops(p) for p in pats]
    assert ["mul", "add_", "mul_"] in [o[:3] for o in ops], ops
    relu = [c for c in trace.calls if c.op.startswith("aten::relu")][0]
    (_, read), = relu.reads
    assert read in trace.unknown  # y as written through its view: its maker is not known
    assert all("relu" not in o or o.index("relu") == 0 for o in ops)


def test_gemma_small_has_its_rmsnorm_chains():
    from conftest import ROOT

    from engine.config import build_target, load_config, override_params

    # 16 tokens rather than --small's 128: the chains found do not depend on the length, and test_capture_chains
    # captures the small config as shipped (Gemma's bfloat16 matmuls over 128 tokens took most of 22 s on CI)
    config = override_params(load_config(ROOT / "configs" / "models" / "gemma4_e2b.toml", small=True),
                             {"seq_len": 16})
    assert config.small and config.params["seq_len"] == 16
    target = build_target(config, torch.device("cpu"))
    target.module.eval()
    trace = trace_forward(target.module, target.forward, time_calls=False)
    pats = patterns(find_chains(trace.calls, container_paths(target.module), unknown=trace.unknown))
    modules = [p for p in pats if p.kind == "module"]
    assert modules, "no module chain: Gemma's RMSNorms are modules"
    assert any(ch.module.endswith("layernorm") for p in modules for ch in p.instances)
    norms = [p for p in modules if all("norm" in ch.module for ch in p.instances)]
    for p in norms:
        ops = _heavy_ops(p)
        assert ops[0] == "_to_copy" and "mean" in ops and ops[-1] == "_to_copy"  # upcast ... downcast
    # Every RMSNorm invocation is a module chain, also those inside patterns (add + norm, norm + rotary):
    # 4 layers of input/post-attention/pre-feedforward/post-feedforward norms at least, and q/k norms.
    n_norms = sum(p.calls for p in norms)
    assert n_norms >= 4 * 4 + 2 * 4, [(p.calls, p.instances[0].module) for p in norms]
    assert all(not c.compute for p in pats for ch in p.instances for c in ch.calls)


def test_a_chain_card_replays_its_module_on_new_inputs():
    # The chain's signature is enough to run it (eager for the card): on new values it gives what the
    # module gives, and every layer's instance has the same signature (one card, counted over layers).
    from engine.capture.chains import CHAIN_OP, chain_card_id, chain_signature, run_chain

    torch.manual_seed(1)
    model = Model().to(torch.bfloat16)
    _, pats = _patterns(model, torch.randn(2, 5, 32, dtype=torch.bfloat16))
    norm = next(p for p in pats if p.kind == "module")
    sigs = [chain_signature(ch) for ch in norm.instances]
    assert len({chain_card_id(s) for s in sigs}) == 1
    sig = sigs[0]
    assert sig["op"] == CHAIN_OP and [a["name"] for a in sig["args"]] == ["in0", "in1"]
    assert sig["args"][0]["shape"] == [2, 5, 32] and sig["args"][0]["dtype"] == "bfloat16"
    assert sig["args"][1]["shape"] == [32]  # the weight
    x = torch.randn(2, 5, 32, dtype=torch.bfloat16) * 3
    layer = model.layers[2].norm1
    with torch.no_grad():
        layer.weight.normal_()
        (out,) = run_chain(sig, [x, layer.weight])
        torch.testing.assert_close(out, layer(x), rtol=0, atol=0)


def test_chain_signature_of_a_pattern_with_two_outputs():
    from engine.capture.chains import chain_signature, run_chain

    model = Model().to(torch.bfloat16)
    _, pats = _patterns(model, torch.randn(2, 5, 32, dtype=torch.bfloat16))
    add_norm = next(p for p in pats if _heavy_ops(p)[:2] == ["add", "_to_copy"])
    sig = chain_signature(add_norm.instances[1])
    assert len(sig["chain"]["outputs"]) == 2
    layer = model.layers[1]
    x, h = torch.randn(2, 5, 32, dtype=torch.bfloat16), torch.randn(2, 5, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        # in0/in1/in2 in first-use order: the attention projection's output (a view of it), the
        # residual stream, the second norm's weight.
        names = [a["name"] for a in sig["args"]]
        assert names == ["in0", "in1", "in2"]
        outs = run_chain(sig, [h, x, layer.norm2.weight])
        total = x + h
        torch.testing.assert_close(outs[0], total, rtol=0, atol=0)
        torch.testing.assert_close(outs[1], layer.norm2(total), rtol=0, atol=0)


def test_a_value_the_parent_computes_for_every_layer_never_joins_two_layers():
    # Like Gemma's per-layer inputs: the model computes a value at its own level that every layer's
    # chain reads. The chains may take that value in, but no chain holds members of two layers.
    class PerLayer(nn.Module):
        def __init__(self, d=16, n=3):
            super().__init__()
            self.layers = nn.ModuleList([RMS(d) for _ in range(n)])
            self.scale = nn.Parameter(torch.ones(d))

        def forward(self, x):
            extra = torch.tanh(x) * self.scale  # computed once, at the model level
            for layer in self.layers:
                x = layer(x * extra) + extra
            return x

    class Wrapper(nn.Module):  # as transformers' ForCausalLM holds its .model
        def __init__(self):
            super().__init__()
            self.model = PerLayer()

        def forward(self, x):
            return self.model(x)

    model = Wrapper()
    trace, pats = _patterns(model, torch.randn(4, 16))
    for p in pats:
        for ch in p.instances:
            layers = {c.path.split(".")[2] for c in ch.calls if c.path.startswith("model.layers.")}
            assert len(layers) <= 1, (ch.scope, [c.path for c in ch.calls])
    assert pats, "the layers' chains were found"


def test_a_synthetic_chain_card_has_samples_that_replay(tmp_path):
    from engine.capture.chain_cards import synthetic_chain_card
    from engine.capture.chains import CHAIN_OP, chain_signature, run_chain
    from engine.capture.samples import load_sample

    model = Model().to(torch.bfloat16)
    _, pats = _patterns(model, torch.randn(2, 5, 32, dtype=torch.bfloat16))
    sig = chain_signature(next(p for p in pats if p.kind == "module").instances[0])
    ref = synthetic_chain_card(tmp_path, sig, 2, device="cpu")
    assert ref.op == CHAIN_OP and len(ref.samples) == 2 and ref.outputs[0]["shape"] == [2, 5, 32]
    a, b = (load_sample(p, "cpu") for p in ref.samples)
    assert not torch.equal(a.args[0][1], b.args[0][1])  # two different input sets
    for s in (a, b):
        assert torch.equal(run_chain(sig, [v for _, v in s.args])[0], s.outputs[0])


def test_a_cpu_captured_chain_described_for_the_gpu_replays_on_any_device():
    # A CPU capture's chain card says device 'cuda' everywhere (engine.run.as_gpu), also in a member's
    # `type_as` copy; eager for the card runs its members on the inputs' device (on the H200 the copy went
    # back to the CPU and the lane failed with "Expected all tensors to be on the same device").
    from engine.capture.chains import chain_signature, run_chain
    from engine.run.as_gpu import _on_cuda

    class TypeAsRMS(RMS):  # Gemma's form: the result cast back with type_as (a copy that names a device)
        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            return (h * (1 + self.weight.float())).type_as(x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.norm = nn.Linear(32, 32), TypeAsRMS(32)

        def forward(self, x):
            return self.norm(self.lin(x))

    torch.manual_seed(1)
    model = Net().to(torch.bfloat16)
    _, pats = _patterns(model, torch.randn(2, 5, 32, dtype=torch.bfloat16))
    sig = chain_signature(next(p for p in pats if p.kind == "module").instances[0])
    on_gpu = _on_cuda(sig)
    assert any(a.get("value") == {"device": "cuda"} for n in on_gpu["chain"]["nodes"] for a in n["args"])
    x = torch.randn(2, 5, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        model.norm.weight.normal_()
        (out,) = run_chain(on_gpu, [x, model.norm.weight])
        assert out.device.type == "cpu"
        torch.testing.assert_close(out, model.norm(x), rtol=0, atol=0)


def test_a_copy_to_another_device_ends_a_chain():
    class LeavingRMS(RMS):  # a norm whose result leaves the device inside the module (as `.cpu()` would)
        def forward(self, x):
            return super().forward(x).to("meta") * 2

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.norm = nn.Linear(32, 32), LeavingRMS(32)

        def forward(self, x):
            return self.norm(self.lin(x))

    model = Net().to(torch.bfloat16)
    trace = trace_forward(model, lambda: model(torch.randn(4, 32, dtype=torch.bfloat16)), time_calls=False)
    chains = find_chains(trace.calls, container_paths(model), unknown=trace.unknown)
    assert chains  # the norm itself is still one
    for ch in chains:
        assert not any(c.op == "aten::_to_copy" and "meta" in str(c.signature) for c in ch.calls)


def test_a_batch_norm_module_alone_is_no_module_chain():
    """BatchNorm's module runs `empty` (its reserve) and one `native_batch_norm`: one op of traffic, which
    its op card already is; it must not become a chain card of its own."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3)).eval()
    trace, pats = _patterns(model, torch.randn(1, 3, 16, 16))
    assert any(c.op.startswith("aten::native_batch_norm") or "batch_norm" in c.op for c in trace.calls)
    assert not [p for p in pats if p.kind == "module"], [(_heavy_ops(p), p.kind) for p in pats]
