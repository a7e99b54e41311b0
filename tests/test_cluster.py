"""Issue 9's acceptance: workers on "other machines" (each its own PID_HOME, the client's directory hidden from
them by a private mount) and a client share nothing but Redis (broker and job store). The client submits 30 jobs and
deletes the repository; Redis is killed and restarted mid-batch (from its append-only file); a worker is SIGKILLed
mid-job. Every job completes exactly once (never two live attempts, from the model server's request log), each
patch matches the tree as it was at submit, everything downloads on the client, the killed attempt's transcript is
kept, and once the workers are gone `submit --wait` says that no worker consumes the queue."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.brokers import RedisServer, _skip_unless
from tests.conftest import ctrl_c_default, stop_worker
from tests.scripted_llm import ScriptedLLM
from tests.stderr_lines import StderrLines
from tests.test_e2e_remote import start_hidden_worker
from tests.test_worker_chaos import assert_never_two_live_attempts
from pid.jobs.redis_store import RedisStore

pytestmark = [pytest.mark.docker, pytest.mark.cli]

JOBS = 30


class ClusterModel:
    """Job "cluster-N": its first attempt edits data.txt and then runs a few seconds (so a worker can die under it),
    a later attempt edits it at once; after the tool result, the job is done. Keeps each attempt's request times."""

    def __init__(self) -> None:
        self.attempts: dict[str, list[list[float]]] = {}
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps(body.get("messages", []))
        name = re.search(r"cluster-\d+", text).group(0)   # type: ignore[union-attr]
        n = name.split("-")[1]
        with self._lock:
            runs = self.attempts.setdefault(name, [])
            called = re.search(rf"call-{name}-(\d+)", text)
            if called is None:
                runs.append([time.time()])
                wait = "; sleep 12" if len(runs) == 1 else ""
                return {"tool_calls": [{"id": f"call-{name}-{len(runs)}", "name": "bash",
                                        "arguments": {"command": f"sed -i s/v1/v2-{n}/ data.txt{wait}"}}]}
            runs[int(called.group(1)) - 1].append(time.time())
            return {"text": f"done {name}"}



def _pid(env: dict[str, str], cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pid.cli.main", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _statuses(env: dict[str, str], cwd: Path) -> dict[str, str]:
    listed = _pid(env, cwd, "list", "--limit", "100", "--json")
    return {r["id"]: r["status"] for r in json.loads(listed.stdout)} if listed.returncode == 0 else {}


@pytest.mark.long
def test_workers_sharing_only_redis_run_a_batch_exactly_once_through_a_redis_restart_and_a_killed_worker(
        pid_env, tmp_path):
    _skip_unless("redis-server", "Redis")
    redis = RedisServer(tmp_path / "redis", appendonly=True)
    redis.start()
    client = tmp_path / "client"
    repo = client / "repo"
    repo.mkdir(parents=True)
    (repo / "data.txt").write_text("v1\n")
    (client / "out").mkdir()
    base = {**pid_env, "PID_BROKER_URL": redis.url}
    client_env = {**base, "PID_HOME": str(client / "home")}
    model = ClusterModel()
    workers: list[subprocess.Popen] = []
    try:
        with ScriptedLLM(responder=model) as llm:
            jobs = []
            for n in range(JOBS):
                res = _pid(client_env, client, "submit", f"cluster-{n}", "--repo", str(repo), "--model", "m",
                           "--base-url", llm.base_url, "--out", str(client / "out"), "--disk", "0")
                assert res.returncode == 0, res.stderr
                jobs.append(res.stdout.strip())
            shutil.rmtree(repo)                    # the jobs run on the tree as it was at submit
            (client / "repo").mkdir()
            (client / "repo" / "data.txt").write_text("changed after submit\n")
            for n in (1, 2):
                (tmp_path / f"w{n}").mkdir()
                workers.append(start_hidden_worker({**base, "PID_HOME": str(tmp_path / f"w{n}" / "home")},
                                                   tmp_path / f"w{n}", tmp_path / f"w{n}.log", hide=client,
                                                   concurrency=4))
            deadline = time.time() + 30
            while len(json.loads(_pid(client_env, client, "workers", "--json").stdout or "[]")) < 2:
                assert time.time() < deadline, "pid workers did not list both workers"
                time.sleep(0.5)

            deadline = time.time() + 240
            while list(_statuses(client_env, client).values()).count("completed") < 4:
                assert time.time() < deadline, "six jobs did not complete"
                time.sleep(0.5)
            redis.restart()                        # kill -9 and start again: the append-only file has everything

            # SIGKILL the first worker while it runs a job whose transcript has reached the store
            victim = workers[0]
            store = RedisStore(redis.url)
            deadline = time.time() + 120
            killed: list[str] = []
            while not killed:
                assert time.time() < deadline, "the first worker ran no job:\n" + (tmp_path / "w1.log").read_text()
                time.sleep(0.2)
                killed = [r.id for r in store.list(100) if r.status == "running"
                          and f":{victim.pid}:" in (r.owner or "")
                          and "session.attempt-1.jsonl" in store.artifact_names(r.id)]
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait()
            lost = [r.id for r in store.list(100) if f":{victim.pid}:" in (r.owner or "")]   # before a sweep

            results = {}
            for job_id in jobs:
                done = _pid(client_env, client, "result", job_id, "--wait", "--json", "--download",
                            str(client / "dl" / job_id), timeout=300)
                logs_now = [(tmp_path / f"w{n}.log").read_text()[-3000:] for n in (1, 2)]
                assert done.returncode == 0, done.stdout[-3000:] + done.stderr + "".join(logs_now)
                results[job_id] = done
            logs = _pid(client_env, client, "logs", killed[0])
            stop_worker(workers[1])
            alone = subprocess.Popen([sys.executable, "-m", "pid.cli.main", "submit", "--wait", "cluster-99", "--repo",
                                      str(client / "repo"), "--model", "m", "--base-url", llm.base_url, "--out",
                                      str(client / "out"), "--disk", "0"], cwd=client,
                                     env={**client_env, "PID_NO_WORKER_NOTICE_S": "8"},   # > ALIVE_WITHIN_S:
                                     # by then the killed worker, whose process this host cannot see, is silent
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=ctrl_c_default)
            alone_lines = StderrLines(alone)
            alone_lines.wait_for("no worker is consuming queue 'pid'")
            alone.send_signal(signal.SIGINT)
            alone_err = alone_lines.text()
    finally:
        for proc in workers:
            stop_worker(proc)   # a clean stop removes its jobs' containers
        redis.stop()

    for n, job_id in enumerate(jobs):
        result = json.loads(results[job_id].stdout)
        assert (result["status"], result["final_message"]) == ("completed", f"done cluster-{n}")
        patch = (client / "dl" / job_id / "patch.diff").read_text()
        assert "-v1" in patch and f"+v2-{n}" in patch, patch   # the tree at submit, not the one after
        assert (client / "dl" / job_id / "session.jsonl").exists()
        assert not (client / "out" / job_id).exists()         # every byte came back through the store
    assert_never_two_live_attempts(model.attempts)
    runs = sorted(len(attempts) for attempts in model.attempts.values())
    assert runs.count(1) >= JOBS - len(lost) and max(runs) <= 2, (runs, lost)
    for job_id in killed:
        result = json.loads(results[job_id].stdout)
        assert [a["attempt"] for a in result["per_attempt"]] == [1, 2]
        assert (client / "dl" / job_id / "session.attempt-1.jsonl").exists()   # the lost attempt's transcript
    assert "was lost: back in the queue" in logs.stdout and "attempt 2 started on" in logs.stdout, logs.stdout
    assert "no worker is consuming queue 'pid'" in alone_err, alone_err
