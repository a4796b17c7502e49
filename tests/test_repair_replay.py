"""LLMProposer with a scripted client, the bounded repair loop as the orchestrator runs it, the store's
candidate/LLM-call rows, replay."""

import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from engine.cards import OperatorCard
from engine.lane.evaluate import Evaluation
from engine.propose.base import Hardware, Proposal, ProposalRequest, Usage
from engine.propose.llm import Completion, LLMProposer, Message, ProviderError
from engine.propose.prompting import build_messages
from engine.propose.repair import MAX_ATTEMPTS
from engine.propose.replay import ReplayProposer
from engine.run.orchestrator import Budgets, NullRecorder, Orchestrator
from engine.run.plan import CardState
from engine.run.store_recorder import StoreRecorder
from engine.store import Store, new_id
from engine.store.store import candidate_hash

KERNEL = '''#include <cuda_fp16.h>
extern "C" __global__ void relu8(__half* __restrict__ x, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __hmax(x[i], __float2half(0.f));
}'''
SPEC = '''[[launch]]
kernel = "relu8"
grid = ["ceil_div(self.numel, 256)"]
block = [256]
args = [{ ptr = "self" }, { i64 = "self.numel" }]'''
FULL = f"Here you go.\n```cuda\n{KERNEL}\n```\n```toml\n{SPEC}\n```\n"
NO_SPEC = f"Here is the kernel:\n```cuda\n{KERNEL}\n```\nLaunch it with 256 threads."
SPEC_ONLY = f"```toml\n{SPEC}\n```"

CARD = OperatorCard(
    "card-relu", "aten::relu_",
    {"op": "aten::relu_", "aliases": [], "args": [
        {"name": "self", "kind": "tensor", "dtype": "float16", "shape": [32, 64], "stride": [64, 1], "align": 16,
         "device": "cuda", "neg": False, "conj": False}]},
    "f16[32,64]",
    [{"kind": "tensor", "dtype": "float16", "shape": [32, 64], "stride": [64, 1], "align": 16}],
    calls=3, bytes=8192,
)
REQUEST = ProposalRequest(CARD, Hardware())


@dataclass
class FakeClient:
    """Answers from a script (a str, or an exception to raise); records every call."""

    script: list
    name: str = "fake"
    model: str = "fake-model"
    calls: list = field(default_factory=list)

    async def complete(self, system, messages, *, max_tokens, temperature=None):
        self.calls.append({"system": system, "messages": list(messages), "max_tokens": max_tokens})
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        text, stop = item if isinstance(item, tuple) else (item, "end_turn")
        return Completion(text=text, usage=Usage(100, 50, 0.01, 0.5), model="fake-model-2025",
                          stop_reason=stop, raw_id=f"id{len(self.calls)}")


# ------------------------------------------------------------------------------------------ LLMProposer


async def test_complete_answer_in_one_call():
    client = FakeClient([FULL])
    p = await LLMProposer(client, name="fake").propose(REQUEST)
    assert p.ok and p.source == KERNEL and p.spec == SPEC
    assert p.provider == "fake" and p.model == "fake-model-2025"
    assert p.usage == Usage(100, 50, 0.01, 0.5)
    assert len(client.calls) == 1 and client.calls[0]["max_tokens"] == 8192
    system, messages = build_messages(REQUEST)
    assert client.calls[0]["system"] == system and client.calls[0]["messages"] == messages
    assert system in p.prompt and messages[0].content in p.prompt
    assert FULL in p.response


async def test_missing_spec_gets_one_targeted_follow_up_and_is_merged():
    client = FakeClient([NO_SPEC, SPEC_ONLY])
    p = await LLMProposer(client, name="fake").propose(REQUEST)
    assert p.ok, p
    assert p.source == KERNEL and p.spec == SPEC
    assert len(client.calls) == 2
    follow = client.calls[1]["messages"]
    assert [m.role for m in follow] == ["user", "assistant", "user"]
    assert follow[1] == Message("assistant", NO_SPEC)
    assert "`relu8`" in follow[2].content and "only the TOML launch spec" in follow[2].content
    assert client.calls[1]["max_tokens"] == 2048
    # Accounting and transcripts cover both calls.
    assert p.usage == Usage(200, 100, 0.02, 1.0)
    assert NO_SPEC in p.response and SPEC_ONLY in p.response and "===== assistant (follow-up) =====" in p.response
    assert follow[2].content in p.prompt


async def test_follow_up_happens_once_only():
    client = FakeClient([NO_SPEC, "I cannot produce the spec.", FULL])
    p = await LLMProposer(client).propose(REQUEST)
    assert p.category == "no-spec" and len(client.calls) == 2 and p.source == KERNEL
    assert p.provider == "fake"  # the client's name when none is given
    client = FakeClient([NO_SPEC])
    p = await LLMProposer(client, followups=0).propose(REQUEST)
    assert p.category == "no-spec" and len(client.calls) == 1


async def test_provider_errors_become_proposals():
    err = ProviderError("anthropic claude-x: HTTP 529 overloaded", category="server")
    p = await LLMProposer(FakeClient([err]), name="anthropic").propose(REQUEST)
    assert p.category == "provider" and not p.ok and "overloaded" in p.reason and "server" in p.reason
    assert p.prompt and p.response == "" and p.usage == Usage()
    p = await LLMProposer(FakeClient([RuntimeError("socket closed")])).propose(REQUEST)
    assert p.category == "provider" and "RuntimeError: socket closed" in p.reason
    # A failing follow-up keeps what the first call produced and cost.
    p = await LLMProposer(FakeClient([NO_SPEC, err])).propose(REQUEST)
    assert p.category == "provider" and "follow-up" in p.reason and p.source == KERNEL
    assert p.usage.tokens_in == 100


async def test_unusable_answers_are_categorised_and_truncation_is_noted():
    p = await LLMProposer(FakeClient([("```cuda\n" + KERNEL[:80], "max_tokens")])).propose(REQUEST)
    assert p.category == "truncated" and "max_tokens=8192" in p.reason
    p = await LLMProposer(FakeClient(["```python\nimport triton\n```"])).propose(REQUEST)
    assert p.category == "not-cuda"
    p = await LLMProposer(FakeClient([""])).propose(REQUEST)
    assert p.category == "empty"


async def test_every_card_is_supported():
    assert LLMProposer(FakeClient([])).supports(CARD)


# ------------------------------------------------------------------------------------------ repair loop
# The loop the engine runs: the orchestrator with a scripted proposer and a stand-in for compile + lane.


@dataclass
class ScriptedProposer:
    """Hands out scripted proposals (then declines) and records the requests it got; it repairs, as LLMs do."""

    proposals: list
    name: str = "scripted"
    repairs: bool = True
    requests: list = field(default_factory=list)

    def supports(self, card):
        return True

    async def propose(self, request):
        self.requests.append(request)
        if not self.proposals:
            return Proposal(declined=True, reason="script done")
        return self.proposals.pop(0)


def good(tag: str = "") -> Proposal:
    return Proposal(source=KERNEL + f"\n// {tag}", spec=SPEC, intent="vectorisation", provider="scripted")


def broken(tag: str = "") -> Proposal:
    return Proposal(source=KERNEL.replace("__hmax", "hmax_typo") + f"\n// {tag}", spec=SPEC,
                    intent="vectorisation", provider="scripted")


DIAG = 'candidate.cu(4): error: identifier "hmax_typo" is undefined'


class Check:
    """A stand-in for compile + lane: typo -> compile error, CHEAT -> suspicious, WRONG -> mismatch, else
    verified. Records what it was asked to evaluate."""

    def __init__(self):
        self.seen: list[Proposal] = []

    async def __call__(self, card, p: Proposal) -> Evaluation:
        self.seen.append(p)
        if "hmax_typo" in p.source:
            return Evaluation("rejected", "compile", DIAG, 0.0)
        if "CHEAT" in p.source:
            return Evaluation("rejected", "suspicious", "0.2 µs is below the 1.9 µs roofline", 0.0)
        if "WRONG" in p.source:
            return Evaluation("rejected", "mismatch", "out0: max abs err 2.0 at [3, 7]", 0.0)
        return Evaluation("verified", None, "", 0.0, payload={"timing": {
            "eager": {"median": 20.0}, "candidate": {"median": 9.0}, "speedup": 20.0 / 9.0,
            "speedup_ci": [2.0, 2.4]}})


async def search(proposer, *, iterations: int, check: Check | None = None, store: Store | None = None,
                 run: str | None = None, **kw) -> Orchestrator:
    """One card searched one proposal at a time (so the script's order is the order of the calls)."""
    ids = (f"c{i}" for i in itertools.count())
    recorder = StoreRecorder(store, run) if store is not None else NullRecorder()
    o = Orchestrator(cards=[CardState(replace(CARD, share=0.5, eager_us=20.0), ["s0"])], proposer=proposer,
                     evaluate=check or Check(), recorder=recorder,
                     new_id=(lambda: new_id("cand")) if store is not None else (lambda: next(ids)),
                     budgets=Budgets(iterations_per_card=iterations), max_proposals=1, poll_s=0.005, **kw)
    if store is not None:
        recorder.orchestrator = o
    await o.run()
    return o


def records(o: Orchestrator) -> list:
    return list(o.records.values())


async def test_compile_error_is_repaired_with_its_diagnostics():
    proposer = ScriptedProposer([broken("1"), good("2")])
    o = await search(proposer, iterations=2)
    first, fixed = records(o)
    assert (first.category, fixed.status) == ("compile", "verified") and fixed.proposal.source.endswith("// 2")
    assert fixed.parent_id == first.id  # the repair is the failure's child: lineage is kept
    repair = proposer.requests[1]
    assert repair.failed.candidate_id == first.id and repair.attempt == 1 and DIAG in repair.failed.message
    assert repair.card == proposer.requests[0].card and repair.parent is None  # still the node's request
    _, messages = build_messages(repair)          # the repair prompt shows the diagnostics
    assert DIAG in messages[0].content and "hmax_typo" in messages[0].content


async def test_the_loop_stops_after_max_attempts():
    proposer = ScriptedProposer([broken(str(i)) for i in range(5)])
    o = await search(proposer, iterations=4)
    assert MAX_ATTEMPTS == 3
    # Three attempts for the first request (the first and two repairs), then a new request from the root.
    assert [r.attempt for r in proposer.requests] == [0, 1, 2, 0]
    recs = records(o)
    assert proposer.requests[2].failed.candidate_id == recs[1].id and proposer.requests[3].failed is None
    assert [r.parent_id for r in recs] == [None, recs[0].id, recs[1].id, None]


async def test_suspicious_and_provider_failures_are_not_repaired():
    cheat = replace(good(), source=KERNEL + "\n// CHEAT")
    proposer = ScriptedProposer([cheat, good()])
    o = await search(proposer, iterations=2)
    assert [r.category for r in records(o)] == ["suspicious", None]
    assert proposer.requests[1].failed is None and records(o)[1].parent_id is None  # a fresh start, no repair
    failed = Proposal(provider="x", category="provider", reason="auth: bad key")
    check = Check()
    proposer = ScriptedProposer([failed, good()])
    o = await search(proposer, iterations=2, check=check)
    assert [r.category for r in records(o)] == ["provider", None] and proposer.requests[1].failed is None
    assert len(check.seen) == 1  # the provider failure had nothing to compile
    proposer = ScriptedProposer([Proposal(declined=True, reason="no template")])
    o = await search(proposer, iterations=2)
    assert not o.records and len(proposer.requests) == 1 and o.cards[CARD.card_id].done_reason == "declined"


async def test_unusable_answers_are_retried_with_the_same_request_and_lineage_is_kept():
    wrong = replace(good(), source=KERNEL + "\n// WRONG")
    no_code = Proposal(provider="scripted", category="no-code", reason="no fenced CUDA code block")
    proposer = ScriptedProposer([wrong, no_code, broken("3"), good("4")])
    check = Check()
    o = await search(proposer, iterations=4, check=check, max_attempts=4)
    recs = records(o)
    assert [r.category for r in recs] == ["mismatch", "no-code", "compile", None]
    assert len(check.seen) == 3  # the unusable answer was never compiled
    # Attempt 1 repairs attempt 0; attempt 2 answers the same repair request again; attempt 3 repairs 2.
    assert proposer.requests[1].failed.candidate_id == recs[0].id
    assert proposer.requests[2] is proposer.requests[1]
    assert proposer.requests[3].failed.candidate_id == recs[2].id
    assert [r.parent_id for r in recs] == [None, recs[0].id, recs[0].id, recs[2].id]


async def test_proposers_that_do_not_repair_get_one_attempt_per_request():
    proposer = ScriptedProposer([broken("1"), good("2")], repairs=False)
    o = await search(proposer, iterations=2)
    assert [r.failed for r in proposer.requests] == [None, None]
    assert [r.parent_id for r in records(o)] == [None, None]


async def test_bad_spec_is_repaired_with_its_reason():
    bad = Proposal(source=KERNEL, spec=SPEC.replace('"relu8"', '"relu"'), provider="scripted",
                   category="bad-spec", reason="launch[0] names kernel 'relu', but the source has none")
    proposer = ScriptedProposer([bad, good()])
    o = await search(proposer, iterations=2)
    assert records(o)[-1].status == "verified" and proposer.requests[1].failed.category == "bad-spec"
    _, messages = build_messages(proposer.requests[1])
    assert "names kernel 'relu'" in messages[0].content


async def test_llm_proposer_in_the_repair_loop_end_to_end():
    broken_answer = FULL.replace("__hmax", "hmax_typo")
    client = FakeClient([broken_answer, FULL])
    o = await search(LLMProposer(client, name="fake"), iterations=2)
    assert records(o)[-1].status == "verified" and len(client.calls) == 2
    assert DIAG in client.calls[1]["messages"][0].content


# ------------------------------------------------------------------------------------------------ store


@pytest.fixture
async def store(tmp_path: Path):
    async with await Store.open(tmp_path / "kforge.db") as s:
        yield s


async def new_run(store: Store, capture: str = "cap-1") -> str:
    if await store.get_capture(capture) is None:
        await store.save_capture({"id": capture, "model": "m", "device": "cuda:0", "dtype": "float16"}, [], [])
    return (await store.create_run(capture, "m", "fake"))["id"]


async def test_llm_calls_round_trip(store):
    run = await new_run(store)
    a = await store.add_llm_call(run, "card-a", "anthropic", "claude-x", "PROMPT", "RESPONSE", 100, 50, 0.01, 1.5)
    b = await store.add_llm_call(run, "card-b", "anthropic", "claude-x", "P2", None, 10, 0, 0.0, 0.1,
                                 error="server: overloaded")
    rows = await store.llm_calls(run)
    assert [r["id"] for r in rows] == [a, b] and a.startswith("llm-")
    assert rows[0]["prompt"] == "PROMPT" and rows[0]["response"] == "RESPONSE" and rows[0]["tokens_in"] == 100
    assert rows[1]["error"] == "server: overloaded" and rows[1]["response"] is None
    assert [r["id"] for r in await store.llm_calls(run, "card-b")] == [b]
    assert (await store.get_llm_call(a))["cost_usd"] == 0.01
    assert await store.get_llm_call("llm-missing") is None


async def test_candidates_round_trip_dedupe_and_update(store):
    run = await new_run(store)
    kw = dict(parent_id=None, proposer="fake", model_name="m1", llm_call_id=None, status="proposed")
    cid, created = await store.add_candidate(run, "card-a", source=KERNEL, launch_spec=SPEC, **kw)
    assert created and cid.startswith("cand-")
    # Whitespace changes are the same candidate: the existing id comes back, nothing is inserted.
    reformatted = KERNEL.replace("  ", "    ").replace("\n", "\n\n")
    again, created = await store.add_candidate(run, "card-a", source=reformatted, launch_spec=SPEC + "\n", **kw)
    assert (again, created) == (cid, False)
    assert candidate_hash(KERNEL, SPEC) == candidate_hash(reformatted, SPEC + "\n")
    # Another spec, another card or another run is a new candidate.
    other, created = await store.add_candidate(run, "card-a", source=KERNEL, launch_spec=SPEC.replace("256]", "128]"),
                                               **{**kw, "parent_id": cid})
    assert created and other != cid
    b, _ = await store.add_candidate(run, "card-b", source=KERNEL, launch_spec={"launch": []}, **kw)
    run2 = await new_run(store)
    _, created = await store.add_candidate(run2, "card-a", source=KERNEL, launch_spec=SPEC, **kw)
    assert created
    # Unusable answers (no source) are all kept.
    u1, c1 = await store.add_candidate(run, "card-a", source="", launch_spec=None, **{**kw, "status": "unusable"})
    u2, c2 = await store.add_candidate(run, "card-a", source="", launch_spec=None, **{**kw, "status": "unusable"})
    assert c1 and c2 and u1 != u2

    rows = await store.candidates(run, "card-a")
    assert [r["id"] for r in rows] == [cid, other, u1, u2]
    assert rows[0]["launch_spec"] == SPEC and rows[1]["parent_id"] == cid and rows[2]["launch_spec"] == {}
    assert [r["id"] for r in await store.candidates(run)] == [cid, other, b, u1, u2]
    assert (await store.get_candidate(b))["launch_spec"] == {"launch": []}

    await store.update_candidate(cid, status="verified", best_us=9.5, speedup=1.3,
                                 verification={"ok": True, "samples": 3}, timing={"median_us": 9.5})
    row = await store.get_candidate(cid)
    assert row["status"] == "verified" and row["verification"] == {"ok": True, "samples": 3}
    assert row["timing"] == {"median_us": 9.5} and row["updated_at"] >= row["created_at"]
    with pytest.raises(ValueError, match="source"):
        await store.update_candidate(cid, source="x")
    with pytest.raises(KeyError):
        await store.update_candidate("cand-missing", status="verified")


async def test_the_engine_stores_the_repair_lineage(store):
    """Each attempt is stored with its parent: a repair's parent is the attempt it fixes."""
    run = await new_run(store)
    await search(ScriptedProposer([broken("1"), broken("2"), good("3")]), iterations=3, store=store, run=run)
    rows = await store.candidates(run)
    assert [r["parent_id"] for r in rows] == [None, rows[0]["id"], rows[1]["id"]]
    assert [r["category"] for r in rows] == ["compile", "compile", None]
    assert [r["focus"] for r in rows] == [None, None, None]  # repairs keep the fresh kernel's (no) focus


# ----------------------------------------------------------------------------------------------- replay


async def test_replay_serves_recorded_answers_in_order_and_then_declines(store):
    run = await new_run(store)
    call = await store.add_llm_call(run, "card-relu", "fake", "fake-model", "THE PROMPT", FULL, 1, 2, 0.5, 1.0)
    kw = dict(parent_id=None, proposer="fake", model_name="fake-model")
    await store.add_candidate(run, "card-relu", source=KERNEL, launch_spec=SPEC, llm_call_id=call, status="verified",
                              **kw)
    await store.add_candidate(run, "card-other", source=KERNEL + "//o", launch_spec=SPEC, status="rejected", **kw)
    await store.add_candidate(run, "card-relu", source="", launch_spec=None, status="unusable", category="no-code",
                              error="no fenced CUDA code block", **kw)
    await store.add_candidate(run, "card-relu", source=KERNEL + "//3", launch_spec=SPEC, status="rejected",
                              category="mismatch", **kw)

    async def serve_all(replay):
        return [await replay.propose(REQUEST) for _ in range(4)]

    first = await serve_all(ReplayProposer(store, run))
    assert first[0].source == KERNEL and first[0].spec == SPEC and first[0].ok
    assert first[0].prompt == "THE PROMPT" and first[0].response == FULL and first[0].model == "fake-model"
    assert first[0].provider == "replay" and first[0].usage == Usage()
    assert first[1].category == "no-code" and first[1].reason == "no fenced CUDA code block" and not first[1].ok
    assert first[2].source == KERNEL + "//3" and first[2].ok
    assert first[3].declined and "3 answer(s), all served" in first[3].reason
    # Deterministic: a second replay serves exactly the same.
    assert await serve_all(ReplayProposer(store, run)) == first
    # Cards are independent; a card with no recordings is declined.
    other = ReplayProposer(store, run)
    o = await other.propose(replace(REQUEST, card=replace(CARD, card_id="card-other")))
    assert o.source == KERNEL + "//o"
    none = await other.propose(replace(REQUEST, card=replace(CARD, card_id="card-new")))
    assert none.declined and "no answers" in none.reason


async def test_replay_drives_the_repair_loop_like_the_original_run(store):
    recorded = await new_run(store)
    no_code = Proposal(provider="scripted", category="no-code", reason="no fenced CUDA code block")
    await search(ScriptedProposer([broken("1"), no_code, good("3")]), iterations=3, store=store, run=recorded)
    replayed = await new_run(store)
    replay = ReplayProposer(store, recorded)
    await search(replay, iterations=3, store=store, run=replayed)
    assert replay.repairs  # the recorded run repaired, so the replay takes repair requests too

    def shape(rows):
        index = {r["id"]: i for i, r in enumerate(rows)}
        return [(r["source"], r["status"], r["category"], r["error"], index.get(r["parent_id"])) for r in rows]

    before, after = await store.candidates(recorded), await store.candidates(replayed)
    assert shape(after) == shape(before)
    assert [r["category"] for r in after] == ["compile", "no-code", None] and shape(after)[2][-1] == 0
    assert {r["proposer"] for r in after} == {"replay"}


async def test_a_resumed_replay_serves_only_what_its_run_lacks(store):
    recorded = await new_run(store)
    kw = dict(parent_id=None, proposer="fake", model_name="fake-model")
    unusable = dict(source="", launch_spec=None, status="rejected", category="no-code",
                    error="no fenced CUDA code block")
    await store.add_candidate(recorded, "card-relu", **unusable, **kw)
    await store.add_candidate(recorded, "card-relu", source=KERNEL, launch_spec=SPEC, status="verified", **kw)
    await store.add_candidate(recorded, "card-relu", source=KERNEL + "//3", launch_spec=SPEC, status="verified", **kw)
    # The killed session stored the unusable answer and the third; the second was still in flight.
    replayed = await new_run(store)
    await store.add_candidate(replayed, "card-relu", **unusable, parent_id=None, proposer="replay")
    await store.add_candidate(replayed, "card-relu", source=KERNEL + "//3", launch_spec=SPEC, status="verified",
                              parent_id=None, proposer="replay")
    replay = ReplayProposer(store, recorded, resumed_run=replayed)
    first = await replay.propose(REQUEST)
    assert first.ok and first.source == KERNEL
    assert (await replay.propose(REQUEST)).declined
