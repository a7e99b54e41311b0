"""Private broker servers for the tests: a Redis and a RabbitMQ started by the test itself, on free ports, with all
their files in the test's tmp_path, and stopped (every process they started, nothing else) at the end.

The server binaries come from the distribution (docker/setup.sh --test installs redis-server and rabbitmq-server);
where one is missing its fixture skips the test, with the reason (in CI it fails: tests/services.py). Nothing here
touches a system service or another user's Erlang node: RabbitMQ gets its own node name, ports, cookie (HOME) and
epmd port, and only an epmd that carries that port in its environment is stopped.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from tests.services import missing

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"   # Debian's; /usr/sbin's wrapper would switch user


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class RedisServer:
    """`redis-server`, by default with RDB snapshots at Redis's own slowest rule (an hour after a write): none is
    taken during a test, so a restart after `kill()` starts empty, as a crashed Redis does between snapshots. With
    appendonly, every write is in its append-only file first (fsync always): a restart has them all. Without
    snapshots nor appendonly it is volatile, which `pid worker` refuses for a job store."""
    home: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    appendonly: bool = False
    snapshots: bool = True

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 20) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        log = open(self.home / "redis.log", "a")
        save = "3600 1" if self.snapshots else ""
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", save,
             *(["--appendonly", "yes", "--appendfsync", "always"] if self.appendonly else ["--appendonly", "no"]),
             "--dir", str(self.home)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        log.close()
        deadline = time.time() + timeout
        while not self.ping():
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("redis-server did not start:\n" + (self.home / "redis.log").read_text()[-2000:])
            time.sleep(0.05)

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """`kill -9`: whatever it held is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def restart(self) -> None:
        """Killed and started again on the same port: empty, or with what its append-only file holds."""
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def _environment(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)


def _processes_with(variable: str, value: str) -> list[int]:
    """The processes whose environment says variable=value: this broker's and no one else's."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and _environment(int(entry)).get(variable) == value:
            found.append(int(entry))
    return found


@dataclass
class RabbitMQServer:
    """A RabbitMQ node of its own: node name, AMQP/distribution/epmd ports, cookie, data, logs and config all
    private. consumer_timeout_ms is set low, and checked every second, so that a test can outlast it."""
    home: Path
    consumer_timeout_ms: int = 5_000
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    tag: str = field(default_factory=lambda: f"pidtest-{uuid.uuid4().hex[:10]}")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def environment(self) -> dict[str, str]:
        home = self.home
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=str(home), PID_TEST_RABBITMQ=self.tag,   # HOME: the Erlang cookie; the tag: to find our processes
            RABBITMQ_NODENAME=f"{self.tag}@localhost", RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port), RABBITMQ_DIST_PORT=str(free_port()), ERL_EPMD_PORT=str(free_port()),
            RABBITMQ_MNESIA_BASE=str(home / "mnesia"), RABBITMQ_LOG_BASE=str(home / "log"),
            RABBITMQ_CONFIG_FILE=str(home / "rabbitmq.conf"), RABBITMQ_CONF_ENV_FILE=str(home / "rabbitmq-env.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(home / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(home / "enabled_plugins"), RABBITMQ_ENABLED_PLUGINS="",
            RABBITMQ_PID_FILE=str(home / "rabbitmq.pid"), RABBITMQ_LOGS="-",
        )
        return env

    def start(self, timeout: float = 90) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "rabbitmq.conf").write_text(
            f"consumer_timeout = {self.consumer_timeout_ms}\nlisteners.tcp.default = 127.0.0.1:{self.port}\n"
            "loopback_users = none\n")
        # The broker checks consumer timeouts on its channels' tick, every minute by default: every second here.
        (self.home / "advanced.config").write_text("[{rabbit, [{channel_tick_interval, 1000}]}].\n")
        (self.home / "rabbitmq-env.conf").write_text("")
        (self.home / "enabled_plugins").write_text("[].\n")
        log = open(self.home / "rabbitmq.log", "a")
        self.proc = subprocess.Popen([RABBITMQ_SERVER], env=self.environment(), cwd=self.home, stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.time() + timeout
        while not self.accepts_amqp():
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError("rabbitmq-server did not start:\n" + self.log()[-3000:])
            time.sleep(0.5)

    def log(self) -> str:
        try:
            return (self.home / "rabbitmq.log").read_text(errors="replace")
        except OSError:
            return ""

    def accepts_amqp(self) -> bool:
        if not _answers(self.port):
            return False
        from kombu import Connection
        try:
            with Connection(self.url, connect_timeout=2) as conn:
                conn.connect()
                return True
        except Exception:
            return False

    def stop(self) -> None:
        """Stops the node, then kills whatever of its processes remain (the VM, its helpers, its own epmd)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()   # the script's trap stops the node gracefully
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for pid in _processes_with("PID_TEST_RABBITMQ", self.tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if self.proc is not None and self.proc.poll() is None:
            self.proc.wait(timeout=10)


def _skip_unless(binary: str, what: str) -> None:
    if not (shutil.which(binary) or os.path.exists(binary)):
        missing(f"{what} is not installed here ({binary}); docker/setup.sh --test installs it")


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private, empty Redis on a free port."""
    _skip_unless("redis-server", "Redis")
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def rabbitmq_server(tmp_path: Path) -> Iterator[RabbitMQServer]:
    """A private RabbitMQ node with a 5 s consumer_timeout, checked every second."""
    _skip_unless(RABBITMQ_SERVER, "RabbitMQ")
    server = RabbitMQServer(tmp_path / "rabbitmq")
    server.start()
    try:
        yield server
    finally:
        server.stop()
