"""HTTP plumbing the providers share: one keep-alive client, cancellable reads, retries, SSE events.

Why a custom network backend: a cancel must stop a request promptly even while the server is silent (before the
response headers or between chunks), and httpx has no cancel hook for sync streams. So every socket read is done in
short slices that check the cancel event of the call running on that thread. Reads happen on the caller's thread,
hence a thread-local; a thread with no cancel event set reads exactly as httpx would.
"""
from __future__ import annotations

import copy
import functools
import html
import io
import json
import math
import re
import ssl
import threading
import zlib
import time
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import urlsplit

import httpcore
import httpx

from pid.messages import AssistantMessage, Message, ToolSpec, Usage
from pid.config import KEYED_HOSTS
from pid.providers import retry
from pid.providers.base import ProviderConfig, price, without_images

CANCEL_CHECK_S = 0.1        # longest a cancelled read keeps waiting on a silent server
ERROR_TEXT_LIMIT = 500

ABORTED_MESSAGE = "request aborted"

# The most of one reply pid reads: its text, thinking and tool-call arguments together, in UTF-8 bytes, counted as
# they arrive (each block and call also counts BLOCK_BYTES, so that a stream of empty ones is bounded too). A real
# reply is far below it (128k tokens, a large output limit, are ~0.5 MB; a `write` of a large file ~1 MB). Past it the
# reply fails, is not retried, and pid reads no further: with the pieces kept compact (Pieces), a job's memory stays
# flat whatever a server sends.
MAX_REPLY_BYTES = 4 << 20
BLOCK_BYTES = 64
# The most one server-sent event may take, its escaped JSON included: a server may send a whole reply in one event.
MAX_EVENT_BYTES = 2 * MAX_REPLY_BYTES
# Read after the reply's end so that the connection can be reused, at most (a server that keeps the stream open
# past its end, if only with comments, is not waited for)
DRAIN_BYTES = 65536
DRAIN_S = 1.0
# Read after the reply said it is complete (OpenAI's finish_reason, Anthropic's stop_reason) for what only trails it,
# its usage and its end, at most DRAIN_BYTES and this long: a server that stops there but keeps the stream open holds
# no job (it had waited for its wall clock, and lost the answer)
TRAILER_S = 10.0
# The most of one stream pid reads, every byte counted: its events' JSON, empty events, comments and blank lines (a
# server could send `{"choices":[]}` or `:` forever, which adds nothing to the reply): generous, since a reply of
# one-character deltas is ~60 times its text.
MAX_STREAM_BYTES = 64 * MAX_REPLY_BYTES
REPLY_TOO_LARGE = ("the model's reply exceeded {limit} bytes ({mib} MiB) of text, thinking and tool-call arguments, "
                   "the most pid reads of one reply; pid stopped reading it")
EVENT_TOO_LARGE = ("the server sent a stream event of more than {limit} bytes ({mib} MiB), more than any reply pid "
                   "reads; pid stopped reading it")


class Cancelled(Exception):
    """Raised inside a socket read when the current call's cancel event is set."""


_current = threading.local()


class _CancellableStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = self._read(max_bytes, timeout)
        budget: StreamBudget | None = getattr(_current, "budget", None)
        if budget is not None:   # every byte off the socket, the chunked framing's too
            budget.spend(len(data))
        return data

    def _read(self, max_bytes: int, timeout: float | None) -> bytes:
        cancel: threading.Event | None = getattr(_current, "cancel", None)
        until: float | None = getattr(_current, "until", None)
        if cancel is None and until is None:
            return self._inner.read(max_bytes, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        if until is not None:
            deadline = until if deadline is None else min(deadline, until)
        while True:
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            wait = CANCEL_CHECK_S if deadline is None else min(CANCEL_CHECK_S, deadline - time.monotonic())
            if wait <= 0:
                raise httpcore.ReadTimeout("timed out")
            try:
                return self._inner.read(max_bytes, wait)
            except httpcore.ReadTimeout:
                continue

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _CancellableStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _CancellableBackend(httpcore.SyncBackend):
    def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        return _CancellableStream(super().connect_tcp(*args, **kwargs))

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        return _CancellableStream(super().connect_unix_socket(*args, **kwargs))


def _env_proxy(base_url: str) -> str | None:
    """The http(s) proxy the environment names for base_url (honouring no_proxy), if any."""
    parts = urlsplit(base_url)
    if parts.hostname and urllib.request.proxy_bypass(parts.hostname):
        return None
    proxy = urllib.request.getproxies().get(parts.scheme)
    return proxy if proxy and proxy.startswith(("http://", "https://")) else None


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """httpx's default TLS settings, made once: loading the CA bundle takes ~50 ms, paid per client otherwise."""
    return httpx.create_ssl_context()


def retry_policy(config: ProviderConfig) -> retry.RetryPolicy:
    return retry.RetryPolicy(max_wait_s=config.max_retry_wait_s, budget_s=config.retry_budget_s,
                             base_s=config.retry_base_s, max_retries=config.max_retries)


def make_client(config: ProviderConfig, url: str) -> httpx.Client:
    """One client per provider instance, so consecutive turns reuse a kept-alive connection."""
    transport = httpx.HTTPTransport(verify=_tls_context(), proxy=_env_proxy(url))
    # The one reach into httpx internals: the pool it built gets our cancellable sockets.
    transport._pool._network_backend = _CancellableBackend()
    timeout = httpx.Timeout(connect=config.connect_timeout_s, read=config.read_timeout_s,
                            write=config.connect_timeout_s, pool=config.connect_timeout_s)
    return _Client(transport=transport, timeout=timeout, trust_env=False)


class _Client(httpx.Client):
    """httpx's client, made cheaper per request without changing what it sends or keeps: the URL is parsed and the
    headers are merged with the client's once for all the requests to the same URL with the same headers (httpx does
    both at every request), and a response without cookies skips the cookie jar's parsing."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._cookies = _Cookies(self._cookies)
        self._prepared: tuple[Any, httpx.URL, httpx.Headers] | None = None

    def build_request(self, method: str, url: httpx.URL | str, *, content: Any = None,
                      headers: Any = None, **kwargs: Any) -> httpx.Request:
        if kwargs or self.cookies or self.params or not isinstance(url, str) or not isinstance(headers, dict):
            return super().build_request(method, url, content=content, headers=headers, **kwargs)
        key = (url, tuple(headers.items()), tuple(self.headers.multi_items()))
        if self._prepared is None or self._prepared[0] != key:
            merged = httpx.Headers(self.headers)   # as httpx merges them
            merged.update(headers)
            # (a relative URL joins the client's base_url, as httpx does)
            self._prepared = (key, self._merge_url(url), merged)
        _key, full, merged = self._prepared
        # Request copies the headers it is given: the merged ones are never changed
        return httpx.Request(method, full, content=content, headers=merged,
                             extensions={"timeout": self.timeout.as_dict()})


class _Cookies(httpx.Cookies):
    def extract_cookies(self, response: httpx.Response) -> None:
        """Only a response that sets cookies has any to extract (the jar reads just these two headers)."""
        if "set-cookie" in response.headers or "set-cookie2" in response.headers:
            super().extract_cookies(response)


class _ReadsWith:
    """What this thread's socket reads see (_CancellableStream.read) as `name`, for the time of the block (`set`
    changes it within the block). A class, not a generator: a turn enters several."""
    __slots__ = ("name", "value", "previous")

    def __init__(self, name: str, value: Any) -> None:
        self.name, self.value, self.previous = name, value, None

    def __enter__(self) -> "_ReadsWith":
        self.previous = getattr(_current, self.name, None)
        setattr(_current, self.name, self.value)
        return self

    def set(self, value: Any) -> None:
        self.value = value
        setattr(_current, self.name, value)

    def __exit__(self, *_exc: object) -> None:
        setattr(_current, self.name, self.previous)


def cancellable(cancel: threading.Event | None) -> _ReadsWith:
    """Make reads on this thread give up (raise Cancelled) once `cancel` is set."""
    return _ReadsWith("cancel", cancel)


def reads_counted(budget: StreamBudget) -> _ReadsWith:
    """Take every byte this thread's reads get off a socket from `budget` (StreamTooLong once it is spent)."""
    return _ReadsWith("budget", budget)


def reads_until(moment: float | None) -> _ReadsWith:
    """Make reads on this thread time out (httpx.ReadTimeout) at `moment` (time.monotonic()) at the latest (None:
    no such moment)."""
    return _ReadsWith("until", moment)


@dataclass
class Failure:
    """Why a request produced no (complete) stream; `aborted` when it was the caller's cancel. `retry` names why
    trying again may help (pid/providers/retry.py), `asked_s` is the wait the server asked for."""
    message: str
    aborted: bool = False
    retry: str | None = None
    status: int | None = None
    asked_s: float | None = None


def stream_request(client: httpx.Client, url: str, *, headers: dict[str, str], body: bytes,
                   cancel: threading.Event | None, consume: Callable[[httpx.Response], None]) -> Failure | None:
    """POST once, hand the open response to `consume`, and turn every way this can go wrong into a Failure."""
    with cancellable(cancel):
        opened = post_stream(client, url, headers=headers, body=body, cancel=cancel)
        if isinstance(opened, Failure):
            return opened
        try:
            consume(opened)
        except Cancelled:
            return Failure(ABORTED_MESSAGE, aborted=True)
        except Exception as exc:  # noqa: BLE001 - the provider seam never raises
            if cancel is not None and cancel.is_set():
                return Failure(ABORTED_MESSAGE, aborted=True)
            return Failure(stream_failure(exc, url), retry=_stream_retry(exc))
        finally:
            opened.close()
    return None


def post_stream(client: httpx.Client, url: str, *, headers: dict[str, str], body: bytes,
                cancel: threading.Event | None) -> httpx.Response | Failure:
    """POST and return the open streaming response, or the Failure (retryable or not) that came instead.

    Must run inside `cancellable(cancel)`. The caller closes the response.
    """
    if cancel is not None and cancel.is_set():
        return Failure(ABORTED_MESSAGE, aborted=True)
    try:
        response = client.send(client.build_request("POST", url, headers=headers, content=body), stream=True)
    except Cancelled:
        return Failure(ABORTED_MESSAGE, aborted=True)
    except httpx.ConnectError as exc:
        return Failure(f"cannot reach {_origin(url)}: {_describe(exc)}", retry=retry.UNREACHABLE)
    except httpx.ConnectTimeout as exc:
        return Failure(f"cannot reach {_origin(url)}: {_describe(exc)}", retry=retry.TIMEOUT)
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
        if _malformed(exc):
            return Failure(f"{_origin(url)} answered with what is not HTTP pid can read: {_describe(exc)}",
                           retry=retry.MALFORMED)
        return Failure(f"connection to {_origin(url)} failed: {_describe(exc)}", retry=retry.CONNECTION)
    except httpx.TimeoutException as exc:
        return Failure(f"timed out waiting for a response from {_origin(url)} ({type(exc).__name__})",
                       retry=retry.TIMEOUT)
    except httpx.HTTPError as exc:
        return Failure(f"request to {url} failed: {_describe(exc)}")
    if response.status_code < 300:
        return response
    try:
        text = error_text(_read_bounded(response)) if response.status_code >= 400 else \
            f"redirected to {response.headers.get('location', '?')} (use that base URL)"
    except Cancelled:
        return Failure(ABORTED_MESSAGE, aborted=True)
    except httpx.HTTPError as exc:
        text = f"(error body unreadable: {_describe(exc)})"
    finally:
        response.close()
    status = response.status_code
    reason = retry.reason_for_status(status) if status >= 400 else None
    if reason == retry.SERVER_ERROR and "overloaded" in text.lower():
        reason = retry.OVERLOADED
    return Failure(f"HTTP {status} from {url}: {text}", retry=reason, status=status,
                   asked_s=retry.server_delay(status, response.headers) if reason else None)


def _stream_retry(exc: BaseException) -> str | None:
    """Why an error raised while the body streamed is worth a retry: the connection, not our parsing, failed."""
    if isinstance(exc, httpx.TimeoutException):
        return retry.TIMEOUT
    if _malformed(exc):
        return retry.MALFORMED
    if isinstance(exc, httpx.HTTPError):
        return retry.STREAM_BROKE
    return None


def _read_bounded(response: httpx.Response, limit: int = 65536) -> bytes:
    data = b""
    try:
        for chunk in body_chunks(response):
            data += chunk
            if len(data) >= limit:
                break
    except UnsupportedEncoding as exc:
        data += f"(a body in an encoding pid does not read: {exc})".encode()
    return data[:limit]


ENCODINGS = "gzip, deflate"   # what pid asks for, and reads
DECODE_STEP = 65536           # the most one compressed piece of a body turns into at a time


class UnsupportedEncoding(Exception):
    """A body in a content encoding pid does not decode itself (several layers, brotli, ...)."""


class StreamTooLong(Exception):
    """The stream sent more bytes than its budget (StreamBudget) allows."""


@dataclass
class StreamBudget:
    """The bytes a stream may still send, every one counted (comments, blank lines, compressed bytes that decode to
    nothing, and what they decode to); the reader may lower it."""
    left: int

    def spend(self, size: int) -> None:
        self.left -= size
        if self.left < 0:
            raise StreamTooLong()


def body_chunks(response: httpx.Response, budget: StreamBudget | None = None) -> Iterator[bytes]:
    """A response's body as the server meant it, decoded here in bounded steps. httpx would inflate a small
    compressed piece into one chunk of any size before any limit could be checked (2 KB of `gzip, gzip` became 2 GB):
    pid reads the raw bytes, and accepts identity or one layer of gzip or deflate, DECODE_STEP bytes at a time. Each
    decoded byte is taken from `budget` (StreamTooLong once it is spent; the raw ones are, off the socket, where the
    stream is read within reads_counted). UnsupportedEncoding for any other encoding."""
    stream = response.stream
    raw: Iterable[bytes] = stream if isinstance(stream, httpx.SyncByteStream) else response.iter_raw()
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return iter(raw)
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise UnsupportedEncoding(encoding[:100])
    return _inflated(raw, encoding, budget)


def _inflated(raw: Iterable[bytes], encoding: str, budget: StreamBudget | None) -> Iterator[bytes]:
    spend = budget.spend if budget is not None else (lambda size: None)
    decoder = zlib.decompressobj(wbits=32 + zlib.MAX_WBITS)   # (a gzip or a zlib header, whichever it is)
    try:
        for chunk in raw:
            while chunk:
                piece = decoder.decompress(chunk, DECODE_STEP)
                if piece:
                    spend(len(piece))
                    yield piece
                chunk = decoder.unconsumed_tail
        rest = decoder.flush(DECODE_STEP)
        if rest:
            yield rest
    except zlib.error as exc:
        raise httpx.DecodingError(f"the body's {encoding} is corrupt: {exc}") from None


# How httpx words a connection that ended before its answer did (a kept-alive connection the server had closed, a
# server restarting): worth retrying. Any other protocol error is bytes that are not HTTP (a bad status line, a header
# with control bytes, a broken chunk), which the same request gets again.
_CUT_SHORT = ("server disconnected", "peer closed connection", "peer unexpectedly closed connection")


def _malformed(exc: BaseException) -> bool:
    return isinstance(exc, httpx.RemoteProtocolError) and not str(exc).lower().startswith(_CUT_SHORT)


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def truncate(text: str, limit: int = ERROR_TEXT_LIMIT) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def error_text(body: bytes) -> str:
    """The server's own words from an error body: OpenAI, Anthropic, vLLM and FastAPI shapes; an HTML page's first
    meaningful line (a proxy's or a web server's error page); else the raw text."""
    raw = body.decode("utf-8", errors="replace").strip()
    try:
        parsed = json.loads(raw)
    except ValueError:
        if _HTML.match(raw):
            return f"{truncate(html_line(raw), 200)} (an HTML page, not an API's answer)"
        return truncate(raw) or "(empty body)"
    message = _find_message(parsed)
    return truncate(message if message else raw)


_HTML = re.compile(r"(?:<\?xml[^>]*>\s*)?(?:<!--.*?-->\s*)*<(?:!doctype\s+html|html)\b", re.I | re.S)
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.I | re.S)
_HIDDEN = re.compile(r"<(script|style|head)\b.*?</\1\s*>", re.I | re.S)
_TAG = re.compile(r"<[^>]*>")


def html_line(page: str) -> str:
    """An HTML page's first meaningful line: its title, else the first line of its visible text."""
    title = _TITLE.search(page)
    found = title.group(1) if title else ""
    if not found.strip():
        text = _TAG.sub("\n", _HIDDEN.sub("", page))
        found = next((line for line in text.splitlines() if line.strip()), "")
    return " ".join(html.unescape(found).split()) or "(an empty page)"


def _find_message(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        for key in ("error", "message", "detail"):
            if key in value:
                found = _find_message(value[key])
                if found:
                    return found
    return None


class ToolsJSON:
    """The tools' part of a request body, encoded again only when the tools change (a turn's tools rarely do). A
    copy of what was encoded is kept: a schema changed in place must not match what was sent."""

    def __init__(self, entry: Callable[[ToolSpec], dict[str, Any]]) -> None:
        self._entry = entry
        self._sent: list[ToolSpec] = []
        self._json = "[]"

    def json(self, tools: list[ToolSpec]) -> str:
        if tools != self._sent:
            self._sent, self._json = copy.deepcopy(tools), json.dumps([self._entry(t) for t in tools])
        return self._json


def json_object(fields: dict[str, Any], raw: dict[str, str]) -> str:
    """json.dumps(fields), with the values of the keys in `raw` already encoded (as raw[key])."""
    return "{" + ", ".join(f"{json.dumps(key)}: {raw[key] if key in raw else json.dumps(value)}"
                           for key, value in fields.items()) + "}"


class EventTooLarge(Exception):
    """One server-sent event (its unfinished line included) outgrew MAX_EVENT_BYTES."""


SSE_FIELDS = (b"data", b"event", b"id", b"retry")


def iter_sse(response: httpx.Response, limit: int = MAX_EVENT_BYTES, strays: list[bytes] | None = None,
             budget: StreamBudget | None = None) -> Iterator[tuple[str, bytes]]:
    """(event name, data) per server-sent event. Comment lines are skipped; `data:` may lack its space. An event
    larger than `limit` bytes raises EventTooLarge as soon as that many have arrived: an endless line is never
    held whole, and each of its data lines costs its bytes and its newline, so empty ones too. The first line that
    is no SSE field goes into `strays` (a body that is not a stream at all). `budget` takes what a compressed body
    decodes to (body_chunks): StreamTooLong once it is spent."""
    event = ""
    data = bytearray()   # the event's data lines, joined by newlines as they come
    lines_in = 0
    pending: list[bytes] = []  # the unfinished line, in the chunks it came in (joined once, when it ends)
    pending_size = 0
    for chunk in body_chunks(response, budget):
        if b"\n" not in chunk:
            pending.append(chunk)
            pending_size += len(chunk)
            if pending_size + len(data) > limit:
                raise EventTooLarge(limit)
            continue
        if pending:
            pending.append(chunk)
            chunk = b"".join(pending)
        lines = chunk.split(b"\n")
        last = lines.pop()
        pending, pending_size = ([last] if last else []), len(last)
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if lines_in:
                    yield event, bytes(data)
                    data, lines_in = bytearray(), 0
                event = ""
                continue
            if line[0] == 58:  # ":" starts a comment (keep-alives from OpenRouter and others)
                continue
            name, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                if lines_in:
                    data += b"\n"
                data += value
                lines_in += 1
            elif name == b"event":
                event = value.decode("utf-8", errors="replace")
            elif strays is not None and not strays and name not in SSE_FIELDS:
                strays.append(line[:200])
        if pending_size + len(data) > limit:
            raise EventTooLarge(limit)
    buffer = b"".join(pending)
    if buffer.strip() and buffer.startswith(b"data:"):
        value = buffer[5:]
        if lines_in:
            data += b"\n"
        data += value[1:] if value[:1] == b" " else value
        lines_in += 1
    if lines_in:
        yield event, bytes(data)


def _fail_read(reply: Any, exc: Exception) -> None:
    """A reply whose stream passed one of pid's bounds fails saying which; any other error is the caller's."""
    if isinstance(exc, StreamTooLong):
        reply.fail(f"the server's stream passed {MAX_STREAM_BYTES >> 20} MiB, the most pid reads of one reply; pid "
                   "stopped reading it")
    elif isinstance(exc, EventTooLarge):
        limit = int(exc.args[0])
        reply.fail(EVENT_TOO_LARGE.format(limit=limit, mib=limit >> 20))
    elif isinstance(exc, UnsupportedEncoding):
        reply.fail(f"the server sent its reply in a content encoding pid does not read ({exc}); pid asks for "
                   f"{ENCODINGS} or none")
    else:
        raise exc


def stream_failure(exc: BaseException, url: str) -> str:
    """A readable sentence for an error raised while a response body was streaming."""
    if isinstance(exc, httpx.TimeoutException):
        return f"stream from {_origin(url)} went silent (read timeout)"
    if isinstance(exc, httpx.HTTPError):
        return f"stream from {_origin(url)} broke: {_describe(exc)}"
    return f"stream from {_origin(url)} failed: {type(exc).__name__}: {_describe(exc)}"


def whole_number(value: Any) -> int | None:
    """A JSON field that must be a whole number (an index), when it is one: a bool or a float is not."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class Pieces:
    """A text that streams in, kept in one growing buffer: a reply of millions of tiny deltas must not cost a string
    object each (a list of two-character strings takes ~30 times the text)."""
    __slots__ = ("_buffer",)

    def __init__(self, first: str = "") -> None:
        self._buffer = io.StringIO(newline="")
        if first:
            self._buffer.write(first)

    def append(self, piece: str) -> None:
        self._buffer.write(piece)

    def text(self) -> str:
        return self._buffer.getvalue()


BYTES_PER_TOKEN = 4   # a failed reply's estimate (_reported): about what English text and code average


class StreamReply:
    """The part of a reply-in-progress the shared stream loop uses: its end, its failure, its id, its size."""

    def __init__(self) -> None:
        self.response_id: str | None = None
        self.done = False
        self.error: str | None = None
        self.aborted = False
        self.retry: str | None = None      # why the failed call may succeed when tried again (retry.py's names)
        self.status: int | None = None
        self.asked_s: float | None = None  # the wait the server asked for
        self.events = 0                    # server-sent events read (none at all: an empty response)
        self.content_type = ""             # the response's, as it said (see not_a_stream)
        self.strays: list[bytes] = []      # the first line of the body that was no SSE field
        self.size = 0                      # bytes of text, thinking and arguments so far (see MAX_REPLY_BYTES)

    def fail(self, message: str, *, aborted: bool = False, retry: str | None = None, status: int | None = None,
             asked_s: float | None = None) -> None:
        self.error, self.aborted, self.retry, self.status, self.asked_s = message, aborted, retry, status, asked_s

    def grow(self, size: int) -> None:
        """Count `size` more bytes of the reply; past MAX_REPLY_BYTES it fails (the stream loop then stops)."""
        self.size += size
        if self.size > MAX_REPLY_BYTES and self.error is None:
            self.fail(REPLY_TOO_LARGE.format(limit=MAX_REPLY_BYTES, mib=MAX_REPLY_BYTES >> 20))

    @property
    def finished(self) -> bool:
        """The server said the reply is complete (else the stream ended early)."""
        raise NotImplementedError

    def feed(self, event: str, payload: dict[str, Any], on_text: Callable[[str], None] | None) -> None:
        raise NotImplementedError


UNFINISHED_MESSAGE = "the stream ended before the response finished"
NO_ANSWER = "the server's stream held no answer (no content and no finish reason)"
NOT_EVENTS = "the server's reply is not a stream of events; it began: "
def not_a_stream(content_type: str) -> bool:
    """A reply that said it is something else (a web page, a JSON body from a server that does not stream): no event
    in it is the endpoint's mistake, not an empty answer (which some servers give a conversation too long)."""
    return bool(content_type) and not content_type.lower().startswith("text/event-stream")


# llama-cpp-python's answer to a streaming request too long for its context: HTTP 200 and not one event. Retried a
# little (retry.EMPTY_RETRIES), then taken for the refusal it most likely is (pid/providers/overflow.py), so that the
# loop compacts and asks again; still empty after that, the job fails saying so.
EMPTY_MESSAGE = ("the server returned an empty response (no event at all; some servers answer so when the "
                 "conversation is too long for their context)")


class StreamingProvider:
    """What both wire formats share: one keep-alive client, and a stream() that never raises and that retries.

    A subclass says how to build the request body, how to feed stream events into its reply, and how the reply
    becomes an AssistantMessage.
    """
    label = "http"
    api = ""   # its wire format's name (pid.config.API_NAMES), which its messages carry

    def __init__(self, config: ProviderConfig, url: str, headers: dict[str, str]) -> None:
        self.config = config
        self._url = url
        host = httpx.URL(url).host
        self._missing_key = None if config.api_key or host not in KEYED_HOSTS else (
            f"no API key: {host} needs one (set PID_API_KEY where the job runs, or pass --api-key)")
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                         "Accept-Encoding": ENCODINGS, **headers}
        self._client = make_client(config, url)
        self._answered = False   # the endpoint has answered a request (a refusal then is a restart: retry.py)

    def close(self) -> None:
        self._client.close()

    def sibling(self, config: ProviderConfig) -> "StreamingProvider":
        """A provider of this class under another config (compaction's summary call), which knows what this one
        learned of the endpoint: once it answered, a refusal is a restart to wait out, not a wrong URL."""
        # (each wire format, a subclass, is built from its config alone)
        other = type(self)(config)  # type: ignore[call-arg]
        other._answered = self._answered
        return other

    def stream(self, system: str, messages: list[Message], tools: list[ToolSpec], *,
               cancel: threading.Event | None = None,
               on_text: Callable[[str], None] | None = None,
               on_retry: retry.RetryListener | None = None) -> AssistantMessage:
        reply = self._new_reply()
        dropped = Usage()   # what the attempts given up on reported using: their replies go, their cost stays
        try:
            if self._missing_key:
                reply.fail(self._missing_key, aborted=False)
                return self._finish(reply)
            if not self.config.images:
                messages = without_images(messages)
            body = self.request_bytes(system, messages, tools)
            policy = retry_policy(self.config)
            retrying_since: float | None = None   # the first failure: the retry budget counts from there
            attempt = 1
            same_reason, in_a_row = None, 0   # the latest failures' reason, and how many in a row had it
            while True:
                failure = stream_request(self._client, self._url, headers=self._headers, body=body, cancel=cancel,
                                         consume=lambda response: self._consume(response, reply, on_text))
                self._answered = self._answered or failure is None or failure.status is not None
                if failure is not None:
                    reply.fail(failure.message, aborted=failure.aborted, retry=failure.retry, status=failure.status,
                               asked_s=failure.asked_s)
                elif reply.error is None and reply.events == 0 and not_a_stream(reply.content_type):
                    reply.fail(f"the server answered with {truncate(reply.content_type)}, not an event stream: is "
                               "--base-url the API's own (an OpenAI-compatible one usually ends in /v1)?")
                elif reply.error is None and reply.events == 0 and reply.strays:
                    reply.fail(NOT_EVENTS + truncate(reply.strays[0].decode("utf-8", "replace")))
                elif reply.error is None and reply.events == 0:
                    reply.fail(EMPTY_MESSAGE, retry=retry.EMPTY)
                elif reply.error is None and not reply.finished:
                    reply.fail(UNFINISHED_MESSAGE, retry=retry.STREAM_BROKE)
                if reply.error is not None:
                    reply.error = self._without_key(reply.error)
                if reply.error is None or reply.aborted or reply.retry is None:
                    return self._finish(reply, dropped, len(body))
                now = retry.clock()
                retrying_since = retrying_since if retrying_since is not None else now
                in_a_row = in_a_row + 1 if reply.retry == same_reason else 1
                same_reason = reply.retry
                wait = policy.wait_before_retry(attempt, reply.retry, reply.asked_s, now - retrying_since,
                                                answered=self._answered, in_a_row=in_a_row)
                if wait is None:
                    if attempt > 1:
                        reply.error += f" (after {attempt} attempts)"
                    asked = min(reply.asked_s or 0.0, policy.max_wait_s)
                    if asked >= retry.MIN_ASKED_S and now - retrying_since + asked > policy.budget_s:
                        reply.error += (f" (the server asked to wait {asked:g} s, past what the retry budget of "
                                        f"{policy.budget_s:g} s left: --retry-budget)")
                    return self._finish(reply, dropped, len(body))
                so_far = Usage()
                so_far.add(dropped)
                so_far.add(self._reported(reply, len(body)))
                if on_retry is not None and on_retry(retry.RetryNotice(attempt, wait, reply.retry, reply.status,
                                                                       reply.error, so_far)) is False:
                    return self._finish(reply, dropped, len(body))
                dropped = so_far
                reply = self._new_reply()   # the failed attempt's partial reply is dropped, never merged
                if retry.interruptible_wait(wait, cancel):
                    reply.fail(ABORTED_MESSAGE, aborted=True)
                    return self._finish(reply, dropped)
                attempt += 1
        except Exception as exc:  # noqa: BLE001 - the seam never raises
            reply.fail(f"internal error in the {self.label} provider: {type(exc).__name__}: {exc}")
        return self._finish(reply, dropped)

    def _without_key(self, text: str) -> str:
        """A server's error text, with the job's own API key, should the server echo it (gateways and proxies that
        quote the Authorization header do), replaced: the text goes into the log, the events and result.json."""
        key = self.config.api_key
        if not key or len(key) < 8:
            return text
        text = text.replace(key, "[the API key]")
        body, cut = (text[:-3], "...") if text.endswith("...") else (text, "")
        for size in range(len(key) - 1, 3, -1):   # (a key the text's truncation cut: its start is left at the end)
            if body.endswith(key[:size]):
                return body[:-size] + "[the API key]" + cut
        return text

    def _finish(self, reply: StreamReply, dropped: Usage | None = None, sent: int = 0) -> AssistantMessage:
        """The reply as a message; should what the server sent break even that, a failed message that says so, with
        none of the reply's content (the seam never raises: the job ends as a provider's error, the call counted).
        A failed reply the server said nothing of using is estimated (_reported); what the call's `dropped` attempts
        reported rides beside it, as its retried_usage (the call cost that too). Its error never holds the job's API
        key."""
        message = self._message_or_failure(reply)
        if message.stop_reason in ("error", "aborted") and message.usage.total_tokens == 0:
            message.usage = self._reported(reply, sent)
        if dropped is not None and (dropped.total_tokens or dropped.cost.total):
            message.retried_usage = dropped
        if message.error_message:
            message.error_message = self._without_key(message.error_message)
        return message

    def _message_or_failure(self, reply: StreamReply) -> AssistantMessage:
        try:
            return self._message(reply)
        except Exception as exc:  # noqa: BLE001
            error = reply.error or (f"malformed reply from the server ({type(exc).__name__}: "
                                    f"{truncate(str(exc))})")
        return AssistantMessage([], self.api, self.config.provider, self.config.model, self._reported(reply),
                                "error", error, reply.response_id if isinstance(reply.response_id, str) else None)

    def _reported(self, reply: StreamReply, sent: int = 0) -> Usage:
        """What the server said the reply used, priced (the call was made: it is counted when it can still be read).
        A reply that came in part with no word of its usage (cut at MAX_REPLY_BYTES, broken, cancelled) is estimated
        at ~4 bytes a token, the `sent` request's bytes and what arrived: an endless reply must not be free under
        --max-cost. One that never began counts nothing."""
        try:
            usage = price(self._usage(reply), self.config)
        except Exception:  # noqa: BLE001
            usage = Usage()
        if usage.total_tokens == 0 and reply.size > 0:
            usage = price(Usage(input=sent // BYTES_PER_TOKEN, output=-(-reply.size // BYTES_PER_TOKEN),
                                estimated=True), self.config)
        return usage

    def request_body(self, system: str, messages: list[Message], tools: list[ToolSpec]) -> dict[str, Any]:
        raise NotImplementedError

    def request_bytes(self, system: str, messages: list[Message], tools: list[ToolSpec]) -> bytes:
        """The request body as sent: `request_body` in JSON. A subclass may build the same bytes faster."""
        return json.dumps(self.request_body(system, messages, tools)).encode()

    def _new_reply(self) -> StreamReply:
        raise NotImplementedError

    def _consume(self, response: Any, reply: StreamReply, on_text: Callable[[str], None] | None) -> None:
        """SSE events into the reply (its feed(event, payload, on_text)); malformed data fails it, and so does one
        too large: reading stops there (the caller closes the response, and with it the connection). Once the reply
        says it is complete only its trailers are read, DRAIN_BYTES and TRAILER_S at most, and once it is done the
        rest is drained, DRAIN_S at most, so that the connection can be kept alive if its end comes soon; whatever
        goes wrong then costs nothing of the answer."""
        reply.content_type = response.headers.get("content-type", "")
        budget = StreamBudget(MAX_STREAM_BYTES)
        stage, until = 0, math.inf   # 0 reading, 1 complete (its trailers), 2 done (the drain): each bounded closer
        spared, size = 0, 0          # the budget held back in stage 1, and the reply's size when it began
        trusted = True   # a finish reason ends the reply, unless more of it follows one: some gateways put
                         # finish_reason on every chunk, and the rest of such a reply is read as any other
        with reads_counted(budget), reads_until(None) as bound:
            try:
                for event, data in iter_sse(response, strays=reply.strays, budget=budget):
                    if reply.done:
                        continue
                    reply.events += 1
                    if data == b"[DONE]":   # (OpenAI's end; Anthropic's is message_stop, which feed() sees)
                        reply.done = True
                    elif not self._take(event, data, reply, on_text):
                        return
                    if stage == 1 and reply.size != size and not reply.done:   # the reply went on after its finish
                        trusted, stage, until = False, 0, math.inf
                        budget.left, spared = budget.left + spared, 0
                        bound.set(None)
                    now_stage = 2 if reply.done else 1 if reply.finished and trusted else 0
                    if now_stage > stage:
                        stage, size = now_stage, reply.size
                        until = min(until, time.monotonic() + (DRAIN_S if stage == 2 else TRAILER_S))
                        spared = max(budget.left - DRAIN_BYTES, 0)   # (given back should the reply go on)
                        budget.left -= spared
                        bound.set(until)
            except Exception as exc:  # noqa: BLE001 - each bound's own words; once complete, nothing is lost
                if stage == 0:
                    _fail_read(reply, exc)

    def _take(self, event: str, data: bytes, reply: StreamReply, on_text: Callable[[str], None] | None) -> bool:
        """One event of the reply fed to it; False when it failed the reply (reading stops)."""
        try:   # (SSE is UTF-8: decoded here, json.loads skips guessing the encoding of bytes)
            payload = json.loads(data.decode("utf-8"))
        except ValueError:
            reply.fail("malformed stream data from the server: " + truncate(data.decode("utf-8", "replace")))
            return False
        if isinstance(payload, dict):
            reply.feed(event, payload, on_text)
        return reply.error is None

    def _message(self, reply: Any) -> AssistantMessage:
        raise NotImplementedError

    def _usage(self, reply: Any) -> Usage:
        """The tokens the reply says it used."""
        raise NotImplementedError
