"""Guard keys leave a size-1 dim's stride out (engine.ops.key_strides), yet PyTorch reads it to decide whether a
4-D/5-D tensor is channels-last (`suggest_memory_format()`), and eager's kernels lay their outputs out by that.
A variant proven on one runs in eager only on calls PyTorch takes alike (engine.cast.guard.proven_formats).

Found on the H100 (docs/results/sd35-layout-2026-12-06d/): sd35_medium's unrouted Decoder hands its first
upsampling bf16[1,512,128,128] at strides (512, 1, 65536, 512), which PyTorch takes for NCHW; the cast's upsample
variant was proven there and returns NCHW. Under the Decoder's channels-last route the same call holds a true
channels-last tensor (batch stride 8,388,608), for which eager returns channels-last: the variant served it and
returned NCHW, and every tensor after it ran NCHW."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch

import engine.cast
from engine.capture.signature import bind_arguments, signature_of, signature_text
from engine.cast import format as cast_format
from engine.cast import runtime
from engine.cast.format import write_cast
from engine.ops import channels_last_by_strides, layout_sensitive

UP2 = torch.ops.aten.upsample_nearest2d.default
UP3 = torch.ops.aten.upsample_nearest3d.default
ENV = {"torch": torch.__version__, "torch_minor": ".".join(torch.__version__.split(".")[:2]), "cuda": "13.0",
       "gpu": "NVIDIA H200", "arch": "sm_90", "compute_capability": [9, 0], "driver": "13.0", "nvrtc": "13.0"}


def _strided(shape, order, size1_stride):
    """A dense tensor of `shape` laid out with dims in `order` (outermost first), each size-1 dim's stride set to
    `size1_stride` (None: as the layout gives it)."""
    stride, step = [0] * len(shape), 1
    for d in reversed(order):
        stride[d] = step
        step *= shape[d]
    if size1_stride is not None:
        stride = [size1_stride if n == 1 else s for n, s in zip(shape, stride)]
    return torch.empty_strided(shape, stride).copy_(torch.randn(shape))


def _eager_says_channels_last(t: torch.Tensor) -> bool:
    """Whether eager's upsampling (laid out by suggest_memory_format) returns channels-last for `t`."""
    out = UP2(t, [2 * t.shape[2], 2 * t.shape[3]], 2.0, 2.0) if t.dim() == 4 else \
        UP3(t, [2 * t.shape[2], 2 * t.shape[3], 2 * t.shape[4]], 2.0, 2.0, 2.0)
    fmt = torch.channels_last if t.dim() == 4 else torch.channels_last_3d
    return out.stride() == torch.empty(out.shape, memory_format=fmt).stride()   # (a C of 1 is contiguous too)


@pytest.mark.parametrize("shape", [(1, 8, 3, 5), (2, 8, 1, 5), (1, 8, 1, 1), (1, 1, 3, 5), (1, 8, 3, 4, 2),
                                   (1, 4, 1, 3, 2)])
def test_channels_last_by_strides_is_what_eager_lays_outputs_out_by(shape):
    seen = set()
    for order in itertools.permutations(range(len(shape))):
        for size1 in (None, 1, shape[1], 7, 10 ** 6):
            t = _strided(shape, order, size1)
            mine = channels_last_by_strides(tuple(t.shape), t.stride())
            assert mine == _eager_says_channels_last(t), (t.stride(), mine)
            seen.add(mine)
    assert seen == {True, False}
    assert layout_sensitive(shape)


def test_shapes_without_a_size_one_dim_or_not_4d_5d_are_not_layout_sensitive():
    assert not layout_sensitive((2, 8, 3, 5)) and not layout_sensitive((1, 8, 3)) and not layout_sensitive((1, 8))


# ---------------------------------------------------------------------------------- a cast, on the CPU key

X = (1, 8, 3, 3)
EAGER_LIKE = (8, 1, 24, 8)     # channels-last strides with eager's batch stride C: NCHW to PyTorch
TRUE_CL = (72, 1, 24, 8)       # the same with the batch stride C·H·W: channels-last to PyTorch
REST = ([6, 6], 2.0, 2.0)


def _x(stride):
    torch.manual_seed(0)
    return torch.empty_strided(X, stride).copy_(torch.randn(X))


def _cast(tmp_path, monkeypatch, proofs):
    """A cast of upsample_nearest2d variants, id -> the input strides each was proven on; each plan is PyTorch's
    kernel on a copy in the memory format PyTorch takes its proof's tensor for (what a kernel that writes NCHW
    rows, or channels-last ones, gives), through the Python router at the CPU key. `c.ran`: (id, strides)."""
    monkeypatch.setenv("KFORGE_CAST_ROUTER", "python")
    monkeypatch.setattr(runtime, "add_entries", functools.partial(runtime.add_entries, dispatch_key="CPU"))
    variants, plans, ran = [], {}, []
    for vid, stride in proofs.items():
        sig = signature_of(UP2, bind_arguments(UP2, (_x(stride), *REST), {}))
        variants.append({"id": vid, "op": "aten::upsample_nearest2d", "signature": sig,
                         "signature_text": signature_text(sig), "outputs": [], "launch_spec": "", "kernels": [],
                         "files": {}, "category": "custom CUDA", "evidence": {}, "provenance": {},
                         "targets": ["eager", "compile"]})
        fmt = torch.channels_last if channels_last_by_strides(X, stride) else torch.contiguous_format

        def plan(bound, vid=vid, fmt=fmt):
            ran.append((vid, tuple(bound[0].stride())))
            with runtime.suspended():
                return UP2(bound[0].contiguous(memory_format=fmt), *bound[1:])

        plans[vid] = plan
    manifest = {"format": cast_format.FORMAT, "format_version": cast_format.FORMAT_VERSION, "env": ENV,
                "variants": variants}
    write_cast(tmp_path / "t.cast", manifest, {}, "# test\n")
    c = engine.cast.load(tmp_path / "t.cast", env=ENV, plans=plans)
    c.ran = ran
    return c


@pytest.fixture
def cast(tmp_path, monkeypatch):
    """A cast of one upsample_nearest2d variant proven on the eager-like layout."""
    c = _cast(tmp_path, monkeypatch, {"up": EAGER_LIKE})
    yield c
    c.remove()
    assert runtime.routes() == {}


def test_in_eager_a_call_pytorch_takes_for_channels_last_misses_a_variant_proven_on_one_it_does_not(cast):
    with cast.enabled(), torch.no_grad():
        hit = UP2(_x(EAGER_LIKE), *REST)
        alike = UP2(_x((5, 1, 24, 8)), *REST)      # another batch stride, NCHW to PyTorch too: served
        other = UP2(_x(TRUE_CL), *REST)            # channels-last to PyTorch: eager's kernel
        st = cast.stats()
    assert cast.ran == [("up", EAGER_LIKE), ("up", (5, 1, 24, 8))]
    assert hit.is_contiguous() and alike.is_contiguous()
    assert other.is_contiguous(memory_format=torch.channels_last) and not other.is_contiguous()  # as eager
    # declined for its format, not a miss: its key is the variant's, and a near-miss listing would show the
    # user a signature the cast has
    assert st["format_declines"] == {"aten::upsample_nearest2d": 1}
    assert st["misses"]["aten::upsample_nearest2d"] == 0 and st["near_misses"]["aten::upsample_nearest2d"] == 0
    torch.testing.assert_close(other, UP2(_x(TRUE_CL), *REST), rtol=0, atol=0)


def test_a_variant_and_its_twin_with_one_key_each_serve_the_calls_pytorch_takes_alike(tmp_path, monkeypatch):
    """A variant proven on a tensor channels-last in name only and its true channels-last twin (engine.capture.
    twins) have one key: both are routed (the second was "already covered" and never ran), each call goes to the
    one proven on its format, and removing the cast takes both out."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "already covered by another installed cast"
        c = _cast(tmp_path, monkeypatch, {"up": EAGER_LIKE, "twin": TRUE_CL})
        try:
            with c.enabled(), torch.no_grad():
                a, b = UP2(_x(EAGER_LIKE), *REST), UP2(_x(TRUE_CL), *REST)
                st = c.stats()
            assert c.ran == [("up", EAGER_LIKE), ("twin", TRUE_CL)]
            assert a.is_contiguous() and b.is_contiguous(memory_format=torch.channels_last)
            assert {v["id"]: v["hits"] for v in st["variants"]} == {"up": 1, "twin": 1}
            assert st["format_declines"] == {} and st["misses"]["aten::upsample_nearest2d"] == 0
        finally:
            c.remove()
    assert runtime.routes() == {}


def test_inside_compiled_code_the_variant_serves_both_layouts(cast):
    """Compiled code holds its own layouts and gets the strides it asserts (engine.cast.runtime: _HELD,
    _as_promised): the distinction is eager's, not Inductor's (a channels-last GroupNorm under torch.compile
    holds its batch stride as C·H·W where eager's had C)."""
    with cast.enabled(), torch.no_grad(), runtime.target_scope("compile"):
        UP2(_x(TRUE_CL), *REST)
    assert cast.ran == [("up", TRUE_CL)]


def test_two_variants_of_one_signature_in_one_cast_the_first_serves_and_the_second_says_why(tmp_path, monkeypatch):
    """Two variants whose proofs differ only where the guard does not look (a size-1 dim's stride, the same
    memory format to PyTorch) are one signature: the first serves, the second stays off with a problem naming
    it (the export's confirmation read it as "the guard did not match the variant's own inputs", and install
    warned of "another installed cast")."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = _cast(tmp_path, monkeypatch, {"up": EAGER_LIKE, "same": (5, 1, 24, 8)})
        try:
            with c.enabled(), torch.no_grad():
                UP2(_x((5, 1, 24, 8)), *REST)
                st = c.stats()
        finally:
            c.remove()
    assert c.ran == [("up", (5, 1, 24, 8))]
    by_id = {v["id"]: v for v in st["variants"]}
    assert by_id["up"]["hits"] == 1 and by_id["up"]["problem"] is None
    assert by_id["same"]["problem"] == "the same signature as variant up of this cast, which serves its calls"
    assert not by_id["same"]["active"]
