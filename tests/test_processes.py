"""The host's sweep of a container's processes (sandbox/processes.py) as a state machine: what it tells its caller
when the engine's freeze and thaw fail in turn. The sweep itself, against real containers: test_trust_boundary."""
from __future__ import annotations

import docker.errors
import pytest

from pid.sandbox import processes


class Engine:
    """The engine's API as the sweep uses it: pauses that fail `refusals` times, thaws that always fail."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.paused = False

    def inspect_container(self, container_id: str) -> dict:
        return {"State": {"Pid": 4242}}

    def pause(self, container_id: str) -> None:
        if self.refusals:
            self.refusals -= 1
            raise docker.errors.APIError("unable to freeze")
        self.paused = True

    def unpause(self, container_id: str) -> None:
        raise docker.errors.APIError("cannot thaw")


class Client:
    def __init__(self, api: Engine) -> None:
        self.api = api


@pytest.fixture
def nothing_listed(monkeypatch, tmp_path):
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    monkeypatch.setattr(processes.os, "geteuid", lambda: 0)
    monkeypatch.setattr(processes, "_cgroup_procs_file", lambda pid: str(procs))
    monkeypatch.setattr(processes, "_host_uid", lambda pid, uid: 1000)
    monkeypatch.setattr(processes.time, "sleep", lambda s: None)


def test_a_container_frozen_late_and_never_thawed_goes_back_to_the_caller_as_frozen(nothing_listed):
    """The freeze failed three times (the passes ran unfrozen), then succeeded for the last look, and no thaw
    worked: the sweep must say the container is frozen (its caller removes it), never that it may go on (a request
    into a frozen container waits out its timeout; a docker exec there wedges the engine's shim)."""
    engine = Engine(refusals=processes.FREEZE_ATTEMPTS)
    sweep = processes.kill_agent_processes(Client(engine), "c0ffee", 1000)
    assert engine.paused and sweep is not None and not sweep.thawed


def test_a_container_that_was_never_frozen_and_held_nothing_is_left_to_the_sweep_inside(nothing_listed):
    engine = Engine(refusals=processes.FREEZE_ATTEMPTS + 1)
    assert processes.kill_agent_processes(Client(engine), "c0ffee", 1000) is None
