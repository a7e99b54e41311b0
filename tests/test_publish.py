"""A job's message on a Redis broker, pushed by pid itself (jobs/publish.py): the same message Celery sends, and a
`pid submit` that never loads Celery or kombu. (The cluster tests run jobs published this way on real workers.)"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.brokers import RedisServer
from tests.conftest import ROOT

pytestmark = pytest.mark.cli   # a redis-server and subprocesses

# Fields that are fresh in every message, whoever sends it.
PER_MESSAGE = {("headers", "origin"), ("properties", "delivery_tag"), ("properties", "reply_to")}


@pytest.fixture
def redis_url(tmp_path: Path):
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def _env(tmp_path: Path, url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PID_")}
    return dict(env, PID_BROKER_URL=url, PID_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))


def _fields(message: dict) -> dict[tuple[str, str], object]:
    out: dict[tuple[str, str], object] = {}
    for key, value in message.items():
        if isinstance(value, dict):
            out.update({(key, inner): v for inner, v in value.items()})
        else:
            out[(key, "")] = base64.b64decode(value) if key == "body" else value
    return out


def test_the_pushed_message_is_the_one_celery_sends(tmp_path, redis_url):
    import redis

    from pid.jobs.publish import message
    sent = subprocess.run([sys.executable, "-c", "from pid.worker.app import app; "
                           "app.send_task('pid.run_job', args=['job-1'], task_id='job-1', queue='q1')"],
                          env=_env(tmp_path, redis_url), capture_output=True, text=True, timeout=60)
    assert sent.returncode == 0, sent.stderr
    client = redis.Redis.from_url(redis_url)
    celerys = _fields(json.loads(client.lpop("q1")))
    ours = _fields(json.loads(message("job-1", "q1")))
    assert set(ours) == set(celerys)
    assert {k: v for k, v in ours.items() if k not in PER_MESSAGE} == \
           {k: v for k, v in celerys.items() if k not in PER_MESSAGE}


SUBMIT = """
import sys
from click.testing import CliRunner
from pid.cli.main import cli
result = CliRunner().invoke(cli, sys.argv[1:], catch_exceptions=False)
print(result.output, end="")
UNNEEDED = ("celery", "kombu", "docker", "pid.worker", "pid.tools", "pid.agent", "pid.cli.view", "pid.cli.rerun",
            "pid.cli.batch", "pid.events", "pid.messages", "http.client")
print("loaded:", sorted({n for m in sys.modules for n in UNNEEDED if m == n or m.startswith(n + ".")}))
sys.exit(result.exit_code)
"""


def test_submit_on_redis_pushes_one_message_without_loading_celery(tmp_path, redis_url, sample_repo):
    import redis
    done = subprocess.run([sys.executable, "-c", SUBMIT, "submit", "a task", "--repo", str(sample_repo), "--model",
                           "m", "--base-url", "http://127.0.0.1:9/v1", "--queue", "q2"],
                          env=_env(tmp_path, redis_url), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
    job_id = done.stdout.split()[0]
    assert "loaded: []" in done.stdout
    # (a new user's: the worker elsewhere never writes --out, and nothing said so)
    assert f"pid: a worker keeps this job's artifacts in the job store; `pid result {job_id} --wait --download " \
        in done.stdout + done.stderr, done.stdout + done.stderr
    entries = redis.Redis.from_url(redis_url).lrange("q2", 0, -1)
    assert len(entries) == 1
    sent = json.loads(entries[0])
    assert sent["headers"]["id"] == job_id and sent["properties"]["delivery_info"]["routing_key"] == "q2"


def _queued(home: Path, queue: str) -> list[dict]:
    folder = home / "broker" / "queue"
    return [json.loads(p.read_bytes()) for p in sorted(folder.iterdir()) if p.name.endswith(f".{queue}.msg")]


def test_the_message_put_in_the_embedded_queue_is_the_one_celery_sends(tmp_path):
    """On the embedded queue pid puts the message file itself (jobs/queue_files.py), without kombu: the same as
    Celery's."""
    env = {**_env(tmp_path, ""), "PID_BROKER_URL": ""}
    celery = "from pid.worker.app import app; app.send_task('pid.run_job', args=['job-1'], task_id='job-1', queue='q1')"
    ours = ("from pid.jobs.dispatch import publish; from pid.jobs.store import default_store; "
            "print(publish(default_store(), [('job-1', 'q1')]))")
    for code in (celery, ours):
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    celerys, kombus = (_fields(m) for m in _queued(tmp_path / "home", "q1"))
    assert set(kombus) == set(celerys)
    assert {k: v for k, v in kombus.items() if k not in PER_MESSAGE} == \
           {k: v for k, v in celerys.items() if k not in PER_MESSAGE}



def test_one_process_publishes_over_one_connection_and_a_failed_one_is_dropped(tmp_path):
    """A worker's hand-backs and re-dispatches through kombu (RabbitMQ; here kombu on the embedded queue's transport)
    reuse the process's connection to the broker, as Celery's producer pool did; a send that failed drops it, and the
    next one connects anew."""
    env = {**_env(tmp_path, ""), "PID_BROKER_URL": ""}
    code = ("import os; from pid.jobs import publish as p; from pid.jobs.brokers import broker_settings\n"
            "url, options = broker_settings(os.environ['PID_HOME'])\n"
            "print(p.send(url, options, [('job-1', 'q1')])); first = list(p._connections.values())\n"
            "print(p.send(url, options, [('job-2', 'q1')])); assert list(p._connections.values()) == first\n"
            "class Broken(Exception): pass\n"
            "def refuse(*a, **k): raise Broken('refused')\n"
            "first[0].Producer = refuse; sent, error = p.send(url, options, [('job-3', 'q1')])\n"
            "assert sent == 0 and isinstance(error, Broken) and not p._connections, (sent, error)\n"
            "print(p.send(url, options, [('job-4', 'q1')])); assert list(p._connections.values()) != first\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["(1, None)", "(1, None)", "(1, None)"]
    assert [_fields(m)[("headers", "id")] for m in _queued(tmp_path / "home", "q1")] == ["job-1", "job-2", "job-4"]

CLIENT = """
import sys
from click.testing import CliRunner
from pid.cli.main import cli
submitted = CliRunner().invoke(cli, ["submit", "a task", "--repo", sys.argv[1], "--model", "m",
                                    "--base-url", "http://127.0.0.1:9/v1"], catch_exceptions=False)
job = submitted.output.split()[0]
print("submit", submitted.exit_code)
for args in (["list"], ["status", job], ["logs", job], ["view", job, "-o", "page.html"], ["workers"], ["cancel", job],
             ["--help"]):
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    print(args[0], result.exit_code)
print("loaded:", sorted({n for m in sys.modules for n in sys.argv[2:] if m == n or m.startswith(n + ".")}))
"""


def test_the_client_commands_load_neither_celery_nor_the_worker(tmp_path, sample_repo):
    """Submitting (on the embedded queue), listing, status, logs, cancel and workers: the client needs jobs/, never
    worker/, Celery or kombu (only `pid worker` and a foreground run load those)."""
    env = {**_env(tmp_path, ""), "PID_BROKER_URL": ""}
    done = subprocess.run([sys.executable, "-c", CLIENT, str(sample_repo), "celery", "kombu", "pid.worker", "docker"],
                          env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
    assert all(f"{command} 0" in done.stdout for command in ("submit", "list", "status", "cancel")), done.stdout
    assert "loaded: []" in done.stdout, done.stdout
    assert len(_queued(tmp_path / "home", "pid")) == 1


def test_submit_loads_only_what_it_needs(tmp_path, sample_repo):
    """`pid submit` is a short process on the way to the job's first model request: it loads neither the other
    commands (view, continue, retry, batch) nor the agent's tools or events, nor the queue's libraries on the
    embedded queue, nor an HTTP client for its image check."""
    env = {**_env(tmp_path, ""), "PID_BROKER_URL": ""}
    done = subprocess.run([sys.executable, "-c", SUBMIT, "submit", "a task", "--repo", str(sample_repo), "--model",
                           "m", "--base-url", "http://127.0.0.1:9/v1"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "loaded: []" in done.stdout, done.stdout


def test_a_redis_database_past_the_servers_is_one_line(tmp_path, redis_url):
    """`redis://host/99` on a server of 16 databases: `pid list` says so in one line, exit 2, not a traceback (a
    new-user test)."""
    past = redis_url.rsplit("/", 1)[0] + "/99"
    run = subprocess.run([sys.executable, "-m", "pid.cli.main", "list"], env=_env(tmp_path, past),
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("pid: error: cannot use the job store") and "DB index" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and run.stderr.count("\n") == 1


@pytest.mark.parametrize("url", ["redis:/127.0.0.1:6390/0", "127.0.0.1:6390"])
def test_a_mistyped_broker_url_is_refused_by_the_commands_that_read_the_store(tmp_path, url):
    """`pid list` with a mistyped PID_BROKER_URL had read this machine's SQLite store and said "no jobs", exit 0 (a
    new-user test): it refuses it, in one line, as submit and worker do."""
    run = subprocess.run([sys.executable, "-m", "pid.cli.main", "list"], env=_env(tmp_path, url),
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("pid: error: PID_BROKER_URL=") and "not a broker pid knows" in run.stderr
    assert not (tmp_path / "home" / "jobs.db").exists()
