"""`pid steer` and `pid follow-up` as a new user met them: a message from stdin (`-`), and a job whose agent has
ended (its check or its artifacts still under way) refusing what no one would read. Real CLI processes and a real
job store; no engine."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pid.jobs.spec import JobSpec
from pid.jobs.sqlite_store import JobStore

pytestmark = pytest.mark.cli


def pid(env: dict[str, str], cwd: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pid.cli.main", *args], cwd=cwd, env=env, input=stdin, text=True,
                          capture_output=True, timeout=60)


def test_a_message_dash_is_read_from_stdin_and_an_ended_agent_takes_none(pid_env, tmp_path):
    store = JobStore(str(Path(pid_env["PID_HOME"]) / "jobs.db"))
    job = store.create(JobSpec(task="t", repo=str(tmp_path), model="m", out_dir=str(tmp_path),
                               base_url="http://127.0.0.1:9/v1"))
    sent = pid(pid_env, tmp_path, "steer", job.id, "-", stdin="from stdin\nsecond line\n")
    assert sent.returncode == 0, sent.stderr
    assert pid(pid_env, tmp_path, "follow-up", job.id, "-", stdin="later").returncode == 0
    assert store.take_messages(job.id) == [("steer", "from stdin\nsecond line\n"), ("follow_up", "later")]

    assert store.claim(job.id, "w", lease_s=60)
    for activity in ("running the check", "collecting the artifacts"):   # (the worker's progress, jobs/progress.py)
        assert store.progress(job.id, "w", 1, 1, activity=activity)
        for command in ("steer", "follow-up"):
            refused = pid(pid_env, tmp_path, command, job.id, "too late")
            assert refused.returncode == 2 and refused.stderr == \
                f"pid: error: job {job.id}'s agent has ended (now: {activity}): it takes no more messages\n", \
                refused.stderr
        paused = pid(pid_env, tmp_path, "pause", job.id)   # (it said nothing, and held nothing: an API tester's)
        assert paused.returncode == 2 and paused.stderr == \
            f"pid: error: job {job.id}'s agent has ended (now: {activity}): nothing to pause\n", paused.stderr
    assert store.take_messages(job.id) == [] and not store.get(job.id).paused
