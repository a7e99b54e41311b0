"""`pid view ID|DIR`: a job or a batch as self-contained HTML (pid/html_view.py, pid/html_index.py).

A DIR holding batch.jsonl is a batch (an index and a page per item, in DIR/view/); a DIR holding result.json or
session.jsonl is a job's artifacts; anything else is a job id, whose result, transcript and patch come from the job
store (wherever the worker ran) or, when the store has none, from the job's own out directory.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from cli.output import echo

# The same names as pid/html_view.py's and worker/artifact_store.py's; the renderer is imported only when a page is
# made, so that registering this command costs the other commands nothing.
RESULT, SESSION, PATCH, BATCH = "result.json", "session.jsonl", "patch.diff", "batch.jsonl"

_ATTEMPT = re.compile(r"session\.attempt-(\d+)\.jsonl")


class ViewError(click.ClickException):
    """One line, exit 2 (cli.main prints ClickExceptions as `pid: error: ...`)."""
    exit_code = 2


@click.command("view")
@click.argument("target", metavar="ID|DIR")
@click.option("-o", "--output", metavar="FILE", type=click.Path(dir_okay=False),
              help="Where to write the page (default: pid-view-<id>.html here for a job; DIR/view/index.html for a "
                   "batch, its items' pages beside it).")
@click.option("--open", "open_page", is_flag=True, help="Open the page in a browser, where there is one.")
def view(target: str, output: str | None, open_page: bool) -> None:
    """Write a job (by id, or its artifacts' directory) or a batch directory as one self-contained HTML page: the
    result, the transcript with every tool call and edit, the patch; for a batch, a sortable table of its items
    linking to each item's page. Prints the page's path."""
    if os.path.isdir(target):
        path = _view_dir(target, output)
    else:
        path = _view_job_id(target, output)
    echo(path)
    if open_page and not open_in_browser(path):
        echo("pid: no browser here (no $BROWSER, no display): open the file above yourself", err=True)


def _view_dir(directory: str, output: str | None) -> str:
    from pid.html_index import render_batch
    from pid.html_view import read_result, render_job
    if os.path.isfile(os.path.join(directory, BATCH)):
        default = os.path.join(directory, "view")
        if output is None and any(os.path.exists(os.path.join(default, n)) for n in (RESULT, SESSION)):
            raise ViewError(f"{default} is an item's folder (an item whose id is 'view'): pass -o FILE")
        index = os.path.abspath(output or os.path.join(default, "index.html"))
        _check_writable(os.path.dirname(index), create=output is None)
        try:
            path, _ = render_batch(directory, os.path.dirname(index), os.path.basename(index))
        except OSError as exc:
            raise ViewError(f"cannot write {index}: {exc.strerror or exc}") from None
        return path
    if not any(os.path.isfile(os.path.join(directory, name)) for name in (RESULT, SESSION)):
        raise ViewError(f"{directory}: neither a batch directory ({BATCH}) nor a job's artifacts ({RESULT}, "
                        f"{SESSION})")
    job_id = str((read_result(directory) or {}).get("id") or os.path.basename(os.path.abspath(directory)))
    return _write(output, job_id, render_job(directory))


def _view_job_id(job_id: str, output: str | None) -> str:
    from pid.config import HomeUnusable, ensure_pid_home
    try:
        ensure_pid_home()
    except HomeUnusable as exc:
        raise ViewError(str(exc)) from None
    from cli.ids import NoSuchJob, resolve
    from worker.store import default_store
    store = default_store()
    try:
        job_id = resolve(store, job_id)
    except NoSuchJob as exc:
        if not exc.message.startswith("no such job:"):   # ambiguous, or a batch item without a job
            raise
        looks_like_path = os.sep in job_id or job_id.startswith(".")
        raise ViewError(f"no such {'directory' if looks_like_path else 'job or directory'}: {job_id}") from None
    record = store.get(job_id)
    if record is None:
        raise ViewError(f"no such job or directory: {job_id}")
    fallback = _from_record(record)
    with tempfile.TemporaryDirectory(prefix="pid-view-") as tmp:
        where = _artifacts(store, record, tmp)
        if where is None:
            raise ViewError(f"job {job_id} ({record.status}) has no result or transcript yet, neither in the job "
                            f"store nor in {record.spec.job_dir}")
        from pid.html_view import render_job
        return _write(output, job_id, render_job(where, fallback=fallback))


def _artifacts(store: Any, record: Any, tmp: str) -> str | None:
    """A directory holding the job's result.json / session.jsonl / patch.diff: the job's own out directory when it
    holds what the store has (a worker on this machine wrote it), else what the store has, fetched into tmp (only
    these three: collected files may be large), else the out directory if it holds anything."""
    from worker.artifact_store import already_local
    local = record.spec.job_dir
    if already_local(store, record.id, local):
        return str(local)
    try:
        names = set(store.artifact_names(record.id))
    except Exception:
        names = set()
    attempts = sorted((int(m.group(1)), n) for n in names if (m := _ATTEMPT.fullmatch(n)))
    wanted = {name: name for name in (RESULT, SESSION, PATCH) if name in names}
    if SESSION not in wanted and attempts:       # still running, or ended without its own transcript
        wanted[SESSION] = attempts[-1][1]
    if wanted:
        from worker.store import BlobMissing
        for local_name, stored in wanted.items():
            try:
                with open(os.path.join(tmp, local_name), "wb") as f:
                    for chunk in store.open_artifact(record.id, stored):
                        f.write(chunk)
            except BlobMissing:
                os.unlink(os.path.join(tmp, local_name))
        if any(os.path.exists(os.path.join(tmp, n)) for n in (RESULT, SESSION)):
            return tmp
    if any(os.path.isfile(os.path.join(local, n)) for n in (RESULT, SESSION)):
        return str(local)
    return None


def _from_record(record: Any) -> dict[str, Any]:
    """What the store knows of a job: the header when there is no result.json (a running job)."""
    usage = record.total_usage
    return {"id": record.id, "status": record.status, "exit_reason": record.exit_reason, "model": record.spec.model,
            "task": record.spec.task, "repo": record.spec.repo, "turns": record.turns,
            "tool_calls": record.tool_calls, "duration_s": record.duration_s, "error": record.error,
            "usage": {"total_tokens": usage.get("total_tokens"), "input": usage.get("input"),
                      "output": usage.get("output"), "cache_read": usage.get("cache_read"),
                      "cost": usage.get("cost")}}


def _write(output: str | None, job_id: str, text: str) -> str:
    from pid.html_page import write_page
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", job_id)[:100] or "job"
    path = os.path.abspath(output or f"pid-view-{safe}.html")
    _check_writable(os.path.dirname(path), create=False)
    try:
        write_page(path, text)
    except OSError as exc:
        raise ViewError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def _check_writable(directory: str, create: bool) -> None:
    if create:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise ViewError(f"cannot create {directory}: {exc.strerror or exc}") from None
    if not os.path.isdir(directory):
        raise ViewError(f"-o: directory {directory} does not exist")


def open_in_browser(path: str) -> bool:
    """In a browser where there is one: $BROWSER, a desktop session, or macOS/Windows. Otherwise (a server over
    SSH) nothing: the path is already printed, and a console browser taking over the terminal would surprise.
    Returns whether a browser took it."""
    if sys.platform.startswith("linux") and not (os.environ.get("BROWSER") or os.environ.get("DISPLAY")
                                                 or os.environ.get("WAYLAND_DISPLAY")):
        return False
    import webbrowser
    try:
        return webbrowser.open(Path(path).as_uri())
    except Exception:   # webbrowser.Error, or a browser that cannot start: the path is printed
        return False
