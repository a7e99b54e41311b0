"""pid's privilege drop (drop.c), built on the host and put into each sandbox's /.pid beside channel.sh.

Every command of the agent starts through a privilege drop. Through the image's `setpriv` that costs ~1 ms more of
the container's CPU per command than a static program of a few system calls (docs/speed.md), and needs util-linux in
the image. The program is built once per machine with the host's C compiler (`$CC`, else `cc`), no C library, and
kept in the user's cache directory by its source's digest. Without a compiler, or on an architecture drop.c does not
know, there is none: channel.sh then drops through setpriv, as it always could (channel_hello.sh also tries the
program once as it starts, and takes setpriv if it cannot run there: an engine of another architecture). Where it
runs, it also forks the bash server's pre-started shells (drop.c's serve mode), a fork of the server cost more.

The program runs as root in every sandbox, so a kept copy is used only when it is this user's and nobody else can
write it or its directory; otherwise it is built again.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.resources
import logging
import os
import platform
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import threading

log = logging.getLogger(__name__)

SOURCE = importlib.resources.files(__package__).joinpath("drop.c").read_bytes()
NAME = "drop"                       # its name in /.pid
MACHINES = ("x86_64", "aarch64")    # the architectures drop.c has system calls for
ELF_MACHINES = {"x86_64": 62, "aarch64": 183}   # their ELF e_machine
ET_EXEC, PT_DYNAMIC, PT_INTERP = 2, 2, 3
MAX_SIZE = 64 * 1024                # a build larger than this is not the program drop.c makes
BUILD_TIMEOUT_S = 60.0
FLAGS = ["-static", "-nostdlib", "-Os", "-fno-stack-protector", "-fno-asynchronous-unwind-tables", "-fno-pie",
         "-no-pie", "-Wl,--build-id=none", "-s"]


_building = threading.Lock()   # (a worker's jobs may all start at once: one builds, the others wait for it)


@functools.cache
def program() -> bytes | None:
    """The built program's bytes (read from the cache, else built now), or None: commands drop through setpriv."""
    cache = _cache_path()
    if cache is None:
        return None
    with _building:
        kept = _kept(cache)
        if kept is not None:
            return kept
        built = _build()
        if built is not None:
            _keep(cache, built)
        return built


def _cache_path() -> str | None:
    """Where this user keeps the program built from this source, by its digest; None where there is none to use."""
    machine = platform.machine()
    if os.name != "posix" or platform.system() != "Linux" or machine not in MACHINES:
        return None
    digest = hashlib.sha256(SOURCE + " ".join(FLAGS).encode()).hexdigest()[:16]
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pid",
                        f"drop-{digest}-{machine}")


def _kept(path: str) -> bytes | None:
    """The kept copy, if it and its directory are this user's and writable by nobody else (no link followed)."""
    try:
        if not _private(os.lstat(os.path.dirname(path))):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not _private(os.fstat(fd)):
            return None
        data = f.read(MAX_SIZE + 1)
    return data if _plausible(data) else None


def _private(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _build() -> bytes | None:
    compiler = shutil.which(os.environ.get("CC") or "cc")
    if compiler is None:
        log.info("no C compiler here: agent commands drop their privileges through the image's setpriv")
        return None
    with tempfile.TemporaryDirectory(prefix="pid-drop-") as tmp:
        source, out = os.path.join(tmp, "drop.c"), os.path.join(tmp, NAME)
        with open(source, "wb") as f:
            f.write(SOURCE)
        try:
            built = subprocess.run([compiler, *FLAGS, "-o", out, source], capture_output=True, text=True,
                                   timeout=BUILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("cannot build pid's privilege drop (%s): commands drop through setpriv", exc)
            return None
        if built.returncode != 0:
            log.warning("cannot build pid's privilege drop: commands drop through setpriv: %s",
                        built.stderr.strip()[-500:])
            return None
        with open(out, "rb") as f:
            data = f.read(MAX_SIZE + 1)
    return data if _plausible(data) else None


def _plausible(data: bytes) -> bool:
    """Whether `data` is a program drop.c could have been built into for this machine: a static 64-bit
    little-endian executable (no interpreter, nothing linked at run time) of this machine's architecture, no larger
    than MAX_SIZE. A kept or shipped file is run as root in every sandbox, and channel.sh only tells whether it
    exits 0: /bin/true would pass that, and every agent command would then do nothing and succeed."""
    if len(data) > MAX_SIZE or len(data) < 64 or data[:6] != b"\x7fELF\x02\x01":
        return False
    kind, machine = struct.unpack_from("<HH", data, 16)
    ph_offset, = struct.unpack_from("<Q", data, 32)
    ph_size, ph_count = struct.unpack_from("<HH", data, 54)
    if kind != ET_EXEC or machine != ELF_MACHINES.get(platform.machine()) or ph_size < 4 or ph_count == 0 \
            or ph_offset + ph_size * ph_count > len(data):
        return False
    kinds = {struct.unpack_from("<I", data, ph_offset + n * ph_size)[0] for n in range(ph_count)}
    return not kinds & {PT_DYNAMIC, PT_INTERP}


def _keep(path: str, data: bytes) -> None:
    """Into the cache, whole or not at all (another process may be reading it)."""
    tmp = None
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        if not _private(os.lstat(os.path.dirname(path))):
            log.info("not keeping pid's privilege drop in %s: others may write there", os.path.dirname(path))
            return
        fd, tmp = tempfile.mkstemp(prefix=".drop-", dir=os.path.dirname(path))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        log.info("cannot keep pid's privilege drop in %s: %s", path, exc)
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def main(argv: list[str]) -> int:
    """`python -m pid.sandbox.drop_helper build FILE`: the program, built or kept here, into FILE (to ship it, as
    docker/build-worker.sh does into the worker image). `... keep FILE`: such a file into this user's cache, where
    `program()` finds it, on a machine with no compiler (the worker image)."""
    if len(argv) != 2 or argv[0] not in ("build", "keep"):
        log.error("usage: python -m pid.sandbox.drop_helper build|keep FILE")
        return 2
    action, path = argv
    if action == "build":
        data = program()
        if data is None:
            log.error("pid's privilege drop cannot be built here (no C compiler, or not Linux on x86_64 or aarch64)")
            return 1
        with open(path, "wb") as f:
            f.write(data)
        return 0
    with open(path, "rb") as f:
        data = f.read(MAX_SIZE + 1)
    if not _plausible(data):
        log.error("%s is not pid's privilege drop (a static ELF program for %s of at most %d bytes)", path,
                  platform.machine(), MAX_SIZE)
        return 1
    kept = _cache_path()
    if kept is None:
        log.error("pid's privilege drop is not used on this machine (not Linux on x86_64 or aarch64)")
        return 1
    _keep(kept, data)
    if _kept(kept) != data:
        log.error("cannot keep pid's privilege drop in %s", kept)
        return 1
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main(sys.argv[1:]))
