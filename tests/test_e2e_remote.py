"""A worker that shares nothing with its client but the job store: the client's directory (its --out, its
repository, with Redis its PID_HOME too) is hidden from the worker by a private tmpfs mounted over it in the
worker's own mount namespace, so the worker writes "the client's path" on a disk of its own, as one on another
machine does. The client still gets result.json, the patch, the transcripts and the collected files, from the store.
And the API key given at submit travels through the store only: never in a broker message, a result, a transcript,
`pid status` or the worker's log, and a job handed back to the queue keeps it."""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import stop_worker, wait_ready
from tests.scripted_llm import ScriptedLLM
from pid.jobs.sqlite_store import JobStore
from tests.services import missing

pytestmark = [pytest.mark.docker, pytest.mark.cli]

KEY = "sk-remote-7d1e-not-on-the-wire"
SCRIPT = [
    {"tool_calls": [
        {"name": "edit", "arguments": {"path": "hello.py",
                                       "edits": [{"oldText": 'print("hello")', "newText": 'print("hello, remote")'}]}},
        {"name": "write", "arguments": {"path": "notes/new.txt", "content": "made far away\n"}}]},
    {"text": "Done remotely."},
]


def _can_hide() -> str | None:
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"no private mount namespace here (unshare: {probe.stderr.strip()})"


def start_hidden_worker(env: dict[str, str], cwd: Path, log_path: Path, hide: Path,
                        concurrency: int = 1) -> subprocess.Popen:
    """A real `pid worker` that cannot see `hide` (an empty tmpfs of its own is mounted there)."""
    reason = _can_hide()
    if reason:
        missing(reason)
    script = 'mount -t tmpfs -o mode=0700 pid-elsewhere "$1" && shift && exec "$@"'
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                                 str(hide), sys.executable, "-m", "pid.cli.main", "worker", "--concurrency",
                                 str(concurrency)],
                                cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    return wait_ready(proc, log_path)


def job_args(llm: ScriptedLLM, repo: Path, out: Path, *extra: str) -> list[str]:
    # --disk 0: a job disk is a loop mount, which the engine would not see from the worker's private namespace
    return ["Make hello.py greet remote.", "--repo", str(repo), "--model", "scripted", "--base-url", llm.base_url,
            "--out", str(out), "--disk", "0", "--file", "notes/new.txt", *extra]


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "hello.py").write_text('print("hello")\n')
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(path), "add", "-A"], check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(path), "commit", "-qm", "i"],
                   check=True)
    return path


def check_downloaded(job_dir: Path, job_id: str) -> None:
    """Everything came from the store: written by the client's download (0600), not by the worker."""
    result = json.loads((job_dir / "result.json").read_text())
    assert result["id"] == job_id and result["status"] == "completed", result
    assert result["final_message"] == "Done remotely."
    assert '+print("hello, remote")' in (job_dir / "patch.diff").read_text()
    assert "notes/new.txt" in (job_dir / "patch.diff").read_text()
    assert (job_dir / "files" / "workspace" / "notes" / "new.txt").read_text() == "made far away\n"
    assert "Done remotely." in (job_dir / "session.jsonl").read_text()
    assert oct((job_dir / "patch.diff").stat().st_mode & 0o777) == "0o600"


def message_texts(raw: str) -> list[str]:
    """A broker message as stored, and its body decoded (kombu stores the body base64-encoded)."""
    texts = [raw]
    try:
        message = json.loads(raw)
        body = message.get("body", "")
        texts.append(base64.b64decode(body).decode("utf-8", "replace")
                     if message.get("properties", {}).get("body_encoding") == "base64" else str(body))
    except (ValueError, AttributeError, TypeError):
        pass
    return texts


def assert_key_nowhere(key: str, *texts: str) -> None:
    for text in texts:
        assert key not in text, text[:2000]


def test_a_worker_that_cannot_see_the_client_s_disk_returns_everything_through_the_store(
        run_pid, pid_env, tmp_path):
    client = tmp_path / "client"
    repo = make_repo(client / "repo")
    out = client / "out"
    out.mkdir()
    (tmp_path / "worker").mkdir()
    env = {**pid_env, "PID_HOME": str(tmp_path / "home")}   # the embedded broker and store live there: shared
    with ScriptedLLM(SCRIPT * 2) as llm:
        queued = run_pid("submit", *job_args(llm, repo, out, "--api-key", KEY), env=env)
        assert queued.code == 0, queued.stderr
        job_id = queued.stdout.strip()
        # The message waits in the embedded broker's files: it carries the job's id, not its key.
        messages = [p for p in (tmp_path / "home" / "broker").rglob("*") if p.is_file()]
        assert messages, "the queued message is a file under PID_HOME/broker"
        texts = [t for p in messages for t in message_texts(p.read_text(errors="replace"))]
        assert any(job_id in t for t in texts)
        assert_key_nowhere(KEY, *texts)
        worker = start_hidden_worker(env, tmp_path / "worker", tmp_path / "worker.log", hide=client)
        try:
            done = run_pid("result", job_id, "--wait", "--download", str(tmp_path / "dl"), "--json", env=env)
            again = run_pid("submit", "--wait", "--json", *job_args(llm, repo, out), env=env)
        finally:
            stop_worker(worker)
        headers = list(llm.request_headers)
    assert done.code == 0, done.stderr + (tmp_path / "worker.log").read_text()
    check_downloaded(tmp_path / "dl", job_id)
    assert not (out / job_id).exists()   # the worker wrote "the client's --out" on its own disk only
    # the worker used the key from the store: the model saw it, and nothing else did
    assert headers[0].get("authorization") == f"Bearer {KEY}"
    status = run_pid("status", job_id, "--json", env=env)
    store = JobStore(str(tmp_path / "home" / "jobs.db"))
    assert store.secret(job_id) is None   # ended: forgotten
    downloaded = [p.read_text(errors="replace") for p in (tmp_path / "dl").rglob("*") if p.is_file()]
    assert_key_nowhere(KEY, status.stdout, done.stdout, (tmp_path / "worker.log").read_text(), *downloaded,
                       json.dumps(store.events(job_id)))
    # submit --wait --out: the worker's files are not here, so the client downloads them into the job's out dir
    assert again.code == 0, again.stderr + (tmp_path / "worker.log").read_text()
    second = again.json()["id"]
    check_downloaded(out / second, second)
    assert headers[2].get("authorization") is None   # no key given, none in the worker's environment


def test_a_job_handed_back_and_run_again_keeps_its_key_and_both_transcripts(run_pid, pid_env, tmp_path):
    client = tmp_path / "client"
    repo = make_repo(client / "repo")
    (tmp_path / "worker").mkdir()
    env = {**pid_env, "PID_HOME": str(tmp_path / "home")}
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60"}}]}, *SCRIPT]
    with ScriptedLLM(script) as llm:
        first = start_hidden_worker(env, tmp_path / "worker", tmp_path / "w1.log", hide=client)
        try:
            job_id = run_pid("submit", *job_args(llm, repo, client / "out", "--api-key", KEY), env=env).stdout.strip()
            deadline = time.time() + 60
            while "running bash" not in run_pid("status", job_id, env=env).stdout:
                assert time.time() < deadline, (tmp_path / "w1.log").read_text()
                time.sleep(0.2)
            os.kill(first.pid, signal.SIGTERM)   # hand the job back
            first.wait(timeout=60)
        finally:
            stop_worker(first)
        assert "handed back to the queue" in (tmp_path / "w1.log").read_text()
        second = start_hidden_worker(env, tmp_path / "worker", tmp_path / "w2.log", hide=client)
        try:
            done = run_pid("result", job_id, "--wait", "--download", str(client / "dl"), env=env, timeout=120)
        finally:
            stop_worker(second)
        headers = list(llm.request_headers)
    logs = (tmp_path / "w1.log").read_text() + (tmp_path / "w2.log").read_text()
    assert done.code == 0, done.stderr + logs
    assert JobStore(str(tmp_path / "home" / "jobs.db")).get(job_id).attempts == 2
    assert len(headers) == 3 and [h.get("authorization") for h in headers] == [f"Bearer {KEY}"] * 3
    check_downloaded(client / "dl", job_id)
    assert "sleep 60" in (client / "dl" / "session.attempt-1.jsonl").read_text()   # the handed-back attempt's
    assert "sleep 60" not in (client / "dl" / "session.jsonl").read_text()
    assert_key_nowhere(KEY, logs, *(p.read_text(errors="replace") for p in (client / "dl").rglob("*")
                                    if p.is_file()))


def test_with_redis_two_homes_and_nothing_shared(run_pid, pid_env, redis_server, tmp_path):
    client = tmp_path / "client"
    repo = make_repo(client / "repo")
    out = client / "out"
    out.mkdir()
    (tmp_path / "worker").mkdir()
    shared = {"PID_STORE_URL": redis_server.url, "PID_BROKER_URL": redis_server.url}
    client_env = {**pid_env, **shared, "PID_HOME": str(client / "home")}
    worker_env = {**pid_env, **shared, "PID_HOME": str(tmp_path / "worker" / "home")}
    import redis
    r = redis.Redis.from_url(redis_server.url)
    with ScriptedLLM(SCRIPT * 2) as llm:
        queued = run_pid("submit", *job_args(llm, repo, out, "--api-key", KEY), env=client_env)
        assert queued.code == 0, queued.stderr
        job_id = queued.stdout.strip()
        # the message waits in Redis (the queue's list): the id, no key
        waiting = [m.decode("utf-8", "replace") for key in r.keys("*")
                   if r.type(key) == b"list" for m in r.lrange(key, 0, -1)]
        texts = [t for m in waiting for t in message_texts(m)]
        assert any(job_id in t for t in texts), waiting
        assert_key_nowhere(KEY, *texts)
        worker = start_hidden_worker(worker_env, tmp_path / "worker", tmp_path / "worker.log", hide=client)
        try:
            done = run_pid("result", job_id, "--wait", "--download", str(client / "dl"), env=client_env)
            again = run_pid("submit", "--wait", "--json", *job_args(llm, repo, out, "--api-key", KEY),
                            env=client_env)
        finally:
            stop_worker(worker)
        headers = list(llm.request_headers)
    log = (tmp_path / "worker.log").read_text()
    assert done.code == 0, done.stderr + log
    check_downloaded(client / "dl", job_id)
    assert again.code == 0, again.stderr + log
    check_downloaded(out / again.json()["id"], again.json()["id"])
    assert [h.get("authorization") for h in headers] == [f"Bearer {KEY}"] * 4
    status = run_pid("status", job_id, "--json", env=client_env)
    assert_key_nowhere(KEY, log, status.stdout, again.stdout, done.stdout)
    everything = []
    for key in r.keys("*"):
        kind = r.type(key)
        if kind == b"string":
            everything.append(r.get(key) or b"")
        elif kind == b"hash":
            everything += [k + b"=" + v for k, v in r.hgetall(key).items()]
        elif kind == b"list":
            everything += r.lrange(key, 0, -1)
        elif kind == b"stream":
            everything += [json.dumps({k.decode(): v.decode("utf-8", "replace") for k, v in f.items()}).encode()
                           for _, f in r.xrange(key)]
    assert_key_nowhere(KEY, *(b.decode("utf-8", "replace") for b in everything))
