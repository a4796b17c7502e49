"""Stable Diffusion 3.5 Medium with random weights: one MMDiT denoising step (CFG batch) + the VAE decode.

The real MMDiT (diffusers `SD3Transformer2DModel`, config of stabilityai/stable-diffusion-3.5-medium) has
24 `JointTransformerBlock`s of three kinds: blocks 0-12 use dual attention (MMDiT-X: a second,
image-only self-attention `attn2` and `SD35AdaLayerNormZeroX`), blocks 13-22 are plain joint blocks,
block 23 is `context_pre_only` (no context feed-forward; its context branch ends after the attention).
All blocks of one kind have identical shapes, so the model is built with `num_layers=3,
dual_attention_layers=(0,)`, which keeps exactly one block of each kind, and `multiplicity` scales
their calls back to 13, 10 and 1. Every per-layer width is the real one. With `full_depth=True` all
24 blocks are built (for whole-model benchmarks). The VAE (`AutoencoderKL` with the SD3 config) is
built whole; only its decoder runs, so the encoder is dropped after init.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from engine.models.random_init import default_dtype, tiled_random_init
from engine.models.target import CaptureTarget

# stabilityai/stable-diffusion-3.5-medium transformer/config.json
MMDIT_CONFIG = dict(
    sample_size=128, patch_size=2, in_channels=16, num_layers=24, attention_head_dim=64,
    num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536,
    pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=384,
    dual_attention_layers=tuple(range(13)), qk_norm="rms_norm",
)
# Shrunk: one block of each kind (block 0 dual attention, 1 plain joint, 2 context_pre_only).
SHRUNK_LAYERS = dict(num_layers=3, dual_attention_layers=(0,))

# stabilityai/stable-diffusion-3.5-medium vae/config.json
VAE_CONFIG = dict(
    in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512),
    layers_per_block=2, latent_channels=16, norm_num_groups=32, act_fn="silu", sample_size=1024,
    scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False, use_post_quant_conv=False,
    force_upcast=True,
)
VAE_SCALE = 8  # three 2x upsamplers in the decoder


def block_kinds(num_layers: int, dual_attention_layers: tuple[int, ...]) -> list[tuple[bool, bool]]:
    """(use_dual_attention, context_pre_only) per block, as SD3Transformer2DModel.__init__ assigns them."""
    return [(i in dual_attention_layers, i == num_layers - 1) for i in range(num_layers)]


def mmdit_config(full_depth: bool = False) -> dict:
    """The `SD3Transformer2DModel` arguments the builder uses: the real 24 blocks with `full_depth`, else one
    block of each kind."""
    return dict(MMDIT_CONFIG) if full_depth else {**MMDIT_CONFIG, **SHRUNK_LAYERS}


def full_multiplicity() -> dict[str, int]:
    """How many blocks of each kind the real 24-block MMDiT has, keyed by the shrunk block's path."""
    full = block_kinds(MMDIT_CONFIG["num_layers"], MMDIT_CONFIG["dual_attention_layers"])
    shrunk = block_kinds(SHRUNK_LAYERS["num_layers"], SHRUNK_LAYERS["dual_attention_layers"])
    return {f"transformer.transformer_blocks.{i}": full.count(kind) for i, kind in enumerate(shrunk)}


class SD35Medium(nn.Module):
    """Container so module paths read `transformer.…` and `vae.decoder.…`."""

    def __init__(self, transformer: nn.Module, vae: nn.Module):
        super().__init__()
        self.transformer = transformer
        self.vae = vae

    def forward(self, hidden_states, encoder_hidden_states, pooled_projections, timestep, vae_latent):
        """One MMDiT step on the CFG batch, then decode a latent the way StableDiffusion3Pipeline does."""
        noise_pred = self.transformer(
            hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states,
            pooled_projections=pooled_projections, timestep=timestep, return_dict=False,
        )[0]
        cfg = self.vae.config
        latent = vae_latent / cfg.scaling_factor + cfg.shift_factor
        image = self.vae.decode(latent, return_dict=False)[0]
        return noise_pred, image


def center_sincos_table(embed_dim: int, grid_size: int, used: int, base_size: float,
                        interpolation_scale: float) -> torch.Tensor:
    """diffusers' (grid_size², embed_dim) 2-D sin-cos table with only the centre used x used crop filled in.

    The MMDiT reads only that centre crop (`PatchEmbed.cropped_pos_embed`) of its 384 x 384 table; the
    values there are computed by diffusers' own `get_2d_sincos_pos_embed_from_grid` on the same positions,
    so they are the ones the full table holds. The whole table costs ~25 s of float64 on a CPU."""
    from diffusers.models.embeddings import get_2d_sincos_pos_embed_from_grid

    top = (grid_size - used) // 2
    g = torch.arange(top, top + used, dtype=torch.float32) / (grid_size / base_size) / interpolation_scale
    grid = torch.stack(torch.meshgrid(g, g, indexing="xy"), dim=0).reshape(2, 1, used, used)
    crop = get_2d_sincos_pos_embed_from_grid(embed_dim, grid, output_type="pt")
    table = torch.zeros(grid_size, grid_size, embed_dim, dtype=torch.float32)
    table[top:top + used, top:top + used] = crop.reshape(used, used, embed_dim).float()
    return table.reshape(grid_size * grid_size, embed_dim)


@contextlib.contextmanager
def _center_pos_embed(used: int):
    """While the MMDiT is built, its position table is `center_sincos_table` (see there)."""
    from diffusers.models import embeddings

    full = embeddings.get_2d_sincos_pos_embed

    def centre_only(embed_dim, grid_size, cls_token=False, extra_tokens=0, interpolation_scale=1.0,
                    base_size=16, device=None, output_type="pt"):
        if cls_token or extra_tokens or output_type != "pt" or not isinstance(grid_size, int):
            return full(embed_dim, grid_size, cls_token=cls_token, extra_tokens=extra_tokens,
                        interpolation_scale=interpolation_scale, base_size=base_size, device=device,
                        output_type=output_type)
        return center_sincos_table(embed_dim, grid_size, used, base_size, interpolation_scale)

    embeddings.get_2d_sincos_pos_embed = centre_only
    try:
        yield
    finally:
        embeddings.get_2d_sincos_pos_embed = full


def build(*, device: torch.device, dtype: torch.dtype, image_size: int = 1024, text_tokens: int = 333,
          cfg_batch: int = 2, vae_latent_size: int = 128, timestep: float = 500.0,
          seed: int = 0, full_depth: bool = False) -> CaptureTarget:
    """SD3.5 Medium: MMDiT on (cfg_batch, 16, image_size/8, image_size/8) + VAE decode to an image.

    `text_tokens` is the joint text sequence (77 CLIP-L/G + 256 T5 = 333 in the pipeline);
    `vae_latent_size` is the side of the (1, 16, s, s) latent decoded to a (1, 3, 8s, 8s) image;
    `full_depth` builds all 24 MMDiT blocks instead of one of each kind.
    `forward()` returns `(noise_pred, image)`.
    """
    from diffusers import AutoencoderKL, SD3Transformer2DModel

    step = VAE_SCALE * MMDIT_CONFIG["patch_size"]
    if image_size % step:
        raise ValueError(f"image_size must be a multiple of {step}, got {image_size}")
    latent = image_size // VAE_SCALE
    if latent // MMDIT_CONFIG["patch_size"] > MMDIT_CONFIG["pos_embed_max_size"]:
        raise ValueError(f"image_size {image_size} exceeds the MMDiT's position-embedding grid")

    torch.manual_seed(seed)
    # Init directly on the device; random inits become a tiled fill of the same scale (per-element RNG
    # in float32 took most of a CPU capture's time).
    used = latent // MMDIT_CONFIG["patch_size"]
    pos_table = _center_pos_embed(used) if device.type == "cpu" else contextlib.nullcontext()
    with torch.device(device), default_dtype(dtype), tiled_random_init(seed), pos_table:
        transformer = SD3Transformer2DModel(**mmdit_config(full_depth))
        vae = AutoencoderKL(**VAE_CONFIG)
    vae.encoder = None  # only decode() runs; AutoencoderKL.decode never touches the encoder
    model = SD35Medium(transformer, vae).to(device=device, dtype=dtype).eval()

    g = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    c = MMDIT_CONFIG
    inputs = dict(
        hidden_states=randn(cfg_batch, c["in_channels"], latent, latent),
        encoder_hidden_states=randn(cfg_batch, text_tokens, c["joint_attention_dim"]),
        pooled_projections=randn(cfg_batch, c["pooled_projection_dim"]),
        # The pipeline passes the scheduler's float32 timestep, expanded to the CFG batch.
        timestep=torch.full((cfg_batch,), float(timestep), dtype=torch.float32, device=device),
        vae_latent=randn(1, VAE_CONFIG["latent_channels"], vae_latent_size, vae_latent_size),
    )

    processors = sorted({type(p).__name__ for p in transformer.attn_processors.values()})
    vae_processors = sorted({type(p).__name__ for p in vae.attn_processors.values()})
    if full_depth:
        kinds = block_kinds(c["num_layers"], c["dual_attention_layers"])
        depth = {"depth": f"the full-depth model: MMDiT built with all {len(kinds)} blocks (no multiplicity): "
                          f"{kinds.count((True, False))} dual-attention, {kinds.count((False, False))} plain "
                          f"joint, {kinds.count((False, True))} context_pre_only; all widths real"}
    else:
        depth = {"shrinking": "MMDiT built with num_layers=3, dual_attention_layers=(0,): block 0 = dual-attention "
                              "(x13 in the real model), block 1 = plain joint (x10), block 2 = context_pre_only "
                              "(x1); all widths real"}
    notes = {
        **depth,
        "inputs": f"CFG batch {cfg_batch}, image {image_size}x{image_size} (latent {latent}x{latent}, "
                  f"{(latent // c['patch_size']) ** 2} image tokens), {text_tokens} text tokens; "
                  f"VAE decodes a 1x16x{vae_latent_size}x{vae_latent_size} latent",
        "attention": f"MMDiT: {', '.join(processors)}; VAE mid-block: {', '.join(vae_processors)} "
                     "(both F.scaled_dot_product_attention, default backend)",
        "qk_norm": "diffusers RMSNorm (variance computed in float32, weight applied in model dtype)",
        "vae": f"decoder only (encoder deleted after init), no post_quant_conv; runs in {dtype} like the SD3 "
               "pipeline (it ignores force_upcast); latent / scaling_factor + shift_factor before decode",
        "weights": f"random, {dtype} built directly on {device}: each torch.nn.init random fill replaced by a tiled "
                   "N(0, 1) block scaled to that init's mean and std"
                   + ("; the 384x384 position table holds diffusers' values in the centre crop the MMDiT "
                      "reads and zeros elsewhere (the full float64 table takes ~25 s on a CPU)"
                      if device.type == "cpu" else ""),
        "timestep": "float32, as from FlowMatchEulerDiscreteScheduler; sinusoidal embedding cast to model dtype",
    }
    return CaptureTarget(module=model, forward=lambda: model(**inputs),
                         multiplicity={} if full_depth else full_multiplicity(), notes=notes,
                         full_depth=full_depth)


class SD35VaeDecode(nn.Module):
    """The SD3.5 VAE's decode as a model of its own (paths read `vae.decoder.…`, as in SD35Medium)."""

    def __init__(self, vae: nn.Module):
        super().__init__()
        self.vae = vae

    def forward(self, vae_latent):
        cfg = self.vae.config
        return self.vae.decode(vae_latent / cfg.scaling_factor + cfg.shift_factor, return_dict=False)[0]


def build_vae(*, device: torch.device, dtype: torch.dtype, vae_latent_size: int = 128, seed: int = 0) -> CaptureTarget:
    """SD3.5 Medium's VAE decode alone: a (1, 16, s, s) latent to a (1, 3, 8s, 8s) image, as the pipeline's
    last step runs it (and as `engine.config.sd35_vae` times it)."""
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    with torch.device(device), default_dtype(dtype), tiled_random_init(seed):
        vae = AutoencoderKL(**VAE_CONFIG)
    vae.encoder = None  # only decode() runs
    model = SD35VaeDecode(vae).to(device=device, dtype=dtype).eval()
    g = torch.Generator(device="cpu").manual_seed(seed)
    latent = torch.randn(1, VAE_CONFIG["latent_channels"], vae_latent_size, vae_latent_size,
                         generator=g).to(device=device, dtype=dtype)
    notes = {"vae": f"SD3.5 Medium VAE decoder only, random weights in {dtype}; a 1x16x{vae_latent_size}x"
                    f"{vae_latent_size} latent decoded to a {8 * vae_latent_size}x{8 * vae_latent_size} image"}
    return CaptureTarget(module=model, forward=lambda: model(latent), notes=notes)
