"""Retries, rate limiting and the attempt loop every SDK client shares.

The SDKs' own retries are switched off (max_retries=0) so that these are the only ones: one policy,
one time budget, one clear message when we give up, and fake sleep/clock/rng in tests.
"""

from __future__ import annotations

import asyncio
import email.utils
import http
import json
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from engine.errors import UsageError
from engine.propose.base import Usage
from engine.propose.providers.base import (
    RETRYABLE,
    Completion,
    Message,
    Price,
    ProviderError,
    cost_usd,
    find_price,
    scrub,
)

log = logging.getLogger("engine.propose.providers")

T = TypeVar("T")

# Extra time past an attempt's timeout before we cancel it ourselves: httpx's timeouts are per phase
# (connect, each read), so a server that drips bytes could otherwise outlive the attempt budget.
_GRACE_S = 0.5
_STATUS_WORDS = {429: "rate limited", 529: "overloaded", 500: "server error", 408: "request timeout",
                 401: "authentication failed", 403: "permission denied", 402: "payment required"}


@dataclass(frozen=True)
class RetryPolicy:
    """When to try again: capped exponential backoff with full jitter, within a total time budget."""

    max_attempts: int = 5
    base_delay: float = 0.5
    max_delay: float = 30.0
    total_timeout: float = 120.0
    min_attempt_s: float = 0.25      # less budget than this left: give up rather than start a doomed try
    jitter: Literal["full", "none"] = "full"
    sleep: Callable[[float], Awaitable[Any]] = field(default=asyncio.sleep, repr=False, compare=False)
    rng: Callable[[], float] = field(default=random.random, repr=False, compare=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)

    def backoff(self, attempt: int) -> float:
        """Delay after failed attempt `attempt` (1-based): uniform in [0, min(max_delay, base·2^(n-1))]."""
        # Full jitter (AWS architecture blog) spreads parallel agents that failed together.
        cap = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
        return cap if self.jitter == "none" else self.rng() * cap


class RateLimiter:
    """Per-provider concurrency limit plus a requests-per-minute token bucket (burst 1 by default)."""

    def __init__(self, concurrency: int | None = None, requests_per_minute: float | None = None, *,
                 burst: int = 1, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.concurrency = concurrency if concurrency and concurrency > 0 else None
        self.requests_per_minute = requests_per_minute if requests_per_minute and requests_per_minute > 0 else None
        self.burst = max(1, burst)
        self._sleep, self._clock = sleep, clock
        self._tokens = float(self.burst)
        self._last = clock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sem: asyncio.Semaphore | None = None
        self._lock: asyncio.Lock | None = None
        self.in_flight = 0
        self.max_in_flight = 0

    def __repr__(self) -> str:
        return f"RateLimiter(concurrency={self.concurrency}, requests_per_minute={self.requests_per_minute})"

    def __getstate__(self) -> dict[str, Any]:
        # asyncio primitives belong to one loop and cannot be pickled; the copy makes its own.
        return {**self.__dict__, "_loop": None, "_sem": None, "_lock": None, "in_flight": 0}

    def _primitives(self) -> tuple[asyncio.Semaphore | None, asyncio.Lock]:
        # asyncio primitives bind to the loop that first waits on them; a client reused under a new
        # asyncio.run() (the CLI, per-test loops) gets fresh ones instead of a RuntimeError.
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._lock is None:
            self._loop = loop
            self._sem = asyncio.Semaphore(self.concurrency) if self.concurrency else None
            self._lock = asyncio.Lock()
        return self._sem, self._lock

    async def _take_token(self, lock: asyncio.Lock) -> None:
        if self.requests_per_minute is None:
            return
        rate = self.requests_per_minute / 60.0
        async with lock:                  # FIFO: waiters are served in arrival order
            while True:
                now = self._clock()
                self._tokens = min(float(self.burst), self._tokens + (now - self._last) * rate)
                self._last = now
                if self._tokens >= 1.0:
                    self._tokens -= 1.0
                    return
                await self._sleep((1.0 - self._tokens) / rate)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[float]:
        """Hold one request slot; yields the seconds spent waiting for it."""
        sem, lock = self._primitives()
        t0 = self._clock()
        if sem is not None:
            await sem.acquire()
        try:
            # Slot first, then token: a token taken while queued for a slot would be spent in a burst.
            await self._take_token(lock)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            waited = self._clock() - t0
            try:
                yield waited
            finally:
                self.in_flight -= 1
        finally:
            if sem is not None:
                sem.release()


@asynccontextmanager
async def _no_limit() -> AsyncIterator[float]:
    yield 0.0


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if headers is None:
        return None
    value = headers.get(name)
    if value is None and not hasattr(headers, "multi_items"):   # plain dicts are case-sensitive
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    return value


def parse_retry_after(headers: Mapping[str, str] | None, *, now: Callable[[], float] = time.time) -> float | None:
    """Seconds the server asked us to wait: `retry-after-ms`, else `retry-after` (seconds or HTTP date)."""
    ms = _header(headers, "retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = _header(headers, "retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now())


def api_message(body: object) -> str | None:
    """The human message of an error body: `{"error": {"message"}}` (Anthropic, OpenAI) or `{"message"}` (vLLM)."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(err, str):
            return err
        if isinstance(body.get("message"), str):
            return body["message"]
    if isinstance(body, str) and body.strip():
        return body.strip()
    return None


def error_from_status(label: str, status: int, headers: Mapping[str, str] | None, body: object = None, *,
                      secret: str | None = None) -> ProviderError:
    """ProviderError for an HTTP error status: 429/5xx/529/408/409 retryable, other 4xx not."""
    # Anthropic's SDK keeps the whole body, OpenAI's only its "error" object.
    err = body.get("error", body) if isinstance(body, dict) else None
    code = (err.get("code") or err.get("type")) if isinstance(err, dict) else None
    if status == 429 and code == "insufficient_quota":   # OpenAI: out of credit, not a rate limit
        category = "auth"
    elif status == 429:
        category = "rate-limit"
    elif status == 408:
        category = "timeout"
    elif status >= 500 or status == 409:   # 529 overloaded (Anthropic); 409 a lock timeout upstream
        category = "server"
    elif status in (401, 402, 403):
        category = "auth"
    else:
        category = "bad-request"
    try:
        words = "insufficient quota" if category == "auth" and status == 429 else (
            _STATUS_WORDS.get(status) or http.HTTPStatus(status).phrase.lower())
    except ValueError:
        words = "error"
    detail = f"{status} {words}"
    msg = api_message(body)
    if msg and category not in RETRYABLE:   # why a request was refused is worth showing; a 500's isn't
        detail += ": " + scrub(" ".join(msg.split()), secret)[:240]
    return ProviderError(f"{label}: {detail}", category=category, status=status,
                         retry_after=parse_retry_after(headers), detail=detail)


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """What a successful call_with_retry returns besides the value."""

    value: T
    attempts: int
    attempt_latency_s: float         # the successful attempt alone
    elapsed_s: float                 # everything: queueing, failed attempts, backoff sleeps


async def call_with_retry(attempt: Callable[[float], Awaitable[T]], *, policy: RetryPolicy, label: str,
                          timeout_s: float, limiter: RateLimiter | None = None) -> Outcome[T]:
    """Run `attempt(timeout)` until it succeeds, fails for good, or the budget or attempts run out.

    `attempt` raises ProviderError for failures. Time queued in the limiter does not count against
    `policy.total_timeout` (it is our own throttling, not the provider failing).
    """
    clock = policy.clock
    start = clock()
    queued = 0.0
    n = 0
    last: ProviderError | None = None
    out_of_time = ""                 # why the time budget ended the retries, if it did

    def budget_left() -> float:
        return policy.total_timeout - (clock() - start - queued)

    while n < policy.max_attempts:
        left = budget_left()
        if left < policy.min_attempt_s:
            out_of_time = f"time budget of {policy.total_timeout:g} s spent"
            break
        n += 1
        async with (limiter.slot() if limiter is not None else _no_limit()) as waited:
            queued += waited
            timeout = min(timeout_s, max(left, policy.min_attempt_s))
            t0 = clock()
            try:
                value = await asyncio.wait_for(attempt(timeout), timeout + _GRACE_S)
            except asyncio.TimeoutError:
                err = ProviderError(f"{label}: timed out after {timeout:.1f} s", category="timeout",
                                    detail=f"timed out after {timeout:.1f} s")
            except ProviderError as e:
                err = e
            else:
                now = clock()
                return Outcome(value, n, now - t0, now - start)
        if not err.retryable:
            if n > 1:
                raise ProviderError(f"{err.message} (attempt {n})", category=err.category, retryable=False,
                                    status=err.status, detail=err.detail, attempts=n,
                                    elapsed_s=clock() - start) from None
            raise err
        last = err
        if n >= policy.max_attempts:
            break
        delay = err.retry_after if err.retry_after is not None else policy.backoff(n)
        delay = min(delay, policy.max_delay)
        if budget_left() - delay < policy.min_attempt_s:
            # Sleeping past the budget only to fail is worse than failing now with the real cause.
            out_of_time = (f"time budget of {policy.total_timeout:g} s spent" if delay < policy.min_attempt_s
                           else f"waiting {delay:g} s more would overrun the {policy.total_timeout:g} s time budget")
            break
        log.debug("%s: attempt %d failed (%s); retrying in %.2f s", label, n, err.detail, delay)
        await policy.sleep(delay)

    elapsed = clock() - start
    if last is None:   # the budget was gone before the first attempt (total_timeout < min_attempt_s)
        raise ProviderError(f"{label}: no attempt made: total budget of {policy.total_timeout:g} s is too short",
                            category="timeout", detail="total budget too short", attempts=0, elapsed_s=elapsed)
    tail = f" (last retry-after {last.retry_after:g} s)" if last.retry_after is not None else ""
    if out_of_time:
        tail += f"; {out_of_time}"
    detail = f"gave up after {n} attempt{'s' if n != 1 else ''} in {elapsed:.1f} s: {last.detail}{tail}"
    log.debug("%s: %s", label, detail)
    raise ProviderError(f"{label}: {detail}", category=last.category, retryable=last.retryable,
                        status=last.status, retry_after=last.retry_after, detail=detail, attempts=n,
                        elapsed_s=elapsed)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _field(obj: Any, name: str) -> Any:
    # Responses are SDK models, but parsing is lenient: a part the SDK could not type stays a dict.
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


@dataclass(frozen=True)
class Answer:
    """One parsed response, provider-neutral (what a client's `_parse` returns)."""

    text: str
    model: str | None
    stop_reason: str | None
    raw_id: str | None
    tokens_in: int = 0               # including cache reads and writes
    tokens_out: int = 0
    cache_read: int = 0
    cache_write: int = 0


class SDKClient:
    """What the Anthropic and OpenAI clients share: key lookup, limiter, retries, timing, cost.

    Subclasses supply `_sdk_module`, `_new_http`, `_sdk`, `_create` and `_parse`. The API key is read
    from the environment inside each `complete()` and lives only in that call's SDK object.
    """

    provider_type = ""
    default_key_env = ""
    # Multipliers of the input price for cache tokens when the price table gives none.
    cache_read_factor = 1.0
    cache_write_factor = 1.0

    def __init__(self, model: str, *, name: str | None = None, api_key_env: str | None = None,
                 base_url: str | None = None, max_tokens_default: int = 8192, timeout_s: float = 300.0,
                 prices: Mapping[str, Any] | None = None, limiter: RateLimiter | None = None,
                 retry: RetryPolicy | None = None) -> None:
        self.name = name or self.provider_type
        self.model = model
        self.api_key_env = api_key_env or self.default_key_env
        self.base_url = base_url or None
        self.max_tokens_default = max_tokens_default
        self.timeout_s = float(timeout_s)
        self.prices = {m: p if isinstance(p, Price) else Price(**p) for m, p in (prices or {}).items()}
        self.limiter = limiter if limiter is not None else RateLimiter()
        self.retry = retry if retry is not None else RetryPolicy()
        self._http: Any = None
        self._http_loop: asyncio.AbstractEventLoop | None = None

    @property
    def label(self) -> str:
        """'name model', the prefix of every error message."""
        return f"{self.name} {self.model}"

    def __repr__(self) -> str:
        where = f", base_url={self.base_url!r}" if self.base_url else ""
        return (f"{type(self).__name__}(name={self.name!r}, model={self.model!r}{where}, "
                f"api_key_env={self.api_key_env!r})")

    def __getstate__(self) -> dict[str, Any]:
        # An open HTTP client cannot cross processes; the copy opens its own. There is no key to drop.
        return {**self.__dict__, "_http": None, "_http_loop": None}

    def has_key(self, env: Mapping[str, str] | None = None) -> bool:
        """Whether the key's environment variable is set (non-empty)."""
        return bool((os.environ if env is None else env).get(self.api_key_env, ""))

    def check_credentials(self) -> None:
        """Raise UsageError (exit 2) when a key is needed and its environment variable is empty."""
        if not self.base_url and not self.has_key():
            raise UsageError(f"provider '{self.name}': environment variable {self.api_key_env} is not set; "
                             f"export your API key, or use --provider builtin")

    def _api_key(self) -> str:
        key = os.environ.get(self.api_key_env, "")
        if key:
            return key
        if self.base_url:
            # Local OpenAI-compatible servers (vLLM, Ollama, llama.cpp, LM Studio) ignore the key, but
            # the SDKs insist on one; a placeholder is sent only when a base_url is set and the variable
            # is empty. A hosted endpoint behind base_url then answers 401, which names the variable.
            return "not-needed"
        raise ProviderError(f"{self.label}: environment variable {self.api_key_env} is not set",
                            category="auth", retryable=False,
                            detail=f"environment variable {self.api_key_env} is not set")

    def _http_client(self) -> Any:
        # One connection pool per event loop, shared by every call; SDK objects are cheap per call
        # (about 0.1 ms), a new pool is not (about 30 ms of TLS setup).
        loop = asyncio.get_running_loop()
        if self._http is None or self._http_loop is not loop or self._http.is_closed:
            self._http, self._http_loop = self._new_http(), loop
        return self._http

    async def aclose(self) -> None:
        """Close the connection pool (a later call opens a new one)."""
        http_client, self._http, self._http_loop = self._http, None, None
        if http_client is not None and not http_client.is_closed:
            await http_client.aclose()

    async def __aenter__(self) -> SDKClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def complete(self, system: str, messages: list[Message], *, max_tokens: int | None = None,
                       temperature: float | None = None) -> Completion:
        """One answer; ProviderError after retries, or at once for errors that retrying cannot fix."""
        if not messages:
            raise ValueError("complete() needs at least one message")
        max_tokens = max_tokens or self.max_tokens_default
        key = self._api_key()
        secret = None if key == "not-needed" else key
        sdk = self._sdk(key, self._http_client())

        async def attempt(timeout: float) -> Answer:
            try:
                raw = await self._create(sdk, system, messages, max_tokens, temperature, timeout)
            except ProviderError:
                raise
            except Exception as e:
                err = self._map_error(e, timeout, secret)
                if err is None:
                    raise
                raise err from None
            return self._parse(raw)

        out = await call_with_retry(attempt, policy=self.retry, label=self.label, timeout_s=self.timeout_s,
                                    limiter=self.limiter)
        a = out.value
        price = find_price(self.prices, self.model, a.model)
        cost = cost_usd(price, tokens_in=a.tokens_in, tokens_out=a.tokens_out, cache_read=a.cache_read,
                        cache_write=a.cache_write, cache_read_factor=self.cache_read_factor,
                        cache_write_factor=self.cache_write_factor)
        log.debug("%s: %d in, %d out, $%.4f, %.1f s (%d attempts)", self.label, a.tokens_in, a.tokens_out,
                  cost, out.elapsed_s, out.attempts)
        return Completion(text=a.text, usage=Usage(tokens_in=a.tokens_in, tokens_out=a.tokens_out,
                                                   cost_usd=cost, latency_s=out.attempt_latency_s),
                          model=a.model or self.model, stop_reason=a.stop_reason, raw_id=a.raw_id,
                          cost_known=price is not None, latency_total_s=out.elapsed_s, attempts=out.attempts,
                          cache_read_tokens=a.cache_read, cache_write_tokens=a.cache_write, provider=self.name)

    def _map_error(self, exc: Exception, timeout: float, secret: str | None) -> ProviderError | None:
        """The ProviderError for an exception the SDK raised; None for one that is our own bug."""
        sdk = self._sdk_module()
        if isinstance(exc, sdk.APITimeoutError):
            return ProviderError(f"{self.label}: timed out after {timeout:.1f} s", category="timeout",
                                 detail=f"timed out after {timeout:.1f} s")
        if isinstance(exc, sdk.APIStatusError):
            return error_from_status(self.label, exc.status_code, exc.response.headers, exc.body, secret=secret)
        if isinstance(exc, sdk.APIResponseValidationError):
            return self._malformed(scrub(str(exc), secret))
        if isinstance(exc, sdk.APIConnectionError):
            cause = exc.__cause__ or exc.__context__
            why = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
            why = scrub(" ".join(why.split()), secret)[:240]
            return ProviderError(f"{self.label}: connection failed ({why})", category="connection",
                                 detail=f"connection failed ({why})")
        if isinstance(exc, json.JSONDecodeError):   # a 200 whose body is not JSON: the SDK lets it escape
            return self._malformed(f"body is not valid JSON ({exc.msg} at char {exc.pos})")
        base = getattr(sdk, "AnthropicError", None) or getattr(sdk, "OpenAIError", None)
        if base is not None and isinstance(exc, base):
            why = scrub(" ".join(str(exc).split()), secret)[:240]
            return ProviderError(f"{self.label}: {why}", category="bad-request", detail=why)
        return None

    def _not_json(self, raw: str | bytes) -> ProviderError:
        # With a non-JSON content-type the SDKs return the body as text instead of raising.
        head = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw)[:80]
        return self._malformed(f"not a JSON response: {' '.join(head.split())!r}")

    def _malformed(self, why: str) -> ProviderError:
        return ProviderError(f"{self.label}: malformed response: {why}", category="malformed",
                             detail=f"malformed response: {why}")

    # -- supplied by each provider ---------------------------------------------------------------

    def _new_http(self) -> Any:
        raise NotImplementedError

    def _sdk(self, key: str, http_client: Any) -> Any:
        raise NotImplementedError

    async def _create(self, sdk: Any, system: str, messages: list[Message], max_tokens: int,
                      temperature: float | None, timeout: float) -> Any:
        raise NotImplementedError

    def _sdk_module(self) -> Any:
        """The SDK module (`anthropic`, `openai`): both are generated alike, with one exception tree."""
        raise NotImplementedError

    def _parse(self, raw: Any) -> Answer:
        raise NotImplementedError
