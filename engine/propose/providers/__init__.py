"""LLM provider clients: Anthropic and OpenAI-compatible chat APIs behind one `complete()`.

The SDK client classes are imported on first use, so that `builtin` runs never pay for the SDKs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.propose.providers.base import Completion, LLMClient, Message, Price, ProviderError
from engine.propose.providers.config import (
    ProviderConfig,
    default_provider,
    load_providers,
    make_client,
    shipped_providers_path,
)
from engine.propose.providers.retry import RateLimiter, RetryPolicy, SDKClient

if TYPE_CHECKING:
    from engine.propose.providers.anthropic_client import AnthropicClient
    from engine.propose.providers.openai_client import OpenAIClient

__all__ = [
    "AnthropicClient", "Completion", "LLMClient", "Message", "OpenAIClient", "Price", "ProviderConfig",
    "ProviderError", "RateLimiter", "RetryPolicy", "SDKClient", "default_provider", "load_providers", "make_client",
    "shipped_providers_path",
]


def __getattr__(name: str) -> Any:
    if name == "AnthropicClient":
        from engine.propose.providers.anthropic_client import AnthropicClient

        return AnthropicClient
    if name == "OpenAIClient":
        from engine.propose.providers.openai_client import OpenAIClient

        return OpenAIClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
