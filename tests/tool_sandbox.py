"""Sandbox fixtures for the tool tests. Tools never touch the host, so neither do their tests.

- `sandbox`: each test twice, against the in-memory sandbox (fast tier) and a real container (`docker` tier). For
  tests that need only files, or commands the test itself scripts.
- `docker_sandbox`: a real container only (marked `docker` through its one parameter), for tests of real shell
  behaviour.
The container is one per test module (a container start per test would dominate the run; tests use distinct file
names), shared by both fixtures: conftest's `tools_container`.
"""
from __future__ import annotations

import posixpath
from typing import Any, Iterator

import pytest

from pid.messages import ToolCall
from pid.tools import ToolContext, default_registry
from tests.memory_sandbox import MemorySandbox

DOCKER = pytest.param("docker", marks=pytest.mark.docker)


@pytest.fixture(scope="module", params=[DOCKER])
def docker_sandbox(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue("tools_container")


@pytest.fixture(scope="module", params=["memory", DOCKER])
def sandbox(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        with MemorySandbox() as box:
            yield box
    else:
        yield request.getfixturevalue("tools_container")


# ---------------------------------------------------------------- helpers for the tool tests

def put(box: Any, rel: str, data: bytes | str) -> str:
    """Create a file in the sandbox's workdir; returns its absolute in-sandbox path."""
    path = posixpath.join(box.workdir, rel)
    box.write_file(path, data.encode("utf-8") if isinstance(data, str) else data)
    return path


def get(box: Any, rel: str) -> bytes:
    return box.read_file(posixpath.join(box.workdir, rel))


def call_tool(box: Any, name: str, args: dict, **ctx_fields: Any):
    """Run one tool call through the default registry, as the agent loop does."""
    ctx = ToolContext(box, **ctx_fields)
    return default_registry().execute(ToolCall("call-1", name, args), ctx)
