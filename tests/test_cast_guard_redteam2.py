"""The second guard red team: calls where a cast raised, or served something eager would not compute.

On the CPU, with the stand-ins the other cast tests use: op routes installed at the CPU key with Python plans
(tests/test_cast_guard.py), graph routes with the stand-in backend of tests/test_cast_graph_routes.py."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from test_cast_graph_routes import _routed

from engine.capture.signature import bind_arguments, signature_of
from engine.cast import runtime
from engine.cast.guard import bind, call_key, first_shape, key_function, layout_of, signature_key

# ------------------------------------------------------------------------------------------ graph routes


def test_a_graph_route_called_with_an_expanded_argument_runs_eagerly_instead_of_raising():
    """A static copy of an expanded argument (stride 0) cannot be written: `copy_` refuses a destination whose
    elements share memory, and the route's first call of that signature raised where eager runs."""
    model, gs, backend = _routed()
    x = torch.randn(1, 8).expand(4, 8)
    with torch.no_grad():
        want = model(x)
        with gs:
            got = [model(x) for _ in range(3)]
    assert all(torch.equal(g[0], want[0]) and torch.equal(g[1]["gate"], want[1]["gate"]) for g in got)
    st = next(iter(gs.stats().values()))
    assert backend.captures == 0 and list(st["refused"].values()) == [
        "an argument whose elements share memory (an expanded view)"]
    assert st["declines"] == {"signature refused": 2}


# ------------------------------------------------------------------------------------------- op routes


def _sig(op, *args, **kwargs):
    return signature_of(op, bind_arguments(op, args, kwargs))


def _route(owner, op, args, fn, kwargs=None, vid="v0"):
    lay = layout_of(op)
    sig = _sig(op, *args, **(kwargs or {}))
    plan = runtime.Plan(vid, fn)
    runtime.add_entries(owner, [(lay.op_name, signature_key(lay, sig, 0), plan, first_shape(sig))], "CPU")
    return plan


@pytest.fixture
def owner():
    me = object()
    yield me
    runtime.remove_owner(me)
    assert runtime.routes() == {}


def test_another_override_below_ours_removed_while_ours_is_installed_leaves_misses_working(owner):
    """A route calls the kernel registered before it on a miss. Where that was another library's override
    (torch.library), removed while the cast is installed, torch invalidates it: every miss raised
    'SafeKernelFunction has been invalidated' where eager runs PyTorch's kernel. The route now takes the kernel
    below it again and carries on; removing the cast leaves PyTorch's kernel."""
    op = torch.ops.aten.softplus.default
    x, other = torch.randn(2, 8), torch.randn(3, 8)
    want_x, want_other = F.softplus(x), F.softplus(other)
    below = torch.library.get_kernel(op, "CPU")
    seen = []

    def theirs(keyset, *args):
        seen.append(1)
        return below.call_boxed(keyset, *args)

    lib = torch.library.Library("aten", "IMPL", "CPU")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lib.impl("softplus", theirs, "CPU", with_keyset=True)
        plan = _route(owner, op, (x, 1, 20), lambda b: torch.full_like(b[0], 7.0))
        assert torch.equal(F.softplus(other), want_other) and seen == [1]   # a miss: theirs, then PyTorch's
    finally:
        lib._destroy()
    assert torch.equal(F.softplus(other), want_other) and seen == [1]    # a miss: PyTorch's (raised before)
    assert torch.all(F.softplus(x) == 7.0) and plan.hits == 1           # hits still served
    runtime.remove_owner(owner)
    assert torch.equal(F.softplus(x), want_x) and torch.equal(F.softplus(other), want_other)


def test_a_float_argument_zero_is_keyed_with_its_sign(owner):
    """`float` and `float?` schema slots were keyed as they arrive, and 0.0 == -0.0: a variant proven for
    `nan_to_num(x, nan=0.0)` served `nan=-0.0`, whose NaNs eager turns into negative zeros (the C++ router
    compared the sign already)."""
    op = torch.ops.aten.nan_to_num.default
    x = torch.tensor([float("nan"), 1.0, -2.0, float("inf")])
    lay = layout_of(op)
    proven = signature_key(lay, _sig(op, x, 0.0, None, None), 0)
    for args in ((x, 0.0, None, None), (x, -0.0, None, None), (x, 1.5, None, None), (x, None, None, None)):
        assert key_function(lay)(args) == call_key(lay, list(args))
    assert key_function(lay)((x, 0.0, None, None)) == proven != key_function(lay)((x, -0.0, None, None))
    plan = _route(owner, op, (x, 0.0, None, None), lambda b: torch.full_like(b[0], 7.0))
    assert torch.all(torch.nan_to_num(x, nan=0.0) == 7.0) and plan.hits == 1
    runtime.remove_owner(owner)
    want = torch.nan_to_num(x, nan=-0.0)
    plan = _route(owner, op, (x, 0.0, None, None), lambda b: torch.full_like(b[0], 7.0))
    got = torch.nan_to_num(x, nan=-0.0)
    assert plan.hits == 0 and torch.equal(got, want) and torch.signbit(got[0]) and torch.equal(
        torch.signbit(got), torch.signbit(want))


def test_a_device_argument_is_keyed_with_its_index():
    """A device value was keyed by its type alone: `x.to("cuda:1", torch.float16)` of a tensor on cuda:0 matched a
    `_to_copy` variant proven for `device=cuda` (captures record the type) and would have returned its output on
    cuda:0. A device without an index is the current one; a captured one is the variant's device."""
    op = torch.ops.aten._to_copy.default
    x = torch.randn(4)
    lay = layout_of(op)
    sig = _sig(op, x, dtype=torch.float16, device=torch.device("cuda", 0))
    assert sig["args"][3]["value"] == {"device": "cuda"}                # what a capture records
    on0, on1 = signature_key(lay, sig, 0), signature_key(lay, sig, 1)
    assert on0 != on1

    def live(dev):
        return call_key(lay, bind(lay, (x,), {"dtype": torch.float16, "device": dev}))

    assert live(torch.device("cuda", 0)) == on0 and live(torch.device("cuda", 1)) == on1
    assert live(torch.device("cuda", 1)) != on0 and live(torch.device("cpu")) != on0
    # no index: the current device (0 here, where there is no GPU)
    assert live(torch.device("cuda")) == on0


# ------------------------------------------------------------------------------------------ module cards


class _Twice(torch.nn.Module):
    def forward(self, w):
        return w * 2


def test_a_parametrization_registered_on_a_routed_module_declines_and_remove_restores_the_class(tmp_path):
    """torch.nn.utils.parametrize gives the module a generated subclass (ParametrizedRMS) and moves its weight.
    The route declines (parameters changed); `cast.remove()` raised AttributeError (it released the module's class
    now, which it never patched, and `del`-ed a forward that class does not have) and left the dispatcher on the
    class it did patch."""
    from test_cast_modules import ENV, Counting, Model, X, _write

    import engine.cast

    torch.manual_seed(1)
    model = Model().to(torch.bfloat16)
    rms = type(model.layers[0].norm1)
    own = rms.__dict__.get("forward")
    plan = Counting()
    c = engine.cast.load(_write(tmp_path), env=ENV, plans={"rms": plan})
    x = torch.randn(*X, dtype=torch.bfloat16)
    c.install(model)
    try:
        torch.nn.utils.parametrize.register_parametrization(model.layers[0].norm1, "weight", _Twice())
        assert type(model.layers[0].norm1) is not rms
        with torch.no_grad():
            got = model(x)
    finally:
        c.remove()
    assert rms.__dict__.get("forward") is own                       # the class's own forward back
    with torch.no_grad():
        assert torch.equal(got, model(x))
    assert plan.calls == 2 and c.stats()["modules"]["layers.0.norm1"]["declines"] == {"parameters changed": 1}
