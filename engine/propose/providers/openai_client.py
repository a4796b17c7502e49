"""OpenAIClient: Chat Completions through `openai.AsyncOpenAI`, for OpenAI and compatible servers.

With `base_url` it talks to vLLM, Ollama, llama.cpp's server, LM Studio or OpenRouter. Local servers
need no key: when `base_url` is set and the key's variable is empty, the placeholder "not-needed" is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import openai

from engine.propose.providers.base import Message, Price
from engine.propose.providers.retry import Answer, RateLimiter, RetryPolicy, SDKClient, _field, _int, _str


class OpenAIClient(SDKClient):
    """A chat model behind the Chat Completions API (OpenAI itself or any compatible server)."""

    provider_type = "openai"
    default_key_env = "OPENAI_API_KEY"

    def __init__(self, model: str, *, name: str | None = None, api_key_env: str = "OPENAI_API_KEY",
                 base_url: str | None = None, max_tokens_default: int = 8192, timeout_s: float = 300.0,
                 prices: Mapping[str, Price | Mapping[str, float]] | None = None,
                 limiter: RateLimiter | None = None, retry: RetryPolicy | None = None,
                 max_tokens_param: str | None = None) -> None:
        super().__init__(model, name=name, api_key_env=api_key_env, base_url=base_url,
                         max_tokens_default=max_tokens_default, timeout_s=timeout_s, prices=prices,
                         limiter=limiter, retry=retry)
        # OpenAI's reasoning models (gpt-5, o-series) reject `max_tokens` and want
        # `max_completion_tokens`; local servers all understand `max_tokens`, not all the newer name.
        self.max_tokens_param = max_tokens_param or ("max_tokens" if self.base_url else "max_completion_tokens")
        if self.max_tokens_param not in ("max_tokens", "max_completion_tokens"):
            raise ValueError(f"max_tokens_param must be 'max_tokens' or 'max_completion_tokens', "
                             f"not {self.max_tokens_param!r}")

    def _sdk_module(self) -> Any:
        return openai

    def _new_http(self) -> Any:
        return openai.DefaultAsyncHttpxClient()

    def _sdk(self, key: str, http_client: Any) -> openai.AsyncOpenAI:
        # max_retries=0: retry.py is the only retry layer. Without base_url the SDK falls back to
        # OPENAI_BASE_URL, then api.openai.com; it also reads OPENAI_ORG_ID / OPENAI_PROJECT_ID.
        kwargs: dict[str, Any] = {"base_url": self.base_url} if self.base_url else {}
        return openai.AsyncOpenAI(api_key=key, max_retries=0, timeout=self.timeout_s,
                                  http_client=http_client, **kwargs)

    async def _create(self, sdk: openai.AsyncOpenAI, system: str, messages: list[Message],
                      max_tokens: int, temperature: float | None, timeout: float) -> Any:
        chat: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        chat += [{"role": m.role, "content": m.content} for m in messages]
        kwargs: dict[str, Any] = {self.max_tokens_param: max_tokens}
        if temperature is not None:     # reasoning models accept only the default; None leaves it out
            kwargs["temperature"] = temperature
        return await sdk.chat.completions.create(model=self.model, messages=chat, timeout=timeout, **kwargs)

    def _parse(self, raw: Any) -> Answer:
        if isinstance(raw, (str, bytes)):
            raise self._not_json(raw)
        choices = _field(raw, "choices")
        if not isinstance(choices, list) or not choices:
            raise self._malformed("no 'choices' in the completion")
        choice = choices[0]
        message = _field(choice, "message")
        if message is None:
            raise self._malformed("no 'message' in the first choice")
        content = _field(message, "content")
        # content is None for a refusal or a tool call; the answer parser sees an empty answer.
        text = content if isinstance(content, str) else ""
        usage = _field(raw, "usage")   # servers may omit it (older llama.cpp): then tokens are 0
        details = _field(usage, "prompt_tokens_details")
        return Answer(text=text, model=_str(_field(raw, "model")), stop_reason=_str(_field(choice, "finish_reason")),
                      raw_id=_str(_field(raw, "id")), tokens_in=_int(_field(usage, "prompt_tokens")),
                      tokens_out=_int(_field(usage, "completion_tokens")),
                      cache_read=_int(_field(details, "cached_tokens")))
