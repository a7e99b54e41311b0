"""The `sandbox` fixture for tool tests: the real DockerSandbox when it can run, else a local subprocess double.

One sandbox per test module (a container start per test would dominate the run); tests use distinct file names.

`SubprocessSandbox` is an honest implementation of the pid.sandbox.Sandbox protocol on a temp directory: bash in its
own session, output streamed to a file, the process group killed on timeout or cancel, tail and totals computed by
streaming that file, so memory stays bounded like the real one. Set PID_TEST_LOCAL_SANDBOX=1 to force it.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Callable, Iterator, Mapping

import pytest

from pid.sandbox import ExecResult

POLL_S = 0.02
ON_OUTPUT_EVERY_S = 0.1
ON_OUTPUT_MAX_BYTES = 16 * 1024


class SubprocessSandbox:
    def __init__(self, root: str) -> None:
        self.root = root
        self.workdir = os.path.join(root, "workspace")
        self._outputs = os.path.join(root, "outputs")
        os.makedirs(self.workdir)
        os.makedirs(self._outputs, mode=0o700)
        self._counter = 0
        self._lock = threading.Lock()

    def exec(self, command: str, *, timeout: float, tail_bytes: int = 65536,
             keep_lines: int | None = None, keep_bytes: int | None = None,
             env: Mapping[str, str] | None = None,
             on_output: Callable[[bytes], None] | None = None,
             cancel: threading.Event | None = None) -> ExecResult:
        with self._lock:
            self._counter += 1
            output_path = os.path.join(self._outputs, f"exec-{self._counter}.log")
        fd = os.open(output_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            proc = subprocess.Popen(["bash", "-c", command], cwd=self.workdir, stdin=subprocess.DEVNULL,
                                    stdout=fd, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, **(env or {})})
        finally:
            os.close(fd)
        deadline = time.monotonic() + timeout
        timed_out = cancelled = False
        sent = 0
        last_sent_at = 0.0
        while proc.poll() is None:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
            elif cancel is not None and cancel.is_set():
                cancelled = True
            if timed_out or cancelled:
                self._kill_group(proc)
                break
            if on_output is not None and now - last_sent_at >= ON_OUTPUT_EVERY_S:
                sent = self._send_new_output(output_path, sent, on_output)
                last_sent_at = now
            time.sleep(POLL_S)
        proc.wait()
        if on_output is not None:
            self._send_new_output(output_path, sent, on_output)
        total_bytes, total_lines, tail = _scan(output_path, tail_bytes)
        return ExecResult(None if (timed_out or cancelled) else proc.returncode, tail, total_bytes, total_lines,
                          timed_out=timed_out, cancelled=cancelled, output_path=output_path)

    @staticmethod
    def _kill_group(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    @staticmethod
    def _send_new_output(path: str, sent: int, on_output: Callable[[bytes], None]) -> int:
        size = os.path.getsize(path)
        if size <= sent:
            return sent
        start = max(sent, size - ON_OUTPUT_MAX_BYTES)
        with open(path, "rb") as f:
            f.seek(start)
            on_output(f.read(size - start))
        return size

    def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        with open(path, "rb") as f:
            return f.read() if max_bytes is None else f.read(max_bytes)

    def write_file(self, path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "wb") as f:  # an existing file keeps its mode
            f.write(data)


def _scan(path: str, tail_bytes: int) -> tuple[int, int, bytes]:
    """(total bytes, total lines, last `tail_bytes` bytes) streaming the file in chunks."""
    newlines = 0
    last = b""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            newlines += chunk.count(b"\n")
            last = chunk[-1:]
        total = f.tell()
        f.seek(max(total - tail_bytes, 0))
        tail = f.read()
    lines = newlines + (1 if total and last != b"\n" else 0)
    return total, lines, tail


def _docker_sandbox_factory() -> Callable[[], object] | None:
    """A function creating the real DockerSandbox, or None when PID_TEST_LOCAL_SANDBOX asks for the local double.

    Without that variable Docker is required: a missing engine fails the tests rather than quietly testing less.
    """
    if os.environ.get("PID_TEST_LOCAL_SANDBOX"):
        return None
    from sandbox import DockerSandbox, SandboxConfig
    return lambda: DockerSandbox.create(SandboxConfig(job_id="test-tools"))


@pytest.fixture(scope="module")
def sandbox() -> Iterator[object]:
    create = _docker_sandbox_factory()
    if create is not None:
        box = create()
        try:
            yield box
        finally:
            (getattr(box, "close", None) or getattr(box, "remove"))()
        return
    root = tempfile.mkdtemp(prefix="pid-tools-")
    try:
        yield SubprocessSandbox(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- helpers for the tool tests

def put(box: object, rel: str, data: bytes | str) -> str:
    """Create a file in the sandbox's workdir; returns its absolute in-sandbox path."""
    import posixpath
    path = posixpath.join(box.workdir, rel)  # type: ignore[attr-defined]
    box.write_file(path, data.encode("utf-8") if isinstance(data, str) else data)  # type: ignore[attr-defined]
    return path


def get(box: object, rel: str) -> bytes:
    import posixpath
    return box.read_file(posixpath.join(box.workdir, rel))  # type: ignore[attr-defined]


def call_tool(box: object, name: str, args: dict, **ctx_fields: object):
    """Run one tool call through the default registry, as the agent loop does."""
    from pid.messages import ToolCall
    from pid.tools import ToolContext, default_registry
    ctx = ToolContext(box, **ctx_fields)  # type: ignore[arg-type]
    return default_registry().execute(ToolCall("call-1", name, args), ctx)
