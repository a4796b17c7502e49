import contextlib
import json
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _share_the_cores_between_workers() -> None:
    """Under xdist, each worker's PyTorch (and the processes its tests start) gets its share of the cores. With
    the default of one OpenMP thread per core, two workers on two cores ran four threads on two cores, and a
    parallel op waited on its own descheduled thread: the chain honest sweep took 34 s instead of 9."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if not workers or "OMP_NUM_THREADS" in os.environ:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)  # macOS
    threads = max(1, cores // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if threads < torch.get_num_threads():
        torch.set_num_threads(threads)


_share_the_cores_between_workers()


def load_script(name: str):
    """scripts/NAME.py imported as a module (the scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # a script's dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        # One GPU: its tests run one after another on one xdist worker (addopts: --dist loadgroup).
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(pytest.mark.xdist_group("gpu"))
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def run_cli(argv, capsys):
    """Run `kforge-tui ARGV` in-process; returns (exit code, stdout, stderr)."""
    from kforge_tui.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def capture_json(config, workspace, capsys, *extra):
    code, out, err = run_cli(["capture", config, "--json", "--small", "--device", "cpu",
                              "--workspace", workspace, *extra], capsys)
    assert code == 0, err
    return json.loads(out)


class OutErr:
    """A capsys stand-in for module-scoped fixtures: redirects stdout/stderr around one call (capture_json's)."""

    def __init__(self):
        import io

        self._out, self._err = io.StringIO(), io.StringIO()
        self._ctx = contextlib.ExitStack()
        self._ctx.enter_context(contextlib.redirect_stdout(self._out))
        self._ctx.enter_context(contextlib.redirect_stderr(self._err))

    def readouterr(self):
        self._ctx.close()
        return self._out.getvalue(), self._err.getvalue()


@pytest.fixture(scope="session")
def gemma_small_capture(tmp_path_factory):
    """Gemma 4 E2B's --small capture as shipped (128 tokens), one sample per card: (its workspace, its JSON).
    Shared by the tests that read it (test_capture_chains, test_capture_models), each marked
    xdist_group("gemma_small_capture") so that they land on one worker and it is made once (~25 s on a CI core)."""
    ws = tmp_path_factory.mktemp("gemma-small")
    return ws, capture_json(CONFIGS / "models" / "gemma4_e2b.toml", ws, OutErr(), "--samples", "1")


@pytest.fixture(scope="session")
def sd35_vae_dry_run(tmp_path_factory):
    """`run --dry-run` of the SD3.5 VAE (small) on the CPU with channels-last twins and conv-bias folds on, its
    group_norm cards searched for one iteration: `run --json`'s (exit code, stdout, stderr). Shared by the tests
    that read it (test_chain_twins, test_conv_bias_fold_dry_run), each marked xdist_group("sd35_vae_dry_run") so
    that it is made once (~20 s on a CI core). The folds only add cards: with them on, every other card of the
    run came out as without them (2026-12-07: the same 79 cards, each with the same outcome, and 8 fold cards)."""
    tmp = tmp_path_factory.mktemp("sd35-vae")
    text = (CONFIGS / "examples" / "sd35_vae.toml").read_text()
    assert "[capture]\n" in text
    config = tmp / "vae.toml"
    config.write_text(text.replace("[capture]\n", "[capture]\nlayout_twins = true\nconv_bias_folds = true\n"))
    return run_cli(["run", config, "--small", "--dry-run", "--no-tui", "--device", "cpu", "--ops", "group_norm",
                    "--iterations", "1", "--json", "--workspace", tmp / "ws"], OutErr())


# What every engine module, the CLI's help and a headless capture import, in one fresh process: it prints the
# Ray modules loaded once every engine module is imported and `--help` and `run --help` are shown, then captures
# my_model and prints the Textual modules loaded by then. Its --help text and the capture's JSON go to stdout.
IMPORT_PROBE = r'''
import importlib, pkgutil, sys
import engine
for m in pkgutil.walk_packages(engine.__path__, "engine."):
    importlib.import_module(m.name)
import kforge_tui.cli
for argv in (["--help"], ["run", "--help"]):
    try:
        kforge_tui.cli.main(argv)
    except SystemExit:
        pass
print("RAY:", sorted(m for m in sys.modules if m == "ray" or m.startswith("ray.")), file=sys.stderr, flush=True)
code = kforge_tui.cli.main(["capture", sys.argv[1], "--small", "--device", "cpu", "--json",
                            "--workspace", sys.argv[2]])
assert code == 0, code
loaded = sorted(m for m in sys.modules if m == "textual" or m.startswith("textual."))
print("TEXTUAL:", loaded, file=sys.stderr)
'''


@pytest.fixture(scope="session")
def engine_import_probe(tmp_path_factory):
    """IMPORT_PROBE's finished process (returncode, stdout, stderr). Shared by the tests that read it
    (test_import_hygiene: no Textual; test_lane_ray: no Ray), each marked xdist_group("engine_import_probe") so
    that it runs once: importing every engine module (the SDKs of the LLM providers, torch) is most of its ~12 s."""
    import subprocess

    ws = tmp_path_factory.mktemp("import-probe")
    return subprocess.run([sys.executable, "-c", IMPORT_PROBE, str(CONFIGS / "examples" / "my_model.toml"), str(ws)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


class _RayCluster:
    """The shared cluster of conftest.ray_cluster, and how many of this session's test modules that use it are
    still to run (in this worker: the tests marked xdist_group("ray") all run in one)."""

    cluster = None
    left: int | None = None


@pytest.fixture(scope="session")
def _ray_cluster_session():
    yield _RayCluster
    if _RayCluster.cluster is not None:  # not every test that uses it ran here (another --dist)
        _RayCluster.cluster.shutdown()
        _RayCluster.cluster = None


@pytest.fixture(scope="module")
def ray_cluster(request, _ray_cluster_session):
    """A local Ray cluster (ray.cluster_utils.Cluster) of one head node with 2 CPUs, and no driver: a test connects
    to `.address` (ray.init, `run --ray-address`), adds a node, and leaves it as it found it. Shared by the tests
    marked xdist_group("ray"), so that a worker starts its processes once (~8 s of a CI core each time); it is shut
    down after the last module that uses it, rather than at the session's end (idle, its processes took 3 % of a
    core). Skipped where Ray is not installed."""
    pytest.importorskip("ray")
    held = _ray_cluster_session
    if held.left is None:
        held.left = len({item.nodeid.split("::")[0] for item in request.session.items
                         if "ray_cluster" in item.fixturenames})
    if held.cluster is None:
        from ray.cluster_utils import Cluster

        # no autoscaler monitor and no log monitor (a worker's output is not sent to the drivers): a fixed local
        # cluster needs neither, and the head started in 6.2 s instead of 9.5 s here
        held.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 2, "include_dashboard": False, "object_store_memory": 200 * 2**20,
            "no_monitor": True, "include_log_monitor": False})
        _forget_as_current_ray(held.cluster.address)
    try:
        yield held.cluster
    finally:
        held.left -= 1
        if held.left <= 0:
            held.cluster.shutdown()
            held.cluster = None


def _forget_as_current_ray(address: str) -> None:
    """Cluster writes its address where `ray.init()` without an address looks first (Ray's ray_current_cluster
    file): left there, a `run --ray` of another test started meanwhile, in this worker or the other, would join
    this cluster instead of starting its own local instance."""
    try:
        from ray._common.utils import get_ray_address_file
    except ImportError:  # older Ray kept it in ray._private.utils
        from ray._private.utils import get_ray_address_file
    path = Path(get_ray_address_file(None))
    with contextlib.suppress(OSError):
        if path.read_text().strip() == address:
            path.unlink()


@pytest.fixture
def cli(capsys):
    return lambda *argv: run_cli(argv, capsys)


sys.path.insert(0, str(ROOT / "tests"))


@pytest.fixture
def torch_config():
    """`torch_config(module, name=value, ...)` sets torch config values (Inductor's, functorch's, Dynamo's) for one
    test through the module's own `patch`, undone after it. Not monkeypatch.setattr: pytest 9.2's undo deletes
    such a setting from torch's config module, and every later compile in that worker failed (18 tests of the
    README's test command on a fresh install)."""
    with contextlib.ExitStack() as stack:
        yield lambda module, **values: stack.enter_context(module.patch(**values))
