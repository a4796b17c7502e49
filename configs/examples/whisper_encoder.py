"""The audio encoder of Whisper (transformers), sized like whisper-small, random weights, as a user's
builder for Kernel Forge.

Built from a config object, so nothing is downloaded. Whisper's encoder takes a fixed-length log-mel
spectrogram: 30 s of audio is 3000 frames of 80 mel bins, which two 1-D convolutions (the second of
stride 2) turn into 1500 positions. `frames` sets that length (the position table follows it), never a width.
"""

import torch
from transformers import WhisperConfig
from transformers.models.whisper.modeling_whisper import WhisperEncoder


def build(device: torch.device, dtype: torch.dtype, batch: int = 8, frames: int = 3000, seed: int = 0):
    torch.manual_seed(seed)
    config = WhisperConfig(  # whisper-small's encoder
        num_mel_bins=80, d_model=768, encoder_layers=12, encoder_attention_heads=12, encoder_ffn_dim=3072,
        max_source_positions=frames // 2, activation_function="gelu",
    )
    config._attn_implementation = "sdpa"
    encoder = WhisperEncoder(config).to(device=device, dtype=dtype).eval()
    mel = torch.randn(batch, config.num_mel_bins, frames, device=device, dtype=dtype)
    return encoder, (mel,)
