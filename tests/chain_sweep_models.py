"""Small models whose forwards hold the chains real models have (norms with upcasts, residual adds, GroupNorm ->
SiLU, gated MLPs, AdaLN, rotary embeddings, masked softmax) and user-written variations (non-contiguous inputs,
broadcast weights, dtype mixes, in-place ops, views, outputs that alias): the honest sweep of chain cards
(tests/test_chain_honest_sweep.py, scripts/chain_honest_sweep.py) captures them with the real capture on the CPU.

`build(device, dtype, name, seed)` is a capture builder (engine.config.build_target): the model of PATTERNS[name]
with shapes and values drawn from `seed`. Every chain sits in a submodule, between matmuls where real ones are."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


def _shape(seed: int, choices: list) -> object:
    return choices[seed % len(choices)]


# ------------------------------------------------------------------------------------------------ norms


class LlamaRMS(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + self.eps)
        return self.weight * h.to(dtype)


class GemmaRMS(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.zeros(d)), eps

    def forward(self, x):
        h = x.float()
        out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out = out * (1.0 + self.weight.float())
        return out.type_as(x)


class Wrap(nn.Module):
    """`inner` between two projections (the matmuls a chain sits between in a model)."""

    def __init__(self, d_in, inner, d_out=None, dtype=F32):
        super().__init__()
        self.proj_in = nn.Linear(d_in, d_in, bias=False)
        self.inner = inner
        self.proj_out = nn.Linear(d_out or d_in, d_out or d_in, bias=False)
        self.to(dtype)

    def forward(self, x):
        y = self.inner(self.proj_in(x))
        if isinstance(y, (tuple, list)):
            return tuple(self.proj_out(t) if t.shape[-1] == self.proj_out.in_features else t for t in y)
        return self.proj_out(y)


class AddNorm(nn.Module):
    """A layer's residual add and the norm after it: the sum (the residual stream) and the normed both leave."""

    def __init__(self, d, norm):
        super().__init__()
        self.attn = nn.Linear(d, d, bias=False)
        self.norm = norm
        self.mlp = nn.Linear(d, d, bias=False)

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.mlp(self.norm(x))


class Block(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class GNSiLU(nn.Module):
    def __init__(self, c, groups):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.norm = nn.GroupNorm(groups, c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return self.conv2(F.silu(self.norm(self.conv1(x))))


# ------------------------------------------------------------------------------------------------ MLPs


class GeGLUChunk(nn.Module):
    def __init__(self, d, h, act):
        super().__init__()
        self.proj = nn.Linear(d, 2 * h)
        self.down = nn.Linear(h, d)
        self.act = act

    def forward(self, x):
        a, gate = self.proj(x).chunk(2, dim=-1)
        return self.down(a * self.act(gate))


class SwiGLU2(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, h, bias=False), nn.Linear(d, h, bias=False), nn.Linear(h, d)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


# ------------------------------------------------------------------------------------------------ AdaLN


class AdaLN(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ada = nn.Linear(d, 2 * d)
        self.norm = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.out = nn.Linear(d, d)

    def forward(self, x, c):
        shift, scale = self.ada(F.silu(c)).chunk(2, dim=1)
        h = self.norm(x) * (1 + scale[:, None]) + shift[:, None]
        return self.out(h)


class AdaLNModel(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.block = AdaLN(d)

    def forward(self, x, c):
        return self.block(x, c)


# ------------------------------------------------------------------------------------------------ attention


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    def __init__(self, d, heads, seq):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d, d, bias=False)
        hd = d // heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(seq).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        q = self.q(x).view(b, s, self.heads, d // self.heads).transpose(1, 2)   # non-contiguous
        cos, sin = self.cos[:s].to(q.dtype), self.sin[:s].to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        return self.o(q.transpose(1, 2).reshape(b, s, d))


class MaskedSoftmax(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
        scores = scores + mask
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v)
        return self.o(out.transpose(1, 2).reshape(b, s, d))


# ------------------------------------------------------------------------------------------------ user-written


class Fn(nn.Module):
    """A chain written as a function of the module's inputs (and its parameters)."""

    def __init__(self, fn, params=()):
        super().__init__()
        self.fn = fn
        self.ps = nn.ParameterList([nn.Parameter(p, requires_grad=False) for p in params])

    def forward(self, *xs):
        return self.fn(*xs, *self.ps)


class Around(nn.Module):
    """`inner(*xs)` inside a submodule, inputs from a projection when `project`; the outputs leave as they are."""

    def __init__(self, inner, d=None, dtype=F32):
        super().__init__()
        self.inner = inner
        self.proj = nn.Linear(d, d, bias=False).to(dtype) if d else None

    def forward(self, x, *rest):
        if self.proj is not None:
            x = self.proj(x)
        out = self.inner(x, *rest)
        return out


def _t_scale(x, w):
    return (x.t() * 2.0 + 1.0) * w


def _slice_chain(x):
    return torch.sigmoid(x[:, ::2]) * x[:, 1::2]


def _inplace_mid(x):
    h = x * 2.0
    h.mul_(0.5)
    return torch.tanh(h).add_(1.0)


def _inplace_input(x):
    y = torch.relu(x)
    x.mul_(y)            # writes its own input
    return x + 1.0


def _views(x):
    b, s, d = x.shape
    h = torch.sigmoid(x).reshape(b * s, d)
    h = h * 3.0
    return h.view(b, s, d).transpose(1, 2).contiguous() - 1.0


def _out_view_of_input(x):
    y = torch.exp(x) + 1.0
    return y * 2.0, x.view(-1)


def _aliasing_outputs(x):
    y = torch.sin(x) * x
    return y, y.view(-1), y.t()


def _mixed(x, w32):
    return (x.float() * w32 + 0.5).to(x.dtype) * 2


def _scalar_consts(x):
    return torch.clamp(x * 0.125 - 3, min=-1.5, max=2.0).pow(3.0) / 7.0


def _broadcast_w(x, w):
    return torch.sigmoid(x) * w + w


def _where_chain(x):
    return torch.where(x > 0, x * 2.0, torch.exp(x) - 1.0).abs()


def _int_chain(x):
    i = (x * 10).to(torch.int64)
    return (i % 7 + i // 3).to(torch.float32) * 0.5


def _expand_chain(x, w):
    return (x.unsqueeze(1).expand(-1, 3, -1) * w).sum(1) + 1.0


def _softmax_fp16_mask(x):
    s = x.shape[-1]
    mask = torch.full((s, s), float("-inf"), dtype=x.dtype, device=x.device).triu(1)
    return torch.softmax(x.view(-1, s, s) + mask, dim=-1).to(x.dtype)


def _layer_norm_fp32_weight(x, w, b):
    return F.layer_norm(x.float(), (x.shape[-1],), w, b, 1e-5).to(x.dtype) * 1.5


def _cat_slices(x):
    return torch.cat([x[..., 1:] * 2, x[..., :1] - 1], dim=-1).relu()


def _mean_sub(x):
    return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-5)


def _exact_int(x):
    return (x > 0.5).to(x.dtype) * x + (x < -0.5).to(x.dtype)


def _inplace_view_of_input(x):
    x[:, :4].mul_(2.0)
    return torch.tanh(x) * 3.0


class ResidualInPlace(nn.Module):
    """`hidden.add_(residual)` on the residual stream, then a norm: the chain writes its input, which the next
    layer reads."""

    def __init__(self, d):
        super().__init__()
        self.attn = nn.Linear(d, d, bias=False)
        self.norm = LlamaRMS(d)
        self.mlp = nn.Linear(d, d, bias=False)

    def forward(self, x):
        h = self.attn(x)
        h.add_(x)
        return h + self.mlp(self.norm(h))


def _inplace_through_a_view(x):
    h = x.view(-1)
    h.mul_(2.0)
    return torch.sigmoid(h) * 3.0


def _relu_inplace_out(x):
    x.relu_()
    return x, torch.sigmoid(x) * 2.0


def _view_out_used_inside(x):
    h = x * 2.0
    v = h.view(-1)
    return v + 1.0, v


def _scalar_tensor(x):
    return x * torch.tensor(0.5, dtype=x.dtype) + torch.tensor(1.0, dtype=x.dtype)


def _normalize(x):
    return F.normalize(x, dim=-1) * 2.0


def _arange_positions(x):
    s = x.shape[-2]
    pos = torch.arange(s, device=x.device, dtype=x.dtype)[:, None]
    return torch.sin(x + pos) * 0.5


def _masked_fill(x, m):
    return torch.softmax(x.masked_fill(m, float("-inf")), dim=-1) * 1.0


def _addcmul_lerp(x, w):
    return torch.lerp(torch.addcmul(x, x, w, value=0.5), w.expand_as(x), 0.25)


def _fp16_sum(x):
    return (x.float().sum(-1, keepdim=True) / x.shape[-1]).half() + x


def _t5_rms(x, w):
    var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(var + 1e-6)
    return w * x.to(w.dtype)


def _clamp_inf(x):
    y = x * 300.0
    big = torch.finfo(y.dtype).max - 1000
    return torch.clamp(y, min=-big, max=big) + 1.0


class BNReLU(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return self.conv2(F.relu(self.bn(self.conv1(x)) * 1.0))


def _bn(dtype):
    def make(seed, g):
        n, c, hw = _shape(seed, [(2, 8, 4), (1, 3, 5), (1, 16, 3)])
        return Block([BNReLU(c) for _ in range(2)]).to(dtype), (_rn(g, n, c, hw, hw, dtype=dtype),)
    return make


def _residual_inplace(dtype):
    def make(seed, g):
        b, s, d = _shape(seed, [(2, 5, 32), (1, 1, 17), (1, 6, 64)])
        return Block([ResidualInPlace(d) for _ in range(2)]).to(dtype), (_rn(g, b, s, d, dtype=dtype),)
    return make


class SplitOutside(nn.Module):
    """`gate, up = proj(x).chunk(2)` in the parent, `silu(gate) * up` in a submodule: two chain inputs that are
    views of one storage."""

    def __init__(self, d, h):
        super().__init__()
        self.proj = nn.Linear(d, 2 * h, bias=False)
        self.act = Fn(lambda g, u: F.silu(g) * u)
        self.down = nn.Linear(h, d, bias=False)

    def forward(self, x):
        g, u = self.proj(x).chunk(2, dim=-1)
        return self.down(self.act(g, u))


class ExpandedMask(nn.Module):
    """A mask expanded (stride 0) and a slice with an offset, made outside the chain's module."""

    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d, bias=False)
        self.inner = Fn(lambda s, m, b: torch.softmax(s * 0.5 + m, dim=-1) + b)

    def forward(self, x, mask):
        s = self.proj(x)
        m = mask.expand(s.shape[0], -1)
        return self.inner(s, m, s[:, 1:2])


class PositionGather(nn.Module):
    """Rotary tables gathered by integer position ids inside the chain."""

    def __init__(self, d, seq):
        super().__init__()
        self.proj = nn.Linear(d, d, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
        emb = torch.outer(torch.arange(seq).float(), inv).repeat(1, 2)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.rot = Fn(lambda q, pos, cos: q * cos[pos] + 1.0)

    def forward(self, x, pos):
        return self.rot(self.proj(x), pos, self.cos)


class Noise(nn.Module):
    """StyleGAN's noise injection: fresh noise every forward, in eval too."""

    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.weight = nn.Parameter(torch.zeros(1))
        self.act = Fn(lambda x, w: F.leaky_relu(x + w * torch.randn(x.shape[0], 1, x.shape[2], x.shape[3],
                                                                     dtype=x.dtype, device=x.device), 0.2))

    def forward(self, x):
        return self.conv(self.act(self.conv(x), self.weight))


def _quant(x):
    q = torch.clamp(torch.round(x / 0.05), -128, 127).to(torch.int8)
    return q, q.to(torch.float32) * 0.05


def _exp_half(x):
    return torch.exp(x.float() * 4.0).half() * 0.5


def _full_mask_rows(x):
    s = x.shape[-1]
    m = torch.zeros(s, s, dtype=x.dtype, device=x.device)
    m[0] = float("-inf")
    return torch.softmax(x.view(-1, s, s) + m, dim=-1) * 1.0


def _range_dim0(x):   # one row: 0 / 0, NaN everywhere
    return (x - x.mean(0)) / (x.amax(0) - x.amin(0))


def _cumsum(x):
    return torch.cumsum(torch.sigmoid(x), dim=-1) * 0.5


def _sum_all(x):
    return (x * x).sum() + 1.0, x * 2.0


def _argmax(x):
    return torch.softmax(x * 2.0, dim=-1).argmax(-1)


def _downcast(x):
    return (torch.tanh(x) * 2.0).to(torch.bfloat16) + 1


def _manual_silu_cl(x):
    return x * torch.sigmoid(x) * 1.5


def _permuted_out(x):
    return x.transpose(-1, -2) * 2.0 + 1.0


def _bool_index(x):
    return torch.sigmoid(x[x > 0]) * 2.0


def _item_scale(x):
    return torch.tanh(x) / (x.abs().amax().item() + 1.0) * 2.0


def _nonzero_rows(x):
    rows = torch.nonzero(x.sum(-1) > 0).squeeze(-1)
    return torch.relu(x.index_select(0, rows)) + 1.0


def _unique(x):
    return torch.unique((x * 2).round()) * 0.5


def _repeat_interleave(x):
    counts = (x[:, 0] > 0).long() + 1
    return torch.repeat_interleave(x * 2.0, counts, dim=0) + 1.0


class ReadThenWritten(nn.Module):
    """A chain value read outside (a projection) and then written in place by a later member."""

    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.inner = Fn(lambda x, p: self._go(x, p))

    def _go(self, x, proj):
        h = torch.tanh(x) * 2.0
        y = proj(h)
        h.mul_(3.0)
        return h + 1.0, y

    def forward(self, x):
        a, b = self.inner(x, self.proj)
        return self.out(a) + b


class ViewOfWritten(nn.Module):
    """A view of an input, passed beside it, read after a member wrote the input in place."""

    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d, bias=False)
        self.inner = Fn(lambda x, v: self._go(x, v))

    @staticmethod
    def _go(x, v):
        s = torch.sigmoid(x)
        x.mul_(s)
        return x * 2.0 + v

    def forward(self, x):
        h = self.proj(x)
        return self.inner(h, h[:, :1])


class ForeachOnInputs(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.a, self.b = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.inner = Fn(lambda x, y: self._go(x, y))

    @staticmethod
    def _go(x, y):
        torch._foreach_mul_([x, y], 0.5)
        return torch.sigmoid(x) * y

    def forward(self, x):
        return self.inner(self.a(x), self.b(x))


def _masked_fill_input(x, m):
    x.masked_fill_(m, 0.0)
    return torch.softmax(x, dim=-1) * 2.0


def _add_out_into_input(x, w):
    y = torch.sigmoid(x)
    torch.add(y, w, out=x)
    return x * 2.0


def build(device, dtype, name: str, seed: int = 0):
    """The model of `name` (PATTERNS) with shapes from `seed`, on `device`; its example inputs from `seed` too."""
    g = torch.Generator().manual_seed(1000 + seed)
    torch.manual_seed(seed)
    model, inputs = PATTERNS[name](seed, g)
    model = model.to(device)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.copy_((torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.dim() == 1 else 0.0)).to(p.dtype))
    inputs = tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs)
    return model, inputs


def _rn(g, *shape, dtype=F32):
    return torch.randn(*shape, generator=g).to(dtype)


def _llama(dtype):
    def make(seed, g):
        b, s, d = _shape(seed, [(1, 1, 17), (2, 5, 32), (1, 7, 64), (3, 3, 48), (2, 1, 128)])
        return Block([Wrap(d, LlamaRMS(d), dtype=dtype) for _ in range(2)]).to(dtype), (_rn(g, b, s, d, dtype=dtype),)
    return make


def _gemma(dtype):
    def make(seed, g):
        b, s, d = _shape(seed, [(2, 5, 32), (1, 1, 17), (1, 9, 96), (2, 3, 40)])
        return Block([Wrap(d, GemmaRMS(d), dtype=dtype) for _ in range(2)]).to(dtype), (_rn(g, b, s, d, dtype=dtype),)
    return make


def _add_norm(kind, dtype):
    def make(seed, g):
        b, s, d = _shape(seed, [(2, 5, 32), (1, 1, 17), (1, 6, 64), (3, 2, 24)])
        norm = {"rms": lambda: LlamaRMS(d), "gemma": lambda: GemmaRMS(d), "ln": lambda: nn.LayerNorm(d)}[kind]
        return Block([AddNorm(d, norm()) for _ in range(2)]).to(dtype), (_rn(g, b, s, d, dtype=dtype),)
    return make


def _gn(dtype, channels_last):
    def make(seed, g):
        n, c, hw, groups = _shape(seed, [(2, 8, 4, 4), (1, 16, 5, 8), (1, 12, 3, 3), (2, 32, 4, 32)])
        x = _rn(g, n, c, hw, hw, dtype=dtype)
        m = Block([GNSiLU(c, groups) for _ in range(2)]).to(dtype)
        if channels_last:
            m = m.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        return m, (x,)
    return make


def _glu(kind, dtype):
    def make(seed, g):
        b, s, d = _shape(seed, [(2, 5, 32), (1, 1, 17), (1, 7, 24)])
        h = 2 * d + 6
        layer = {"geglu": lambda: GeGLUChunk(d, h, F.gelu), "geglu_tanh": lambda: GeGLUChunk(
            d, h, lambda t: F.gelu(t, approximate="tanh")), "swiglu_chunk": lambda: GeGLUChunk(d, h, F.silu),
                 "swiglu2": lambda: SwiGLU2(d, h)}[kind]
        return Block([layer() for _ in range(2)]).to(dtype), (_rn(g, b, s, d, dtype=dtype),)
    return make


def _adaln(dtype):
    def make(seed, g):
        b, s, d = _shape(seed, [(2, 5, 32), (1, 1, 17), (3, 4, 24)])
        return AdaLNModel(d).to(dtype), (_rn(g, b, s, d, dtype=dtype), _rn(g, b, d, dtype=dtype))
    return make


def _rotary(dtype):
    def make(seed, g):
        b, s, d, h = _shape(seed, [(2, 5, 32, 2), (1, 1, 16, 1), (1, 7, 48, 3)])
        return Block([Rotary(d, h, 16) for _ in range(2)]).to(dtype), (_rn(g, b, s, d, dtype=dtype),)
    return make


def _masked_softmax(dtype):
    def make(seed, g):
        b, s, d, h = _shape(seed, [(2, 5, 32, 2), (1, 1, 16, 1), (1, 7, 48, 3)])
        mask = torch.full((s, s), torch.finfo(dtype).min).triu(1).to(dtype)[None, None]
        return Around(MaskedSoftmax(d, h)).to(dtype), (_rn(g, b, s, d, dtype=dtype), mask)
    return make


def _fn(fn, shapes, dtype=F32, params=(), project=True, channels=None):
    """A user-written chain `fn` inside a submodule, its first input from a projection (`project`)."""
    def make(seed, g):
        shape = _shape(seed, shapes)
        d = shape[-1]
        ps = [p(shape, g) if callable(p) else p for p in params]
        m = Around(Fn(fn, ps), d if project else None, dtype=dtype)
        return m.to(dtype) if not ps else m, (_rn(g, *shape, dtype=dtype),)
    return make


def _w(dtype=F32, last=True):
    def make(shape, g):
        return _rn(g, shape[-1] if last else shape[0], dtype=dtype)
    return make


def _wt(shape, g):   # a weight for the transposed input: one per row of x
    return _rn(g, shape[0])


PATTERNS = {
    # real models' chains
    "llama_rms bf16": _llama(BF16),
    "llama_rms fp16": _llama(F16),
    "llama_rms fp32": _llama(F32),
    "gemma_rms bf16": _gemma(BF16),
    "gemma_rms fp32": _gemma(F32),
    "add+rms bf16": _add_norm("rms", BF16),
    "add+gemma fp16": _add_norm("gemma", F16),
    "add+layernorm fp32": _add_norm("ln", F32),
    "add+layernorm bf16": _add_norm("ln", BF16),
    "groupnorm+silu fp32": _gn(F32, False),
    "groupnorm+silu fp32 channels-last": _gn(F32, True),
    "groupnorm+silu bf16": _gn(BF16, False),
    "groupnorm+silu bf16 channels-last": _gn(BF16, True),
    "geglu chunk fp32": _glu("geglu", F32),
    "geglu tanh bf16": _glu("geglu_tanh", BF16),
    "swiglu chunk bf16": _glu("swiglu_chunk", BF16),
    "swiglu two projections fp16": _glu("swiglu2", F16),
    "adaln modulate fp32": _adaln(F32),
    "adaln modulate bf16": _adaln(BF16),
    "rotary fp32": _rotary(F32),
    "rotary bf16": _rotary(BF16),
    "masked softmax fp32": _masked_softmax(F32),
    "masked softmax bf16": _masked_softmax(BF16),
    # user-written variations
    "transposed input": _fn(_t_scale, [(8, 17), (5, 32), (1, 9)], params=[_wt]),
    "sliced input": _fn(_slice_chain, [(4, 34), (1, 18), (3, 64)]),
    "in-place on an intermediate": _fn(_inplace_mid, [(4, 17), (1, 32), (2, 3, 8)]),
    "in-place on an input": _fn(_inplace_input, [(4, 17), (1, 32), (2, 3, 8)]),
    "views inside": _fn(_views, [(2, 5, 17), (1, 1, 32), (3, 2, 8)]),
    "output a view of an input": _fn(_out_view_of_input, [(4, 17), (1, 32)]),
    "outputs alias each other": _fn(_aliasing_outputs, [(4, 17), (1, 32), (6, 6)]),
    "bf16 x fp32 weight": _fn(_mixed, [(4, 17), (1, 32), (2, 3, 64)], dtype=BF16, params=[_w(F32)]),
    "fp16 x fp32 weight": _fn(_mixed, [(4, 17), (1, 32), (2, 3, 64)], dtype=F16, params=[_w(F32)]),
    "scalar constants": _fn(_scalar_consts, [(4, 17), (1, 32), (2, 3, 64)]),
    "broadcast weight bf16": _fn(_broadcast_w, [(4, 17), (1, 32), (2, 3, 64)], dtype=BF16, params=[_w(BF16)]),
    "where chain": _fn(_where_chain, [(4, 17), (1, 32)]),
    "int chain": _fn(_int_chain, [(4, 17), (1, 32)]),
    "expand inside": _fn(_expand_chain, [(4, 17), (1, 32)], params=[_w()]),
    "causal softmax fp16": _fn(_softmax_fp16_mask, [(2, 8, 8), (1, 1, 1), (3, 5, 5)], dtype=F16, project=False),
    "layer_norm fp32 params on bf16": _fn(_layer_norm_fp32_weight, [(4, 17), (2, 3, 64)], dtype=BF16,
                                          params=[_w(), _w()]),
    "cat of slices": _fn(_cat_slices, [(4, 17), (1, 32), (2, 3, 8)]),
    "standardize": _fn(_mean_sub, [(4, 17), (1, 32), (2, 3, 64)]),
    "comparisons to dtype": _fn(_exact_int, [(4, 17), (1, 32)], dtype=BF16),
    "in-place on a view of an input": _fn(_inplace_view_of_input, [(4, 17), (1, 32), (3, 8)]),
    "residual add_ then norm bf16": _residual_inplace(BF16),
    "in-place through a view made inside": _fn(_inplace_through_a_view, [(4, 17), (1, 32)]),
    "relu_ on the input, returned": _fn(_relu_inplace_out, [(4, 17), (1, 32)]),
    "a view output used inside": _fn(_view_out_used_inside, [(4, 17), (1, 32)]),
    "scalar tensors": _fn(_scalar_tensor, [(4, 17), (1, 32)]),
    "normalize": _fn(_normalize, [(4, 17), (1, 32), (2, 3, 64)]),
    "arange positions": _fn(_arange_positions, [(2, 5, 17), (1, 1, 32)]),
    "masked_fill softmax": _fn(_masked_fill, [(4, 17), (1, 32)],
                               params=[lambda shape, g: torch.rand(shape, generator=g) > 0.7]),
    "addcmul lerp": _fn(_addcmul_lerp, [(4, 17), (1, 32)], params=[_w()]),
    "fp16 mean via float sum": _fn(_fp16_sum, [(4, 17), (1, 32), (2, 3, 300)], dtype=F16),
    "t5 rms bf16": _fn(_t5_rms, [(4, 17), (1, 32), (2, 3, 64)], dtype=BF16, params=[_w(BF16)]),
    "clamp near fp16 max": _fn(_clamp_inf, [(4, 17), (1, 32)], dtype=F16),
    "batchnorm eval relu fp32": _bn(F32),
    "gate/up views of one storage": lambda seed, g: (
        Block([SplitOutside(*_shape(seed, [(16, 24), (17, 9), (32, 64)])) for _ in range(2)]),
        (_rn(g, _shape(seed, [2, 1, 3]), _shape(seed, [(16, 24), (17, 9), (32, 64)])[0]),)),
    "expanded mask and offset slice": lambda seed, g: (
        ExpandedMask(_shape(seed, [16, 17, 8])),
        (_rn(g, _shape(seed, [3, 1, 5]), _shape(seed, [16, 17, 8])),
         torch.where(torch.rand(_shape(seed, [16, 17, 8]), generator=g) > 0.8, float("-inf"), 0.0)[None])),
    "positions gather": lambda seed, g: (
        PositionGather(16, 12),
        (_rn(g, _shape(seed, [5, 1, 7]), 16), torch.randint(0, 12, (_shape(seed, [5, 1, 7]),), generator=g))),
    "noise injection": lambda seed, g: (
        Block([Noise(_shape(seed, [4, 3, 8])) for _ in range(2)]),
        (_rn(g, 1, _shape(seed, [4, 3, 8]), 5, 5),)),
    "quantize dequantize": _fn(_quant, [(4, 17), (1, 32)]),
    "exp overflow to fp16": _fn(_exp_half, [(4, 17), (1, 32)]),
    "softmax fully masked row": _fn(_full_mask_rows, [(2, 8, 8), (3, 5, 5)], project=False),
    "range over a dim of 1": _fn(_range_dim0, [(1, 17), (1, 32), (3, 8)]),
    "cumsum": _fn(_cumsum, [(4, 17), (1, 32), (2, 300)]),
    "full sum to 0-dim": _fn(_sum_all, [(4, 17), (1, 32)]),
    "argmax of softmax": _fn(_argmax, [(4, 17), (1, 32)]),
    "fp32 to bf16 output": _fn(_downcast, [(4, 17), (1, 32)]),
    "manual silu channels-last": lambda seed, g: (
        Around(Fn(_manual_silu_cl)), (_rn(g, 2, 8, 5, 5).contiguous(memory_format=torch.channels_last),)),
    "transposed output": _fn(_permuted_out, [(2, 5, 17), (1, 4, 32)]),
    "chain value read outside, then written": lambda seed, g: (
        ReadThenWritten(_shape(seed, [16, 17])), (_rn(g, _shape(seed, [3, 1]), _shape(seed, [16, 17])),)),
    "view of a written input beside it": lambda seed, g: (
        ViewOfWritten(_shape(seed, [16, 17])), (_rn(g, _shape(seed, [3, 1]), _shape(seed, [16, 17])),)),
    "foreach_mul_ on two inputs": lambda seed, g: (
        ForeachOnInputs(_shape(seed, [16, 17])), (_rn(g, _shape(seed, [3, 1]), _shape(seed, [16, 17])),)),
    "masked_fill_ on the input": _fn(_masked_fill_input, [(4, 17), (1, 32)],
                                     params=[lambda shape, g: torch.rand(shape, generator=g) > 0.7]),
    "add(out=) into the input": _fn(_add_out_into_input, [(4, 17), (1, 32)], params=[_w()]),
    "boolean mask indexing": _fn(_bool_index, [(4, 17), (1, 32)]),
    "item() inside": _fn(_item_scale, [(4, 17), (1, 32)]),
    "nonzero rows": _fn(_nonzero_rows, [(6, 17), (5, 32)]),
    "unique": _fn(_unique, [(4, 17), (1, 32)]),
    "repeat_interleave by values": _fn(_repeat_interleave, [(4, 17), (3, 32)]),
}
