"""Host cost per call of eager, of a guard miss and of a guard hit, on a tiny op where the host, not
the GPU, sets the pace (a relu on 4096 fp16 values: the kernel takes ~2 µs)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.bench.host import per_call_us

if TYPE_CHECKING:
    from engine.propose.base import Hardware


def relu_cast(path: Path, n: int = 4096) -> Path:
    """A one-variant cast (builtin relu kernel for fp16[n]); packaged without confirmation: it is a
    host-cost probe, not something to ship."""
    x = torch.randn(n, device="cuda", dtype=torch.float16)
    return probe_cast(path, [(torch.ops.aten.relu.default, (x,))])


def probe_cast(path: Path, calls: list[tuple[Any, tuple]]) -> Path:
    """A cast with one builtin-kernel variant per (op, args) call, packaged without confirmation: for probes
    and self-tests, not something to ship."""
    return package_cards(path, [probe_card(f"probe{i}", op, args) for i, (op, args) in enumerate(calls)])


def probe_card(card_id: str, op: Any, args: tuple) -> dict[str, Any]:
    """The operator card of one call (its exact signature and outputs)."""
    from engine.capture.signature import bind_arguments, describe_tensor, signature_of, signature_text

    sig = signature_of(op, bind_arguments(op, args, {}))
    out = op(*args)
    outputs = [describe_tensor(t) for t in (out if isinstance(out, (tuple, list)) else (out,))]
    return {"card_id": card_id, "op": sig["op"], "signature": sig, "signature_text": signature_text(sig),
            "outputs": outputs}


def package_cards(path: Path, cards: list[dict[str, Any]], hw: Hardware | None = None) -> Path:
    """Each card's builtin kernel at its default parameters, rendered for `hw` (default: this GPU) and
    compiled for it, written as a cast. Without a visible GPU (a compile-only check): the default
    Hardware's figures with the environment's arch."""
    from engine.cards import card_from_row
    from engine.cast.compat import current_env
    from engine.cast.format import write_cast
    from engine.compile import compile_nvrtc
    from engine.export.direct import current_hardware
    from engine.export.package import ExportVariant, package
    from engine.propose.base import Hardware
    from engine.propose.builtin import BuiltinProposer

    env = current_env()
    if hw is None:
        hw = current_hardware() if torch.cuda.is_available() else Hardware(arch=env["arch"] or Hardware().arch)
    variants = []
    for card in cards:
        brief = card_from_row(card)
        template, why = BuiltinProposer().template_for(brief, hw=hw)
        assert template is not None, why
        r = template.render(brief, template.default(brief, hw=hw), hw=hw)
        res = compile_nvrtc(r.source, arch=env["arch"])
        assert res.ok, res.summary()
        variants.append(ExportVariant(card, {"id": card["card_id"], "source": r.source, "launch_spec": r.spec,
                                             "proposer": "builtin"}, res.cubin, res.ptx, env["arch"]))
    manifest, files, report = package(variants, env, {"model": "probe"})
    write_cast(path, manifest, files, report)
    return path


def measure(tmp: Path) -> dict[str, Any]:
    """Eager, miss and hit host µs per call (relu on fp16[4096]; the miss on fp16[4104])."""
    import engine.cast

    path = relu_cast(tmp / "hostcost.cast")
    x = torch.randn(4096, device="cuda", dtype=torch.float16)
    y = torch.randn(4104, device="cuda", dtype=torch.float16)
    eager_x = per_call_us(lambda: torch.relu(x))
    eager_y = per_call_us(lambda: torch.relu(y))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cast = engine.cast.load(path)
    problems = [str(w.message) for w in caught if issubclass(w.category, engine.cast.CastWarning)]
    assert not problems, problems
    with cast.enabled():
        out = torch.relu(x)
        assert cast.variants[0].hits == 1, "the host-cost probe's guard did not hit"
        assert torch.equal(out, torch.relu(x.float()).half())
        hit = per_call_us(lambda: torch.relu(x))
        miss = per_call_us(lambda: torch.relu(y))
        router = cast.stats()["variants"][0]["router"]
    eager_x2 = per_call_us(lambda: torch.relu(x))
    eager_x = min(eager_x, eager_x2)
    return {"op": "aten::relu fp16[4096]", "eager_us": eager_x, "eager_miss_shape_us": eager_y,
            "hit_us": hit, "miss_us": miss, "hit_added_us": hit - eager_x, "miss_added_us": miss - eager_y,
            "router": router}
