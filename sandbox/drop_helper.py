"""pid's privilege drop (drop.c), built on the host and put into each sandbox's /.pid beside channel.sh.

Every command of the agent starts through a privilege drop. Through the image's `setpriv` that costs ~1 ms more of
the container's CPU per command than a static program of a few system calls (docs/speed.md), and needs util-linux in
the image. The program is built once per machine with the host's C compiler (`$CC`, else `cc`), no C library, and
kept in the user's cache directory by its source's digest. Without a compiler, or on an architecture drop.c does not
know, there is none: channel.sh then drops through setpriv, as it always could (channel_hello.sh also tries the
program once as it starts, and takes setpriv if it cannot run there: an engine of another architecture). Where it
runs, it also forks the bash server's pre-started shells (drop.c's serve mode), a fork of the server cost more.

The same source, built as a shared library, is the other half of the drop's zygote (`library()`, /.pid/zygote.so):
a bash builtin that forks each slot shell from a bash that already started, ~1 ms of the container's CPU less per
command than an exec of bash (drop.c). Without it the drop forks and executes each shell itself.

The program runs as root in every sandbox, so a kept copy is used only when it is this user's and nobody else can
write it or its directory; otherwise it is built again (the library likewise: it runs in every agent's shells).
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
from dataclasses import dataclass

log = logging.getLogger(__name__)

SOURCE = importlib.resources.files(__package__).joinpath("drop.c").read_bytes()
MACHINES = ("x86_64", "aarch64")    # the architectures drop.c has system calls for
ELF_MACHINES = {"x86_64": 62, "aarch64": 183}   # their ELF e_machine
ET_EXEC, ET_DYN, PT_DYNAMIC, PT_INTERP = 2, 3, 2, 3
MAX_SIZE = 64 * 1024                # a build larger than this is not the program drop.c makes
BUILD_TIMEOUT_S = 60.0
COMMON = ("-nostdlib", "-Os", "-fno-stack-protector", "-fno-asynchronous-unwind-tables", "-Wl,--build-id=none", "-s")


@dataclass(frozen=True)
class Build:
    """One of the two things drop.c is built into, and what its messages call it."""
    name: str                # its name in /.pid
    flags: tuple[str, ...]
    executable: bool         # the static program (run as root); else the zygote's shared library (loaded by bash)
    what: str                # "pid's <what>"
    without: str             # what happens where there is none


DROP = Build("drop", ("-static", *COMMON, "-fno-pie", "-no-pie"), True, "privilege drop",
             "commands drop through setpriv")
ZYGOTE = Build("zygote.so", ("-shared", "-fPIC", "-DPID_ZYGOTE", *COMMON), False,   # (its C library: bash's)
               "zygote library", "the drop forks and executes each shell itself")


_building = threading.Lock()   # (a worker's jobs may all start at once: one builds, the others wait for it)


@functools.cache
def program() -> bytes | None:
    """The built program's bytes (read from the cache, else built now), or None: commands drop through setpriv."""
    return _made(DROP)


@functools.cache
def library() -> bytes | None:
    """The zygote's half, built the same way, or None (also without the program): the drop forks every shell."""
    return _made(ZYGOTE) if program() is not None else None


def _made(build: Build) -> bytes | None:
    cache = _cache_path(build)
    if cache is None:
        return None
    with _building:
        kept = _kept(cache, build)
        if kept is not None:
            return kept
        built = _build(build)
        if built is not None:
            _keep(cache, built, build)
        return built


def _cache_path(build: Build) -> str | None:
    """Where this user keeps `build` made from this source, by its digest; None where there is none to use."""
    machine = platform.machine()
    if os.name != "posix" or platform.system() != "Linux" or machine not in MACHINES:
        return None
    digest = hashlib.sha256(SOURCE + " ".join(build.flags).encode()).hexdigest()[:16]
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pid",
                        f"{build.name.split('.')[0]}-{digest}-{machine}")


def _kept(path: str, build: Build) -> bytes | None:
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
    return data if _plausible(data, build) else None


def _private(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _build(build: Build) -> bytes | None:
    compiler = shutil.which(os.environ.get("CC") or "cc")
    if compiler is None:
        log.info("no C compiler here for pid's %s: %s", build.what, build.without)
        return None
    with tempfile.TemporaryDirectory(prefix="pid-drop-") as tmp:
        source, out = os.path.join(tmp, "drop.c"), os.path.join(tmp, build.name)
        with open(source, "wb") as f:
            f.write(SOURCE)
        try:
            built = subprocess.run([compiler, *build.flags, "-o", out, source], capture_output=True, text=True,
                                   timeout=BUILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("cannot build pid's %s (%s): %s", build.what, exc, build.without)
            return None
        if built.returncode != 0:
            log.warning("cannot build pid's %s: %s: %s", build.what, build.without, built.stderr.strip()[-500:])
            return None
        with open(out, "rb") as f:
            data = f.read(MAX_SIZE + 1)
    return data if _plausible(data, build) else None


def _plausible(data: bytes, build: Build) -> bool:
    """Whether `data` is what drop.c could have been built into for this machine: a 64-bit little-endian ELF file
    of this machine's architecture, no larger than MAX_SIZE; the program static (no interpreter, nothing linked at
    run time), the library a shared object with no interpreter. A kept or shipped program is run as root in every
    sandbox, and channel.sh only tells whether it exits 0: /bin/true would pass that, and every agent command would
    then do nothing and succeed."""
    if len(data) > MAX_SIZE or len(data) < 64 or data[:6] != b"\x7fELF\x02\x01":
        return False
    kind, machine = struct.unpack_from("<HH", data, 16)
    ph_offset, = struct.unpack_from("<Q", data, 32)
    ph_size, ph_count = struct.unpack_from("<HH", data, 54)
    if kind != (ET_EXEC if build.executable else ET_DYN) or machine != ELF_MACHINES.get(platform.machine()) \
            or ph_size < 4 or ph_count == 0 or ph_offset + ph_size * ph_count > len(data):
        return False
    kinds = {struct.unpack_from("<I", data, ph_offset + n * ph_size)[0] for n in range(ph_count)}
    if build.executable:
        return not kinds & {PT_DYNAMIC, PT_INTERP}
    return PT_DYNAMIC in kinds and PT_INTERP not in kinds


def _keep(path: str, data: bytes, build: Build) -> None:
    """Into the cache, whole or not at all (another process may be reading it)."""
    tmp = None
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        if not _private(os.lstat(os.path.dirname(path))):
            log.info("not keeping pid's %s in %s: others may write there", build.what, os.path.dirname(path))
            return
        fd, tmp = tempfile.mkstemp(prefix=".drop-", dir=os.path.dirname(path))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        log.info("cannot keep pid's %s in %s: %s", build.what, path, exc)
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def main(argv: list[str]) -> int:
    """`python -m pid.sandbox.drop_helper build FILE`: the program, built or kept here, into FILE, and the zygote's
    half into FILE.so (to ship them, as docker/build-worker.sh does into the worker image). `... keep FILE`: such
    files into this user's cache, where `program()` and `library()` find them, on a machine with no compiler (the
    worker image)."""
    if len(argv) != 2 or argv[0] not in ("build", "keep"):
        log.error("usage: python -m pid.sandbox.drop_helper build|keep FILE")
        return 2
    action, path = argv
    if action == "build":
        data, half = program(), library()
        if data is None:
            log.error("pid's privilege drop cannot be built here (no C compiler, or not Linux on x86_64 or aarch64)")
            return 1
        with open(path, "wb") as f:
            f.write(data)
        if half is not None and path != os.devnull:
            with open(path + ".so", "wb") as f:
                f.write(half)
        return 0
    for build, file in ((DROP, path), (ZYGOTE, path + ".so")):
        cache = _cache_path(build)
        if cache is None:
            log.error("pid's privilege drop is not used on this machine (not Linux on x86_64 or aarch64)")
            return 1
        if build is ZYGOTE and not os.path.exists(file):
            continue
        with open(file, "rb") as f:
            data = f.read(MAX_SIZE + 1)
        if not _plausible(data, build):
            log.error("%s is not pid's %s (an ELF file for %s of at most %d bytes)", file, build.what,
                      platform.machine(), MAX_SIZE)
            return 1
        _keep(cache, data, build)
        if _kept(cache, build) != data:
            log.error("cannot keep pid's %s in %s", build.what, cache)
            return 1
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main(sys.argv[1:]))
