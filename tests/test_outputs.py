"""Which finished outputs stay on pid's disk (pid.sandbox.outputs), on a real directory."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from pid.sandbox.commands import SETTLE_AT, TRIM_EVERY_S, OutputFiles
from pid.sandbox.output_trim import STEP
from pid.sandbox.outputs import LINGER_BYTES, KeptOutputs, remove, used

KiB = 1024


@pytest.fixture
def out(tmp_path: Path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield tmp_path, fd
    os.close(fd)


def output(path: Path, name: str, size: int) -> str:
    (path / name).write_bytes(b"x" * size)
    return name


def test_an_output_shown_whole_goes_at_once_with_its_record(out) -> None:
    path, fd = out
    output(path, "1.1", 10 * KiB)
    (path / "1.1.cut").write_text("0 0\n")
    KeptOutputs().finished(fd, "1.1", kept=False)
    assert os.listdir(path) == []


def test_kept_outputs_stay_within_their_bytes_and_files_oldest_first(out) -> None:
    path, fd = out
    kept = KeptOutputs(budget=100 * KiB, files=3)
    for n in range(1, 4):
        kept.finished(fd, output(path, f"1.{n}", 40 * KiB), kept=True)
    assert sorted(os.listdir(path)) == ["1.2", "1.3"]          # 120 KiB > 100: the oldest went
    kept.finished(fd, output(path, "1.4", 4 * KiB), kept=True)
    kept.finished(fd, output(path, "1.5", 4 * KiB), kept=True)
    assert sorted(os.listdir(path)) == ["1.3", "1.4", "1.5"]   # 4 files > 3: the oldest went
    kept.finished(fd, output(path, "1.6", 500 * KiB), kept=True)
    assert os.listdir(path) == ["1.6"]                         # the newest stays, whatever its size


def test_a_kept_output_that_grew_after_its_command_counts_as_it_is_now(out) -> None:
    path, fd = out
    kept = KeptOutputs(budget=100 * KiB)
    kept.finished(fd, output(path, "1.1", 10 * KiB), kept=True)
    with open(path / "1.1", "ab") as f:          # a process left behind still writes to it
        f.write(b"y" * 200 * KiB)
    kept.finished(fd, output(path, "1.2", 10 * KiB), kept=True)
    assert os.listdir(path) == ["1.2"]


def test_clear_removes_every_output_but_never_walks_into_a_directory(out) -> None:
    path, fd = out
    kept = KeptOutputs()
    kept.finished(fd, output(path, "1.1", KiB), kept=True)
    output(path, "2.7", KiB)
    (path / "planted").mkdir()
    (path / "planted" / "inside").write_text("x")
    (path / "link").symlink_to(path / "planted" / "inside")
    kept.clear(fd)
    assert os.listdir(path) == ["planted"] and (path / "planted" / "inside").read_text() == "x"


def test_remove_and_used_never_follow_a_link(out, tmp_path_factory) -> None:
    path, fd = out
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "big"
    elsewhere.write_bytes(b"z" * 64 * KiB)
    (path / "1.1").symlink_to(elsewhere)
    assert used(fd, "1.1") < 64 * KiB
    remove(fd, "1.1")
    assert not (path / "1.1").is_symlink() and elsewhere.exists()
    assert used(fd, "gone") == 0


def test_a_process_left_behind_cannot_fill_the_disk_through_an_output_it_still_holds(out) -> None:
    """`server &` keeps its command's output open after the command ends: removing the name alone frees nothing
    while it writes. The file is emptied as it goes, and cut back whenever it has grown past LINGER_BYTES."""
    path, fd = out
    kept = KeptOutputs(budget=100 * KiB)
    writer = open(path / "1.1", "wb")   # (as the shell's redirection: no O_APPEND)
    try:
        writer.write(b"x" * 300 * KiB)
        writer.flush()
        kept.finished(fd, "1.1", kept=False)
        assert os.listdir(path) == [] and os.fstat(writer.fileno()).st_blocks == 0   # emptied as it went
        writer.write(b"y" * 2 * LINGER_BYTES)
        writer.flush()
        kept.sweep(fd)
        assert os.fstat(writer.fileno()).st_blocks == 0

        grower = open(path / "1.2", "wb")   # a kept output grows past the budget after its command
        kept.finished(fd, output(path, "1.2", 10 * KiB), kept=True)
        grower.write(b"z" * 200 * KiB)
        grower.flush()
        kept.sweep(fd)
        assert os.listdir(path) == [] and os.fstat(grower.fileno()).st_blocks == 0
        grower.close()
    finally:
        writer.close()
        kept.close()


class PidDisk:
    """As much of a JobDisk as OutputFiles.open needs: where pid's directories are."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, sub: str) -> str:
        return str(self.root / sub)


@pytest.fixture
def files(tmp_path: Path):
    """A sandbox's OutputFiles on tmp_path/out, with a clock the test moves: (the files, the directory, the clock)."""
    (tmp_path / "out").mkdir()
    clock = [100.0]
    files = OutputFiles(clock=lambda: clock[0])
    files.open(PidDisk(tmp_path))   # type: ignore[arg-type]
    yield files, tmp_path / "out", clock
    files.close()


def test_finished_outputs_go_a_few_at_a_time_or_once_a_sweep_is_due(files) -> None:
    files, path, clock = files
    files.housekeeping()   # (a sweep: the next is due TRIM_EVERY_S later)
    names = [output(path, f"1.{n}", KiB) for n in range(SETTLE_AT)]
    for name in names[:-1]:
        files.finished(f"/.pid/out/{name}", kept=False)
        files.housekeeping()
    assert sorted(os.listdir(path)) == sorted(names)   # back-to-back commands: they wait for more...
    files.finished(f"/.pid/out/{names[-1]}", kept=False)
    files.housekeeping()
    assert os.listdir(path) == []                      # ...and go together
    files.finished("/.pid/out/" + output(path, "1.9", KiB), kept=False)
    files.housekeeping()
    assert os.listdir(path) == ["1.9"]
    clock[0] += TRIM_EVERY_S                           # commands a second apart: each goes at the next one's start
    files.housekeeping()
    assert os.listdir(path) == []


def test_a_trimmed_output_goes_with_its_record(files) -> None:
    files, path, clock = files
    output(path, "2.1", 3 * STEP)
    assert files.trim("2.1", 64 * KiB) == 2 * STEP
    assert sorted(os.listdir(path)) == ["2.1", "2.1.cut"]
    files.finished("/.pid/out/2.1", kept=False)
    clock[0] += TRIM_EVERY_S
    files.housekeeping()
    assert os.listdir(path) == []
