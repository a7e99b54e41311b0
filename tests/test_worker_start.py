"""A worker that cannot start its housekeeping (heartbeat, sweeps, stop signals) ends at once, rather than take jobs
while `pid workers` says no worker is alive: Celery only logs what a worker_ready handler raises."""
from __future__ import annotations

import logging

import pytest

from pid.worker import main_process


class Exited(Exception):
    pass


def test_a_worker_whose_start_fails_exits_saying_why(monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    def broken(sender: object) -> None:
        raise ValueError("$PID_SWEEP_S: 'soon' is not a number of seconds above 0")

    def exit_(code: int) -> None:
        raise Exited(code)
    monkeypatch.setattr(main_process, "_ready", broken)
    monkeypatch.setattr(main_process.os, "_exit", exit_)
    monkeypatch.setattr(logging, "shutdown", lambda: None)   # (the test run's own logging stays up)
    with caplog.at_level(logging.CRITICAL), pytest.raises(Exited) as exited:
        main_process._start(sender=object())
    assert exited.value.args == (1,)
    assert "pid worker cannot start its housekeeping ($PID_SWEEP_S: 'soon' is not a number of seconds above 0): " \
           "stopping" in caplog.text
