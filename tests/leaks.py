"""The suite's container leak check: what THIS test run made and left behind, never anybody else's.

Every container a test run makes carries its run id (pid.sandbox.reaper.LABEL_TEST_RUN, from the PID_TEST_RUN variable
that conftest sets for itself and for the pid processes it starts). The engine is shared with other runs and real
workers: only containers with this run's id are counted, and only those are removed.
"""
from __future__ import annotations

import time
from typing import Any

from pid.sandbox.reaper import LABEL_TEST_RUN, force_remove, list_containers


def run_containers(client: Any, run_id: str) -> list[dict[str, Any]]:
    """This run's containers that are not already on their way out (auto-removal takes a moment)."""
    return [c for c in list_containers(client, [f"{LABEL_TEST_RUN}={run_id}"]) if c.get("State") != "removing"]


def find_leaks(client: Any, run_id: str, wait_s: float = 10.0, poll_s: float = 0.5) -> list[dict[str, Any]]:
    """This run's containers still there after up to `wait_s` (an auto-removed one can linger briefly)."""
    deadline = time.monotonic() + wait_s
    leaked = run_containers(client, run_id)
    while leaked and time.monotonic() < deadline:
        time.sleep(poll_s)
        leaked = run_containers(client, run_id)
    return leaked


def remove_leaks(client: Any, leaked: list[dict[str, Any]]) -> None:
    """Force-remove them; one that vanished meanwhile is fine (force_remove never raises)."""
    for container in leaked:
        force_remove(client, container["Id"])


def describe(leaked: list[dict[str, Any]]) -> str:
    return ", ".join(f"{c['Id'][:12]}({(c.get('Labels') or {}).get('pid.job', '?')})" for c in leaked)
