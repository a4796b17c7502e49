"""AnthropicClient: the Messages API through `anthropic.AsyncAnthropic`, retried by our policy only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anthropic

from engine.propose.providers.base import Message, Price
from engine.propose.providers.retry import Answer, RateLimiter, RetryPolicy, SDKClient, _field, _int, _str


class AnthropicClient(SDKClient):
    """Claude through the Messages API (`system=` carries the system prompt; `temperature` is ignored)."""

    provider_type = "anthropic"
    default_key_env = "ANTHROPIC_API_KEY"
    # Anthropic's documented prices: cache reads 0.1x input, 5-minute cache writes 1.25x input.
    cache_read_factor = 0.1
    cache_write_factor = 1.25

    def __init__(self, model: str, *, name: str | None = None, api_key_env: str = "ANTHROPIC_API_KEY",
                 base_url: str | None = None, max_tokens_default: int = 8192, timeout_s: float = 300.0,
                 prices: Mapping[str, Price | Mapping[str, float]] | None = None,
                 limiter: RateLimiter | None = None, retry: RetryPolicy | None = None) -> None:
        super().__init__(model, name=name, api_key_env=api_key_env, base_url=base_url,
                         max_tokens_default=max_tokens_default, timeout_s=timeout_s, prices=prices,
                         limiter=limiter, retry=retry)

    def _sdk_module(self) -> Any:
        return anthropic

    def _new_http(self) -> Any:
        return anthropic.DefaultAsyncHttpxClient()

    def _sdk(self, key: str, http_client: Any) -> anthropic.AsyncAnthropic:
        # max_retries=0: retry.py is the only retry layer. An explicit timeout also keeps the SDK from
        # refusing non-streaming calls whose max_tokens it guesses would run past 10 minutes.
        # base_url=None lets the SDK read ANTHROPIC_BASE_URL, as the SDK documents.
        return anthropic.AsyncAnthropic(api_key=key, base_url=self.base_url, max_retries=0,
                                        timeout=self.timeout_s, http_client=http_client)

    async def _create(self, sdk: anthropic.AsyncAnthropic, system: str, messages: list[Message],
                      max_tokens: int, temperature: float | None, timeout: float) -> Any:
        # `temperature` is accepted and ignored: the Messages API version this SDK pins (anthropic 2.x,
        # anthropic-version 2026-10-21) has no sampling parameters, and create() refuses the keyword.
        kwargs: dict[str, Any] = {}
        if system:                      # an empty system prompt is left out rather than sent empty
            kwargs["system"] = system
        return await sdk.messages.create(
            model=self.model, max_tokens=max_tokens, timeout=timeout,
            messages=[{"role": m.role, "content": m.content} for m in messages], **kwargs)

    def _parse(self, raw: Any) -> Answer:
        if isinstance(raw, (str, bytes)):   # the SDK hands back text when content-type is not JSON
            raise self._not_json(raw)
        content = _field(raw, "content")
        if not isinstance(content, list):
            raise self._malformed("no 'content' list in the message")
        # Text blocks only: thinking and tool blocks are not the answer.
        text = "".join(str(_field(b, "text") or "") for b in content if _field(b, "type") == "text")
        usage = _field(raw, "usage")
        cache_read = _int(_field(usage, "cache_read_input_tokens"))
        cache_write = _int(_field(usage, "cache_creation_input_tokens"))
        return Answer(text=text, model=_str(_field(raw, "model")), stop_reason=_str(_field(raw, "stop_reason")),
                      raw_id=_str(_field(raw, "id")),
                      tokens_in=_int(_field(usage, "input_tokens")) + cache_read + cache_write,
                      tokens_out=_int(_field(usage, "output_tokens")), cache_read=cache_read,
                      cache_write=cache_write)
