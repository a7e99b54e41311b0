"""Trimming a running command's output from the host: the front goes, the tail and the counts stay true."""
from __future__ import annotations

import os

import pytest

from pid.sandbox.output_trim import STEP, read_cut, trim_front


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


def test_a_huge_sparse_output_costs_the_host_no_reading_of_its_holes(out_dir):
    """The agent can give its output file a size of terabytes with nothing behind it (ftruncate on its stdout): the
    host used to read every zero of it, for hours, its command's timeout unseen. Holes hold no newline."""
    path, fd = out_dir
    with open(path / "3.1", "wb") as f:
        f.write(b"a\nb\n")
        f.truncate(1 << 40)                      # a TiB...
        f.seek((1 << 40) - 3 * STEP)
        f.write(b"x\n" * (STEP // 2))             # ...then a little output
    assert trim_front(fd, "3.1", 1 << 20) == (1 << 40) - STEP   # (reading the TiB would stop at the budget first)
    assert read_cut(fd, "3.1") == ((1 << 40) - STEP, 2 + STEP // 2)


def test_counting_stops_at_its_budget_and_the_next_trim_goes_on(out_dir, monkeypatch):
    from pid.sandbox import output_trim
    path, fd = out_dir
    (path / "3.1").write_bytes(b"y\n" * (4 * STEP))    # 8 MiB of lines
    clock = iter([0.0, 0.0, 0.0, 0.0, 99.0])            # the budget runs out after the first chunk or so
    monkeypatch.setattr(output_trim.time, "monotonic", lambda: next(clock, 99.0))
    first = trim_front(fd, "3.1", 1 << 20)
    assert 0 < first < 7 * STEP and read_cut(fd, "3.1") == (first, first // 2)
    monkeypatch.undo()
    assert trim_front(fd, "3.1", 1 << 20) == 7 * STEP
    assert read_cut(fd, "3.1") == (7 * STEP, 7 * STEP // 2)


@pytest.mark.parametrize("plant", ["fifo", "symlink"])
def test_what_a_root_agent_plants_at_the_record_s_name_is_replaced_not_followed_or_waited_on(out_dir, plant):
    path, fd = out_dir
    target = path / "elsewhere"
    target.write_bytes(b"z")
    (path / "3.1").write_bytes(b"q\n" * (2 * STEP))
    if plant == "fifo":
        os.mkfifo(path / "3.1.cut.new")          # opening it for writing would wait for a reader forever
    else:
        os.symlink(target, path / "3.1.cut.new")
    assert trim_front(fd, "3.1", 1 << 20) == 3 * STEP
    assert read_cut(fd, "3.1") == (3 * STEP, 3 * STEP // 2) and target.read_bytes() == b"z"


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
        os.symlink(target, path / "4.1.cut")                       # a record that points away
    with pytest.raises(OSError):
        trim_front(fd, "3.1", 1 << 20)
    with pytest.raises(OSError):
        trim_front(fd, "4.1", 1 << 20)
    assert target.read_bytes() == b"z" * (4 * STEP)
