"""Values that used to slip through the up-front check: more CPUs than the engine has, a broker URL no transport
serves. Each is one line and exit 2 before anything is recorded or started (no job, no container)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pid.sandbox.config import LABEL_OWNER
from pid.sandbox.reaper import owner_label
from tests.conftest import pid_containers
from tests.test_cli import LOCAL, assert_one_error
from pid.jobs.spec import JobSpec
from pid.jobs.sqlite_store import JobStore

pytestmark = pytest.mark.cli


def no_job(run_pid) -> None:
    listed = run_pid("list", "--json")
    assert listed.code == 0 and json.loads(listed.stdout) == [], listed.stdout


@pytest.mark.docker   # the engine says how many CPUs it has
@pytest.mark.parametrize("command", ["run", "submit"])
def test_more_cpus_than_the_engine_has_is_one_line_and_nothing_starts(run_pid, pid_env, sample_repo: Path,
                                                                     tmp_path: Path, command):
    res = run_pid(command, "t", "--repo", str(sample_repo), "--model", "m", "--base-url", LOCAL,
                  "--out", str(tmp_path / "out"), "--cpus", "4096")
    assert_one_error(res, "--cpus 4096", "the Docker engine has only")
    no_job(run_pid)
    assert not (tmp_path / "out").exists()
    mine = owner_label(pid_env["PID_HOME"])   # (the engine is shared: only this installation's containers count)
    assert not [c for c in pid_containers() if c.labels.get(LABEL_OWNER) == mine]


@pytest.mark.docker   # the engine says how many CPUs it has
def test_a_batch_item_asking_more_cpus_than_the_engine_has_is_named(run_pid, sample_repo: Path, tmp_path: Path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "small", "task": "t", "repo": str(sample_repo)}) + "\n" +
                     json.dumps({"id": "greedy", "task": "t", "repo": str(sample_repo), "cpus": 4096}) + "\n")
    res = run_pid("batch", str(tasks), "--out", str(tmp_path / "out"), "--model", "m", "--base-url", LOCAL)
    assert_one_error(res, "item greedy: --cpus 4096", "the Docker engine has only", "nothing was submitted")
    no_job(run_pid)


@pytest.mark.parametrize("args", [("submit", "t", "--model", "m", "--base-url", LOCAL), ("worker",),
                                  ("retry", "20261201-000000-abcdef")], ids=["submit", "worker", "retry"])
def test_a_broker_url_no_transport_serves_is_one_line_and_nothing_is_queued(run_pid, pid_env, sample_repo: Path,
                                                                           args):
    repo = ("--repo", str(sample_repo)) if args[0] == "submit" else ()
    before = []
    if args[0] == "retry":   # a job that exists: an id that names none is refused first, for that
        job = JobStore(os.path.join(pid_env["PID_HOME"], "jobs.db")).create(JobSpec(task="t", model="m"))
        args, before = ("retry", job.id), [job.id]
    env = {**pid_env, "PID_BROKER_URL": "bogus://user:hunter2@host/0"}
    line = assert_one_error(run_pid(*args, *repo, env=env), "PID_BROKER_URL=bogus://user:***@host/0",
                            "not a broker pid knows")
    assert "hunter2" not in line
    listed = run_pid("list", "--json")
    assert listed.code == 0 and [j["id"] for j in json.loads(listed.stdout)] == before, listed.stdout


def test_a_batch_with_a_broker_url_no_transport_serves_is_refused(run_pid, pid_env, sample_repo: Path,
                                                                  tmp_path: Path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"task": "t", "repo": str(sample_repo)}) + "\n")
    res = run_pid("batch", str(tasks), "--out", str(tmp_path / "out"), "--model", "m", "--base-url", LOCAL,
                  env={**pid_env, "PID_BROKER_URL": "bogus://host/0"})
    assert_one_error(res, "not a broker pid knows")
    no_job(run_pid)
