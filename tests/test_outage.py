"""pid/jobs/outage.py: a running job's store writes wait out an outage (tries again while the store cannot be
reached, streams rewound), and only an outage: any other error is the caller's at once. A command waiting on a job
waits through one, up to WAIT_OUTAGE_S."""
from __future__ import annotations

import io
import time
from typing import Any

import pytest
import redis

from pid.jobs import outage
from pid.jobs.outage import Patience, WaitingThrough, patient, transient


class FlakyStore:
    """Refuses its first `down` calls as an unreachable Redis does, then stores what it reads."""

    def __init__(self, down: int, error: Exception | None = None) -> None:
        self.down, self.error, self.calls, self.stored = down, error, 0, b""

    def put_artifact(self, job_id: str, name: str, stream: Any, limit: int = 0) -> str:
        self.calls += 1
        data = stream.read(3)   # a try that fails midway has read some of the stream
        if self.calls <= self.down:
            raise self.error or redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        self.stored = data + stream.read()
        return "sha256:x"


def test_a_write_waits_out_an_outage_and_sends_the_whole_stream():
    store = FlakyStore(down=2)
    assert patient(store, Patience("j", time.monotonic() + 30)).put_artifact("j", "a", io.BytesIO(b"abcdef")) \
        == "sha256:x"   # type: ignore[arg-type]
    assert (store.calls, store.stored) == (3, b"abcdef")


def test_an_error_that_is_not_an_outage_is_raised_at_once():
    store = FlakyStore(down=5, error=KeyError("j"))
    with pytest.raises(KeyError):
        patient(store, Patience("j", time.monotonic() + 30)).put_artifact("j", "a", io.BytesIO(b"x"))  # type: ignore[arg-type]
    assert store.calls == 1


def test_what_counts_as_an_outage():
    assert transient(redis.ConnectionError("refused")) and transient(redis.TimeoutError("slow"))
    assert transient(redis.BusyLoadingError("LOADING"))   # Redis up again, still reading its append-only file
    assert transient(ConnectionRefusedError()) and not transient(redis.ResponseError("WRONGTYPE"))
    assert not transient(ValueError("too large"))


def test_a_wait_through_an_outage_says_it_once_each_way_and_gives_up_at_its_limit(monkeypatch):
    said: list[str] = []
    clock = [1000.0]
    monkeypatch.setattr(outage.time, "monotonic", lambda: clock[0])
    waiting = WaitingThrough(said.append)
    down = redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    assert waiting.bear(down) and waiting.bear(down)
    clock[0] += 30
    waiting.reached()
    assert said == ["the job store is unreachable (Error 111 connecting to 127.0.0.1:6379. Connection refused.): "
                    f"waiting for it ({outage.WAIT_OUTAGE_S:.0f}s at most; Ctrl-C stops waiting, the job goes on)",
                    "the job store is back (after 30s)"]
    waiting.reached()   # (no outage: nothing said)
    assert len(said) == 2
    assert waiting.bear(down)
    clock[0] += outage.WAIT_OUTAGE_S
    assert not waiting.bear(down)   # past the limit: the caller raises the store's error
    assert not WaitingThrough(said.append).bear(redis.ResponseError("WRONGTYPE"))   # not an outage: at once
