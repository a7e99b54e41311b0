"""What pid knows about a model: its context window, its largest reply, its prices, whether it thinks.

A built-in table covers the common OpenAI, Anthropic and open-weight models (numbers as pi's model registry has
them). A user file in pi's `models.json` format extends and overrides it, so a pi user's file works as it is:

    {"providers": {"<name>": {"baseUrl": ..., "api": ..., "models": [
        {"id": "my-model", "contextWindow": 65536, "maxTokens": 8192, "reasoning": false,
         "cost": {"input": 0.5, "output": 1.5, "cacheRead": 0.05, "cacheWrite": 0}}]}}}

The file is the first that exists of: `$PID_MODELS`, `$PID_HOME/models.json`, then pi's own
(`$PI_CODING_AGENT_DIR/models.json`, default `~/.pi/agent/models.json`). It is read where the job runs (the worker).
Only the fields above are used; pi's other keys (baseUrl, apiKey, headers, compat...) are ignored.

A model found nowhere gets DEFAULT_CONTEXT_WINDOW and `known=False` (the runner warns). Explicit overrides (the job's
--context-window, --input-price...) win over everything.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from urllib.parse import urlsplit
from typing import Any, Mapping

from pid.config import pid_home
from pid import settings

# Unknown models: 128k, pi's own default for a models.json entry without contextWindow. Too small compacts a job
# again and again (a 32k guess leaves ~16k of conversation: two file reads); too large costs one refused request,
# which overflow recovery answers by compacting and asking again. A server that truncates silently (Ollama, whose
# default window is a few thousand tokens) is wrong under any guess: say its window with --context-window.
DEFAULT_CONTEXT_WINDOW = 128000
DEFAULT_MAX_TOKENS = 16384   # pi's default for a models.json entry without maxTokens
OLLAMA_PORT = 11434          # Ollama's own port: how a job tells that its model server is probably Ollama
MODELS_ENV = settings.MODELS.name


@dataclass(frozen=True)
class ModelInfo:
    """One model's limits and prices (USD per million tokens)."""
    id: str
    context_window: int = DEFAULT_CONTEXT_WINDOW
    max_tokens: int = DEFAULT_MAX_TOKENS
    input_price: float = 0.0
    output_price: float = 0.0
    cache_read_price: float = 0.0
    cache_write_price: float = 0.0
    reasoning: bool = False
    known: bool = False          # found in the table or the user's file (else: the defaults above)
    source: str = "default"      # "built-in", the user file's path, or "default"


def _m(context: int, max_tokens: int, inp: float, out: float, cache_read: float = 0.0, cache_write: float = 0.0,
       reasoning: bool = False) -> dict[str, Any]:
    return {"context_window": context, "max_tokens": max_tokens, "input_price": inp, "output_price": out,
            "cache_read_price": cache_read, "cache_write_price": cache_write, "reasoning": reasoning}


# Keys are lower-case ids. Open-weight models carry their native window and no price (self-hosted: the cost is
# yours; a hosted one can be priced in models.json or with --input-price/--output-price).
BUILT_IN: dict[str, dict[str, Any]] = {
    # OpenAI
    "gpt-4": _m(8192, 8192, 30, 60),
    "gpt-4-turbo": _m(128000, 4096, 10, 30),
    "gpt-4o": _m(128000, 16384, 2.5, 10, 1.25),
    "gpt-4o-mini": _m(128000, 16384, 0.15, 0.6, 0.075),
    "gpt-4.1": _m(1047576, 32768, 2, 8, 0.5),
    "gpt-4.1-mini": _m(1047576, 32768, 0.4, 1.6, 0.1),
    "gpt-4.1-nano": _m(1047576, 32768, 0.1, 0.4, 0.025),
    "gpt-5": _m(400000, 128000, 1.25, 10, 0.125, reasoning=True),
    "gpt-5-mini": _m(400000, 128000, 0.25, 2, 0.025, reasoning=True),
    "gpt-5-nano": _m(400000, 128000, 0.05, 0.4, 0.005, reasoning=True),
    "gpt-5-codex": _m(400000, 128000, 1.25, 10, 0.125, reasoning=True),
    "gpt-5-chat-latest": _m(128000, 16384, 1.25, 10, 0.125),
    "gpt-5.1": _m(400000, 128000, 1.25, 10, 0.125, reasoning=True),
    "gpt-5.1-codex": _m(400000, 128000, 1.25, 10, 0.125, reasoning=True),
    "gpt-5.1-codex-mini": _m(400000, 128000, 0.25, 2, 0.025, reasoning=True),
    "gpt-5.2": _m(400000, 128000, 1.75, 14, 0.175, reasoning=True),
    "gpt-5.2-codex": _m(400000, 128000, 1.75, 14, 0.175, reasoning=True),
    "o1": _m(200000, 100000, 15, 60, 7.5, reasoning=True),
    "o3": _m(200000, 100000, 2, 8, 0.5, reasoning=True),
    "o3-mini": _m(200000, 100000, 1.1, 4.4, 0.55, reasoning=True),
    "o4-mini": _m(200000, 100000, 1.1, 4.4, 0.275, reasoning=True),
    # Anthropic
    "claude-3-haiku": _m(200000, 4096, 0.25, 1.25, 0.03, 0.3),
    "claude-3-5-haiku": _m(200000, 8192, 0.8, 4, 0.08, 1),
    "claude-3-5-sonnet": _m(200000, 8192, 3, 15, 0.3, 3.75),
    "claude-3-7-sonnet": _m(200000, 64000, 3, 15, 0.3, 3.75, reasoning=True),
    "claude-sonnet-4": _m(200000, 64000, 3, 15, 0.3, 3.75, reasoning=True),
    "claude-sonnet-4-0": _m(200000, 64000, 3, 15, 0.3, 3.75, reasoning=True),
    "claude-sonnet-4-5": _m(200000, 64000, 3, 15, 0.3, 3.75, reasoning=True),
    "claude-opus-4": _m(200000, 32000, 15, 75, 1.5, 18.75, reasoning=True),
    "claude-opus-4-0": _m(200000, 32000, 15, 75, 1.5, 18.75, reasoning=True),
    "claude-opus-4-1": _m(200000, 32000, 15, 75, 1.5, 18.75, reasoning=True),
    "claude-opus-4-5": _m(200000, 64000, 5, 25, 0.5, 6.25, reasoning=True),
    "claude-haiku-4-5": _m(200000, 64000, 1, 5, 0.1, 1.25, reasoning=True),
    # Open weights (native windows; served windows are often smaller: --context-window)
    "gpt-oss-20b": _m(131072, 32768, 0, 0, reasoning=True),
    "gpt-oss-120b": _m(131072, 32768, 0, 0, reasoning=True),
    "qwen3-coder": _m(262144, 65536, 0, 0),
    "qwen3-coder-30b-a3b-instruct": _m(262144, 65536, 0, 0),
    "qwen3-coder-480b-a35b-instruct": _m(262144, 65536, 0, 0),
    "qwen2.5-coder-32b-instruct": _m(32768, 8192, 0, 0),
    "qwen2.5-coder-7b-instruct": _m(32768, 8192, 0, 0),
    "qwen3-32b": _m(40960, 32768, 0, 0, reasoning=True),
    "qwen3-235b-a22b-instruct-2507": _m(262144, 16384, 0, 0),
    "qwq-32b": _m(131072, 32768, 0, 0, reasoning=True),
    "llama-3.1-8b-instruct": _m(131072, 16384, 0, 0),
    "llama-3.1-70b-instruct": _m(131072, 16384, 0, 0),
    "llama-3.3-70b-instruct": _m(131072, 16384, 0, 0),
    "deepseek-v3": _m(131072, 8192, 0, 0),
    "deepseek-v3.1": _m(163840, 32768, 0, 0, reasoning=True),
    "deepseek-r1": _m(131072, 32768, 0, 0, reasoning=True),
    "deepseek-chat": _m(131072, 8192, 0.28, 0.42, 0.028),
    "deepseek-reasoner": _m(131072, 65536, 0.28, 0.42, 0.028, reasoning=True),
    "devstral-small": _m(131072, 16384, 0, 0),
    "devstral-small-2505": _m(131072, 16384, 0, 0),
    "mistral-small-3.2-24b-instruct": _m(131072, 16384, 0, 0),
    "glm-4.5-air": _m(131072, 98304, 0, 0, reasoning=True),
    "glm-4.6": _m(202752, 131072, 0, 0, reasoning=True),
    "kimi-k2-instruct": _m(131072, 16384, 0, 0),
    "gemma-3-27b-it": _m(131072, 8192, 0, 0),
}


class ModelsFileError(ValueError):
    """The user's models.json cannot be read: the job must not run on a silent guess."""


def models_file() -> str | None:
    """The user's models.json, if one exists (see the module's docstring for the order)."""
    explicit = settings.MODELS.raw()
    if explicit:
        return explicit   # named on purpose: a missing one is an error, not a fallback
    pi_dir = os.environ.get("PI_CODING_AGENT_DIR") or os.path.join(os.path.expanduser("~"), ".pi", "agent")
    for path in (os.path.join(pid_home(), "models.json"), os.path.join(pi_dir, "models.json")):
        if os.path.isfile(path):
            return path
    return None


def load_models_file(path: str) -> dict[str, dict[str, Any]]:
    """pi's models.json as {lower-case id: fields}; also keyed "provider/id" so either spelling finds it."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ModelsFileError(f"cannot read the models file {path}: {exc}") from None
    table: dict[str, dict[str, Any]] = {}
    providers = data.get("providers") if isinstance(data, dict) else None
    if not isinstance(providers, dict):
        raise ModelsFileError(f"{path}: expected {{\"providers\": {{...}}}} (pi's models.json format)")
    for provider, spec in providers.items():
        for model in (spec or {}).get("models") or []:
            if not isinstance(model, dict) or not isinstance(model.get("id"), str):
                raise ModelsFileError(f"{path}: provider {provider!r} has a model without a string \"id\"")
            fields = _from_pi(model, path)
            table[model["id"].lower()] = fields
            table[f"{provider}/{model['id']}".lower()] = fields
    return table


def _from_pi(model: dict[str, Any], path: str) -> dict[str, Any]:
    cost = model.get("cost") or {}
    try:
        return {"context_window": int(model.get("contextWindow") or DEFAULT_CONTEXT_WINDOW),   # pi's defaults
                "max_tokens": int(model.get("maxTokens") or DEFAULT_MAX_TOKENS),
                "input_price": float(cost.get("input", 0)), "output_price": float(cost.get("output", 0)),
                "cache_read_price": float(cost.get("cacheRead", 0)),
                "cache_write_price": float(cost.get("cacheWrite", 0)),
                "reasoning": bool(model.get("reasoning", False)), "source": path}
    except (TypeError, ValueError) as exc:
        raise ModelsFileError(f"{path}: model {model.get('id')!r}: {exc}") from None


def _lookup(table: Mapping[str, dict[str, Any]], name: str, *, prefix: bool) -> dict[str, Any] | None:
    """The exact id (also without its "vendor/" prefix, ":" read as "-"); with `prefix`, the longest table id the name
    starts with followed by a separator (a dated snapshot "claude-sonnet-4-5-20250929", a tag "qwen3-coder:30b")."""
    key = name.strip().lower()
    candidates = [key, key.rsplit("/", 1)[-1]]
    candidates += [c.replace(":", "-") for c in candidates]
    for candidate in candidates:
        if candidate in table:
            return table[candidate]
    if prefix:
        for candidate in candidates:
            starts = [k for k in table if candidate.startswith(k) and candidate[len(k):len(k) + 1] in ("-", "@")]
            if starts:
                return table[max(starts, key=len)]
    return None


def model_info(name: str, overrides: Mapping[str, Any] | None = None) -> ModelInfo:
    """What is known of `name`: the user's file first, then the built-in table, then the defaults; `overrides`
    (ModelInfo field -> value; None values ignored) win. Raises ModelsFileError for a broken user file."""
    path = models_file()
    user: Mapping[str, dict[str, Any]] = {}
    if path is not None:
        if not os.path.isfile(path):
            raise ModelsFileError(f"{MODELS_ENV}={path}: no such file")
        user = load_models_file(path)
    built_in = {k: {**v, "source": "built-in"} for k, v in BUILT_IN.items()}
    found: dict[str, Any] | None = None
    for prefix in (False, True):   # an exact entry anywhere beats a prefix anywhere; the user's file first
        found = _lookup(user, name, prefix=prefix) or _lookup(built_in, name, prefix=prefix)
        if found is not None:
            break
    info = ModelInfo(id=name, known=found is not None, **(found or {}))
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    info = dataclasses.replace(info, **given) if given else info
    # Input tokens the provider says it cached are priced apart from the rest; where no one priced them, they cost
    # what input costs, so --max-cost can overshoot nothing.
    if not info.input_price:
        return info
    return dataclasses.replace(info, cache_read_price=info.cache_read_price or info.input_price,
                               cache_write_price=info.cache_write_price or info.input_price)


def unknown_model_warning(info: ModelInfo, window_given: bool = False) -> str | None:
    """What a model the table lacks is assumed to be, of what its options did not give; None when they gave it all."""
    assumed, options = [], []
    if not window_given:
        assumed.append(f"a {info.context_window:,}-token context window")
        options.append("--context-window")
    if not (info.input_price or info.output_price):
        assumed.append("no prices")
        options.append("--input-price/--output-price")
    if not assumed:
        return None
    return (f"model {info.id!r} is not in the model table: assuming {' and '.join(assumed)} (set "
            f"{' and '.join(options)}, or describe it in models.json: {MODELS_ENV} or $PID_HOME/models.json)")


def silent_truncation_warning(info: ModelInfo, base_url: str | None) -> str | None:
    """For a model server that looks like Ollama (its port, or "ollama" in the host's name): it cuts a prompt longer
    than its context length (num_ctx, a few thousand tokens unless its operator set more) without an error, whatever
    window the model itself has, so no window pid assumes is safe there; None for any other server."""
    parts = urlsplit(base_url or "")
    try:
        port = parts.port
    except ValueError:
        port = None
    if port != OLLAMA_PORT and "ollama" not in (parts.hostname or ""):
        return None
    return (f"the model server at {base_url} looks like Ollama, which cuts prompts longer than its context length "
            f"(num_ctx, a few thousand tokens unless set) without an error: pid assumes {info.context_window:,} tokens "
            f"for {info.id!r}; pass --context-window with the length the server uses")
