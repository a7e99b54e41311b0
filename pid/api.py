"""pid's Python API: submit jobs, follow them, run one in the foreground, from a Python program (an eval harness, a
CI tool) without a `pid` process per job. docs/api.md shows it in use.

The options are the `pid run` / `pid submit` options under their JobSpec names (timeout_s=600, max_turns=30,
out_dir=…, api_key=…, no_images=True, queue=…, max_workspace=…), with the same defaults (the same PID_*
environment variables) and the same checks: each keyword goes through the command's own option, so a bad value
raises PidError with the one line `pid` prints for it, after `pid: error:`. A job then goes through the same
function `pid submit` calls (pid/jobs/submission.py), and a batch through `pid batch`'s own (pid/jobs/batch_setup.py,
batch_run.py), which report to the API as they report to the command: no output is parsed here.

Importing this module loads neither Celery, nor Docker's SDK, nor pid's worker: what each call needs is imported
when it is called (pid.run alone loads the agent and the sandbox, as `pid run` does).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, ParamSpec, TypeVar

from pid.errors import PidError

P = ParamSpec("P")
R = TypeVar("R")

# A library's log records are its caller's to show (logging's advice for libraries): pid's (a sweep putting a lost
# job back in the queue) never reach stderr on their own. What the caller should see is a Python warning (_warn).
logging.getLogger("pid").addHandler(logging.NullHandler())

# Command-line options that are about the terminal, not the job: the API returns values instead of printing them.
_CLI_ONLY = {"as_json", "wait", "verbose"}
# `pid batch`'s own options (pid.jobs.batch_setup.Options); the others are the job options, every item's defaults.
_BATCH_OPTIONS = {"api_key", "no_images", "repo", "queue", "max_workspace", "workers", "max_total_cost",
                  "max_running", "allow_outside", "retry_failed"}
_BATCH_CLI_ONLY = {"detach", "status_dir", "wait_dir", "cancel_dir"}   # the command line's only
POLL_S = 0.2            # how often a wait looks at the job's record
SWEEP_EVERY_S = 5.0     # how often a wait looks for jobs whose process died (as `pid result --wait` does)


@contextlib.contextmanager
def _store_reached() -> Iterator[None]:
    """A job store that cannot be reached (or refuses pid) is PidError with the CLI's line, not its library's
    exception."""
    try:
        yield
    except PidError:
        raise
    except Exception as exc:
        from pid.jobs.reach import unreachable_store
        line = unreachable_store(exc)
        if line is None:
            raise
        raise PidError(line) from None


def _reached(fn: Callable[P, R]) -> Callable[P, R]:
    """fn, under _store_reached."""
    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        with _store_reached():
            return fn(*args, **kwargs)
    return call


@_reached
def submit(task: str, repo: str | os.PathLike[str] | None = None, **options: Any) -> Job:
    """Queue a job for a worker, as `pid submit` does; returns it at once. A directory `repo` is packed now: the
    job sees it as it is now."""
    params = _parse("submit", task, repo, options)
    from pid.jobs import submission
    spec = submission.submit(params, api_key=params.pop("api_key"), no_images=params.pop("no_images"),
                             max_workspace=params.pop("max_workspace"), queue=params.pop("queue"), warn=_warn)
    return Job(spec.id)


@_reached
def run(task: str, repo: str | os.PathLike[str] | None = None, *, on_start: Callable[[Job], None] | None = None,
        **options: Any) -> dict[str, Any]:
    """Run one job in this process, as `pid run` does (no queue, no worker; its sandbox on this machine's engine),
    and return its result: what `pid run --json` prints (result.json; the patch is OUT/<id>/patch.diff, or
    pid.job(result["id"]).patch()). A failed or cancelled job is a result too; PidError is for what stops it before
    it starts. It is in the job store meanwhile: `pid list`, `pid steer`, `pid cancel` reach it, and so does the Job
    that `on_start(job)` is given as it goes in (from this thread: another thread may steer or cancel it)."""
    _callable_or_none("on_start", on_start)
    params = _parse("run", task, repo, options)
    from pid.jobs import submission
    api_key = params.pop("api_key")
    spec = submission.prepare_run(params, api_key=api_key, no_images=params.pop("no_images"),
                                  max_workspace=params.pop("max_workspace"), warn=_warn)
    starting, job = submission.start_foreground(spec)
    if on_start is not None:
        try:
            on_start(Job(spec.id))
        except BaseException as exc:   # the job ends before its agent starts, and its sandbox goes
            from pid.worker.sandbox_start import abandon
            abandon(starting)
            job.end(None, error=None if isinstance(exc, KeyboardInterrupt) else
                    f"on_start raised {type(exc).__name__}: {exc}")
            raise
    return _warned_of(submission.run_foreground(spec, job, starting, api_key=api_key, sink=_notices_warned))


@_reached
def batch(tasks: str | os.PathLike[str], out: str | os.PathLike[str],
          on_item: Callable[[dict[str, Any]], None] | None = None, **options: Any) -> dict[str, Any]:
    """Run a batch in this process, in the calling thread (any thread), as `pid batch TASKS --out OUT` does, and
    return what `pid batch --json` prints: {"items": [each item's batch.jsonl object, as it ended in this call],
    "summary": summary.json's data}; `on_item(row)` is called with each as it ends. Its options are the
    command's (workers=2, max_total_cost=…, max_running=…, retry_failed=True, allow_outside=True, and every job
    option as every item's default); running it again with the same OUT resumes the batch. A KeyboardInterrupt
    while it runs cancels the batch's jobs that have not ended (without waiting for the running ones to stop),
    writes batch.jsonl and summary.json as far as they got, and propagates."""
    from pid.jobs.batch_setup import run_batch
    _callable_or_none("on_item", on_item)
    tasks_path, out_dir, opts = _batch_options("batch", tasks, out, options, _CLI_ONLY | _BATCH_CLI_ONLY)
    return run_batch(tasks_path, out_dir, opts, display=_Items(on_item), warn=_warn)


@_reached
def submit_batch(tasks: str | os.PathLike[str], out: str | os.PathLike[str], **options: Any) -> Batch:
    """Submit a batch's jobs (or resume it) and return at once, as `pid batch TASKS --out OUT --detach` does;
    workers elsewhere run them. The options are pid.batch's but `workers` (they would stop as this returns)."""
    from pid.jobs.batch_setup import submit_batch as submit_jobs
    tasks_path, out_dir, opts = _batch_options("submit_batch", tasks, out, options,
                                              _CLI_ONLY | _BATCH_CLI_ONLY | {"workers"})
    return Batch(submit_jobs(tasks_path, out_dir, opts, warn=_warn).bdir.path)


@_reached
def open_batch(out: str | os.PathLike[str]) -> Batch:
    """The batch whose output directory is `out` (started by pid.batch, pid.submit_batch or `pid batch`);
    PidError if it is none."""
    from pid.jobs.batch_setup import open_dir
    if not isinstance(out, (str, os.PathLike)):
        raise PidError(f"the batch's directory must be a path, not {type(out).__name__}")
    _ready()
    path = os.path.abspath(os.path.expanduser(os.fspath(out)))
    open_dir(path)
    return Batch(path)


@dataclass
class Batch:
    """A batch, by its output directory: each method reads it and the job store afresh, from any process that
    shares them."""
    out: str

    @property
    @_reached
    def id(self) -> str:
        from pid.jobs.batch_setup import open_dir
        return open_dir(self.out).batch_id

    @_reached
    def status(self) -> dict[str, Any]:
        """Where its items are, no waiting: what `pid batch --status OUT --json` prints ({"batch", "items",
        "counts" by status, "cost", "budget", "item_states": each item's id, job_id, status, turns, cost, detail})."""
        from pid.jobs.batch_control import status
        from pid.jobs.batch_setup import default_store, open_dir
        return status(open_dir(self.out), default_store()).as_dict()

    @_reached
    def wait(self, on_item: Callable[[dict[str, Any]], None] | None = None,
             timeout: float | None = None) -> dict[str, Any]:
        """Follow its jobs that have not ended to their end (downloaded into OUT, recorded) and return what
        pid.batch returns: {"items": [those that ended in this call], "summary": {…}}; a KeyboardInterrupt as
        there. TimeoutError after `timeout` seconds, the jobs going on (those that ended meanwhile are recorded,
        and given to on_item). `pid batch --wait OUT --json`."""
        from pid.jobs.batch_setup import wait_batch
        _callable_or_none("on_item", on_item)
        return wait_batch(self.out, _Items(on_item), warn=_warn, timeout=_seconds_or_none(timeout))

    @_reached
    def cancel(self) -> list[dict[str, str]]:
        """Cancel every job of the batch that has not ended: {"item", "job", "status"} each, "cancelled" (it was
        queued) or "running" (its worker stops it). `pid batch --cancel OUT`; the same pid.batch call resumes them."""
        from pid.jobs.batch_control import cancel
        from pid.jobs.batch_setup import default_store, open_dir
        return cancel(open_dir(self.out), default_store())


def _seconds_or_none(timeout: Any) -> float | None:
    """A wait's timeout, checked: seconds, 0 or more, or None (no limit)."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout >= 0):
        raise PidError(f"timeout must be a number of seconds, 0 or more (or None), not {timeout!r}")
    return timeout


def _callable_or_none(name: str, hook: Any) -> None:
    if hook is not None and not callable(hook):
        raise PidError(f"{name} must be a function (or None), not {type(hook).__name__}")


def _batch_options(name: str, tasks: Any, out: Any, options: dict[str, Any],
                   cli_only: set[str]) -> tuple[str, str, Any]:
    """pid.batch's (pid.`name`'s) keywords through `pid batch`'s options: the tasks file, the output directory and
    the rest."""
    from pid.jobs.batch_setup import Options
    if not isinstance(tasks, (str, os.PathLike)):
        raise PidError(f"the tasks file must be a path, not {type(tasks).__name__}")
    if not isinstance(out, (str, os.PathLike)):
        raise PidError(f"the batch's directory must be a path, not {type(out).__name__}")
    if "out_dir" in options:   # (the batch's directory is `out`; the job option has no other meaning here)
        raise PidError(f"pid.{name}() takes no option 'out_dir': the batch's directory is its `out` argument")
    params = _parse("batch", os.fspath(tasks), None, {**options, "out_dir": os.fspath(out)}, cli_only, name)
    job = {k: v for k, v in params.items() if k not in _BATCH_OPTIONS | _BATCH_CLI_ONLY | {"tasks"}}
    out_dir = job.pop("out_dir")
    return params["tasks"], out_dir, Options(job=job, **{k: v for k, v in params.items() if k in _BATCH_OPTIONS})


@_reached
def job(job_id: str) -> Job:
    """A Job for a job already in the store (submitted here, by `pid submit`, or on another machine sharing the
    store), by its whole id; PidError if there is none."""
    from pid.jobs import submission
    if not isinstance(job_id, str):
        raise PidError(f"pid.job() takes a job's id, a string, not {type(job_id).__name__}")
    _ready()
    handle = Job(job_id)
    store = handle._store()
    try:
        submission.job_record(store, job_id)
    except PidError as exc:   # (no such job: the store itself answered)
        raise PidError(f"{exc} (pid.job() takes a job's whole id, as pid list --json gives it)") from None
    return handle


@_reached
def list_jobs(limit: int | None = None, status: str | None = None,
              batch: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """The newest jobs in the store, newest first, at most `limit` (None: 20, or all of a batch's), as `pid list
    --json` gives them (each a dict: `id`, `status`, `task`, `exit_reason`, counts, usage, times, …;
    `pid.job(d["id"])` is its Job). `status` keeps the jobs in it (queued, running, or an ending's); `batch` those of
    the batch whose output directory it is, each then with its `item` and whether it is the item's `current` job
    (else a retry replaced it)."""
    from pid.endings import JOB_STATUSES
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise PidError(f"pid.list_jobs(): limit is a whole number from 1 on, or None, not {limit!r}")
    if status is not None and status not in JOB_STATUSES:
        raise PidError(f"pid.list_jobs(): no job status {status!r} ({', '.join(JOB_STATUSES)})")
    _ready()
    from pid.jobs.batch_control import batch_jobs, listed
    from pid.jobs.store import LIST_LIMIT, default_store
    from pid.jobs.sweep import sweep_quietly
    store = default_store()
    sweep_quietly(store)
    if batch is None:
        return listed(store.list(LIST_LIMIT if limit is None else limit, status), None)
    return listed(*batch_jobs(store, os.fspath(batch), limit, status))


@dataclass
class Job:
    """A job in the store, by id: every method asks the store, so it works from any process or machine that
    shares it, whichever worker runs the job."""
    id: str
    _cached_store: Any = field(default=None, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        """Its id alone: a Job goes to another process (multiprocessing) as what it is, a name in the store."""
        return {"id": self.id}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.id, self._cached_store = state["id"], None

    def _store(self) -> Any:
        if self._cached_store is None:
            from pid.jobs.store import default_store
            self._cached_store = default_store()
        return self._cached_store

    def _record(self) -> Any:
        from pid.jobs.submission import job_record
        return job_record(self._store(), self.id)

    @_reached
    def status(self) -> str:
        """queued, running, or how it ended (pid.endings.STATUSES: completed, failed, cancelled, …)."""
        return str(self._record().status)

    def __hash__(self) -> int:   # (a job is its id: a dict's key, a set's member)
        return hash(self.id)

    @_reached
    def paused(self) -> bool:
        """A pause holds the job (pause(); `pid pause`): it makes no model call until resumed."""
        return bool(self._record().held)

    @_reached
    def done(self) -> bool:
        """The job has ended (its result is there, or follows within moments)."""
        return bool(self._record().terminal)

    @_reached
    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the job ends and return its result (see result()); TimeoutError after `timeout` seconds,
        the job going on. Meanwhile a job whose process died is found and ended, as `pid result --wait` does."""
        from pid.jobs.sweep import sweep_quietly
        timeout = _seconds_or_none(timeout)
        from pid import settings
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        next_sweep = started + SWEEP_EVERY_S
        from pid.jobs.workers import QueuedNotice
        queued = QueuedNotice(self._store(), self.id, settings.NO_WORKER_NOTICE_S.get())
        while not self.done():
            now = time.monotonic()
            line = queued()   # (as `pid result --wait` says it)
            if line is not None:
                _warn(line)
            if deadline is not None and now >= deadline:
                record = self._record()
                held = " (paused: resume() lets it go on)" if record.held else ""
                raise TimeoutError(f"job {self.id} is still {record.status}{held} after {timeout:g}s")
            if now >= next_sweep:
                next_sweep = now + SWEEP_EVERY_S
                sweep_quietly(self._store())
            time.sleep(POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - now)))
        return _warned_of(self.result())

    @_reached
    def result(self) -> dict[str, Any]:
        """The ended job's result.json, as `pid result --json` prints it (its exit reason, usage, cost, check; the
        patch's file name in result["artifacts"]["patch"], its text from patch()); PidError if it has not ended
        (wait() waits)."""
        from pid.jobs.submission import load_result
        record = self._record()
        if not record.terminal:
            raise PidError(f"job {self.id} is {record.status}: no result yet")
        return load_result(self._store(), self.id)

    def patch(self) -> str | None:
        """The ended job's patch.diff (its change to the workspace), from the job store wherever it ran, as text to
        read: "" when the job changed nothing; None when it left no patch (it never ran, or its sandbox was lost
        before the patch was taken). PidError if it has not ended. Bytes that are not UTF-8 (a file in Latin-1)
        are kept as surrogates: to write or `git apply` it, take patch_bytes()."""
        patch = self.patch_bytes()
        return None if patch is None else patch.decode("utf-8", "surrogateescape")

    @_reached
    def patch_bytes(self) -> bytes | None:
        """The ended job's patch.diff as it is, `git apply`-able: what patch() reads, byte for byte."""
        from pid.jobs.artifact_store import PATCH
        result = self.result()   # (ended, and its artifacts uploaded with its result)
        store = self._store()
        if "patch" not in result.get("artifacts", {}) or PATCH not in store.artifact_names(self.id):
            return None
        return b"".join(store.open_artifact(self.id, PATCH))

    @_reached
    def download(self, dest: str | os.PathLike[str]) -> str:
        """Every artifact of the ended job (result.json, patch.diff, session.jsonl, the files collected under
        files/…) from the job store into the directory `dest` (made if missing; one that is not empty must hold this
        job's earlier download), wherever the job ran; returns its absolute path. `pid result ID --download DEST`.
        PidError if it has not ended or its artifacts cannot all be written."""
        from pid.jobs.artifact_store import DownloadError, download
        if not isinstance(dest, (str, os.PathLike)) or not os.fspath(dest):
            raise PidError(f"dest must be a directory's path, not {dest!r}")
        self.result()   # (ended, its artifacts stored with its result)
        path = os.path.abspath(os.path.expanduser(os.fspath(dest)))
        try:
            download(self._store(), self.id, path)
        except DownloadError as exc:
            raise PidError(str(exc)) from None
        return path

    def logs(self, follow: bool = True) -> Iterator[dict[str, Any]]:
        """The job's log records (what `pid logs --json` prints, one dict each: tool calls, model errors, the job's
        starts and end), from the first; with follow, going on as they come until the job ends."""
        if not isinstance(follow, bool):
            raise PidError(f"follow must be True or False, not {follow!r}")
        return self._logs(follow)

    def _logs(self, follow: bool) -> Iterator[dict[str, Any]]:
        from pid.jobs.store import with_dropped
        with _store_reached():
            store, after = self._store(), 0
            while True:
                ended = self._record().terminal   # (read before the events: the last ones are in by then)
                events = store.events(self.id, after=after, wait_s=1.0 if follow and not ended else 0)
                for after, record in with_dropped(events, after):
                    yield record
                if not follow or ended:
                    return

    @_reached
    def cancel(self) -> str:
        """Cancel the job; returns "running" (its process stops it and keeps the artifacts so far, wait() for its
        end) or "cancelled" (it had not started: it ended now). PidError if it has ended already."""
        from pid.jobs.submission import cancel
        return cancel(self._store(), self.id)

    @_reached
    def steer(self, message: str) -> None:
        """A message the agent gets after its current tool calls, before its next model call (`pid steer`)."""
        from pid.jobs.submission import post
        post(self._store(), self.id, "steer", message)

    @_reached
    def follow_up(self, message: str) -> None:
        """A message the agent gets when it would otherwise stop (`pid follow-up`)."""
        from pid.jobs.submission import post
        post(self._store(), self.id, "follow_up", message)

    @_reached
    def retry(self, **options: Any) -> Job:
        """Run the ended job again as a new job (`pid retry`): the same task and options, on the same workspace
        snapshot; returns the new job, queued. Options: model, base_url, api (who answers now), out_dir, queue,
        api_key (the earlier job's key was forgotten when it ended). PidError if this job has not ended."""
        from pid.jobs import requeue
        params = _params("retry", [self.id], options, api_name="Job.retry")
        _, spec = requeue.retry(self.id, _rerun(params), _warn)
        return Job(spec.id)

    @_reached
    def continue_(self, message: str, **options: Any) -> Job:
        """A new job that carries on this ended one's conversation with `message` (`pid continue`), on its snapshot
        with its patch applied, so the new job's patch holds both jobs' changes; returns it, queued. Options:
        model, base_url, api (who answers now), max_turns, timeout_s, max_cost (the earlier job's by default),
        out_dir, queue, api_key. PidError if this job has not ended or left no transcript."""
        from pid.jobs import requeue
        if not isinstance(message, str):
            raise PidError(f"the message must be text, not {type(message).__name__}")
        params = _params("continue", [self.id, message], options, api_name="Job.continue_")
        _, spec = requeue.continue_job(self.id, message, _rerun(params), _warn)
        return Job(spec.id)

    @_reached
    def pause(self) -> None:
        """Hold the job before its next model call (`pid pause`; a queued one holds once it starts). Its wall
        clock keeps running. PidError if it has ended, or its agent has (its check or its artifacts under way)."""
        from pid.jobs.submission import set_paused
        set_paused(self._store(), self.id, True)

    @_reached
    def resume(self) -> None:
        """Let a paused job go on (`pid resume`); PidError if it is not paused."""
        from pid.jobs.submission import set_paused
        set_paused(self._store(), self.id, False)


def _rerun(params: dict[str, Any]) -> Any:
    from pid.jobs.requeue import LIMITS, Rerun
    return Rerun(params["out_dir"], params["queue"], params["api_key"], params.get("model"), params.get("base_url"),
                 params.get("api"), {name: params[name] for name in LIMITS if name in params})


class _Items:
    """pid.batch's display: each ended item to on_item, the notes as warnings (the batch's own collector keeps
    the rows)."""

    def __init__(self, on_item: Callable[[dict[str, Any]], None] | None) -> None:
        self.on_item = on_item

    def item_ended(self, row: dict[str, Any], progress: Any) -> None:
        if self.on_item is not None:
            self.on_item(row)

    def update(self, progress: Any) -> None:
        pass

    def note(self, text: str) -> None:
        _warn(text)

    def stop(self) -> None:
        pass


def _warned_of(result: dict[str, Any]) -> dict[str, Any]:
    """A result, with the warning its ending deserves where the CLI prints one under the summary."""
    from pid.cli.output import missing_originals_warning
    text = missing_originals_warning(result)
    if text:
        _warn(text)
    return result


def _notices_warned(event: Any) -> None:
    """pid.run's sink: the agent's warnings (a model not in the model table: no prices, a context window assumed)
    are Python warnings, where `pid run` prints them."""
    from pid.events import Notice
    if isinstance(event, Notice) and event.level == "warning":
        _warn(event.text)


def _warn(text: str) -> None:
    """What is allowed but worth saying (a sandbox on the network): a Python warning, where the CLI prints a line,
    named by the caller's line (not pid's: Python shows a warning once per line that raised it). Sanitised as the
    CLI's line is: it may quote a tasks file's paths, and Python prints it to the terminal."""
    from pid.terminal import one_line
    text = one_line(text)
    warnings.warn(text if text.startswith("pid: ") else f"pid: {text}", stacklevel=_caller_level())


def _caller_level() -> int:
    """warnings.warn's stacklevel for the first frame outside pid's own code (Python 3.12's skip_file_prefixes)."""
    own = os.path.dirname(__file__) + os.sep   # (the package: its sandbox/, jobs/, … are imported as pid.*)
    frame: Any = sys._getframe(2)   # (_warn's caller, as warnings.warn counts from _warn)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(own):
        frame, level = frame.f_back, level + 1
    return level


def _parse(command_name: str, task: Any, repo: Any, options: dict[str, Any],
           cli_only: set[str] = _CLI_ONLY, api_name: str | None = None) -> dict[str, Any]:
    """The keyword options through the command's own click options (`pid run`, `pid submit`, `pid batch`): their
    defaults, environment variables and checks; returns the values the command's function would get (`task`: its
    argument). A refusal is PidError with the CLI's one line; so is an unusable PID_HOME, which stops every command
    first."""
    if not isinstance(task, str):
        raise PidError(f"the task must be text, not {type(task).__name__}")
    if repo is not None and not isinstance(repo, (str, os.PathLike)):
        raise PidError(f"repo must be a path or a URL, not {type(repo).__name__}")
    given = options if repo is None else {"repo": os.fspath(repo), **options}
    return _params(command_name, [task], given, cli_only, api_name)


def _params(command_name: str, arguments: list[str], options: dict[str, Any], cli_only: set[str] = _CLI_ONLY,
            api_name: str | None = None) -> dict[str, Any]:
    """The command's parameters for these arguments and keyword options, parsed and checked as `pid` parses them."""
    import click

    from pid.terminal import one_line
    command = _command(command_name)
    args = _args(command, api_name or command_name, options, cli_only)
    try:
        ctx = command.make_context(f"pid {command_name}", [*args, "--", *arguments])
    except click.ClickException as exc:
        raise PidError(one_line(exc.format_message())) from None
    _ready()
    return {k: v for k, v in ctx.params.items() if k not in _CLI_ONLY}


def _ready() -> None:
    """What every `pid` command checks before it does anything (pid.config.check_ready)."""
    from pid.config import check_ready
    check_ready()



def _command(name: str) -> Any:
    """The `pid` command of this name: its options are the API's."""
    import click

    from pid.cli.main import cli
    if name in ("continue", "retry"):   # (pid.cli.rerun's, which `pid` registers when they are named)
        from pid.cli import main
        from pid.cli.rerun import register
        register(cli, main)
    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    return command


def _args(command: Any, command_name: str, options: dict[str, Any], cli_only: set[str] = _CLI_ONLY) -> list[str]:
    """The keywords as command-line words (`--flag=value`), each checked to be one of the command's options."""
    import click

    from pid.cli.options import OnceOption
    params = {p.name: p for p in command.params if isinstance(p, click.Option) and p.name not in cli_only}
    args: list[str] = []
    for name, value in options.items():
        param = params.get(name)
        if param is None:
            taken = sorted(n for n in params if n and not (n == "out_dir" and command_name.endswith("batch")))
            raise PidError(f"pid.{command_name}() takes no option {name!r} (it takes {', '.join(taken)})")
        if value is None:
            continue
        flag = max(param.opts, key=len)
        if param.is_flag:
            if not isinstance(value, bool):
                raise PidError(f"{flag}: {value!r} is not True or False")
            args += [flag] if value else []
            continue
        if isinstance(param, OnceOption) and not isinstance(value, str):   # (check=[] had meant no check at all)
            raise PidError(f"{flag} takes one value, a string, not {type(value).__name__}")
        if isinstance(value, (set, frozenset)):   # (tools={"read", "bash"}: in a set's order, which is none)
            value = sorted(value, key=str)
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        # a name, a path, a key: never a number (as a tasks file says)
        text = isinstance(param.type, (click.types.StringParamType, click.Path))
        wanted = "strings or paths (or a list of them)" if param.multiple else "a string"
        for item in items:
            if text and not isinstance(item, (str, os.PathLike)):
                raise PidError(f"{flag} takes {wanted}, not {type(item).__name__}")
            if not isinstance(item, (str, int, float, os.PathLike)):   # (a dict would have become its repr)
                what = ("strings, numbers or paths (or a list of them)" if param.multiple else
                        "a string" if text else "a number (int or float) or a string")
                raise PidError(f"{flag} takes {what}, not {type(item).__name__}")
        args += [f"{flag}={_as_text(v)}" for v in (items if param.multiple else [value])]
    return args


def _as_text(value: Any) -> str:
    """A value as it would be typed after its flag: the option's own type then reads it as the CLI does."""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)   # --tools read,bash
    return repr(value) if isinstance(value, float) else str(value)
