"""Qwen3.5-35B-A3B text model (transformers `Qwen3_5MoeForCausalLM`) with random weights, one prefill.

The real model has 40 decoder layers, 3 Gated-DeltaNet (linear attention) : 1 gated full attention,
each followed by a 256-expert top-8 MoE with a shared expert. The builder keeps 4 layers
[linear, linear, linear, full] at full width with all 256 experts; each stands for 10 real layers.
With `full_depth=True` it builds all 40 (~35B parameters, ~70 GB in bf16), for whole-model benchmarks.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect

import torch

from engine.models.random_init import random_model
from engine.models.target import CaptureTarget

# Qwen/Qwen3.5-35B-A3B text_config. The class defaults are this model apart from RoPE and max length.
REAL_NUM_LAYERS = 40
REAL_LAYER_TYPES = (["linear_attention"] * 3 + ["full_attention"]) * 10
A3B_CONFIG = dict(
    vocab_size=248_320,
    hidden_size=2048,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=256,
    hidden_act="silu",
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    num_experts=256,
    num_experts_per_tok=8,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    max_position_embeddings=262_144,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
)
SMALL_NUM_LAYERS = 4
SMALL_LAYER_TYPES = ["linear_attention"] * 3 + ["full_attention"]


def _bound_implementation(fn, package: str) -> str:
    """Which implementation a transformers `use_kernel_func_from_hub_with_fallback` function dispatches to."""
    try:
        nonlocals = inspect.getclosurevars(fn).nonlocals
        if "is_new_implementation" in nonlocals:
            impl = nonlocals.get("implementation")
            if nonlocals["is_new_implementation"]:
                return f"{getattr(impl, '__module__', package)}.{getattr(impl, '__name__', '?')} ({package})"
            return "transformers' PyTorch reference"
    except (TypeError, ValueError):
        pass
    found = importlib.util.find_spec(package) is not None
    return f"{package} {'installed' if found else 'not installed'} (dispatch not introspectable)"


def text_config(full_depth: bool = False, attn_implementation: str = "sdpa",
                experts_implementation: str = "grouped_mm"):
    """The `Qwen3_5MoeTextConfig` the builder uses: all 40 layers with `full_depth`, else [linear x3, full]."""
    from transformers import Qwen3_5MoeTextConfig

    return Qwen3_5MoeTextConfig(
        **A3B_CONFIG,
        num_hidden_layers=REAL_NUM_LAYERS if full_depth else SMALL_NUM_LAYERS,
        layer_types=list(REAL_LAYER_TYPES if full_depth else SMALL_LAYER_TYPES),
        attn_implementation=attn_implementation,
        experts_implementation=experts_implementation,
    )


def share_experts(model: torch.nn.Module) -> int:
    """Make every MoE layer's experts read the first layer's expert weights (the same Parameter objects);
    returns the bytes of expert weights no longer held. Shapes, strides and calls are unchanged."""
    layers = [layer.mlp.experts for layer in model.model.layers]
    freed = 0
    for experts in layers[1:]:
        for name in ("gate_up_proj", "down_proj"):
            freed += getattr(experts, name).nbytes
            setattr(experts, name, getattr(layers[0], name))
    return freed


def build(*, device: torch.device, dtype: torch.dtype, seq_len: int = 2048, batch: int = 1,
          attn_implementation: str = "sdpa", experts_implementation: str = "grouped_mm",
          use_cache: bool = False, logits_to_keep: int = 0, seed: int = 0,
          full_depth: bool = False, share_expert_weights: bool = False, decode: bool = False) -> CaptureTarget:
    """Qwen3.5-35B-A3B text model, 4 of 40 layers (3 linear + 1 full; all 40 with `full_depth`), one prefill
    of `batch` x `seq_len`. With `share_expert_weights` (the config's --small) all layers' experts read one
    set of expert weights: 1.6 GB instead of 6.4 GB to fill and hold, for the same calls."""
    from transformers import Qwen3_5MoeForCausalLM
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as mod

    config = text_config(full_depth, attn_implementation, experts_implementation)
    shared = []
    model = random_model(Qwen3_5MoeForCausalLM, config, device=device, dtype=dtype, seed=seed,
                         before_fill=(lambda m: shared.append(share_experts(m))) if share_expert_weights else None)

    kinds = ["linear_attention" if hasattr(layer, "linear_attn") else "full_attention" for layer in model.model.layers]
    if full_depth:
        if kinds != REAL_LAYER_TYPES:
            raise RuntimeError(f"full-depth Qwen3.5 layers {kinds} are not the real {REAL_LAYER_TYPES}")
        multiplicity = {}
    else:
        per_kind = {t: REAL_LAYER_TYPES.count(t) // SMALL_LAYER_TYPES.count(t) for t in set(SMALL_LAYER_TYPES)}
        if kinds != SMALL_LAYER_TYPES or sum(per_kind[t] for t in kinds) != REAL_NUM_LAYERS:
            raise RuntimeError(f"shrunk Qwen3.5 layers {kinds} are not {SMALL_LAYER_TYPES}")
        multiplicity = {f"model.layers.{i}": per_kind[t] for i, t in enumerate(kinds)}

    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, config.vocab_size, (batch, seq_len), generator=gen).to(device)

    def forward():
        with torch.no_grad():
            return model(input_ids=input_ids, use_cache=use_cache, logits_to_keep=logits_to_keep)

    step_note = ""
    if decode:  # one decoding step after a prefill of seq_len tokens (engine/models/decode.py)
        from engine.models.decode import decode_step

        forward, step_note = decode_step(model, input_ids, logits_to_keep)

    experts = model.config._experts_implementation
    notes = {
        "model": "Qwen3_5MoeForCausalLM (text only), Qwen/Qwen3.5-35B-A3B text_config, random weights",
        "transformers": importlib.metadata.version("transformers"),
        "attention": f"full layers: {model.config._attn_implementation} (requested {attn_implementation!r}), "
        "16 q heads / 2 KV heads of 256, q_proj 2048->8192 carries a sigmoid output gate, RoPE on 1/4 of "
        "head_dim (text-only mRoPE)",
        "linear_attention": "Gated DeltaNet, 16 key / 32 value heads of 128, depthwise causal conv1d k=4; "
        f"chunk_gated_delta_rule = {_bound_implementation(mod.torch_chunk_gated_delta_rule, 'fla')}; "
        f"causal_conv1d_fn = {_bound_implementation(mod.causal_conv1d_fn, 'causal_conv1d')} "
        "(flash-linear-attention / causal-conv1d replace these with their own kernels when installed)",
        "experts": f"{experts} (requested {experts_implementation!r}); 256 experts top-8, expert MLP 512, "
        "shared expert 512 with a sigmoid gate. grouped_mm sorts the token-expert pairs and runs one "
        "grouped GEMM per projection with fixed total rows (tokens x 8); 'eager' loops over hit experts "
        "with a different GEMM shape per expert",
        "forward": step_note or (f"one prefill of {batch}x{seq_len} random token ids, no attention mask, "
        f"use_cache={use_cache}, logits_to_keep={logits_to_keep}"
        + (" (logits for every position)" if logits_to_keep == 0 else "")),
        "layers": ("full depth: all 40 layers built (no multiplicity), 10 x [linear_attention x3, "
                   "full_attention]; all 256 experts; no widths changed" if full_depth else
                   "4 of 40 kept: model.layers.0-2 = linear_attention x10 each, model.layers.3 = "
                   "full_attention x10; all 256 experts kept; no widths changed"),
        "weights": f"{dtype} built directly on {device}; matrices and experts from a tiled N(0, 0.02) "
        "block, norms/A_log/dt_bias/buffers from the model's own init"
        + (f"; every layer's experts read model.layers.0's expert weights ({shared[0] / 1e9:.1f} GB not "
           "built; same shapes and calls)" if shared else ""),
    }
    return CaptureTarget(module=model, forward=forward, multiplicity=multiplicity, notes=notes,
                         full_depth=full_depth)
