"""The FIFO link to a channel server, against a stand-in server on this machine (no engine): hello, EOF when the
server goes, a dead server refusing requests at once, nothing read from a closed link, descriptors past 1024."""
from __future__ import annotations

import os
import resource
import threading
import time

import pytest

from pid.sandbox.channel import Channel, ChannelClosed, PipeLink
from pid.sandbox.frames import PipeReader, StreamClosed


def serve(run_dir: str, channel_id: int, replies: list[bytes], stop: threading.Event) -> threading.Thread:
    """A server that opens its FIFOs as the container's entry would, answers each request line with the next reply
    (its "%s" the request's nonce), and exits (closing both) when `stop` is set or the replies run out."""
    def run() -> None:
        with open(os.path.join(run_dir, f"rep.{channel_id}"), "wb", buffering=0) as out, \
                open(os.path.join(run_dir, f"req.{channel_id}"), "rb", buffering=0) as inp:
            for reply in replies:
                request = inp.readline()
                if stop.is_set() or not request:
                    return
                out.write(reply.replace(b"%s", request.split()[1]))
            stop.wait(30)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture()
def run_dir(tmp_path):
    path = tmp_path / "run"
    path.mkdir(mode=0o700)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    yield str(path), fd
    os.close(fd)


def test_hello_unlinks_the_names_and_a_dead_server_is_seen_at_once(run_dir):
    path, fd = run_dir
    link = PipeLink(fd, 7)
    stop = threading.Event()
    server = serve(path, 7, [b"R %s bash 0 0\n"], stop)
    channel = Channel(link, 7, "agent")
    try:
        channel.send_hello(time.monotonic() + 5)
        channel.await_hello(time.monotonic() + 5)
        assert channel.shell == "bash" and os.listdir(path) == []   # nothing else can open them now
        stop.set()
        server.join(5)
        started = time.monotonic()
        with pytest.raises(ChannelClosed):   # a request to a server that is gone fails, it does not fill the pipe
            channel._send(b"x" * 300_000, time.monotonic() + 20)
        assert time.monotonic() - started < 2
        assert channel.is_idle_clean() is False   # and its reply end says EOF
    finally:
        channel.close()


def test_a_server_that_never_opens_its_fifos_is_waited_for_only_while_the_container_lives(run_dir):
    _, fd = run_dir
    channel = Channel(PipeLink(fd, 8), 8, "control")
    try:
        channel.send_hello(time.monotonic() + 5)   # (the host holds the request FIFO: this never blocks)
        started = time.monotonic()
        with pytest.raises(ChannelClosed):
            channel.await_hello(time.monotonic() + 30, alive=lambda: time.monotonic() - started < 0.5)
        assert time.monotonic() - started < 3
    finally:
        channel.close()


def test_a_hello_naming_an_unknown_shell_is_refused(run_dir):
    path, fd = run_dir
    stop = threading.Event()
    channel = Channel(PipeLink(fd, 9), 9, "agent")
    serve(path, 9, [b"R %s \xff\xfe 0 0\n"], stop)
    try:
        channel.send_hello(time.monotonic() + 5)
        with pytest.raises(Exception, match="did not start"):
            channel.await_hello(time.monotonic() + 5)
    finally:
        stop.set()
        channel.close()


def test_a_closed_readers_descriptor_number_is_never_read_again():
    r, w = os.pipe()
    reader = PipeReader(r)
    reader.forget()
    os.close(r)
    r2, w2 = os.pipe()   # (likely the same number as r)
    os.write(w2, b"someone else's bytes\n")
    try:
        with pytest.raises(StreamClosed):
            reader.read_until(b"\n", time.monotonic() + 1, 100)
        with pytest.raises(StreamClosed):
            reader.fileno()
    finally:
        for fd in (w, r2, w2):
            os.close(fd)


def test_descriptors_numbered_past_1024_work(run_dir):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2100:
        pytest.skip(f"the hard open-files limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2100), hard))
    r, w = os.pipe()
    high_r, high_w = os.dup2(r, 2000), os.dup2(w, 2001)
    os.close(r)
    os.close(w)
    try:
        reader = PipeReader(high_r)
        assert reader.read_until(b"\n", time.monotonic() + 0.05, 100) is None   # select() would raise here
        os.write(high_w, b"hello\n")
        assert reader.read_until(b"\n", time.monotonic() + 1, 100) == b"hello"
    finally:
        os.close(high_r)
        os.close(high_w)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
