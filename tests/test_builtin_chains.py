"""Builtin chain templates (engine.propose.builtin.chains) and the chain prompt, on chains traced from small
models built here: which template takes each chain, that its kernels compile for the profiled GPUs and
their launch specs parse, and that the prompt's PyTorch code computes what eager computes."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.capture.chains import chain_signature, container_paths, find_chains, patterns, run_chain, trace_forward
from engine.capture.signature import describe_tensor, signature_text
from engine.cards import OperatorCard

BF = torch.bfloat16


class Block(nn.Module):
    """Holds the module under test, so its calls run inside a submodule (chains never span the root)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.block = inner

    def forward(self, *args):
        return self.block(*args)


class GemmaRMS(nn.Module):
    """Gemma's RMSNorm: fp32 statistics, rsqrt written as pow(-0.5), weight applied as (1 + w)."""

    def __init__(self, d: int):
        super().__init__()
        self.lin, self.weight = nn.Linear(d, d), nn.Parameter(torch.randn(d) * 0.1)

    def forward(self, x):
        x = self.lin(x)
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + 1e-6, -0.5)
        return (h * (1.0 + self.weight.float())).type_as(x)


class LlamaRMS(nn.Module):
    """Llama's RMSNorm: downcast after normalising, then the weight multiply in bf16 (a second rounding)."""

    def __init__(self, d: int):
        super().__init__()
        self.lin, self.weight = nn.Linear(d, d), nn.Parameter(1 + torch.randn(d) * 0.1)

    def forward(self, x):
        x = self.lin(x)
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        return self.weight * h.to(x.dtype)


class GatedMLP(nn.Module):
    def __init__(self, d: int, act):
        super().__init__()
        self.gate, self.up, self.down, self.act = nn.Linear(d, 2 * d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d), act
        
    def forward(self, x):
        return self.down(self.act(self.gate(x)) * self.up(x))


class GroupNormSilu(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.norm, self.c2 = nn.Conv2d(8, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.c2(F.silu(self.norm(self.c1(x))))


class AdaLN(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.lin, self.mod, self.out = nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)

    def forward(self, x, c):
        scale, shift = self.mod(c).unsqueeze(1).chunk(2, dim=-1)
        return self.out(self.lin(x) * (1 + scale) + shift)


def _cuda(d: dict) -> dict:
    return {**d, "device": "cuda"}  # traced on the CPU; the card describes the GPU call


def chain_cards(model: nn.Module, *inputs: torch.Tensor) -> list[OperatorCard]:
    """Every chain pattern of one forward as a chain card (first instance), outputs from eager."""
    torch.manual_seed(0)
    model = Block(model.to(BF))
    trace = trace_forward(model, lambda: model(*inputs), time_calls=False)
    cards = []
    for p in patterns(find_chains(trace.calls, container_paths(model), unknown=trace.unknown)):
        sig = chain_signature(p.instances[0])
        sig = {**sig, "args": [_cuda(a) for a in sig["args"]]}
        outs = run_chain(sig, random_inputs(sig))
        cards.append(OperatorCard(p.id, sig["op"], sig, signature_text(sig) if False else p.id,
                                  [_cuda(describe_tensor(t)) for t in outs]))
    return cards


def random_inputs(sig: dict, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for a in sig["args"]:
        n = sum((s - 1) * st for s, st in zip(a["shape"], a["stride"])) + 1
        base = torch.randn(n, generator=g).to(getattr(torch, a["dtype"]))
        out.append(base.as_strided(a["shape"], a["stride"]))
    return out
