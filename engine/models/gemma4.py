"""Gemma 4 E2B text model (transformers `Gemma4ForCausalLM`) with random weights, one prefill.

The real E2B text model has 35 decoder layers of four kinds: sliding-window or full attention, each
either computing its own K/V or reusing the K/V of the last earlier layer of its type ("KV-shared",
the last 20 layers, whose MLP is double width). The builder keeps one layer of each kind at full
width and returns `multiplicity` so call counts describe all 35 layers; with `full_depth=True` it builds
all 35 (for whole-model benchmarks: a shrunk model over-weights the LM head and logit soft-cap).
"""

from __future__ import annotations

import importlib.metadata
from collections import Counter

import torch

from engine.models.random_init import random_model
from engine.models.target import CaptureTarget

# google/gemma-4-E2B text_config (the class defaults are a different, larger model: hidden 2304, 30 layers).
REAL_NUM_LAYERS = 35
REAL_LAYER_TYPES = (["sliding_attention"] * 4 + ["full_attention"]) * 7
REAL_NUM_KV_SHARED_LAYERS = 20
E2B_CONFIG = dict(
    vocab_size=262_144,
    vocab_size_per_layer_input=262_144,
    hidden_size=1536,
    intermediate_size=6144,  # x2 on the KV-shared layers (use_double_wide_mlp)
    use_double_wide_mlp=True,
    num_attention_heads=8,
    num_key_value_heads=1,
    head_dim=256,  # sliding layers
    global_head_dim=512,  # full-attention layers (an init kwarg, stored as per_layer_config[i].head_dim)
    hidden_size_per_layer_input=256,
    hidden_activation="gelu_pytorch_tanh",
    final_logit_softcapping=30.0,
    sliding_window=512,
    max_position_embeddings=131_072,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    attention_k_eq_v=False,
    enable_moe_block=False,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    },
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)
# One layer of each kind: [sliding, full] unshared, then [sliding, full] KV-shared.
SMALL_NUM_LAYERS = 4
SMALL_LAYER_TYPES = ["sliding_attention", "full_attention"] * 2
SMALL_NUM_KV_SHARED_LAYERS = 2


def real_layer_kinds() -> Counter:
    """(attention type, kv_shared) -> number of such layers in the real E2B text model."""
    first_shared = REAL_NUM_LAYERS - REAL_NUM_KV_SHARED_LAYERS
    return Counter((t, i >= first_shared) for i, t in enumerate(REAL_LAYER_TYPES))


def layer_kind(layer: torch.nn.Module) -> tuple[str, bool]:
    """(attention type, kv_shared) of a built `Gemma4TextDecoderLayer`."""
    return layer.self_attn.layer_type, bool(layer.self_attn.is_kv_shared_layer)


def text_config(full_depth: bool = False, attn_implementation: str = "sdpa"):
    """The `Gemma4TextConfig` the builder uses: all 35 layers with `full_depth`, else one of each kind."""
    from transformers import Gemma4TextConfig

    return Gemma4TextConfig(
        **E2B_CONFIG,
        num_hidden_layers=REAL_NUM_LAYERS if full_depth else SMALL_NUM_LAYERS,
        layer_types=list(REAL_LAYER_TYPES if full_depth else SMALL_LAYER_TYPES),
        num_kv_shared_layers=REAL_NUM_KV_SHARED_LAYERS if full_depth else SMALL_NUM_KV_SHARED_LAYERS,
        attn_implementation=attn_implementation,
    )


def build(*, device: torch.device, dtype: torch.dtype, seq_len: int = 2048, batch: int = 1,
          attn_implementation: str = "sdpa", use_cache: bool = False, logits_to_keep: int = 0,
          seed: int = 0, full_depth: bool = False, decode: bool = False) -> CaptureTarget:
    """Gemma 4 E2B text model, 4 of 35 layers (one per kind; all 35 with `full_depth`), one prefill of
    `batch` x `seq_len` tokens."""
    from transformers import Gemma4ForCausalLM

    config = text_config(full_depth, attn_implementation)
    model = random_model(Gemma4ForCausalLM, config, device=device, dtype=dtype, seed=seed)
    # transformers computes the rotary tables per layer type in the order of a set of strings, which the
    # process's hash seed decides: two captures of one config made different rotary chain cards. One order.
    if isinstance(getattr(model.model, "unique_layer_types", None), (set, frozenset)):
        model.model.unique_layer_types = sorted(model.model.unique_layer_types)

    real = real_layer_kinds()
    kinds = [layer_kind(layer) for layer in model.model.layers]
    if full_depth:
        if Counter(kinds) != real:
            raise RuntimeError(f"full-depth Gemma 4 layers {Counter(kinds)} are not the real kinds {real}")
        multiplicity = {}
    else:
        if sorted(kinds) != sorted(real):
            raise RuntimeError(f"shrunk Gemma 4 layers {kinds} do not cover the real kinds {sorted(real)} once each")
        multiplicity = {f"model.layers.{i}": real[kind] for i, kind in enumerate(kinds)}

    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, config.vocab_size, (batch, seq_len), generator=gen).to(device)

    def forward():
        with torch.no_grad():
            return model(input_ids=input_ids, use_cache=use_cache, logits_to_keep=logits_to_keep)

    step_note = ""
    if decode:  # one decoding step after a prefill of seq_len tokens (engine/models/decode.py)
        from engine.models.decode import decode_step

        forward, step_note = decode_step(model, input_ids, logits_to_keep)

    ple = config.num_hidden_layers * config.hidden_size_per_layer_input
    real_ple = REAL_NUM_LAYERS * config.hidden_size_per_layer_input
    kv_shared = ("; KV-shared layers have no k/v projections and read the K/V of the last unshared layer of "
                 "their type")
    if full_depth:
        depth = {
            "layers": "full depth: all 35 layers built (no multiplicity): "
            + ", ".join(f"{n} {t}{' KV-shared' if s else ''}" for (t, s), n in real.items()) + kv_shared,
            "depth": "the full-depth model: every width is the real one, the per-layer-embedding (PLE) tables "
            f"included (width num_hidden_layers x 256 = {ple}): embed_tokens_per_layer "
            f"{config.vocab_size_per_layer_input}x{ple}, per_layer_model_projection {config.hidden_size}->{ple}",
        }
    else:
        depth = {
            "layers": "4 of 35 kept: "
            + ", ".join(f"model.layers.{i} = {t}{' KV-shared' if s else ''} x{real[(t, s)]}"
                        for i, (t, s) in enumerate(kinds)) + kv_shared,
            "shrink": f"widths are the real model's except the per-layer-embedding (PLE) tables, whose width is "
            f"num_hidden_layers x 256: embed_tokens_per_layer {config.vocab_size_per_layer_input}x{ple} "
            f"(real x{real_ple}) and per_layer_model_projection {config.hidden_size}->{ple} (real ->{real_ple}); "
            "these run once per forward (multiplicity 1)",
        }
    notes = {
        "model": "Gemma4ForCausalLM (text only), google/gemma-4-E2B text_config, random weights",
        "transformers": importlib.metadata.version("transformers"),
        "attention": f"{model.config._attn_implementation} (requested {attn_implementation!r}); scaling 1.0, "
        "q/k RMS-norm; sliding layers head_dim 256 window 512, full layers head_dim 512 with proportional "
        "RoPE on 1/4 of it; 8 query heads, 1 KV head",
        "forward": step_note or (f"one prefill of {batch}x{seq_len} random token ids, no attention mask, "
        f"use_cache={use_cache}, logits_to_keep={logits_to_keep}"
        + (" (logits for every position)" if logits_to_keep == 0 else "")
        + "; generate() would use a cache and logits_to_keep=1, and with that transformers 5.24 (not 5.17) "
        "runs the KV-shared layers on the last token only"),
        **depth,
        "weights": f"{dtype} built directly on {device}; matrices from a tiled N(0, 0.02) block, norms/buffers "
        "from the model's own init; lm_head tied to embed_tokens",
    }
    return CaptureTarget(module=model, forward=forward, multiplicity=multiplicity, notes=notes,
                         full_depth=full_depth)
