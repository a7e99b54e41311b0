"""The engine's default runtime is asked once per engine and process, also by a burst's jobs starting all at once
(each /info costs the engine two processes as it starts their containers). No engine: a client that counts."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from pid.sandbox import launch


class CountingClient:
    def __init__(self, url: str) -> None:
        self.api = SimpleNamespace(base_url=url)
        self.asked = 0
        self._lock = threading.Lock()

    def info(self) -> dict:
        with self._lock:
            self.asked += 1
        time.sleep(0.05)   # (an engine busy starting containers answers late: every job would have asked by then)
        return {"DefaultRuntime": "runc"}


def test_sixteen_jobs_starting_at_once_ask_the_engine_once(monkeypatch):
    monkeypatch.setattr(launch, "_default_runtimes", {})
    client = CountingClient("http+docker://burst")
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: launch.default_runtime(client), range(16)))   # type: ignore[arg-type]
    assert answers == ["runc"] * 16 and client.asked == 1
    other = CountingClient("http+docker://another-engine")
    assert launch.default_runtime(other) == "runc" and other.asked == 1   # (per engine)
