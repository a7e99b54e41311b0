"""What a command says when the job store or the broker cannot be reached, or refuses pid's credentials: one line
that names where (never with its password) and why, instead of a client library's traceback.

Light on purpose: it looks only at the exception's class, and at the libraries a command has already loaded (an
error from Redis can only come from a process that imported redis).
"""
from __future__ import annotations

import os
import shutil
import sys

from pid.jobs.brokers import shown_url
from pid import settings

REASON_CHARS = 200   # of the library's own words


def unreachable_store(exc: BaseException) -> str | None:
    """The one line for `exc` when it says the job store cannot be reached (or refuses pid); None otherwise."""
    if not _unreachable(exc):
        return None
    from pid.jobs.store import store_url, store_variable
    url = store_url()
    if url:
        where = f"{shown_url(url)} ({store_variable()})"
    else:
        from pid.config import pid_home
        where = os.path.join(pid_home(), "jobs.db")
        return f"cannot use the job store at {where}: {_reason(exc)}{_disk_left(pid_home())}"
    return f"cannot use the job store at {where}: {_reason(exc)}{_tls_hint(url, exc)}"


def unreachable_broker(exc: BaseException, job_id: str) -> str:
    """The one line for a broker that would not take job `job_id`'s message (whatever the reason: nothing ran)."""
    url = settings.BROKER_URL.raw() or "the embedded queue"
    return f"could not queue job {job_id}: the broker at {shown_url(url)} (PID_BROKER_URL) did not take it: " \
           f"{_reason(exc)}{_tls_hint(url, exc)}"


def _unreachable(exc: BaseException) -> bool:
    redis_errors = sys.modules.get("redis.exceptions")
    if redis_errors is not None and isinstance(exc, (redis_errors.ConnectionError, redis_errors.TimeoutError,
                                                     redis_errors.NoPermissionError)):
        return True   # (AuthenticationError, a wrong or missing password, is a ConnectionError)
    if redis_errors is not None and isinstance(exc, redis_errors.ResponseError) and "DB index" in str(exc):
        return True   # a database number past the server's (`redis://host/99`): no store there for pid
    sqlite = sys.modules.get("sqlite3")
    if sqlite is not None and isinstance(exc, sqlite.OperationalError) and str(exc) in SQLITE_OUT_OF_ROOM:
        return True
    from pid.jobs.store import StoreUnavailable
    return isinstance(exc, StoreUnavailable)


# What SQLite says when the store's disk is full: "disk I/O error" when a WAL file cannot grow
SQLITE_OUT_OF_ROOM = ("disk I/O error", "database or disk is full")


def _disk_left(path: str) -> str:
    """For a SQLite store: a full disk under PID_HOME, said as such (SQLite's own words may be "disk I/O error")."""
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return ""
    return f" (its disk is full: {usage.free:,} bytes free under {path})" if usage.free < 1 << 20 else ""


def _tls_hint(url: str | None, exc: BaseException) -> str:
    """A timeout on a rediss:// URL is most often a plain Redis, which waits for a command while the client waits
    for its TLS handshake: say so, since the library's words only say it timed out."""
    if not (url or "").startswith("rediss:") or "timeout" not in (str(exc) + type(exc).__name__).lower():
        return ""
    return " (rediss:// speaks TLS: is the server's port a TLS one? A plain Redis takes redis://)"


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 1] + "…"
