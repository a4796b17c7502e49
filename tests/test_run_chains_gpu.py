"""H200: chain cards through the user's path — `run` (builtin proposer, real lane) finds and wins the RMSNorm
module card of a small Gemma-like stack, `export` keeps it after the whole-model check with the model's
modules patched (eager target) and, where it is faster there, as a pattern inside compiled graphs (compile
target; otherwise the export refuses it by measurement, as on the H200 for this small stack), and the loaded
cast runs it: through the module's forward in eager, through the pattern op under `cast.compile`. A few
minutes (one torch.compile of a four-layer model per export target)."""

import textwrap

import pytest
from test_run_gpu import _document, build_user_model, compiled_call, user_model

pytestmark = pytest.mark.gpu

MODEL_PY = textwrap.dedent('''
    import torch
    from torch import nn

    class RMSNorm(nn.Module):  # Gemma's form: float32 inside, (1 + weight), one downcast at the end
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.zeros(d))

        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return (h * (1.0 + self.weight.float())).type_as(x)

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.norm, self.proj = RMSNorm(d), nn.Linear(d, d, bias=False)

        def forward(self, x):
            return x + self.proj(self.norm(x))

    class Stack(nn.Module):
        def __init__(self, d=2048, n=4):
            super().__init__()
            self.layers = nn.ModuleList([Block(d) for _ in range(n)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    def build(device, dtype):
        torch.manual_seed(0)
        model = Stack().to(device=device, dtype=dtype).eval()
        with torch.no_grad():
            for layer in model.layers:
                layer.norm.weight.normal_(0, 0.1)
                layer.proj.weight.mul_(0.05)
        x = torch.randn(1, 2048, 2048, device=device, dtype=dtype)
        return model, (x,)
''')


def test_module_card_runs_in_eager_and_as_a_pattern_under_compile(cli, capsys, tmp_path):
    import torch

    import engine.cast
    from engine.cast.format import read_cast

    config = user_model(tmp_path, "rms_stack", MODEL_PY, samples=2)
    ws = tmp_path / "ws"
    code, out, err = cli("run", config, "--no-tui", "--iterations", "6", "--json", "--no-compile-ref",
                         "--workspace", ws)
    assert code == 0, err
    doc = _document(out, err, "run")
    chains = [c for c in doc["cards"] if c["op"] == "kforge::chain"]
    with capsys.disabled():
        for c in chains:
            print(f"\nchain card {c['id']}: eager {c['eager_us']} us, best {c['best_us']} us, "
                  f"{c['speedup']} {c['speedup_ci']}, {c['verified']}/{c['candidates']} verified")
    won = [c for c in chains if c["speedup_ci"] and c["speedup_ci"][0] > 1.2]
    assert won, f"no chain card won in the lane: {chains}"

    results = {}
    for target in ("eager", "compile"):
        cast_file = tmp_path / f"{target}.cast"
        code, out, err = cli("export", "--out", cast_file, "--workspace", ws, "--json", "--target", target)
        if target == "compile" and code == 1 and "with the cast in compiled forwards" in err \
                and ("is slower" in err or "is not faster" in err):
            # Inductor fuses this RMSNorm into its neighbours; where the model compiled with the pattern op is
            # slower than without, the whole-model check refuses it, as it must. (The 0.66-0.70x measured on the
            # H200 at 3893e9a and 8a0f25a measured a bug fixed in 86dfbda: the check enables the cast per call,
            # and every call after the first enabled block missed and ran the chain eagerly.) The pattern path
            # itself is still exercised below, with the eager cast's proof. On an H100 at cfbc938 the check measured
            # 0.43-0.47x for every set (said "not faster with confidence" then, a wording this test did not expect).
            with capsys.disabled():
                print(f"export compile refused by the whole-model check: {err.strip()}")
            continue
        assert code == 0, err
        results[target] = _document(out, err, f"export --target {target}")
        variants = read_cast(cast_file).manifest["variants"]
        modules = [v for v in variants if v["op"] == "kforge::chain" and "module" in v]
        with capsys.disabled():
            print(f"export {target}: {[v['op'] for v in variants]}; warnings {results[target]['warnings']}")
        assert modules, f"export --target {target} dropped the module card: {results[target]}"
        # The whole-model check ran (on the H200 at 0448e38 the compile check of this user-file model failed
        # to import its module by name, and the cast was written unchecked).
        assert not [w for w in results[target]["warnings"] if "check failed" in w], results[target]["warnings"]

    model, (x,) = build_user_model(tmp_path, "rms_stack")
    with torch.no_grad():
        eager = model(x)
        cast = engine.cast.load(tmp_path / "eager.cast")
        with cast.enabled(model):
            cast.reset_stats()
            mine = model(x)
            st = cast.stats()
            cast.reset_stats()
            again = model(x)  # where a graph route captured a block, this forward replays it
            st2 = cast.stats()
        hits = {p: m["hits"] for p, m in st["modules"].items()}
        graphs = st["graph_routes"]
        captured = {p for p, g in graphs.items() if g["captured"]}
        with capsys.disabled():
            print(f"eager cast, first forward: module hits {hits}; graph routes {graphs}")
        # A graph route over a block (kept where replaying it saves time: this small stack is host-bound) runs
        # its first call eagerly, then two warm-ups and the capture: four calls of each norm inside it. (The H100
        # at 4289291 counted 4 hits per norm; this test expected 1, written before the export kept graph routes.)
        inside = {p: any(g == "" or p.startswith(g + ".") for g in captured) for p in hits}
        assert hits and all(n == (4 if inside[p] else 1) for p, n in hits.items()), (st["modules"], graphs)
        torch.testing.assert_close(mine, eager, atol=5e-2, rtol=2e-2)
        # The second forward: the captured blocks replay (their norms' kernels run inside the graphs), the rest
        # goes through the module route again; the same bits as the first.
        assert all(st2["graph_routes"][g]["replays"] == 1 for g in captured), st2["graph_routes"]
        assert all(m["hits"] == (0 if inside[p] else 1) for p, m in st2["modules"].items()), st2["modules"]
        torch.testing.assert_close(again, mine, atol=0, rtol=0)
        assert torch.equal(model(x), eager)  # removed: the model is its own again

        torch._dynamo.reset()
        if "compile" in results:
            cast = engine.cast.load(tmp_path / "compile.cast")
        else:  # no compile-proven cast: the same kernels, made to run under compile too
            cast = engine.cast.load(tmp_path / "eager.cast", any_target=True)
        with cast.enabled(model):
            got, st = compiled_call(cast, model, x)
        assert sum(st["patterns"].values()) >= 4, st["patterns"]  # one RMSNorm per layer, in the graph
        assert st["pattern_problems"] == {}
        torch.testing.assert_close(got, eager, atol=5e-2, rtol=2e-2)
