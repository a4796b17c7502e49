"""The LLM proposer: prompt a chat model for a candidate, extract it, follow up once for a missing spec.

    proposer = LLMProposer(client, name="anthropic")
    proposal = await proposer.propose(request)      # never raises for provider or answer problems

`client` is anything with `async complete(system, messages, *, max_tokens, temperature=None) ->
Completion` (the provider clients in engine.propose.providers, or a test fake).
"""

from __future__ import annotations

import time
from typing import Protocol

from engine.cards import OperatorCard
from engine.propose.answer import Extracted, complete_spec, extract, kernel_names
from engine.propose.base import Proposal, ProposalRequest, Usage
from engine.propose.prompting import build_messages, followup_prompt
from engine.propose.providers.base import TRUNCATED, Completion, Message, ProviderError

__all__ = ["Completion", "LLMClient", "LLMProposer", "Message", "ProviderError", "transcript"]

# How turns are joined in Proposal.prompt / Proposal.response (what the TUI shows and the store keeps).
TURN_HEADER = "\n\n===== {label} =====\n"


class LLMClient(Protocol):
    """What LLMProposer needs of a provider client (engine.propose.providers.base.LLMClient has this shape)."""

    async def complete(self, system: str, messages: list[Message], *, max_tokens: int,
                       temperature: float | None = None) -> Completion:
        """One answer to `messages`; raises ProviderError when the provider fails."""
        ...


def transcript(turns: list[tuple[str, str]]) -> str:
    """Labelled turns joined with a clear separator: `===== label =====` then the text verbatim."""
    return "".join(TURN_HEADER.format(label=label) + text for label, text in turns).lstrip("\n")


def _add(a: Usage, b: Usage) -> Usage:
    return Usage(a.tokens_in + b.tokens_in, a.tokens_out + b.tokens_out, a.cost_usd + b.cost_usd,
                 a.latency_s + b.latency_s)


class LLMProposer:
    """A Proposer backed by a chat model. Declines nothing: every card gets a prompt."""

    repairs = True  # the orchestrator sends failed candidates back with their diagnostics

    def __init__(self, client: LLMClient, *, name: str | None = None, max_tokens: int = 8192, followups: int = 1,
                 temperature: float | None = None, followup_max_tokens: int = 2048) -> None:
        self.client = client
        self.name = name or getattr(client, "name", "") or "llm"
        self.max_tokens = max_tokens
        self.followups = followups
        self.temperature = temperature
        # A spec is a few hundred tokens; a small cap keeps a rambling follow-up cheap.
        self.followup_max_tokens = min(followup_max_tokens, max_tokens)

    def supports(self, card: OperatorCard) -> bool:
        return True

    async def propose(self, request: ProposalRequest) -> Proposal:
        system, messages = build_messages(request)
        intent = request.intent or ""
        sent: list[tuple[str, str]] = [("system", system), *(("user", m.content) for m in messages)]
        received: list[tuple[str, str]] = []
        usage = Usage()
        model = str(getattr(self.client, "model", "") or "")

        def result(ex: Extracted | None, *, category: str | None = None, reason: str = "") -> Proposal:
            category = category or (ex.category if ex else None)
            if not reason and ex is not None and ex.category is not None:
                reason = ex.reason
            return Proposal(source=(ex.source or "") if ex else "", spec=(ex.spec or "") if ex else "",
                            intent=intent, provider=self.name, model=model, usage=usage,
                            prompt=transcript(sent), response=transcript(received),
                            category=category, reason=reason)

        try:
            completion = await self._complete(system, messages, self.max_tokens)
        except Exception as e:  # the contract: provider trouble is a Proposal, never an exception
            return result(None, category="provider", reason=_error_text(e))
        usage = _add(usage, completion.usage)
        model = completion.model or model
        received.append(("assistant", completion.text))
        ex = _note_truncation(extract(completion.text), completion, self.max_tokens)

        for _ in range(max(0, self.followups)):
            if ex.category != "no-spec":
                break
            names, mangled = kernel_names(ex.source or "")
            ask = followup_prompt([*names, *mangled], ex.reason)
            messages = [*messages, Message("assistant", completion.text), Message("user", ask)]
            sent.append(("user (follow-up: launch spec)", ask))
            try:
                completion = await self._complete(system, messages, self.followup_max_tokens)
            except Exception as e:
                return result(ex, category="provider", reason=f"the follow-up for the launch spec failed: "
                                                              f"{_error_text(e)}")
            usage = _add(usage, completion.usage)
            received.append(("assistant (follow-up)", completion.text))
            ex = complete_spec(ex, completion.text)
        return result(ex)

    async def _complete(self, system: str, messages: list[Message], max_tokens: int) -> Completion:
        start = time.perf_counter()
        completion = await self.client.complete(system, list(messages), max_tokens=max_tokens,
                                                temperature=self.temperature)
        if not completion.usage.latency_s:  # a client that does not time itself: use the wall time
            u = completion.usage
            completion = _with_usage(completion, Usage(u.tokens_in, u.tokens_out, u.cost_usd,
                                                       time.perf_counter() - start))
        return completion


def _with_usage(c: Completion, usage: Usage) -> Completion:
    from dataclasses import replace

    return replace(c, usage=usage)


def _note_truncation(ex: Extracted, c: Completion, max_tokens: int) -> Extracted:
    """Say in the reason when a broken answer stopped at the token limit (raise max_tokens, not the prompt)."""
    if ex.category is None or c.stop_reason not in TRUNCATED:
        return ex
    return Extracted(ex.source, ex.spec, ex.category, f"{ex.reason} (the answer hit max_tokens={max_tokens})")


def _error_text(e: Exception) -> str:
    if isinstance(e, ProviderError):
        return f"{e.category}: {e.message}"
    return f"{type(e).__name__}: {e}"
