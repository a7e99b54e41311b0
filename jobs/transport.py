"""pid's embedded broker: kombu's filesystem transport made safe for several producers and consumers.

kombu's own filesystem transport writes a message in place (create, lock, write) while its reader lists, moves and
reads without the lock, so a reader can take an empty or half-written file (a JSONDecodeError that stops Celery's
consumer, and the message is gone); and with `store_processed` off it moves a claimed file into the temp directory,
which on another filesystem is a copy plus delete that two consumers can both win. Here:

- a producer writes `.<name>.tmp` (mode 0600, never matched by a reader) and renames it to `<name>`: a reader only
  ever sees complete messages;
- a message whose priority is FRONT_PRIORITY (a job put back: jobs/dispatch.py) is named to sort before every
  other, so it is read next, ahead of the messages already queued;
- a consumer claims a message with one rename into a claim folder on the same filesystem (`<queue folder>/.claimed`),
  so exactly one consumer wins; a file another consumer took first is skipped;
- a message that still cannot be parsed is moved aside (`<queue folder>/.bad`) with a warning, and the consumer goes on;
- a queue folder that cannot be listed, or a message that cannot be claimed or read for a reason of the system's (no
  descriptor left, I/O error; the message goes back to the queue), is a connection error, which Celery's consumer
  recovers from by reconnecting, not a channel error that stops it.

Use it as `pidfs://` after `register()`; the transport options are kombu's filesystem ones (`data_folder_in`,
`data_folder_out`, `control_folder`, `store_processed`, `processed_folder`) plus optional `claim_folder` and
`bad_folder`.
"""
from __future__ import annotations

import fcntl
import logging
import os
import shutil
from collections import deque
from collections.abc import Callable
from queue import Empty
from typing import Any

from kombu.exceptions import ChannelError
from kombu.exceptions import ConnectionError as BrokerConnectionError
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import filesystem, virtual
from kombu.utils.json import dumps, loads
from kombu.utils.objects import cached_property

from pid.jobs.queue_files import FRONT_PRIORITY, MESSAGE_SUFFIX, MODE, TEMP_PREFIX, check_queue_name, put

SCHEME = "pidfs"
CLAIMED = ".claimed"
BAD = ".bad"

log = logging.getLogger("pid.worker")


def register() -> None:
    """Make `pidfs://` name this transport (idempotent; before a Connection or Celery app resolves the URL)."""
    TRANSPORT_ALIASES[SCHEME] = f"{__name__}:Transport"


def _mkdir_private(folder: str) -> str:
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return folder


class Channel(filesystem.Channel):
    """Atomic put (temp name + rename), exclusive get (rename into a claim folder), bad messages set aside."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: dict[str, deque[str]] = {}   # per queue: names of the last listing not tried yet

    # ---------------------------------------------------------------- names and folders

    @staticmethod
    def _is_message_of(name: str, queue: str) -> bool:
        return not name.startswith(TEMP_PREFIX) and name.partition(".")[2] == queue + MESSAGE_SUFFIX

    @cached_property
    def claim_folder(self) -> str:
        """Where a consumer renames a message to own it: must be on the queue folder's filesystem, or the rename
        that makes a claim exclusive would be impossible."""
        folder = _mkdir_private(self.transport_options.get("claim_folder")
                                or os.path.join(self.data_folder_in, CLAIMED))
        if os.stat(folder).st_dev != os.stat(self.data_folder_in).st_dev:
            raise ChannelError(f"claim_folder {folder!r} is not on the filesystem of {self.data_folder_in!r}")
        return folder

    @cached_property
    def bad_folder(self) -> str:
        return self.transport_options.get("bad_folder") or os.path.join(self.data_folder_in, BAD)

    # ---------------------------------------------------------------- put

    # kombu's own bases disagree on the argument's name (`message`, `payload`): every caller passes it by position.
    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Write the whole message under a name no reader matches, then rename it into place (queue_files.put)."""
        try:
            check_queue_name(queue)
        except ValueError as exc:
            raise ChannelError(str(exc)) from None
        front = self._get_message_priority(message) >= FRONT_PRIORITY
        try:
            put(self.data_folder_out, queue, dumps(message).encode("utf-8"), front)
        except OSError as exc:
            raise ChannelError(f"Cannot add a message to {self.data_folder_out!r}: {exc}") from exc

    def _put_fanout(self, exchange: str, payload: Any, routing_key: str, **kwargs: Any) -> None:
        for binding in self.get_table(exchange):
            self._put(binding.queue, payload)

    # ---------------------------------------------------------------- get

    def _listing(self, queue: str) -> deque[str]:
        try:
            names = os.listdir(self.data_folder_in)
        except OSError as exc:
            raise BrokerConnectionError(f"Cannot list the queue folder {self.data_folder_in!r}: {exc}") from exc
        return deque(sorted(name for name in names if self._is_message_of(name, queue)))

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        """The oldest message of `queue` this consumer wins. One listing serves many gets (listing a folder of
        thousands of messages for each get would be quadratic); a name someone else claimed meanwhile is skipped."""
        pending = self._pending.get(queue)
        while True:
            if not pending:
                pending = self._pending[queue] = self._listing(queue)
                if not pending:
                    del self._pending[queue]    # no key per reply queue ever polled, in a long-lived process
                    raise Empty()
            claimed = self._claim(pending.popleft())
            if claimed is None:
                continue
            message = self._read_claimed(claimed)
            if message is not None:
                return message

    def _claim(self, name: str) -> str | None:
        """Own message `name` by renaming it into the claim folder; None when another consumer was first."""
        source = os.path.join(self.data_folder_in, name)
        target = os.path.join(self.claim_folder, name)
        try:
            os.rename(source, target)
        except FileNotFoundError:
            if os.path.isdir(self.claim_folder):
                return None
            _mkdir_private(self.claim_folder)      # removed under us: make it again and try once more
            try:
                os.rename(source, target)
            except FileNotFoundError:
                return None
        except OSError as exc:
            raise BrokerConnectionError(f"Cannot claim message {source!r}: {exc}") from exc
        return target

    def _read_claimed(self, path: str) -> dict[str, Any] | None:
        """The message at `path` (now ours), which leaves the claim folder; None if it was set aside as unreadable."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            # Not the message's fault (no descriptor left, I/O error): give it back to the queue and report.
            self._give_back(path)
            raise BrokerConnectionError(f"Cannot read message {path!r}: {exc}") from exc
        try:
            message = loads(data)
            if not isinstance(message, dict):
                raise ValueError(f"a message is a JSON object, not {type(message).__name__}")
        except ValueError as exc:   # JSONDecodeError and UnicodeDecodeError are ValueErrors
            self._set_aside(path, exc)
            return None
        self._done_with(path)
        return message

    def _give_back(self, path: str) -> None:
        try:
            os.rename(path, os.path.join(self.data_folder_in, os.path.basename(path)))
        except OSError:
            log.warning("broker: could not return message %s to the queue", path)

    def _set_aside(self, path: str, why: Exception) -> None:
        target = os.path.join(self.bad_folder, os.path.basename(path))
        try:
            shutil.move(path, _mkdir_private(self.bad_folder))
        except OSError as exc:
            log.warning("broker: unreadable message %s (%s) could not be moved aside: %s", path, why, exc)
            return
        log.warning("broker: unreadable message moved aside to %s (%s)", target, why)

    def _done_with(self, path: str) -> None:
        """Keep or delete a message that was read: a failure here leaves a copy in the claim folder (which no one
        reads) but must not lose the message, which the consumer already holds."""
        try:
            if self.store_processed:
                shutil.move(path, os.path.join(_mkdir_private(self.processed_folder), os.path.basename(path)))
            else:
                os.unlink(path)
        except OSError as exc:
            log.warning("broker: message %s was delivered but not %s: %s", path,
                        "kept" if self.store_processed else "deleted", exc)

    # ---------------------------------------------------------------- size and purge

    def _size(self, queue: str) -> int:
        return len(self._listing(queue))

    def _purge(self, queue: str) -> int:
        self._pending.pop(queue, None)
        count = 0
        for name in self._listing(queue):
            try:
                os.unlink(os.path.join(self.data_folder_in, name))
            except FileNotFoundError:
                continue        # a consumer claimed it meanwhile
            count += 1
        return count

    # ---------------------------------------------------------------- exchange tables (fanout bindings)

    def get_table(self, exchange: str) -> list[Any]:
        """The bindings of `exchange`; a table file just created by a binder and still empty means none yet."""
        path = self._exchange_file(exchange)
        try:
            with open(path, "rb") as f:
                fcntl.flock(f.fileno(), fcntl.LOCK_SH)
                data = f.read()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ChannelError(f"Cannot open {path}") from exc
        return [filesystem.exchange_queue_t(*row) for row in loads(data)] if data.strip() else []

    def _update_table(self, exchange: str, change: Callable[[list[Any]], bool]) -> None:
        """Read, change and rewrite `exchange`'s table under one exclusive lock (created 0600 if missing: kombu
        truncates it before locking, so two workers starting at once could each drop the other's binding)."""
        path = self._exchange_file(exchange)
        _mkdir_private(str(self.control_folder))
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, MODE)
        except OSError as exc:
            raise ChannelError(f"Cannot open {path}") from exc
        with open(fd, "r+b", buffering=0) as f:
            fcntl.flock(fd, fcntl.LOCK_EX)
            data = f.read()
            table = [filesystem.exchange_queue_t(*row) for row in loads(data)] if data.strip() else []
            if change(table):
                f.seek(0)
                f.write(dumps(table).encode("utf-8"))
                f.truncate()

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")

        def add(table: list[Any]) -> bool:
            if binding in table:
                return False
            table.insert(0, binding)
            return True

        self._update_table(exchange, add)

    def _delete(self, queue: str, exchange: str, routing_key: str, pattern: str, *args: Any, **kwargs: Any) -> None:
        self._purge(queue)
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        if not os.path.exists(self._exchange_file(exchange)):
            return

        def remove(table: list[Any]) -> bool:
            if binding not in table:
                return False
            table.remove(binding)
            return True

        self._update_table(exchange, remove)


class Transport(filesystem.Transport):
    """kombu's filesystem transport with pid's Channel (register() maps `pidfs://` to it)."""

    Channel = Channel
    global_state = virtual.BrokerState()     # this transport's own, as kombu's has its own
    driver_type = SCHEME
    driver_name = SCHEME

