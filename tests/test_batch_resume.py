"""A batch's --out is its memory: the same command resumes it, and nothing else is merged into it. Another tasks
file, other options, or a submitted item's line edited or removed, is refused (exit 2) with how to resume and the
way out (another directory). Real CLI; the jobs wait in a queue no worker consumes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli import assert_one_error

pytestmark = [pytest.mark.docker, pytest.mark.cli]   # --detach submits (the embedded queue checks the image)


def write_tasks(path: Path, repo: Path, ids: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "task": f"task {i}", "repo": str(repo)}) + "\n" for i in ids))
    return path


def test_another_tasks_file_or_other_options_are_refused_and_the_same_command_resumes(run_pid, pid_env, sample_repo,
                                                                                      tmp_path):
    out = tmp_path / "out"
    tasks = write_tasks(tmp_path / "tasks.jsonl", sample_repo, ["a", "b"])
    common = ["--out", str(out), "--base-url", "http://127.0.0.1:9/v1", "--queue", "nobody-consumes-this",
              "--detach"]
    first = run_pid("batch", str(tasks), "--model", "m1", *common)
    assert first.code == 0, first.stderr
    jobs = len(run_pid("list", "--json", "--limit", "100").json())
    meta = json.loads((out / "batch.json").read_text())

    other = write_tasks(tmp_path / "other.jsonl", sample_repo, ["c"])
    line = assert_one_error(run_pid("batch", str(other), "--model", "m1", *common), "another tasks file",
                            str(tasks), "another --out directory")
    assert f"pid batch {tasks} --out {out}" in line
    line = assert_one_error(run_pid("batch", str(tasks), "--model", "m2", *common), "other options", "--model",
                            "another --out directory")
    assert "--base-url" not in line
    assert '--model (or $PID_MODEL) was "m1", now "m2"' in line   # (which to give back to resume, and where from)
    piped = subprocess.run([sys.executable, "-m", "pid.cli.main", "batch", "-", "--model", "m1", *common],
                           input=other.read_text(), cwd=tmp_path, env=pid_env, capture_output=True, text=True,
                           timeout=120)
    assert piped.returncode == 2 and "another tasks file" in piped.stderr, piped.stderr
    assert len(run_pid("list", "--json", "--limit", "100").json()) == jobs   # nothing more was submitted
    assert json.loads((out / "batch.json").read_text())["order"] == meta["order"] == ["a", "b"]

    # a line edited or removed since its item was submitted: the batch's result would no longer be the file's
    tasks.write_text(json.dumps({"id": "a", "task": "task a, edited", "repo": str(sample_repo)}) + "\n")
    line = assert_one_error(run_pid("batch", str(tasks), "--model", "m1", *common), "tasks file changed",
                            "a (edited), b (removed)", "another --out directory")
    assert len(run_pid("list", "--json", "--limit", "100").json()) == jobs   # nothing more was submitted

    write_tasks(tasks, sample_repo, ["a", "b", "d"])   # the same file, one item added: the same batch, resumed
    again = run_pid("batch", str(tasks), "--model", "m1", *common)
    assert again.code == 0, again.stderr
    assert json.loads((out / "batch.json").read_text())["order"] == ["a", "b", "d"]
    assert len(run_pid("list", "--json", "--limit", "100").json()) == jobs + 1   # only the new item

    # a cancelled item (no row: nothing followed it) runs again, so its line may change
    ledger = [json.loads(line) for line in (out / "jobs.jsonl").read_text().splitlines()]
    assert run_pid("cancel", [e["job_id"] for e in ledger if e["id"] == "a"][-1]).code == 0
    tasks.write_text(json.dumps({"id": "a", "task": "task a, edited", "repo": str(sample_repo)}) + "\n"
                     + "".join(json.dumps({"id": i, "task": f"task {i}", "repo": str(sample_repo)}) + "\n"
                               for i in ("b", "d")))
    edited = run_pid("batch", str(tasks), "--model", "m1", *common)
    assert edited.code == 0, edited.stderr   # (accepted: its cancelled job's row is written, then it goes again)


def test_batch_status_says_each_running_item_s_turn_once(run_pid, pid_env, sample_repo, tmp_path):
    import time
    from tests.conftest import start_worker, stop_worker
    from tests.scripted_llm import ScriptedLLM
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 30"}}]}, {"text": "done"}]
    with ScriptedLLM(script) as llm:
        worker = start_worker(pid_env, tmp_path, tmp_path / "worker.log")
        try:
            tasks = write_tasks(tmp_path / "tasks.jsonl", sample_repo, ["slow"])
            out = tmp_path / "out"
            assert run_pid("batch", str(tasks), "--out", str(out), "--model", "scripted", "--base-url",
                           llm.base_url, "--detach").code == 0
            deadline = time.time() + 60
            while "running bash sleep 30" not in (shown := run_pid("batch", "--status", str(out)).stdout):
                assert time.time() < deadline, shown
                time.sleep(0.3)
        finally:
            stop_worker(worker)
    line = next(line for line in shown.splitlines() if "slow" in line)
    assert line.split()[0] == "slow", line
    # ITEM JOB STATUS TURNS COST DETAIL: the turn once, in its column (the activity's own "turn 1:" dropped)
    assert line.split()[2:] == ["running", "1", "$0", "running", "bash", "sleep", "30"] and "turn" not in line, line


def test_every_line_whose_image_is_missing_is_told_with_its_number(run_pid, pid_env, sample_repo, tmp_path):
    """With the embedded queue (a worker on this machine) each line naming an image the engine lacks is a bad line:
    all of them, by number (only the first image was told, without a line, and only once every other line was
    good: a new-user test's). Through the API that is BadTasks, with its lines."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(line) + "\n" for line in [
        {"id": "a", "task": "t", "repo": str(sample_repo), "image": "pid-test-nope:1"},
        {"id": "b", "task": "t", "repo": str(sample_repo), "image": "pid-test-nope:2"},
        {"id": "c", "task": "t", "repo": str(sample_repo)}]))
    res = run_pid("batch", str(tasks), "--out", str(tmp_path / "out"), "--model", "m", "--base-url",
                  "http://127.0.0.1:9/v1", "--detach")
    assert res.code == 2, res.stderr
    assert "line 1: sandbox image 'pid-test-nope:1' not found" in res.stderr, res.stderr
    assert "line 2: sandbox image 'pid-test-nope:2' not found" in res.stderr and "line 3" not in res.stderr
    import pid
    from pid.jobs.batch_setup import BadTasks
    with pytest.MonkeyPatch.context() as env:
        for name, value in pid_env.items():
            env.setenv(name, value)
        with pytest.raises(BadTasks) as raised:
            pid.submit_batch(tasks, tmp_path / "out2", model="m", base_url="http://127.0.0.1:9/v1")
    assert [line.split(":", 1)[0] for line in raised.value.lines] == ["line 1", "line 2"]
    # options that cannot be together are a bad line too, as on the command line
    tasks.write_text(json.dumps({"id": "d", "task": "t", "workdir": "/testbed", "disk": "0"}) + "\n")
    clash = run_pid("batch", str(tasks), "--out", str(tmp_path / "out3"), "--model", "m", "--base-url",
                    "http://127.0.0.1:9/v1", "--detach")
    assert clash.code == 2 and "line 1: --workdir needs the job's own disk" in clash.stderr, clash.stderr
    # a line bad otherwise is told together with a missing image, not in a second round once it is mended (a new
    # user's)
    tasks.write_text("{not json\n" + json.dumps({"id": "e", "task": "t", "image": "pid-test-nope:1",
                                                  "repo": str(sample_repo)}) + "\n")
    both = run_pid("batch", str(tasks), "--out", str(tmp_path / "out4"), "--model", "m", "--base-url",
                   "http://127.0.0.1:9/v1", "--detach")
    assert both.code == 2 and "line 1: not JSON" in both.stderr, both.stderr
    assert "line 2: sandbox image 'pid-test-nope:1' not found" in both.stderr, both.stderr


def test_a_batch_directory_from_elsewhere_is_not_resumed(run_pid, pid_env, sample_repo, tmp_path):
    """A hostile-repository test's: a tasks directory that carried its own `pid-batch/` (batch.json, a batch.jsonl
    row saying item `a` completed with its check passed) made `pid batch … --out pid-batch` print "nothing to do",
    100 % passed, exit 0, with nothing run; links among its files sent the ledger and the worker's log elsewhere."""
    from datetime import datetime, timezone
    tasks = write_tasks(tmp_path / "tasks.jsonl", sample_repo, ["a"])
    out = tmp_path / "pid-batch"
    out.mkdir()
    (out / "batch.json").write_text(json.dumps({"batch": "b-fake", "tasks": str(tasks)}))
    forged = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + "abcdef"
    (out / "batch.jsonl").write_text(json.dumps({"id": "a", "job_id": forged, "status": "completed", "exit_code": 0,
                                                 "check": {"passed": True}, "check_asked": True}) + "\n")
    common = ["--out", str(out), "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--queue",
              "nobody-consumes-this", "--detach"]
    assert_one_error(run_pid("batch", str(tasks), *common), "its results name jobs this job store never had", "(a)")
    (out / "batch.jsonl").unlink()
    (out / "jobs.jsonl").symlink_to(tmp_path / "victim")
    assert_one_error(run_pid("batch", str(tasks), *common), "holds a symbolic link (jobs.jsonl)")
    assert not (tmp_path / "victim").exists()
