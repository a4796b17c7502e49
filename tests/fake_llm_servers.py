"""A fake Anthropic + OpenAI-compatible HTTP server (aiohttp, 127.0.0.1, a free port) for client tests.

It serves `POST /v1/messages` (Anthropic Messages) and `POST /v1/chat/completions` (OpenAI Chat
Completions) with real-format JSON, follows a script of replies (normal answers and injected faults),
and records every request (headers as sent, the key included, and the JSON body).

    async with FakeLLMServer() as srv:
        srv.script(rate_limited(retry_after=1), answer("ok"))
        client = AnthropicClient("claude-x", base_url=srv.anthropic_url)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

CODE_ANSWER = (
    "Here is the kernel.\n\n```cuda\n__global__ void add_kernel(const float* a, const float* b, float* out, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) out[i] = a[i] + b[i];\n}\n```\n"
)


@dataclass
class Reply:
    """One scripted reply. Build them with the helpers below rather than by hand."""

    kind: str = "text"               # text | error | reset | malformed | raw
    text: str = CODE_ANSWER
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    error_type: str = ""             # Anthropic error.type / OpenAI error.code
    error_message: str = ""
    echo_key: bool = False           # put the key as received into the error message (scrub tests)
    delay: float = 0.0               # seconds before answering
    truncated: bool = False          # stop_reason max_tokens / finish_reason length
    tokens_in: int = 100
    tokens_out: int | None = None    # None: about one token per four characters
    cache_read: int = 0
    cache_write: int = 0
    model: str | None = None         # the model to report; None echoes the request's
    body: str = ""                   # kind 'malformed' / 'raw': sent verbatim
    content_type: str = "application/json"


def answer(text: str = CODE_ANSWER, **kw: Any) -> Reply:
    """A normal answer (`end_turn` / `stop`)."""
    return Reply(text=text, **kw)


def no_code(**kw: Any) -> Reply:
    """An answer without any code block."""
    return Reply(text="I would fuse the two loads, but I cannot write this kernel without more detail.", **kw)


def truncated(**kw: Any) -> Reply:
    """An answer cut at max_tokens, mid-kernel."""
    return Reply(text="```cuda\n__global__ void add_kernel(const float* a, const float* b,", truncated=True, **kw)


def rate_limited(retry_after: float | None = 1, retry_after_ms: float | None = None) -> Reply:
    """429 with `retry-after` (seconds) and/or `retry-after-ms`."""
    headers = {}
    if retry_after is not None:
        headers["retry-after"] = f"{retry_after:g}"
    if retry_after_ms is not None:
        headers["retry-after-ms"] = f"{retry_after_ms:g}"
    return Reply(kind="error", status=429, headers=headers, error_type="rate_limit_error",
                 error_message="Number of requests has exceeded your rate limit")


def server_error(status: int = 500) -> Reply:
    """A 5xx."""
    return Reply(kind="error", status=status, error_type="api_error", error_message="Internal server error")


def overloaded() -> Reply:
    """Anthropic's 529 overloaded_error."""
    return Reply(kind="error", status=529, error_type="overloaded_error", error_message="Overloaded")


def out_of_quota() -> Reply:
    """OpenAI's 429 insufficient_quota: out of credit, which waiting does not fix."""
    return Reply(kind="error", status=429, error_type="insufficient_quota",
                 error_message="You exceeded your current quota, please check your plan and billing details.")


def unauthorized(echo_key: bool = False) -> Reply:
    """401; with echo_key the message quotes the key received, as some servers do."""
    return Reply(kind="error", status=401, error_type="authentication_error",
                 error_message="invalid x-api-key", echo_key=echo_key)


def bad_request(message: str = "max_tokens: must be at most 64000", status: int = 400) -> Reply:
    """A 4xx the client must not retry."""
    return Reply(kind="error", status=status, error_type="invalid_request_error", error_message=message)


def slow(seconds: float, then: Reply | None = None) -> Reply:
    """`then` (a normal answer by default) after `seconds`: longer than the client timeout, it times out."""
    r = then or answer()
    r.delay = seconds
    return r


def reset() -> Reply:
    """Headers and half a body, then the connection is aborted (a reset mid-response)."""
    return Reply(kind="reset")


def malformed() -> Reply:
    """200 with a body that is not JSON although it says it is."""
    return Reply(kind="malformed", body='{"id": "msg_broken", "content": [{"type": "text", "text": "trunc')


def wrong_schema() -> Reply:
    """200 with valid JSON that is not a message / completion."""
    return Reply(kind="raw", body=json.dumps({"status": "ok", "result": 42}))


@dataclass
class Recorded:
    """One request as the server received it."""

    path: str
    headers: dict[str, str]          # lower-cased names
    body: Any
    started: float                   # time.monotonic()
    reply: str


class FakeLLMServer:
    """The fake server: `async with FakeLLMServer() as srv`, then `srv.script(...)` and point clients at it."""

    def __init__(self, *, default: Reply | None = None) -> None:
        self.default = default or answer()
        self.queue: list[Reply] = []
        self.requests: list[Recorded] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.port = 0
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> FakeLLMServer:
        app = web.Application()
        app.router.add_post("/v1/messages", self._anthropic)
        app.router.add_post("/v1/chat/completions", self._openai)
        # handler_cancellation: a client that gave up (timeout) cancels the slow handler with it.
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=0.5,
                                     handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def close(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeLLMServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def anthropic_url(self) -> str:
        """base_url for AsyncAnthropic (it appends /v1/messages)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        """base_url for AsyncOpenAI (it appends /chat/completions)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *replies: Reply) -> FakeLLMServer:
        """Queue replies, served in order; when the queue is empty the default answer is served."""
        self.queue.extend(replies)
        return self

    # -- handlers --------------------------------------------------------------------------------

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "anthropic")

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "openai")

    async def _serve(self, request: web.Request, api: str) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")
        reply = self.queue.pop(0) if self.queue else self.default
        self.requests.append(Recorded(request.path, {k.lower(): v for k, v in request.headers.items()}, body,
                                      time.monotonic(), reply.kind))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if reply.delay:
                try:
                    await asyncio.wait_for(self._closing.wait(), reply.delay)
                    return web.Response(status=503, text="shutting down")
                except asyncio.TimeoutError:
                    pass
            return await self._respond(request, api, reply, body)
        finally:
            self.in_flight -= 1

    async def _respond(self, request: web.Request, api: str, reply: Reply, body: Any) -> web.StreamResponse:
        if reply.kind == "reset":
            resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            resp.content_length = 4096               # promise more than is ever sent
            await resp.prepare(request)
            await resp.write(b'{"id": "msg_reset", "type": "message", "content": [{"type": "te')
            assert request.transport is not None
            request.transport.abort()
            return resp
        if reply.kind in ("malformed", "raw"):
            return web.Response(status=reply.status, text=reply.body, content_type=reply.content_type,
                                headers=reply.headers)
        if reply.kind == "error":
            return self._error(request, api, reply)
        model = reply.model or (body.get("model") if isinstance(body, dict) else None) or "fake-model"
        n = next(self._ids)
        tokens_out = reply.tokens_out if reply.tokens_out is not None else max(1, len(reply.text) // 4)
        if api == "anthropic":
            payload: dict[str, Any] = {
                "id": f"msg_fake{n:04d}", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": reply.text}],
                "stop_reason": "max_tokens" if reply.truncated else "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": reply.tokens_in, "output_tokens": tokens_out,
                          "cache_creation_input_tokens": reply.cache_write,
                          "cache_read_input_tokens": reply.cache_read},
            }
            headers = {"request-id": f"req_fake{n:04d}", **reply.headers}
        else:
            payload = {
                "id": f"chatcmpl-fake{n:04d}", "object": "chat.completion", "created": int(time.time()),
                "model": model, "system_fingerprint": "fp_fake",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.text, "refusal": None},
                             "logprobs": None, "finish_reason": "length" if reply.truncated else "stop"}],
                "usage": {"prompt_tokens": reply.tokens_in + reply.cache_read, "completion_tokens": tokens_out,
                          "total_tokens": reply.tokens_in + reply.cache_read + tokens_out,
                          "prompt_tokens_details": {"cached_tokens": reply.cache_read}},
            }
            headers = {"x-request-id": f"req_fake{n:04d}", **reply.headers}
        return web.json_response(payload, headers=headers)

    def _error(self, request: web.Request, api: str, reply: Reply) -> web.Response:
        message = reply.error_message
        if reply.echo_key:
            key = request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix("Bearer ")
            message += f": {key}"
        if api == "anthropic":
            payload: dict[str, Any] = {"type": "error", "error": {"type": reply.error_type, "message": message},
                                       "request_id": "req_fake_error"}
        else:
            payload = {"error": {"message": message, "type": reply.error_type, "param": None,
                                 "code": reply.error_type}}
        return web.json_response(payload, status=reply.status, headers=reply.headers)


@pytest.fixture
async def fake_llm():
    """A started FakeLLMServer for one test (import this fixture into a test module to use it)."""
    async with FakeLLMServer() as srv:
        yield srv
