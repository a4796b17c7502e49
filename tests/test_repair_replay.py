"""LLMProposer with a scripted client, the bounded repair loop, the store's candidate/LLM-call rows, replay."""

from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from engine.cards import OperatorCard
from engine.propose.base import Attempt, Hardware, Proposal, ProposalRequest, Usage
from engine.propose.llm import Completion, LLMProposer, Message, ProviderError
from engine.propose.prompting import build_messages
from engine.propose.repair import propose_with_repair, repair_parents
from engine.propose.replay import ReplayProposer
from engine.store import Store
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


@dataclass
class ScriptedProposer:
    """Hands out scripted proposals and records the requests it got."""

    proposals: list
    name: str = "scripted"
    requests: list = field(default_factory=list)

    def supports(self, card):
        return True

    async def propose(self, request):
        self.requests.append(request)
        return self.proposals.pop(0)


def good(tag: str = "") -> Proposal:
    return Proposal(source=KERNEL + f"\n// {tag}", spec=SPEC, intent="vectorisation", provider="scripted")


def broken(tag: str = "") -> Proposal:
    return Proposal(source=KERNEL.replace("__hmax", "hmax_typo") + f"\n// {tag}", spec=SPEC,
                    intent="vectorisation", provider="scripted")


DIAG = 'candidate.cu(4): error: identifier "hmax_typo" is undefined'


def make_check(results: dict | None = None):
    """A stand-in for compile + lane: typo -> compile error, 'SLOW' -> suspicious, else verified."""
    seen = []

    async def check(p: Proposal) -> Attempt:
        seen.append(p)
        cid = f"cand-{len(seen)}"
        if "hmax_typo" in p.source:
            return Attempt(cid, p.source, p.spec, intent=p.intent, status="rejected", category="compile",
                           diagnostics=DIAG)
        if "CHEAT" in p.source:
            return Attempt(cid, p.source, p.spec, status="rejected", category="suspicious",
                           message="0.2 µs is below the 1.9 µs roofline")
        if "WRONG" in p.source:
            return Attempt(cid, p.source, p.spec, status="rejected", category="mismatch",
                           message="out0: max abs err 2.0 at [3, 7]")
        return Attempt(cid, p.source, p.spec, intent=p.intent, status="verified", best_us=9.0, speedup=1.4)

    check.seen = seen
    return check


async def test_compile_error_is_repaired_with_its_diagnostics():
    proposer = ScriptedProposer([broken("1"), good("2")])
    check = make_check()
    reported = []

    async def on_attempt(p, a, k):
        reported.append((p, a, k))

    proposal, attempt, history = await propose_with_repair(proposer, REQUEST, check=check, on_attempt=on_attempt)
    assert attempt.status == "verified" and proposal.source.endswith("// 2")
    assert len(history) == 2 and [k for *_, k in reported] == [0, 1]
    assert [a.category for _, a, _ in reported] == ["compile", None]
    repair = proposer.requests[1]
    assert repair.failed is history[0][1] and repair.attempt == 1 and repair.failed.diagnostics == DIAG
    assert repair.card is REQUEST.card and repair.parent is REQUEST.parent
    _, messages = build_messages(repair)          # the repair prompt shows the diagnostics
    assert DIAG in messages[0].content and "hmax_typo" in messages[0].content


async def test_the_loop_stops_after_max_attempts():
    proposer = ScriptedProposer([broken(str(i)) for i in range(5)])
    _, attempt, history = await propose_with_repair(proposer, REQUEST, check=make_check(), max_attempts=3)
    assert len(history) == 3 and attempt.category == "compile" and len(proposer.requests) == 3
    assert [r.attempt for r in proposer.requests] == [0, 1, 2]
    assert proposer.requests[2].failed is history[1][1]
    with pytest.raises(ValueError):
        await propose_with_repair(proposer, REQUEST, check=make_check(), max_attempts=0)


async def test_suspicious_and_provider_failures_are_not_repaired():
    cheat = replace(good(), source=KERNEL + "\n// CHEAT")
    _, attempt, history = await propose_with_repair(ScriptedProposer([cheat, good()]), REQUEST, check=make_check())
    assert len(history) == 1 and attempt.category == "suspicious"
    failed = Proposal(provider="x", category="provider", reason="auth: bad key")
    check = make_check()
    _, attempt, history = await propose_with_repair(ScriptedProposer([failed, good()]), REQUEST, check=check)
    assert len(history) == 1 and attempt.category == "provider" and attempt.status == "unusable"
    assert check.seen == []  # nothing to compile
    declined = Proposal(declined=True, reason="no template")
    _, attempt, history = await propose_with_repair(ScriptedProposer([declined]), REQUEST, check=make_check())
    assert attempt.status == "declined" and len(history) == 1


async def test_unusable_answers_are_retried_with_the_same_request_and_lineage_is_kept():
    wrong = replace(good(), source=KERNEL + "\n// WRONG")
    no_code = Proposal(provider="scripted", category="no-code", reason="no fenced CUDA code block")
    proposer = ScriptedProposer([wrong, no_code, broken("3"), good("4")])
    check = make_check()
    reported = []

    async def on_attempt(p, a, k):
        reported.append(a)

    _, attempt, history = await propose_with_repair(proposer, REQUEST, check=check, max_attempts=4,
                                                    on_attempt=on_attempt)
    assert attempt.status == "verified" and len(reported) == 4
    assert [a.category for a in reported] == ["mismatch", "no-code", "compile", None]
    assert len(check.seen) == 3  # the unusable answer was never compiled
    # Attempt 1 repairs attempt 0; attempt 2 answers the same repair request again; attempt 3 repairs 2.
    assert proposer.requests[1].failed is reported[0]
    assert proposer.requests[2] is proposer.requests[1]
    assert proposer.requests[3].failed is reported[2]
    assert repair_parents(reported) == [None, 0, 0, 2]


async def test_bad_spec_is_repaired_with_its_reason():
    bad = Proposal(source=KERNEL, spec=SPEC.replace('"relu8"', '"relu"'), provider="scripted",
                   category="bad-spec", reason="launch[0] names kernel 'relu', but the source has none")
    proposer = ScriptedProposer([bad, good()])
    _, attempt, history = await propose_with_repair(proposer, REQUEST, check=make_check())
    assert attempt.status == "verified" and proposer.requests[1].failed.category == "bad-spec"
    _, messages = build_messages(proposer.requests[1])
    assert "names kernel 'relu'" in messages[0].content


async def test_llm_proposer_in_the_repair_loop_end_to_end():
    broken_answer = FULL.replace("__hmax", "hmax_typo")
    client = FakeClient([broken_answer, FULL])
    _, attempt, history = await propose_with_repair(LLMProposer(client, name="fake"), REQUEST, check=make_check())
    assert attempt.status == "verified" and len(client.calls) == 2
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


async def test_the_engine_can_store_the_repair_lineage(store):
    """on_attempt stores each attempt with its parent: a repair's parent is the attempt it fixes."""
    run = await new_run(store)
    stored: list[str] = []
    attempts: list[Attempt] = []

    async def on_attempt(p, a, k):
        attempts.append(a)
        parent = repair_parents(attempts)[k]
        cid, _ = await store.add_candidate(run, CARD.card_id, parent_id=None if parent is None else stored[parent],
                                           source=p.source, launch_spec=p.spec, proposer=p.provider,
                                           status=a.status, category=a.category)
        stored.append(cid)

    await propose_with_repair(ScriptedProposer([broken("1"), broken("2"), good("3")]), REQUEST,
                              check=make_check(), on_attempt=on_attempt)
    rows = await store.candidates(run)
    assert [r["parent_id"] for r in rows] == [None, rows[0]["id"], rows[1]["id"]]
    assert [r["category"] for r in rows] == ["compile", "compile", None]


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
    run = await new_run(store)
    kw = dict(parent_id=None, proposer="fake", model_name="fake-model")
    await store.add_candidate(run, "card-relu", source=broken().source, launch_spec=SPEC, status="rejected",
                              category="compile", **kw)
    await store.add_candidate(run, "card-relu", source=KERNEL, launch_spec=SPEC, status="verified", **kw)
    _, attempt, history = await propose_with_repair(ReplayProposer(store, run), REQUEST, check=make_check())
    assert attempt.status == "verified" and [a.category for _, a in history] == ["compile", None]
