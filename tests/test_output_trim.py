"""Trimming a running command's output from the host: the front goes, the tail and the counts stay true."""
from __future__ import annotations

import os

import pytest

from sandbox.output_trim import STEP, read_cut, trim_front


@pytest.fixture
def out_dir(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield tmp_path, fd
    os.close(fd)


def test_the_front_is_punched_out_in_whole_mebibytes_and_its_newlines_recorded(out_dir):
    path, fd = out_dir
    line = b"y" * 1023 + b"\n"
    (path / "3.1").write_bytes(line * (5 * 1024) + b"tail")     # 5 MiB of 1 KiB lines, then a partial line
    assert trim_front(fd, "3.1", 1 << 20) == 4 * STEP
    data = (path / "3.1").read_bytes()
    assert len(data) == 5 * STEP + 4                              # the size stays: the command appends at its end
    assert data[:4 * STEP] == bytes(4 * STEP) and data[4 * STEP:] == line * 1024 + b"tail"
    assert os.stat(path / "3.1").st_blocks * 512 < 2 * STEP       # the front no longer takes disk
    assert read_cut(fd, "3.1") == (4 * STEP, 4 * 1024)
    with open(path / "3.1", "ab") as f:                           # more output: the next cut adds to the record
        f.write(b"\n" + line * (3 * 1024))
    assert trim_front(fd, "3.1", 1 << 20) == 7 * STEP
    # (then: the kept lines, "tail\n", and 2 MiB less 5 bytes of lines)
    assert read_cut(fd, "3.1") == (7 * STEP, 4 * 1024 + 1024 + 1 + 2047)


def test_a_small_output_is_left_whole(out_dir):
    path, fd = out_dir
    (path / "3.1").write_bytes(b"x\n" * 1000)
    assert trim_front(fd, "3.1", 1 << 20) == 0
    assert not (path / "3.1.cut").exists() and read_cut(fd, "3.1") == (0, 0)


@pytest.mark.parametrize("plant", ["fifo", "symlink"])
def test_what_a_root_agent_plants_there_is_refused_not_followed_or_waited_on(out_dir, plant):
    path, fd = out_dir
    target = path / "elsewhere"
    target.write_bytes(b"z" * (4 * STEP))
    if plant == "fifo":
        os.mkfifo(path / "3.1")
        (path / "4.1").write_bytes(b"z" * (4 * STEP))
        os.mkfifo(path / "4.1.cut")                                # a record that would block a reader
    else:
        os.symlink(target, path / "3.1")
        (path / "4.1").write_bytes(b"z" * (4 * STEP))
        os.symlink(target, path / "4.1.cut.new")                   # the record's temporary name, pointing away
    with pytest.raises(OSError):
        trim_front(fd, "3.1", 1 << 20)
    with pytest.raises(OSError):
        trim_front(fd, "4.1", 1 << 20)
    assert target.read_bytes() == b"z" * (4 * STEP)
