"""Per-job filesystems of a fixed size: the one bound on everything a job's container can write.

Docker's `storage_opt size` needs xfs/quota support that overlay2-on-ext4 hosts lack, and bind mounts are not
covered by it anyway. So each job gets its own ext4 filesystem in a sparse image file, loop-mounted on the host;
the container only gets bind mounts of directories inside it. The agent can write at most SIZE (minus the 5%
reserved for root, so pid's own root-run machinery can still write the patch after the agent filled the disk),
and the host loses at most SIZE of disk, whatever the agent does.

Layout under `root` (e.g. PID_HOME/disks, mode 0700):

    root/<name>.img   sparse image, flock'ed exclusively by its owner for as long as the disk lives
    root/<name>/      its mount point

The lock is what tells a live disk from an orphan: a worker that died (even SIGKILL) releases it, and
`reap_disks` then unmounts and removes what was left behind.

Safety rules: the mounted filesystem's contents are written by an untrusted container, so nothing here ever
walks into it after the job started: close and reap just unmount and `rmdir` the (then empty) mount point.
Layout directories are created right after mounting, before any container exists, relative to a directory
fd opened with O_NOFOLLOW.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Callable

log = logging.getLogger(__name__)

TIMEOUT = 30.0                     # seconds for mkfs / mount / umount -l
LOST_TRIES, LOST_WAIT_S = 40, 0.05  # a new image a concurrent reap took: how long its removal is waited for
UMOUNT_TIMEOUT = 60.0              # a plain umount may have to flush dirty pages into the image first
RESERVED_PERCENT = 5   # blocks only root can use: pid's machinery still writes after the agent filled the disk
IMAGE_SUFFIX = ".img"
# Where root's tools live, for workers started with a PATH that lacks the sbin directories.
_FALLBACK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]?)(?:i?b)?\s*$", re.IGNORECASE)
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}$")


class DiskError(Exception):
    """Setting up a per-job disk failed; the message says what to do about it."""


def parse_size(text: str) -> int:
    """'10g', '300m', '512k', '1.5G', '1048576' (bytes) -> bytes; binary units (k=1024), optional 'b'/'ib' suffix.

    Why strict: the size is a security bound typed by a human; '10' silently meaning 10 bytes or '10x' meaning
    anything at all would be worse than an error.
    """
    match = _SIZE_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"invalid size {text!r}: expected a number with an optional unit k, m, g, t or p "
                         f"(binary: 1k = 1024 bytes), e.g. '10g', '300m', '1.5G' or '1048576'")
    number, unit = match.group(1), match.group(2).lower()
    try:
        value = Decimal(number)
    except InvalidOperation:  # pragma: no cover - the regex only lets decimals through
        raise ValueError(f"invalid size {text!r}") from None
    if unit == "" and value != value.to_integral_value():
        raise ValueError(f"invalid size {text!r}: a size without a unit is in bytes and must be a whole number")
    size = int(value * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"invalid size {text!r}: must be more than 0 bytes")
    return size


def format_size(n: int) -> str:
    """Bytes as the shortest exact size parse_size reads back: 10737418240 -> '10g'."""
    for unit, shift in (("t", 40), ("g", 30), ("m", 20), ("k", 10)):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def _which(tool: str) -> str | None:
    return shutil.which(tool, path=os.pathsep.join(filter(None, [os.environ.get("PATH"), _FALLBACK_PATH])))


def disks_supported() -> str | None:
    """None when per-job disks can be made here (root, Linux, mkfs.ext4, mount and loop devices); else the reason.

    Why: lets the worker fail fast at start-up with an actionable message instead of failing every job.
    """
    if not sys.platform.startswith("linux"):
        return f"per-job disks need Linux (loop-mounted ext4), not {sys.platform}; pass --disk 0"
    if os.geteuid() != 0:
        return "per-job disks need root (mount); run the worker as root or pass --disk 0"
    for tool, package in (("mkfs.ext4", "e2fsprogs"), ("mount", "util-linux"), ("umount", "util-linux")):
        if _which(tool) is None:
            return f"per-job disks need {tool} (install {package}) or pass --disk 0"
    if not os.path.exists("/dev/loop-control"):
        return "per-job disks need loop devices but /dev/loop-control is missing (modprobe loop) or pass --disk 0"
    return None


def _run(tool: str, *args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """Run a tool by absolute path, no shell, bounded; raises OSError/CalledProcessError/TimeoutExpired."""
    exe = _which(tool)
    if exe is None:
        raise FileNotFoundError(errno.ENOENT, f"{tool} not found on PATH or in {_FALLBACK_PATH}", tool)
    return subprocess.run([exe, *args], check=True, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        out = (exc.stderr or exc.stdout or b"").decode(errors="replace").strip()
        return f"{os.path.basename(str(exc.cmd[0]))} exited {exc.returncode}: {out or '(no output)'}"
    if isinstance(exc, subprocess.TimeoutExpired):
        return f"{os.path.basename(str(exc.cmd[0]))} timed out after {exc.timeout:g}s"
    return f"{type(exc).__name__}: {exc}"


def _unescape_mountinfo(field_: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_)


def _is_mounted(path: str) -> bool:
    """Is `path` a mount point in our mount namespace? Reads mountinfo; never touches the path itself."""
    path = os.path.abspath(path)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            return any(len(parts := line.split(" ")) > 4 and _unescape_mountinfo(parts[4]) == path for line in f)
    except OSError:  # no /proc: fall back on the device-change test (lstat based, so no symlink following)
        return os.path.ismount(path)


_EXT4_IOC_SHUTDOWN = 0x8004587D        # _IOR('X', 125, __u32)
_EXT4_GOING_FLAGS_NOLOGFLUSH = 2
_EXT4_ROOT_INO = 2


def _loop_backing_file(dev: int) -> str | None:
    try:
        with open(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/loop/backing_file", encoding="utf-8",
                  errors="surrogateescape") as f:
            return f.read().rstrip("\n").removesuffix(" (deleted)")
    except OSError:
        return None


def _discard(mountpoint: str, image: str) -> bool:
    """Shut the filesystem down without flushing (EXT4_IOC_SHUTDOWN, NOLOGFLUSH); True if done.

    Why: a plain unmount first writes every dirty page into the image we are about to delete (~0.7 s and 200 MB
    of host writes for 200 MB of unsynced job output); after a shutdown it takes ~30 ms and writes nothing.
    Processes still inside get EIO from then on, which is fine: the job is over.
    Guarded hard, because the same ioctl on the host's own filesystem would take the host down: it is only
    issued on a directory fd (O_NOFOLLOW) that is the root inode of a loop device backed by exactly `image`.
    """
    if not _is_mounted(mountpoint):
        return False
    try:
        fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if st.st_ino != _EXT4_ROOT_INO or _loop_backing_file(st.st_dev) != image:
            return False
        fcntl.ioctl(fd, _EXT4_IOC_SHUTDOWN, _EXT4_GOING_FLAGS_NOLOGFLUSH.to_bytes(4, sys.byteorder))
        return True
    except OSError as exc:
        log.info("cannot shut down %s before unmounting (it will be flushed instead): %s", mountpoint, exc)
        return False
    finally:
        os.close(fd)


def _unmount(mountpoint: str, *, lazy_only: bool = False) -> bool:
    """Unmount, lazily when busy (or when asked to); True when `mountpoint` is no longer a mount point.

    A lazy unmount detaches the filesystem at once; it lives on (and its loop device with it) until the last
    process inside it leaves, then the loop device auto-detaches because mount(8) set it up with autoclear.
    """
    if not _is_mounted(mountpoint):
        return True
    attempts = (["-l"],) if lazy_only else ([], ["-l"])
    for extra in attempts:
        try:
            _run("umount", *extra, mountpoint, timeout=TIMEOUT if extra else UMOUNT_TIMEOUT)
        except (OSError, subprocess.SubprocessError) as exc:
            log.info("umount %s %s failed: %s", " ".join(extra), mountpoint, _describe(exc))
        if not _is_mounted(mountpoint):
            return True
    log.warning("cannot unmount %s; leaving it and its directory in place", mountpoint)
    return False


def _rmdir(path: str) -> None:
    _remove(os.rmdir, path, "mount point")


def _unlink(path: str) -> None:
    _remove(os.unlink, path, "disk image")


def _remove(remove: Callable[[str], None], path: str, what: str) -> None:
    try:
        remove(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot remove %s %s: %s", what, path, exc)


def _same_file(fd: int, path: str) -> bool:
    """Does `path` (not followed) still name the file open as `fd`? Guards against a concurrent reap/replace."""
    try:
        st, cur = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return st.st_nlink > 0 and (st.st_dev, st.st_ino) == (cur.st_dev, cur.st_ino)


def _prepare_root(root: str) -> str:
    """Create `root` 0700 if missing; refuse one that others could plant symlinks or files in."""
    root = os.path.abspath(root)
    try:
        if not os.path.lexists(root):
            os.makedirs(root, mode=0o700, exist_ok=True)
            os.chmod(root, 0o700, follow_symlinks=False)
        st = os.lstat(root)
    except OSError as exc:
        raise DiskError(f"cannot create the disk directory {root}: {exc}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise DiskError(f"disk directory {root} is not a directory (or is a symlink); remove it")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise DiskError(f"disk directory {root} must be owned by uid {os.geteuid()} and writable by nobody else "
                        f"(it is uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); chmod 700 it")
    # mount(8) records the canonical path in mountinfo; work with the same spelling everywhere.
    return os.path.realpath(root)


def _check_rel(rel: str) -> list[str]:
    parts = rel.split("/") if isinstance(rel, str) else []
    if not parts or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise DiskError(f"invalid layout directory {rel!r}: must be a relative path without '.', '..' or '//'")
    return parts


def _make_layout(mountpoint: str, layout: dict[str, tuple[int, int, int]]) -> None:
    """Create each layout directory with exact owner and mode, through O_NOFOLLOW directory fds.

    Parents are created first (sorted), missing intermediate ones as root 0755. A directory that already exists
    (lost+found, or a parent listed earlier) is reused only if it really is a directory, never via a symlink.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    top = os.open(mountpoint, flags)
    try:
        os.fchmod(top, 0o755)
        for rel in sorted(layout, key=lambda r: r.count("/")):
            uid, gid, mode = layout[rel]
            parts = _check_rel(rel)
            fds: list[int] = []
            try:
                parent = top
                for i, part in enumerate(parts):
                    last = i == len(parts) - 1
                    try:
                        os.mkdir(part, 0o700, dir_fd=parent)
                        created = True
                    except FileExistsError:
                        created = False
                    fds.append(os.open(part, flags, dir_fd=parent))
                    parent = fds[-1]
                    if last:
                        os.fchown(parent, uid, gid)
                        os.fchmod(parent, mode)   # after chown: chown clears setuid/setgid bits
                    elif created:
                        os.fchmod(parent, 0o755)
            finally:
                for fd in fds:
                    os.close(fd)
    finally:
        os.close(top)


@dataclass
class JobDisk:
    """One job's filesystem: a sparse ext4 image loop-mounted on the host, locked by its owner while it lives."""

    image: str          # the sparse image file
    mountpoint: str     # where it is mounted on the host
    size: int
    _lock_fd: int = field(default=-1, repr=False, compare=False)

    @classmethod
    def create(cls, root: str, name: str, size: int, *,
               layout: dict[str, tuple[int, int, int]] | None = None) -> "JobDisk":
        """Create root/<name>.img (sparse) and mount it at root/<name>/, then create the `layout` directories in it.

        `layout` maps relative directory names to (uid, gid, mode), e.g. {"workspace": (1000, 1000, 0o755),
        "tmp": (0, 0, 0o1777)}. The exclusive flock on the image (fd is O_CLOEXEC, so containers and tools never
        inherit it) lasts for the object's life: it is how reap_disks tells this live disk from an orphan.
        On any failure everything done so far is undone and DiskError is raised.
        """
        reason = disks_supported()
        if reason is not None:
            raise DiskError(reason)
        if not isinstance(name, str) or not _NAME_RE.match(name) or name.endswith(IMAGE_SUFFIX):
            raise DiskError(f"invalid disk name {name!r}: use letters, digits, '_', '-', '.' (not first), "
                            f"at most 200 characters, not ending in {IMAGE_SUFFIX}")
        if not isinstance(size, int) or size <= 0:
            raise DiskError(f"invalid disk size {size!r}: must be a positive number of bytes")
        layout = dict(layout or {})
        for rel in layout:
            _check_rel(rel)
        root = _prepare_root(root)
        image, mountpoint = os.path.join(root, name + IMAGE_SUFFIX), os.path.join(root, name)

        fd = -1
        lost = False
        for _ in range(LOST_TRIES):  # a reap_disks running right between our open and flock may take the new file
            try:                     # away: it is then removing it, and the name is ours again once it has
                fd = os.open(image, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                if lost:
                    time.sleep(LOST_WAIT_S)
                    continue
                raise DiskError(f"disk {image} already exists: another job uses the name {name!r}, "
                                f"or a dead worker left it (reap_disks cleans those up)") from None
            except OSError as exc:
                raise DiskError(f"cannot create disk image {image}: {exc}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                fd, lost = -1, True
                continue
            if _same_file(fd, image):
                break
            os.close(fd)
            fd = -1
        if fd < 0:
            raise DiskError(f"cannot lock new disk image {image}: it kept being removed by a concurrent reap; retry")

        disk = cls(image=image, mountpoint=mountpoint, size=size, _lock_fd=fd)
        mounted = made_dir = False
        try:
            os.ftruncate(fd, size)
            _run("mkfs.ext4", "-q", "-F", "-m", str(RESERVED_PERCENT), "-O", "^has_journal",
                 "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", image)
            try:
                os.mkdir(mountpoint, 0o700)
            except FileExistsError:
                raise DiskError(f"mount point {mountpoint} already exists (left by a dead worker?); "
                                f"reap_disks removes it") from None
            made_dir = True
            # noinit_itable: no background zeroing of inode tables (~160 MB of host writes for a 10G disk).
            _run("mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noinit_itable", image, mountpoint)
            mounted = True
            _make_layout(mountpoint, layout)
        except BaseException as exc:
            if mounted and not _unmount(mountpoint, lazy_only=True):
                made_dir = False     # still mounted: never rmdir (or walk) it
            if made_dir:
                _rmdir(mountpoint)
            _unlink(image)
            os.close(fd)
            disk._lock_fd = -1
            if isinstance(exc, DiskError):
                raise
            if isinstance(exc, (OSError, subprocess.SubprocessError)):
                raise DiskError(f"cannot set up disk {name!r} ({size} bytes) under {root}: {_describe(exc)}") from exc
            raise
        return disk

    def path(self, rel: str) -> str:
        """Host path of a layout directory (for bind mounts); does not check that it exists."""
        return os.path.join(self.mountpoint, *_check_rel(rel))

    @property
    def closed(self) -> bool:
        return self._lock_fd < 0

    def close(self) -> None:
        """Discard the contents, unmount (lazily if busy), remove the image and the mount point, release the lock.

        Idempotent and never raises: it runs in cleanup paths. Whatever cannot be removed is logged and left for
        reap_disks; the image is unlinked before the lock is released so a reaper never sees a half-closed disk.
        """
        if self._lock_fd < 0:
            return
        try:
            _discard(self.mountpoint, self.image)
            if _unmount(self.mountpoint):
                _rmdir(self.mountpoint)
                _unlink(self.image)
            else:
                log.warning("disk %s stays mounted at %s; its image is kept", self.image, self.mountpoint)
        except Exception:  # noqa: BLE001 - close must never raise
            log.warning("error closing disk %s", self.image, exc_info=True)
        finally:
            fd, self._lock_fd = self._lock_fd, -1
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> "JobDisk":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _reap_image(root: str, name: str) -> bool:
    image, mountpoint = os.path.join(root, name + IMAGE_SUFFIX), os.path.join(root, name)
    try:
        fd = os.open(image, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:  # vanished, or a symlink (ELOOP) that nobody of ours made: leave it
        if exc.errno != errno.ENOENT:
            log.warning("not reaping %s: %s", image, exc)
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            log.warning("not reaping %s: not a regular file", image)
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False            # held: a live disk
        if not _same_file(fd, image):
            return False            # closed or replaced under us
        _discard(mountpoint, image)
        if not _unmount(mountpoint, lazy_only=True):
            return False
        try:
            if stat.S_ISDIR(os.lstat(mountpoint).st_mode):
                _rmdir(mountpoint)
        except FileNotFoundError:
            pass
        _unlink(image)
        return not os.path.lexists(image)
    finally:
        os.close(fd)


def _reap_stray_dir(root: str, name: str) -> bool:
    """A mount point without its image: a worker died between steps. Unmount (lazily) and rmdir, nothing more."""
    mountpoint = os.path.join(root, name)
    if os.path.lexists(mountpoint + IMAGE_SUFFIX):
        return False
    if not _unmount(mountpoint, lazy_only=True):
        return False
    _rmdir(mountpoint)
    return not os.path.lexists(mountpoint)


def reap_disks(root: str) -> list[str]:
    """Clean up disks under `root` whose owner process is gone; returns the names reaped.

    An image whose flock can be taken has no live owner: its filesystem is shut down (see _discard), its mount point
    lazily unmounted and removed, then the image. Mount-point directories without an image are removed as well.
    Disks whose lock is held are never
    touched, entries that vanish mid-scan are skipped, symlinks are never followed.
    """
    try:
        if stat.S_ISLNK(os.lstat(root).st_mode):
            log.warning("not reaping disks under %s: it is a symlink", root)
            return []
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.warning("cannot inspect disk directory %s: %s", root, exc)
        return []
    root = os.path.realpath(root)
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.warning("cannot scan disk directory %s: %s", root, exc)
        return []
    reaped: list[str] = []
    for entry in entries:
        if entry.name.endswith(IMAGE_SUFFIX) and _NAME_RE.match(name := entry.name[:-len(IMAGE_SUFFIX)]):
            try:
                if _reap_image(root, name):
                    reaped.append(name)
            except Exception:  # noqa: BLE001 - one bad entry must not stop the sweep
                log.warning("error reaping disk %s", entry.path, exc_info=True)
    for entry in entries:
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            continue
        if is_dir and _NAME_RE.match(entry.name) and entry.name not in reaped:
            try:
                if _reap_stray_dir(root, entry.name):
                    reaped.append(entry.name)
            except Exception:  # noqa: BLE001
                log.warning("error reaping mount point %s", entry.path, exc_info=True)
    return reaped
