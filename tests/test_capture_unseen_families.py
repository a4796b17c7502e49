"""Calls of model families the reference models do not have (detectors, FFT mixers, text towers that pool at an
end-of-text token), found by a sweep of unseen models through capture: what becomes a card and what a chain."""

from pathlib import Path

import pytest
import torch

from engine.capture.run import capture_model
from engine.config import load_config


def _capture(tmp_path: Path, source: str, device: str = "cpu"):
    (tmp_path / "user_model.py").write_text("import torch\nfrom torch import nn\n\n" + source)
    config = tmp_path / "user_model.toml"
    config.write_text('name = "user_model"\nbuilder = "user_model.py:build"\n[params]\n_ = 0\n'
                      '[dtype]\ncpu = "float32"\ncuda = "float32"\n')
    ws = tmp_path / "ws"
    ws.mkdir()
    return capture_model(load_config(config), torch.device(device), ws)


# The same captures on a GPU (run there by scripts/gpu_tests.py): the CUDA calls are the ones a user's run gets.
DEVICES = pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])


def _chain_ops(result) -> list[list[str]]:
    return [[n["op"] for n in c.signature["chain"]["nodes"]] for c in result.chains]


KEEP = '''
import zlib

ONCE = zlib.crc32(__file__.encode())  # one name per loaded file: a second capture in this process registers anew


@torch.library.custom_op(f"kforge_test_unseen::keep_positive_{ONCE}", mutates_args=())
def keep_positive(x: torch.Tensor) -> torch.Tensor:
    """Like torchvision's nms: how many rows it keeps depends on their values."""
    return x[x[:, 0] > 0].clone()


@keep_positive.register_fake
def _(x):
    n = torch.library.get_ctx().new_dynamic_size()
    return x.new_empty(n, x.shape[1])


@torch.library.custom_op(f"kforge_test_unseen::twice_{ONCE}", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


class Head(nn.Module):
    def forward(self, boxes):
        kept = keep_positive(boxes * 1.5 + 0.25)
        scaled = twice(boxes.sigmoid() * 3.0)
        return kept.relu() * 2 + 1, (scaled + 1).tanh()


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = Head()

    def forward(self, boxes):
        return self.head(boxes)


def build(_):
    torch.manual_seed(0)
    return Model(), (torch.randn(64, 4),)
'''


@DEVICES
def test_another_librarys_op_whose_output_size_depends_on_values_is_no_card_and_ends_chains(tmp_path, device):
    # torchvision's nms carries no dynamic_output_shape tag: it was a card, and a member of Mask R-CNN's chain
    # cards, though every fresh input set keeps another number of boxes. Its fake kernel tells.
    result = _capture(tmp_path, KEEP, device)
    ops = {c.op.split(".")[0].rsplit("_", 1)[0] for c in result.cards}
    assert "kforge_test_unseen::keep_positive" not in ops, ops
    assert result.skipped.get("data-dependent", 0) >= 1, result.skipped
    assert "kforge_test_unseen::twice" in ops   # same shape out as in: a card like any op
    # neither library op sits inside a chain: we cannot read their code, and one of them is data-dependent
    chains = _chain_ops(result)
    assert chains and not [c for c in chains if any(not op.startswith("aten::") for op in c)], chains


FFT = '''
class Mixer(nn.Module):
    """FNet's token mixing: a 2-D FFT, its real part, a residual add and a layer norm."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)

    def forward(self, x):
        mixed = torch.fft.fftn(x, dim=(-1, -2)).real
        return self.norm((x + mixed) * 0.5)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.mixer = Mixer()

    def forward(self, x):
        return self.mixer(x.float() * 1.0)


def build(_):
    torch.manual_seed(0)
    return Model(), (torch.randn(2, 16, 32),)
'''


@DEVICES
def test_an_fft_ends_a_chain(tmp_path, device):
    # FNet's two largest chain cards (28 % and 16 % of its time) held `_fft_c2c` as a "memory-bound" member:
    # a chain kernel would have had to compute a 2-D FFT.
    result = _capture(tmp_path, FFT, device)
    assert any(c.op.startswith("aten::_fft_") for c in result.cards), [c.op for c in result.cards]
    chains = _chain_ops(result)
    assert chains, [c.op for c in result.cards]   # the add and layer norm after it still make one
    assert not [c for c in chains if any("fft" in op for op in c)], chains


GRN = '''
class GRN(nn.Module):
    \"\"\"ConvNeXt V2's global response normalisation (channels-last), between two linears.\"\"\"

    def __init__(self):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((1, 1, 1, 32), 0.5))
        self.beta = nn.Parameter(torch.full((1, 1, 1, 32), 0.1))

    def forward(self, x):
        gx = torch.norm(x, p=2, dim=(1, 2), keepdim=True)
        nx = gx / (gx.mean(dim=-1, keepdim=True) + 1e-6)
        return self.gamma * (x * nx) + self.beta + x


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.grn = GRN()
        self.down = nn.Linear(32, 16)

    def forward(self, x):
        return self.down(self.grn(self.up(x)))


def build(_):
    torch.manual_seed(0)
    return Model(), (torch.randn(2, 8, 8, 16),)
'''


@DEVICES
def test_a_vector_norm_joins_a_chain(tmp_path, device):
    # `linalg_vector_norm` is a reduction: the `linalg_` prefix rule (for factorizations) had kept it out of
    # ConvNeXt V2's GRN chain, leaving the norm and the ops after it apart.
    result = _capture(tmp_path, GRN, device)
    chains = _chain_ops(result)
    assert any("aten::linalg_vector_norm" in c and "aten::mean.dim" in c for c in chains), chains


TEXT = '''
class Text(nn.Module):
    """CLIP's text tower in small: embed and normalise the tokens, encode, and pool at the end-of-text token."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.norm = nn.LayerNorm(32)
        self.proj = nn.Linear(32, 32)

    def forward(self, ids):
        flat = ids.view(-1, ids.shape[-1])
        h = self.proj(self.norm(self.emb(flat) * 2.0 + 1.0))
        eos = flat.to(torch.int32).eq(7).int().argmax(dim=-1)
        return h, eos


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.text = Text()

    def forward(self, ids):
        return self.text(ids)


def build(_):
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 8))
    ids[:, -1] = 7
    return Model(), (ids,)
'''


@DEVICES
def test_two_computations_that_share_only_a_view_of_an_input_are_two_chains(tmp_path, device):
    # CLIP's chain card joined the token embedding and layer norm at the tower's start with the end-of-text argmax
    # at its end: both read one view of the token ids, and that view joined them.
    result = _capture(tmp_path, TEXT, device)
    chains = _chain_ops(result)
    both = [c for c in chains if "aten::argmax" in c and "aten::native_layer_norm" in c]
    assert not both, chains
    assert [c for c in chains if "aten::argmax" in c] and [c for c in chains if "aten::native_layer_norm" in c], \
        chains


EMPTY = '''
class Model(nn.Module):
    """A detector's level with no proposals: a gather of no rows, a write of no rows, and a check for the host."""

    def forward(self, feats, rows):
        picked = feats.index_select(0, rows)            # rows is empty: nothing read, nothing written
        out = feats.clone()
        out.index_put_((rows,), picked)                 # writes no row of `out`
        same = torch.equal(out, feats)                  # a bool for the host
        return out * (2.0 if same else 3.0) + picked.sum()


def build(_):
    return Model(), (torch.randn(16, 8), torch.zeros(0, dtype=torch.long))
'''


@DEVICES
def test_calls_that_write_nothing_or_return_only_to_the_host_are_not_cards(tmp_path, device):
    # Mask R-CNN had cards of roi_align over 0 boxes and of index_put_ of 0 rows (listed at 3.8 MiB of traffic for
    # the untouched tensor); a TransformerEncoder's nested-tensor check, which returns a bool, was its top card.
    result = _capture(tmp_path, EMPTY, device)
    ops = {c.op for c in result.cards}
    assert not ops & {"aten::index_select", "aten::index_put_", "aten::equal"}, ops
    assert {"aten::mul.Tensor", "aten::clone"} <= ops, ops
    assert result.skipped.get("empty") == 2 and result.skipped.get("host result") == 1, result.skipped


CODEBOOK = '''
class Quantizer(nn.Module):
    """A VQ-VAE's codebook lookup (diffusers' VectorQuantizer): pairwise distances to every code, argmin, embed."""

    def __init__(self):
        super().__init__()
        self.codes = nn.Embedding(64, 8)

    def forward(self, z):
        flat = (z * 1.0).view(-1, 8)
        near = torch.cdist(flat, self.codes.weight).argmin(dim=1)
        q = self.codes(near).view(z.shape)
        return z + (q - z) * 0.5, torch.cdist(flat[:16], self.codes.weight[:16], p=1).sum()


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.quantize = Quantizer()

    def forward(self, z):
        return self.quantize(z)


def build(_):
    torch.manual_seed(0)
    return Model(), (torch.randn(2, 32, 8),)
'''


@DEVICES
def test_pairwise_distances_end_a_chain(tmp_path, device):
    # VQ-VAE's quantizer made one "memory-bound" chain card of cdist, argmin, embedding and the straight-through
    # arithmetic: its kernel would have had to compute every (latent, code) distance, a matmul's work.
    result = _capture(tmp_path, CODEBOOK, device)
    ops = {c.op for c in result.cards}
    assert {"aten::_euclidean_dist", "aten::_cdist_forward"} <= ops, ops
    chains = _chain_ops(result)
    assert chains, ops   # the arithmetic after the lookup still makes one
    assert not [c for c in chains if {"aten::_euclidean_dist", "aten::_cdist_forward"} & set(c)], chains


RANDOM = '''
import torch.nn.functional as F


class Sampler(nn.Module):
    """A sampling head: Gumbel-max and multinomial token picks, MC dropout (training=True in eval), noise."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        logits = self.lin(x)
        probs = logits.softmax(-1)
        q = torch.empty_like(probs).exponential_(1)
        pick = (probs / q).argmax(-1)
        drawn = torch.multinomial(probs, 2)
        kept = F.dropout(logits, 0.5, training=True)
        noisy = torch.normal(logits, 0.1) + torch.bernoulli(probs)
        return pick.sum() + drawn.sum() + kept.sum() + noisy.sum() + (logits * 2.0).tanh().sum()


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = Sampler()

    def forward(self, x):
        return self.head(x)


def build(_):
    torch.manual_seed(0)
    return Model(), (torch.randn(4, 8),)
'''


@DEVICES
def test_calls_that_draw_random_numbers_are_not_cards(tmp_path, device):
    # A sampling head's bernoulli, multinomial, exponential_, normal and MC dropout were op cards (bernoulli at a
    # third of the model's time): every call draws other numbers, so no kernel could match eager's output.
    result = _capture(tmp_path, RANDOM, device)
    ops = {c.op.split(".")[0] for c in result.cards}
    drawn = {"aten::bernoulli", "aten::bernoulli_", "aten::multinomial", "aten::exponential_", "aten::normal",
             "aten::native_dropout", "aten::uniform_"}
    assert not ops & drawn, ops
    assert {"aten::_softmax", "aten::tanh", "aten::argmax"} <= ops, ops
    assert result.skipped.get("random", 0) >= 4, result.skipped
    assert "random" in result.notes and "not cards" in result.notes["random"], result.notes


def test_an_op_tagged_random_that_draws_nothing_is_still_a_card():
    # Every attention op is tagged nondeterministic_seeded for its dropout_p, and an inference forward passes 0 (or
    # leaves it out): the 'random' skip took SD3.5's and Gemma's attention out of their captures (CI, 2026-12-06g).
    from engine.capture.filters import draws

    q = k = v = torch.randn(1, 2, 8, 16)
    sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    assert not draws(sdpa, (q, k, v), {})               # dropout_p left at its default, 0
    assert not draws(sdpa, (q, k, v, 0.0), {})
    assert draws(sdpa, (q, k, v, 0.1), {})
    assert not draws(torch.ops.aten.native_dropout.default, (q, 0.5, False), {})   # train off
    assert draws(torch.ops.aten.native_dropout.default, (q, 0.5, True), {})
    assert draws(torch.ops.aten.bernoulli.default, (q.sigmoid(),), {})
