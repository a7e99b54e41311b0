"""The engine probe (`pid submit`'s image check) reads a bounded answer in bounded time: whatever listens on the
socket, it never hangs a submit nor fills its memory; anything but a whole 200 and a JSON object is None (the SDK
then words the error)."""
from __future__ import annotations

import socket
import threading

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
    assert image_present("img") is None   # (without its deadline, it would read until pytest's timeout)
    gone.set()


def test_an_answer_of_its_content_length_is_whole_without_waiting_for_the_close(engine, monkeypatch):
    monkeypatch.setattr(engine_probe, "TIMEOUT_S", 60.0)
    held = threading.Event()

    def keep_open(conn: socket.socket) -> None:   # as an engine (or a proxy) keeping the connection alive
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{"NCPU": 5}\n')
        held.wait(60)
    engine.append(keep_open)
    assert engine_cpus() == 5
    held.set()


def test_an_answer_nested_past_pythons_limit_is_no_answer(engine):
    engine.append(lambda c: c.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + b"[" * 200_000))
    assert image_present("img") is None
