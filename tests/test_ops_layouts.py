"""engine.ops: an op's outputs as its meta kernel lays them out, and results copied into given strides (what a
held input's call must return under torch.compile, docs/compile.md)."""

import collections

import torch

from engine.ops import meta_output_strides, restrided, same_strides


def test_meta_output_strides_are_the_fake_tensors_and_nothing_runs():
    op = torch.ops.aten.native_group_norm.default
    x = torch.randn(1, 8, 4, 4).contiguous(memory_format=torch.channels_last)
    bound = [("input", x), ("weight", None), ("bias", None), ("N", 1), ("C", 8), ("HxW", 16), ("group", 4),
             ("eps", 1e-5)]
    strides = meta_output_strides(op, bound)
    assert len(strides) == 3 and strides[1] == strides[2] == (4, 1)
    # the first output: whatever this torch's meta kernel says, as a fake tensor of the input's device shows it
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = op(mode.from_tensor(x), None, None, 1, 8, 16, 4, 1e-5)
    assert strides[0] == tuple(fake[0].stride())


def test_restrided_copies_only_the_tensors_whose_strides_differ_and_keeps_the_container():
    x = torch.randn(2, 3, 4, 5)
    cl = tuple(x.contiguous(memory_format=torch.channels_last).stride())
    out = restrided((x, [x, x]), [None, cl, None])
    assert out[0] is x and out[1][1] is x and out[1][0] is not x
    assert out[1][0].stride() == cl and torch.equal(out[1][0], x)
    assert restrided(x, [tuple(x.stride())]) is x and restrided(x, []) is x
    r = torch.max(x, 1)
    assert type(restrided(r, [(20, 1, 4), None])) is type(r)
    pair = collections.namedtuple("pair", "a b")
    got = restrided(pair(x, x), [cl])
    assert type(got) is pair and got.a.stride() == cl and got.b is x


def test_strides_compare_as_compiled_codes_assertions_do_a_size_one_dims_aside():
    """torch 2.11's meta GroupNorm gives (C, 1, W·C, C) for a [1, C, H, W] channels-last input that Inductor
    holds as (C·H·W, 1, W·C, C): the same layout, and compiled code's assert_size_stride accepts either."""
    from torch._C._dynamo.guards import assert_size_stride

    shape = (1, 128, 4, 4)
    held, meta = (2048, 1, 512, 128), (128, 1, 512, 128)
    assert same_strides(shape, held, meta)
    assert_size_stride(torch.empty_strided(shape, meta), shape, held)  # what the comparison stands for
    assert not same_strides(shape, held, (2048, 16, 4, 1))               # channels-last vs contiguous
    assert not same_strides((2, 128, 4, 4), (2048, 1, 512, 128), (128, 1, 512, 128))  # the batch dim counts
    assert same_strides((0, 3), (3, 1), (1, 5))                           # an empty tensor: any layout
    assert not same_strides(shape, held, (1, 512, 128))                  # another rank
    t = torch.empty_strided(shape, meta)
    assert restrided(t, [held]) is t                                       # nothing to copy
