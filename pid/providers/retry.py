"""When a failed model call is tried again, and after how long.

A batch against a real provider meets rate limits, overloads and broken connections within minutes; a job must wait
them out instead of failing. What is retried: HTTP 408, 429 and 5xx (Anthropic's 529 `overloaded` among them) but
501 and 505 (the server cannot do the request at all), an error event of those kinds inside a stream, connection
resets and timeouts, and a stream that breaks or ends before the reply finished. The whole call is repeated; the
partial reply of the failed attempt is dropped.

How long: what the server asks for (`Retry-After` in seconds or as an HTTP date, `retry-after-ms`, or on a 429 the
rate-limit reset headers of OpenAI and Anthropic; a wait under 0.1 s is none asked), else exponential backoff with
full jitter. Each wait is capped at `max_wait_s`; one call's retrying (from its first failure: the waits and the
attempts after it) stays within `budget_s`: no wait starts that would end past it. A refused connection (nothing
listening, an unknown host) to an endpoint that has not yet answered the job is most likely a wrong URL, so it gets
only UNREACHABLE_RETRIES retries; once the endpoint has answered, a refusal is a server restarting (a local one
reloading its model), retried as any failure. An answer that is not HTTP pid can read (a bad status line or header, a
broken chunk) comes back the same for the same request: it gets MALFORMED_RETRIES retries, not the whole budget.
"""
from __future__ import annotations

import math
import random
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Callable, Mapping

from pid.messages import Usage

UNREACHABLE_RETRIES = 2
MIN_ASKED_S = 0.1   # a server's asked wait below this is taken as none asked: the backoff holds
MALFORMED_RETRIES = 2
EMPTY_RETRIES = 2   # an empty response is most likely a refusal for length: the loop compacts instead (see EMPTY)

# What a retryable failure was, as the wait's event says it ("rate limited, retrying in 12 s").
RATE_LIMITED = "rate limited"
OVERLOADED = "overloaded"
SERVER_ERROR = "server error"
CONNECTION = "connection failed"
TIMEOUT = "timed out"
STREAM_BROKE = "stream broke"
EMPTY = "empty response"
UNREACHABLE = "unreachable"
MALFORMED = "malformed response"


@dataclass
class RetryPolicy:
    max_wait_s: float = 60.0            # the longest single wait, whatever a server asks for
    budget_s: float = 900.0             # one model call's retrying: from its first failure to its last attempt
    base_s: float = 1.0                 # backoff: uniform(0, min(max_wait_s, base_s * 2**(attempt-1)))
    max_retries: int | None = None      # None: as many as the budget allows

    def wait_before_retry(self, attempt: int, reason: str, asked_s: float | None, spent_s: float,
                          answered: bool = False, in_a_row: int = 1) -> float | None:
        """Seconds to wait before attempt `attempt + 1`, or None to give up (`spent_s`: time since the call
        first failed, later attempts included; `answered`: the endpoint has answered this job before; `in_a_row`:
        how many of the latest attempts failed for this same reason, this one included)."""
        if self.max_retries is not None and attempt > self.max_retries:
            return None
        if reason == UNREACHABLE and attempt > UNREACHABLE_RETRIES and not answered:
            return None
        if reason == EMPTY and attempt > EMPTY_RETRIES:
            return None
        if reason == MALFORMED and in_a_row > MALFORMED_RETRIES:
            return None
        # The server's word, when it asks for a real wait: less than MIN_ASKED_S (0, or a date gone by) is none
        # asked, and the backoff holds (a proxy answering 500 with `Retry-After: 0` was asked again at once,
        # thousands of times a second). ("nan" parses as a float: never compare with it.)
        if asked_s is not None and not math.isnan(asked_s) and asked_s >= MIN_ASKED_S:
            wait = min(asked_s, self.max_wait_s)
        else:
            wait = random.uniform(0.0, min(self.max_wait_s, self.base_s * 2 ** (attempt - 1)))
        if spent_s + wait > self.budget_s:
            return None
        return wait


@dataclass
class RetryNotice:
    """One wait before a model call is repeated: what failed, and how long pid waits."""
    attempt: int               # the attempt that failed (1: the first)
    wait_s: float
    reason: str                # one of the names above
    status: int | None         # the HTTP status, when there was one
    error: str                 # the failure in the server's words
    usage: Usage = field(default_factory=Usage)   # what the call's failed attempts so far reported using, priced


# Told of each wait before it starts; False: the call is not tried again (the caller's cost cap is spent).
RetryListener = Callable[[RetryNotice], "bool | None"]


def clock() -> float:
    """The clock the retry budget is counted on (a test sets its own, with interruptible_wait)."""
    return time.monotonic()


def interruptible_wait(seconds: float, cancel: threading.Event | None) -> bool:
    """Wait `seconds` unless `cancel` is set first (then at once); True when cancelled."""
    return (cancel or threading.Event()).wait(seconds)


PERMANENT_5XX = (501, 505)   # Not Implemented, HTTP Version Not Supported: the same request fails the same way


def reason_for_status(status: int) -> str | None:
    """The retry reason for an HTTP status, or None when retrying cannot help (a 4xx other than 408 and 429, and
    the 5xx that say the server cannot do this request at all)."""
    if status == 429:
        return RATE_LIMITED
    if status == 529:
        return OVERLOADED
    if status == 408:
        return TIMEOUT
    if status >= 500 and status not in PERMANENT_5XX:
        return SERVER_ERROR
    return None


def server_delay(status: int, headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The wait the server asks for, in seconds (None: it names none). Header names are matched lower-case."""
    now = time.time() if now is None else now
    h = {k.lower(): v for k, v in headers.items()}
    if h.get("retry-after-ms"):   # (one that asks for no wait hides no Retry-After that asks for one)
        try:
            asked_ms = float(h["retry-after-ms"]) / 1000
            if asked_ms > 0:
                return asked_ms
        except ValueError:
            pass
    if h.get("retry-after"):
        asked = parse_retry_after(h["retry-after"], now)
        if asked is not None:
            return asked
    if status != 429:
        return None
    return rate_limit_reset(h, now)


def parse_retry_after(value: str, now: float) -> float | None:
    """Retry-After: delta-seconds or an HTTP date."""
    try:
        return max(float(value.strip()), 0.0)
    except ValueError:
        pass
    try:
        return max(parsedate_to_datetime(value).timestamp() - now, 0.0)
    except (TypeError, ValueError, IndexError):
        return None


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_duration(value: str) -> float | None:
    """OpenAI's reset durations, Go style: "1s", "6m0s", "20ms", "1h2m3.5s"."""
    text = value.strip()
    if not text or _DURATION_PART.sub("", text):
        return None
    return sum(float(n) * _UNIT_S[unit] for n, unit in _DURATION_PART.findall(text))


def parse_reset(value: str, now: float) -> float | None:
    """A reset header: a duration (OpenAI), an RFC 3339 time (Anthropic) or plain seconds, as seconds from now."""
    text = value.strip()
    duration = parse_duration(text)
    if duration is not None:
        return duration
    try:
        return max(float(text), 0.0)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return max(when.timestamp() - now, 0.0)


# (remaining header, reset header) pairs: OpenAI's, then Anthropic's.
_LIMITS = [(f"x-ratelimit-remaining-{k}", f"x-ratelimit-reset-{k}") for k in ("requests", "tokens")] + [
    (f"anthropic-ratelimit-{k}-remaining", f"anthropic-ratelimit-{k}-reset")
    for k in ("requests", "tokens", "input-tokens", "output-tokens")]


def rate_limit_reset(headers: Mapping[str, str], now: float) -> float | None:
    """When the exhausted limit resets: the latest reset among limits with nothing remaining; if the headers say
    none is exhausted, the soonest reset."""
    exhausted: list[float] = []
    others: list[float] = []
    for remaining_name, reset_name in _LIMITS:
        if reset_name not in headers:
            continue
        reset = parse_reset(headers[reset_name], now)
        if reset is None:
            continue
        remaining = headers.get(remaining_name, "").strip()
        (exhausted if remaining in ("0", "0.0") else others).append(reset)
    if exhausted:
        return max(exhausted)
    return min(others) if others else None
