"""`pid batch`'s tasks file checked as `pid submit` checks its options (the real CLI; no engine needed: every case
here is refused before anything is packed or submitted), and what the command prints about a batch it did not
follow to its end (`--status DIR`, the resume line after Ctrl-C)."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from pid.cli.batch_run import count, without_secrets
from pid.cli.batch_progress import Progress
from pid.jobs.batch import BatchDir


@pytest.mark.cli
def test_a_line_is_refused_as_submit_would_refuse_its_options_and_accepted_as_submit_would_accept_them(
        run_pid, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    lines = [
        {"task": "t", "repo": str(repo), "max_turns": 3.5},                  # 1: never truncated to 3
        {"task": "t", "repo": str(repo), "max_turns": 3.0},                  # 2: a whole number
        {"task": "t", "repo": str(repo), "check": "  "},                     # 3: submit says the check is empty
        {"task": "t", "repo": str(repo), "no_images": "yes"},                # 4: a flag is a JSON boolean
        {"task": "t", "repo": str(repo), "no-images": True, "images": False},  # 5: --no-images, or the field
        {"task": "t", "repo": str(repo), "max_cost": 1},                     # 6: gpt-4o-mini: the table's prices
        {"task": "t", "repo": str(repo), "max_cost": 1, "model": "my-local-model"},  # 7: no prices anywhere
        {"task": "t" * ((1 << 20) + 1), "repo": str(repo)},                 # 8: a task a result could not carry
    ]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(line) + "\n" for line in lines))
    r = run_pid("batch", str(tasks), "--out", str(tmp_path / "out"), "--model", "gpt-4o-mini",
                "--base-url", "http://127.0.0.1:9/v1", "--max-total-cost", "5")
    assert r.code == 2 and "Traceback" not in r.stderr, r.stderr
    assert "line 1: max_turns: 3.5 is not a whole number" in r.stderr
    assert "line 3: check: the check command is empty" in r.stderr
    assert "line 4: no_images: must be true or false" in r.stderr
    assert "line 7: max_cost needs the model's prices" in r.stderr
    assert "line 8: its task is larger than 1 MiB (1,048,577 bytes)" in r.stderr
    for number in (2, 5, 6):
        assert f"line {number}:" not in r.stderr, r.stderr
    assert "5 bad line(s)" in r.stderr and not (tmp_path / "out").exists()


@pytest.mark.cli
def test_a_models_file_that_is_missing_refuses_the_batch_as_it_refuses_submit(run_pid, pid_env, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"task": "t", "repo": str(repo)}) + "\n")
    missing = tmp_path / "nonexistent.json"
    for command in (["batch", str(tasks), "--out", str(tmp_path / "out")], ["submit", "t", "--repo", str(repo)]):
        r = run_pid(*command, "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
                    env={**pid_env, "PID_MODELS": str(missing)})
        assert r.code == 2 and r.stderr.startswith("pid: error: PID_MODELS=") and str(missing) in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "out").exists()


def test_status_counts_an_ended_job_no_run_has_downloaded_yet_by_its_status(tmp_path: Path):
    """`pid batch --status DIR` of a detached batch whose jobs ended: not 'not submitted'."""
    bdir = BatchDir.create(str(tmp_path / "b"), {})
    bdir.set_order(["a", "b", "c", "d"], {})
    bdir.record_jobs([("a", "job-a"), ("b", "job-b"), ("c", "job-c")])
    bdir.rows["c"] = {"id": "c", "job_id": "job-old", "status": "failed", "cost": 1.0}   # an earlier run's row

    def record(status: str, cost: float) -> SimpleNamespace:
        return SimpleNamespace(status=status, terminal=status not in ("queued", "running"),
                               total_usage={"cost": cost}, turns=1, activity=None)

    records = {"job-a": record("completed", 0.5), "job-b": record("running", 0.25), "job-c": record("limit", 0.125)}
    progress = Progress(total=4)
    count(progress, bdir, records, {"job-b": "b"})   # --status follows none: only the live ones are "tracked"
    assert progress.counts == {"completed": 1, "running": 1, "limit": 1, "not submitted": 1}
    assert progress.cost == 0.875


def test_the_resume_line_never_shows_the_api_key():
    assert without_secrets(["t.jsonl", "--api-key", "sk-secret", "--out", "o", "--api-key=sk-2", "--model", "m"]) \
        == ["t.jsonl", "--api-key", "KEY", "--out", "o", "--api-key=KEY", "--model", "m"]


def test_continue_and_retry_of_a_batch_item_default_their_out_to_pid_runs_not_the_batchs_scratch(tmp_path, monkeypatch):
    from pid.jobs.requeue import out_dir
    said: list[str] = []

    def _out_dir(given, earlier):
        return out_dir(given, earlier, said.append)
    batch = BatchDir.create(str(tmp_path / "b"), {})
    monkeypatch.chdir(tmp_path)
    assert _out_dir(None, batch.jobs_dir) == str(tmp_path / "pid-runs")
    assert _out_dir(None, batch.jobs_dir + "/") == str(tmp_path / "pid-runs")
    (tmp_path / "mine").mkdir()
    assert _out_dir(None, str(tmp_path / "mine")) == str(tmp_path / "mine")   # any other: the earlier job's
    assert said == []   # (a batch's scratch is never an item's artifacts directory: nothing to say)
    assert _out_dir(None, str(tmp_path / "no" / "such")) == str(tmp_path / "pid-runs")
    assert said[-1] == (f"the earlier job's artifacts directory is of no use here ({tmp_path / 'no' / 'such'}: its "
                        f"parent directory {tmp_path / 'no'} does not exist): this job's go to {tmp_path / 'pid-runs'}")


@pytest.mark.cli
def test_a_byte_order_mark_and_crlf_line_ends_are_not_part_of_the_lines(run_pid, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    good = json.dumps({"task": "t", "repo": str(repo)})
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"\xef\xbb\xbf" + good.encode() + b"\r\n" + good.encode() + b"\r\n{bad\r\n")
    r = run_pid("batch", str(tasks), "--out", str(tmp_path / "out"), "--model", "m", "--base-url", "http://x/v1")
    assert r.code == 2 and "line 3: not JSON" in r.stderr, r.stderr
    assert "line 1:" not in r.stderr and "line 2:" not in r.stderr and "1 bad line(s)" in r.stderr


@pytest.mark.cli
def test_a_tasks_file_not_utf8_is_refused_with_its_line(run_pid, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b'\xef\xbb\xbf{"task": "t"}\n{"task": "caf\xe9"}\n')   # (a byte order mark, then Latin-1)
    r = run_pid("batch", str(tasks), "--out", str(tmp_path / "out"), "--model", "m", "--base-url", "http://x/v1")
    assert r.code == 2 and f"cannot read {tasks}: line 2: not UTF-8 (byte 0xe9" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.cli
def test_help_names_what_repo_and_out_take(run_pid):
    for command in ("run", "submit", "batch"):
        text = run_pid(command, "--help").stdout
        assert "--repo DIR|URL" in text and "--out DIR" in text and "--out TEXT" not in text, command
    for command in ("continue", "retry"):
        assert "--out DIR" in run_pid(command, "--help").stdout


@pytest.mark.docker
@pytest.mark.cli
def test_ctrl_c_on_wait_dir_names_the_command_that_resubmits_the_cancelled_items(run_pid, pid_env, tmp_path):
    """`pid batch --wait DIR` cannot submit again what its Ctrl-C cancelled: the resume line is the batch's own
    command (its tasks file and DIR), not `--wait DIR` (which would only summarize the cancelled items)."""
    import signal
    import subprocess
    import sys
    import time
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "one", "task": "t", "repo": str(repo)}) + "\n")
    out = tmp_path / "out"
    r = run_pid("batch", str(tasks), "--out", str(out), "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
                "--detach")   # no worker: the job stays queued
    assert r.code == 0, r.stderr
    proc = subprocess.Popen([sys.executable, "-m", "pid.cli.main", "batch", "--wait", str(out)], cwd=tmp_path,
                            env=pid_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert f"resume with: pid batch {tasks} --out {out} and the options that submitted it" in stderr, stderr
    assert json.loads(run_pid("batch", "--status", str(out), "--json").stdout)["counts"] == {"cancelled": 1}


def test_a_rerun_with_nothing_to_do_tells_a_failed_check_apart_from_a_failed_job():
    from pid.jobs.batch_run import nothing_to_do
    done = {"status": "completed", "exit_code": 0}
    check_failed = {"status": "completed", "exit_code": 4}   # (the agent completed; the check failed the patch)
    limit = {"status": "limit", "exit_code": 3}
    assert nothing_to_do([done, done]) == "nothing to do: skipped 2 completed"
    assert nothing_to_do([done, check_failed, limit, limit]) == (
        "nothing to do: skipped 1 completed, 1 completed whose check failed, 2 failed or hit a limit "
        "(--retry-failed runs them again)")
    assert nothing_to_do([check_failed]) == (
        "nothing to do: skipped 1 completed whose check failed (--retry-failed runs them again)")


def test_the_check_pass_rate_counts_items_whose_check_never_ran_as_not_passed():
    """A SWE-bench-style batch's pass rate is its resolved rate: an item that asked for a check and hit a limit or an
    error before it (no verdict) did not pass; one that asked for none is not counted."""
    from pid.cli.batch_progress import summary_text
    from pid.jobs.batch import row_for, summarize

    def ended(status: str, reason: str, check: dict | None = None) -> dict:
        return {"status": status, "exit_reason": reason, "usage": {}, "turns": 1, **({"check": check} if check else {})}
    rows = [row_for("fixed", "j1", ended("completed", "stop", {"passed": True, "exit_code": 0}), True),
            row_for("wrong", "j2", ended("completed", "stop", {"passed": False, "exit_code": 1}), True),
            row_for("slow", "j3", ended("limit", "wall_clock"), True),
            row_for("broken", "j4", ended("failed", "provider_error"), True),
            row_for("unchecked", "j5", ended("completed", "stop"), False)]
    summary = summarize(rows, items=5)
    assert summary["check"] == {"asked": 4, "checked": 2, "passed": 1, "pass_rate": 0.25}
    said = summary_text(summary, ".")
    assert "check: 1/4 passed (25%), 2 of them never checked (their jobs did not complete)" in said, said
    # a batch.jsonl of an older pid (no check_asked): its verdicts alone, as before
    old = [{k: v for k, v in row.items() if k != "check_asked"} for row in rows]
    assert summarize(old, items=5)["check"] == {"asked": 2, "checked": 2, "passed": 1, "pass_rate": 0.5}


def test_a_hostile_tasks_file_is_read_within_bounds_and_its_bad_lines_reported(tmp_path, monkeypatch):
    """/dev/zero as a tasks file took 7.3 GB in 20 s, a 300 MB line 1.2 GB, and a line of deeply nested JSON ended
    the command with a traceback (an attack review's): each is now a bounded read and one line of error."""
    import pid.jobs.batch_setup as batch_setup
    from pid.errors import PidError
    monkeypatch.setattr(batch_setup, "TASKS_LINE_MAX", 1 << 20)
    monkeypatch.setattr(batch_setup, "TASKS_FILE_MAX", 4 << 20)
    with pytest.raises(PidError, match=r"cannot read /dev/zero: larger than 4 MiB: split it"):
        batch_setup.read_items("/dev/zero", allow_outside=False)
    tasks = tmp_path / "tasks.jsonl"
    good = json.dumps({"id": "ok", "task": "t"})
    exact = json.dumps({"id": "exact", "task": ""})
    exact = exact[:-2] + "y" * ((1 << 20) - len(exact)) + exact[-2:]   # (a line of exactly the limit: it is read)
    tasks.write_text("\n".join([good, json.dumps({"id": "big", "task": "x" * (1 << 20)}), "[" * 100_000 + "]" * 100_000,
                                json.dumps({"id": "last", "task": "t"}), exact]) + "\n")
    items, errors = batch_setup.read_items(str(tasks), allow_outside=False)
    assert [item.id for item in items] == ["ok", "last", "exact"] and len(exact.encode()) == 1 << 20
    assert sorted(errors) == ["line 2: longer than 1 MiB (a task is at most 1 MiB)",
                              "line 3: not JSON pid reads (nested too deeply)"], errors


def test_a_tasks_file_of_bad_lines_is_told_in_bounded_memory_and_a_path_must_be_a_string(tmp_path):
    """A hostile-tasks test's: one error kept per bad line took ~100 bytes of memory per byte of the file (3 GB for a
    30 MB file of `1`s); and a system_prompt given as a number skipped the tasks directory's bound (`42`, read from
    the current directory)."""
    import pid.jobs.batch_setup as batch_setup
    from pid.cli.batch_tasks import MAX_BAD_LINES
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("1\n" * (MAX_BAD_LINES * 5) + json.dumps({"id": "x", "task": "t", "system_prompt": 42}) + "\n")
    items, errors = batch_setup.read_items(str(tasks), allow_outside=False)
    assert items == [] and len(errors) == MAX_BAD_LINES + 1
    assert errors[-1] == f"line {MAX_BAD_LINES + 1} on: not read ({MAX_BAD_LINES} bad lines already)"
    tasks.write_text(json.dumps({"id": "x", "task": "t", "system_prompt": 42}) + "\n")
    items, errors = batch_setup.read_items(str(tasks), allow_outside=False)
    assert errors == ["line 1: system_prompt: must be a path (a string)"], errors


def test_a_prompt_file_that_is_a_fifo_no_one_writes_is_refused_in_time(tmp_path, monkeypatch):
    """`--system-prompt` (or a tasks line's system_prompt) naming a FIFO hung the command for good; a pipe that does
    send its text (`<(…)`) is still read."""
    import click
    from pid.cli import options
    monkeypatch.setattr(options, "PROMPT_READ_S", 0.5)
    fifo = tmp_path / "prompt.fifo"
    os.mkfifo(fifo)
    with pytest.raises(click.BadParameter, match="it sent nothing for 0.5 s"):
        options.PromptFile().convert(str(fifo), None, None)
    def write() -> None:   # as `<(…)`'s writer: it opens the FIFO (waiting for the reader), writes, and ends
        with open(fifo, "wb") as f:
            f.write(b"be brief\n")
    writer = threading.Thread(target=write)
    writer.start()
    assert options.PromptFile().convert(str(fifo), None, None) == "be brief\n"
    writer.join()


def test_batch_status_says_each_ended_items_check(tmp_path):
    """`pid batch --status` showed an item whose check failed as `completed … stop`, as one that passed."""
    from pid.cli.batch_control import item_lines
    from pid.jobs.batch import row_for
    from pid.jobs.batch_control import item_rows
    bdir = BatchDir.create(str(tmp_path / "out"), {})
    names = ["good", "bad", "slow", "plain"]
    bdir.set_order(names, {})
    bdir.record_jobs([(name, f"job-{name}") for name in names])
    ended = [("completed", "stop", {"passed": True}), ("completed", "stop", {"passed": False}),
             ("limit", "wall_clock", None), ("completed", "stop", None)]
    for name, (status, reason, check) in zip(names, ended):
        result = {"status": status, "exit_reason": reason, **({"check": check} if check else {})}
        bdir.rows[name] = row_for(name, f"job-{name}", result, check_asked=name != "plain")
    rows = item_rows(bdir, {})
    assert [(r["detail"], r["check"]) for r in rows] == [
        ("stop, check passed", "passed"), ("stop, check failed", "failed"), ("wall_clock, check not run", "not run"),
        ("stop", None)]
    assert "stop, check failed" in "\n".join(item_lines(bdir, {}, 120))
