"""Retries a batch survives: rate limits, overloads, server errors, broken connections and streams are waited out
(the server's Retry-After and rate-limit reset headers honoured, else backoff with full jitter), each wait is an
event, cancel ends a wait at once, and a retried call never duplicates its partial reply. Waits here are short
(fractions of a second); the one real-time test (a 40 s rate limit through `pid run`) is at the end."""
from __future__ import annotations

import json
import threading
import time
from email.utils import formatdate
from datetime import datetime, timezone

import pytest

from pid import events as ev
from pid.agent import Agent
from pid.event_records import EventRecords
from pid.messages import AssistantMessage, UserMessage
from pid.providers import make_provider
from pid.providers.base import ProviderConfig
from pid.providers import retry
from pid.providers.retry import RetryNotice, RetryPolicy, parse_duration, server_delay
from pid.session import SessionWriter
from pid.tools.base import ToolContext
from pid.tools.registry import default_registry
from tests.memory_sandbox import Commands, MemorySandbox, Run
from tests.scripted_llm import ScriptedLLM

OPENAI = "openai-completions"
ANTHROPIC = "anthropic-messages"
BOTH = [OPENAI, ANTHROPIC]
HELLO = [UserMessage.text("hello")]
SHORT = {"retry_base_s": 0.01, "max_retry_wait_s": 0.3, "retry_budget_s": 5.0}


def provider(llm: ScriptedLLM, api: str = OPENAI, **overrides):
    return make_provider(ProviderConfig(model="m", base_url=llm.base_url, api=api, provider="scripted",
                                        **{**SHORT, **overrides}))


class RetryClock:
    """The retry clock, set by a test: each wait is recorded and moves the clock on, and none takes any time."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def wait(self, seconds: float, cancel: threading.Event | None) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return False


@pytest.fixture
def retry_clock(monkeypatch: pytest.MonkeyPatch) -> RetryClock:
    clock = RetryClock()
    monkeypatch.setattr(retry, "clock", lambda: clock.now)
    monkeypatch.setattr(retry, "interruptible_wait", clock.wait)
    return clock


def stream(p, **kwargs) -> tuple[AssistantMessage, list[RetryNotice], list[str]]:
    notices: list[RetryNotice] = []
    deltas: list[str] = []
    reply = p.stream("", HELLO, [], on_retry=notices.append, on_text=deltas.append, **kwargs)
    return reply, notices, deltas


# -- what the server asks for ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5),
                                           ("0s", 0.0), ("", None), ("soon", None), ("5", None), ("1s2", None)])
def test_openai_reset_durations(text, seconds):
    assert parse_duration(text) == (pytest.approx(seconds) if seconds is not None else None)


def test_retry_after_seconds_and_http_date():
    now = time.time()
    assert server_delay(503, {"Retry-After": "12"}, now) == 12
    assert server_delay(429, {"retry-after": formatdate(now + 30, usegmt=True)}, now) == pytest.approx(30, abs=1)
    assert server_delay(429, {"Retry-After": formatdate(now - 30, usegmt=True)}, now) == 0
    assert server_delay(429, {"retry-after-ms": "1500", "Retry-After": "2"}, now) == 1.5
    assert server_delay(429, {"Retry-After": "whenever"}, now) is None
    assert server_delay(429, {}, now) is None


def test_openai_rate_limit_headers_name_the_exhausted_limit():
    headers = {"x-ratelimit-remaining-requests": "57", "x-ratelimit-reset-requests": "6m0s",
               "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "20ms"}
    assert server_delay(429, headers) == pytest.approx(0.02)
    both = {**headers, "x-ratelimit-remaining-requests": "0"}
    assert server_delay(429, both) == pytest.approx(360)
    unknown = {"x-ratelimit-reset-requests": "6m0s", "x-ratelimit-reset-tokens": "1s"}
    assert server_delay(429, unknown) == pytest.approx(1)       # nothing says which: the soonest
    assert server_delay(500, headers) is None                    # a reset header only explains a 429


def test_anthropic_rate_limit_reset_is_an_rfc3339_time():
    now = time.time()
    later = datetime.fromtimestamp(now + 42, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    headers = {"anthropic-ratelimit-input-tokens-remaining": "0", "anthropic-ratelimit-input-tokens-reset": later,
               "anthropic-ratelimit-requests-remaining": "49",
               "anthropic-ratelimit-requests-reset": datetime.fromtimestamp(now + 1, tz=timezone.utc).isoformat()}
    assert server_delay(429, headers, now) == pytest.approx(42, abs=0.01)


def test_backoff_has_full_jitter_and_every_wait_is_capped():
    policy = RetryPolicy(max_wait_s=60, budget_s=900, base_s=1)
    waits = [policy.wait_before_retry(3, retry.SERVER_ERROR, None, 0) for _ in range(300)]
    assert all(0 <= w <= 4 for w in waits) and max(waits) > 3 and min(waits) < 1   # uniform(0, 1 * 2**2)
    assert all(policy.wait_before_retry(20, retry.SERVER_ERROR, None, 0) <= 60 for _ in range(50))
    assert policy.wait_before_retry(1, retry.RATE_LIMITED, 5, 0) == 5              # the server's word, exactly
    assert policy.wait_before_retry(1, retry.RATE_LIMITED, 3600, 0) == 60          # ...up to --max-retry-wait


def test_a_server_asking_for_no_wait_gets_the_backoff():
    """`Retry-After: 0` (or a date gone by) on every 500 had pid ask again at once: ~2,500 requests a second."""
    policy = RetryPolicy(max_wait_s=60, budget_s=900, base_s=1)
    for asked in (0.0, -5.0, 0.001):
        waits = [policy.wait_before_retry(5, retry.SERVER_ERROR, asked, 0) for _ in range(200)]
        assert all(0 <= w <= 16 for w in waits) and max(waits) > 2   # uniform(0, 1 * 2**4), as with none asked
    assert retry.server_delay(500, {"retry-after-ms": "0", "Retry-After": "5"}) == 5   # (the 0 hid the 5)


def test_the_budget_and_the_caps_end_the_retries():
    policy = RetryPolicy(max_wait_s=60, budget_s=900, base_s=1)
    assert policy.wait_before_retry(9, retry.RATE_LIMITED, 60, 840) == 60
    assert policy.wait_before_retry(9, retry.RATE_LIMITED, 60, 841) is None        # would pass the budget
    assert policy.wait_before_retry(2, retry.UNREACHABLE, None, 0) is not None
    assert policy.wait_before_retry(3, retry.UNREACHABLE, None, 0) is None         # a wrong URL: 3 attempts
    assert policy.wait_before_retry(9, retry.UNREACHABLE, None, 0, answered=True) is not None   # a restart
    assert RetryPolicy(max_retries=2).wait_before_retry(3, retry.SERVER_ERROR, None, 0) is None


# -- the provider retries --------------------------------------------------------------------------------------

@pytest.mark.parametrize("api", BOTH)
def test_a_rate_limit_is_waited_out_honouring_retry_after(api, retry_clock):
    # three 429s by count, not for a time span: a loaded machine fits fewer retries into one
    limited = {"error": {"status": 429, "headers": {"Retry-After": "0.2"}}}
    with ScriptedLLM([limited, limited, limited, {"text": "made it"}]) as llm:
        reply, notices, _ = stream(provider(llm, api))
        assert (reply.stop_reason, reply.text) == ("stop", "made it")
        assert len(llm.requests) == len(notices) + 1 == 4
        assert all(r == llm.requests[0] for r in llm.requests)   # the same call, repeated whole
    assert [n.attempt for n in notices] == [1, 2, 3]
    assert all((n.reason, n.status, n.wait_s) == ("rate limited", 429, 0.2) for n in notices)
    assert "HTTP 429" in notices[0].error
    assert retry_clock.waits == [0.2, 0.2, 0.2]   # the waits were waited, each before its retry


def test_a_longer_retry_after_is_capped_by_max_retry_wait(retry_clock):
    with ScriptedLLM([{"error": {"status": 429, "headers": {"Retry-After": "30"}}}, {"text": "ok"}]) as llm:
        reply, notices, _ = stream(provider(llm, max_retry_wait_s=0.2))
    assert reply.text == "ok" and notices[0].wait_s == 0.2 and retry_clock.waits == [0.2]


def test_openai_reset_header_sets_the_wait():
    headers = {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "150ms",
               "x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": "6m0s"}
    with ScriptedLLM([{"error": {"status": 429, "headers": headers}}, {"text": "ok"}]) as llm:
        reply, notices, _ = stream(provider(llm, max_retry_wait_s=60))
    assert reply.text == "ok" and notices[0].wait_s == pytest.approx(0.15)


@pytest.mark.parametrize("api", BOTH)
def test_server_errors_and_anthropic_overload_are_retried(api):
    overloaded = {"status": 529, "body": {"type": "error", "error": {"type": "overloaded_error",
                                                                     "message": "Overloaded"}}}
    with ScriptedLLM([{"error": {"status": 500}}, {"error": {"status": 503}}, {"error": overloaded},
                      {"text": "fine"}]) as llm:
        reply, notices, _ = stream(provider(llm, api))
    assert reply.text == "fine"
    assert [(n.status, n.reason) for n in notices] == [(500, "server error"), (503, "server error"),
                                                      (529, "overloaded")]


def test_an_overloaded_error_event_inside_an_anthropic_stream_is_retried():
    with ScriptedLLM([{"stream_error": "Overloaded"}, {"text": "second time lucky"}]) as llm:
        reply, notices, _ = stream(provider(llm, ANTHROPIC))
    assert reply.text == "second time lucky"
    assert notices[0].reason == "overloaded" and "Overloaded" in notices[0].error
    assert notices[0].status is None   # (the stream came with a 200: shown as "HTTP 529", it named none sent)


def test_a_server_error_chunk_inside_an_openai_stream_is_retried():
    refused = sse_error({"message": "context too long", "type": "invalid_request_error", "code": "bad_request"})
    with ScriptedLLM([{"stream_error": "upstream hiccup"},          # {"error": {"code": 502, ...}}
                      {"raw": [sse_error({"message": "Rate limit reached", "type": "rate_limit_exceeded"})]},
                      {"text": "third time"}, {"raw": [refused]}, {"text": "must not be reached"}]) as llm:
        p = provider(llm)
        reply, notices, _ = stream(p)
        assert reply.text == "third time" and [n.reason for n in notices] == ["server error", "rate limited"]
        reply, notices, _ = stream(p)
        assert len(llm.requests) == 4
    assert reply.stop_reason == "error" and notices == [] and "context too long" in reply.error_message


def sse_error(error: dict) -> str:
    return "data: " + json.dumps({"error": error}) + "\n\n"


def test_a_request_error_inside_a_stream_is_not_retried():
    with ScriptedLLM([{"stream_error": "bad tool schema", "stream_error_type": "invalid_request_error"},
                      {"text": "must not be reached"}]) as llm:
        reply, notices, _ = stream(provider(llm, ANTHROPIC))
        assert len(llm.requests) == 1
    assert reply.stop_reason == "error" and notices == [] and "bad tool schema" in reply.error_message


@pytest.mark.parametrize("api", BOTH)
@pytest.mark.parametrize("broken", [{"break_after": 4}, {"cut": True}], ids=["connection-drop", "early-end"])
def test_a_stream_broken_mid_reply_is_retried_whole_without_duplicated_text(api, broken):
    text = "The first half of the answer, then the second half."
    with ScriptedLLM([{"text": text, **broken}, {"text": text}]) as llm:
        reply, notices, deltas = stream(provider(llm, api))
    assert (reply.stop_reason, reply.text) == ("stop", text)          # once, not the partial text plus the whole
    assert [n.reason for n in notices] == ["stream broke"]
    assert deltas and "".join(deltas).endswith(text) and "".join(deltas) != text   # the live view saw both tries


@pytest.mark.parametrize("api", BOTH)
def test_a_server_that_never_answers_in_time_is_retried(api):
    with ScriptedLLM([{"text": "late", "delay_s": 30}, {"text": "prompt"}]) as llm:
        reply, notices, _ = stream(provider(llm, api, read_timeout_s=0.3))
    assert reply.text == "prompt" and notices[0].reason == "timed out"


def test_the_retry_budget_ends_a_call_with_the_last_error(retry_clock):
    """On the retry clock, where only the waits take time (a loaded machine's slow requests would eat the budget)."""
    with ScriptedLLM([{"error": {"status": 429, "message": "slow down", "headers": {"Retry-After": "0.2"}},
                       "repeat_s": 60}]) as llm:
        reply, notices, _ = stream(provider(llm, retry_budget_s=0.5))
    assert reply.stop_reason == "error" and "slow down" in reply.error_message
    assert len(notices) == 2 and f"after {len(notices) + 1} attempts" in reply.error_message
    assert retry_clock.now == pytest.approx(0.4)   # two waits of 0.2: a third would end past the budget


@pytest.mark.parametrize("api", BOTH)
def test_cancel_interrupts_a_wait_at_once(api, monkeypatch):
    """The real wait, entered for 30 s, returns as cancelled once the cancel comes (a wait that did not would end
    uncancelled after 30 s)."""
    cancel = threading.Event()
    real_wait = retry.interruptible_wait
    entered = threading.Event()
    waited: list[tuple[float, bool]] = []

    def wait(seconds: float, event: threading.Event | None) -> bool:
        entered.set()
        waited.append((seconds, real_wait(seconds, event)))
        return waited[-1][1]
    monkeypatch.setattr(retry, "interruptible_wait", wait)
    with ScriptedLLM([{"error": {"status": 429, "headers": {"Retry-After": "30"}}}, {"text": "never"}]) as llm:
        p = provider(llm, api, max_retry_wait_s=60, retry_budget_s=900)
        notices: list[RetryNotice] = []
        threading.Thread(target=lambda: entered.wait(60) and cancel.set(), daemon=True).start()
        reply = p.stream("", HELLO, [], cancel=cancel, on_retry=notices.append)
        assert len(llm.requests) == 1
    assert reply.stop_reason == "aborted" and reply.content == [] and notices[0].wait_s == 30
    assert waited == [(30, True)]   # the 30 s wait ended as cancelled


# -- the agent: events, transcript, cancel -----------------------------------------------------------------------

def make_agent(llm, box, sink, session=None, **config) -> Agent:
    p = make_provider(ProviderConfig(model="m", base_url=llm.base_url, **{**SHORT, **config}))
    return Agent(p, default_registry(), ToolContext(sandbox=box), "system prompt", sink=sink, session=session)


def test_a_retried_call_leaves_one_reply_in_the_transcript_and_says_so_in_events(tmp_path):
    text = "Here is the whole answer, streamed in pieces."
    events: list[ev.Event] = []
    with ScriptedLLM([{"text": text, "break_after": 3}, {"error": {"status": 429}}, {"text": text}]) as llm, \
            MemorySandbox(Commands({"true": Run()})) as box:
        with SessionWriter(str(tmp_path / "session.jsonl")) as session:
            outcome = make_agent(llm, box, events.append, session).run("go")
    assert outcome.status == "completed" and outcome.final_message == text and outcome.turns == 1
    retries = [e for e in events if isinstance(e, ev.ModelRetry)]
    assert [(r.turn, r.attempt, r.reason, r.status) for r in retries] == [(1, 1, "stream broke", None),
                                                                         (1, 2, "rate limited", 429)]
    deltas = [e for e in events if isinstance(e, ev.TextDelta)]
    assert "".join(d.text for d in deltas if d.attempt == 3) == text           # what a live view keeps
    assert {d.attempt for d in deltas} == {1, 3}                                # the 429 streamed nothing
    entries = [json.loads(line) for line in (tmp_path / "session.jsonl").read_text().splitlines()]
    assistants = [e["message"] for e in entries if e.get("message", {}).get("role") == "assistant"]
    assert len(assistants) == 1 and assistants[0]["content"] == [{"type": "text", "text": text}]
    records = [r for r in map(EventRecords(), events) if r and r["type"] == "model_retry"]
    assert records[1]["message"].startswith("rate limited, retrying ") and records[1]["status"] == 429


def test_cancel_during_a_wait_ends_the_job_at_once(monkeypatch):
    events: list[ev.Event] = []
    real_wait = retry.interruptible_wait
    waited: list[tuple[float, bool]] = []

    def wait(seconds: float, event: threading.Event | None) -> bool:
        waited.append((seconds, real_wait(seconds, event)))
        return waited[-1][1]
    monkeypatch.setattr(retry, "interruptible_wait", wait)
    with ScriptedLLM([{"error": {"status": 429, "headers": {"Retry-After": "30"}}}, {"text": "never"}]) as llm, \
            MemorySandbox(Commands({"true": Run()})) as box:
        agent = make_agent(llm, box, events.append, max_retry_wait_s=60, retry_budget_s=900)

        def cancel_once_waiting() -> None:
            while not any(isinstance(e, ev.ModelRetry) for e in events):
                time.sleep(0.01)
            agent.cancel()

        threading.Thread(target=cancel_once_waiting, daemon=True).start()
        outcome = agent.run("go")
    assert outcome.status == "cancelled" and waited == [(30, True)]   # the 30 s wait ended as cancelled
    assert isinstance(events[-1], ev.AgentEnd) and events[-1].exit_reason == "cancelled"


def test_pid_status_says_the_job_is_waiting_to_retry():
    from pid.jobs.progress import Progress
    progress = Progress()
    progress.on_event(ev.TurnStart(3))
    progress.on_event(ev.ModelRetry(3, 2, 12.0, "rate limited", 429, "HTTP 429 from ..."))
    assert progress.snapshot()["activity"] == "turn 3: rate limited, retrying in 12 s (attempt 2 failed)"
    progress.on_event(ev.TextDelta(3, "Here", 3))          # the retried call answers: the wait is over
    assert progress.snapshot()["activity"] == "turn 3: the model is answering (attempt 3)"
    progress.on_event(ev.TextDelta(3, " it is", 3))
    assert progress.snapshot()["activity"] == "turn 3: the model is answering (attempt 3)"


# -- the real CLI: a 40 s rate limit -------------------------------------------------------------------------------

@pytest.mark.long
@pytest.mark.docker   # `pid run`: a real job, in a real container
@pytest.mark.cli
def test_pid_run_waits_out_a_40_second_rate_limit_and_shows_the_waits(run_pid, pid_env, sample_repo, tmp_path):
    """The acceptance case: 429 with Retry-After: 5 for 40 s, then success. Also wires --thinking and the cache
    prices through the CLI into the request and the cost."""
    script = [{"error": {"status": 429, "headers": {"Retry-After": "5"}}, "repeat_s": 40},
              {"text": "done despite the limit", "usage": {"prompt_tokens": 1000, "completion_tokens": 10,
                                                         "cached_tokens": 800}}]
    with ScriptedLLM(script) as llm:
        res = run_pid("run", "say done", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url,
                      "--out", str(tmp_path / "out"), "--thinking", "low", "--input-price", "1",
                      "--cache-read-price", "0.5", timeout=200)
        requests = list(llm.requests)
    assert res.code == 0, res.stderr   # (the server answered 429 for its first 40 s, by its own clock)
    waits = [line for line in res.stderr.splitlines() if "rate limited, retrying in 5.0 s" in line]
    assert len(waits) == len(requests) - 1 >= 8
    assert "HTTP 429, attempt 1 failed" in waits[0]
    assert requests[-1]["reasoning_effort"] == "low"
    job_id = res.stderr.split()[1].rstrip(":")
    result = json.loads((tmp_path / "out" / job_id / "result.json").read_text())
    assert result["status"] == "completed" and result["usage"]["cache_read"] == 800
    assert result["usage"]["cost"] == pytest.approx((200 * 1 + 800 * 0.5) / 1e6)
    logs = run_pid("logs", job_id)
    assert logs.code == 0 and logs.stdout.count("rate limited, retrying in 5.0 s") == len(waits)
    as_json = [json.loads(line) for line in run_pid("logs", job_id, "--json").stdout.splitlines()]
    retries = [r for r in as_json if r["type"] == "model_retry"]
    assert [r["attempt"] for r in retries] == list(range(1, len(waits) + 1))
    assert all((r["status"], r["wait_s"], r["reason"]) == (429, 5, "rate limited") for r in retries)


@pytest.mark.parametrize("api", BOTH)
def test_a_501_is_permanent_one_request_and_its_error(api):
    """Not Implemented: the server cannot do this request at all, so asking again cannot help."""
    with ScriptedLLM([{"error": {"status": 501, "message": "tools are not implemented"}}, {"text": "never"}]) as llm:
        reply, notices, _ = stream(provider(llm, api))
        assert len(llm.requests) == 1
    assert reply.stop_reason == "error" and notices == []
    assert "HTTP 501" in (reply.error_message or "") and "tools are not implemented" in (reply.error_message or "")
    assert retry.reason_for_status(500) == retry.SERVER_ERROR and retry.reason_for_status(505) is None
