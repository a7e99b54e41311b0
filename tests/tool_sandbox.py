"""The `sandbox` fixture for tool and loop tests: a real DockerSandbox, one per test module (a container start per
test would dominate the run; tests use distinct file names). Tools never touch the host, so neither do their tests.
"""
from __future__ import annotations

import os
import posixpath
from typing import Iterator

import pytest

from pid.messages import ToolCall
from pid.tools import ToolContext, default_registry
from sandbox import DockerSandbox, SandboxConfig


# PID_TEST_RUNTIME=runsc runs the tool tests under gVisor (docker/setup.sh --test does, where runsc is registered);
# gVisor's own threads count against the pids limit, hence the larger one there.
RUNTIME = os.environ.get("PID_TEST_RUNTIME") or None


@pytest.fixture(scope="module")
def sandbox() -> Iterator[DockerSandbox]:
    box = DockerSandbox.create(SandboxConfig(job_id="test-tools", runtime=RUNTIME,
                                             pids_limit=4096 if RUNTIME == "runsc" else 512))
    try:
        yield box
    finally:
        box.close()


# ---------------------------------------------------------------- helpers for the tool tests

def put(box: object, rel: str, data: bytes | str) -> str:
    """Create a file in the sandbox's workdir; returns its absolute in-sandbox path."""
    path = posixpath.join(box.workdir, rel)  # type: ignore[attr-defined]
    box.write_file(path, data.encode("utf-8") if isinstance(data, str) else data)  # type: ignore[attr-defined]
    return path


def get(box: object, rel: str) -> bytes:
    return box.read_file(posixpath.join(box.workdir, rel))  # type: ignore[attr-defined]


def call_tool(box: object, name: str, args: dict, **ctx_fields: object):
    """Run one tool call through the default registry, as the agent loop does."""
    ctx = ToolContext(box, **ctx_fields)  # type: ignore[arg-type]
    return default_registry().execute(ToolCall("call-1", name, args), ctx)
