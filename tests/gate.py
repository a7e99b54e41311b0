"""A command for the scripted agent that waits until the test opens a gate: instead of `sleep N` while the test sends
controls (pause, steer, follow-up) to the running job, which a loaded machine can outrun (the sleep ends before the
third `pid` command has even started, and the control lands at the wrong turn or on a finished job)."""
from __future__ import annotations

GATE = "/tmp/.pid-test-gate"   # the job container's /tmp: the agent's command sees it appear
REACHED = "/tmp/.pid-test-reached"   # ...and the test sees this one appear, made by the command
NEVER_OPENED = 97   # the command's exit status when the gate stayed shut


def gated(then: str, limit_s: int = 120) -> str:
    """A bash command: wait for the gate, then run `then`. A gate still shut after `limit_s` ends the command with
    status 97 and says so, instead of running `then` as if the test had opened it (so a test that never opens its
    gate fails, rather than hanging or passing unnoticed)."""
    return (f"n=0; while [ ! -e {GATE} ] && [ $n -lt {limit_s * 10} ]; do sleep 0.1; n=$((n + 1)); done; "
            f"if [ ! -e {GATE} ]; then echo 'tests/gate.py: the test never opened the gate ({limit_s} s)' >&2; "
            f"exit {NEVER_OPENED}; fi; {then}")


def reached(job_id: str) -> bool:
    """Whether the job's command has got as far as `touch {REACHED}` (the other way round from the gate: the
    command tells the test it runs now), seen in the job's own container."""
    boxes = _boxes(job_id)
    return bool(boxes) and all(box.exec_run(["test", "-e", REACHED], user="root").exit_code == 0 for box in boxes)


def open_gate(job_id: str) -> None:
    """Open the gate in the job's own container (found by its job label; no other container is touched)."""
    boxes = _boxes(job_id)
    assert boxes, f"job {job_id} has no container"
    for box in boxes:
        done = box.exec_run(["touch", GATE], user="root")
        assert done.exit_code == 0, done.output


def _boxes(job_id: str) -> list:
    """The job's own containers, found by its job label (no other container is touched)."""
    from tests.conftest import pid_containers
    return [c for c in pid_containers() if c.labels.get("pid.job") == job_id]
