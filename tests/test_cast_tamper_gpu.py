"""GPU: a cast whose manifest was edited into nonsense for one variant (an unknown op, a signature that is no
table, a broken launch spec, no outputs) installs without raising, keeps that variant off with a problem, and the
model's relu computes what eager does. (A red team's casts, 2026-12-06; the shape checks at load are CPU-tested
in test_cast_format.py; what `install` and the routers do with them needs a GPU.)

Not tested here, by design: a guard widened or a dtype changed in a hand-edited manifest. The digests show only
that a cast agrees with itself; a cast is trusted code, like a wheel, and `kforge-tui audit --verify` re-checks
every variant on the user's GPU (docs/cast.md)."""

from __future__ import annotations

import warnings

import pytest
import torch
from cast_helpers import edit_manifest, write_genuine_cast

pytestmark = pytest.mark.gpu


def _relu(m):
    return next(v for v in m["variants"] if v["op"] == "aten::relu")


TAMPERS = {
    "none (the control: its relu is hit)": lambda m: None,
    "unknown op": lambda m: _relu(m).update(op="aten::nope"),
    "launch spec not json": lambda m: _relu(m).update(launch_spec="[[[bad"),
    "no outputs": lambda m: _relu(m).update(outputs=None),
    "no kernels": lambda m: _relu(m).update(kernels=[]),
}


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
@pytest.mark.parametrize("router", ["python", "c++"])
def test_a_variant_edited_into_nonsense_stays_off_and_the_model_computes_eagers_answer(tmp_path, monkeypatch,
                                                                                          tamper, router):
    import engine.cast as ec
    from engine.cast.compat import current_env

    monkeypatch.setenv("KFORGE_CAST_ROUTER", "python" if router == "python" else "cpp")
    genuine = tmp_path / "genuine.cast"
    manifest = write_genuine_cast(genuine, env=current_env())
    arg = _relu(manifest)["signature"]["args"][0]
    edited = tmp_path / "edited.cast"
    edit_manifest(genuine, edited, TAMPERS[tamper])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        cast = ec.load(edited)
        cast.install()
        try:
            x = torch.randn(*arg["shape"], device="cuda").to(getattr(torch, arg["dtype"]))
            y = torch.relu(x)
            torch.cuda.synchronize()
            row = next(v for v in cast.stats()["variants"] if v["op"] in ("aten::relu", "aten::nope"))
        finally:
            cast.remove()
    assert torch.equal(y, x.clamp(min=0)), tamper
    if tamper.startswith("none"):
        assert row["active"] and row["hits"] >= 1, (row, [str(w.message) for w in said])
        return
    loaded = cast.problem is None
    assert not loaded or (not row["active"] and row["hits"] == 0), (tamper, row, [str(w.message) for w in said])
