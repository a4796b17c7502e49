"""The whole-model check at export on a degenerate model output: a cast that zeroes the model (or makes it
NaN) is not chosen, and where eager's own output is all zeros, constant or NaN, the report and the
warnings say that the model-level agreement is no evidence, instead of reporting perfect agreement.
CPU only: the check's decisions are pure functions over the outputs; the GPU parts are stand-ins."""

from __future__ import annotations

import math

import pytest
import torch

from engine.export.e2e import choose_set, degenerate, eager_caveat, judge_output, rel_l2_err, unrepeatable


def test_degenerate_names_what_is_wrong_with_an_output():
    assert degenerate(torch.randn(4, 10)) is None
    assert degenerate(torch.zeros(3, 5)) == "all zeros"
    assert degenerate(torch.full((2, 8), 0.5)) == "constant (every element 0.5)"
    assert degenerate(torch.full((6,), -3, dtype=torch.int64)) == "constant (every element -3)"
    x = torch.randn(1000, dtype=torch.float64)
    x[[3, 70, 999]] = torch.tensor([math.nan, math.inf, -math.inf], dtype=torch.float64)
    assert degenerate(x) == "non-finite (NaN/Inf) in 3 of 1000 elements"
    assert degenerate(torch.tensor([math.nan, math.nan])) == "non-finite (NaN/Inf) in 2 of 2 elements"
    assert degenerate(torch.tensor(2.5)) is None  # one element (a scalar loss) is not "constant"
    assert degenerate(torch.zeros(1)) == "all zeros"
    assert degenerate(torch.empty(0, 4)) == "empty (no elements)"


def test_rel_l2_err_of_a_large_float16_output_does_not_overflow():
    # A float16 norm of 100,000 elements of 300 is inf; with the reference's norm inf, an output half of it
    # read as agreeing (0.0), and two outputs of 60,000 and -60,000 as differing by inf.
    big = torch.full((100_000,), 300.0, dtype=torch.float16)
    assert big.norm().isinf()
    assert rel_l2_err(big * 0.5, big) == pytest.approx(0.5)
    assert rel_l2_err(big, big.clone()) == 0.0
    far = torch.full((4,), 60_000.0, dtype=torch.float16)
    assert rel_l2_err(-far, far) == pytest.approx(2.0)


def test_rel_l2_err_never_reads_non_finite_outputs_as_agreement():
    nan = torch.tensor([math.nan, 1.0])
    assert rel_l2_err(nan, nan.clone()) == math.inf  # both NaN in the same place: not agreement
    assert rel_l2_err(torch.tensor([3.0, 4.0]), torch.tensor([math.inf, 4.0])) == math.inf
    assert rel_l2_err(nan, torch.tensor([3.0, 4.0])) == math.inf
    assert rel_l2_err(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 4.0])) == 0.0


def test_a_cast_that_breaks_the_model_is_rejected_and_a_degenerate_eager_is_no_evidence():
    good = torch.randn(2, 16, dtype=torch.float64)
    assert judge_output(good, good + 1e-6) == (True, None)
    assert judge_output(good, torch.zeros_like(good)) == (
        False, "the model's output with the cast is all zeros; eager's is not")
    assert judge_output(good, torch.full_like(good, 0.5)) == (
        False, "the model's output with the cast is constant (every element 0.5); eager's is not")
    nan = good.clone()
    nan[0, 0] = math.nan
    assert judge_output(good, nan) == (
        False, "the model's output with the cast is non-finite (NaN/Inf) in 1 of 32 elements; eager's is not")
    # Eager's own output is zeros (random weights that saturate): a cast that zeroes the model agrees with it
    # perfectly, which proves nothing; the check may still time it, but must say so.
    zeros = torch.zeros(2, 16, dtype=torch.float64)
    ok, note = judge_output(zeros, zeros.clone())
    assert ok and note == "eager's own output is all zeros: agreement of the model's output says nothing"
    ok, note = judge_output(nan, nan.clone())
    assert ok and note == ("eager's own output is non-finite (NaN/Inf) in 1 of 32 elements: agreement of the "
                           "model's output says nothing")
    # Non-finite with the cast where eager is finite (if constant) is still a broken model.
    assert judge_output(zeros, torch.full_like(zeros, math.nan)) == (
        False, "the model's output with the cast is non-finite (NaN/Inf) in 32 of 32 elements; eager's is finite "
               "(all zeros)")


def _stand_in(outputs: dict[tuple[str, ...], torch.Tensor], speedups: dict[tuple[str, ...], list[float]],
              timed: list[tuple[str, ...]]):
    """run_set for choose_set: the model's output with each set, and a timing that records it was asked."""
    def run_set(ids):
        key = tuple(ids)

        def time_it():
            timed.append(key)
            low, high = speedups[key]
            return {"speedup": (low + high) / 2, "speedup_ci": [low, high], "eager_ms": 1.0, "cast_ms": 0.9}

        return outputs[key], time_it
    return run_set


def test_the_check_skips_a_set_that_zeroes_the_model_and_keeps_the_next():
    eager = torch.randn(4, 8, dtype=torch.float64)
    sets = [["a", "b", "c"], ["a"]]
    timed: list = []
    run_set = _stand_in({("a", "b", "c"): torch.zeros_like(eager), ("a",): eager * (1 + 1e-4)},
                        {("a", "b", "c"): [1.2, 1.3], ("a",): [1.05, 1.1]}, timed)
    tried, chosen = choose_set(sets, eager, run_set)
    assert timed == [("a",)]  # the rejected set is not even timed
    assert tried[0] == {"variants": ["a", "b", "c"], "rel_l2_err": 1.0,
                        "rejected": "the model's output with the cast is all zeros; eager's is not"}
    assert chosen is tried[1] and chosen["variants"] == ["a"] and chosen["rel_l2_err"] == pytest.approx(1e-4)
    assert "output_note" not in chosen

    timed.clear()
    only_bad = _stand_in({("a", "b", "c"): torch.full_like(eager, math.nan), ("a",): torch.zeros_like(eager)},
                         {}, timed)
    tried, chosen = choose_set(sets, eager, only_bad)
    assert chosen is None and timed == [] and all(t["rejected"] for t in tried)
    assert tried[0]["rel_l2_err"] == math.inf  # NaN is never agreement


def test_the_check_times_a_set_against_a_degenerate_eager_but_says_it_proves_nothing():
    eager = torch.full((4, 8), 0.5, dtype=torch.float64)
    timed: list = []
    run_set = _stand_in({("a",): eager.clone()}, {("a",): [1.1, 1.2]}, timed)
    tried, chosen = choose_set([["a"]], eager, run_set)
    assert timed == [("a",)] and chosen["rel_l2_err"] == 0.0
    assert chosen["output_note"] == ("eager's own output is constant (every element 0.5): agreement of the "
                                     "model's output says nothing")


def _kept(n: int):
    from engine.export.package import ExportVariant

    out = []
    for i in range(n):
        card = {"card_id": f"{i:08d}cafe", "op": "aten::relu", "signature": {}, "outputs": []}
        v = ExportVariant(card, {"id": f"c{i}", "source": "", "launch_spec": ""}, None, None, "sm_90")
        v.confirmed = {"net_us": float(10 - i)}
        out.append(v)
    return out


def _model_check(monkeypatch, result):
    """package._model_check with the fresh-process check replaced by `result` (what e2e.check returned)."""
    import engine.export.package as package

    monkeypatch.setattr(package, "package", lambda *a, **k: ({}, {}, ""))
    monkeypatch.setattr(package, "write_cast", lambda *a, **k: None)
    monkeypatch.setattr(package, "run_model_check", lambda *a, **k: result)
    kept, source, excluded, warnings = _kept(2), {"model": "m"}, [], []
    left = package._model_check(kept, {}, source, excluded, "cfg.toml", False, "eager", lambda m: None,
                                warnings.append)
    return left, source, excluded, warnings


def test_export_says_a_degenerate_eager_output_is_no_evidence(monkeypatch):
    from engine.export.report import markdown_report

    chosen = {"variants": [_kept(2)[0].vid, _kept(2)[1].vid], "speedup": 1.2, "speedup_ci": [1.1, 1.3],
              "eager_ms": 2.0, "cast_ms": 1.6, "rel_l2_err": 0.0}
    left, source, excluded, warnings = _model_check(monkeypatch, {
        "mode": "eager", "tried": [chosen], "chosen": chosen, "degenerate_eager": "all zeros"})
    assert len(left) == 2 and excluded == []
    check = source["model_check"]
    assert check["degenerate_eager"] == "all zeros" and check["rel_l2_err"] == 0.0
    assert warnings == ["whole-model check: eager's own output is all zeros: agreement of the model's output says "
                        "nothing about the cast's correctness (each variant's own confirmation still holds)"]
    text = markdown_report({"format_version": 1, "env": {}, "variants": [], "source": source})
    assert ("1.200× (95% CI 1.100–1.300); eager's own output is all zeros: agreement of the model's output says "
            "nothing (a cast that broke the model could agree with it).") in text
    assert "moved by" not in text  # no perfect agreement reported


def test_export_leaves_out_the_variants_of_a_set_that_broke_the_model(monkeypatch):
    from engine.errors import JobError

    a, b = (v.vid for v in _kept(2))
    bad = {"variants": [a, b], "rel_l2_err": 1.0,
           "rejected": "the model's output with the cast is all zeros; eager's is not"}
    good = {"variants": [a], "speedup": 1.1, "speedup_ci": [1.05, 1.15], "eager_ms": 2.0, "cast_ms": 1.8,
            "rel_l2_err": 2e-4}
    left, source, excluded, warnings = _model_check(monkeypatch, {
        "mode": "eager", "tried": [bad, good], "chosen": good, "degenerate_eager": None})
    assert [v.vid for v in left] == [a] and warnings == []
    assert "degenerate_eager" not in source["model_check"]
    (why,) = excluded
    assert why["reason"] == ("whole-model check: the set with it was rejected (2 variant(s): the model's output "
                             "with the cast is all zeros; eager's is not); kept the 1 with the most net gain "
                             "(1.100x)")
    with pytest.raises(JobError) as e:
        _model_check(monkeypatch, {"mode": "eager", "tried": [bad], "chosen": None, "degenerate_eager": None})
    assert str(e.value) == ("export: no variant set passed the whole-model check of m in eager forwards (2 "
                            "variant(s): the model's output with the cast is all zeros; eager's is not); nothing "
                            "written")


def test_a_model_whose_own_forwards_disagree_cannot_vouch_for_a_cast():
    # A model that doubles its input in place (or counts its calls in a buffer) gave rel. L2 15 "against eager"
    # with no cast installed at all: the check compared two different forwards.
    torch.manual_seed(0)
    x = torch.randn(64, dtype=torch.float64)
    assert unrepeatable(x, x.clone()) is None
    assert unrepeatable(x, x + 1e-9 * x.norm()) is None   # GPU eager adding in another order
    why = unrepeatable(x, 2 * x)
    assert why.startswith("not repeatable: two of its forwards on the same inputs differ by 1.0e+00")
    assert eager_caveat(why).startswith("eager's own output is not repeatable")
    assert "not repeatable" in unrepeatable(x, torch.full_like(x, math.inf))


def test_outputs_beside_the_compared_one_are_judged_too():
    """The check compared the output's first tensor only: a cast that made a model's second output (a cache, an
    auxiliary head, the hidden states) NaN or all zeros was chosen as if the model were fine."""
    from engine.export.e2e import judge_other_outputs, output_states
    from engine.models.forwards import output_tensor, output_tensors

    logits, cache, aux = torch.randn(2, 5), torch.randn(2, 3, 4), torch.randn(2, 7)
    out = {"logits": logits, "past": (cache, None), "aux": aux, "n": 3}
    assert output_tensor(out) is logits and output_tensors(out) == [logits, cache, aux]
    eager = output_states(output_tensors(out)[1:])
    assert judge_other_outputs(eager, [cache + 1e-6, aux]) is None
    nan_cache = cache.clone()
    nan_cache[0, 0, 0] = math.nan
    assert judge_other_outputs(eager, [nan_cache, aux]) == (
        "the model's output tensor 2 (depth first) with the cast is non-finite (NaN/Inf) in 1 of 24 elements; "
        "eager's is not")
    assert judge_other_outputs(eager, [cache, torch.zeros_like(aux)]) == (
        "the model's output tensor 3 (depth first) with the cast is all zeros; eager's is not")
    assert judge_other_outputs(eager, [cache]) == "the model's output with the cast holds 2 tensors; eager's holds 3"

    # choose_set rejects a set on run_set's word about the other outputs, and says why
    first = torch.randn(4, 8, dtype=torch.float64)
    timed: list = []

    def run_set(ids):
        def time_it():
            timed.append(tuple(ids))
            return {"speedup": 1.1, "speedup_ci": [1.05, 1.15], "eager_ms": 1.0, "cast_ms": 0.9}
        facts = {"other_outputs": "the model's output tensor 2 (depth first) with the cast is all zeros; eager's is not"} \
            if len(ids) > 1 else {}
        return first.clone(), time_it, facts

    tried, chosen = choose_set([["a", "b"], ["a"]], first, run_set)
    assert tried[0]["rejected"].startswith("the model's output tensor 2") and "other_outputs" not in tried[0]
    assert chosen is tried[1] and timed == [("a",)]
