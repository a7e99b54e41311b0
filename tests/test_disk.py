"""Per-job disks (pid.sandbox.disk): real sparse images, real ext4, real loop mounts, all under tmp_path."""
from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pid.sandbox import disk as disk_mod
from pid.sandbox.disk import DiskError, JobDisk, disks_supported, parse_size, reap_disks
from tests.services import missing

# Real loop-mounted disks need root and the host's loop devices, like the engine. One xdist worker runs them one
# after another: a test here calls sync(2), which would flush another's page cache that is meant to stay unwritten.
pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("disks")]

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
GiB = 1 << 30

UNSUPPORTED = disks_supported()


@pytest.fixture
def _disks() -> None:
    """Skipped where per-job disks cannot be made (failed, in CI: tests/services.py)."""
    if UNSUPPORTED is not None:
        missing(f"per-job disks unavailable here: {UNSUPPORTED}")


needs_disks = pytest.mark.usefixtures("_disks")

LAYOUT = {"workspace": (1000, 1000, 0o755), "home": (1000, 1000, 0o755),
          "tmp": (0, 0, 0o1777), "pid": (0, 0, 0o711)}


def _unescape(field: str) -> str:
    return disk_mod._unescape_mountinfo(field)


def mounts() -> set[str]:
    with open("/proc/mounts", encoding="utf-8") as f:
        return {_unescape(line.split()[1]) for line in f}


def mount_options(path: str) -> set[str]:
    with open("/proc/mounts", encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if _unescape(parts[1]) == path:
                return set(parts[3].split(","))
    raise AssertionError(f"{path} is not mounted")


def loops_backed_by(image: str) -> list[str]:
    """Loop devices whose backing file is `image` (deleted or not)."""
    found = []
    for dev in Path("/sys/block").glob("loop*"):
        try:
            backing = (dev / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue
        if backing == image or backing == image + " (deleted)":
            found.append(dev.name)
    return found


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture
def root(tmp_path: Path):
    """A private disk root; whatever a failing test left mounted under it is lazily unmounted afterwards."""
    path = tmp_path / "disks"
    yield str(path)
    real = os.path.realpath(path)
    for mp in sorted((m for m in mounts() if m.startswith(real + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], capture_output=True, timeout=30)


# --- parse_size -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("10g", 10 * GiB), ("10G", 10 * GiB), ("300m", 300 * MiB), ("512k", 512 * 1024), ("1.5G", 3 * GiB // 2),
    ("1048576", MiB), ("1", 1), (" 2m ", 2 * MiB), ("2MiB", 2 * MiB), ("2mb", 2 * MiB), ("1t", 1 << 40),
    (".5k", 512), ("0.5m", MiB // 2),
])
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "   ", "g", "abc", "10x", "10 gg", "-1", "-1g", "0", "0k", "0.0g", "1.5",
                                  "1e9", "1,5g", "10g10", "inf", "nan", "0.0001k"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_disks_supported_explains_missing_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disk_mod.os, "geteuid", lambda: 1000)
    if not sys.platform.startswith("linux"):
        pytest.skip("not Linux")
    reason = disks_supported()
    assert reason is not None and "root" in reason and "--disk 0" in reason


# --- create / layout ------------------------------------------------------------------------------------------

@needs_disks
def test_create_mounts_sparse_fs_with_layout(root: str) -> None:
    d = JobDisk.create(root, "job1", parse_size("1g"), layout={**LAYOUT, "workspace/sub": (1001, 1002, 0o2750)})
    try:
        assert d.image == os.path.join(os.path.realpath(root), "job1.img")
        assert d.mountpoint == os.path.join(os.path.realpath(root), "job1")
        assert d.size == GiB
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
        img = os.stat(d.image)
        assert stat.S_IMODE(img.st_mode) == 0o600
        assert img.st_size == GiB
        assert img.st_blocks * 512 < 32 * MiB, "image should be sparse"
        assert d.mountpoint in mounts()
        # noinit_itable: no background zeroing of inode tables, i.e. no hidden host writes
        assert {"nosuid", "nodev", "noinit_itable"} <= mount_options(d.mountpoint)
        vfs = os.statvfs(d.mountpoint)
        assert 0.9 * GiB < vfs.f_blocks * vfs.f_frsize <= GiB
        for rel, (uid, gid, mode) in {**LAYOUT, "workspace/sub": (1001, 1002, 0o2750)}.items():
            st = os.lstat(d.path(rel))
            assert stat.S_ISDIR(st.st_mode), rel
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (uid, gid, mode), rel
        assert d.path("workspace") == os.path.join(d.mountpoint, "workspace")
        assert not d.closed
    finally:
        d.close()


@needs_disks
@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", ".hidden", "x.img", "a b", "x" * 201])
def test_create_rejects_bad_names(root: str, name: str) -> None:
    with pytest.raises(DiskError, match="invalid disk name"):
        JobDisk.create(root, name, 64 * MiB)


@needs_disks
@pytest.mark.parametrize("rel", ["/abs", "../up", "a/../b", "a//b", "", ".", "a/"])
def test_create_rejects_bad_layout(root: str, rel: str) -> None:
    with pytest.raises(DiskError, match="invalid layout directory"):
        JobDisk.create(root, "job", 64 * MiB, layout={rel: (0, 0, 0o755)})
    assert not os.path.exists(os.path.join(root, "job.img"))


@needs_disks
def test_create_refuses_shared_root(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(DiskError, match="writable by nobody else"):
        JobDisk.create(str(shared), "job", 64 * MiB)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(DiskError, match="symlink"):
        JobDisk.create(str(link), "job", 64 * MiB)
    assert list((tmp_path / "elsewhere").iterdir()) == []


@needs_disks
def test_create_failure_undoes_everything(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # mkfs fails on a 1-byte image
    with pytest.raises(DiskError, match="mkfs.ext4"):
        JobDisk.create(root, "tiny", 1)
    assert os.listdir(root) == []

    # a failure after the mount (creating the layout) unmounts and removes again
    def boom(*args, **kwargs):
        raise PermissionError(errno.EPERM, "injected")
    monkeypatch.setattr(disk_mod.os, "fchown", boom)
    with pytest.raises(DiskError, match="injected"):
        JobDisk.create(root, "late", 64 * MiB, layout=LAYOUT)
    monkeypatch.undo()
    real = os.path.realpath(root)
    assert not any(m.startswith(real + "/") for m in mounts())
    assert os.listdir(root) == []
    assert wait_for(lambda: not loops_backed_by(os.path.join(real, "late.img")))


@needs_disks
def test_create_refuses_name_in_use(root: str) -> None:
    live = JobDisk.create(root, "job", 64 * MiB, layout=LAYOUT)
    try:
        Path(live.path("workspace"), "keep").write_text("x")
        with pytest.raises(DiskError, match="already exists"):
            JobDisk.create(root, "job", 64 * MiB)
        assert live.mountpoint in mounts()
        assert Path(live.path("workspace"), "keep").read_text() == "x"
    finally:
        live.close()


# --- the size bound ---------------------------------------------------------------------------------------------

def _fill(path: str, limit: int) -> tuple[int, int]:
    """Write 1 MiB blocks into `path` until ENOSPC or `limit`; returns (bytes written, errno or 0)."""
    block = b"\xa5" * MiB
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        while written < limit:
            try:
                written += os.write(fd, block)
            except OSError as exc:
                return written, exc.errno
        return written, 0
    finally:
        try:
            os.fsync(fd)
        except OSError:
            pass
        os.close(fd)


def _fill_as(uid: int, gid: int, path: str, limit: int) -> tuple[int, int]:
    """_fill in a forked child that dropped to uid/gid, so root's reserved blocks are not available to it.

    The child enters the directory while still root: the disk root is 0700, as in production, where the agent
    only reaches its directories through the container's bind mounts.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no pytest machinery from here on, always _exit
        code = 1
        try:
            os.close(r)
            os.chdir(os.path.dirname(path))
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            written, err = _fill(os.path.basename(path), limit)
            os.write(w, f"{written} {err}".encode())
            code = 0
        except BaseException as exc:  # noqa: BLE001
            os.write(w, repr(exc).encode())
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"writer child failed: {out!r}"
    written, err = map(int, out.split())
    return written, err


@needs_disks
def test_writes_are_bounded_and_root_keeps_a_reserve(root: str) -> None:
    size = parse_size("300m")
    d = JobDisk.create(root, "full", size, layout=LAYOUT)
    try:
        user_written, user_err = _fill_as(1000, 1000, os.path.join(d.path("workspace"), "big"), GiB)
        assert user_err == errno.ENOSPC, f"unprivileged writer stopped with errno {user_err} after {user_written}"
        assert 200 * MiB < user_written < size

        root_written, root_err = _fill(os.path.join(d.path("pid"), "patch"), GiB)
        assert root_err == errno.ENOSPC
        # 5% of 300 MiB is 15 MiB: root (pid's own machinery) can still write its patch after the agent filled up
        assert 8 * MiB < root_written < 20 * MiB, root_written
        assert user_written + root_written < size

        os.sync()
        used = os.stat(d.image).st_blocks * 512
        assert used < 310 * MiB, f"image uses {used / MiB:.1f} MiB of host disk"
        assert used > 250 * MiB, "the data should really have landed in the image"
    finally:
        d.close()


# --- close -----------------------------------------------------------------------------------------------------

@needs_disks
def test_close_is_idempotent_and_removes_everything(root: str) -> None:
    d = JobDisk.create(root, "job", 256 * MiB, layout=LAYOUT)
    Path(d.path("workspace"), "file").write_bytes(b"x" * MiB)
    assert d.mountpoint in mounts() and loops_backed_by(d.image)
    d.close()
    assert d.closed
    assert d.mountpoint not in mounts()
    assert not os.path.lexists(d.mountpoint)
    assert not os.path.lexists(d.image)
    assert os.listdir(root) == []
    assert wait_for(lambda: not loops_backed_by(d.image)), "loop device left attached"
    d.close()  # again: no error, nothing to do
    with JobDisk.create(root, "job", 256 * MiB) as again:  # the name is free again; context manager closes
        assert again.mountpoint in mounts()
    assert os.listdir(root) == []


@needs_disks
def test_close_releases_the_lock(root: str) -> None:
    import fcntl
    d = JobDisk.create(root, "job", 64 * MiB)
    fd = os.open(d.image, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert os.get_inheritable(d._lock_fd) is False
        d.close()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free now
    finally:
        os.close(fd)
        d.close()


@needs_disks
def test_close_of_busy_mount_unmounts_lazily(root: str) -> None:
    d = JobDisk.create(root, "busy", 64 * MiB, layout=LAYOUT)
    Path(d.path("workspace"), "f").write_text("hello")
    holder = subprocess.Popen(["sleep", "300"], cwd=d.path("workspace"))
    try:
        # a plain umount really fails: this is what makes the test meaningful
        plain = subprocess.run(["umount", d.mountpoint], capture_output=True, timeout=30)
        assert plain.returncode != 0 and d.mountpoint in mounts()

        d.close()
        assert d.mountpoint not in mounts()
        assert not os.path.lexists(d.mountpoint) and not os.path.lexists(d.image)
        assert loops_backed_by(d.image), "the filesystem should live on while a process is inside"
        with pytest.raises(OSError) as err:  # ... but it was shut down: its contents are gone for good
            Path(f"/proc/{holder.pid}/cwd/f").read_text()
        assert err.value.errno == errno.EIO
    finally:
        holder.kill()
        holder.wait()
    assert wait_for(lambda: not loops_backed_by(d.image)), "loop device not released after the last user left"


@needs_disks
def test_discard_drops_unflushed_data_instead_of_writing_it_to_the_host(root: str) -> None:
    """Up to three disks: the kernel's own writeback may flush part of one while it is measured (seen in CI, with
    the other tests' writes past the machine's dirty-page threshold: 28 of 128 MiB); a discard that did not work
    writes all of every one."""
    written = []
    for n in range(3):
        d = JobDisk.create(root, f"job{n}", 1 * GiB, layout=LAYOUT)
        try:
            with open(d.path("workspace") + "/dirty", "wb") as f:
                f.write(b"\x5a" * (128 * MiB))        # in the page cache, not yet in the image
            before = os.stat(d.image).st_blocks * 512
            assert disk_mod._discard(d.mountpoint, d.image)
            with pytest.raises(OSError) as err:
                Path(d.path("workspace"), "more").write_text("x")
            assert err.value.errno == errno.EIO
            assert disk_mod._unmount(d.mountpoint)
            os.sync()
            written.append((os.stat(d.image).st_blocks * 512 - before) / MiB)
        finally:
            d.close()
        assert not os.path.lexists(d.image) and os.listdir(root) == []
        if written[-1] < 16:
            return
    raise AssertionError(f"unmount wrote {', '.join(f'{w:.0f}' for w in written)} MiB into the images")


@needs_disks
def test_discard_only_hits_the_disks_own_filesystem(root: str) -> None:
    a = JobDisk.create(root, "a", 64 * MiB, layout=LAYOUT)
    b = JobDisk.create(root, "b", 64 * MiB, layout=LAYOUT)
    try:
        assert not disk_mod._discard(a.mountpoint, b.image)          # a's fs is not backed by b's image
        assert not disk_mod._discard(a.path("workspace"), a.image)   # not a mount point
        # (deliberately no case on a host directory: a broken guard there would shut down the host's filesystem)
        for d in (a, b):
            Path(d.path("workspace"), "ok").write_text("still fine")
            assert Path(d.path("workspace"), "ok").read_text() == "still fine"
    finally:
        a.close()
        b.close()


# --- reap_disks ------------------------------------------------------------------------------------------------

CHILD = """
import sys, time
from pid.sandbox.disk import JobDisk

d = JobDisk.create(sys.argv[1], sys.argv[2], 64 << 20, layout={"workspace": (1000, 1000, 0o755)})
open(d.path("workspace") + "/data", "w").write("orphan")
print("ready", flush=True)
time.sleep(300)
"""


def _orphan(root: str, name: str) -> None:
    """Create a disk in a child process and SIGKILL it: mount and image stay behind, the lock is released."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, root, name], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env, text=True)
    try:
        line = child.stdout.readline()
        assert line.strip() == "ready", child.stderr.read() if child.poll() is not None else line
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        child.stderr.close()


@needs_disks
def test_reap_removes_orphans_but_not_live_disks(root: str, tmp_path: Path) -> None:
    live = JobDisk.create(root, "live", 64 * MiB, layout=LAYOUT)
    try:
        _orphan(root, "orphan")
        real = os.path.realpath(root)
        orphan_mp, orphan_img = os.path.join(real, "orphan"), os.path.join(real, "orphan.img")
        assert orphan_mp in mounts() and os.path.exists(orphan_img), "SIGKILL should leave the disk behind"
        os.mkdir(os.path.join(root, "stray"))              # a mount point whose image is gone

        # things nobody of ours made: never followed, never removed
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "victim").write_text("keep")
        os.symlink(outside / "victim", os.path.join(root, "evil.img"))
        os.symlink(outside, os.path.join(root, "evil"))

        reaped = reap_disks(root)
        assert sorted(reaped) == ["orphan", "stray"]
        assert orphan_mp not in mounts()
        assert not os.path.lexists(orphan_mp) and not os.path.lexists(orphan_img)
        assert not os.path.lexists(os.path.join(root, "stray"))
        assert wait_for(lambda: not loops_backed_by(orphan_img))

        assert (outside / "victim").read_text() == "keep"
        assert os.path.islink(os.path.join(root, "evil.img")) and os.path.islink(os.path.join(root, "evil"))

        assert live.mountpoint in mounts() and os.path.exists(live.image)
        Path(live.path("workspace"), "still").write_text("writable")
        assert reap_disks(root) == []                      # nothing left to reap; live still untouched
        assert live.mountpoint in mounts()
    finally:
        live.close()
    assert sorted(os.listdir(root)) == ["evil", "evil.img"]


@needs_disks
def test_reap_lazily_unmounts_a_busy_orphan(root: str) -> None:
    _orphan(root, "orphan")
    real = os.path.realpath(root)
    mp, img = os.path.join(real, "orphan"), os.path.join(real, "orphan.img")
    holder = subprocess.Popen(["sleep", "300"], cwd=os.path.join(mp, "workspace"))
    try:
        assert reap_disks(root) == ["orphan"]
        assert mp not in mounts() and not os.path.lexists(mp) and not os.path.lexists(img)
        assert loops_backed_by(img)
    finally:
        holder.kill()
        holder.wait()
    assert wait_for(lambda: not loops_backed_by(img))


@needs_disks
def test_reap_leaves_an_image_replaced_between_open_and_lock(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The image reap opened was closed and its name reused before the lock: the new one is not reaped."""
    _orphan(root, "job")
    img = os.path.join(os.path.realpath(root), "job.img")
    real_flock = disk_mod.fcntl.flock
    swapped = []

    def flock(fd, op):
        if not swapped:
            swapped.append(True)
            Path(img + ".new").write_bytes(b"")
            os.replace(img + ".new", img)      # as if the old disk was closed and a new job took the name
        return real_flock(fd, op)
    monkeypatch.setattr(disk_mod.fcntl, "flock", flock)
    assert reap_disks(root) == []
    assert os.path.exists(img) and os.path.join(os.path.realpath(root), "job") in mounts()
    monkeypatch.undo()
    os.unlink(img)
    assert reap_disks(root) == ["job"]                  # now a stray mount point: cleaned
    assert os.listdir(root) == []


@needs_disks
def test_create_survives_a_reap_between_open_and_lock(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real_flock = disk_mod.fcntl.flock
    calls = []

    def flock(fd, op):
        calls.append(op)
        if len(calls) == 1:
            os.unlink(os.path.join(os.path.realpath(root), "job.img"))   # what a racing reap_disks would do
        return real_flock(fd, op)
    monkeypatch.setattr(disk_mod.fcntl, "flock", flock)
    d = JobDisk.create(root, "job", 64 * MiB)
    monkeypatch.undo()
    try:
        assert len(calls) == 2
        assert os.path.exists(d.image) and d.mountpoint in mounts()
        assert disk_mod._same_file(d._lock_fd, d.image)
    finally:
        d.close()


@needs_disks
def test_create_waits_out_a_reap_that_locked_the_new_image_first(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reap took the brand-new image's lock before its creator: the creator's lock is refused, and the name is
    still taken until the reap has removed it (CI saw "disk ... already exists" here). The creator waits for that."""
    import threading
    real_flock = disk_mod.fcntl.flock
    calls = []

    def flock(fd, op):
        calls.append(op)
        if len(calls) == 1:
            image = os.path.join(os.path.realpath(root), "job.img")
            reaper = os.open(image, os.O_RDONLY)
            real_flock(reaper, disk_mod.fcntl.LOCK_EX)   # as _reap_image holds it...

            def finish() -> None:   # ...while it shuts the new disk down, then removes it
                time.sleep(0.2)
                os.unlink(image)
                os.close(reaper)
            threading.Thread(target=finish).start()
        return real_flock(fd, op)
    monkeypatch.setattr(disk_mod.fcntl, "flock", flock)
    d = JobDisk.create(root, "job", 64 * MiB)
    monkeypatch.undo()
    try:
        assert len(calls) == 2
        assert os.path.exists(d.image) and d.mountpoint in mounts()
        assert disk_mod._same_file(d._lock_fd, d.image)
    finally:
        d.close()


def test_reap_missing_root_is_empty(tmp_path: Path) -> None:
    assert reap_disks(str(tmp_path / "nope")) == []


@needs_disks
@pytest.mark.parametrize("pooled", [False, True])
def test_a_retried_job_clears_the_disk_its_lost_attempt_left(root: str, monkeypatch, pooled: bool) -> None:
    """compose-smoke at e32d019: a killed worker's job ran again on the other replica, but its first attempt's disk
    stayed mounted (the sweep that requeued it ran in a client with another PID_HOME). The retry clears it, with a
    warm pool as without."""
    from pid.sandbox import docker_sandbox
    from pid.worker.warm_pool import PooledProvider, WarmPool
    _orphan(root, "job-lost-a1b2c3")
    real = os.path.realpath(root)
    assert os.path.join(real, "job-lost-a1b2c3") in mounts()
    monkeypatch.setattr(docker_sandbox, "default_disk_root", lambda: root)
    provider = PooledProvider(WarmPool(1)) if pooled else docker_sandbox.DockerProvider()   # (the pool not started)
    provider.clear_job("job-lost")
    assert not [m for m in mounts() if m.startswith(real + "/")]
    assert not os.path.lexists(os.path.join(real, "job-lost-a1b2c3.img"))
