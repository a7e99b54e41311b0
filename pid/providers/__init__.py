"""LLM providers behind one seam (`Provider.stream`); `make_provider` picks the implementation by `config.api`."""
from __future__ import annotations

import sys

# `import httpx` also imports httpx's own command-line tool, and with it click, rich and pygments (~60 ms), whenever
# rich is installed (pid batch's progress display needs it). pid never runs that tool: blocking the module makes
# httpx skip it, as it does when rich is absent. (Only when httpx is not imported yet: then nobody used the tool.)
if "httpx" not in sys.modules:
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

from pid.providers import anthropic, openai  # noqa: E402
from pid.providers.anthropic import AnthropicProvider  # noqa: E402
from pid.providers.base import Provider, ProviderConfig  # noqa: E402
from pid.providers.openai import OpenAIProvider  # noqa: E402

PROVIDERS = {openai.API: OpenAIProvider, anthropic.API: AnthropicProvider}


def make_provider(config: ProviderConfig) -> Provider:
    try:
        factory = PROVIDERS[config.api]
    except KeyError:
        raise ValueError(f"unknown provider api {config.api!r}; expected one of {sorted(PROVIDERS)}") from None
    return factory(config)


__all__ = ["AnthropicProvider", "OpenAIProvider", "Provider", "ProviderConfig", "make_provider"]
