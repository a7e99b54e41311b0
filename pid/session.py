"""Session transcripts as JSONL in pi's version-3 format, appended as the task runs.

Each line is flushed when written, so a crash mid-task leaves a valid prefix that pi (and `read_session`) can open.
"""
from __future__ import annotations

import json
import os
import secrets
import uuid
from datetime import datetime, timezone
from typing import IO, Any, Iterable

from pid.messages import Message, message_from_dict

SESSION_VERSION = 3


def iso_time(ts: float | None = None) -> str:
    """UTC, milliseconds, trailing Z: the timestamp form pi writes (and result.json uses)."""
    moment = datetime.now(timezone.utc) if ts is None else datetime.fromtimestamp(ts, timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _entry_id() -> str:
    return secrets.token_hex(4)


class SessionWriter:
    """Writes a pi session file: a header line, then entries chained by parentId."""

    def __init__(self, path: str, *, cwd: str = "/workspace", session_id: str | None = None,
                 parent_session: str | None = None) -> None:
        """`parent_session`: the session file this one continues (pi's header field, as its fork writes it)."""
        self.path = path
        self.id = session_id or str(uuid.uuid4())
        self._last_id: str | None = None
        self._ids: set[str] = set()   # ids are 8 hex digits (pi's): one is drawn again until it is new, as pi does
        self._file: IO[bytes] = open(path, "ab")
        header = {"type": "session", "version": SESSION_VERSION, "id": self.id, "timestamp": iso_time(), "cwd": cwd}
        self._write({**header, "parentSession": parent_session} if parent_session else header)

    def copy(self, entry: dict[str, Any]) -> None:
        """An entry of the parent session, as it was (id and parentId kept): the next entries follow it."""
        self._write(entry)
        self._last_id = entry["id"]
        self._ids.add(entry["id"])

    def _write(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"
        try:
            data = line.encode("utf-8")
        except UnicodeEncodeError:   # a lone surrogate (a byte of a file not in UTF-8, a model's "\ud800"): as an
            data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()   # escape: JSON holds it, UTF-8 cannot
        self._file.write(data)
        self._file.flush()

    def _append(self, body: dict[str, Any]) -> str:
        entry_id = _entry_id()
        while entry_id in self._ids:   # a repeated id would make the chain a cycle (readers would loop forever)
            entry_id = _entry_id()
        self._ids.add(entry_id)
        self._write({"type": body.pop("type"), "id": entry_id, "parentId": self._last_id, "timestamp": iso_time(),
                     **body})
        self._last_id = entry_id
        return entry_id

    def model_change(self, provider: str, model: str) -> str:
        return self._append({"type": "model_change", "provider": provider, "modelId": model})

    def thinking_level_change(self, level: str = "off") -> str:
        return self._append({"type": "thinking_level_change", "thinkingLevel": level})

    def message(self, message: Message) -> str:
        return self._append({"type": "message", "message": message.to_dict()})

    def compaction(self, summary: str, first_kept_entry_id: str, tokens_before: int,
                   details: dict[str, Any] | None = None) -> str:
        """pi's compaction entry: pi (and `session_context`) rebuild the context as the summary, then the messages
        from firstKeptEntryId on."""
        body: dict[str, Any] = {"type": "compaction", "summary": summary, "firstKeptEntryId": first_kept_entry_id,
                                "tokensBefore": tokens_before}
        if details is not None:
            body["details"] = details
        body["fromHook"] = False
        return self._append(body)

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()

    def __enter__(self) -> "SessionWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_session(path: str) -> tuple[dict[str, Any], list[Message]]:
    """The header and the messages along the chain ending at the last entry (the current branch of the tree)."""
    header, chain = _read(path)
    return header, [message_from_dict(e["message"]) for e in chain if e.get("type") == "message"]


def session_context(path: str) -> list[Message]:
    """The conversation a model would see on continuing the session, as pi builds it: with a compaction on the
    current branch, its summary (as a user message), then the messages from its firstKeptEntryId on."""
    return [message for _id, message in session_context_entries(path)]


def session_context_entries(path: str) -> list[tuple[str | None, Message]]:
    """session_context's messages with the id of the entry each came from (None for a compaction's summary), so a
    continued conversation can be compacted again against the entries it was loaded from."""
    from pid.compaction import SUMMARY_PREFIX, SUMMARY_SUFFIX
    from pid.messages import UserMessage

    _header, chain = _read(path)
    latest = max((i for i, e in enumerate(chain) if e.get("type") == "compaction"), default=None)
    if latest is None:
        return [(e.get("id"), message_from_dict(e["message"])) for e in chain if e.get("type") == "message"]
    compaction = chain[latest]
    first = next((i for i, e in enumerate(chain) if e.get("id") == compaction.get("firstKeptEntryId")), latest)
    kept = [e for i, e in enumerate(chain) if i >= first and i != latest and e.get("type") == "message"]
    summary = UserMessage.text(SUMMARY_PREFIX + str(compaction.get("summary", "")) + SUMMARY_SUFFIX)
    return [(None, summary), *((e.get("id"), message_from_dict(e["message"])) for e in kept)]


def _read(path: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header, and the entries along the chain ending at the file's last entry, oldest first."""
    with open(path, encoding="utf-8") as f:
        return read_chain(f)


def read_chain(lines: Iterable[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A session's header, and its entries from the root to the last one (the leaf, as pi loads it). A torn last
    line is ignored (the prefix is what counts after a crash); a cycle (repeated ids) ends the walk."""
    header: dict[str, Any] = {}
    entries: dict[str, dict[str, Any]] = {}
    last: str | None = None
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            break
        if obj.get("type") == "session":
            header = obj
            continue
        entries[obj["id"]] = obj
        last = obj["id"]
    chain: list[dict[str, Any]] = []
    seen: set[str] = set()
    while last is not None and last not in seen:
        seen.add(last)
        entry = entries[last]
        chain.append(entry)
        last = entry.get("parentId")
    chain.reverse()
    return header, chain
