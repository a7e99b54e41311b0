"""A job store or broker that cannot be reached, or that refuses pid's credentials, is one line naming it (never its
password) and exit 2, from every command that needs it: never a client library's traceback."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.brokers import free_port
from tests.test_cli import LOCAL, assert_one_error

pytestmark = pytest.mark.cli

COMMANDS = [("list",), ("workers",), ("status", "20261201-000000-abcdef"), ("logs", "20261201-000000-abcdef"),
            ("cancel", "20261201-000000-abcdef"), ("steer", "20261201-000000-abcdef", "hi"),
            ("pause", "20261201-000000-abcdef"), ("result", "20261201-000000-abcdef"),
            ("retry", "20261201-000000-abcdef"), ("submit", "t", "--model", "m", "--base-url", LOCAL)]


@pytest.mark.parametrize("args", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_redis_that_is_down_is_one_line_naming_it(run_pid, pid_env, sample_repo: Path, args):
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"   # nothing listens there
    repo = ("--repo", str(sample_repo)) if args[0] == "submit" else ()
    line = assert_one_error(run_pid(*args, *repo, env={**pid_env, "PID_BROKER_URL": url}),
                            "job store", f"127.0.0.1:{url.rsplit(':', 1)[1]}", "PID_BROKER_URL")
    assert "hunter2" not in line


@pytest.mark.parametrize("args", [("list",), ("workers",), ("status", "20261201-000000-abcdef"), ("worker",)])
def test_a_redis_that_refuses_the_password_is_one_line_naming_it(run_pid, pid_env, redis_server, args):
    """(`pid worker` waits for a store that is down, as Celery waits for its broker; one that refuses the password
    will not change its mind, so the worker says so and exits 2 rather than waiting forever.)"""
    url = redis_server.url.replace("redis://", "redis://nobody:hunter2@")   # no such user: WRONGPASS
    line = assert_one_error(run_pid(*args, env={**pid_env, "PID_STORE_URL": url}, timeout=60),
                            "job store", f"127.0.0.1:{redis_server.port}", "PID_STORE_URL")
    assert "hunter2" not in line


def test_a_sqlite_store_that_cannot_be_opened_is_one_line(run_pid, pid_env, tmp_path: Path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    line = assert_one_error(run_pid("list", env={**pid_env, "PID_STORE_URL": f"sqlite://{blocked}/jobs.db"}),
                            "job store", str(blocked), "PID_STORE_URL")
    assert "cannot make" in line


def test_a_broker_that_is_down_at_submit_is_one_line_naming_it(run_pid, pid_env, sample_repo: Path):
    url = f"amqp://guest:hunter2@127.0.0.1:{free_port()}//"   # the store stays SQLite: only the broker fails
    res = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", LOCAL,
                  env={**pid_env, "PID_BROKER_URL": url})
    line = assert_one_error(res, "could not queue job", "broker", "PID_BROKER_URL", "amqp://guest:***@127.0.0.1")
    assert "hunter2" not in line
