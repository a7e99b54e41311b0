"""The agent loop: ask the model, run the tools it calls, feed the results back, until it answers.

    task -> [model -> tool calls (concurrently) -> results in call order] * -> final answer

Everything else here is an ending rule (limits, cancel, errors) or a hook for a human in the loop
(steering, follow-ups, pause). The loop never raises for model or tool failures; each becomes an outcome.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pid import events as ev
from pid.compaction import CompactionFailed, Compactor
from pid.context import estimate_usage
from pid.endings import ExitReason, Status, status_of
from pid.messages import AssistantMessage, Message, ToolCall, ToolResultMessage, Usage, UserMessage
from pid.providers.base import Provider, price
from pid.providers.overflow import is_context_overflow
from pid.providers.retry import RetryNotice
from pid.replay import Replay
from pid.sandbox_api import SandboxLost
from pid.session import SessionWriter
from pid.tokens import get_counter
from pid.tools.base import ToolContext, ToolResult
from pid.tools.registry import ToolRegistry

LENGTH_STOP_TOOL_ERROR = ('Tool call "{name}" was not executed: the response hit the output token limit, so its '
                          'arguments may be truncated. Re-issue the tool call with complete arguments.')
# The most tool calls one reply runs: what they return is held together, and a reply of 4 MiB holds ~46,000 `read`s
# (an attack review's endpoint made 4,000 take 1.1 GB). Far more than a model asks for at once. The first call past
# them is answered, not run; any after it are left out of the transcript (an endpoint that sent 40,000 a turn grew a
# job's memory by ~50 MB a turn with their answers), and the model may ask again.
MAX_CALLS_PER_REPLY = 64
TOO_MANY_CALLS_ERROR = ('Tool call "{name}" was not executed: one response may make at most {limit} tool calls, and '
                        'this one made {made}{after}. Re-issue what is still needed in your next response.')
LEFT_OUT_CALLS = ": this call and the {count} after it did not run (those are left out of the conversation)"
OVERFLOW_ERROR = ("the conversation is too long for the model's context window ({detail}); try a model with a larger "
                  "window, or set --context-window to the window the server really has")


@dataclass
class Limits:
    max_turns: int | None = None              # pi has no cap; a job's comes from its spec
    wall_clock_s: float | None = None
    max_cost: float | None = None             # USD
    max_consecutive_timeouts: int = 3
    # What the job's earlier attempts spent (a worker that died or handed the job back): max_cost is the job's,
    # however many attempts it takes (max_turns is each attempt's: each starts over, with a new transcript)
    spent_cost: float = 0.0
    # Asked before every model call: a reason (and its message) to end the run now, or None. A limit shared with
    # others that the loop cannot see (a batch's budget, kept elsewhere); it must not raise.
    gate: Callable[[], tuple[ExitReason, str] | None] | None = None


@dataclass
class Outcome:
    """How a run ended. Only the reason is set; the status follows from it (pid/endings.py)."""
    exit_reason: ExitReason
    final_message: str = ""
    turns: int = 0
    tool_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    error: str | None = None

    @property
    def status(self) -> Status:
        return status_of(self.exit_reason)


class Agent:
    """One task's conversation with the model. Thread-safe controls: steer, follow_up, pause, resume, cancel."""

    def __init__(self, provider: Provider, tools: ToolRegistry, context: ToolContext, system_prompt: str, *,
                 session: SessionWriter | None = None, sink: ev.EventSink = ev.ignore,
                 limits: Limits | None = None, max_parallel_tools: int = 8, compactor: Compactor | None = None,
                 notices: list[str] | None = None, check_in: Callable[[], None] | None = None) -> None:
        """`check_in` is asked before each model call and as the agent would stop (pi's getSteeringMessages and
        getFollowUpMessages): a job's relay (worker/control.py) applies then what was sent since its last poll (pause,
        steer, follow-up, cancel), so a control posted while a command ran takes hold before the next call, and a
        follow-up posted just before the last reply is not left behind. It returns soon and must not raise."""
        self.provider = provider
        self.tools = tools
        self.context = context
        self.system_prompt = system_prompt
        self.session = session
        self.sink = sink
        self.limits = limits or Limits()
        self.messages: list[Message] = []
        self.compactor = compactor               # None: the context is never compacted
        self.notices = list(notices or [])
        self._check_in = check_in
        self._entry_ids: list[str | None] = []   # each message's session entry, parallel to `messages`
        self._replay = Replay()
        self.cancel_event = context.cancel
        self._stop_reason: ExitReason | None = None   # why cancel_event was set: "cancelled" or "wall_clock"
        self._stop_why: str | None = None   # who stopped it, when not the user (its worker stopping)
        self._steering: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._follow_ups: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._resumed = threading.Event()
        self._resumed.set()
        self._sink_lock = threading.Lock()
        self._sent: queue.SimpleQueue[ev.Event] = queue.SimpleQueue()   # controls' `sent`, for the next to emit
        self._ended = False
        self._inbox_lock = threading.Lock()   # a steer or follow-up goes in, or the loop is over: one or the other
        self._inbox_closed = False
        self._pool = ThreadPoolExecutor(max_parallel_tools, thread_name_prefix="pid-tool")
        self._calls_made = 0   # by the last reply, before _keep_calls

    @property
    def ended(self) -> bool:
        """Its loop is over: a steer or follow-up would reach no one (steer() and follow_up() say False)."""
        return self._inbox_closed

    # -- controls (any thread) --------------------------------------------------------------------------------------
    def load_history(self, entries: list[tuple[str | None, Message]],
                     compaction: dict[str, Any] | None = None) -> None:
        """A continued job's conversation so far, already in its session file: (entry id, message) pairs, so a later
        compaction can name the entry it keeps from. `compaction`: the session's latest compaction entry, when the
        conversation opens with its summary (pid.session.session_context_entries): a later compaction updates it."""
        self.messages = [message for _id, message in entries]
        self._entry_ids = [entry_id for entry_id, _message in entries]
        if self.compactor is not None and compaction is not None and entries and entries[0][0] is None \
                and isinstance(self.messages[0], UserMessage):
            self.compactor.resume(self.messages[0], str(compaction.get("summary", "")), compaction.get("details"))

    # Each control's `sent` event is queued before the control itself, so that its `received` (which the loop emits
    # after draining that queue) can never come first.
    def steer(self, text: str) -> bool:
        """Delivered after the running tool batch completes, before the next model call. False: the agent has
        ended, nothing took it."""
        return self._post("steer", self._steering, text)

    def follow_up(self, text: str) -> bool:
        """Delivered when the agent would otherwise stop; the loop then goes on. False: as steer()."""
        return self._post("follow_up", self._follow_ups, text)

    def _post(self, kind: ev.ControlKind, inbox: "queue.SimpleQueue[str]", text: str) -> bool:
        with self._inbox_lock:
            if self._inbox_closed:
                return False
            self._send(ev.Control(kind, "sent", text))
            inbox.put(text)
            return True

    def pause(self) -> None:
        if not self.cancel_event.is_set() and self._resumed.is_set():  # a cancelled agent must run to its end
            self._send(ev.Control("pause", "sent"))
            self._resumed.clear()

    def resume(self) -> None:
        if not self._resumed.is_set():
            self._send(ev.Control("resume", "sent"))
            self._resumed.set()

    def cancel(self, reason: ExitReason = "cancelled", why: str | None = None) -> None:
        """Stop at the next check. `why`: who stops it when it is not the user's cancel (its worker stopping)."""
        if self._stop_reason is None:
            self._stop_reason, self._stop_why = reason, why
            if reason == "cancelled":   # (a wall clock running out is the job's limit, not a control)
                self._send(ev.Control("cancel", "sent", why))
        self.cancel_event.set()
        self._resumed.set()

    # -- the loop ---------------------------------------------------------------------------------------------------
    def run(self, task: str) -> Outcome:
        timer = None
        if self.limits.wall_clock_s is not None:
            timer = threading.Timer(self.limits.wall_clock_s, self.cancel, args=("wall_clock",))
            timer.daemon = True
            timer.start()
        self._emit(ev.AgentStart())
        for text in self.notices:
            self._emit(ev.Notice(text))
        try:
            outcome = self._loop(task)
        finally:
            if timer:
                timer.cancel()
            self._pool.shutdown(wait=True, cancel_futures=True)
            with self._inbox_lock:   # what came after the loop last looked (its last model call, a limit) is said
                self._inbox_closed = True
                left = _drain(self._steering, "steer") + _drain(self._follow_ups, "follow_up")
        for kind, text in left:
            self._emit(ev.Notice(undelivered(kind or "steer", text)))
        self._emit(ev.AgentEnd(outcome.status, outcome.exit_reason))
        self._ended = True
        return outcome

    def _loop(self, task: str) -> Outcome:
        out = Outcome("stop")
        pending: list[tuple[ev.ControlKind | None, str]] = [(None, task)]   # user messages that open the next turn
        consecutive_timeouts = 0
        while True:
            if self._check_in is not None:
                self._check_in()
            if not self._resumed.is_set():
                self._emit(ev.Control("pause", "received"))
                self._resumed.wait()    # what was steered while paused goes into the very next call
                if not self.cancel_event.is_set():
                    self._emit(ev.Control("resume", "received"))
            if self.cancel_event.is_set():
                self._take_in(pending)   # the transcript keeps what was asked, even if no model call followed
                return self._stopped(out)
            if (spent := self._no_room(out)) is not None:   # (its earlier attempts' cost may have used it all)
                return _end(out, *spent)
            stop = self.limits.gate() if self.limits.gate is not None else None
            if stop is not None:
                self._take_in(pending)
                return _end(out, *stop)
            out.turns += 1
            turn = out.turns
            self._emit(ev.TurnStart(turn))
            self._take_in(pending + _drain(self._steering, "steer"))
            pending = []
            reply, overflow = self._ask_fitting(turn, out)
            if overflow is not None:
                self._emit(ev.TurnEnd(turn, reply, []))
                return _end(out, "context_overflow", overflow)
            if reply.stop_reason == "aborted" or self.cancel_event.is_set():
                self._emit(ev.TurnEnd(turn, reply, []))
                return self._stopped(out)
            if reply.stop_reason == "error":
                self._emit(ev.TurnEnd(turn, reply, []))
                if (over := self._over_cost(out)) is not None:   # (its failed attempts count: retrying stopped)
                    return _end(out, "max_cost", over)
                return _end(out, "provider_error", reply.error_message or "model request failed")
            calls = reply.tool_calls
            try:
                results = self._run_tools(reply) if calls else []
            except SandboxLost as exc:   # nothing more can run: end now, truthfully
                self._emit(ev.TurnEnd(turn, reply, []))
                if self.cancel_event.is_set():
                    return self._stopped(out)
                return _end(out, "sandbox_error", str(exc))
            out.tool_calls += self._calls_made   # (those left out of the transcript too: the model made them)
            for result in results:
                self._add(result)
            self._emit(ev.TurnEnd(turn, reply, results))
            if self.cancel_event.is_set():
                return self._stopped(out)
            # Counted by turn, so that the model has seen each timeout before the next counts: a turn whose commands
            # all ran out of time adds one, a command that finished in time starts over.
            commands = [r for r in results if r.tool_name == "bash"]
            if commands and all(r.details and r.details.get("timedOut") for r in commands):
                consecutive_timeouts += 1
            elif commands:
                consecutive_timeouts = 0
            if consecutive_timeouts >= self.limits.max_consecutive_timeouts:
                return _end(out, "consecutive_timeouts",
                            f"the commands of {consecutive_timeouts} turns in a row timed out")
            # The cap is looked at before each model call: a reply that ends the job with its answer completes it,
            # whatever that last call cost (a steer or follow-up that asks for more is looked at before its call).
            if (calls or reply.stop_reason != "stop") and (over := self._over_cost(out)) is not None:
                return _end(out, "max_cost", over)
            if not calls:
                pending = self._mail_after(out, reply)
                if not pending:
                    return out

    def _mail_after(self, out: Outcome, reply: AssistantMessage) -> list[tuple[ev.ControlKind | None, str]]:
        """After an answer with no tool call: the steers (else the follow-ups) that open the next turn, or none when
        the job ends with this answer (`out` then says how)."""
        if self._check_in is not None:
            self._check_in()
        # a steer that came during this last reply is not dropped; follow-ups wait for exactly this moment
        if (spent := self._no_room(out)) is None:
            pending = _drain(self._steering, "steer") or _drain(self._follow_ups, "follow_up")
            if pending:
                return pending
        out.final_message = reply.text
        if spent is not None and not (self._steering.empty() and self._follow_ups.empty()):
            _end(out, *spent)   # more was asked than its limits leave room for: run() says it was not delivered
        elif reply.stop_reason == "length":   # cut short: it never said it was done
            _end(out, "length", "the model's answer was cut at its output-token limit")
        return []

    def _call_model(self, turn: int, out: Outcome, context: list[Message]) -> AssistantMessage:
        """One model call, retried by the provider; each wait is an event, and the deltas say which attempt. What a
        failed attempt reported using counts, so a retry that the cost cap no longer leaves room for is not made."""
        attempt = 1

        def retrying(notice: RetryNotice) -> bool:
            nonlocal attempt
            if not self._retry_within_cost(turn, out, notice):
                return False
            attempt = notice.attempt + 1
            return True

        return self.provider.stream(self.system_prompt, context, self.tools.specs(), cancel=self.cancel_event,
                                    on_text=lambda text: self._emit(ev.TextDelta(turn, text, attempt)),
                                    on_retry=retrying)

    def _retry_within_cost(self, turn: int, out: Outcome, notice: RetryNotice) -> bool:
        """Whether a failed model call (the loop's, or a summary's) is tried again: not once what its attempts
        reported using would pass the cost cap. The wait is an event."""
        if self._over_cost(out, notice.usage) is not None:
            return False
        self._emit(ev.ModelRetry(turn, notice.attempt, notice.wait_s, notice.reason, notice.status, notice.error))
        return True

    def _ask(self, turn: int, out: Outcome) -> AssistantMessage:
        """One model call on the current context; its reply joins the transcript (a failed one is never replayed)."""
        context = self._context_messages()
        reply = self._call_model(turn, out, context)
        if reply.usage.total_tokens == 0 and reply.stop_reason not in ("error", "aborted"):
            reply.usage = price(estimate_usage(get_counter(), self.system_prompt, context, reply, self.tools.specs()),
                                self.provider.config)
        out.usage.add(reply.usage)
        if reply.retried_usage is not None:   # (the job's count, not the message's: see AssistantMessage)
            out.usage.add(reply.retried_usage)
        self._calls_made = _keep_calls(reply, MAX_CALLS_PER_REPLY + 1)
        self._add(reply)
        return reply

    # -- compaction (pid/compaction.py decides and summarises; the loop records it) ---------------------------------
    def _ask_fitting(self, turn: int, out: Outcome) -> tuple[AssistantMessage, str | None]:
        """The model's reply, the context compacted first when it would not fit, and once more (then asked again)
        when the provider refuses it for its length. The second value, if any, is why the job ends (context_overflow).
        """
        if self.compactor is not None:
            tokens = self._context_tokens()
            if self.compactor.should_compact(tokens):
                # failing, the call goes ahead: the window may still hold it
                self._compact(turn, out, "threshold", tokens)
        reply = self._ask(turn, out)
        if not is_context_overflow(reply) or self.cancel_event.is_set():
            return reply, None
        refused = reply.error_message or "refused for its length"
        if self.compactor is None:
            return reply, OVERFLOW_ERROR.format(detail=refused)
        problem = self._compact(turn, out, "overflow", self._context_tokens())
        if problem is not None:
            return reply, None if self.cancel_event.is_set() else \
                OVERFLOW_ERROR.format(detail=f"{refused}; compacting did not help: {problem}")
        reply = self._ask(turn, out)
        if is_context_overflow(reply):
            return reply, OVERFLOW_ERROR.format(detail=f"still refused after compacting: {reply.error_message}")
        return reply, None

    def _context_tokens(self) -> int:
        assert self.compactor is not None
        return self.compactor.context_tokens(self.system_prompt, self.tools.specs(), self._context_messages(),
                                             self.messages)

    def _compact(self, turn: int, out: Outcome, reason: str, tokens: int) -> str | None:
        """Summarise the older part of the conversation; the session gets pi's compaction entry. Returns why it could
        not be done, or None."""
        assert self.compactor is not None
        self._emit(ev.CompactionStart(reason, tokens))
        try:
            done = self.compactor.compact(self.messages, tokens, reason=reason, cancel=self.cancel_event,
                                          on_retry=lambda notice: self._retry_within_cost(turn, out, notice))
        except CompactionFailed as exc:
            out.usage.add(exc.usage)
            self._emit(ev.CompactionEnd(reason, tokens, error=str(exc), usage=exc.usage))
            return str(exc)
        out.usage.add(done.usage)
        first_kept_id = self._entry_ids[done.first_kept]
        if self.session and first_kept_id:
            self.session.compaction(done.summary, first_kept_id, done.tokens_before, done.details())
        self._emit(ev.CompactionEnd(reason, tokens, self._context_tokens(), done.summarized, done.summary,
                                    will_retry=reason == "overflow", usage=done.usage))
        return None

    def _run_tools(self, reply: AssistantMessage) -> list[ToolResultMessage]:
        calls = reply.tool_calls
        if reply.stop_reason == "length":
            return [_result_message(c, ToolResult.error(LENGTH_STOP_TOOL_ERROR.format(name=c.name)))
                    for c in calls]
        calls, refused = calls[:MAX_CALLS_PER_REPLY], calls[MAX_CALLS_PER_REPLY:]
        left_out = self._calls_made - MAX_CALLS_PER_REPLY - 1
        after = LEFT_OUT_CALLS.format(count=left_out) if left_out > 0 else ""
        too_many = [_result_message(c, ToolResult.error(TOO_MANY_CALLS_ERROR.format(
            name=c.name, limit=MAX_CALLS_PER_REPLY, made=self._calls_made, after=after))) for c in refused]
        if len(calls) == 1:
            return [self._run_tool(calls[0])] + too_many
        return list(self._pool.map(self._run_tool, calls)) + too_many  # map keeps the order of the model's calls

    def _run_tool(self, call: ToolCall) -> ToolResultMessage:
        self._emit(ev.ToolStart(call.id, call.name, call.arguments))
        started = time.monotonic()

        def update(partial: str) -> None:
            self._emit(ev.ToolUpdate(call.id, call.name, partial))

        result = self.tools.execute(call, dataclasses.replace(self.context, on_update=update))
        message = _result_message(call, result)
        self._emit(ev.ToolEnd(call.id, call.name, message, time.monotonic() - started))
        return message

    def _context_messages(self) -> list[Message]:
        """What the model sees: failed or aborted replies are left out, and every tool call it sees has a result."""
        if self.compactor is not None and self.compactor.latest is not None:
            return self._replay.messages(self.messages, self.compactor.summary_message(), self.compactor.first_kept)
        return self._replay.messages(self.messages)

    def _take_in(self, pending: list[tuple[ev.ControlKind | None, str]]) -> None:
        """User messages into the conversation; a steer's or follow-up's is `received` as it joins."""
        for kind, text in pending:
            if kind is not None:
                self._emit(ev.Control(kind, "received", text))
            self._add(UserMessage.text(text))

    def _add(self, message: Message) -> None:
        self.messages.append(message)
        self._entry_ids.append(self.session.message(message) if self.session else None)
        self._emit(ev.MessageEnd(message))

    def _emit(self, event: ev.Event) -> None:
        with self._sink_lock:     # tool threads emit too; a sink never sees two events at once
            if not self._sent.empty():
                self._emit_sent()     # a control sent meanwhile comes first
            self.sink(event)
        if not self._sent.empty():
            self._emit_sent_soon()

    def _send(self, event: ev.Control) -> None:
        """A control's `sent`, from any thread, a signal handler's included: it never waits for the sink (the thread
        it interrupted may be inside it); whoever holds the sink emits it when done. None after agent_end."""
        if not self._ended:
            self._sent.put(event)
            self._emit_sent_soon()

    def _emit_sent_soon(self) -> None:
        """Emit the queued `sent` events now, unless another thread (or this one, interrupted) is emitting: it will.
        """
        while not self._sent.empty() and self._sink_lock.acquire(blocking=False):
            try:
                self._emit_sent()
            finally:
                self._sink_lock.release()

    def _emit_sent(self) -> None:
        while not self._sent.empty():
            self.sink(self._sent.get())

    def _stopped(self, out: Outcome) -> Outcome:
        if self._stop_reason == "wall_clock":
            return _end(out, "wall_clock",
                        f"wall-clock limit of {self.limits.wall_clock_s:g}s (--timeout) reached")
        if self._stop_reason is None:   # its cancel event was set from outside: a cancel all the same
            self.cancel()
        self._emit(ev.Control("cancel", "received", self._stop_why))
        return _end(out, "cancelled", None)

    def _no_room(self, out: Outcome) -> tuple[ExitReason, str] | None:
        """Why no further model call may be made (its turns, or its cost cap, spent), or None."""
        if self.limits.max_turns is not None and out.turns >= self.limits.max_turns:
            return "max_turns", f"reached max_turns ({self.limits.max_turns})"
        if (over := self._over_cost(out)) is not None:
            return "max_cost", over
        return None

    def _over_cost(self, out: Outcome, more: Usage | None = None) -> str | None:
        """Why the job's cost passed max_cost (this attempt's and its earlier ones', and `more` not yet counted), or
        None."""
        if self.limits.max_cost is None:
            return None
        spent = out.usage.cost.total + self.limits.spent_cost + (more.cost.total if more is not None else 0.0)
        limit = self.limits.max_cost
        if spent <= limit:
            return None
        digits = next((d for d in range(4, 12) if f"{spent:.{d}f}" != f"{limit:.{d}f}"), 12)   # (never $x > $x)
        return (f"cost ${spent:.{digits}f} exceeded --max-cost ${limit:.{digits}f}"
                + (" over its attempts" if self.limits.spent_cost else ""))


def _result_message(call: ToolCall, result: ToolResult) -> ToolResultMessage:
    details = result.details
    if result.timed_out:
        details = {**(details or {}), "timedOut": True}
    return ToolResultMessage(call.id, call.name, list(result.content), result.is_error, details)


def _end(out: Outcome, reason: ExitReason, error: str | None) -> Outcome:
    out.exit_reason, out.error = reason, error
    return out


def undelivered(kind: str, text: str) -> str:
    """What a job's log says of a steer or follow-up no agent took."""
    return (f"{kind.replace('_', '-')} not delivered: the agent had ended (`pid continue` carries on with a message): "
            f"{text[:200]}{'…' if len(text) > 200 else ''}")


def _drain(pending: "queue.SimpleQueue[str]", kind: ev.ControlKind) -> list[tuple[ev.ControlKind | None, str]]:
    texts: list[tuple[ev.ControlKind | None, str]] = []
    while not pending.empty():
        texts.append((kind, pending.get()))
    return texts


def _keep_calls(reply: AssistantMessage, most: int) -> int:
    """Leave at most `most` tool calls in `reply` (its other content stays, in order); how many it made."""
    made = len(reply.tool_calls)
    if made > most:
        kept = 0
        content = []
        for block in reply.content:
            if isinstance(block, ToolCall):
                kept += 1
                if kept > most:
                    continue
            content.append(block)
        reply.content = content
    return made
