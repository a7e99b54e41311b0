"""Chaos on real brokers, started by the tests themselves (tests/brokers.py; skipped where the server is not
installed): Redis killed and restarted empty mid-batch, Redis down while a lost job is put back, RabbitMQ with
two workers on one host and a consumer timeout shorter than a job, and Flower listing pid's tasks.

Every job completes exactly once: no two attempts of one job are ever live at once (the model server's log), and
none is left queued."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.brokers import free_port
from tests.conftest import start_worker, stop_worker
from tests.gate import gated, open_gate
from tests.scripted_llm import ScriptedLLM
from tests.test_worker_chaos import JobsModel, _submit, _wait_running_tool
from pid.jobs.sqlite_store import JobStore
from pid.jobs.store import Store

pytestmark = pytest.mark.docker


def _store(env: dict[str, str]) -> JobStore:
    return JobStore(os.path.join(env["PID_HOME"], "jobs.db"))


def _local_store(pid_env: dict[str, str]) -> dict[str, str]:
    """These tests are about the broker: the job store stays SQLite under PID_HOME (a Redis broker would otherwise
    be the store too, jobs/store.py: store_url)."""
    return {"PID_STORE_URL": "sqlite://" + os.path.join(os.path.abspath(pid_env["PID_HOME"]), "jobs.db")}


def _wait_ended(store: Store, job_ids: list[str], logs: list[Path], timeout: float) -> None:
    deadline = time.time() + timeout
    while True:
        records = [store.get(j) for j in job_ids]
        if all(r.terminal for r in records):
            return
        if time.time() > deadline:
            pending = [(r.id, r.status, r.attempts, r.dispatched_at) for r in records if not r.terminal]
            raise AssertionError(f"not ended after {timeout:.0f}s: {pending}\n" +
                                 "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs))
        time.sleep(0.5)


def _all_completed_once(store: Store, job_ids: list[str], model: JobsModel) -> list:
    records = [store.get(j) for j in job_ids]
    assert [(r.status, r.exit_reason) for r in records] == [("completed", "stop")] * len(job_ids), \
        [(r.id, r.status, r.exit_reason, r.error) for r in records]
    model.assert_never_two_live_attempts()
    return records


# -- RabbitMQ -------------------------------------------------------------------------------------------------------

@pytest.mark.long
def test_rabbitmq_a_job_longer_than_the_consumer_timeout_completes_and_the_worker_keeps_consuming(
        rabbitmq_server, run_pid, pid_env, sample_repo, tmp_path):
    """One process, two jobs queued at once, the first longer than the broker's consumer timeout: RabbitMQ would
    hand the worker the second one while the first runs, and time it out unacknowledged."""
    env = {**pid_env, "PID_BROKER_URL": rabbitmq_server.url, "PID_SWEEP_S": "1"}
    store = _store(env)
    timeout_s = rabbitmq_server.consumer_timeout_ms / 1000
    model = JobsModel(long_command=f"sleep {timeout_s * 2 + 5:.0f}")
    log = tmp_path / "w.log"
    with ScriptedLLM(responder=model) as llm:
        worker = start_worker(env, tmp_path, log, concurrency=1)
        try:
            jobs = [_submit(run_pid, env, sample_repo, llm, tmp_path / "out", n) for n in range(2)]
            _wait_ended(store, jobs, [log], timeout=150)
            assert worker.poll() is None, log.read_text()
        finally:
            stop_worker(worker)
    records = _all_completed_once(store, jobs, model)
    assert [r.attempts for r in records] == [1, 1]
    assert records[0].duration_s > timeout_s   # it did outlast the broker's timeout
    assert records[1].started_at > records[0].finished_at   # the same worker took the next job after it
    assert "timed out" not in rabbitmq_server.log()


@pytest.mark.long
def test_rabbitmq_a_message_that_arrives_while_every_process_is_busy_goes_back_to_the_broker(
        rabbitmq_server, run_pid, pid_env, sample_repo, tmp_path):
    """Two processes, two jobs running, two more queued: when the shorter job ends the broker sends two (its
    prefetch), one more than can start; that one goes back to the broker instead of timing out in the worker while
    the long jobs run."""
    env = {**pid_env, "PID_BROKER_URL": rabbitmq_server.url}
    store = _store(env)
    timeout_s = rabbitmq_server.consumer_timeout_ms / 1000
    # the first two wait for the test (tests/gate.py) until the other two are queued, however long submitting takes
    long = f"sleep {timeout_s * 4:.0f}"
    model = JobsModel(long_command=long, first_commands={"chaos-0": gated(long), "chaos-1": gated("true")})
    log = tmp_path / "w.log"
    with ScriptedLLM(responder=model) as llm:
        worker = start_worker(env, tmp_path, log, concurrency=2)
        try:
            with ThreadPoolExecutor(2) as submits:
                def submit(numbers: range) -> list[str]:
                    return list(submits.map(lambda n: _submit(run_pid, env, sample_repo, llm, tmp_path / "out", n),
                                            numbers))
                jobs = submit(range(2))
                _wait_running_tool(store, jobs, log)   # the first two run; two more wait for the shorter one's end
                jobs += submit(range(2, 4))
            assert store.get(jobs[1]).status == "running", log.read_text()
            open_gate(jobs[0])   # the long one runs on,
            open_gate(jobs[1])   # the short one ends: the broker sends the two queued, one more than can start
            _wait_ended(store, jobs, [log], timeout=150)
            assert worker.poll() is None, log.read_text()
        finally:
            stop_worker(worker)
    records = _all_completed_once(store, jobs, model)
    assert [r.attempts for r in records] == [1] * 4
    assert "timed out" not in rabbitmq_server.log()


def test_rabbitmq_two_workers_on_one_host_both_consume(rabbitmq_server, run_pid, pid_env, sample_repo, tmp_path):
    env = {**pid_env, "PID_BROKER_URL": rabbitmq_server.url}
    store = _store(env)
    model = JobsModel(long_command="sleep 8")
    logs = [tmp_path / "w1.log", tmp_path / "w2.log"]
    with ScriptedLLM(responder=model) as llm:
        workers = [start_worker(env, tmp_path, log) for log in logs]
        try:
            jobs = [_submit(run_pid, env, sample_repo, llm, tmp_path / "out", n) for n in range(2)]
            _wait_running_tool(store, jobs, logs[0])   # both at once: one on each worker
            running_on = {store.get(j).owner.rsplit(":", 2)[1] for j in jobs}
            _wait_ended(store, jobs, logs, timeout=90)
            assert [w.poll() for w in workers] == [None, None], [p.read_text() for p in logs]
        finally:
            for w in workers:
                stop_worker(w)
    _all_completed_once(store, jobs, model)
    assert len(running_on) == 2
    assert [sum(f"job {j} started" in p.read_text() for j in jobs) for p in logs] == [1, 1]


def _messages_lost(*logs: Path) -> int:
    return sum(p.read_text().count("its message is lost") for p in logs)


# -- Redis ----------------------------------------------------------------------------------------------------------

@pytest.mark.long
def test_redis_killed_and_restarted_empty_mid_batch_every_job_completes_exactly_once(
        redis_server, run_pid, pid_env, sample_repo, tmp_path):
    """kill -9 and an empty restart lose every message Redis held: the reconciler dispatches those jobs again."""
    env = {**pid_env, "PID_BROKER_URL": redis_server.url, "PID_SWEEP_S": "1", "PID_RECONCILE_S": "8",
           **_local_store(pid_env)}
    store = _store(env)
    model = JobsModel(long_command="sleep 8")
    logs = [tmp_path / "w1.log", tmp_path / "w2.log"]
    with ScriptedLLM(responder=model) as llm:
        workers = [start_worker(env, tmp_path, log, concurrency=2) for log in logs]
        try:
            with ThreadPoolExecutor(4) as submits:   # quickly: most of the batch is still queued when Redis dies
                jobs = list(submits.map(lambda n: _submit(run_pid, env, sample_repo, llm, tmp_path / "out", n),
                                        range(12)))
            deadline = time.time() + 90
            while sum((r := store.get(j)) is not None and r.status == "running" for j in jobs) < 4:
                assert time.time() < deadline, logs[0].read_text()
                time.sleep(0.2)
            queued = sum(store.get(j).status == "queued" for j in jobs)
            redis_server.kill()
            time.sleep(2)
            redis_server.start()
            _wait_ended(store, jobs, logs, timeout=180)
            assert [w.poll() for w in workers] == [None, None], [p.read_text() for p in logs]
        finally:
            for w in workers:
                stop_worker(w)
    print(f"queued when Redis was killed: {queued}; re-dispatched as lost: {_messages_lost(*logs)}")
    records = _all_completed_once(store, jobs, model)
    assert [r.attempts for r in records] == [1] * 12
    assert sorted(len(runs) for runs in model.attempts.values()) == [1] * 12
    assert queued >= 1 and _messages_lost(*logs) >= 1   # the chaos happened: messages were lost and re-dispatched


def test_redis_down_while_a_lost_job_is_put_back_then_back_the_job_completes(
        redis_server, run_pid, pid_env, sample_repo, tmp_path):
    """A worker SIGKILLed while Redis is down: its job goes back to the queue but cannot be dispatched; once Redis is
    back the reconciler dispatches it and it completes, once."""
    env = {**pid_env, "PID_BROKER_URL": redis_server.url, "PID_SWEEP_S": "1", **_local_store(pid_env)}
    store = _store(env)
    model = JobsModel(long_command="sleep 60")
    logs = [tmp_path / "w1.log", tmp_path / "w2.log"]
    with ScriptedLLM(responder=model) as llm:
        first = start_worker(env, tmp_path, logs[0])
        second = None
        try:
            job_id = _submit(run_pid, env, sample_repo, llm, tmp_path / "out", 0)
            _wait_running_tool(store, [job_id], logs[0])
            second = start_worker(env, tmp_path, logs[1])
            redis_server.kill()
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
            deadline = time.time() + 60
            while (r := store.get(job_id)).dispatch_error is None:   # put back, and its dispatch failed
                assert time.time() < deadline, (r, logs[1].read_text())
                time.sleep(0.2)
            time.sleep(3)
            down, runs_while_down = store.get(job_id), len(model.attempts["chaos-0"])
            redis_server.start()
            _wait_ended(store, [job_id], logs, timeout=90)
        finally:
            stop_worker(first)
            if second is not None:
                stop_worker(second)
    assert (down.status, down.attempts) == ("queued", 1), down
    assert runs_while_down == 1   # nothing ran while Redis was down
    record = _all_completed_once(store, [job_id], model)[0]
    assert record.attempts == 2 and len(model.attempts["chaos-0"]) == 2


def test_a_redis_broker_is_the_job_store_too(redis_server, run_pid, pid_env, sample_repo, tmp_path):
    """No PID_STORE_URL: the broker's Redis holds the jobs (jobs/redis_store.py); no database under PID_HOME."""
    from pid.jobs.redis_store import RedisStore
    env = {**pid_env, "PID_BROKER_URL": redis_server.url, "PID_SWEEP_S": "1"}
    store = RedisStore(redis_server.url)
    model = JobsModel(long_command="true")
    log = tmp_path / "w.log"
    with ScriptedLLM(responder=model) as llm:
        worker = start_worker(env, tmp_path, log, concurrency=2)
        try:
            jobs = [_submit(run_pid, env, sample_repo, llm, tmp_path / "out", n) for n in range(3)]
            _wait_ended(store, jobs, [log], timeout=120)
            listed = run_pid("list", env=env)
            assert [w.concurrency for w in store.workers(alive_within_s=30)] == [2]
        finally:
            stop_worker(worker)
    assert listed.code == 0 and all(j in listed.stdout for j in jobs), listed
    _all_completed_once(store, jobs, model)
    assert not os.path.exists(os.path.join(pid_env["PID_HOME"], "jobs.db"))


# -- Flower ---------------------------------------------------------------------------------------------------------

def test_flower_lists_a_pid_jobs_task(redis_server, run_pid, pid_env, sample_repo, tmp_path):
    """The command docs/queue.md gives: Flower on the broker, a `pid worker --events`; Flower's API lists the job."""
    env = {**pid_env, "PID_BROKER_URL": redis_server.url, **_local_store(pid_env)}
    port = free_port()
    flower_log = tmp_path / "flower.log"
    with open(flower_log, "w") as out:
        flower = subprocess.Popen(
            [sys.executable, "-m", "celery", "--broker", redis_server.url, "flower", f"--port={port}",
             "--address=127.0.0.1"], env={**env, "FLOWER_UNAUTHENTICATED_API": "true"}, cwd=tmp_path,
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    model = JobsModel(long_command="true")
    log = tmp_path / "w.log"
    try:
        with ScriptedLLM(responder=model) as llm:
            worker = start_worker(env, tmp_path, log, events=True)
            try:
                job_id = _submit(run_pid, env, sample_repo, llm, tmp_path / "out", 0)
                _wait_ended(_store(env), [job_id], [log, flower_log], timeout=90)
                tasks: dict = {}
                deadline = time.time() + 30
                while job_id not in tasks:
                    assert time.time() < deadline and flower.poll() is None, (tasks, flower_log.read_text())
                    time.sleep(0.5)
                    try:
                        tasks = httpx.get(f"http://127.0.0.1:{port}/api/tasks", timeout=5).json()
                    except (httpx.HTTPError, ValueError):
                        pass
            finally:
                stop_worker(worker)
    finally:
        flower.terminate()
        flower.wait(timeout=30)
    assert tasks[job_id]["name"] == "pid.run_job"
    assert tasks[job_id]["state"] == "SUCCESS"
