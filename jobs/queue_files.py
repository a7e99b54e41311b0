"""The embedded queue's message files, written without kombu: what jobs/transport.py's Channel puts, and what a client
(`pid submit`) puts itself, so that it needs neither kombu nor Celery (~0.1 s of its start).

A message is a file `<stamp>_<id>.<queue>.msg` in the queue folder (kombu's filesystem layout), written whole under a
name no reader matches (`.<name>.tmp`, mode 0600) and renamed into place: a reader only ever sees complete messages.
A message for the front of its queue (a job put back) is named `-<stamp>_...`: it sorts before every other.
"""
from __future__ import annotations

import os
import time
import uuid

TEMP_PREFIX = "."        # a name the reader never matches: every folder entry starting with it is skipped
TEMP_SUFFIX = ".tmp"
MESSAGE_SUFFIX = ".msg"
MODE = 0o600
FRONT_PRIORITY = 9   # AMQP's sense: the highest
FRONT = "-"          # sorts before every digit of a stamp

_last_stamp = 0


def _stamp() -> str:
    """A fixed-width wall-clock stamp, strictly increasing within a process: names sort oldest first (also across a
    reboot, which a monotonic clock would not survive)."""
    global _last_stamp
    _last_stamp = max(time.time_ns(), _last_stamp + 1)
    return f"{_last_stamp:020d}"


def message_name(queue: str, front: bool = False) -> str:
    """kombu's layout, `<stamp>_<id>.<queue>.msg`, so messages already queued by kombu's transport still match; one
    for the front, `-<stamp>_...`: read before the others, in its own order among those for the front."""
    return f"{FRONT if front else ''}{_stamp()}_{uuid.uuid4().hex}.{queue}{MESSAGE_SUFFIX}"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def check_queue_name(queue: str) -> None:
    if not queue or "/" in queue or "\0" in queue:
        raise ValueError(f"Invalid queue name for the filesystem transport: {queue!r}")


def put(folder: str, queue: str, data: bytes, front: bool = False) -> str:
    """Write one message whole, then rename it into place; its name. Raises OSError (nothing is left behind)."""
    check_queue_name(queue)
    name = message_name(queue, front)
    final = os.path.join(folder, name)
    temp = os.path.join(folder, TEMP_PREFIX + name + TEMP_SUFFIX)
    try:
        fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, MODE)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.rename(temp, final)
    except OSError:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    return name
