"""`pid batch`, for real: the CLI as a subprocess, its own local worker (--workers), Docker containers, and a
scripted model server that answers each request from the conversation it carries (which item, which turn).

The projects are three small real ones with a bug; the agent fixes it (or, for some items, forgets to); the check,
where this checkout has `--check`, is `python3 -m unittest`."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import start_worker, stop_worker
from tests.scripted_llm import ScriptedLLM
from pid.jobs.batch import batch_exit_code, percentile

CHECK = "python3 -m unittest -q"

PROJECTS = {
    "adder": ("calc.py", "def add(a, b):\n    return a - b\n", "a - b", "a + b",
              "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
              "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"),
    "multiplier": ("mul.py", "def mul(a, b):\n    return a + b\n", "a + b", "a * b",
                   "import unittest\nfrom mul import mul\n\n\nclass T(unittest.TestCase):\n"
                   "    def test_mul(self):\n        self.assertEqual(mul(3, 4), 12)\n"),
    "shout": ("shout.py", "def shout(s):\n    return s.lower()\n", "s.lower()", "s.upper()",
              "import unittest\nfrom shout import shout\n\n\nclass T(unittest.TestCase):\n"
              "    def test_shout(self):\n        self.assertEqual(shout('hi'), 'HI')\n"),
}
ITEM_RE = re.compile(r"\[item (\S+?)\]")


def make_projects(root: Path) -> dict[str, Path]:
    """Three small projects, each with a bug its unit test catches."""
    made = {}
    for name, (module, code, _, _, test) in PROJECTS.items():
        project = root / name
        project.mkdir(parents=True)
        (project / module).write_text(code)
        (project / f"test_{module}").write_text(test)
        made[name] = project
    return made


class Agentish:
    """The scripted model's answers, per conversation: turn 1 fixes the bug (or, for a 'forgetful' item, only
    looks), turn 2 runs the tests, turn 3 says done. Every request is logged with its item, its conversation
    (the id of the conversation's first tool call, which every later request carries) and its time."""

    def __init__(self, delay_s: float = 0.0, turns: int | None = None, usage: dict[str, int] | None = None) -> None:
        self.delay_s, self.turns, self.usage = delay_s, turns, usage
        self.log: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        first_user = next(m for m in messages if m["role"] == "user")
        text = first_user["content"] if isinstance(first_user["content"], str) else \
            " ".join(p.get("text", "") for p in first_user["content"])
        item = ITEM_RE.search(text).group(1)
        project = next(name for name in PROJECTS if f"project {name}" in text)
        calls = [c for m in messages if m["role"] == "assistant" for c in (m.get("tool_calls") or [])]
        turn = sum(1 for m in messages if m["role"] == "assistant")
        conversation = calls[0]["id"] if calls else f"conv-{uuid.uuid4().hex[:10]}"
        with self.lock:
            self.log.append({"item": item, "conversation": conversation, "turn": turn, "t": time.time()})
        answer: dict[str, Any] = {"delay_s": self.delay_s} if self.delay_s else {}
        if self.usage:
            answer["usage"] = self.usage
        if self.turns is not None:   # the budget's jobs: every turn a cheap command, never done by themselves
            if turn >= self.turns:
                return {**answer, "text": "done"}
            return {**answer, "tool_calls": [{"name": "bash", "arguments": {"command": "true"},
                                              "id": conversation if turn == 0 else f"c{turn}-{conversation}"}]}
        module, _, old, new, _ = PROJECTS[project]
        if turn == 0:
            forgetful = "forget" in text
            command = "ls" if forgetful else f"sed -i 's/{old}/{new}/' {module}"
            return {**answer, "tool_calls": [{"name": "bash", "arguments": {"command": command}, "id": conversation}]}
        if turn == 1:
            command = "python3 -m unittest -q || true"
            return {**answer, "tool_calls": [{"name": "bash", "arguments": {"command": command},
                                              "id": f"t-{conversation}"}]}
        return {**answer, "text": "Fixed."}

    def conversations(self) -> dict[str, list[tuple[float, float]]]:
        """item -> the (first, last) request times of each of its conversations."""
        spans: dict[tuple[str, str], list[float]] = {}
        for entry in self.log:
            spans.setdefault((entry["item"], entry["conversation"]), []).append(entry["t"])
        by_item: dict[str, list[tuple[float, float]]] = {}
        # a first request's conversation id is only known from its second request on: merge by the first turn
        for (item, _), times in spans.items():
            by_item.setdefault(item, []).append((min(times), max(times)))
        return by_item


def tasks_file(path: Path, projects: dict[str, Path], n: int, forget_every: int = 0) -> Path:
    names = list(projects)
    with open(path, "w") as f:
        for i in range(n):
            name = names[i % len(names)]
            forget = forget_every and i % forget_every == forget_every - 1
            f.write(json.dumps({"id": f"item-{i}", "repo": str(projects[name]),
                                "task": f"Fix the failing test of project {name} [item item-{i}]"
                                        + (" (forget)" if forget else "")}) + "\n")
    return path


def batch_cmd(tasks: Path, out: Path, llm: ScriptedLLM, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pid.cli.main", "batch", str(tasks), "--out", str(out), "--model", "scripted",
            "--base-url", llm.base_url, "--disk", "0", *extra]


def rows(out: Path) -> dict[str, dict[str, Any]]:
    path = out / "batch.jsonl"
    if not path.exists():
        return {}
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    ids = [r["id"] for r in lines]
    assert len(ids) == len(set(ids)), "one object per item"
    return {r["id"]: r for r in lines}


def no_item_twice_at_once(agent: Agentish) -> None:
    """From the server's log: two conversations of one item never overlap in time."""
    by_conversation: dict[str, list[float]] = {}
    firsts: list[dict[str, Any]] = []
    for entry in agent.log:
        by_conversation.setdefault(entry["conversation"], []).append(entry["t"])
        if entry["turn"] == 0:
            firsts.append(entry)
    spans: dict[str, list[tuple[float, float]]] = {}
    for entry in firsts:   # a conversation: its first request, and the later ones that carry its id
        times = by_conversation.get(entry["conversation"], [entry["t"]])
        spans.setdefault(entry["item"], []).append((entry["t"], max(times)))
    for item, item_spans in spans.items():
        item_spans.sort()
        for (_, end), (start, _) in zip(item_spans, item_spans[1:]):
            assert start > end, f"{item}: two of its jobs talked to the model at the same time"


# -- fast: no Docker ---------------------------------------------------------------------------------------------

def test_the_exit_code_is_the_worst_items_and_percentiles_are_nearest_rank():
    assert batch_exit_code([]) == 0 and batch_exit_code([0, 0]) == 0
    assert batch_exit_code([0, 3]) == 3 and batch_exit_code([3, 4, 0]) == 4 and batch_exit_code([4, 1, 3]) == 1
    assert batch_exit_code([0, 7]) == 1                          # an unknown code counts as a failure
    assert percentile([], 50) is None
    assert percentile([5, 1, 3], 50) == 3 and percentile(list(range(1, 101)), 95) == 95


@pytest.mark.cli
def test_bad_lines_are_all_reported_with_their_numbers_and_nothing_is_submitted(run_pid, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    lines = [
        json.dumps({"task": "fine", "repo": str(repo)}),
        "{not json",
        json.dumps(["a list"]),
        json.dumps({"repo": str(repo)}),                                   # no task
        json.dumps({"task": "t", "repo": str(repo), "timeout": -5}),        # out of range
        json.dumps({"task": "t", "repo": str(repo), "colour": "red"}),      # unknown field
        "",
        json.dumps({"id": "1", "task": "t", "repo": str(repo)}),            # line 1's default id
        json.dumps({"id": "../x", "task": "t", "repo": str(repo)}),
        json.dumps({"task": "t", "repo": str(tmp_path / "missing")}),
        json.dumps({"task": "t", "repo": str(repo), "tools": "read,teleport"}),
        json.dumps({"task": "t", "repo": str(repo), "max_turns": 3, "file": ["a", "b"], "queue": "q1"}),
    ]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(lines) + "\n")
    r = run_pid("batch", str(tasks), "--out", str(tmp_path / "out"), "--model", "m", "--base-url", "http://x/v1")
    assert r.code == 2, r.stderr
    for number in (2, 3, 4, 5, 6, 8, 9, 10, 11):
        assert f"line {number}:" in r.stderr, (number, r.stderr)
    for number in (1, 7, 12):
        assert f"line {number}:" not in r.stderr
    assert "9 bad line(s)" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()
    listed = run_pid("list", "--json")
    assert listed.code == 0 and json.loads(listed.stdout) == []
    assert run_pid("batch", str(tasks), "--model", "m").code == 2           # --out is required
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    r = run_pid("batch", str(empty), "--out", str(tmp_path / "o2"), "--model", "m")
    assert r.code == 2 and "no tasks" in r.stderr


# -- real runs: Docker, a local worker ---------------------------------------------------------------------------

def result_files(out: Path, ids: list[str]) -> dict[str, dict[str, Any]]:
    return {i: json.loads((out / i / "result.json").read_text()) for i in ids}


@pytest.mark.long
@pytest.mark.docker
@pytest.mark.cli
def test_a_batch_interrupted_halfway_resumes_and_its_summary_matches_the_items_results(pid_env, tmp_path):
    """50 items over three projects, --workers 4: Ctrl-C halfway, the same command again; every item ends once,
    completed items are not run again, and no item's task is with the model twice at the same time."""
    projects = make_projects(tmp_path / "projects")
    tasks = tasks_file(tmp_path / "tasks.jsonl", projects, 50, forget_every=10)
    out = tmp_path / "out"
    agent = Agentish(delay_s=0.05, usage={"prompt_tokens": 1000, "completion_tokens": 100})
    with ScriptedLLM(responder=agent) as llm:
        cmd = batch_cmd(tasks, out, llm, "--workers", "4", "--input-price", "1", "--output-price", "2",
                        "--check", CHECK)
        first = subprocess.Popen(cmd, cwd=tmp_path, env=pid_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        deadline = time.time() + 240
        while len(rows(out)) < 15 and time.time() < deadline and first.poll() is None:
            time.sleep(0.3)
        first.send_signal(signal.SIGINT)
        stdout, stderr = first.communicate(timeout=180)
        assert first.returncode == 130, stderr
        assert "resume with: pid batch" in stderr
        before = rows(out)
        completed_before = {i: r["job_id"] for i, r in before.items() if r["status"] == "completed"}
        assert 10 <= len(completed_before) < 50, before
        assert {r["status"] for r in before.values()} <= {"completed", "cancelled"}
        again = subprocess.run(cmd, cwd=tmp_path, env=pid_env, capture_output=True, text=True, timeout=600)
    final = rows(out)
    ids = [f"item-{i}" for i in range(50)]
    forgetful = {f"item-{i}" for i in range(50) if i % 10 == 9}
    assert sorted(final) == sorted(ids)
    assert all(r["status"] == "completed" for r in final.values()), again.stderr
    for item_id, job_id in completed_before.items():   # skipped, not rerun
        assert final[item_id]["job_id"] == job_id
    runs = agent.conversations()
    for item_id in completed_before:
        assert len(runs[item_id]) == 1, (item_id, runs[item_id])
    no_item_twice_at_once(agent)
    results = result_files(out, ids)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["items"] == 50 and summary["by_status"] == {"completed": 50}
    assert summary["cost"]["total"] == pytest.approx(sum(r["usage"]["cost"] for r in results.values()), abs=1e-5)
    assert summary["tokens"]["total"] == sum(r["usage"]["total_tokens"] for r in results.values())
    costs = [r["usage"]["cost"] for r in results.values()]
    durations = [r["duration_s"] for r in results.values()]
    assert summary["cost"]["p50"] == pytest.approx(percentile(costs, 50), abs=1e-6)
    assert summary["cost"]["p95"] == pytest.approx(percentile(costs, 95), abs=1e-6)
    assert summary["duration_s"]["p50"] == pytest.approx(percentile(durations, 50), abs=1e-3)
    assert summary["duration_s"]["p95"] == pytest.approx(percentile(durations, 95), abs=1e-3)
    assert summary["slowest"][0]["duration_s"] == pytest.approx(max(durations), abs=1e-3)
    assert summary["most_expensive"][0]["cost"] == pytest.approx(max(costs), abs=1e-6)
    for item_id in ids:
        r = final[item_id]
        assert r["cost"] == pytest.approx(results[item_id]["usage"]["cost"], abs=1e-6)
        assert r["turns"] == results[item_id]["turns"] == 3 and r["job_id"] == results[item_id]["id"]
        fixed = PROJECTS[list(PROJECTS)[int(item_id.split("-")[1]) % 3]][3]
        patch = (out / item_id / "patch.diff").read_text()
        assert (f"+    return {fixed}" in patch) == (item_id not in forgetful), (item_id, patch)
    assert not any((out / ".jobs").iterdir())                    # downloaded, the workers' copies removed
    assert again.returncode == 4, again.stderr
    cancelled_before = sum(1 for r in before.values() if r["status"] == "cancelled")
    said = f"pid: {cancelled_before} item{'s' if cancelled_before != 1 else ''} whose earlier job ended cancelled"
    assert cancelled_before == 0 or f"{said}: submitted again" in again.stderr, again.stderr   # said, not silent
    for item_id in ids:
        check_result = results[item_id]["check"]
        assert check_result["passed"] == (item_id not in forgetful), (item_id, check_result)
        assert final[item_id]["check"] == check_result
    assert summary["check"] == {"asked": 50, "checked": 50, "passed": 45, "pass_rate": 0.9}
    assert summary["exit_code"] == 4


@pytest.mark.docker
@pytest.mark.cli
@pytest.mark.parametrize("store", ["embedded", "redis"])
def test_the_batch_budget_stops_running_jobs_at_their_next_model_call_and_cancels_the_queued(store, pid_env, tmp_path,
                                                                                          request):
    """$0.01 per model call, a budget of $0.05, two jobs at once, eight items of six calls each: the batch stops
    within one call per running job; every item ends cancelled, batch_budget. With SQLite (a transaction) and with
    Redis as broker and store (a Lua script)."""
    if store == "redis":
        pid_env = {**pid_env, "PID_BROKER_URL": request.getfixturevalue("redis_server").url}
    projects = make_projects(tmp_path / "projects")
    tasks = tasks_file(tmp_path / "tasks.jsonl", projects, 8)
    out = tmp_path / "out"
    agent = Agentish(delay_s=0.3, turns=6, usage={"prompt_tokens": 1000, "completion_tokens": 0})
    with ScriptedLLM(responder=agent) as llm:
        r = subprocess.run(batch_cmd(tasks, out, llm, "--workers", "2", "--input-price", "10", "--max-total-cost",
                                     "0.05", "--json"), cwd=tmp_path, env=pid_env, capture_output=True, text=True,
                           timeout=300)
    assert r.returncode == 1, r.stderr
    final = rows(out)
    assert len(final) == 8
    assert {(x["status"], x["exit_reason"]) for x in final.values()} == {("cancelled", "batch_budget")}, final
    calls = len(agent.log)
    assert 5 <= calls <= 5 + 2, calls                              # the budget's calls, plus one per running job
    results = result_files(out, list(final))
    spent = sum(x["usage"]["cost"] for x in results.values())
    assert spent == pytest.approx(calls * 0.01, abs=1e-6)
    assert 0.05 <= spent <= 0.05 + 2 * 0.01 + 1e-9
    started = [x for x in results.values() if x["turns"] > 0]
    assert 1 <= len(started) <= 4 and all("budget" in (x.get("error") or "") for x in results.values())
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert lines[-1]["summary"]["by_status"] == {"cancelled": 8}
    assert lines[-1]["summary"]["budget"]["spent"] == pytest.approx(spent, abs=1e-6)


@pytest.mark.docker
@pytest.mark.cli
def test_a_detached_batch_keeps_its_running_limit_without_its_client(run_pid, pid_env, tmp_path):
    """--detach --max-running 1: the client is gone, a worker with three slots runs the batch's jobs one at a
    time (the store refuses the others at claim); --status and --wait DIR read it later."""
    projects = make_projects(tmp_path / "projects")
    tasks = tasks_file(tmp_path / "tasks.jsonl", projects, 4)
    out = tmp_path / "out"
    agent = Agentish(delay_s=0.2)
    with ScriptedLLM(responder=agent) as llm:
        r = run_pid(*batch_cmd(tasks, out, llm, "--detach", "--max-running", "1")[3:])
        assert r.code == 0, r.stderr
        assert "pid batch --wait" in r.stdout
        status = run_pid("batch", "--status", str(out), "--json")
        assert status.code == 0 and json.loads(status.stdout)["counts"] == {"queued": 4}
        items = json.loads(status.stdout)["item_states"]   # (each item as the table shows it)
        assert [(i["id"], i["status"], i["turns"]) for i in items] == [(f"item-{n}", "queued", 0) for n in range(4)]
        assert all(i["job_id"] for i in items)
        worker = start_worker(pid_env, tmp_path, tmp_path / "worker.log", concurrency=3)
        try:
            waited = run_pid("batch", "--wait", str(out), timeout=300)
        finally:
            stop_worker(worker)
    assert waited.code == 0, waited.stderr
    assert "4 items: 4 completed" in waited.stdout
    results = sorted(result_files(out, [f"item-{i}" for i in range(4)]).values(), key=lambda x: x["started_at"])
    for earlier, later in zip(results, results[1:]):
        assert later["started_at"] >= earlier["finished_at"], "two of the batch's jobs ran at once"
    ended = json.loads(run_pid("batch", "--status", str(out), "--json").stdout)
    assert ended["counts"] == {"completed": 4}
    assert [(i["status"], i["detail"]) for i in ended["item_states"]] == [("completed", "stop")] * 4


def run_in_pty(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> tuple[int, str]:
    """The command with a terminal (120 columns) as its stdout and stderr: what a person at one sees."""
    import fcntl
    import pty
    import struct
    import termios
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(cmd, cwd=cwd, env={**env, "TERM": "xterm-256color", "COLUMNS": "120"},
                            stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    chunks = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            data = os.read(leader, 65536)
        except OSError:   # the terminal's other end closed: the command ended
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return proc.wait(timeout=30), b"".join(chunks).decode(errors="replace")


@pytest.mark.long
@pytest.mark.docker
@pytest.mark.cli
def test_a_terminal_gets_a_live_table_and_retry_failed_reruns_only_the_failed(pid_env, tmp_path):
    """On a terminal: the live table (counts, running items with their turn, cost, ETA). Items that hit a limit
    are not rerun by the same command; with --retry-failed (their limit raised in the file) they are, and only
    they. A completed item's line edited is refused: its result would not be the line's."""
    projects = make_projects(tmp_path / "projects")
    tasks = tasks_file(tmp_path / "tasks.jsonl", projects, 4)
    lines = [json.loads(line) for line in tasks.read_text().splitlines()]
    for line in lines[2:]:
        line["max_turns"] = 1                     # three turns needed: these end `limit`
    tasks.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    agent = Agentish(delay_s=0.6, usage={"prompt_tokens": 1000, "completion_tokens": 100})
    with ScriptedLLM(responder=agent) as llm:
        cmd = batch_cmd(tasks, out, llm, "--workers", "2", "--input-price", "1")
        code, screen = run_in_pty(cmd, pid_env, tmp_path)
        assert code == 3, screen
        plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)
        assert "4 items" in plain and "ETA" in plain and "turn" in plain and "last tool" in plain, plain
        assert re.search(r"item-\d +[123] +\$", plain), plain          # a running item, its turn and its cost
        assert "[4/4]" in plain and "4 items: 2 completed, 2 limit" in plain
        first = rows(out)
        assert {i: r["status"] for i, r in first.items()} == {"item-0": "completed", "item-1": "completed",
                                                                "item-2": "limit", "item-3": "limit"}
        requests = len(agent.log)
        same = subprocess.run(cmd, cwd=tmp_path, env=pid_env, capture_output=True, text=True, timeout=300)
        assert same.returncode == 3 and len(agent.log) == requests, same.stderr    # nothing ran again
        edited = [dict(line, task="another task") if line["id"] == "item-0" else line for line in lines]
        tasks.write_text("".join(json.dumps(line) + "\n" for line in edited))   # a completed item's line, edited
        refused = subprocess.run([*cmd, "--retry-failed"], cwd=tmp_path, env=pid_env, capture_output=True,
                                 text=True, timeout=300)
        assert refused.returncode == 2 and "item-0 (edited)" in refused.stderr, refused.stderr
        assert len(agent.log) == requests
        for line in lines:
            line.pop("max_turns", None)
        tasks.write_text("".join(json.dumps(line) + "\n" for line in lines))
        retried = subprocess.run([*cmd, "--retry-failed"], cwd=tmp_path, env=pid_env, capture_output=True,
                                 text=True, timeout=300)
    assert retried.returncode == 0, retried.stderr
    final = rows(out)
    assert all(r["status"] == "completed" for r in final.values())
    assert [final[i]["job_id"] for i in ("item-0", "item-1")] == [first[i]["job_id"] for i in ("item-0", "item-1")]
    assert all(final[i]["job_id"] != first[i]["job_id"] for i in ("item-2", "item-3"))
    assert {e["item"] for e in agent.log[requests:]} == {"item-2", "item-3"}
    assert json.loads((out / "item-2" / "result.json").read_text())["id"] == final["item-2"]["job_id"]


def test_the_summary_counts_per_item_figures_over_the_items_that_ran():
    """Items the budget cancelled in the queue (no turn) are counted by status but do not drag p50 to zero."""
    from pid.jobs.batch import summarize
    ran = [{"id": f"r{i}", "status": "completed", "exit_code": 0, "cost": 1.0 + i, "tokens": 100, "turns": 2,
            "duration_s": 10.0 + i} for i in range(3)]
    queued = [{"id": f"q{i}", "status": "cancelled", "exit_code": 1, "exit_reason": "batch_budget", "cost": 0,
               "tokens": 0, "turns": 0, "duration_s": 0.0} for i in range(5)]
    summary = summarize(ran + queued, items=8)
    assert summary["by_status"] == {"completed": 3, "cancelled": 5} and summary["ran"] == 3
    assert summary["cost"]["total"] == 6.0 and summary["cost"]["p50"] == 2.0
    assert summary["duration_s"]["p50"] == 11.0 and summary["slowest"][0] == {"id": "r2", "duration_s": 12.0}
    assert summary["exit_code"] == 1


def test_an_item_whose_check_original_the_workspace_lacks_is_warned_of_by_the_batch(capsys):
    """A misspelt --check-original protects nothing (the agent's edit of the test it meant is judged with it): the
    batch says so beside the item's line and under its summary, not only in batch.jsonl."""
    from pid.cli.batch_progress import Lines, summary_text
    from pid.jobs.batch import summarize
    from pid.jobs.batch_run import Progress
    check = {"command": "pytest", "exit_code": 0, "passed": True, "duration_s": 1.0, "output_tail": "",
             "timed_out": False, "ran_on": "patch", "original": ["tests/test_calc.py"]}
    rows = [{"id": "typo", "status": "completed", "exit_reason": "stop", "exit_code": 0, "cost": 0, "tokens": 1,
             "turns": 1, "duration_s": 1.0, "check": {**check, "original_missing": ["tests/test_calc.py"]}},
            {"id": "fine", "status": "completed", "exit_reason": "stop", "exit_code": 0, "cost": 0, "tokens": 1,
             "turns": 1, "duration_s": 1.0, "check": check}]
    for row in rows:
        Lines(as_json=False).item_ended(row, Progress(total=2))
    out, err = capsys.readouterr()
    assert out.count("check=passed") == 2 and "warning" not in out
    assert err.splitlines() == ["warning: typo: --check-original tests/test_calc.py: not in the original workspace, "
                                "so the check saw none there (right for a file the patch adds; else a misspelt path, "
                                "which protects nothing)"]
    summary = summarize(rows, items=2)
    assert summary["check"]["original_missing"] == ["typo"]
    assert "warning: 1 item(s) named --check-original paths" in summary_text(summary, "out")
    assert "warning" not in summary_text(summarize(rows[1:], items=1), "out")


@pytest.mark.docker   # `pid batch --workers 1`: a real worker process, real containers
@pytest.mark.cli
def test_a_tasks_line_naming_another_endpoint_gets_neither_the_command_line_s_key_nor_the_worker_s(
        pid_env, tmp_path):
    """A tasks file is anyone's: a line pointing `base_url` at a server of its own used to receive the command
    line's key, and the worker's own. Each key goes to the endpoint it was given with only."""
    projects = make_projects(tmp_path / "projects")
    tasks = tasks_file(tmp_path / "tasks.jsonl", projects, 2)
    with ScriptedLLM([{"text": "done"}] * 2) as ours, ScriptedLLM([{"text": "done"}] * 2) as theirs:
        lines = [json.loads(line) for line in tasks.read_text().splitlines()]
        lines[1]["base_url"] = theirs.base_url
        tasks.write_text("".join(json.dumps(line) + "\n" for line in lines))
        # the local worker (--workers) has a key of its own in its environment, for PID_BASE_URL: ours
        env = {**pid_env, "PID_API_KEY": "sk-workers-own", "PID_BASE_URL": ours.base_url}
        done = subprocess.run([*batch_cmd(tasks, tmp_path / "out", ours, "--workers", "1", "--api-key", "sk-cli")],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        ours_seen = [h.get("authorization") for h in ours.request_headers]
        theirs_seen = [h.get("authorization") for h in theirs.request_headers]
    assert done.returncode == 0, done.stderr
    assert (ours_seen, theirs_seen) == (["Bearer sk-cli"], [None]), (ours_seen, theirs_seen)
