"""Which process this is, exactly: its boot, pid namespace and start time, read from /proc. A job's lease owner and
a worker's heartbeat carry it, so that on their own machine a process that is gone is known gone, and a pid reused
by another process, or a host of the same name, never passes for it. Light on purpose: the CLI reads it.
"""
from __future__ import annotations

import os
import socket


def process_identity(pid: int) -> str | None:
    """boot id, pid namespace and start time of a process on this machine, as one token; None where /proc lacks
    them."""
    fields = proc_stat(pid)
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()[:8]
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{boot}-{namespace}-{fields[19]}" if fields is not None and len(fields) > 19 else None


def proc_stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (state first, start time at index 19); None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_alive(host: str, pid: int, identity: str) -> bool | None:
    """Is the process that `identity` (process_identity's token) names still there? Knowable only on its own machine,
    in this boot and pid namespace (None elsewhere): a pid reused by another process, a zombie, or a host of the same
    name never passes for it."""
    if host != socket.gethostname():
        return None
    mine = process_identity(os.getpid())
    if mine is None or identity.count("-") < 2 or mine.split("-", 2)[:2] != identity.split("-", 2)[:2]:
        return None   # another boot, or another pid namespace of a host with this name: not ours to judge
    fields = proc_stat(pid)
    return fields is not None and fields[0] != "Z" and process_identity(pid) == identity


def process_mark() -> str:
    """This process as "host:pid:identity", for a label or record that must say whether it is gone (mark_gone)."""
    return f"{socket.gethostname()}:{os.getpid()}:{process_identity(os.getpid()) or ''}"


def mark_gone(mark: str) -> bool:
    """Is the process process_mark() named known to be gone (on this machine only: elsewhere, or unreadable, no)?"""
    host, _, rest = mark.partition(":")
    pid, _, identity = rest.partition(":")
    return pid.isdigit() and process_alive(host, int(pid), identity) is False
