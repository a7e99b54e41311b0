"""A worker's warm pool (worker/warm_pool.py): a ready sandbox is hardened like a fresh one, serves one job only, and
goes on cancel, on the worker's stop, and after a SIGKILL at the next reap; a job of a class with none ready starts
as without a pool."""
from __future__ import annotations

import os
import signal
import time
import uuid
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import docker
import pytest

from pid.sandbox import DockerSandbox, SandboxConfig
from pid.sandbox.config import LABEL_POOL, taken_name
from pid.sandbox.reaper import reap_expired, remove_job_containers
from pid.worker.warm_pool import IDLE_S, SPARE_S, WarmPool, class_of
from tests.conftest import RUNTIME, pid_containers, start_worker, stop_worker
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.docker

IMAGE = os.environ.get("PID_TEST_IMAGE", "pid-sandbox:latest")


def config(job_id: str, **more: Any) -> SandboxConfig:
    return SandboxConfig(**{"image": IMAGE, "runtime": RUNTIME, "job_id": job_id, "attempt": 1, "ttl_s": 600.0,
                            **more})


def pool_containers() -> list:
    return [c for c in pid_containers() if LABEL_POOL in c.labels]


def wait_ready(pool: WarmPool, count: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while sum(entry["ready"] for entry in pool.status()) < count:
        assert time.time() < deadline, "the pool made no sandbox"
        time.sleep(0.1)


def test_a_ready_sandbox_serves_one_job_and_goes_by_the_jobs_name():
    pool = WarmPool(1).start()
    taken = second = None
    try:
        assert pool.take(config("wp-test-a")) is None   # nothing served yet: the job makes its own
        pool.served(config("wp-test-a"))
        wait_ready(pool, 1)
        ready_ids = {c.id for c in pool_containers()}
        taken = pool.take(config("wp-test-a"))
        assert taken is not None and taken.container.id in ready_ids
        assert taken.exec("echo hi > /workspace/f && cat /workspace/f", timeout=30).tail == b"hi\n"
        client = docker.from_env()
        assert client.api.inspect_container(taken.container.id)["Name"] == "/" + taken_name("wp-test-a", 1)
        # the next job of the class never gets the same one: a new one (another container) is made for it
        wait_ready(pool, 1)
        second = pool.take(config("wp-test-b"))
        assert second is not None and second.container.id != taken.container.id
        assert second.exec("cat /workspace/f 2>&1; true", timeout=30).tail != b"hi\n"
        # cancel, a retry and the sweep of a lost attempt find the taken one by the job's id and attempt
        assert remove_job_containers("wp-test-a", attempt=2) == []
        assert remove_job_containers("wp-test-a", attempt=1) == [taken.container.id]
    finally:
        for box in (taken, second):
            if box is not None:
                box.close()
        pool.close()
    assert pool_containers() == []   # a clean stop leaves no ready sandbox


def test_a_class_with_nothing_ready_or_another_limit_is_not_served_from_the_pool():
    pool = WarmPool(1).start()
    try:
        pool.served(config("wp-test-c"))
        wait_ready(pool, 1)
        assert pool.take(config("wp-test-d", memory="1g")) is None      # another class
        assert pool.take(config("wp-test-e", ttl_s=10 ** 6)) is None    # needs more time than the ready one has
        assert class_of(config("x")) == class_of(config("y", attempt=3, ttl_s=900))   # (one band: 600)
    finally:
        pool.close()
    assert pool_containers() == []


def test_ready_and_taken_pool_sandboxes_expire_like_any_other():
    owner = f"wp-test-{uuid.uuid4().hex[:8]}"   # (this test's own: the reap touches nothing else)
    pool = WarmPool(2).start()
    taken = None
    try:
        pool.served(config("wp-test-g", owner=owner))
        wait_ready(pool, 2)
        taken = pool.take(config("wp-test-g", owner=owner))
        assert taken is not None
        ours = {c.id for c in pool_containers()}
        assert taken.container.id in ours and len(ours) >= 2
        later = datetime.now(timezone.utc) + timedelta(seconds=600 + IDLE_S + 2 * SPARE_S + 60)
        assert set(reap_expired(owner, now=datetime.now(timezone.utc))) == set()   # not before their time
        removed = set(reap_expired(owner, now=later))
        assert ours <= removed   # the taken one (the job's now) and the ready one alike
    finally:
        if taken is not None:
            taken.close()
        pool.close()
    assert pool_containers() == []


HARDENING = ("CapAdd", "CapDrop", "SecurityOpt", "ReadonlyRootfs", "PidsLimit", "Memory", "MemorySwap", "NanoCpus",
             "NetworkMode", "Ulimits", "Runtime", "Init", "AutoRemove", "Privileged", "LogConfig")


def test_a_pooled_sandbox_is_hardened_as_a_fresh_one():
    client = docker.from_env()
    pool = WarmPool(1).start()
    fresh = DockerSandbox.create(config("wp-test-fresh"))
    try:
        pool.served(config("wp-test-f"))
        wait_ready(pool, 1)
        taken = pool.take(config("wp-test-f"))
        assert taken is not None
        try:
            pooled_info = client.api.inspect_container(taken.container.id)
            fresh_info = client.api.inspect_container(fresh.container.id)
            for key in HARDENING:
                assert pooled_info["HostConfig"].get(key) == fresh_info["HostConfig"].get(key), key
            assert pooled_info["Config"]["User"] == fresh_info["Config"]["User"]
            assert sorted(m["Destination"] for m in pooled_info["Mounts"]) == \
                sorted(m["Destination"] for m in fresh_info["Mounts"])
            assert taken.exec("id -u", timeout=30).tail == fresh.exec("id -u", timeout=30).tail
        finally:
            taken.close()
    finally:
        fresh.close()
        pool.close()
    assert pool_containers() == []


# -- a real worker --------------------------------------------------------------------------------------------------

def _wait(what: str, check: Any, log: Path, timeout: float = 90) -> Any:
    deadline = time.time() + timeout
    while not (found := check()):
        assert time.time() < deadline, f"{what}:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)
    return found


def _ready_ids() -> list[str]:
    """The pool's containers not yet taken: the ready ones, and one still being made (labelled already)."""
    return [c.id for c in pool_containers() if c.labels.get("pid.job", "").startswith("pool-")
            and not c.name.startswith("pid-job-")]


def _wait_ready(run_pid: Any, env: dict[str, str], log: Path, count: int) -> list[str]:
    """The pool's ready sandboxes, once `pid workers` counts `count` ready: a container still being made is listed
    already, and a job that comes meanwhile is not served from it (it makes its own)."""
    _wait(f"{count} ready sandbox(es)",
          lambda: f"warm pool: {IMAGE} {count} ready" in run_pid("workers", env=env).stdout, log)
    return _wait("their containers", lambda: len(ids := _ready_ids()) == count and ids, log)


# Two jobs through a worker's pool: the first (waited for) makes its class known, the second runs its `hostname`.
TWO_JOBS = [{"text": "first"},
            {"tool_calls": [{"name": "bash", "arguments": {"command": "hostname"}}]},
            {"text": "second"}]


def _two_jobs(run_pid: Any, env: dict[str, str], tmp_path: Path, log: Path, submit: list[str],
              count: int) -> tuple[Any, str, Any]:
    """The first job to its end, the pool's `count` ready sandboxes then, and the second job (its --out in
    tmp_path/out) to its end: (ready ids, its id, its `pid result --json`)."""
    first = run_pid("submit", "t", *submit, "--wait", env=env)
    assert first.code == 0, first.stderr + log.read_text()
    ready = _wait_ready(run_pid, env, log, count)
    job_id = run_pid("submit", "t", *submit, "--out", str(tmp_path / "out"), env=env).stdout.strip()
    done = run_pid("result", job_id, "--wait", "--json", env=env, timeout=120)
    assert done.code == 0, done.stderr + log.read_text()
    return ready, job_id, done


@contextmanager
def pooled_worker(pid_env: dict[str, str], tmp_path: Path, size: int,
                  script: list[dict[str, Any]]) -> Iterator[tuple[dict[str, str], Path, ScriptedLLM, Any]]:
    """A worker with PID_POOL=size (its log, w.log) and a scripted model, stopped whatever the test does:
    (its environment, its log, the model, its process)."""
    env = {**pid_env, "PID_POOL": str(size)}
    log = tmp_path / "w.log"
    with ScriptedLLM(script) as llm:
        worker = start_worker(env, tmp_path, log)
        try:
            yield env, log, llm, worker
        finally:
            stop_worker(worker)


def test_a_worker_serves_a_job_from_its_pool_then_removes_what_is_left_as_it_stops(run_pid, pid_env, sample_repo,
                                                                                   tmp_path):
    with pooled_worker(pid_env, tmp_path, 1, TWO_JOBS) as (env, log, llm, worker):
        ready, job_id, done = _two_jobs(run_pid, env, tmp_path, log, ["--repo", str(sample_repo), "--model", "m",
                                        "--base-url", llm.base_url], 1)
        assert done.json()["final_message"] == "second"
        transcript = (tmp_path / "out" / job_id / "session.jsonl").read_text()
        assert ready[0][:12] in transcript   # the tool ran in the pooled container (its hostname)
        assert ready[0] not in {c.id for c in pid_containers()}   # and it went with the job
        _wait("the pool refilled", _ready_ids, log)
        _wait("`pid workers` shows the pool",
              lambda: f"warm pool: {IMAGE} 1 ready" in run_pid("workers", env=env).stdout, log, timeout=30)
    assert pool_containers() == [], log.read_text()[-3000:]


def test_a_checked_job_takes_a_pooled_sandbox_and_its_check_a_fresh_one(run_pid, pid_env, sample_repo, tmp_path):
    with pooled_worker(pid_env, tmp_path, 2, TWO_JOBS) as (env, log, llm, worker):
        ready, job_id, done = _two_jobs(run_pid, env, tmp_path, log, ["--repo", str(sample_repo), "--model", "m",
                                        "--base-url", llm.base_url, "--check", "hostname"], 2)
        result = done.json()
        assert result["final_message"] == "second" and result["check"]["passed"], result
        transcript = (tmp_path / "out" / job_id / "session.jsonl").read_text()
        assert any(one[:12] in transcript for one in ready)   # the job's own was a pooled one...
        assert not any(one[:12] in result["check"]["output_tail"] for one in ready)   # ...its check's was not
        # the check's class (its image by id) is none of the pool's: both ready ones are the job's class
        _wait("the pool refilled with the job's class alone",
              lambda: f"warm pool: {IMAGE} 2 ready" in (shown := run_pid("workers", env=env).stdout)
              and "sha256:" not in shown, log, timeout=60)
    assert pool_containers() == [], log.read_text()[-3000:]


def test_cancel_removes_a_running_jobs_pooled_container(run_pid, pid_env, sample_repo, tmp_path):
    script = [{"text": "warm"}, {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 300"}}]}]
    with pooled_worker(pid_env, tmp_path, 1, script) as (env, log, llm, worker):
        submit = ["--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url]
        assert run_pid("submit", "t", *submit, "--wait", env=env).code == 0, log.read_text()
        ready = _wait_ready(run_pid, env, log, 1)
        job_id = run_pid("submit", "t", *submit, env=env).stdout.strip()
        _wait("the job's tool call", lambda: "running bash" in run_pid("status", job_id, env=env).stdout, log)
        client = docker.from_env()
        assert client.api.inspect_container(ready[0])["Name"] == "/" + taken_name(job_id, 1)
        assert run_pid("cancel", job_id, env=env).code == 0
        _wait("the job cancelled", lambda: "cancelled" in run_pid("status", job_id, env=env).stdout, log)
        _wait("its container removed", lambda: ready[0] not in {c.id for c in pid_containers()}, log)
    assert pool_containers() == [], log.read_text()[-3000:]


@pytest.mark.parametrize("reaper", ["pid reap", "the next worker"])
def test_a_sigkilled_workers_pool_is_removed_by_the_next_reap(run_pid, pid_env, sample_repo, tmp_path, reaper):
    with pooled_worker(pid_env, tmp_path, 2, [{"text": "warm"}]) as (env, log, llm, worker):
        done = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url,
                       "--wait", env=env)
        assert done.code == 0, done.stderr + log.read_text()
        _wait("two ready sandboxes", lambda: len(_ready_ids()) >= 2, log)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    assert len(pool_containers()) >= 2   # nothing removed them: their worker had no chance
    disks = Path(env["PID_HOME"]) / "disks"
    assert any(disks.iterdir())          # nor their disks
    if reaper == "pid reap":
        reaped = run_pid("reap", env=env)
        assert reaped.code == 0, reaped.stderr
    else:   # its first housekeeping pass reaps
        later = start_worker(pid_env, tmp_path, tmp_path / "w2.log")
        try:
            _wait("the next worker's reap", lambda: pool_containers() == [] and not any(disks.iterdir()),
                  tmp_path / "w2.log", timeout=60)
        finally:
            stop_worker(later)
    assert pool_containers() == []
    assert not any(disks.iterdir())   # their disks (unmounted, removed) went with them


def test_the_sweep_of_a_sigkilled_pool_workers_job_takes_the_pool_along_with_its_disks(run_pid, pid_env, sample_repo,
                                                                                       tmp_path):
    """An operator's test: the first `pid list` after a pool worker's SIGKILL swept its running job, and with the job's
    disk every disk whose lock had died, the pool's too; the pool's ready containers ran on, on deleted disks, until
    a reap or their expiry. They go together now."""
    script = [{"text": "warm"}, {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 120"}}]},
              {"text": "never"}]
    with pooled_worker(pid_env, tmp_path, 2, script) as (env, log, llm, worker):
        model = ["--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url]
        assert run_pid("submit", "warm", *model, "--wait", env=env).code == 0, log.read_text()
        _wait("two ready sandboxes", lambda: len(_ready_ids()) >= 2, log)
        job_id = run_pid("submit", "t", *model, env=env).stdout.strip()
        _wait("the job's command", lambda: "sleep 120" in run_pid("status", job_id, env=env).stdout, log)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    listed = run_pid("list", env=env)   # (its sweep finds the job's process gone)
    assert listed.code == 0 and job_id in listed.stdout, listed.stderr
    disks = Path(env["PID_HOME"]) / "disks"
    _wait("the pool's containers and every disk", lambda: pool_containers() == [] and not any(disks.iterdir()), log,
          timeout=30)
