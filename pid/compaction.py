"""Compaction, pi's way: when the conversation would no longer fit, the older part becomes a structured summary
written by the same model, and the agent goes on from summary + the most recent messages.

    [task, a1, r1, a2, r2, ..., a40, r40, a41, r41]        too big for window - reserve
     \\________ summarised ________/ \\___ kept (~keep) ___/
    -> [summary (as a user message), a38, r38, ..., a41, r41]

- Trigger: the context (pid's own count: tiktoken where its table is present, else the labelled estimate; or the
  provider's count of the last reply plus what came after it, whichever is larger) exceeds window - reserve.
- The cut: walk back from the newest message adding up tokens until `keep` is reached, then cut at the nearest
  user or assistant message at or after that point, never at a tool result, so a tool call and its results stay on
  the same side. A cut inside a turn (after the user's message) summarises that turn's prefix separately (pi's "split
  turn"); a later compaction updates the previous summary.
- The session gets pi's `compaction` entry (summary, firstKeptEntryId, tokensBefore, details {readFiles,
  modifiedFiles}); the full history stays in the file, and pi rebuilds the same context from it.

Differences from pi: tokens are counted with pid's counter (pi: chars/4); for windows too small for pi's defaults the
reserve is at most half the window, and the kept part and the summary each at most a quarter of what is left (the
split turn's summary an eighth), so that a compacted context has room to grow (with pi's sizes in a 32k window, a
model writing long summaries was compacted before most of its calls); when even the newest turn is over
`keep`, only the newest turn is kept (pi would keep everything); the two summaries of a split turn are asked one after
the other; the conversation handed to the summariser is shortened from its oldest end if it would not fit.
"""
from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from pid.context import MESSAGE_OVERHEAD_TOKENS, estimate_usage, message_text, tools_text
from pid.messages import (AssistantMessage, Message, TextContent, ThinkingContent, ToolCall, ToolResultMessage,
                          ToolSpec, Usage, UserMessage)
from pid.providers.base import Provider, price
from pid.providers.retry import RetryListener
from pid.tokens import TokenCounter, get_counter

RESERVE_TOKENS = 16384        # pi's compaction.reserveTokens: room for the reply (and the summary's)
KEEP_RECENT_TOKENS = 20000    # pi's compaction.keepRecentTokens
TOOL_RESULT_MAX_CHARS = 2000  # a tool result's share of the text the summariser reads

SUMMARY_PREFIX = "The conversation history before this point was compacted into the following summary:\n\n<summary>\n"
SUMMARY_SUFFIX = "\n</summary>"

SUMMARIZATION_SYSTEM_PROMPT = (
    "You are a context summarization assistant. You read a conversation between a user and an AI coding assistant "
    "and write a structured summary of it in exactly the format you are given.\n\n"
    "Do not continue the conversation and do not answer questions asked in it. Output only the summary.")

_FORMAT = """## Goal
[{goal}]

## Constraints & Preferences
- [{constraints}]

## Progress
### Done
- [x] [{done}]

### In Progress
- [ ] [{in_progress}]

### Blocked
- [{blocked}]

## Key Decisions
- **[Decision]**: [{decisions}]

## Next Steps
1. [{next_steps}]

## Critical Context
- [{critical}]

Keep every section short. Keep exact file paths, function names and error messages."""

SUMMARIZATION_PROMPT = (
    "The conversation above is to be summarised. Write a structured checkpoint from which another model can carry on "
    "the work.\n\nUse exactly this format:\n\n" + _FORMAT.format(
        goal="What the user wants done; several items if the session covers several tasks",
        constraints="Constraints, preferences and requirements the user stated, or \"(none)\"",
        done="Tasks and changes completed", in_progress="Work under way", blocked="What prevents progress, if anything",
        decisions="Short rationale", next_steps="What should happen next, in order",
        critical="Data, examples and references needed to carry on, or \"(none)\""))

UPDATE_SUMMARIZATION_PROMPT = (
    "The conversation above holds NEW messages. Merge them into the existing summary given in <previous-summary>.\n\n"
    "Rules:\n- Keep everything the previous summary says that still holds\n- Add the new progress, decisions and "
    "context\n- Move items from \"In Progress\" to \"Done\" once they are finished\n- Update \"Next Steps\" to what "
    "was achieved\n- Keep exact file paths, function names and error messages\n- Drop what is no longer relevant\n\n"
    "Use exactly this format:\n\n" + _FORMAT.format(
        goal="The goals so far, plus new ones if the task grew", constraints="Those so far, plus new ones",
        done="Earlier done items AND newly finished ones", in_progress="Current work, updated",
        blocked="Current blockers; drop resolved ones", decisions="Short rationale (keep earlier ones, add new)",
        next_steps="Updated to the current state", critical="Keep what matters, add what is new"))

TURN_PREFIX_PROMPT = (
    "This is the BEGINNING of a turn too large to keep whole; its end (the recent work) is kept. Summarise the "
    "beginning so that the kept end can be understood:\n\n## Original Request\n[What the user asked for in this "
    "turn]\n\n## Early Progress\n- [Decisions made and work done in this part]\n\n## Context for Suffix\n- "
    "[What is needed to understand the recent work that follows]\n\nBe brief.")


class CompactionFailed(Exception):
    """No summary could be made (nothing to summarise, the model call failed, or it was cancelled)."""

    def __init__(self, message: str, usage: Usage | None = None, aborted: bool = False) -> None:
        super().__init__(message)
        self.usage = usage or Usage()
        self.aborted = aborted


@dataclass
class Compaction:
    """One compaction: the context after it is the summary, then the agent's messages from `first_kept` on."""
    summary: str
    first_kept: int              # index into the agent's messages
    tokens_before: int
    read_files: list[str]
    modified_files: list[str]
    summarized: int              # messages summarised (not counting the previous summary)
    usage: Usage = field(default_factory=Usage)

    def details(self) -> dict[str, list[str]]:
        return {"readFiles": self.read_files, "modifiedFiles": self.modified_files}


@dataclass
class CutPoint:
    first_kept: int
    turn_start: int              # the user message opening the turn that was cut into, or -1
    split_turn: bool


class Compactor:
    """Decides when to compact and does it, for one agent. Not thread-safe: the loop's thread uses it."""

    def __init__(self, provider: Provider, context_window: int, *, reserve_tokens: int = RESERVE_TOKENS,
                 keep_recent_tokens: int = KEEP_RECENT_TOKENS, counter: TokenCounter | None = None,
                 max_output_tokens: int | None = None) -> None:
        self.provider = provider
        self.window = context_window
        self.max_output = max_output_tokens     # the model's largest reply: a summary asks for no more
        self.reserve = min(reserve_tokens, context_window // 2)
        self.threshold = context_window - self.reserve
        self.keep = min(keep_recent_tokens, self.threshold // 4)
        self.summary_tokens = min(int(0.8 * self.reserve), self.threshold // 4)   # pi: 0.8 * reserve
        self.turn_summary_tokens = min(int(0.5 * self.reserve), self.threshold // 8)   # pi: 0.5 * reserve
        self.counter = counter or get_counter()
        self.latest: Compaction | None = None
        self._summary: UserMessage | None = None   # the latest summary as the context's first message
        self._since = 0                         # the agent's message count at the latest compaction
        self._counts: dict[int, tuple[Message, int]] = {}

    def resume(self, summary: UserMessage, text: str, details: Any) -> None:
        """A continued conversation that opens with an earlier compaction's summary (the agent's messages[0], from
        pi's `compaction` entry: its `summary` text and `details`): the next compaction updates that summary and
        carries its file lists on, as pi's would, instead of summarising the summary as a user message."""
        details = details if isinstance(details, dict) else {}

        def paths(key: str) -> list[str]:
            value = details.get(key)
            return [p for p in value if isinstance(p, str)] if isinstance(value, list) else []

        self.latest = Compaction(text, 1, 0, paths("readFiles"), paths("modifiedFiles"), 0)
        self._summary, self._since = summary, 1

    # -- the context ------------------------------------------------------------------------------------------------
    @property
    def first_kept(self) -> int:
        return self.latest.first_kept if self.latest else 0

    def summary_message(self) -> UserMessage | None:
        """The same object until the next compaction (token counts and the providers' conversions are cached by
        identity)."""
        return self._summary

    def message_tokens(self, message: Message) -> int:
        hit = self._counts.get(id(message))
        if hit is None or hit[0] is not message:
            hit = (message, self.counter.count(message_text(message)) + MESSAGE_OVERHEAD_TOKENS)
            self._counts[id(message)] = hit
        return hit[1]

    def context_tokens(self, system: str, tools: list[ToolSpec], context: list[Message],
                       messages: list[Message]) -> int:
        """The size of the next request: pid's own count, or (pi's way) the provider's count of the newest reply
        since the latest compaction plus what came after it, whichever is larger."""
        own = self._fixed_tokens(system, tools) + sum(self.message_tokens(m) for m in context)
        for index in range(len(messages) - 1, self._since - 1, -1):
            m = messages[index]
            if isinstance(m, AssistantMessage) and m.stop_reason not in ("error", "aborted") and m.usage.total_tokens:
                after = sum(self.message_tokens(x) for x in messages[index + 1:])
                return max(own, m.usage.total_tokens + after)
        return own

    def should_compact(self, tokens: int) -> bool:
        return tokens > self.threshold

    def _fixed_tokens(self, system: str, tools: list[ToolSpec]) -> int:
        return self.counter.count(system) + self.counter.count(tools_text(tools)) + MESSAGE_OVERHEAD_TOKENS

    # -- compacting -------------------------------------------------------------------------------------------------
    def find_cut_point(self, messages: list[Message], start: int, end: int, keep: int) -> CutPoint:
        cut_points = [i for i in range(start, end) if _can_start_context(messages[i])]
        if not cut_points:
            return CutPoint(start, -1, False)
        cut = cut_points[0]
        total = 0
        for i in range(end - 1, start - 1, -1):
            total += self.message_tokens(messages[i])
            if total >= keep:
                cut = next((c for c in cut_points if c >= i), cut_points[-1])
                break
        if isinstance(messages[cut], UserMessage):
            return CutPoint(cut, -1, False)
        turn_start = next((i for i in range(cut, start - 1, -1) if isinstance(messages[i], UserMessage)), -1)
        return CutPoint(cut, turn_start, turn_start != -1)

    def compact(self, messages: list[Message], tokens_before: int, *, reason: str = "threshold",
                cancel: threading.Event | None = None, on_retry: RetryListener | None = None) -> Compaction:
        """Summarise what is older than the kept part; raises CompactionFailed. On success the next context is
        `summary_message()` + messages[first_kept:]. `on_retry` hears of each wait before a summary call is
        repeated (a rate limit meets the summary as it meets any call)."""
        start, end = self.first_kept, len(messages)
        cut = self.find_cut_point(messages, start, end, self.keep)
        if cut.first_kept <= start and reason == "overflow":   # refused: keep no more than the newest turn
            cut = self.find_cut_point(messages, start, end, 0)
        history_end = cut.turn_start if cut.split_turn else cut.first_kept
        history = [m for m in messages[start:history_end] if _summarisable(m)]
        prefix = [m for m in messages[cut.turn_start:cut.first_kept] if _summarisable(m)] if cut.split_turn else []
        if not history and not prefix:
            raise CompactionFailed("nothing older than the most recent turn is left to summarise")
        previous = self.latest.summary if self.latest else None
        usage = Usage()
        if history:
            prompt = UPDATE_SUMMARIZATION_PROMPT if previous else SUMMARIZATION_PROMPT
            summary = self._summarize(history, prompt, previous, self.summary_tokens, cancel, usage,
                                      on_retry)
        else:   # only the turn's prefix is new (pi would drop a previous summary here; it is kept)
            summary = previous or "No prior history."
        if prefix:
            turn = self._summarize(prefix, TURN_PREFIX_PROMPT, None, self.turn_summary_tokens, cancel, usage,
                                   on_retry)
            summary = f"{summary}\n\n---\n\n**Turn Context (split turn):**\n\n{turn}"
        read_files, modified_files = self._file_lists(history + prefix)
        summary += _format_files(read_files, modified_files)
        done = Compaction(summary, cut.first_kept, tokens_before, read_files, modified_files,
                          len(history) + len(prefix), usage)
        self.latest, self._since = done, len(messages)
        self._summary = UserMessage.text(SUMMARY_PREFIX + summary + SUMMARY_SUFFIX)
        return done

    def _summarize(self, messages: list[Message], prompt: str, previous: str | None, max_tokens: int,
                   cancel: threading.Event | None, usage: Usage, on_retry: RetryListener | None = None) -> str:
        if self.max_output:
            max_tokens = min(max_tokens, self.max_output)
        tail = (f"<previous-summary>\n{previous}\n</previous-summary>\n\n" if previous else "") + prompt
        budget = self.window - max_tokens - self.counter.count(SUMMARIZATION_SYSTEM_PROMPT + tail) - 512
        conversation = self._fit(serialize_conversation(messages), budget)
        request: list[Message] = [UserMessage.text(f"<conversation>\n{conversation}\n</conversation>\n\n{tail}")]
        # Thinking off: its budget would come on top of max_tokens, which the input budget above already takes whole.
        provider = self.provider.sibling(dataclasses.replace(self.provider.config, max_tokens=max_tokens,
                                                            thinking="off"))
        try:
            reply = provider.stream(SUMMARIZATION_SYSTEM_PROMPT, request, [], cancel=cancel, on_retry=on_retry)
        finally:
            provider.close()
        if reply.usage.total_tokens == 0 and reply.stop_reason not in ("error", "aborted"):
            reply.usage = price(estimate_usage(self.counter, SUMMARIZATION_SYSTEM_PROMPT, request, reply),
                                self.provider.config)
        usage.add(reply.usage)
        if reply.retried_usage is not None:
            usage.add(reply.retried_usage)
        if reply.stop_reason == "aborted" or (cancel is not None and cancel.is_set()):
            raise CompactionFailed("compaction cancelled", usage, aborted=True)
        if reply.stop_reason == "error":
            raise CompactionFailed(f"summarization failed: {reply.error_message or 'model request failed'}", usage)
        if not reply.text.strip():
            raise CompactionFailed("summarization failed: the model returned no summary", usage)
        return self._within(reply.text, max_tokens)

    def _within(self, summary: str, max_tokens: int) -> str:
        """The summary, cut if the server sent far more than it was asked for (one ignoring max_tokens, or
        hostile): a summary over its budget fills the context it was meant to free, and the next call compacts
        again. The server's own count is not taken on trust; pid's differs from the model's tokenizer (by up to half
        again: o200k), or over-counts ordinary text by a third (the estimate without tiktoken's table), so only a
        summary over 1.5 (estimated: 2) times the budget by pid's count is cut."""
        limit = max_tokens * 3 // 2 if self.counter.exact else max_tokens * 2
        if self.counter.count(summary) <= limit:
            return summary
        low, high = 0, min(len(summary), limit * 8)   # the longest prefix within the limit, looked for in its
        # first 8 characters a token (ordinary text has fewer; a summary of long runs of one character is cut
        # shorter than it need be): ~20 counts of that bound what a hostile 4 MiB summary costs
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if self.counter.count(summary[:middle]) <= limit else (low, middle - 1)
        return summary[:low] + f"\n[summary cut: the model wrote more than the {max_tokens} tokens asked for]"

    def _fit(self, parts: list[str], budget: int) -> str:
        """The serialised conversation, its oldest parts left out until it fits the summariser's window."""
        sizes = [self.counter.count(p) + 2 for p in parts]
        total, dropped = sum(sizes), 0
        while parts[dropped:] and total > budget:
            total -= sizes[dropped]
            dropped += 1
        kept = parts[dropped:]
        if dropped:
            kept = [f"[... {dropped} earlier part(s) of the conversation omitted to fit the summariser's context]",
                    *kept]
        return "\n\n".join(kept)

    def _file_lists(self, messages: list[Message]) -> tuple[list[str], list[str]]:
        read: set[str] = set(self.latest.read_files) if self.latest else set()
        modified: set[str] = set(self.latest.modified_files) if self.latest else set()
        for m in messages:
            if isinstance(m, AssistantMessage):
                for call in m.tool_calls:
                    path = call.arguments.get("path") if isinstance(call.arguments, dict) else None
                    if isinstance(path, str) and path:
                        if call.name == "read":
                            read.add(path)
                        elif call.name in ("write", "edit"):
                            modified.add(path)
        return sorted(read - modified), sorted(modified)


def _can_start_context(message: Message) -> bool:
    """A valid first kept message: never a tool result, whose call would be left behind, nor a failed reply, which
    is not part of any context."""
    return isinstance(message, UserMessage) or (isinstance(message, AssistantMessage) and _summarisable(message))


def _summarisable(message: Message) -> bool:
    return not (isinstance(message, AssistantMessage) and message.stop_reason in ("error", "aborted"))


def _format_files(read_files: list[str], modified_files: list[str]) -> str:
    sections = []
    if read_files:
        sections.append("<read-files>\n" + "\n".join(read_files) + "\n</read-files>")
    if modified_files:
        sections.append("<modified-files>\n" + "\n".join(modified_files) + "\n</modified-files>")
    return "\n\n" + "\n\n".join(sections) if sections else ""


def serialize_conversation(messages: list[Message]) -> list[str]:
    """The messages as labelled text blocks, so the summariser reads a transcript rather than continuing it."""
    parts: list[str] = []
    for m in messages:
        if isinstance(m, UserMessage):
            text = "".join(c.text for c in m.content if isinstance(c, TextContent))
            if text:
                parts.append(f"[User]: {text}")
        elif isinstance(m, AssistantMessage):
            thinking = [c.thinking for c in m.content if isinstance(c, ThinkingContent)]
            if thinking:
                parts.append("[Assistant thinking]: " + "\n".join(thinking))
            if any(isinstance(c, TextContent) for c in m.content):
                parts.append(f"[Assistant]: {m.text}")
            calls = [_call_text(c) for c in m.content if isinstance(c, ToolCall)]
            if calls:
                parts.append("[Assistant tool calls]: " + "; ".join(calls))
        elif isinstance(m, ToolResultMessage):
            text = m.text
            if text:
                if len(text) > TOOL_RESULT_MAX_CHARS:
                    text = (text[:TOOL_RESULT_MAX_CHARS]
                            + f"\n\n[... {len(text) - TOOL_RESULT_MAX_CHARS} more characters truncated]")
                parts.append(f"[Tool result]: {text}")
    return parts


def _call_text(call: ToolCall) -> str:
    arguments: Any = call.arguments if isinstance(call.arguments, dict) else {}
    return f"{call.name}(" + ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items()) + ")"
