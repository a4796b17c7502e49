"""H200: graph routes (engine/cast/graphs.py) with torch.cuda.graph itself.

A decoder-like block in bf16 (linear, RMSNorm written out, SiLU gate, SDPA), routed per block: the replay
equals the eager forward bit for bit on new values of the same signature, a forward with a host sync is
refused as not capturable and the process goes on (its eager output returned, later captures still work), and
two blocks' graphs share one pool without one's replay disturbing the other's output."""

import pytest
import torch
from torch import nn

from engine.cast.graphs import GraphSet

pytestmark = pytest.mark.gpu


class Block(nn.Module):
    def __init__(self, d=256, heads=4):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.gate = nn.Linear(d, 2 * d, bias=False)
        self.down = nn.Linear(d, d, bias=False)
        self.w = nn.Parameter(torch.ones(d))
        self.heads, self.eps = heads, 1e-6

    def norm(self, x):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.w

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, d // self.heads).transpose(1, 3).unbind(2)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + a.transpose(1, 2).reshape(b, t, d)
        g, u = self.gate(self.norm(x)).chunk(2, -1)
        return x + self.down(torch.nn.functional.silu(g) * u)


class Syncs(Block):
    def forward(self, x):
        if x.abs().max().item() > 1e9:  # a host sync: not capturable
            return x * 0
        return super().forward(x)


def _model(cls=Block, n=3):
    torch.manual_seed(0)
    return nn.Sequential(*[cls() for _ in range(n)]).cuda().to(torch.bfloat16).eval()


def test_replays_equal_the_eager_forward_bit_for_bit_on_new_values():
    model = _model()
    gs = GraphSet(model, lambda path, m: isinstance(m, Block))
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(2, 64, 256, device="cuda", dtype=torch.bfloat16)
            want = model(x)
            with gs:
                got = model(x)
            assert torch.equal(got, want)
    st = gs.stats()
    assert all(s["captured"] == 1 and s["replays"] == 3 and not s["refused"] for s in st.values()), st


def test_a_forward_with_a_host_sync_is_refused_and_the_process_goes_on():
    model = _model(Syncs, n=1)
    gs = GraphSet(model, lambda path, m: isinstance(m, Block))
    x = torch.randn(2, 64, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want = model(x)
        with gs:
            got = [model(x) for _ in range(2)]
        assert all(torch.equal(g, want) for g in got)
        (st,) = gs.stats().values()
        assert st["refused"]["#1"].startswith("not capturable"), st
        assert st["replays"] == 0
        ok = _model(n=1)  # capture works afterwards
        gs2 = GraphSet(ok, lambda path, m: isinstance(m, Block))
        want = ok(x)
        with gs2:
            ok(x)
            assert torch.equal(ok(x), want)
        assert next(iter(gs2.stats().values()))["replays"] == 1


def test_graphs_sharing_a_pool_keep_each_others_outputs_intact():
    model = _model()
    gs = GraphSet(model, lambda path, m: isinstance(m, Block))
    x = torch.randn(2, 64, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad(), gs:
        model(x)
        outs = []
        h = x
        for blk in model:  # each block's output held while the next block replays
            h = blk(h)
            outs.append(h)
        gs.remove()
        h = x
        for blk, got in zip(model, outs):
            h = blk(h)
            assert torch.equal(got, h)


class Writer(Block):  # as Gemma 4's layers: one puts its keys and values into a mapping for later layers
    def forward(self, x, shared):
        k = self.qkv(self.norm(x))[..., :256]
        shared["full"] = (k, k * 2)
        return super().forward(x)


class Reader(Block):
    def forward(self, x, shared):
        k, v = shared["full"]
        return super().forward(x) + k * v


def test_a_mapping_argument_gets_the_entries_a_replay_writes_and_readers_read_them():
    from collections import UserDict

    torch.manual_seed(0)
    layers = nn.ModuleList([Writer(), Reader(), Reader()]).cuda().to(torch.bfloat16).eval()
    gs = GraphSet(layers, lambda path, m: isinstance(m, Block))

    def run(x):
        shared = UserDict()
        for layer in layers:
            x = layer(x, shared)
        return x, shared["full"]

    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(2, 64, 256, device="cuda", dtype=torch.bfloat16)
            want, want_kv = run(x)
            with gs:
                got, got_kv = run(x)
            assert torch.equal(got, want) and all(torch.equal(a, b) for a, b in zip(got_kv, want_kv))
    st = gs.stats()
    assert all(s["captured"] == 1 and s["replays"] == 3 for s in st.values()), st
