"""Shared fixtures: a private PID_HOME, a sample repository, the real `pid` CLI as a subprocess, a real worker.

Everything is real: the Docker engine, the Celery worker on the embedded broker, and an HTTP LLM server.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import docker
import pytest

ROOT = Path(__file__).resolve().parent.parent
IMAGE = os.environ.get("PID_TEST_IMAGE", "pid-sandbox:latest")

# In-process sandboxes (tool and sandbox tests) keep their job disks, and take their owner label, from a home of
# this run's own: nothing is shared with a real installation on the machine.
os.environ["PID_HOME"] = tempfile.mkdtemp(prefix="pid-test-home-")


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    def json(self) -> dict:
        return json.loads(self.stdout)


@pytest.fixture
def pid_env(tmp_path: Path) -> dict[str, str]:
    """Environment for pid subprocesses: a fresh home, no key or model leaking in from the machine."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PID_", "OPENAI_", "ANTHROPIC_"))}
    env.update(PID_HOME=str(tmp_path / "home"), PID_IMAGE=IMAGE, PYTHONPATH=str(ROOT),
               PYTHONUNBUFFERED="1")
    return env


@pytest.fixture
def run_pid(pid_env: dict[str, str], tmp_path: Path):
    """Run the real CLI: `run_pid("run", "task", "--repo", ...)`."""
    def run(*args: str, timeout: float = 240, env: dict[str, str] | None = None) -> CliResult:
        proc = subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=tmp_path, env=env or pid_env,
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        return CliResult(proc.returncode, proc.stdout, proc.stderr)
    return run


@pytest.fixture
def sample_repo(tmp_path: Path) -> Path:
    """A small git repository with an uncommitted change (the base must include it)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "hello.py").write_text('print("hello")\n')
    (repo / "README.md").write_text("# sample\n")
    (repo / "AGENTS.md").write_text("Always greet politely. MARKER-AGENTS-7f3a\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    (repo / "README.md").write_text("# sample\nuncommitted line\n")
    return repo


def start_worker(env: dict[str, str], cwd: Path, log_path: Path, concurrency: int = 1) -> subprocess.Popen:
    """A real `pid worker` process (in its own process group) on the embedded (filesystem) broker."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", "worker", "--concurrency", str(concurrency)], cwd=cwd,
                                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    deadline = time.time() + 60
    while "ready" not in log_path.read_text():
        if proc.poll() is not None or time.time() > deadline:
            stop_worker(proc)
            raise RuntimeError("worker did not start:\n" + log_path.read_text())
        time.sleep(0.2)
    return proc


def stop_worker(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


@pytest.fixture
def worker(pid_env: dict[str, str], tmp_path: Path):
    proc = start_worker(pid_env, tmp_path, tmp_path / "worker.log")
    yield proc
    stop_worker(proc)


def pid_containers() -> list:
    return docker.from_env().containers.list(all=True, filters={"label": "pid.job"})


_SESSION_STARTED = datetime.now(timezone.utc) - timedelta(seconds=2)


def _created_by_this_run(container) -> bool:
    """Only what this test run made counts (and is removed): other pid jobs on the machine are not ours."""
    try:
        created = datetime.fromisoformat(container.labels.get("pid.created", "").replace("Z", "+00:00"))
    except ValueError:
        return False
    return created >= _SESSION_STARTED


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After the suite no container with pid's labels, created by this run, may remain."""
    try:
        leaked = [c for c in pid_containers() if _created_by_this_run(c)]
    except Exception:
        return
    # auto-removed containers can take a moment to disappear after their main process exits
    deadline = time.time() + 10
    while leaked and time.time() < deadline:
        time.sleep(0.5)
        leaked = [c for c in pid_containers() if _created_by_this_run(c) and c.status != "removing"]
    if leaked:
        names = ", ".join(f"{c.short_id}({c.labels.get('pid.job')})" for c in leaked)
        print(f"\nLEAKED CONTAINERS after the test suite: {names}", file=sys.stderr)
        for c in leaked:
            try:
                c.remove(force=True)
            except Exception:
                pass
        session.exitstatus = 1
