"""The provider-neutral client interface: messages in, a Completion with its accounting out.

Plain frozen data crosses this boundary so that prompts and answer parsing are written once for every
provider. Nothing here ever holds an API key: clients read it from the environment at call time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from engine.propose.base import Usage

Role = Literal["user", "assistant"]

CATEGORIES = ("rate-limit", "server", "timeout", "connection", "auth", "bad-request", "malformed")
# Transient by nature: worth another attempt. The rest fail the same way every time.
RETRYABLE = frozenset({"rate-limit", "server", "timeout", "connection"})
# stop_reason values meaning the answer hit max_tokens (Anthropic, OpenAI-compatible servers).
TRUNCATED = frozenset({"max_tokens", "length"})


@dataclass(frozen=True)
class Message:
    """One turn of the conversation (the system prompt is passed apart)."""

    role: Role
    content: str

    def __post_init__(self) -> None:
        if self.role not in ("user", "assistant"):
            raise ValueError(f"Message role must be 'user' or 'assistant', not {self.role!r}")


@dataclass(frozen=True)
class Price:
    """USD per million tokens; cache prices default to input's (OpenAI) or Anthropic's multipliers."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None


@dataclass(frozen=True)
class Completion:
    """One successful call. `usage.latency_s` is the successful attempt; `latency_total_s` the whole call."""

    text: str
    usage: Usage
    model: str                                # as the server reported it (may be a dated alias)
    stop_reason: str | None                   # 'end_turn' | 'max_tokens' | 'stop' | 'length' | …
    raw_id: str | None
    cost_known: bool = True                   # False: no price for the model, usage.cost_usd is 0
    latency_total_s: float = 0.0              # queueing, every attempt and every backoff sleep
    attempts: int = 1
    cache_read_tokens: int = 0                # already included in usage.tokens_in
    cache_write_tokens: int = 0               # already included in usage.tokens_in
    provider: str = ""                        # the provider instance name ('anthropic', 'local', …)

    @property
    def truncated(self) -> bool:
        """True when the answer stopped at max_tokens (it is probably cut mid-code)."""
        return self.stop_reason in TRUNCATED


class ProviderError(Exception):
    """A failed provider call, as one line naming provider and model; never contains the API key."""

    def __init__(self, message: str, *, category: str, retryable: bool | None = None,
                 status: int | None = None, retry_after: float | None = None, detail: str | None = None,
                 attempts: int = 1, elapsed_s: float = 0.0) -> None:
        if category not in CATEGORIES:
            raise ValueError(f"unknown ProviderError category {category!r}")
        message = " ".join(str(message).split())[:600]   # one line, bounded: server bodies can be huge
        super().__init__(message)
        self.message = message
        self.category = category
        self.retryable = category in RETRYABLE if retryable is None else retryable
        self.status = status
        self.retry_after = retry_after            # seconds the server asked us to wait, if it did
        self.detail = " ".join((detail or message).split())[:600]   # the message without its label
        self.attempts = attempts
        self.elapsed_s = elapsed_s

    def __repr__(self) -> str:
        return f"ProviderError({self.message!r}, category={self.category!r}, retryable={self.retryable})"

    def __reduce__(self) -> tuple[Any, ...]:  # keyword-only __init__: pickle needs the kwargs back
        return (_rebuild_error, (self.message, self.__dict__))


def _rebuild_error(message: str, state: dict[str, Any]) -> ProviderError:
    err = ProviderError(message, category=state["category"])
    err.__dict__.update(state)
    return err


class LLMClient(Protocol):
    """Anything that completes a conversation: the Anthropic and OpenAI-compatible clients, test fakes."""

    name: str
    model: str

    async def complete(self, system: str, messages: list[Message], *, max_tokens: int,
                       temperature: float | None = None) -> Completion:
        """One answer to `messages`; raises ProviderError (already retried where that made sense)."""
        ...


def cost_usd(price: Price | None, *, tokens_in: int, tokens_out: int, cache_read: int = 0,
             cache_write: int = 0, cache_read_factor: float = 1.0, cache_write_factor: float = 1.0) -> float:
    """Cost of one call; `tokens_in` includes the cache tokens, priced by the factors unless set."""
    if price is None:
        return 0.0
    read = price.cache_read if price.cache_read is not None else price.input * cache_read_factor
    write = price.cache_write if price.cache_write is not None else price.input * cache_write_factor
    plain = max(0, tokens_in - cache_read - cache_write)
    return (plain * price.input + cache_read * read + cache_write * write + tokens_out * price.output) / 1e6


def find_price(prices: dict[str, Price], *models: str | None) -> Price | None:
    """The price of the first model named that has one: exact name, else the longest key it starts with.

    The prefix rule prices dated aliases the server reports ('gpt-5-2025-08-07') by their family key.
    """
    for m in models:
        if m and m in prices:
            return prices[m]
    for m in models:
        if not m:
            continue
        keys = [k for k in prices if m.startswith(k)]
        if keys:
            return prices[max(keys, key=len)]
    return None


def scrub(text: str, secret: str | None) -> str:
    """`text` with every occurrence of `secret` masked (servers sometimes echo the key back)."""
    if secret and len(secret) >= 4:
        text = text.replace(secret, "***")
    return text
