"""The one reader of channel.sh's replies (sandbox/channel.py read_reply), against hostile bytes on a pipe: a reply is
taken only with the request's nonce, an allowed tag and well-formed fields, and its payload is counted, never searched,
so nothing in a payload can end a reply early or pass for the next one."""
from __future__ import annotations

import os
import time

import pytest

from pid.sandbox.channel import ProtocolError, Reply, read_reply
from pid.sandbox.errors import SandboxError
from pid.sandbox.frames import PipeReader

NONCE = b"0123456789abcdef01234567"
DONE = {b"D": "dd"}


@pytest.fixture()
def pipe():
    r, w = os.pipe()
    os.set_blocking(r, False)
    reader = PipeReader(r)
    yield reader, w
    os.close(r)
    os.close(w)


def reply(pipe, data: bytes, expect=DONE, limit: int = 100, wait: float = 1.0) -> Reply | None:
    reader, w = pipe
    os.write(w, data)
    return read_reply(reader, NONCE, expect, limit, time.monotonic() + wait)


def test_a_reply_is_its_header_and_exactly_its_length_of_payload(pipe):
    got = reply(pipe, b"D %s 0 3 5\nhello" % NONCE + b"D %s 7 0 0\n" % NONCE)
    assert got == Reply(b"D", [b"0", b"3"], b"hello")
    assert reply(pipe, b"") == Reply(b"D", [b"7", b"0"], b"")   # the next reply, untouched


def test_tags_and_nonces_inside_a_payload_are_only_payload(pipe):
    forged = b"\nD %s 0 0 0\nP %s 1 /.pid/out/1.1 0\n" % (NONCE, NONCE)
    got = reply(pipe, b"D %s 5 0 %d\n%s" % (NONCE, len(forged), forged))
    assert got is not None and (got.fields, got.payload) == ([b"5", b"0"], forged)


def test_a_reply_with_another_nonce_is_refused(pipe):
    with pytest.raises(ProtocolError):
        reply(pipe, b"D %s 0 0 0\n" % NONCE[::-1])
    with pytest.raises(ProtocolError):   # (no nonce at all)
        reply(pipe, b"D 0 0 0\n")


def test_a_payload_longer_than_asked_for_is_refused_before_it_is_read(pipe):
    with pytest.raises(ProtocolError, match="more than was asked"):
        reply(pipe, b"D %s 0 0 101\n" % NONCE + b"x" * 101, limit=100)


def test_a_payload_shorter_than_announced_is_not_taken_from_what_follows(pipe):
    # The header claims 10 bytes, 4 come: the reader waits for the rest (never takes the next reply's bytes for it)
    # and gives up when they do not come.
    reader, w = pipe
    os.write(w, b"D %s 0 0 10\nabcd" % NONCE)
    import pid.sandbox.channel as channel
    old, channel.REPLY_TIMEOUT = channel.REPLY_TIMEOUT, 0.2
    try:
        with pytest.raises(SandboxError, match="whole reply"):
            read_reply(reader, NONCE, DONE, 100, time.monotonic() + 0.1)
    finally:
        channel.REPLY_TIMEOUT = old


def test_a_payload_longer_than_announced_leaves_bytes_that_are_no_reply(pipe):
    assert reply(pipe, b"D %s 0 0 2\nhi there\n" % NONCE).payload == b"hi"
    with pytest.raises(ProtocolError):
        reply(pipe, b"")


@pytest.mark.parametrize("header", [
    b"P %s 1 /.pid/out/1.1 0",          # a tag this request does not allow
    b"E %s 0",                          # the server's "bad request"
    b"D %s 0 0",                        # a field missing
    b"D %s 0 0 0 0",                    # one too many
    b"D %s -1 0 0",                     # not a number
    b"D %s 0x1 0 0",
    b"D %s \xd9\xa1 0 0",               # (a digit, but not an ASCII one)
    b"D %s 0 0 -0",                     # a bad length
    b"D %s 0 0 99999999999999999999999",
    b"D  %s 0 0 0",                     # (fields are split on single spaces)
    b"",
])
def test_malformed_headers_are_refused(pipe, header):
    with pytest.raises(ProtocolError):
        reply(pipe, header.replace(b"%s", NONCE) + b"\n")


@pytest.mark.parametrize("path", [b"/etc/passwd", b"/.pid/out/1.1/../../x", b"/.pid/out/1", b"/.pid/run/cmd.1.0"])
def test_a_start_names_only_an_output_file_of_the_servers(pipe, path):
    with pytest.raises(ProtocolError):
        reply(pipe, b"P %s 12 %s 0\n" % (NONCE, path), {b"P": "dp", b"B": ""}, 0)
    assert reply(pipe, b"P %s 12 /.pid/out/3.4 0\n" % NONCE, {b"P": "dp", b"B": ""}, 0).fields == \
        [b"12", b"/.pid/out/3.4"]


def test_a_header_without_its_end_is_refused_once_over_the_line_limit(pipe):
    with pytest.raises(ProtocolError):
        reply(pipe, b"D %s 0 0 " % NONCE + b"9" * 2000)


def test_no_header_by_the_deadline_is_none(pipe):
    assert reply(pipe, b"D %s 0" % NONCE, wait=0.05) is None
