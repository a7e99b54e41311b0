"""A test that needs a service this machine lacks (a Docker engine, Redis, RabbitMQ, tmux, Chromium, gVisor, a
compose tool, systemd-analyze, node and npm, the llama-server build, a private mount namespace, PyYAML):
skipped on a developer's machine, with the reason; an error in CI.

CI (the environment variable CI set to true, as CI systems set it and .ci/run's caller does) runs
docker/setup.sh --test, which installs every one of them: there a missing one means the suite did not test what
it claims to, and a green run would hide that. Hence it fails, saying what is missing and how to get it.
"""
from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true")


def missing(what: str) -> NoReturn:
    """`what` says what is missing and how to get it."""
    if in_ci():
        pytest.fail(f"CI is set, and {what}", pytrace=False)
    pytest.skip(what)
