"""The guard and the dispatch runtime on CPU tensors: the key of a live call equals the key of its
captured signature and nothing wider; an override installed at the CPU key with a stand-in plan hits
exactly there, misses call the original kernel, and remove() restores eager bit for bit."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from engine.capture.signature import bind_arguments, signature_of
from engine.cast import runtime
from engine.cast.guard import bind, call_key, first_shape, key_function, layout_of, signature_key

GN = torch.ops.aten.native_group_norm.default
ADD = torch.ops.aten.add.Tensor


def _sig(op, *args, **kwargs):
    return signature_of(op, bind_arguments(op, args, kwargs))


def _live(op, *args, **kwargs):
    lay = layout_of(op)
    return call_key(lay, bind(lay, args, kwargs))


def _gn_args(dtype=torch.float16, eps=1e-6):
    x = torch.randn(1, 64, 8, 8, dtype=dtype)
    w = torch.randn(64, dtype=dtype)
    return [x, w, w.clone(), 1, 64, 64, 32, eps]


@pytest.mark.parametrize("case", ["group_norm", "batch_norm", "add_inplace", "cat", "layer_norm", "softmax",
                                  "add_scalar_in_tensor_slot"])
def test_generated_key_function_equals_the_schema_walk_and_the_captured_key(case):
    x = torch.randn(4, 8)
    w = torch.randn(8)
    calls = {
        "group_norm": (GN, _gn_args()),
        "batch_norm": (torch.ops.aten.native_batch_norm.default,
                       [torch.randn(2, 8, 3, 3), w, w.clone(), w.clone(), w.abs(), False, 0.1, 1e-5]),
        "add_inplace": (torch.ops.aten.add_.Tensor, [x.clone(), x]),
        "cat": (torch.ops.aten.cat.default, [[x, x.t().contiguous().t()], 1]),
        "layer_norm": (torch.ops.aten.native_layer_norm.default, [x, [8], w, None, 1e-5]),
        "softmax": (torch.ops.aten._softmax.default, [x, -1, False]),
        "add_scalar_in_tensor_slot": (ADD, [x, 3.0]),
    }
    op, args = calls[case]
    lay = layout_of(op)
    bound = bind(lay, args, {})
    fast = key_function(lay)(tuple(bound))
    assert fast == call_key(lay, bound)
    if case != "add_scalar_in_tensor_slot":  # a Python number there is a miss by construction
        assert fast == signature_key(lay, _sig(op, *args), device_index=-1)
    # Anything different in one argument is a different key.
    other = list(bound)
    other[0] = other[0].to(torch.float64) if case != "cat" else [x.double(), x]
    assert key_function(lay)(tuple(other)) != fast


def test_live_key_equals_captured_key():
    a = _gn_args()
    assert signature_key(layout_of(GN), _sig(GN, *a), device_index=0) == _live(GN, *a)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    # Defaults left out by the caller (alpha) are filled in on both sides.
    assert signature_key(layout_of(ADD), _sig(ADD, x, y), 0) == _live(ADD, x, y) == _live(ADD, x, y, alpha=1)
    ln = torch.ops.aten.native_layer_norm.default
    w = torch.randn(8)
    assert signature_key(layout_of(ln), _sig(ln, x, [8], w, w, 1e-5), 0) == _live(ln, x, [8], w, w, 1e-5)


@pytest.mark.parametrize("what", ["shape", "dtype", "stride", "alignment", "value", "neg", "absent"])
def test_anything_different_is_a_miss(what):
    a = _gn_args()
    key = signature_key(layout_of(GN), _sig(GN, *a), 0)
    b = list(a)
    if what == "shape":
        b[0] = torch.randn(1, 64, 8, 16, dtype=torch.float16)
        b[5] = 128
    elif what == "dtype":
        b = _gn_args(torch.bfloat16)
    elif what == "stride":
        b[0] = a[0].contiguous(memory_format=torch.channels_last)
    elif what == "alignment":
        b[0] = torch.randn(1 + 64 * 64, dtype=torch.float16)[1:].view(1, 64, 8, 8)
    elif what == "value":
        b[7] = 1e-5
    elif what == "neg":
        b[1] = torch._neg_view(-a[1])
    elif what == "absent":
        b[2] = None
    assert _live(GN, *b) != key


def test_a_size_one_dims_stride_is_not_compared():
    """Eager gives a [1, C, H, W] channels-last tensor stride C at the batch dim, Inductor C·H·W (SD3.5-Medium
    under compile, H200 2026-12-03f: a GroupNorm -> SiLU pattern missed every call so). No element is addressed
    through that stride (kernels get data pointers), so the key leaves it out; every other stride counts."""
    a = _gn_args()
    cl = a[0].contiguous(memory_format=torch.channels_last)
    eager_like = torch.empty_strided(cl.shape, (64, 1, 512, 64), dtype=cl.dtype).copy_(cl)
    assert cl.stride() == (4096, 1, 512, 64) and eager_like.stride() == (64, 1, 512, 64)
    key = signature_key(layout_of(GN), _sig(GN, eager_like, *a[1:]), 0)
    assert _live(GN, cl, *a[1:]) == key == key_function(layout_of(GN))([cl, *a[1:]])
    assert _live(GN, a[0], *a[1:]) != key                                  # contiguous: another layout
    b = torch.randn(2, 64, 8, 8, dtype=a[0].dtype).contiguous(memory_format=torch.channels_last)
    odd = torch.empty_strided(b.shape, (64, 1, 512, 64), dtype=b.dtype)    # overlapping batches: not alike
    assert _live(GN, odd, a[1], a[2], 2, 64, 64, 32, 1e-6) != _live(GN, b, a[1], a[2], 2, 64, 64, 32, 1e-6)


def test_key_strides_are_memoised_within_a_bound():
    """A batch of one puts a size-1 dim in most live calls of an LLM: their canonical strides are memoised
    (the guard runs on every call), and the memo stays bounded whatever shapes a model brings."""
    from engine import ops
    from engine.cast import guard

    t = torch.empty(1, 7, 16)
    assert guard.key_strides(t.shape, t.stride()) == (0, 16, 1) == guard.key_strides((1, 7, 16), (5, 16, 1))
    assert guard.key_strides((2, 7), (7, 1)) == (7, 1)
    for n in range(ops._KEY_STRIDES_KEPT + 10):
        guard.key_strides((1, n + 2), (n + 2, 1))
    assert 0 < len(ops._KEY_STRIDES) <= ops._KEY_STRIDES_KEPT


def test_in_place_ops_key_includes_aliasing():
    op = torch.ops.aten.add_.Tensor
    x = torch.randn(16)
    y = torch.randn(16)
    key = signature_key(layout_of(op), _sig(op, x, y), 0)
    assert _live(op, x, y) == key
    assert _live(op, x, x) != key  # self and other share storage: a different kernel contract


@pytest.fixture
def owner():
    me = object()
    yield me
    runtime.remove_owner(me)
    assert runtime.routes() == {}


def _install(owner, op, sig, fn, vid="v0"):
    lay = layout_of(op)
    plan = runtime.Plan(vid, fn)
    runtime.add_entries(owner, [(lay.op_name, signature_key(lay, sig, 0), plan, first_shape(sig))], "CPU")
    return plan


def test_hit_runs_the_plan_miss_runs_the_original(owner):
    a = _gn_args(torch.float32)
    eager = GN(*a)
    sevens = tuple(torch.full_like(t, 7.0) for t in eager)
    other = torch.randn(1, 64, 8, 16)
    expected_other = F.group_norm(other, 32, a[1], a[2], 1e-6)
    plan = _install(owner, GN, _sig(GN, *a), lambda b: sevens)
    out = F.group_norm(a[0], 32, a[1], a[2], 1e-6)  # the public API reaches the same overload
    assert torch.all(out == 7.0) and plan.hits == 1
    got = F.group_norm(other, 32, a[1], a[2], 1e-6)
    assert plan.hits == 1 and torch.equal(got, expected_other)
    route = runtime.routes()[("aten::native_group_norm", "CPU")]
    assert route.misses == 1 and route.near_misses == 0   # stopped at the shape pre-filter
    F.group_norm(a[0], 32, a[1], a[2], 1e-5)                # same shape, other eps: a near miss
    assert route.near_misses == 1 and plan.hits == 1
    runtime.remove_owner(owner)
    after = GN(*a)
    assert all(torch.equal(p, q) for p, q in zip(after, eager))


def test_miss_rewraps_python_scalars_like_wrapped_numbers(owner):
    x = torch.randn(4, 8)
    _install(owner, ADD, _sig(ADD, x, x), lambda b: b[0])
    cases = [torch.randn(3, dtype=torch.float16), torch.arange(3, dtype=torch.int32), torch.tensor([True, False])]
    runtime.remove_owner(owner)
    expected = [(t + 2.5, t + 3, t * 1) for t in cases]
    _install(owner, ADD, _sig(ADD, x, x), lambda b: b[0])
    for t, (e_f, e_i, _) in zip(cases, expected):
        got_f, got_i = t + 2.5, t + 3
        assert got_f.dtype == e_f.dtype and torch.equal(got_f, e_f)
        assert got_i.dtype == e_i.dtype and torch.equal(got_i, e_i)


def test_install_and_remove_are_idempotent_and_shared(owner):
    a = _gn_args(torch.float32)
    sig = _sig(GN, *a)
    zeros = tuple(torch.zeros_like(t) for t in GN(*a))
    p1 = _install(owner, GN, sig, lambda b: zeros, "first")
    other = object()
    lay = layout_of(GN)
    p2 = runtime.Plan("second", lambda b: None)
    shadowed = runtime.add_entries(other, [(lay.op_name, signature_key(lay, sig, 0), p2, first_shape(sig))], "CPU")
    assert shadowed == ["second"]          # the first cast keeps the key
    runtime.remove_owner(other)
    runtime.remove_owner(other)
    GN(*a)
    assert p1.hits == 1 and p2.hits == 0
    runtime.remove_owner(owner)
    runtime.remove_owner(owner)
    assert runtime.routes() == {}


def test_suspended_falls_through(owner):
    a = _gn_args(torch.float32)
    plan = _install(owner, GN, _sig(GN, *a), lambda b: None)
    with runtime.suspended():
        out = GN(*a)
    assert plan.hits == 0 and isinstance(out, tuple)
    route = runtime.routes()[("aten::native_group_norm", "CPU")]
    assert route.fallthrough == 1


def test_concurrent_calls_and_installs(owner):
    a = _gn_args(torch.float32)
    sig = _sig(GN, *a)
    ones = tuple(torch.ones_like(t) for t in GN(*a))
    plan = _install(owner, GN, sig, lambda b: ones)
    errors = []

    def caller():
        try:
            for _ in range(200):
                out = GN(*a)
                assert torch.all(out[0] == 1)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def churn():
        try:
            for _ in range(50):
                o = object()
                lay = layout_of(ADD)
                x = torch.randn(3)
                s = _sig(ADD, x, x)
                runtime.add_entries(o, [(lay.op_name, signature_key(lay, s, 0), runtime.Plan("t", lambda b: b[0]),
                                         first_shape(s))], "CPU")
                runtime.remove_owner(o)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=caller) for _ in range(3)] + [threading.Thread(target=churn)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and plan.hits == 600
    assert ("aten::add.Tensor", "CPU") not in runtime.routes()


def test_torch_compile_over_an_installed_route_traces_and_runs(owner):
    # Dynamo traces with fake tensors (no backend kernel runs, so no plan runs while it traces); the compiled
    # code then calls the real op, where the guard decides as in eager.
    a = _gn_args(torch.float32)
    sevens = tuple(torch.full_like(t, 7.0) for t in GN(*a))
    plan = _install(owner, GN, _sig(GN, *a), lambda b: sevens)
    torch._dynamo.reset()

    @torch.compile(backend="eager", fullgraph=True)
    def f(x, w, b):
        return F.group_norm(x, 32, w, b, 1e-6) + 1

    out = f(a[0], a[1], a[2])
    assert torch.all(out == 8.0) and plan.hits >= 1   # the compiled code's call went through the route
    other = torch.randn(1, 64, 8, 16)                  # another signature: PyTorch's kernel, eager's result
    torch.testing.assert_close(f(other, a[1], a[2]), F.group_norm(other, 32, a[1], a[2], 1e-6) + 1)


def test_a_variant_that_fails_on_a_call_falls_back_to_pytorch_for_good(owner):
    from engine.cast.loader import CastWarning

    a = _gn_args(torch.float32)
    eager = GN(*a)

    def broken(b):
        raise RuntimeError("kforge cast: cuLaunchKernel failed (CUresult 1)")

    plan = _install(owner, GN, _sig(GN, *a), broken)
    with pytest.warns(CastWarning, match="failed on a call and stays on PyTorch"):
        out = GN(*a)
    assert all(torch.equal(x, y) for x, y in zip(out, eager)) and plan.hits == 0
    again = GN(*a)  # no second warning, no second attempt: the key is gone from the guard table
    assert all(torch.equal(x, y) for x, y in zip(again, eager))
    assert runtime.routes()[("aten::native_group_norm", "CPU")].table == {}


def test_an_override_torch_refuses_leaves_that_variants_calls_to_pytorch(monkeypatch):
    """torch 2.11 refuses a Python override over a kernel registered from Python (a model's own torch.library
    op): the variant is reported refused, its calls stay PyTorch's, the cast's other variants install; with
    no `refused` to fill, the error is raised as before."""
    real = runtime.Route

    class Refusing(real):
        def __init__(self, op_name, dispatch_key):
            if op_name == "aten::logsumexp":
                raise RuntimeError("This is not allowed since there's already a kernel registered from python")
            super().__init__(op_name, dispatch_key)

    monkeypatch.setattr(runtime, "Route", Refusing)
    owner = object()
    entries = [("aten::logsumexp", ("k",), runtime.Plan("lse", lambda b: None), None),
               ("aten::hardtanh", ("k",), runtime.Plan("ht", lambda b: None), None)]
    refused: dict[str, str] = {}
    try:
        assert runtime.add_entries(owner, entries, "CPU", refused=refused) == []
        assert list(refused) == ["lse"] and "torch refused the override of aten::logsumexp" in refused["lse"]
        assert ("aten::logsumexp", "CPU") not in runtime.routes() and ("aten::hardtanh", "CPU") in runtime.routes()
        with pytest.raises(RuntimeError, match="already a kernel registered from python"):
            runtime.add_entries(object(), entries[:1], "CPU")
    finally:
        runtime.remove_owner(owner)


@pytest.mark.parametrize("proven, call", [(3, 3.0), (1, True), (0.0, -0.0)])
def test_a_python_number_of_another_type_or_sign_is_another_signature(owner, proven, call):
    """`x + 3` and `x + 3.0` promote differently (an int32 tensor stays int32 with the first, becomes float32
    with the second), `b + True` and `b + 1` too (bool, int64), and `x * 0.0` and `x * -0.0` differ in the
    sign of zeros; a number's key held its value alone (3 == 3.0 == hash), so a variant proven for one ran
    for the other and returned the proven dtype."""
    x = {3: torch.arange(8, dtype=torch.int32), 1: torch.tensor([True, False]), 0.0: torch.ones(4)}[proven]
    op = ADD if proven != 0.0 else torch.ops.aten.mul.Tensor
    want, sevens = op(x, call), torch.full_like(op(x, proven), 7)
    plan = _install(owner, op, _sig(op, x, proven), lambda b: sevens)
    assert torch.all(op(x, proven) == 7) and plan.hits == 1            # the proven call
    got = op(x, call)
    assert plan.hits == 1 and got.dtype == want.dtype and torch.equal(got, want)
    assert torch.equal(torch.signbit(got), torch.signbit(want))
