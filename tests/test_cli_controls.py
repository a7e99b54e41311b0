"""Controls seen: steer, follow-up, pause, resume and cancel each show as they are sent (→) and again as the agent
receives them (←), in a foreground `pid run`'s terminal and in `pid logs` / `logs -f`, from the one event union
(pid/events.py Control). Real CLI processes, a real container, a scripted model."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.gate import gated, open_gate
from tests.scripted_llm import ScriptedLLM

pytestmark = [pytest.mark.docker, pytest.mark.cli]


def start_run(env: dict[str, str], cwd: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """A foreground `pid run` and its job id (its first line)."""
    proc = subprocess.Popen([sys.executable, "-m", "pid.cli.main", "run", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stderr is not None
    first = proc.stderr.readline()
    assert first.startswith("job "), first
    return proc, first.split()[1].rstrip(":")


def wait_until(predicate, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def in_order(text: str, *lines: str) -> None:
    """Each of `lines` begins a line of `text`, in this order."""
    starts = [n for line in lines for n, got in enumerate(text.splitlines()) if got.startswith(line)][:len(lines)]
    assert len(starts) == len(lines) and starts == sorted(starts), (lines, text)


def test_controls_show_as_sent_and_as_received_in_the_terminal_and_the_log(run_pid, pid_env, sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": gated("true")}}]},
              {"text": "steered"}, {"text": "followed up"}]
    with ScriptedLLM(script) as llm:
        proc, job_id = start_run(pid_env, tmp_path, "t", "--repo", str(sample_repo), "--model", "scripted",
                                 "--base-url", llm.base_url, "--out", str(tmp_path / "out"))
        try:
            wait_until(lambda: len(llm.requests) >= 1, what="the first model call")
            not_paused = run_pid("resume", job_id)   # (not "resumed": nothing was paused)
            assert not_paused.code == 2 and "is running, not paused: nothing to resume" in not_paused.stderr
            follower = subprocess.Popen([sys.executable, "-m", "pid.cli.main", "logs", job_id, "-f"], cwd=tmp_path,
                                        env=pid_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for args in (("pause", job_id), ("steer", job_id, "STEER-1"), ("follow-up", job_id, "FOLLOW-2")):
                assert run_pid(*args).code == 0
            open_gate(job_id)   # the command ends only now: all three were sent while it ran
            wait_until(lambda: "← pause received" in run_pid("logs", job_id).stdout, what="the pause to take hold")
            assert len(llm.requests) == 1   # held before its next model call
            assert run_pid("resume", job_id).code == 0
            _, err = proc.communicate(timeout=120)
            followed, _ = follower.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 0, err
    for shown in (err, run_pid("logs", job_id).stdout, followed):
        in_order(shown, "→ pause sent", "← pause received: the agent holds", "→ resume sent",
                 "← resume received: the agent goes on", "← steer received: STEER-1",
                 "← follow-up received: FOLLOW-2")
        in_order(shown, "→ steer sent: STEER-1", "← pause received")   # sent at once, received after the pause
        in_order(shown, "→ follow-up sent: FOLLOW-2", "← pause received")


def test_a_cancel_shows_as_sent_and_as_received(run_pid, pid_env, sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60"}}]}, {"text": "never"}]
    with ScriptedLLM(script) as llm:
        proc, job_id = start_run(pid_env, tmp_path, "t", "--repo", str(sample_repo), "--model", "scripted",
                                 "--base-url", llm.base_url, "--out", str(tmp_path / "out"))
        try:
            wait_until(lambda: len(llm.requests) >= 1, what="the first model call")
            cancelled = run_pid("cancel", job_id)
            _, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
    # a foreground job has no worker: its `pid run` stops it
    assert cancelled.code == 0 and cancelled.stdout == (f"{job_id}: cancelling (its `pid run` stops it and keeps "
                                                        "the artifacts so far)\n"), cancelled.stdout
    assert proc.returncode == 1, err
    assert any(line.startswith("cancelled in ") for line in err.splitlines()), err   # said once, not "(cancelled)"
    in_order(err, "→ cancel sent", "← cancel received: the agent stops")
    in_order(run_pid("logs", job_id).stdout, "→ cancel sent", "← cancel received: the agent stops")
