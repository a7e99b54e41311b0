"""channel.sh's reading of requests, run on the host under each shell that may serve them (bash, dash, busybox ash):
a request the server refuses is answered E and ends the server. A refused `r` used to leave its announced body on
stdin, where the server, as root, then read it as further requests."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pid.sandbox.channel import request_line as line

SCRIPT = Path(__file__).resolve().parent.parent / "sandbox" / "channel.sh"
SHELLS = [pytest.param(argv, id=argv[0]) for argv in (["bash"], ["dash"], ["sh"], ["busybox", "sh"])
          if shutil.which(argv[0])]
HIDDEN = line(b"t n2 0 0 /dev/null")   # a harmless request: any reply to n2 means it ran


def serve(shell: list[str], requests: bytes) -> bytes:
    """The server's whole answer to `requests`, as an agent server that was never greeted (no slot shells, no
    /.pid): only requests that need neither are sent. It must end by itself, at EOF or before."""
    done = subprocess.run([*shell, str(SCRIPT), "agent", "77", "/tmp", "54321", "54321"], input=requests,
                          capture_output=True, timeout=20, cwd="/tmp")
    assert done.returncode == 0, done
    return done.stdout


@pytest.mark.parametrize("shell", SHELLS)
def test_a_hidden_request_is_answered_when_it_is_a_request(shell):
    assert serve(shell, line(b"t n0 0 0 /dev/null") + HIDDEN) == b"S n0 0 0\nS n2 0 0\n"


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("header", [
    b"r n1 0 0 %d -",         # a slot, on a server without slot shells
    b"r n1 0 - %d x",         # a data length that is no number
    b"r n1 0 7 %d -",         # no such slot
    b"r n1 x - %d -",         # an emit that is no number
    b"r n1 0 - %d",           # no data length
])
def test_no_request_in_a_refused_commands_body_runs(shell, header):
    body = HIDDEN + line(b"t n3 0 0 /dev/null")
    assert serve(shell, line(b"t n0 0 0 /dev/null") + line(header % len(body)) + body) == b"S n0 0 0\nE n1 0\n"


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("request_", [b"x n1 5", b"c n1 x /.pid/out/1.1", b"t n1 0 -1 /dev/null", b"k n1 1x", b"",
                                      b"h n1 x"])
def test_a_refused_request_ends_the_server(shell, request_):
    # Out of step with the host: nothing after it is taken for a request.
    assert serve(shell, line(request_) + HIDDEN) == b"E %s 0\n" % (request_.split(b" ") + [b"", b""])[1]


@pytest.mark.parametrize("shell", SHELLS)
def test_a_command_the_host_stopped_sending_half_way_never_runs(shell, tmp_path):
    """The host sent a command's first bytes and went away (its deadline passed, it was killed): the server must not
    run what came, which may be a prefix that means something else (`rm -rf /tmp/x` cut to `rm -rf /`)."""
    marker = Path("/tmp") / f"pid-test-cut-{tmp_path.name}-{shell[0]}"
    command = b"touch %s; echo whole" % bytes(marker)
    try:
        answer = serve(shell, line(b"r n1 2 - %d -" % (len(command) + 40)) + command)
        assert answer == b"" and not marker.exists(), answer
    finally:
        marker.unlink(missing_ok=True)


@pytest.mark.parametrize("shell", SHELLS)
def test_a_server_missing_a_part_or_started_by_a_relative_name_ends_at_once(shell, tmp_path):
    """Its parts are read from beside it: one missing (a packaging mistake) ends it before it answers anything, as
    does a name without a directory (it would read them from wherever it was started)."""
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(SCRIPT, alone / "channel.sh")
    for argv, cwd in (([str(alone / "channel.sh")], "/tmp"), (["channel.sh"], str(SCRIPT.parent))):
        done = subprocess.run([*shell, *argv, "agent", "77", "/tmp", "54321", "54321"], input=HIDDEN,
                              capture_output=True, timeout=20, cwd=cwd)
        assert done.returncode != 0 and done.stdout == b"", (argv, done)


def test_the_host_pads_every_request_line_to_one_size_and_never_cuts_one():
    from pid.sandbox.channel import REQUEST_HEADER
    assert line(b"k n1 5") == b"k n1 5" + b" " * (REQUEST_HEADER - 7) + b"\n"
    assert len(line(b"x" * (REQUEST_HEADER - 1))) == REQUEST_HEADER
    for unfit in (b"x" * REQUEST_HEADER, b"k n1 5\nk n2 6"):
        with pytest.raises(ValueError):
            line(unfit)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("first", [b"t n0 0 0 /dev/null\n",                        # a line, unpadded
                                   line(b"t n0 0 0 /dev/null")[:-1] + b" \n",      # one byte too many
                                   b"t n0\n" + line(b"0 0 /dev/null")[5:]])        # the right size, two lines
def test_a_request_line_of_another_size_is_refused_and_ends_the_server(shell, first):
    """bash reads a request's first line with one `read -N` of REQUEST_HEADER bytes (it reads a line byte by byte),
    sh by lines: either way a line that is not exactly that, its newline last and alone, is out of step."""
    assert serve(shell, first + HIDDEN) == b"E  0\n"
