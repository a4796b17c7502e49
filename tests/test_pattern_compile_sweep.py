"""Pattern cards under torch.compile must not change what the compiled model computes (the pattern replacement sweep,
CPU): a model A is captured through the chain path, every chain card it has becomes a cast's pattern card whose plan
is eager's own `run_chain` (a correct replacement computes what eager does), and a model B that differs from A in one
detail (tests/pattern_compile_cases.py: a constant, operand order, a dtype, an extra reader, a view between members, a
graph break, ...) is compiled with the cast. B's outputs must equal eager's within the noise that plain torch.compile
shows, and where the difference makes A's card wrong for B, its plan must not run.

The whole sweep (every case, and every model of tests/chain_sweep_models.py compiled with its own cards) is
scripts/pattern_compile_sweep.py; the parametrized test keeps the most telling cases."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from pattern_compile_cases import CASES, Case, model

from engine.capture.chains import (
    chain_card_id,
    chain_signature,
    container_paths,
    find_chains,
    patterns,
    run_chain,
    trace_forward,
)
from engine.cast import compose
from engine.cast import patterns as chain_patterns


class Owner:
    """What compose needs of a cast that has only pattern cards: a digest (fresh, so no cached graph is served)."""

    def __init__(self) -> None:
        self.digest = f"sweep-{uuid.uuid4().hex}"


class Counting:
    """Eager's own chain as the card's plan, counting its calls."""

    def __init__(self, signature: dict[str, Any]):
        self.calls, self.signature = 0, signature

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        self.calls += 1
        return run_chain(self.signature, inputs)


def chain_signatures(m: torch.nn.Module, inputs: tuple) -> list[dict[str, Any]]:
    """The chain cards' signatures of `m` on `inputs`, found as the capture finds them (one per card id)."""
    with torch.no_grad():
        trace = trace_forward(m, lambda: m(*inputs), time_calls=False)
    sigs = [chain_signature(p.instances[0]) for p in patterns(find_chains(trace.calls, container_paths(m),
                                                                          unknown=trace.unknown))]
    return list({chain_card_id(s): s for s in sigs}.values())


def _flat(out: Any) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else [t for o in out for t in _flat(o)]


@dataclass
class Outcome:
    cards: int = 0
    plan_calls: int = 0
    matches: int = 0
    problems: list[str] = field(default_factory=list)
    declined: list[str] = field(default_factory=list)  # cards not made patterns (in-place members, ...): why


def _differs(got: torch.Tensor, want: torch.Tensor, noise: float) -> str | None:
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{got.dtype}{list(got.shape)} where eager gives {want.dtype}{list(want.shape)}"
    if not got.is_floating_point():
        return None if torch.equal(got, want) else f"{int((got != want).sum())} of {got.numel()} elements differ"
    if not torch.equal(torch.signbit(got) & torch.isinf(got), torch.signbit(want) & torch.isinf(want)) or \
            not torch.equal(torch.isnan(got), torch.isnan(want)):
        return "infinities or NaNs differ"
    fin = torch.isfinite(want)
    err = (got.double() - want.double()).abs()[fin].max().item() if fin.any() else 0.0
    scale = want.double().abs()[fin].max().item() if fin.any() else 1.0
    tol = max(8 * noise, 4 * torch.finfo(want.dtype).eps * max(scale, 1.0))
    return None if err <= tol else f"max error {err:.3g}, eager vs torch.compile {noise:.3g}"


def compile_and_compare(cards: list[dict[str, Any]], b: torch.nn.Module, runs: list[tuple], dynamic: bool | None,
                        plain: bool = True) -> Outcome:
    """Compile `b` with a cast holding `cards` (plans: eager's chain) and, with `plain`, with torch.compile alone; run
    it on each input set of `runs`; every output must match eager's within plain compile's noise."""
    out = Outcome(cards=len(cards))
    plans = [Counting(s) for s in cards]
    backend = compose.backend(Owner(), patterns=list(zip(cards, plans)))
    out.declined += list(backend.pattern_problems.values())
    with torch.no_grad():
        wants = [_flat(b(*_fresh(inputs))) for inputs in runs]
        noise = [0.0] * len(runs)
        if plain:
            torch._dynamo.reset()
            fast = torch.compile(b, dynamic=dynamic)
            for i, inputs in enumerate(runs):
                noise[i] = max((_err(g, w) for g, w in zip(_flat(fast(*_fresh(inputs))), wants[i])), default=0.0)
        torch._dynamo.reset()
        fast = torch.compile(b, backend=backend, dynamic=dynamic)
        for i, inputs in enumerate(runs):
            gots = _flat(fast(*_fresh(inputs)))
            if len(gots) != len(wants[i]):
                out.problems.append(f"run {i}: {len(gots)} outputs, eager has {len(wants[i])}")
                continue
            for k, (g, w) in enumerate(zip(gots, wants[i])):
                if (why := _differs(g, w, noise[i])) is not None:
                    out.problems.append(f"run {i} output {k}: {why}")
    torch._dynamo.reset()
    out.plan_calls = sum(p.calls for p in plans)
    out.matches = sum(sum(m.values()) for m in backend.pattern_matches)
    chain_patterns.remove_owner(backend.cast)
    return out


def _fresh(inputs: tuple) -> tuple:
    """A copy of the inputs for each run: a model may write them in place."""
    return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in inputs)


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    if got.shape != want.shape or not got.is_floating_point() or got.dtype != want.dtype:
        return 0.0
    fin = torch.isfinite(want) & torch.isfinite(got)
    return (got.double() - want.double()).abs()[fin].max().item() if fin.any() else 0.0


def sweep_case(name: str, plain: bool = True) -> Outcome:
    """Capture A's cards, compile B with them, and say what went wrong (values, or a replacement that fired where
    the case says it must not, or did not where it must)."""
    case: Case = CASES[name]
    a, a_in = model(case.a, case)
    cards = chain_signatures(a, a_in)
    b, b_in = model(case.b, case, dtype=case.b_dtype)
    runs = [b_in] + ([model(case.b, case, shape=case.b_shape, seed=1, dtype=case.b_dtype)[1]] if case.b_shape else [])
    out = compile_and_compare(cards, b, runs, case.dynamic, plain)
    if not cards:
        out.problems.append("A has no chain card")
    if case.fire == "no" and out.plan_calls:
        out.problems.append(f"A's card ran {out.plan_calls} time(s) in B, which it does not compute")
    if case.fire == "yes" and not out.plan_calls:
        out.problems.append("A's card never ran in A compiled")
    return out


def sweep_model(name: str, seed: int = 0, dynamic: bool | None = False, plain: bool = True) -> Outcome:
    """A model of tests/chain_sweep_models.py compiled with a cast of its own chain cards: the replacements must
    compute what eager does."""
    from chain_sweep_models import build

    m, inputs = build("cpu", None, name, seed)
    m.eval()
    cards = chain_signatures(m, inputs)
    return compile_and_compare(cards, m, [inputs], dynamic, plain)


TESTED = ["same rms", "same gn+silu", "rms eps", "group count", "keepdim", "sub order", "extra reader of an intermediate",
          "transpose between members", "graph break inside", "twice with shared inputs", "bf16 model, fp32 card",
          "dynamic pointwise, other size"]


@pytest.fixture(autouse=True)
def _own_inductor_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


@pytest.mark.parametrize("name", TESTED)
def test_a_pattern_card_never_changes_what_the_compiled_model_computes(name):
    out = sweep_case(name, plain=False)
    assert not out.problems, "\n".join(out.problems)


@pytest.mark.parametrize("name", ["int scalar vs float scalar on ints", "float scalar vs int scalar on ints",
                                  "int pow exponent", "negative zero"])
def test_a_literal_matches_only_one_of_its_own_type_and_bits(name):
    # Inductor's matcher compares a pattern's constants with `!=`: 3 == 3.0 and -0.0 == 0.0. A card proven for
    # `(x * 3 + 1) % 5` on int64 replaced `(x * 3.0 + 1) % 5` in the compiled graph: the model returned int64 where
    # eager returns float32 (and the reverse); one proven for `1 / (relu(x) * 0.0)` turned B's -inf into +inf.
    out = sweep_case(name, plain=False)
    assert not out.problems and out.plan_calls == 0, "\n".join(out.problems)


def test_a_hit_returns_the_strides_the_compiled_graph_was_promised():
    # GroupNorm -> SiLU on a channels-last CPU model: the card's variant (eager's chain) returns a channels-last
    # output, as eager does, while the op's fake implementation (PyTorch's meta kernel) promised a contiguous one:
    # the compiled model raised "expected ... stride 1==16 at dim=1" from the op's first call.
    out = sweep_model("groupnorm+silu fp32 channels-last", plain=False)
    assert not out.problems and out.plan_calls == 2, "\n".join(out.problems)


@pytest.mark.parametrize("name", ["sum dtype", "cumsum dtype"])
def test_a_keyword_argument_the_pattern_lacks_must_be_at_its_default(name):
    # Inductor's matcher compares only the keyword arguments its pattern has: the card of `x.sum(-1)` replaced
    # `x.sum(-1, dtype=torch.float64)` (and cumsum's), and the compiled model returned float32 where eager gives
    # float64.
    out = sweep_case(name, plain=False)
    assert not out.problems and out.plan_calls == 0, "\n".join(out.problems)
