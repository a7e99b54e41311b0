"""Chaos on the embedded queue: a worker told to stop (SIGTERM or SIGHUP to its process group, as a service manager
or a closed terminal does; Ctrl-C twice) hands its running jobs back, never fails them; a SIGKILLed worker's job
starts again on another worker within seconds. Every job completes exactly once: no two attempts of one job are
ever live at the same time, as the model server's request log shows."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from typing import Any

import pytest

from tests.conftest import RUNTIME, pid_containers, start_worker, stop_worker
from tests.scripted_llm import ScriptedLLM
from pid.jobs.sqlite_store import JobStore

pytestmark = pytest.mark.docker


class JobsModel:
    """Answers each job by its task ("chaos-N"): its first attempt runs a long command, a later attempt a short one,
    and after a tool result the job is done. Keeps, per job and attempt, when its requests arrived."""

    def __init__(self, long_command: str = "sleep 30", first_commands: dict[str, str] | None = None) -> None:
        self.long_command = long_command
        self.first_commands = first_commands or {}   # job task -> its first attempt's command, instead
        self.attempts: dict[str, list[list[float]]] = {}   # job task -> [request times of each attempt]
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps(body.get("messages", []))
        task = re.search(r"chaos-\d+", text)
        assert task, text[:300]
        name = task.group(0)
        with self._lock:
            runs = self.attempts.setdefault(name, [])
            called = re.search(rf"call-{name}-(\d+)", text)
            if called is None:   # a new attempt: system prompt and task only
                runs.append([time.time()])
                command = self.first_commands.get(name, self.long_command) if len(runs) == 1 else "true"
                return {"tool_calls": [{"id": f"call-{name}-{len(runs)}", "name": "bash",
                                        "arguments": {"command": command}}]}
            runs[int(called.group(1)) - 1].append(time.time())
            return {"text": f"done {name}"}

    def assert_never_two_live_attempts(self) -> None:
        assert_never_two_live_attempts(self.attempts)


def assert_never_two_live_attempts(attempts: dict[str, list[list[float]]]) -> None:
    """Each attempt's model requests all come before the next attempt's first: never two live at once."""
    for name, runs in attempts.items():
        for earlier, later in zip(runs, runs[1:]):
            assert max(earlier) < min(later), f"{name}: two attempts were live at once: {runs}"


def _submit(run_pid, env, repo, llm, out, n: int) -> str:
    res = run_pid("submit", f"chaos-{n}", "--repo", str(repo), "--model", "m", "--base-url", llm.base_url,
                  "--out", str(out), *(["--runtime", RUNTIME] if RUNTIME else []), env=env)
    assert res.code == 0, res.stderr
    return res.stdout.strip()


def _wait_running_tool(store: JobStore, job_ids: list[str], log_path, timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while not all("running bash" in ((r := store.get(j)) and r.activity or "") for j in job_ids):
        assert time.time() < deadline, log_path.read_text()
        time.sleep(0.2)


def _wait_stopped(proc, log_path, timeout: float) -> None:
    """Wait for a worker to exit; if it does not, its log with every thread's stack (SIGUSR2) is the failure."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGUSR2)
        time.sleep(2)
        pytest.fail(f"the worker did not stop within {timeout:.0f} s:\n" + log_path.read_text()[-20000:])


def _own_containers(job_ids: list[str]) -> list[str]:
    return [c.labels["pid.job"] for c in pid_containers() if c.labels.get("pid.job") in job_ids]


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGHUP", "SIGINT twice"])
def test_a_stopped_worker_hands_its_jobs_back_and_they_complete_exactly_once(stop, run_pid, pid_env, sample_repo,
                                                                              tmp_path):
    env = {**pid_env, "PID_SWEEP_S": "1"}
    store = JobStore(os.path.join(env["PID_HOME"], "jobs.db"))
    model = JobsModel()
    with ScriptedLLM(responder=model) as llm:
        first = start_worker(env, tmp_path, tmp_path / "w1.log", concurrency=2)
        try:
            jobs = [_submit(run_pid, env, sample_repo, llm, tmp_path / "out", n) for n in range(2)]
            _wait_running_tool(store, jobs, tmp_path / "w1.log")
            if stop == "SIGINT twice":
                os.killpg(first.pid, signal.SIGINT)
                time.sleep(1.5)
                assert first.poll() is None and [store.get(j).status for j in jobs] == ["running"] * 2
                os.killpg(first.pid, signal.SIGINT)
            else:
                os.killpg(first.pid, getattr(signal, stop))
            _wait_stopped(first, tmp_path / "w1.log", timeout=120)   # seconds when idle; a loaded machine is slower
        finally:
            stop_worker(first)
        log = (tmp_path / "w1.log").read_text()
        records = [store.get(j) for j in jobs]
        assert [(r.status, r.exit_reason, r.attempts, r.handbacks) for r in records] == \
            [("queued", None, 1, 1)] * 2, log
        assert log.count("handed back to the queue") == 2, log
        assert _own_containers(jobs) == []
        said = run_pid("logs", jobs[0], env=env)   # (not a cancel of the user's: a new-user test read it as one)
        why = "SIGINT" if stop == "SIGINT twice" else stop
        said_stop = f"→ pid stops the agent: its worker stops ({why}): the job goes back to the queue"
        assert said_stop in said.stdout and "cancel received" not in said.stdout, said.stdout
        second = start_worker(env, tmp_path, tmp_path / "w2.log", concurrency=2)
        try:
            results = [run_pid("result", j, "--wait", "--json", env=env, timeout=120) for j in jobs]
        finally:
            stop_worker(second)
    for job_id, done in zip(jobs, results):
        assert done.code == 0, done.stderr + (tmp_path / "w2.log").read_text()
        result = done.json()
        assert result["final_message"].startswith("done chaos-")
        assert [a["attempt"] for a in result["per_attempt"]] == [1, 2]
        record = store.get(job_id)
        assert (record.status, record.attempts) == ("completed", 2)
    assert sorted(len(runs) for runs in model.attempts.values()) == [2, 2]
    model.assert_never_two_live_attempts()
    assert _own_containers(jobs) == []


def test_a_killed_workers_job_starts_again_on_another_worker_within_15_s(run_pid, pid_env, sample_repo, tmp_path):
    env = dict(pid_env)   # the default sweep interval: what a real deployment gets
    store = JobStore(os.path.join(env["PID_HOME"], "jobs.db"))
    model = JobsModel()
    with ScriptedLLM(responder=model) as llm:
        first = start_worker(env, tmp_path, tmp_path / "w1.log")
        second = None
        try:
            job_id = _submit(run_pid, env, sample_repo, llm, tmp_path / "out", 0)
            _wait_running_tool(store, [job_id], tmp_path / "w1.log")
            second = start_worker(env, tmp_path, tmp_path / "w2.log")
            killed_at = time.time()
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
            deadline = time.time() + 60
            while len(model.attempts["chaos-0"]) < 2:
                assert time.time() < deadline, (tmp_path / "w2.log").read_text()
                time.sleep(0.1)
            restarted_after = model.attempts["chaos-0"][1][0] - killed_at
            done = run_pid("result", job_id, "--wait", "--json", env=env, timeout=120)
        finally:
            stop_worker(first)
            if second is not None:
                stop_worker(second)
    assert restarted_after <= 15, f"the job started again {restarted_after:.1f}s after its worker was killed"
    assert done.code == 0, done.stderr
    assert store.get(job_id).attempts == 2
    model.assert_never_two_live_attempts()
    assert _own_containers([job_id]) == []


def test_a_job_cancelled_while_its_worker_is_dead_ends_at_once_without_leaving_its_container(run_pid, pid_env,
                                                                                            sample_repo, tmp_path):
    store = JobStore(os.path.join(pid_env["PID_HOME"], "jobs.db"))
    model = JobsModel()
    with ScriptedLLM(responder=model) as llm:
        worker = start_worker(pid_env, tmp_path, tmp_path / "w.log")
        try:
            job_id = _submit(run_pid, pid_env, sample_repo, llm, tmp_path / "out", 0)
            _wait_running_tool(store, [job_id], tmp_path / "w.log")
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        finally:
            stop_worker(worker)
        assert _own_containers([job_id]) == [job_id]   # the dead worker's container is still there
        cancel = run_pid("cancel", job_id)
    assert cancel.code == 0, cancel.stderr
    record = store.get(job_id)
    assert (record.status, record.exit_reason) == ("cancelled", "cancelled")
    assert json.loads((tmp_path / "out" / job_id / "result.json").read_text())["exit_reason"] == "cancelled"
    assert _own_containers([job_id]) == []


SUBMIT_MANY = """
import sys
from pid.jobs.spec import JobSpec
from pid.jobs.store import default_store
from pid.jobs.dispatch import dispatch
store = default_store()
for n in range(int(sys.argv[1])):
    spec = JobSpec(task=f"chaos-{n}", repo=sys.argv[2], model="m", base_url=sys.argv[3], out_dir=sys.argv[4],
                   runtime=sys.argv[5] or None)
    store.create(spec)
    dispatch(spec.id, store=store)
    print(spec.id, flush=True)
"""


@pytest.mark.long
@pytest.mark.xdist_group("100-jobs")   # (its two runs, 12 containers each, one after the other even under xdist)
@pytest.mark.parametrize("load", [False, True], ids=["idle", "loaded"])
def test_a_100_job_batch_on_two_workers_completes_every_job_once(load, pid_env, sample_repo, tmp_path):
    """What `pid submit` does, 100 times from one process (100 CLI starts would be most of the test's time)."""
    import subprocess
    import sys
    store = JobStore(os.path.join(pid_env["PID_HOME"], "jobs.db"))
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 if load else 0)]
    with ScriptedLLM() as llm:   # every job's one model call is answered at once: "script exhausted"
        workers = [start_worker(pid_env, tmp_path, tmp_path / f"w{n}.log", concurrency=3) for n in range(2)]
        try:
            submitted = subprocess.run([sys.executable, "-c", SUBMIT_MANY, "100", str(sample_repo), llm.base_url,
                                        str(tmp_path / "out"), RUNTIME or ""], env=pid_env, capture_output=True,
                                       text=True, timeout=300)
            assert submitted.returncode == 0, submitted.stderr
            jobs = submitted.stdout.split()
            deadline = time.time() + 900
            while not all(store.get(j).terminal for j in jobs):
                assert time.time() < deadline, [store.get(j).status for j in jobs].count("queued")
                time.sleep(1)
        finally:
            for burner in burners:
                burner.kill()
            for worker in workers:
                stop_worker(worker)
        requests = len(llm.requests)
    records = [store.get(j) for j in jobs]
    assert len(jobs) == 100
    assert [r.status for r in records].count("completed") == 100, \
        {r.id: (r.status, r.exit_reason, r.error) for r in records if r.status != "completed"}
    assert [r.attempts for r in records] == [1] * 100
    assert requests == 100      # one model call per job: no job ran twice
    assert _own_containers(jobs) == []


def test_a_job_whose_agent_ended_finishes_its_check_as_its_worker_stops(run_pid, pid_env, sample_repo, tmp_path):
    """SIGTERM while a job's check runs, its agent done: handed back, its whole agent would run again (the model paid
    again); it finishes its check within the stop's grace instead, and is recorded by this worker, once."""
    env = {**pid_env, "PID_SWEEP_S": "1"}
    store = JobStore(os.path.join(env["PID_HOME"], "jobs.db"))
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo fixed >> hello.py"}}]}, {"text": "done"}]
    with ScriptedLLM(script) as llm:
        worker = start_worker(env, tmp_path, tmp_path / "w.log")
        try:
            res = run_pid("submit", "fix it", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url,
                          "--out", str(tmp_path / "out"), "--check", "sleep 6; grep -q fixed hello.py",
                          *(["--runtime", RUNTIME] if RUNTIME else []), env=env)
            assert res.code == 0, res.stderr
            job = res.stdout.strip()
            deadline = time.time() + 90
            while ((r := store.get(job)) and r.activity or "") != "running the check":
                assert time.time() < deadline, (tmp_path / "w.log").read_text()
                time.sleep(0.1)
            os.killpg(worker.pid, signal.SIGTERM)
            _wait_stopped(worker, tmp_path / "w.log", timeout=120)
        finally:
            stop_worker(worker)
        log = (tmp_path / "w.log").read_text()
        assert len(llm.requests) == 2, log
    record = store.get(job)
    assert (record.status, record.exit_reason, record.attempts, record.handbacks) == ("completed", "stop", 1, 0), log
    result = json.loads((tmp_path / "out" / job / "result.json").read_text())
    assert result["check"]["passed"] is True and "handed back" not in log
    assert _own_containers([job]) == []
