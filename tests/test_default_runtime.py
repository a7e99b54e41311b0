"""The engine's default runtime is asked once per engine and process, also by a burst's jobs starting all at once
(each /info costs the engine two processes, `runc --version` and `docker-init --version`, as it starts their
containers). The real engine, its /info calls counted."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import docker
import pytest

from pid.sandbox import launch

pytestmark = pytest.mark.docker


def test_sixteen_jobs_starting_at_once_ask_the_engine_once(monkeypatch):
    monkeypatch.setattr(launch, "_default_runtimes", {})
    client = docker.from_env()
    asked: list[float] = []
    lock = threading.Lock()
    real_info = client.info

    def counted_info() -> dict:
        with lock:
            asked.append(time.monotonic())
        time.sleep(0.05)   # (an engine busy starting containers answers late: every job would have asked by then)
        return real_info()
    monkeypatch.setattr(client, "info", counted_info)
    try:
        with ThreadPoolExecutor(16) as pool:
            answers = set(pool.map(lambda _: launch.default_runtime(client), range(16)))
        assert answers == {real_info()["DefaultRuntime"]} and len(asked) == 1
        assert launch.default_runtime(client) in answers and len(asked) == 1   # (kept for the process)
    finally:
        client.close()
