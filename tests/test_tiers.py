"""The two test tiers: without an engine, every `docker` test is skipped for one stated reason (and the fast tier
runs on); the fixtures of tool_sandbox mark what they need."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def without_an_engine(tmp_path, **more: str) -> subprocess.CompletedProcess:
    """pytest on two tests of tests/test_tools_write.py (an in-memory and a docker variant, and a docker-only
    test), where no engine answers."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "PID_")) and k != "CI"}
    env.update(PYTHONPATH=str(ROOT), DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock", **more)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "-W", "ignore",
                           "tests/test_tools_write.py", "-k", "overwrites or fifo"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_without_an_engine_docker_tests_are_skipped_with_one_reason(tmp_path):
    proc = without_an_engine(tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    # the in-memory variants pass; the docker variant and the docker-only test are skipped, for one reason
    assert "2 passed, 2 skipped" in out, out
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert len(skips) == 1 and "[2]" in skips[0] and "no Docker engine reachable" in skips[0], out


def test_in_ci_a_missing_engine_fails_the_docker_tests_saying_so(tmp_path):
    """CI installs every service the suite uses: a skip there would hide tests that did not run."""
    proc = without_an_engine(tmp_path, CI="true")
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    # the in-memory variants pass; each docker one fails (the file's other tests are deselected, however many)
    assert re.search(r"\b2 passed, [0-9]+ deselected, 2 errors\b", out), out
    assert out.count("CI is set, and no Docker engine reachable") == 2 and "skipped" not in out, out


def test_the_fast_tier_sees_no_engine(monkeypatch):
    """Whatever this machine has, a test of the fast tier cannot reach an engine (conftest.py makes it unreachable):
    one that needs it fails everywhere, not only where Docker is absent."""
    from pid.sandbox.docker_client import connect
    from pid.sandbox.errors import DockerUnavailable
    assert os.environ["DOCKER_HOST"].startswith("unix:///nonexistent/")
    try:
        connect()
    except DockerUnavailable:
        return
    raise AssertionError("an engine answered in the fast tier")


def test_a_leak_a_parallel_worker_finds_fails_the_whole_run(monkeypatch):
    """Under pytest-xdist each worker is a run of its own (its own RUN_ID) and checks its own containers; a worker's
    exit status does not reach the controller, so its finding travels in workeroutput and fails the run there."""
    from types import SimpleNamespace

    import tests.conftest as suite
    monkeypatch.setattr(suite, "_leaked_on_workers", [])
    monkeypatch.setattr(suite, "_leak_check", lambda: "0123456789ab(some-job)")
    worker = SimpleNamespace(config=SimpleNamespace(workeroutput={}), exitstatus=0)
    suite.pytest_sessionfinish(worker, 0)
    assert worker.exitstatus == 1 and worker.config.workeroutput == {"pid_leaked": "0123456789ab(some-job)"}

    monkeypatch.setattr(suite, "_leak_check", lambda: "")   # the controller made no container itself
    suite.pytest_testnodedown(SimpleNamespace(workeroutput=worker.config.workeroutput), None)
    suite.pytest_testnodedown(SimpleNamespace(workeroutput={}), None)   # a clean worker
    controller = SimpleNamespace(config=SimpleNamespace(), exitstatus=0)
    suite.pytest_sessionfinish(controller, 0)
    assert controller.exitstatus == 1


def test_a_run_without_leaks_keeps_its_status(monkeypatch):
    from types import SimpleNamespace

    import tests.conftest as suite
    monkeypatch.setattr(suite, "_leaked_on_workers", [])
    monkeypatch.setattr(suite, "_leak_check", lambda: "")
    session = SimpleNamespace(config=SimpleNamespace(workeroutput={}), exitstatus=0)
    suite.pytest_sessionfinish(session, 0)
    assert session.exitstatus == 0 and session.config.workeroutput == {}
