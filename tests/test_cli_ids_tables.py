"""The real CLI (issue 22): `pid list`, `pid workers` and `pid batch --status` at 80 columns keep their columns
aligned and their ids distinct, small costs read as numbers; a job is reached by any unique end of its id, by `last`
and by BATCHDIR/ITEM; `pid list --batch DIR`; `pid batch --cancel DIR`; a rerun with nothing to do says so. A real
batch (its own worker, Docker, a scripted model server), real `pid worker` processes."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import start_worker, stop_worker
from tests.scripted_llm import ScriptedLLM
from pid.jobs.spec import JobSpec
from pid.jobs.sqlite_store import JobStore

pytestmark = [pytest.mark.docker, pytest.mark.cli]   # the batch runs in containers; submit checks the image

ITEMS = ("fix-parser", "fix-lexer", "docs")
# a long task: its column is the one that gives way first
TASK = "fix the failing test in the parser module and explain what was wrong in one short paragraph"


def table(text: str, header: list[str]) -> tuple[list[str], list[dict[str, str]]]:
    """The lines of a table whose first line is `header`'s names, and its rows (cells are single-spaced, columns
    at least two spaces apart); the table ends at a blank or indented line."""
    lines = text.rstrip("\n").splitlines()
    start = next(i for i, line in enumerate(lines) if line.split() == header)
    rows = []
    for line in lines[start + 1:]:
        if not line.strip() or line.startswith("  "):
            break
        cells = re.split(r" {2,}", line.strip())
        assert len(cells) == len(header), line
        rows.append(dict(zip(header, cells)))
    return lines[start:start + 1 + len(rows)], rows


def assert_aligned(lines: list[str], header: list[str], right: set[str]) -> None:
    """Left-aligned columns start where their header starts, right-aligned ones end where it ends; 80 columns."""
    head = lines[0]
    edges = {m.group(): (m.start(), m.end()) for m in re.finditer(r"\S+", head)}
    assert list(edges) == header, head
    for line in lines[1:]:
        assert len(line) <= 80, line
        for name in header:
            left, end = edges[name]
            if name in right:
                assert line[end - 1] != " " and (end == len(line) or line[end] == " "), (name, line, head)
            else:
                assert line[left] != " " and (left == 0 or line[left - 1] == " "), (name, line, head)


def test_tables_at_80_columns_ids_by_their_end_and_batch_control(run_pid, pid_env, sample_repo, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": i, "task": TASK, "repo": "repo"}) + "\n" for i in ITEMS))
    out = tmp_path / "out"
    turns = [{"text": "done", "usage": {"prompt_tokens": 400, "completion_tokens": 10}} for _ in ITEMS]
    with ScriptedLLM(turns) as llm:
        cmd = ["batch", str(tasks), "--out", str(out), "--model", "scripted", "--base-url", llm.base_url,
               "--disk", "0", "--input-price", "1", "--workers", "2"]
        done = run_pid(*cmd)
        assert done.code == 0, done.stderr
        again = run_pid(*cmd)
    assert again.code == 0, again.stderr
    assert "nothing to do: skipped 3 completed" in again.stderr, again.stderr
    job_ids = {i: json.loads((out / i / "result.json").read_text())["id"] for i in ITEMS}

    # jobs besides the batch's, with ids that share their ends (`pid submit` with no worker: they stay queued)
    store = JobStore(str(Path(pid_env["PID_HOME"]) / "jobs.db"))
    twins = ["20261201-000000-7a7a7a", "20261201-000001-8a7a7a"]
    for job_id in twins:
        store.create(JobSpec(id=job_id, task="a twin", repo=str(sample_repo), model="m", out_dir=str(tmp_path),
                             base_url="http://127.0.0.1:9/v1"))
    env80 = {**pid_env, "COLUMNS": "80"}

    listed = run_pid("list", env=env80)
    assert listed.code == 0, listed.stderr
    header = ["ID", "STATUS", "TIME", "COST", "REASON", "TASK"]
    lines, rows = table(listed.stdout, header)
    assert_aligned(lines, header, right={"TIME", "COST"})
    assert len(rows) == 5 and len({r["ID"] for r in rows}) == 5
    for job_id in [*job_ids.values(), *twins]:   # each shown by its end, as people type it
        assert sum(job_id.endswith(r["ID"].lstrip("…")) for r in rows) == 1, (job_id, listed.stdout)
    costs = [r["COST"] for r in rows if r["STATUS"] == "completed"]
    assert costs == ["$0.00040"] * 3, listed.stdout   # 400 tokens at $1 per million: not "$0.00"

    narrow = run_pid("list", env={**pid_env, "COLUMNS": "40"})   # too narrow for the ids: their ends stay apart
    shown = [line.split()[0] for line in narrow.stdout.splitlines()[1:]]
    assert len(set(shown)) == 5 and any(s.startswith("…") for s in shown), narrow.stdout

    batch_only = run_pid("list", "--batch", str(out), "--json").json()
    assert sorted(r["id"] for r in batch_only) == sorted(job_ids.values())
    assert all(job_ids[r["item"]] == r["id"] and r["current"] for r in batch_only), batch_only
    items_shown = run_pid("list", "--batch", str(out), env=env80).stdout.splitlines()
    assert items_shown[0].split()[:2] == ["ITEM", "ID"] and \
        sorted(line.split()[0] for line in items_shown[1:]) == sorted(ITEMS), items_shown
    cut = run_pid("list", "--batch", str(out), "--json", "--limit", "2")   # (more there: said on stderr)
    assert len(cut.json()) == 2 and "the newest 2 shown; more with --limit" in cut.stderr, cut.stderr
    assert "more with --limit" not in run_pid("list", "--limit", "100").stderr

    status = run_pid("batch", "--status", str(out), env=env80)
    assert status.code == 0, status.stderr
    header = ["ITEM", "JOB", "STATUS", "TURNS", "COST", "DETAIL"]
    lines, rows = table(status.stdout, header)
    assert_aligned(lines, header, right={"TURNS", "COST"})
    assert [r["ITEM"] for r in rows] == list(ITEMS)
    assert all(job_ids[r["ITEM"]].endswith(r["JOB"].lstrip("…")) and r["STATUS"] == "completed" for r in rows)

    # ids people can type
    suffix = job_ids["docs"][-6:]
    assert run_pid("status", suffix).stdout.startswith(job_ids["docs"] + "  completed")
    assert run_pid("status", f"{out}/fix-lexer").stdout.startswith(job_ids["fix-lexer"] + "  ")
    assert run_pid("result", f"{out}/fix-lexer", "--json").json()["id"] == job_ids["fix-lexer"]
    shown = run_pid("result", f"{out}/fix-lexer").stderr   # (its item's folder: the batch's spool is gone)
    assert [line for line in shown.splitlines() if line.startswith("artifacts: ")][0].endswith("/fix-lexer"), shown
    assert run_pid("status", "last").stdout.startswith(twins[-1] + "  queued")
    ambiguous = run_pid("cancel", "a7a7a")
    assert ambiguous.code == 2 and ambiguous.stderr.strip() == \
        f"pid: error: ambiguous job id a7a7a: it ends {twins[0]}, {twins[1]} (type more of it)"
    assert run_pid("cancel", "8a7a7a").stdout == f"{twins[1]}: cancelled\n"
    missing = run_pid("logs", "zzzzzz")
    assert missing.code == 2 and missing.stderr == \
        "pid: error: no such job: zzzzzz (a job's whole id, or its end: its last 4 characters or more)\n"
    short = run_pid("cancel", job_ids["docs"][-1:])   # (a new user's: `pid logs 1` took a job that ends in 1)
    assert short.code == 2 and short.stderr == (f"pid: error: no such job: {job_ids['docs'][-1]} (an id's end "
                                                "names a job from 4 characters on: `pid list` shows the ids)\n")


def test_workers_at_80_columns(run_pid, pid_env, tmp_path):
    procs = [start_worker({**pid_env, "PID_QUEUES": "idle-queue-with-a-long-name"}, tmp_path,
                          tmp_path / f"w{n}.log", concurrency=2) for n in range(2)]
    try:
        listed = run_pid("workers", env={**pid_env, "COLUMNS": "80"})
    finally:
        for proc in procs:
            stop_worker(proc)
    assert listed.code == 0, listed.stderr
    header = ["HOST", "PID", "NODE", "RUNNING", "QUEUES", "UP", "STATE"]
    lines, rows = table(listed.stdout, header)
    assert_aligned(lines, header, right={"PID", "RUNNING", "UP"})
    assert sorted(int(r["PID"]) for r in rows) == sorted(p.pid for p in procs)
    assert len({r["NODE"] for r in rows}) == 2 and all(r["RUNNING"] == "0/2" and r["STATE"] == "alive" for r in rows)


def test_batch_cancel_cancels_every_job_not_ended(run_pid, sample_repo, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": i, "task": "t", "repo": "repo"}) + "\n" for i in ITEMS))
    out = tmp_path / "out"
    detached = run_pid("batch", str(tasks), "--out", str(out), "--model", "m", "--base-url",
                       "http://127.0.0.1:9/v1", "--detach")   # no worker: the jobs stay queued
    assert detached.code == 0, detached.stderr
    cancelled = run_pid("batch", "--cancel", str(out))
    assert cancelled.code == 0, cancelled.stderr
    lines = cancelled.stdout.splitlines()
    assert sorted(line.split()[0] for line in lines[:-1]) == sorted(ITEMS)
    assert all(line.endswith(": cancelled") for line in lines[:-1]) and lines[-1].endswith("3 job(s) cancelled")
    assert json.loads(run_pid("batch", "--status", str(out), "--json").stdout)["counts"] == {"cancelled": 3}
    assert "nothing to cancel" in run_pid("batch", "--cancel", str(out)).stdout

