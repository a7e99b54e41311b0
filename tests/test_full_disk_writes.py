"""A write the job's disk cannot hold leaves the file as it was: a write truncates the file first, and one that then
failed for room left it empty (a new user's: the job ended completed, its patch emptying two source files)."""
from __future__ import annotations

import errno

import pytest

from pid.sandbox import DockerSandbox, SandboxConfig
from tests.conftest import IMAGE, RUNTIME

pytestmark = pytest.mark.docker

OLD = b"def add(a, b):\n    return a + b\n" * 100   # 3.3 KB


@pytest.fixture
def full_box():
    box = DockerSandbox.create(SandboxConfig(image=IMAGE, job_id="test-full-disk", disk=32 << 20, runtime=RUNTIME))
    try:
        box.write_file("calc.py", OLD)
        box.write_file("big.txt", b"x" * (300 << 10))
        done = box.exec("dd if=/dev/zero of=/tmp/fill bs=1M 2>/dev/null; dd if=/dev/zero of=/tmp/fill2 bs=4k "
                        "2>/dev/null; stat -f -c '%a %S' /workspace", timeout=60)
        free = [int(n) for n in done.tail.split()]
        assert free[0] * free[1] < 64 << 10, done.tail   # (nothing left to speak of)
        yield box
    finally:
        box.close()


@pytest.mark.parametrize("size", [40 << 10, 200 << 10])   # in the command itself, and uploaded
def test_a_write_the_disk_cannot_hold_leaves_the_file_as_it_was(full_box, size):
    with pytest.raises(OSError) as refused:
        full_box.write_file("calc.py", b"y" * size)
    assert refused.value.errno == errno.ENOSPC
    assert full_box.read_file("calc.py") == OLD


def test_a_write_that_fits_in_what_the_old_content_frees_still_goes_through(full_box):
    full_box.write_file("big.txt", b"z" * (100 << 10))
    assert full_box.read_file("big.txt") == b"z" * (100 << 10)
