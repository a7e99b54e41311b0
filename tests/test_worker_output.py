"""The worker is quiet: one line when a job starts and one when it ends (no Celery banner, no line per HTTP request);
Ctrl-C lets the running job end, then stops. A Redis broker without its client is a clear error."""
from __future__ import annotations

import pytest

import os
import subprocess
import sys
import signal
import time

from tests.conftest import start_worker, stop_worker
from tests.scripted_llm import ScriptedLLM
from tests.stderr_lines import StderrLines

pytestmark = pytest.mark.docker  # the whole module needs an engine


def test_the_worker_prints_a_line_per_job_and_ctrl_c_lets_the_running_job_end(run_pid, pid_env, sample_repo,
                                                                              tmp_path):
    log = tmp_path / "worker.log"
    # (long enough for `pid status` to see it under a loaded CI: each call is a Python start; 4 s was missed once)
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 10"}}]}, {"text": "done"}]
    worker = start_worker(pid_env, tmp_path, log)
    try:
        with ScriptedLLM(script) as llm:
            job_id = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url,
                             "--out", str(tmp_path / "out")).stdout.strip()
            deadline = time.time() + 60
            while "running bash" not in run_pid("status", job_id).stdout:
                assert time.time() < deadline, log.read_text()
                time.sleep(0.2)
            os.killpg(worker.pid, signal.SIGINT)       # Ctrl-C in the worker's terminal
            assert worker.wait(timeout=60) == 0, log.read_text()
            assert len(llm.requests) == 2              # the job went on to its end...
        done = run_pid("result", job_id, "--json")
    finally:
        stop_worker(worker)
    assert done.code == 0 and done.json()["final_message"] == "done"   # ...and completed
    text = log.read_text()
    assert "pid worker ready" in text
    assert f"job {job_id} started: t" in text
    assert f"job {job_id} completed (stop) in " in text
    assert "waiting for 1 running job(s) to end" in text
    for noise in ("HTTP Request", "[tasks]", "celery@", "SecurityWarning", "No hostname was supplied",
                  "Warm shutdown"):
        assert noise not in text, text


def test_a_redis_broker_without_its_client_is_a_clear_error(run_pid, pid_env, sample_repo, tmp_path):
    # whether or not redis is installed here, this checkout sees it as missing
    hide = tmp_path / "hide"
    (hide / "redis").mkdir(parents=True)
    (hide / "redis" / "__init__.py").write_text("raise ImportError('no redis here')\n")
    env = {**pid_env, "PID_BROKER_URL": "redis://127.0.0.1:1/0",
           "PYTHONPATH": f"{hide}{os.pathsep}{pid_env['PYTHONPATH']}"}
    for args in (["submit", "t", "--repo", str(sample_repo), "--model", "m"], ["worker"]):
        res = run_pid(*args, env=env, timeout=60)
        assert res.code == 2, res.stderr
        assert res.stderr.strip() == ("pid: error: PID_BROKER_URL=redis://… needs the redis client, which is not "
                                      "installed: pip install 'pid[redis]'")
    # a Redis broker means the Redis store too (jobs/store.py: store_url), so `list` needs the client as well...
    res = run_pid("list", env=env)
    assert res.code == 2 and "needs the redis client" in res.stderr
    # ...unless the store is named apart: what needs no broker still works
    local = {**env, "PID_STORE_URL": f"sqlite://{tmp_path}/jobs.db"}
    assert run_pid("list", env=local).code == 0


def test_sigusr2_writes_every_threads_stack_to_the_workers_log(pid_env, tmp_path):
    """What a worker that does not stop is waiting for: `kill -USR2` answers it, every time, and the worker runs
    on."""
    log_path = tmp_path / "w.log"
    proc = start_worker(pid_env, tmp_path, log_path)
    head, end = f"every thread's stack in pid worker {proc.pid} ", f"end of the stacks of pid worker {proc.pid}\n"

    def dumps() -> list[str]:   # the whole ones
        return [part.split(end, 1)[0] for part in log_path.read_text().split(head)[1:] if end in part]

    def waiter_shown(dump: str) -> bool:   # the thread that waits for a drained worker, by its name, and its stack
        section = dump.partition("\nthread pid-stop-when-drained (")[2].split("\nthread ", 1)[0]
        return "in _stop_when_drained" in section

    try:
        # (each dump is a snapshot: one that came as the thread was starting may show it elsewhere, so ask again)
        deadline, asked = time.time() + 30, 0.0
        while not any(waiter_shown(dump) for dump in dumps()):
            assert time.time() < deadline and proc.poll() is None, log_path.read_text()
            if time.time() - asked > 2:
                os.kill(proc.pid, signal.SIGUSR2)
                asked = time.time()
            time.sleep(0.1)
        before = len(dumps())
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGUSR2)   # and again: the worker answers every time
        while len(dumps()) <= before:
            assert time.time() < deadline + 10 and proc.poll() is None, log_path.read_text()
            time.sleep(0.1)
        time.sleep(0.5)
        assert proc.poll() is None
    finally:
        stop_worker(proc)


def test_pid_workers_lists_the_live_workers_from_their_heartbeats(run_pid, pid_env, tmp_path):
    assert run_pid("workers", env=pid_env).stdout.startswith("no live worker")
    procs = [start_worker(pid_env, tmp_path, tmp_path / f"w{n}.log", concurrency=n + 1) for n in range(2)]
    try:
        deadline = time.time() + 20
        while len(run_pid("workers", "--json", env=pid_env).json()) < 2:
            assert time.time() < deadline
            time.sleep(0.5)
        listed = run_pid("workers", "--json", env=pid_env).json()
        assert sorted((w["pid"], w["concurrency"], w["running"], w["alive"]) for w in listed) == \
            sorted((p.pid, n + 1, 0, True) for n, p in enumerate(procs))
        text = run_pid("workers", env=pid_env).stdout
        assert "  0/1  " in text and "  0/2  " in text and text.count("alive") == 2
    finally:
        for proc in procs:
            stop_worker(proc)
    assert run_pid("workers", env=pid_env).stdout.startswith("no live worker")


@pytest.mark.long
def test_queues_route_jobs_to_the_workers_that_consume_them(run_pid, pid_env, sample_repo, tmp_path):
    """A job submitted to queue 'big' waits while only a default-queue worker runs (and --wait says no worker
    consumes 'big'); a worker started with --queue big takes it. `pid workers` shows each worker's queues."""
    script = [{"text": "done"}, {"text": "done"}]
    with ScriptedLLM(script) as llm:
        args = ["t", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url,
                "--out", str(tmp_path / "out")]
        default = start_worker(pid_env, tmp_path, tmp_path / "w1.log")
        big = None
        try:
            plain = run_pid("submit", "--wait", *args)
            assert plain.code == 0, plain.stderr
            waiting = subprocess.Popen([sys.executable, "-m", "pid.cli.main", "submit", "--wait", "--queue", "big",
                                        *args],
                                       cwd=tmp_path, env={**pid_env, "PID_NO_WORKER_NOTICE_S": "4"},
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            waiting_err = StderrLines(waiting)
            notice = "no worker is consuming queue 'big' (start one with `pid worker --queue big`)"
            waiting_err.wait_for(notice)   # 4 s queued, with the default worker free all along
            assert waiting.poll() is None and len(llm.requests) == 1   # the default worker did not take it
            big = start_worker({**pid_env, "PID_QUEUES": "big,other"}, tmp_path, tmp_path / "w2.log")
            err = waiting_err.text(timeout=120)
            assert waiting.returncode == 0, err
            assert notice in err, err
            listed = {w["pid"]: w["queues"] for w in run_pid("workers", "--json").json()}
            assert listed == {default.pid: ["pid"], big.pid: ["big", "other"]}
        finally:
            stop_worker(default)
            if big is not None:
                stop_worker(big)
    assert "job " in (tmp_path / "w2.log").read_text() and " completed (" in (tmp_path / "w2.log").read_text()
