"""The engine probe (`pid submit`'s image check) reads a bounded answer in bounded time: whatever listens on the
socket, it never hangs a submit nor fills its memory; anything but a whole 200 and a JSON object is None (the SDK
then words the error)."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from pid.sandbox import engine_probe
from pid.sandbox.engine_probe import engine_cpus, image_present


@pytest.fixture
def engine(tmp_path, monkeypatch):
    """A fake engine on a Unix socket: answer(conn) serves each connection."""
    path = str(tmp_path / "docker.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    stop = threading.Event()
    handlers: list = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                try:
                    handlers[0](conn)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield handlers
    stop.set()
    server.close()


def test_a_whole_answer_is_read(engine):
    engine.append(lambda c: c.sendall(b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"NCPU": 3}'))
    assert engine_cpus() == 3


@pytest.mark.parametrize("answer", [b"HTTP/1.0 404 Not Found\r\n\r\n{}", b'HTTP/1.0 200 OK\r\n\r\n{"Id": ',
                                    b"garbage", b"", b'HTTP/1.0 200 OK\r\n\r\n["Id"]'])
def test_anything_else_is_no_answer(engine, answer):
    engine.append(lambda c: c.sendall(answer))
    assert image_present("img") is None


def test_an_endless_answer_is_cut_at_its_bound(engine):
    def endless(conn: socket.socket) -> None:
        conn.sendall(b'HTTP/1.0 200 OK\r\n\r\n{"Id": "')
        while True:
            conn.sendall(b"x" * 65536)
    engine.append(endless)
    assert image_present("img") is None


def test_an_engine_that_never_finishes_is_given_up(engine, monkeypatch):
    monkeypatch.setattr(engine_probe, "TIMEOUT_S", 0.5)
    gone = threading.Event()

    def trickle(conn: socket.socket) -> None:   # a byte now and then: no single read ever times out
        conn.sendall(b'HTTP/1.0 200 OK\r\n\r\n{"Id": "')
        while not gone.wait(0.1):
            conn.sendall(b"x")
    engine.append(trickle)
    began = time.monotonic()
    assert image_present("img") is None
    gone.set()
    assert time.monotonic() - began < 30   # (bounded by TIMEOUT_S; the margin is for a loaded machine)
