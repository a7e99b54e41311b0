"""`pid view ID|DIR`: a job or a batch as self-contained HTML (cli/pages/job.py, cli/pages/batch.py).

A DIR holding batch.jsonl is a batch (an index and a page per item, in DIR/view/); a DIR holding result.json or
session.jsonl is a job's artifacts; anything else is a job id, whose result, transcript and patch come from the job
store (wherever the worker ran) or, when the store has none, from the job's own out directory. A job by id has
its family linked: the job it continues and the jobs that continue it get their pages beside its own.

`--watch` keeps a running job's page current: it is rewritten as the job's events arrive, and reloads itself in the
browser (a meta refresh) until the job ends, when it is written a last time without it.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from pid.cli.output import echo
from pid.terminal import one_line

# The same names as cli/pages/job.py's and jobs/artifact_store.py's; the renderer is imported only when a page is
# made, so that registering this command costs the other commands nothing.
RESULT, SESSION, PATCH, BATCH = "result.json", "session.jsonl", "patch.diff", "batch.jsonl"

_ATTEMPT = re.compile(r"session\.attempt-(\d+)\.jsonl")
CHILDREN_SCAN = 1000   # the newest jobs searched for ones that continue this one (they are newer than it)
REFRESH_S = 2          # how often a watched page reloads itself
WATCH_WAIT_S = 2.0     # and how long --watch waits for the job's next event before it rewrites the page anyway


class ViewError(click.ClickException):
    """One line, exit 2 (pid.cli.main prints ClickExceptions as `pid: error: ...`)."""
    exit_code = 2


@click.command("view", short_help="Write a job's or a batch's page (HTML).")
@click.argument("target", metavar="ID|DIR")
@click.option("-o", "--output", metavar="FILE", type=click.Path(dir_okay=False),
              help="Where to write the page (default: pid-view-<id>.html here for a job; DIR/view/index.html for a "
                   "batch, its items' pages beside it; with -o FILE, in FILE-items/ beside FILE).")
@click.option("--open", "open_page", is_flag=True, help="Open the page in a browser, where there is one.")
@click.option("--watch", is_flag=True,
              help="For a job by id: keep rewriting its page while the job runs (the page reloads itself every "
                   f"{REFRESH_S} s); stops when the job ends, or on Ctrl-C.")
def view(target: str, output: str | None, open_page: bool, watch: bool) -> None:
    """Write a job (by id, or its artifacts' directory) or a batch directory as one self-contained HTML page: the
    result, the transcript with every tool call and edit, the patch; for a batch, a sortable table of its items
    linking to each item's page. A job by id links the job it continues and those that continue it, whose pages
    are written beside its own (pid-view-<id>.html). Prints the page's path."""
    if watch and os.path.isdir(target):
        raise ViewError("--watch takes a job id (a directory's page is written once)")

    def opened(path: str) -> None:
        echo(path)
        if open_page and not open_in_browser(path):
            echo("pid: no browser here (no $BROWSER, no display): open the file above yourself", err=True)
    if os.path.isdir(target):
        opened(_view_dir(target, output))
    elif watch:
        _watch(target, output, opened)
    else:
        opened(_view_job_id(target, output))


def _view_dir(directory: str, output: str | None) -> str:
    from pid.cli.pages.batch import render_batch
    from pid.cli.pages.job import read_result, render_job
    if os.path.isfile(os.path.join(directory, BATCH)):
        default = os.path.join(directory, "view")
        if output is None and any(os.path.exists(os.path.join(default, n)) for n in (RESULT, SESSION)):
            raise ViewError(f"{default} is an item's folder (an item whose id is 'view'): pass -o FILE")
        index = os.path.abspath(output or os.path.join(default, "index.html"))
        _check_writable(os.path.dirname(index), create=output is None)
        try:
            path, _ = render_batch(directory, os.path.dirname(index), os.path.basename(index),
                                   items_dir="" if output is None else _items_dir(index))
        except OSError as exc:
            raise ViewError(f"cannot write {index}: {exc.strerror or exc}") from None
        return path
    if not any(os.path.isfile(os.path.join(directory, name)) for name in (RESULT, SESSION)):
        raise ViewError(f"{directory}: neither a batch directory ({BATCH}) nor a job's artifacts ({RESULT}, "
                        f"{SESSION})")
    job_id = str((read_result(directory) or {}).get("id") or os.path.basename(os.path.abspath(directory)))
    return _write(output, job_id, render_job(directory))


def _store_and_record(job_id: str) -> tuple[Any, Any]:
    from pid.config import HomeUnusable, ensure_pid_home
    try:
        ensure_pid_home()
    except HomeUnusable as exc:
        raise ViewError(str(exc)) from None
    from pid.cli.ids import NoSuchJob, resolve
    from pid.jobs.store import default_store
    store = default_store()
    try:
        job_id = resolve(store, job_id)
    except NoSuchJob as exc:
        if not exc.message.startswith("no such job:"):   # ambiguous, or a batch item without a job
            raise
        looks_like_path = os.sep in job_id or job_id.startswith(".")
        raise ViewError(f"no such {'directory' if looks_like_path else 'job or directory'}: {job_id}") from None
    record = store.get(job_id)
    if record is None:   # gone since (expired)
        raise ViewError(f"no such job: {job_id}")
    return store, record


def _view_job_id(job_id: str, output: str | None, refresh_s: int | None = None, family: bool = True) -> str:
    """The job's page; with `family`, first the pages of the job it continues and of those that continue it, beside
    it. Each page links to those of its relatives that are there (the others are named by id)."""
    store, record = _store_and_record(job_id)
    path = _page_path(output, record.id)
    here = os.path.dirname(path)
    relatives = _relatives(store, record)
    pages = {record.id: os.path.basename(path)}
    for _, other in relatives:
        name = _page_name(other.id)
        if family or os.path.isfile(os.path.join(here, name)):
            pages.setdefault(other.id, name)
    if family:
        for _, other in relatives:   # best-effort: a relative without artifacts has no page, only its id
            try:
                _write_job_page(store, other, os.path.join(here, pages[other.id]), pages, _relatives(store, other),
                                None)
            except ViewError:
                del pages[other.id]
    _write_job_page(store, record, path, pages, relatives, refresh_s)
    return path


def _write_job_page(store: Any, record: Any, path: str, pages: dict[str, str], relatives: list[tuple[str, Any]],
                    refresh_s: int | None) -> None:
    from pid.cli.pages.job import Relative, render_job
    linked = [Relative(role, other.id, pages.get(other.id)) for role, other in relatives]
    with tempfile.TemporaryDirectory(prefix="pid-view-") as tmp:
        where = _artifacts(store, record, tmp)
        if where is None:
            raise ViewError(f"job {record.id} ({record.status}) has no result or transcript yet, neither in the job "
                            f"store nor in {record.spec.job_dir}")
        _write_path(path, render_job(where, fallback=_from_record(record), relatives=linked, refresh_s=refresh_s))


def _relatives(store: Any, record: Any) -> list[tuple[str, Any]]:
    """(role, record): the job this one continues, the one it runs again, and the jobs that continue it (found
    among the newest CHILDREN_SCAN jobs of the store)."""
    out: list[tuple[str, Any]] = []
    for key, role in (("parent", "continues"), ("retry_of", "retry of")):
        other = store.get(getattr(record.spec, key)) if getattr(record.spec, key, None) else None
        if other is not None:
            out.append((role, other))
    children = [r for r in store.list(limit=CHILDREN_SCAN) if r.spec.parent == record.id]
    out.extend(("continued by", child) for child in sorted(children, key=lambda r: r.created_at))
    return out


def _watch(job_id: str, output: str | None, opened: Any) -> None:
    """Rewrites the page on each new event of the job (or every WATCH_WAIT_S) while it runs; the page reloads
    itself meanwhile. The last write, when the job has ended (or on Ctrl-C), has no reload."""
    store, record = _store_and_record(job_id)
    path = ""
    seen = 0
    try:
        while True:
            record = store.get(record.id) or record
            live = not record.terminal
            try:
                path = _view_job_id(record.id, output, REFRESH_S if live else None, family=not path or not live)
            except ViewError:
                if not live:
                    raise
                path = _placeholder(output, record)   # queued: nothing to show yet, but a page that reloads
            if opened is not None:
                opened(path)
                opened = None
                if live:
                    echo(f"watching job {record.id}: the page is rewritten as it goes, until it ends (Ctrl-C stops)",
                         err=True)
            if not live:
                return
            events = store.events(record.id, after=seen, wait_s=WATCH_WAIT_S)   # nothing new: rewritten anyway
            seen = events[-1][0] if events else seen
    except KeyboardInterrupt:
        echo("", err=True)   # the shell's prompt on a line of its own, not after the ^C
        if path:   # a page that no longer reloads: nobody rewrites it now
            try:
                try:
                    _view_job_id(record.id, output, None)
                except ViewError:   # (still no transcript: the placeholder, without its reload)
                    _placeholder(output, record, watching=False)
            except ViewError as exc:   # (the page cannot be written now: said, and still the exit of a Ctrl-C)
                echo(f"pid: error: {one_line(exc.format_message())}", err=True)
        raise SystemExit(130) from None


def _placeholder(output: str | None, record: Any, watching: bool = True) -> str:
    from pid.cli.pages.blocks import esc, page
    path = _page_path(output, record.id)
    said = (f"This page reloads every {REFRESH_S} s while pid view --watch runs." if watching else
            "pid view --watch was stopped: this page is not rewritten any more.")
    body = f"<h1>pid job <code>{esc(record.id)}</code></h1><p>{esc(record.status)}: no transcript yet. {said}</p>"
    _write_path(path, page(f"pid job {record.id}", body, refresh_s=REFRESH_S if watching else None))
    return path


def _artifacts(store: Any, record: Any, tmp: str) -> str | None:
    """A directory holding the job's result.json / session.jsonl / patch.diff: the job's own out directory when it
    holds what the store has (a worker on this machine wrote it), else what the store has, fetched into tmp (only
    these three: collected files may be large), else the out directory if it holds anything."""
    from pid.jobs.artifact_store import already_local
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
        from pid.jobs.store import BlobMissing
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


def _page_name(job_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", job_id)[:100] or "job"
    return f"pid-view-{safe}.html"


def _page_path(output: str | None, job_id: str) -> str:
    path = os.path.abspath(output or _page_name(job_id))
    _check_writable(os.path.dirname(path), create=False)
    return path


def _write(output: str | None, job_id: str, text: str) -> str:
    return _write_path(_page_path(output, job_id), text)


def _write_path(path: str, text: str) -> str:
    from pid.cli.pages.blocks import write_page
    try:
        write_page(path, text)
    except OSError as exc:
        raise ViewError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def _items_dir(index: str) -> str:
    """The folder beside a batch page named with -o that holds its items' pages: FILE's name without .html, then
    "-items" (report.html: report-items/)."""
    name = os.path.basename(index)
    return (name[:-5] if name.lower().endswith(".html") else name) + "-items"


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
