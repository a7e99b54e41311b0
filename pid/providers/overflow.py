"""Is a failed model call a refusal for length? Then compacting the context can save the job (pid/compaction.py).

Providers report it in their own words; the patterns are pi's (packages/ai utils/overflow.ts) plus the usual
vLLM/SGLang/TGI/llama.cpp wordings. Rate limits that mention tokens ("Too many tokens, please wait") are not it.
"""
from __future__ import annotations

import re

from pid.messages import AssistantMessage

OVERFLOW_PATTERNS = [re.compile(p, re.IGNORECASE) for p in (
    r"prompt is too long",                              # Anthropic
    r"input length and `?max_tokens`? exceed context limit",   # Anthropic: input + max_tokens (thinking's too)
    r"request_too_large",                               # Anthropic, by bytes (413)
    r"input is too long for requested model",           # Bedrock
    r"exceeds the context window",                      # OpenAI
    r"context[_ ]length[_ ]exceeded",                   # OpenAI's code, generic
    r"input token count.*exceeds the maximum",          # Gemini
    r"maximum prompt length is \d+",                    # xAI
    r"reduce the length of the messages",               # Groq, vLLM
    r"maximum context length",                          # vLLM, OpenRouter
    r"longer than the model's context length",          # SGLang
    r"greater than the context length",                 # LM Studio
    r"exceeds the limit of \d+",                        # GitHub Copilot
    r"exceeds the available context size",              # llama.cpp server
    r"context size has been exceeded",                  # older llama.cpp server
    r"context window exceeds limit",                    # MiniMax
    r"exceeded model token limit",                      # Kimi
    r"too large for model with \d+ maximum context length",   # Mistral
    r"model_context_window_exceeded",                   # z.ai
    r"prompt too long; exceeded (?:max )?context length",      # Ollama
    r"`inputs` tokens \+ `max_new_tokens` must be",     # TGI
    r"too many tokens",                                 # generic
    r"token limit exceeded",                            # generic
    r"^the server returned an empty response",          # llama-cpp-python: HTTP 200, no event (transport.py)
)]
NOT_OVERFLOW = [re.compile(p, re.IGNORECASE) for p in (r"\bHTTP 429\b", r"rate.?limit", r"too many requests",
                                                         r"please wait", r"^(throttling error|service unavailable):")]


def is_context_overflow(message: AssistantMessage) -> bool:
    """True when the call failed because the request was too long for the model's context window."""
    text = message.error_message or ""
    if message.stop_reason != "error" or not text:
        return False
    if any(p.search(text) for p in NOT_OVERFLOW):
        return False
    return any(p.search(text) for p in OVERFLOW_PATTERNS)
