"""A batch's output directory: its memory between runs of `pid batch`, and what it produced.

    DIR/batch.json      the batch's id (its jobs carry it: JobSpec.batch) and settings: its tasks file and the
                        options that define its jobs (a run with another file or other options is refused)
    DIR/jobs.jsonl      the ledger: a line {"id", "job_id"} per job submitted, written (and synced) before the job
                        is created, so that a run that dies never leaves a job the next run does not know about
    DIR/batch.jsonl     the results: one JSON object per ended item (id, job_id, status, exit_reason, exit_code,
                        cost, tokens, turns, tool_calls, duration_s, check, error), in the tasks file's order
    DIR/summary.json    the summary (summarize())
    DIR/<item id>/      the item's artifacts, downloaded from the job store (result.json, patch.diff, session.jsonl…)
    DIR/.jobs/          where a worker on this machine writes (the jobs' --out); removed once downloaded
    DIR/.lock           held (flock) by the one run that submits to or follows the batch (hold())
    DIR/.cancelled      made by a cancel of the whole batch (--cancel DIR, Batch.cancel): the run that follows it
                        submits no more and cancels what it submitted since; the next run that submits removes it

No click here: the command is cli/batch.py.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pid.endings import check_originals_missing, exit_code_for
from pid.errors import PidError
from pid.jobs.spec import ID_TIME, JOB_ID_RE, beside, write_json_atomic
from pid.jobs.trees import remove_tree
from pid.output_dirs import make_marked
from pid.terminal import escaped

META, LEDGER, RESULTS, SUMMARY, JOBS = "batch.json", "jobs.jsonl", "batch.jsonl", "summary.json", ".jobs"
LOCK, CANCELLED = ".lock", ".cancelled"

# An item's exit code, from least to most serious: the batch exits with its worst item's (see docs/batches.md).
# 0 completed (and its check passed), 3 a limit was hit, 4 its check failed, 1 failed or cancelled.
SEVERITY = (0, 3, 4, 1)


LONG_TEXT = 200   # a longer option value (a system prompt's text) is kept by its digest


def kept_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options that define a batch's jobs as batch.json keeps them: JSON values, a long text by its digest."""
    kept: dict[str, Any] = {}
    for name, value in sorted(options.items()):
        value = list(value) if isinstance(value, tuple) else value
        if isinstance(value, str) and len(value) > LONG_TEXT:
            value = "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
        kept[name] = value
    return kept


def other_tasks(meta: dict[str, Any], tasks: str, item_ids: list[str]) -> bool:
    """This tasks file is not the batch's: another path, or (stdin, or the file rewritten) none of the batch's
    items. The same file with items added is the same batch."""
    if meta.get("tasks") not in (None, tasks):
        return True
    known = set(meta.get("order") or [])
    return bool(known) and not known.intersection(item_ids)


def changed_options(meta: dict[str, Any], options: dict[str, Any]) -> list[str]:
    """The names of the options whose value is not the batch's (none when batch.json predates their keeping)."""
    before = meta.get("options")
    if not isinstance(before, dict):
        return []
    now = kept_options(options)
    return [name for name in sorted({*before, *now}) if json.dumps(before.get(name)) != json.dumps(now.get(name))]


def hold(path: str) -> int:
    """An exclusive lock on the batch directory `path` (made if need be) for the run that submits to or follows it:
    two followers would both download every item and rewrite batch.jsonl. flock is per open file, so a second
    follower in the same process (another thread) is refused as one in another process is. Returns the lock's
    descriptor (release() gives it up; so does the process's end). PidError when another run holds it."""
    make_marked(path)
    fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise PidError(f"another run follows {path} (pid batch, pid.batch or Batch.wait, in this process or "
                       "another): let it end, or stop it, before running or waiting for the batch here") from None
    return fd


def release(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def new_batch_id() -> str:
    return "b-" + datetime.now(timezone.utc).strftime(ID_TIME) + "-" + secrets.token_hex(3)


def batch_exit_code(codes: list[int]) -> int:
    """0 when every item's is; else the most serious one (an unknown code counts as 1)."""
    worst = 0
    for code in codes:
        code = code if code in SEVERITY else 1
        if SEVERITY.index(code) > SEVERITY.index(worst):
            worst = code
    return worst


def row_for(item_id: str, job_id: str, result: dict[str, Any], check_asked: bool) -> dict[str, Any]:
    """An ended item's line in batch.jsonl, from its result.json. `check_asked`: its job had a --check, whether or
    not it ran (a job that did not complete has no verdict, and counts as not passed: summarize)."""
    usage = result.get("usage") or {}
    return {"id": item_id, "job_id": job_id, "status": result.get("status"), "exit_reason": result.get("exit_reason"),
            "exit_code": exit_code_for(result), "cost": round(float(usage.get("cost") or 0.0), 6),
            "tokens": int(usage.get("total_tokens") or 0), "turns": int(result.get("turns") or 0),
            "tool_calls": int(result.get("tool_calls") or 0), "duration_s": result.get("duration_s"),
            "check": result.get("check"), "check_asked": check_asked, "error": result.get("error")}


def check_verdict(row: dict[str, Any]) -> str | None:
    """An ended item's check: passed, failed, not run (its job did not get to it), or None (it asked for none)."""
    check = row.get("check")
    if isinstance(check, dict):
        return "passed" if check.get("passed") else "failed"
    return "not run" if row.get("check_asked") else None


def needs_run(row: dict[str, Any] | None, retry_failed: bool) -> bool:
    """Whether a (re)run of the batch runs this item: it never ended, or was cancelled (Ctrl-C, the budget), or
    it failed or hit a limit (or its check failed) and --retry-failed asks for it again."""
    if row is None or row.get("status") in (None, "cancelled"):
        return True
    return retry_failed and row.get("exit_code") != 0


def _links(path: str) -> str:
    """The first symbolic link among the batch directory's entries and its items' (pid's files: none is one), or
    "". The workers' .jobs is theirs, and left out."""
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_symlink():
                return entry.name
            if entry.is_dir(follow_symlinks=False) and entry.name != JOBS:
                with os.scandir(entry.path) as inner:
                    for item in inner:
                        if item.is_symlink():
                            return f"{entry.name}/{item.name}"
    return ""


@dataclass
class BatchDir:
    path: str
    meta: dict[str, Any]
    ledger: dict[str, list[str]] = field(default_factory=dict)   # item id -> its job ids, oldest first
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)             # item ids, as the tasks file has them
    lock: int | None = field(default=None, repr=False)          # hold()'s descriptor, while a run holds it

    @staticmethod
    def exists(path: str) -> bool:
        return os.path.isfile(os.path.join(path, META))

    @classmethod
    def create(cls, path: str, settings: dict[str, Any]) -> "BatchDir":
        os.makedirs(os.path.join(path, JOBS), exist_ok=True)
        meta = {"batch": new_batch_id(), "created_at": time.time(), **settings}
        write_json_atomic(os.path.join(path, META), meta)
        return cls(path, meta)

    @classmethod
    def open(cls, path: str) -> "BatchDir":
        """ValueError (one line) when DIR is not a batch's."""
        try:
            with open(os.path.join(path, META), encoding="utf-8") as f:
                meta = json.load(f)
            if not isinstance(meta, dict) or not isinstance(meta.get("batch"), str):
                raise ValueError
        except (OSError, ValueError):
            raise ValueError(f"{path} is not a batch's output directory (no readable {META})") from None
        linked = _links(path)
        if linked:   # (pid writes none: a directory from elsewhere sent the ledger, the log, the view through them)
            raise ValueError(f"{path} holds a symbolic link ({escaped(linked)}): it is no batch directory pid wrote; "
                             "give another one")   # (its name is the directory's maker's: shown escaped)
        found = cls(path, meta)
        for entry in _lines(os.path.join(path, LEDGER)):
            found.ledger.setdefault(str(entry["id"]), []).append(str(entry["job_id"]))
        for row in _lines(os.path.join(path, RESULTS)):
            found.rows[str(row["id"])] = row
        found.order = list(dict.fromkeys([*meta.get("order", []), *found.ledger, *found.rows]))
        return found

    @property
    def batch_id(self) -> str:
        return str(self.meta["batch"])

    @property
    def jobs_dir(self) -> str:
        return os.path.join(self.path, JOBS)

    def set_order(self, ids: list[str], settings: dict[str, Any]) -> None:
        """The tasks file's items (a rerun may add some) and the run's settings, kept in batch.json."""
        self.order = list(dict.fromkeys([*ids, *self.order]))
        self.meta.update(settings, order=self.order)
        write_json_atomic(os.path.join(self.path, META), self.meta)

    def record_jobs(self, pairs: list[tuple[str, str]]) -> None:
        """Ledger lines for jobs about to be created, on disk (synced) before they are."""
        with open(os.path.join(self.path, LEDGER), "a", encoding="utf-8") as f:
            for item_id, job_id in pairs:
                f.write(json.dumps({"id": item_id, "job_id": job_id}) + "\n")
                self.ledger.setdefault(item_id, []).append(job_id)
            f.flush()
            os.fsync(f.fileno())

    def mark_cancelled(self, on: bool = True) -> None:
        """The batch cancelled as a whole (or, `on` false, resumed): see CANCELLED."""
        path = os.path.join(self.path, CANCELLED)
        if on:
            with open(path, "w", encoding="utf-8"):
                pass
        elif os.path.lexists(path):
            os.remove(path)

    def cancelled(self) -> bool:
        return os.path.lexists(os.path.join(self.path, CANCELLED))

    def current_job(self, item_id: str) -> str | None:
        jobs = self.ledger.get(item_id)
        return jobs[-1] if jobs else None

    def write_rows(self) -> None:
        """batch.jsonl anew (atomically): one line per ended item, in the tasks file's order."""
        path = os.path.join(self.path, RESULTS)
        tmp = beside(path, "tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for item_id in self.order:
                if item_id in self.rows:
                    f.write(json.dumps(self.rows[item_id], ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(os.path.join(self.path, SUMMARY), summary)

    def item_dir(self, item_id: str) -> str:
        return os.path.join(self.path, item_id)

    def replace_item_dir(self, item_id: str, fresh: str) -> None:
        """The item's folder becomes `fresh` (a finished download). What an earlier job left there is kept in
        `earlier/<job id>/`, every earlier job's side by side: a rerun's job may end without having run (a cancel, a
        spent budget), and its empty patch must not cost the work before it. The same job downloaded again keeps
        only what it kept. Each step is one rename, undone if the next fails (the caller then removes `fresh`)."""
        final = self.item_dir(item_id)
        if not os.path.lexists(final):
            os.replace(fresh, final)
            return
        kept, older = os.path.join(fresh, EARLIER), os.path.join(final, EARLIER)
        carried = os.path.isdir(older) and not os.path.islink(older)
        if carried:
            os.replace(older, kept)
        same = _job_id_of(final) == _job_id_of(fresh)
        try:
            if not same:
                os.makedirs(kept, exist_ok=True)
            archived = beside(final, "old-") if same else _free(os.path.join(kept, _job_id_of(final)))
            os.replace(final, archived)
        except OSError:
            if carried:
                os.replace(kept, older)
            raise
        os.replace(fresh, final)
        if same:
            remove_tree(archived)


EARLIER = "earlier"   # an item's folder: the artifacts of its earlier jobs, by job id


def _free(path: str) -> str:
    """`path`, or `path-2`, `path-3`... the first that does not exist."""
    n, free = 1, path
    while os.path.lexists(free):
        n += 1
        free = f"{path}-{n}"
    return free


def _job_id_of(item_dir: str) -> str:
    """The id of the job whose artifacts `item_dir` holds (its result.json's), else a name of its own."""
    try:
        with open(os.path.join(item_dir, "result.json"), encoding="utf-8") as f:
            job_id = json.load(f).get("id")
    except (OSError, ValueError, AttributeError):
        job_id = None
    if isinstance(job_id, str) and JOB_ID_RE.fullmatch(job_id):
        return job_id
    return "unknown"


def _lines(path: str) -> list[dict[str, Any]]:
    """A JSONL file's objects; a torn last line (a run killed mid-write) is skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    found = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and "id" in value:
            found.append(value)
    return found


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100) of the values; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _spread(values: list[float], digits: int) -> dict[str, Any]:
    p50, p95 = percentile(values, 50), percentile(values, 95)
    return {"total": round(sum(values), digits), "p50": None if p50 is None else round(p50, digits),
            "p95": None if p95 is None else round(p95, digits), "max": round(max(values), digits) if values else None}


def summarize(rows: list[dict[str, Any]], items: int, top: int = 5) -> dict[str, Any]:
    """The batch's summary over its ended items' rows (`items`: how many the batch has, ended or not)."""
    by_status: dict[str, int] = {}
    for row in rows:
        by_status[str(row.get("status"))] = by_status.get(str(row.get("status")), 0) + 1
    # The pass rate is over every ended item that asked for a check: one whose job never got to it (a limit, an
    # error, a cancel) did not pass, so that for a SWE-bench-style batch the rate is the resolved rate. (A row of an
    # older pid has no check_asked: its verdicts alone count, as they did.)
    verdicts = [verdict for row in rows if (verdict := check_verdict(row)) is not None]
    asked, checked = len(verdicts), sum(1 for verdict in verdicts if verdict != "not run")
    passed = verdicts.count("passed")
    codes = [int(row.get("exit_code", 1)) for row in rows]
    ran = [row for row in rows if row.get("turns")]   # per item: an item ended before its first turn says nothing
    durations = [float(row["duration_s"]) for row in ran if isinstance(row.get("duration_s"), (int, float))]
    missing = [row["id"] for row in rows if check_originals_missing(row)]   # (said only when there are any)
    return {
        "items": items, "ended": len(rows), "not_ended": items - len(rows), "by_status": by_status,
        "exit_code": batch_exit_code(codes + ([1] if items > len(rows) else [])),
        "check": {"asked": asked, "checked": checked, "passed": passed,
                  "pass_rate": round(passed / asked, 4) if asked else None,
                  **({"original_missing": missing} if missing else {})},
        "ran": len(ran),
        "cost": _spread([float(row.get("cost") or 0) for row in ran], 6),
        "tokens": _spread([float(row.get("tokens") or 0) for row in ran], 1),
        "turns": _spread([float(row.get("turns") or 0) for row in ran], 1),
        "duration_s": _spread(durations, 3),
        "slowest": [{"id": r["id"], "duration_s": r["duration_s"]}
                    for r in sorted((r for r in ran if isinstance(r.get("duration_s"), (int, float))),
                                    key=lambda r: -r["duration_s"])[:top]],
        "most_expensive": [{"id": r["id"], "cost": r.get("cost") or 0}
                           for r in sorted(ran, key=lambda r: -(r.get("cost") or 0))[:top]],
    }
