"""A command for the scripted agent that waits until the test opens a gate: instead of `sleep N` while the test sends
controls (pause, steer, follow-up) to the running job, which a loaded machine can outrun (the sleep ends before the
third `pid` command has even started, and the control lands at the wrong turn or on a finished job)."""
from __future__ import annotations

GATE = "/tmp/.pid-test-gate"   # the job container's /tmp: the agent's command sees it appear


def gated(then: str, limit_s: int = 120) -> str:
    """A bash command: wait for the gate (at most `limit_s`, so that a test that never opens it fails rather than
    hangs), then run `then`."""
    return f"n=0; while [ ! -e {GATE} ] && [ $n -lt {limit_s * 10} ]; do sleep 0.1; n=$((n + 1)); done; {then}"


def open_gate(job_id: str) -> None:
    """Open the gate in the job's own container (found by its job label; no other container is touched)."""
    from tests.conftest import pid_containers
    boxes = [c for c in pid_containers() if c.labels.get("pid.job") == job_id]
    assert boxes, f"job {job_id} has no container"
    for box in boxes:
        done = box.exec_run(["touch", GATE], user="root")
        assert done.exit_code == 0, done.output
