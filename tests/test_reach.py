"""The one line a command prints when the job store or the broker cannot be reached (jobs/reach.py)."""
from __future__ import annotations

import sqlite3
from types import SimpleNamespace

import redis.exceptions

from pid.jobs import reach


def test_a_tls_url_that_times_out_says_the_server_may_be_a_plain_one(monkeypatch):
    """rediss:// against a plain Redis: the server waits for a command while the client waits for its handshake,
    and redis-py only says it timed out (a new-user test)."""
    monkeypatch.setenv("PID_STORE_URL", "rediss://:secret@127.0.0.1:6399/0")
    line = reach.unreachable_store(redis.exceptions.TimeoutError("Timeout connecting to server"))
    assert line is not None and line.startswith("cannot use the job store at rediss://"), line
    assert "secret" not in line and "A plain Redis takes redis://" in line, line
    broker = reach.unreachable_broker(redis.exceptions.TimeoutError("Timeout reading from socket"), "abc")
    assert "A plain Redis takes redis://" not in broker   # (the broker here is the embedded queue)
    monkeypatch.setenv("PID_BROKER_URL", "rediss://127.0.0.1:6399/0")
    assert "A plain Redis takes redis://" in reach.unreachable_broker(redis.exceptions.TimeoutError("x"), "abc")


def test_other_failures_get_no_tls_hint(monkeypatch):
    monkeypatch.setenv("PID_STORE_URL", "rediss://127.0.0.1:6399/0")
    refused = reach.unreachable_store(redis.exceptions.ConnectionError("Error 111 connecting. Connection refused."))
    assert refused is not None and "TLS" not in refused, refused
    monkeypatch.setenv("PID_STORE_URL", "redis://127.0.0.1:6399/0")
    timeout = reach.unreachable_store(redis.exceptions.TimeoutError("Timeout connecting to server"))
    assert timeout is not None and "TLS" not in timeout, timeout


def test_a_full_disk_under_pid_home_is_said_as_such(monkeypatch, tmp_path):
    """SQLite says "disk I/O error" when its WAL cannot grow: the line names the store and says the disk is full
    (it was a traceback: a new-user test, PID_HOME on a full tmpfs)."""
    monkeypatch.delenv("PID_STORE_URL", raising=False)
    monkeypatch.delenv("PID_BROKER_URL", raising=False)
    monkeypatch.setenv("PID_HOME", str(tmp_path))
    monkeypatch.setattr(reach.shutil, "disk_usage", lambda path: SimpleNamespace(total=2 << 20, used=2 << 20, free=0))
    line = reach.unreachable_store(sqlite3.OperationalError("disk I/O error"))
    assert line == f"cannot use the job store at {tmp_path}/jobs.db: disk I/O error (its disk is full: 0 bytes " \
                   f"free under {tmp_path})", line
    assert reach.unreachable_store(sqlite3.OperationalError("no such table: jobs")) is None   # a bug: its traceback
