"""The C++ router, built with torch.utils.cpp_extension and exercised at the CPU dispatch key (no GPU here):
exact-signature hits run the plan (here: outputs allocated, no kernel), misses run PyTorch's own kernel
with the right result, and uninstall restores eager. The CUDA launch path is exercised on a GPU only."""

import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn.functional as F

from engine.capture.signature import bind_arguments, signature_of
from engine.cast import cpp_router
from engine.cast.guard import layout_of

# One xdist worker builds the router (about a minute on a CI core) and runs the module; split over two, both
# workers built or waited for it.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cpp_router")]


@pytest.fixture(scope="module")
def ext():
    mp = pytest.MonkeyPatch()
    mp.setenv("KFORGE_CAST_ROUTER", "cpp")  # the router itself, whatever its self-test says on this machine
    try:
        e = cpp_router.extension()
    finally:
        mp.undo()
    if e is None:
        pytest.fail(f"the C++ router did not build here: {cpp_router.why_not()}")
    return e


def _counts(ext, op_name):
    st = cpp_router.stats(ext, op_name, "CPU")
    return {"hits": st["hits"], "misses": st["misses"]}


def _plan(ext, op, args, outputs_like):
    lay = layout_of(op)
    sig = signature_of(op, bind_arguments(op, args, {}))
    assert cpp_router.supported(lay, sig)
    outs = [{"alias": -1, "dtype": torch.empty(0, dtype=o.dtype), "sizes": list(o.shape), "strides": list(o.stride())}
            for o in outputs_like]
    return cpp_router.make_plan(ext, "cpu", cpp_router.arg_descriptors(lay, sig, -1), outs, [], [], lay.writes)


def test_hits_run_the_plan_and_misses_run_pytorch(ext):
    op = torch.ops.aten.native_batch_norm.default
    x = torch.randn(2, 8, 3, 3)
    w, b, rm, rv = torch.randn(8), torch.randn(8), torch.randn(8), torch.rand(8) + 0.5
    args = (x, w, b, rm, rv, False, 0.1, 1e-5)
    eager = op(*args)
    plan = _plan(ext, op, args, [eager[0], eager[1], eager[2]])
    cpp_router.install(ext, "aten::native_batch_norm", "CPU", [plan])
    try:
        hit = op(*args)  # the same signature: the plan runs (no kernel on the CPU: fresh outputs)
        assert [t.shape for t in hit] == [t.shape for t in eager]
        other = torch.randn(2, 8, 5, 5)  # another shape: PyTorch's kernel, exact result
        miss = op(other, w, b, rm, rv, False, 0.1, 1e-5)
        torch.testing.assert_close(miss[0], torch.nn.functional.batch_norm(other, rm, rv, w, b, False, 0.1, 1e-5),
                                   rtol=0, atol=0)
        op(x, w, b, rm, rv, False, 0.1, 1e-3)  # another eps: a miss
        op(x.double(), w.double(), b.double(), rm.double(), rv.double(), False, 0.1, 1e-5)  # dtype: a miss
        st = cpp_router.stats(ext, "aten::native_batch_norm", "CPU")
        assert st["hits"] == [1] and st["misses"] == 4  # F.batch_norm above is a miss too
        # The eps and dtype misses had the variant's input sizes: near misses, described for the user.
        assert st["near_misses"] == 2 and len(st["near_keys"]) == 2
        assert st["near_keys"][0].startswith("Float[2, 8, 3, 3](s=[72, 9, 3, 1], align 16, cpu)")
        assert "0.001" in st["near_keys"][0] and st["near_keys"][1].startswith("Double[2, 8, 3, 3]")
        cpp_router.reset(ext, "aten::native_batch_norm", "CPU")
        st = cpp_router.stats(ext, "aten::native_batch_norm", "CPU")
        assert st["near_misses"] == 0 and st["near_keys"] == []
    finally:
        cpp_router.uninstall(ext, "aten::native_batch_norm", "CPU")
    again = op(*args)
    assert all(torch.equal(a, e) for a, e in zip(again, eager))  # eager is back
    assert cpp_router.stats(ext, "aten::native_batch_norm", "CPU") == {}


def test_a_call_whose_strides_differ_only_at_a_size_one_dim_hits_where_eager_takes_it_alike(ext):
    """router.cpp's guard leaves a size-1 dim's stride out, as engine.cast.guard does (kernels get data pointers
    only; eager, Inductor and meta kernels disagree on it), except where that stride decides whether PyTorch
    takes the tensor for channels-last: eager lays its outputs out by it. A [1, C, H, W] tensor at eager's
    (C, 1, W·C, C) is not channels-last to PyTorch, at (C·H·W, 1, W·C, C) it is: in eager the second is declined
    by a variant proven on the first (an upsampling under sd35_medium's layout route returned NCHW where eager
    returns channels-last, H100 2026-12-06d), counted as a format decline, not a miss or near miss (its key is
    the variant's); compiled code, which holds its own layouts, still hits."""
    op = torch.ops.aten.upsample_nearest2d.default
    x = torch.randn(1, 8, 3, 3).contiguous(memory_format=torch.channels_last)
    eager_like = torch.empty_strided(x.shape, (8, 1, 24, 8)).copy_(x)
    rest = ([6, 6], 2.0, 2.0)
    assert op(eager_like, *rest).is_contiguous() and not op(x, *rest).is_contiguous()  # eager, unrouted
    plan = _plan(ext, op, (eager_like, *rest), [op(eager_like, *rest)])
    cpp_router.install(ext, "aten::upsample_nearest2d", "CPU", [plan])
    try:
        assert x.stride() == (72, 1, 24, 8)
        op(torch.empty_strided(x.shape, (5, 1, 24, 8)).copy_(x), *rest)  # another batch stride, alike: a hit
        assert _counts(ext, "aten::upsample_nearest2d") == {"hits": [1], "misses": 0}
        out = op(x, *rest)                                     # channels-last to PyTorch: declined in eager
        assert _counts(ext, "aten::upsample_nearest2d") == {"hits": [1], "misses": 0}
        st = cpp_router.stats(ext, "aten::upsample_nearest2d", "CPU")
        assert st["format_declines"] == 1 and st["near_misses"] == 0
        assert not out.is_contiguous()                      # eager's layout for it
        cpp_router.set_target("compile")
        try:
            op(x, *rest)                                       # inside compiled code: a hit
        finally:
            cpp_router.set_target(None)
        op(x.contiguous(), *rest)                              # contiguous: another layout, a miss
        assert _counts(ext, "aten::upsample_nearest2d") == {"hits": [2], "misses": 1}
        assert cpp_router.stats(ext, "aten::upsample_nearest2d", "CPU")["format_declines"] == 1
    finally:
        cpp_router.uninstall(ext, "aten::upsample_nearest2d", "CPU")


def test_two_plans_for_one_key_proven_on_either_format_each_serve_the_calls_eager_takes_alike(ext):
    """A variant proven on a tensor channels-last in name only and its true channels-last twin (engine.capture.
    twins) have the same key; in eager each call goes to the one proven on its format (the twin was never hit
    when the first plan declined for both)."""
    op = torch.ops.aten.upsample_nearest2d.default
    x = torch.randn(1, 8, 3, 3).contiguous(memory_format=torch.channels_last)
    eager_like = torch.empty_strided(x.shape, (8, 1, 24, 8)).copy_(x)
    rest = ([6, 6], 2.0, 2.0)
    plans = [_plan(ext, op, (eager_like, *rest), [op(eager_like, *rest)]), _plan(ext, op, (x, *rest), [op(x, *rest)])]
    cpp_router.install(ext, "aten::upsample_nearest2d", "CPU", plans)
    try:
        a, b = op(eager_like, *rest), op(x, *rest)
        st = cpp_router.stats(ext, "aten::upsample_nearest2d", "CPU")
        assert st["hits"] == [1, 1] and st["misses"] == 0 and st["format_declines"] == 0
        assert a.is_contiguous() and b.is_contiguous(memory_format=torch.channels_last)  # each its proof's layout
    finally:
        cpp_router.uninstall(ext, "aten::upsample_nearest2d", "CPU")


def test_a_second_install_of_the_same_op_is_refused(ext):
    op = torch.ops.aten.relu.default
    x = torch.randn(16)
    plan = _plan(ext, op, (x,), [x])
    cpp_router.install(ext, "aten::relu", "CPU", [plan])
    try:
        with pytest.raises(RuntimeError, match="routed already"):
            cpp_router.install(ext, "aten::relu", "CPU", [plan])
        y = torch.randn(17)
        assert torch.equal(op(y), y.clamp_min(0))  # miss
    finally:
        cpp_router.uninstall(ext, "aten::relu", "CPU")


def test_a_plan_runs_only_under_the_targets_it_was_proven_for(ext):
    # Exported with --target: the mask of the variant's targets; inside compiled code of a cast backend
    # (runtime.target_scope) the call's target is the compile mode, elsewhere eager (CPU: never captured).
    from engine.cast import runtime

    op = torch.ops.aten.relu.default
    x, y = torch.randn(16), torch.randn(18)
    eager_only, compile_only = _plan(ext, op, (x,), [x]), _plan(ext, op, (y,), [y])
    cpp_router.set_plan_targets(ext, eager_only, ["eager", "cuda-graphs"])
    cpp_router.set_plan_targets(ext, compile_only, ["compile"])
    cpp_router.install(ext, "aten::relu", "CPU", [eager_only, compile_only])
    try:
        op(x)
        assert torch.equal(op(y), y.clamp_min(0))  # compile-only in eager: PyTorch's kernel, exact
        with runtime.target_scope("compile"):
            assert torch.equal(op(x), x.clamp_min(0))  # eager-only under compile: PyTorch's kernel
            op(y)
            with runtime.target_scope("compile:reduce-overhead"):  # a mode neither was proven for
                assert torch.equal(op(y), y.clamp_min(0))
        op(x)  # the scope is over: eager again
        st = cpp_router.stats(ext, "aten::relu", "CPU")
        assert st["hits"] == [2, 1] and st["target_declines"] == 3 and st["misses"] == 0
    finally:
        cpp_router.uninstall(ext, "aten::relu", "CPU")


def test_a_plan_that_may_reorder_is_declined_while_deterministic_algorithms_are_on(ext):
    # As the Python router: a reduction's, a norm's, a matmul's kernels may round otherwise from run to run.
    op = torch.ops.aten.relu.default
    x, y = torch.randn(16), torch.randn(18)
    reorders, exact = _plan(ext, op, (x,), [x]), _plan(ext, op, (y,), [y])
    cpp_router.set_plan_reorders(ext, reorders, True)
    cpp_router.install(ext, "aten::relu", "CPU", [reorders, exact])
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert torch.equal(op(x), x.clamp_min(0))   # PyTorch's kernel, exact
        op(y)
        torch.use_deterministic_algorithms(False)
        op(x)
        st = cpp_router.stats(ext, "aten::relu", "CPU")
        assert st["hits"] == [1, 1] and st["determinism_declines"] == 1 and st["misses"] == 0
    finally:
        torch.use_deterministic_algorithms(was)
        cpp_router.uninstall(ext, "aten::relu", "CPU")


def test_an_op_with_many_variants_sends_each_call_to_its_own_or_to_pytorch(ext):
    # As Qwen3.5's aten::mul.Tensor with 25 variants: a call is compared in full only with the variants
    # whose first tensor has its sizes and dtype; the right one hits, everything else runs PyTorch's kernel.
    op = torch.ops.aten.add.Tensor
    shapes = [(5 + i,) for i in range(24)] + [(2, 14)]  # sizes 5..28, then 28 elements as [2, 14]
    plans = [_plan(ext, op, (torch.randn(*s), torch.randn(*s)), [torch.randn(*s)]) for s in shapes]
    cpp_router.install(ext, "aten::add.Tensor", "CPU", plans)
    try:
        x = torch.randn(28)
        # Hits run the plan (on the CPU key: a fresh output of the variant's shape, no kernel).
        assert op(torch.randn(20), torch.randn(20)).shape == (20,)  # variant 15
        assert op(x, x).shape == (28,)  # variant 23
        assert op(x.view(2, 14), x.view(2, 14)).shape == (2, 14)  # variant 24: same numel, other sizes
        d = torch.randn(20, dtype=torch.float64)
        assert torch.equal(op(d, d), d * 2)  # variant 15's sizes in another dtype: PyTorch's result, a near miss
        z = torch.randn(3)
        assert torch.equal(op(z, z), z * 2)  # no variant has these sizes: a plain miss
        st = cpp_router.stats(ext, "aten::add.Tensor", "CPU")
        assert [i for i, h in enumerate(st["hits"]) if h] == [15, 23, 24] and sum(st["hits"]) == 3
        assert st["misses"] == 2 and st["near_misses"] == 1 and st["near_keys"][0].startswith("Double[20]")
    finally:
        cpp_router.uninstall(ext, "aten::add.Tensor", "CPU")


def test_reset_zeroes_the_counters(ext):
    op = torch.ops.aten.relu.default
    x = torch.randn(8)
    cpp_router.install(ext, "aten::relu", "CPU", [_plan(ext, op, (x,), [x])])
    try:
        op(x)
        op(torch.randn(9))
        assert _counts(ext, "aten::relu") == {"hits": [1], "misses": 1}
        cpp_router.reset(ext, "aten::relu", "CPU")
        assert _counts(ext, "aten::relu") == {"hits": [0], "misses": 0}
    finally:
        cpp_router.uninstall(ext, "aten::relu", "CPU")


def _override(op, seen, name):
    """Another library's override of `op` at the CPU key (torch.library), over the kernel dispatched now: it
    notes each call in `seen` and passes it on."""
    below = torch.library.get_kernel(op, "CPU")

    def theirs(keyset, *args):
        seen.append(name)
        return below.call_boxed(keyset, *args)

    lib = torch.library.Library("aten", "IMPL", "CPU")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about registering over a kernel
        lib.impl(op._schema.name.split("::")[1], theirs, "CPU", with_keyset=True)
    return lib


def test_another_override_below_ours_removed_while_ours_is_installed_leaves_misses_working(ext):
    """A miss calls the kernel registered before the route. Where that was another library's override
    (torch.library), removed while the route is installed, torch invalidates it: every miss raised
    'SafeKernelFunction has been invalidated' where eager runs PyTorch's kernel, as the Python router's did
    (test_cast_guard_redteam2). The route now takes the kernel below it again and carries on; uninstalling it
    leaves PyTorch's kernel."""
    op = torch.ops.aten.softplus.default
    x, other = torch.randn(2, 8), torch.randn(3, 8)
    want_x, want_other = F.softplus(x), F.softplus(other)
    pytorchs = repr(torch.library.get_kernel(op, "CPU"))
    seen = []
    lib = _override(op, seen, "theirs")
    installed = False
    try:
        cpp_router.install(ext, "aten::softplus", "CPU", [_plan(ext, op, (x, 1, 20), [x])])
        installed = True
        assert torch.equal(F.softplus(other), want_other) and seen == ["theirs"]  # a miss: theirs, PyTorch's
        lib._destroy()
        assert torch.equal(F.softplus(other), want_other) and seen == ["theirs"]  # PyTorch's (raised before)
        assert torch.equal(F.softplus(other), want_other)
        with cpp_router.prefill("sentinel"):
            assert (F.softplus(x) == -1234.5).all()  # hits still served
        assert _counts(ext, "aten::softplus") == {"hits": [1], "misses": 3}
    finally:
        lib._destroy()
        if installed:
            cpp_router.uninstall(ext, "aten::softplus", "CPU")
    assert repr(torch.library.get_kernel(op, "CPU")) == pytorchs
    assert torch.equal(F.softplus(x), want_x) and torch.equal(F.softplus(other), want_other)
    assert seen == ["theirs"]


def test_misses_on_many_threads_as_the_override_below_ours_goes_all_reach_pytorch(ext):
    """The first misses after the kernel below was removed come at once: one thread takes the kernel below
    again, the others call the one it took (router.cpp rebind), and none raises or gets another answer. Calls
    made while the route's registration is dropped reach PyTorch's kernel directly, not counted."""
    op = torch.ops.aten.softplus.default
    x = torch.randn(2, 8)
    calls = [torch.randn(3 + i % 5, 8) for i in range(64)]
    want = [F.softplus(c) for c in calls]
    seen = []
    lib = _override(op, seen, "theirs")
    cpp_router.install(ext, "aten::softplus", "CPU", [_plan(ext, op, (x, 1, 20), [x])])
    try:
        lib._destroy()
        start = threading.Barrier(8)

        def misses(k):
            start.wait()
            return all(torch.equal(F.softplus(calls[i]), want[i]) for i in range(k, len(calls), 8))

        with ThreadPoolExecutor(8) as pool:
            assert all(pool.map(misses, range(8)))
        counted = _counts(ext, "aten::softplus")["misses"]
        assert seen == [] and 0 < counted <= len(calls)
        assert torch.equal(F.softplus(calls[0]), want[0])
        assert _counts(ext, "aten::softplus") == {"hits": [0], "misses": counted + 1}  # routed again
    finally:
        lib._destroy()
        cpp_router.uninstall(ext, "aten::softplus", "CPU")
    assert torch.equal(F.softplus(calls[0]), want[0])


def test_the_override_below_ours_removed_under_one_registered_after_ours_leaves_the_order_as_it_is(ext):
    """Taking the kernel below again registers the route again, which puts it on top: under another library's
    override registered after the route, that would run the route before it. So there a miss raises as it did
    (as the Python router's does); once that override is gone, misses reach PyTorch's kernel again."""
    op = torch.ops.aten.softplus.default
    x, other = torch.randn(2, 8), torch.randn(3, 8)
    want_other = F.softplus(other)
    pytorchs = repr(torch.library.get_kernel(op, "CPU"))
    seen = []
    below = _override(op, seen, "below")
    above = None
    try:
        cpp_router.install(ext, "aten::softplus", "CPU", [_plan(ext, op, (x, 1, 20), [x])])
        try:
            above = _override(op, seen, "above")
            on_top = repr(torch.library.get_kernel(op, "CPU"))
            assert torch.equal(F.softplus(other), want_other) and seen == ["above", "below"]
            below._destroy()
            with pytest.raises(RuntimeError, match="SafeKernelFunction has been invalidated"):
                F.softplus(other)
            assert repr(torch.library.get_kernel(op, "CPU")) == on_top  # the route did not register again
            with cpp_router.prefill("sentinel"):
                assert (F.softplus(x) == -1234.5).all()  # hits still served, under the other override
            assert seen == ["above", "below", "above", "above"]
            above._destroy()
            assert torch.equal(F.softplus(other), want_other) and len(seen) == 4  # the route on top again
            assert _counts(ext, "aten::softplus") == {"hits": [1], "misses": 3}
        finally:
            cpp_router.uninstall(ext, "aten::softplus", "CPU")
    finally:
        below._destroy()
        if above is not None:
            above._destroy()
    assert repr(torch.library.get_kernel(op, "CPU")) == pytorchs
    assert torch.equal(F.softplus(other), want_other)


_BARE_LIB = torch.library.Library("kforge_cpp_bare_test", "DEF")
_BARE_LIB.define("twice(Tensor x) -> Tensor")


def test_the_only_kernel_below_ours_removed_leaves_misses_raising_without_registering_again_each_time(ext):
    """An op whose one CPU kernel was another library's: with it gone nothing is below the route, misses raise
    as they did (eager raises too), and the route is not registered again on every miss."""
    op = torch.ops.kforge_cpp_bare_test.twice.default
    x, other = torch.randn(4), torch.randn(5)
    impl = torch.library.Library("kforge_cpp_bare_test", "IMPL", "CPU")
    impl.impl("twice", lambda t: t * 2, "CPU")
    try:
        cpp_router.install(ext, "kforge_cpp_bare_test::twice", "CPU", [_plan(ext, op, (x,), [x])])
        try:
            assert torch.equal(op(other), other * 2)
            impl._destroy()
            with pytest.raises(RuntimeError, match="SafeKernelFunction has been invalidated"):
                op(other)
            ours = repr(torch.library.get_kernel(op, "CPU"))
            with pytest.raises(RuntimeError, match="SafeKernelFunction has been invalidated"):
                op(other)
            assert repr(torch.library.get_kernel(op, "CPU")) == ours and "kforge router" in ours
            with cpp_router.prefill("sentinel"):
                assert (op(x) == -1234.5).all()  # hits still served
        finally:
            cpp_router.uninstall(ext, "kforge_cpp_bare_test::twice", "CPU")
    finally:
        impl._destroy()
    with pytest.raises(NotImplementedError):
        op(other)


@pytest.mark.gpu
def test_resnet50_cast_through_the_cpp_router_on_the_gpu(ext, monkeypatch):
    """The H200-exported ResNet-50 cast (docs/results/cast-h200) dispatched by the C++ router: outputs match
    eager, every variant hit from C++, remove() restores eager."""
    from pathlib import Path

    import engine.cast
    from engine.config import config_model
    from engine.models.forwards import output_tensor

    monkeypatch.setenv("KFORGE_CAST_ROUTER", "cpp")
    path = Path(__file__).resolve().parent.parent / "docs" / "results" / "cast-h200" / "resnet50.cast"
    _, forward = config_model("resnet50")
    cast = engine.cast.load(path)
    with torch.no_grad():
        eager = output_tensor(forward()).clone()
        with cast.enabled():
            cast.reset_stats()
            mine = output_tensor(forward()).clone()
            stats = cast.stats()
        after = output_tensor(forward()).clone()
    assert all(v["router"] == "c++" for v in stats["variants"]), stats["variants"]
    assert all(v["hits"] > 0 for v in stats["variants"]), stats["variants"]
    # The counts outlive the C++ routes (as the Python router's do): stats read after the block agree.
    assert [v["hits"] for v in cast.stats()["variants"]] == [v["hits"] for v in stats["variants"]]
    assert cast.stats()["misses"] == stats["misses"]
    torch.testing.assert_close(mine, eager, rtol=2e-2, atol=2e-2)
    assert torch.equal(after, eager)


def test_auto_mode_keeps_out_a_router_whose_self_test_failed_and_cpp_mode_overrides(ext, monkeypatch, tmp_path):
    # As on a GPU machine whose self-test crashed: the verdict is read, auto gives no router, cpp still does.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Test GPU")
    monkeypatch.setattr(cpp_router, "_UNTRUSTED", None)
    real, runs = cpp_router._verdict, []

    def crashed():
        runs.append(1)
        return "its self-test on this GPU crashed with SIGSEGV at 'near miss (other dtype)'"

    monkeypatch.setattr(cpp_router, "_verdict", lambda name: real(name, cache_dir=tmp_path, run=crashed))
    monkeypatch.setenv("KFORGE_CAST_ROUTER", "auto")
    assert cpp_router.extension() is None and cpp_router.extension() is None
    assert runs == [1]
    assert "crashed with SIGSEGV at 'near miss (other dtype)'" in cpp_router.why_not()
    monkeypatch.setenv("KFORGE_CAST_ROUTER", "cpp")
    assert cpp_router.extension() is ext


def test_a_crash_with_backtraces_on_prints_the_native_stack_then_pythons(ext):
    import subprocess
    import sys

    code = ("import ctypes\nfrom engine.cast import cpp_router\n"
            "import faulthandler; faulthandler.enable()\n"
            "assert cpp_router.extension() is not None\n"
            "print('built', flush=True)\n"
            "ctypes.string_at(0)\n")
    env = dict(__import__("os").environ, KFORGE_ROUTER_BACKTRACE="1", KFORGE_CAST_ROUTER="cpp")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == -11 and "built" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "crash backtraces on" in r.stderr
    native = r.stderr.index("kforge router: fatal signal; native backtrace")
    assert r.stderr.index("Fatal Python error: Segmentation fault") > native  # then faulthandler's stack
    assert "libc" in r.stderr[native:] or "python" in r.stderr[native:].lower()  # frames, not just the header


@pytest.mark.gpu
def test_router_self_test_passes_on_the_gpu():
    """What `auto` mode runs before trusting the router: a hit, plain and near misses of a relu cast in a child
    process, each result equal to eager. Crashed on an H200 on 2026-11-30 (SIGSEGV at the first guard miss of real flows)."""
    assert cpp_router._self_test() is None


def test_a_plan_that_fails_on_a_call_falls_back_to_pytorch_for_good(ext, capfd):
    # No libcuda on this machine: the launch fails, the variant is dropped with one warning, PyTorch answers.
    op = torch.ops.aten.relu.default
    x = torch.randn(32)
    lay = layout_of(op)
    sig = signature_of(op, bind_arguments(op, (x,), {}))
    outs = [{"alias": -1, "dtype": torch.empty(0), "sizes": [32], "strides": [1]}]
    launch = {"fn": 0, "grid": [1, 1, 1], "block": [32, 1, 1], "shared": 0, "params": [(1, 0), (2, 0)]}
    plan = cpp_router.make_plan(ext, "cpu", cpp_router.arg_descriptors(lay, sig, -1), outs, [], [launch], False)
    cpp_router.install(ext, "aten::relu", "CPU", [plan])
    try:
        assert torch.equal(op(x), x.clamp_min(0))
        assert torch.equal(op(x), x.clamp_min(0))  # dropped: no second attempt
        err = capfd.readouterr().err  # c10's warning (a Python warning where torch's handler is installed)
        assert err.count("failed on a call and stays on PyTorch") == 1
        assert _counts(ext, "aten::relu") == {"hits": [0], "misses": 2}
    finally:
        cpp_router.uninstall(ext, "aten::relu", "CPU")


def test_suspended_sends_routed_calls_to_pytorch_and_prefill_poisons_fresh_outputs(ext):
    # A plan without launches returns its freshly allocated outputs: what the prefill wrote is what we see.
    from engine.cast import runtime

    op = torch.ops.aten.relu.default
    x = torch.randn(64)
    plan = _plan(ext, op, (x,), [x])
    cpp_router.install(ext, "aten::relu", "CPU", [plan])
    try:
        with cpp_router.prefill("nan"):
            assert torch.isnan(op(x)).all()
        with cpp_router.prefill("sentinel"):
            assert (op(x) == -1234.5).all()
        with runtime.suspended():  # confirmation's eager arm: PyTorch's kernel, not counted
            assert torch.equal(op(x), x.clamp_min(0))
            with runtime.suspended():
                pass
            assert torch.equal(op(x), x.clamp_min(0))  # still suspended after a nested block
        assert _counts(ext, "aten::relu") == {"hits": [2], "misses": 0}
        with cpp_router.prefill("nan"):
            pass
        op(x)  # no prefill outside the block, and routed again after suspended()
        assert _counts(ext, "aten::relu") == {"hits": [3], "misses": 0}
    finally:
        cpp_router.uninstall(ext, "aten::relu", "CPU")


def test_router_mode_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("KFORGE_CAST_ROUTER", raising=False)
    assert cpp_router.mode() == "auto" and cpp_router.wanted()
    monkeypatch.setenv("KFORGE_CAST_ROUTER", "python")
    assert not cpp_router.wanted()
    monkeypatch.setenv("KFORGE_CAST_ROUTER", "CPP")
    assert cpp_router.mode() == "cpp" and cpp_router.wanted()


def test_a_python_number_in_a_tensor_slot_is_compared_by_value(ext):
    # x + 1e-6 (RMS norms' epsilon): add.Tensor receives the number as a wrapped 0-dim CPU tensor.
    op = torch.ops.aten.add.Tensor
    x = torch.randn(4, 8)
    lay = layout_of(op)
    sig = signature_of(op, bind_arguments(op, (x, 1e-6), {}))
    assert cpp_router.supported(lay, sig)
    assert not cpp_router.supported(lay, signature_of(op, bind_arguments(op, (x, True), {})))  # bools: Python
    plan = _plan(ext, op, (x, 1e-6), [x])
    cpp_router.install(ext, "aten::add.Tensor", "CPU", [plan])
    try:
        with cpp_router.prefill("sentinel"):
            assert (x + 1e-6 == -1234.5).all()  # the plan ran
        assert torch.equal(x + 2e-6, x.clone().add_(2e-6))  # another value: PyTorch
        assert torch.equal(x + 1, x.clone().add_(1))  # an int of another value: PyTorch
        assert torch.equal(x + torch.tensor(1e-6), x.clone().add_(1e-6))  # a real 0-dim tensor: PyTorch
        assert _counts(ext, "aten::add.Tensor") == {"hits": [1], "misses": 3}
        # The near misses name the numbers that were passed; a real 0-dim tensor stays a tensor.
        keys = cpp_router.stats(ext, "aten::add.Tensor", "CPU")["near_keys"]
        assert [k.split("cpu), ", 1)[1] for k in keys] == ["2e-06, 1", "1, 1", "Float[](s=[], align 16, cpu), 1"]
    finally:
        cpp_router.uninstall(ext, "aten::add.Tensor", "CPU")


@pytest.mark.parametrize("proven, call", [(3, 3.0), (3.0, 3), (0.0, -0.0)])
def test_a_python_number_of_another_type_or_sign_is_another_signature(ext, proven, call):
    """`x + 3` of an int32 tensor is int32, `x + 3.0` float32; `x * -0.0` flips the zeros' signs. The router
    compared wrapped numbers as doubles (3 == 3.0, 0.0 == -0.0), so a variant proven for one ran for the
    other and returned the proven dtype."""
    op = torch.ops.aten.add.Tensor if proven != 0.0 else torch.ops.aten.mul.Tensor
    x = torch.arange(8, dtype=torch.int32) if proven != 0.0 else torch.ones(8)
    want = op(x, call)
    plan = _plan(ext, op, (x, proven), [op(x, proven)])
    name = op.name()
    cpp_router.install(ext, name, "CPU", [plan])
    try:
        op(x, proven)
        got = op(x, call)
        assert _counts(ext, name)["hits"] == [1]
        assert got.dtype == want.dtype and torch.equal(got, want) and torch.equal(got.signbit(), want.signbit())
    finally:
        cpp_router.uninstall(ext, name, "CPU")


def test_a_c_plus_plus_route_is_told_the_layouts_compiled_code_passes_as_held(monkeypatch):
    """Installed (again) after a compile passed an input as held, the C++ route gets the held layouts: a call of
    compiled code that goes to PyTorch's kernel then gets that input made contiguous (router.cpp set_held)."""
    from engine.cast import cpp_router

    # the stand-in's install is counted in the process-wide table: a later test on this worker read a GroupNorm
    # route "installed now" (test_cast_compile's routed_names) once this module shared a worker with it
    monkeypatch.setattr(cpp_router, "_INSTALLED", {})

    class Ext:
        def __init__(self):
            self.calls = []

        def install(self, *a):
            self.calls.append(("install", a[:3]))

        def set_held(self, *a):
            self.calls.append(("set_held", a))

    ext = Ext()
    cpp_router.install(ext, "aten::native_group_norm", "CUDA", [],
                       [((1, 8, 6, 6), (288, 1, 48, 8), ((288, 1, 48, 8), (4, 1), None))])
    assert ext.calls == [("install", ("aten::native_group_norm", "", "CUDA")),
                         ("set_held", ("aten::native_group_norm", "", [1, 8, 6, 6], [288, 1, 48, 8],
                                       [[288, 1, 48, 8], [4, 1], []]))]


# An op whose kernel takes its input contiguous and returns a contiguous output while its meta kernel gives
# the output its input's layout, as CUDA GroupNorm under torch 2.11's compile (H200, 2026-12-03e).
_HELD_LIB = torch.library.Library("kforge_cpp_held_test", "DEF")
_HELD_LIB.define("scale(Tensor x) -> Tensor")
_SEEN: list[tuple[int, ...]] = []


def _scale_kernel(x):
    _SEEN.append(tuple(x.stride()))
    return x.contiguous() * 2


_HELD_LIB.impl("scale", _scale_kernel, "CPU")
torch.library.register_fake("kforge_cpp_held_test::scale", lambda x: torch.empty_like(x), lib=_HELD_LIB)


# The router's held table outlives an uninstall (as runtime's does): the key-stride form goes first, alone.
@pytest.mark.parametrize("held_as", ["as runtime.held gives it", "exact"])
def test_in_compiled_code_a_held_input_reaches_pytorchs_kernel_contiguous_and_its_output_gets_the_held_strides(
        ext, held_as):
    """router.cpp: a call of compiled code with a held first input that goes to PyTorch's kernel (here a miss)
    hands the kernel that input made contiguous, and copies the kernel's output into the strides compiled code
    asserts. Eager calls, and layouts not held, are left as they are. The held layout is matched a size-1 dim's
    stride aside: runtime.held gives it as guard keys hold it (0 there), the call brings C·H·W."""
    from engine.cast.guard import key_strides

    op = torch.ops.kforge_cpp_held_test.scale.default
    x = torch.randn(1, 8, 6, 6)
    cl = x.contiguous(memory_format=torch.channels_last)
    other = torch.randn(2, 8, 6, 6)
    plan = _plan(ext, op, (other,), [other])  # a variant for another shape: every call below misses
    held = tuple(cl.stride()) if held_as == "exact" else key_strides((1, 8, 6, 6), cl.stride())
    assert held_as == "exact" or held == (0, 1, 48, 8)
    cpp_router.install(ext, "kforge_cpp_held_test::scale", "CPU", [plan],
                       [((1, 8, 6, 6), held, (tuple(cl.stride()),))])
    try:
        _SEEN.clear()
        assert op(cl).is_contiguous() and _SEEN == [tuple(cl.stride())]  # eager: as called, as returned
        ext.set_target(cpp_router.TARGET_BITS.index("compile"))
        try:
            _SEEN.clear()
            got = op(cl)
            plain = op(x)  # contiguous: not a held layout
        finally:
            ext.set_target(-1)
        assert _SEEN == [tuple(x.stride()), tuple(x.stride())]
        assert got.stride() == cl.stride() and torch.equal(got, x * 2)
        assert plain.is_contiguous() and torch.equal(plain, x * 2)
        assert cpp_router.stats(ext, "kforge_cpp_held_test::scale", "CPU")["misses"] == 3
    finally:
        cpp_router.uninstall(ext, "kforge_cpp_held_test::scale", "CPU")


def test_in_compiled_code_a_held_calls_output_differing_only_at_a_size_one_dim_is_not_copied(ext):
    """router.cpp compares a held call's output strides as compiled code's assert_size_stride does: a size-1
    dim's stride aside. torch 2.11's meta GroupNorm gives stride C at the batch dim of a [1, C, H, W] output
    where the kernel's has C·H·W; that is no reason for another pass over the output."""
    op = torch.ops.kforge_cpp_held_test.scale.default
    x = torch.randn(1, 8, 6, 6)
    cl = x.contiguous(memory_format=torch.channels_last)
    other = torch.randn(2, 8, 6, 6)
    plan = _plan(ext, op, (other,), [other])
    cpp_router.install(ext, "kforge_cpp_held_test::scale", "CPU", [plan],
                       [((1, 8, 6, 6), tuple(cl.stride()), ((999, 36, 6, 1), ))])  # contiguous, but dim 0
    try:
        ext.set_target(cpp_router.TARGET_BITS.index("compile"))
        try:
            got = op(cl)
        finally:
            ext.set_target(-1)
        assert got.stride() == (288, 36, 6, 1) and torch.equal(got, x * 2)  # as the kernel returned it
    finally:
        cpp_router.uninstall(ext, "kforge_cpp_held_test::scale", "CPU")
