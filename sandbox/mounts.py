"""The few mount operations the image's copy-on-write filesystem needs (sandbox/image_fs.py), on the host, as root.

Why system calls and not mount(8): an *idmapped* bind mount (open_tree, mount_setattr, move_mount; Linux 5.12+, and
overlayfs accepts idmapped layers since 5.19) is what lets the agent's uid own the image's root-owned files without
copying or chowning a single one, and util-linux learned it only in 2.39. The overlay itself is mounted with
mount(8) from the directory its layers are in, so that the option string (at most a page) holds short relative names.
"""
from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import threading
import time

_libc = ctypes.CDLL(None, use_errno=True)
_SYS = {"x86_64": (428, 429, 442), "aarch64": (428, 429, 442)}   # open_tree, move_mount, mount_setattr
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_IDMAP = 0x100000
MNT_DETACH = 2
UID_END = 1 << 32   # ids run 0 .. 2**32 - 2 (-1 means "no id")
TIMEOUT_S = 30.0


class MountError(OSError):
    """A mount the image's filesystem needs could not be made; the message says which and why."""


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _syscalls() -> tuple[int, int, int]:
    machine = os.uname().machine
    if machine not in _SYS:
        raise MountError(errno.ENOSYS, f"the new mount API is not wired for {machine} here")
    return _SYS[machine]


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise MountError(code, f"{what}: {os.strerror(code)}")
    return result


def attach_clone(source: str, target: str, *, userns_fd: int | None = None, read_only: bool = False) -> None:
    """Bind `source` (not its submounts) at `target`, nosuid and nodev; with `userns_fd`, idmapped by that user
    namespace's mapping (what the files' owners look like through this mount)."""
    open_tree, move_mount, mount_setattr = _syscalls()
    fd = _check(_libc.syscall(open_tree, -100, os.fsencode(source), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC),
                f"cannot clone the mount of {source}")
    try:
        flags = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (MOUNT_ATTR_RDONLY if read_only else 0)
        attr = _MountAttr(flags | (MOUNT_ATTR_IDMAP if userns_fd is not None else 0), 0, 0, userns_fd or 0)
        _check(_libc.syscall(mount_setattr, fd, b"", AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)),
               f"cannot {'idmap' if userns_fd is not None else 'set up'} the mount of {source} (Linux 5.12+ "
               "and a filesystem that supports idmapped mounts are needed)")
        _check(_libc.syscall(move_mount, fd, b"", -100, os.fsencode(target), MOVE_MOUNT_F_EMPTY_PATH),
               f"cannot attach {source} at {target}")
    finally:
        os.close(fd)


def mount_overlay(cwd: str, lowers: list[str], target: str, upper: str | None = None,
                  work: str | None = None) -> None:
    """An overlay at `target`: `lowers` top first (names relative to `cwd`), writable into `upper` when given
    (`work` beside it, on the same mount), read-only without."""
    options = ["nosuid", "nodev", "lowerdir=" + ":".join(lowers)]
    if upper is not None:
        options += [f"upperdir={upper}", f"workdir={work}"]
    for name in [*lowers, upper or "", work or "", target]:
        if any(c in name for c in ",:\n\\"):
            raise MountError(errno.EINVAL, f"cannot name {name!r} in overlay options")
    try:
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", ",".join(options), target], cwd=cwd,
                       check=True, capture_output=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or b"").decode(errors="replace").strip().splitlines()
        raise MountError(errno.EINVAL, f"cannot mount the image's overlay at {target}: "
                                       f"{detail[0] if detail else f'mount exited {exc.returncode}'}") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MountError(errno.EIO, f"cannot mount the image's overlay at {target}: {exc}") from None


def detach(target: str) -> None:
    """Lazily unmount `target` (never blocks on a busy mount). Never raises."""
    _libc.umount2(os.fsencode(target), MNT_DETACH)


def swap_map(inside: int, owner: int = 0) -> str:
    """A uid_map/gid_map that swaps `owner` and `inside` and maps every other id to itself: through an idmapped mount
    of it, the image's files of `owner` (root's, usually) are the agent's, and what the agent writes is stored as
    `owner`'s. The same id twice: every id to itself."""
    if not (0 <= inside < UID_END - 1 and 0 <= owner < UID_END - 1):
        raise ValueError(f"no id swap for {inside} and {owner}")
    low, high = sorted((inside, owner))
    lines = [f"{owner} {inside} 1", f"{inside} {owner} 1"] if low != high else []
    for start, end in ((0, low), (low + 1, high), (high + 1, UID_END - 1)) if low != high else ((0, UID_END - 1),):
        if end > start:
            lines.append(f"{start} {start} {end - start}")
    return "\n".join(lines) + "\n"


_userns: dict[tuple[int, int, int, int], int] = {}
_userns_lock = threading.Lock()


def agent_userns(uid: int, gid: int, owner_uid: int = 0, owner_gid: int = 0) -> int:
    """A user namespace fd whose mapping swaps the owner's ids (root's, by default) and the agent's; one per pair and
    process (the fd keeps the namespace alive after its first process is gone)."""
    key = (uid, gid, owner_uid, owner_gid)
    with _userns_lock:
        if key not in _userns:
            _userns[key] = _new_userns(swap_map(uid, owner_uid), swap_map(gid, owner_gid))
        return _userns[key]


def _new_userns(uid_map: str, gid_map: str) -> int:
    """unshare(1) makes the namespace and waits on its stdin; root writes the maps from outside and keeps an fd."""
    mine = os.readlink("/proc/self/ns/user")
    child = subprocess.Popen(["unshare", "--user", "cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while os.readlink(f"/proc/{child.pid}/ns/user") == mine:
            if child.poll() is not None or time.monotonic() > deadline:
                raise MountError(errno.EPERM, "cannot make a user namespace for the agent's idmapped mounts")
            time.sleep(0.001)
        for name, mapping in (("uid_map", uid_map), ("gid_map", gid_map)):
            with open(f"/proc/{child.pid}/{name}", "w") as f:
                f.write(mapping)
        return os.open(f"/proc/{child.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        if isinstance(exc, MountError):
            raise
        raise MountError(exc.errno or errno.EPERM, f"cannot set up the agent's user namespace: {exc}") from None
    finally:
        assert child.stdin is not None
        child.stdin.close()
        try:
            child.wait(TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
