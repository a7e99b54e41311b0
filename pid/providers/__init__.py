"""LLM providers behind one seam (`Provider.stream`); `make_provider` picks the implementation by `config.api`."""
from __future__ import annotations

from pid.providers import anthropic, openai
from pid.providers.anthropic import AnthropicProvider
from pid.providers.base import Provider, ProviderConfig
from pid.providers.openai import OpenAIProvider

PROVIDERS = {openai.API: OpenAIProvider, anthropic.API: AnthropicProvider}


def make_provider(config: ProviderConfig) -> Provider:
    try:
        factory = PROVIDERS[config.api]
    except KeyError:
        raise ValueError(f"unknown provider api {config.api!r}; expected one of {sorted(PROVIDERS)}") from None
    return factory(config)


__all__ = ["AnthropicProvider", "OpenAIProvider", "Provider", "ProviderConfig", "make_provider"]
