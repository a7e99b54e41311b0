"""The `pid` command. Thin: parse, call, print. Exit codes: 0 completed (and its --check passed), 1 failed or
cancelled, 2 bad usage or input (nothing ran), 3 a limit was hit (timeout, max turns, max cost), 4 completed but its
--check failed, 5 `pid result` of a job not finished yet, 130 interrupted (Ctrl-C; `pid run` stopped by SIGTERM 143,
by SIGHUP 129). A job's codes (0, 1, 3, 4) come from pid.endings.exit_code_for. `pid batch` (cli/batch.py) exits with
its worst item's code."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import asdict
from typing import Any, Callable, NoReturn

import click

import pid.cli as cli_package
from pid import settings
from pid.costs import format_cost
from pid.config import check_ready, pid_home
from pid.cli.ids import JOB_ID, NoSuchJob
from pid.cli.options import (MAX_WORKSPACE_OPTION, QUEUE_OPTION, EnvOption, Number, PoolSpec, QueueName, Url,
                             job_options)
from pid.cli.status_line import on_terminal
from pid.cli.output import (EventFollower, EventPrinter, RecordPrinter, check_line, echo, format_duration,
                            print_result, styled, wait_for)
from pid.terminal import dumps, one_line
from pid.endings import JOB_STATUSES, exit_code_for
from pid.jobs.clients import MissingClient
from pid.errors import PidError
from pid.jobs.spec import DEFAULT_QUEUE, MAX_MESSAGE_BYTES, MAX_MESSAGE_WORDS, JobSpec
from pid.jobs import submission
# The checks a job's options pass, shared with the Python API (pid/api.py); here under the names the other commands use
from pid.jobs.submission import (RESULT_GRACE_S, check_api_key, check_broker, check_cpus, check_image,  # noqa: F401
                                 check_out_dir, check_runtime, load_result)

EXIT_NOT_FINISHED = 5      # `pid result` of a job that has not ended (without --wait)
EXIT_INTERRUPTED = 130     # Ctrl-C, as a shell reports it
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)   # what stops a foreground run as Ctrl-C does
SWEEP_WHILE_WAITING_S = 5.0   # how often a `--wait` looks for jobs whose process died


class BadInput(click.ClickException, PidError):
    """One line on stderr and exit code 2, never a traceback. (A PidError: what the shared checks raise, the
    commands turn into this one, PidCommand.invoke.)"""
    exit_code = 2

    def show(self, file: Any = None) -> None:
        echo(f"pid: error: {one_line(self.format_message())}", err=True)


def before_command() -> None:
    """What every command checks once its arguments are parsed (so --help still works): a PID_* variable set to what
    it cannot be, an unusable PID_HOME (where every command keeps its state). Either stops it before it does
    anything, in one line (BadInput)."""
    try:
        check_ready()
    except PidError as exc:
        raise BadInput(str(exc)) from None


class PidCommand(click.Command):
    """A command of pid's: before_command, then a shared check's refusal is its one line."""

    def invoke(self, ctx: click.Context) -> Any:
        before_command()
        return as_bad_input(lambda: super(PidCommand, self).invoke(ctx))


def as_bad_input(call: Callable[[], Any]) -> Any:
    """A shared check's refusal (PidError, pid/jobs/submission.py) is the command's one line and exit 2."""
    try:
        return call()
    except BadInput:
        raise
    except PidError as exc:
        raise BadInput(str(exc)) from None


def warn_line(text: str) -> None:
    echo(f"pid: warning: {text}", err=True)


class PidGroup(click.Group):
    """pid's commands; those that live in their own modules are imported only when named (or listed by --help), so
    `pid submit` does not pay for `pid batch`'s imports."""
    command_class = PidCommand
    LAZY = {"batch": ("pid.cli.batch", "batch"), "view": ("pid.cli.view", "view")}
    RERUN = ("continue", "retry")   # pid.cli.rerun's, registered with this module's helpers

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.LAZY, *self.RERUN})

    # What a newcomer reaches for first, in this order, in a section of its own above the rest.
    MAIN = ("run", "submit", "worker", "batch")

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        width = max(len(name) for name in self.list_commands(ctx))   # one column for both sections
        rows: dict[str, tuple[str, str]] = {}
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows[name] = (name.ljust(width), command.get_short_help_str(formatter.width - 6 - width))
        for title, names in (("Run jobs", self.MAIN), ("Other commands", [n for n in rows if n not in self.MAIN])):
            with formatter.section(title):
                formatter.write_dl([rows[n] for n in names if n in rows])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.LAZY and name not in self.commands:
            import importlib
            module, attr = self.LAZY[name]
            self.add_command(getattr(importlib.import_module(module), attr), name)
        elif name in self.RERUN and name not in self.commands:
            from pid.cli.rerun import register
            register(self, sys.modules[__name__])   # (this very module: `python -m` runs it as __main__)
        return super().get_command(ctx, name)


def read_stdin_task(what: str = "the task") -> str:
    """TASK (or MESSAGE) `-`: stdin's text (UTF-8, at most MAX_MESSAGE_BYTES: read no further)."""
    data = sys.stdin.buffer.read(MAX_MESSAGE_BYTES + 1)
    if len(data) > MAX_MESSAGE_BYTES:
        raise BadInput(f"{what} on stdin is larger than {MAX_MESSAGE_WORDS}")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        raise BadInput(f"{what} on stdin is not UTF-8 text") from None


@click.group(cls=PidGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pid")
def cli() -> None:
    """pid runs LLM coding agents in Docker sandboxes, in the foreground or through a queue.

    Wherever a command takes a job's ID: the whole id, any end of it of 4 or more characters only one job has
    (70a672), `last` (the newest job), or BATCHDIR/ITEM (a batch item's current job)."""


VERBOSE_HELP = "Also show each tool call as it starts, and its output: its first and last lines, as the model saw it."


@cli.command()
@job_options
@MAX_WORKSPACE_OPTION
@click.option("--verbose", "-v", is_flag=True, help=VERBOSE_HELP)
def run(api_key: str | None, as_json: bool, no_images: bool, max_workspace: int, verbose: bool,
        **options: Any) -> None:
    """Run one job in the foreground (no queue). On a terminal a status line at the bottom shows what it is doing,
    its tokens and cost so far, and the model's replies stream as they come."""
    if options["task"] == "-":
        options["task"] = read_stdin_task()
    spec = submission.prepare_run(options, api_key=api_key, no_images=no_images, max_workspace=max_workspace,
                                  warn=warn_line)
    agents: list[Any] = []
    jobs: list[Any] = []   # the job, once in the store
    stopped_by: list[int] = []   # the signals that stopped it: the exit code is 128 + the first's, as a shell's
    views: list[Any] = []   # the terminal's live view, while the job runs: a Ctrl-C's words go above its status line

    def say(text: str) -> None:
        (views[0].line.echo if views else echo)(text, err=True)

    def on_stop(signum: int, frame: Any) -> None:
        again = bool(stopped_by)
        stopped_by.append(signum)
        if not agents:   # setting up: it stops at its next step. Never an exception here: it could break an import
            if jobs:     # that the sandbox's thread waits on, and nothing would end
                jobs[0].cancel.set()
                if not again:   # its set-up or its agent, not yet begun, sees the cancel at its next step
                    say(("" if views else "\n") + "cancelling: the job stops at its next step…")
                    return
            if again:
                say("still setting up: it stops at its next step…")
            return
        if not agents[0].cancel_event.is_set():
            # (a status line's echo starts on a clean line; else the terminal's ^C shares the line)
            say(("" if views else "\n") + "cancelling: collecting the patch and removing the container…")
            agents[0].cancel()
        else:  # cleanup is short and bounded; interrupting it would leak the container and lose the result
            say("still cleaning up…")

    # Ctrl-C, and SIGTERM or SIGHUP as CI runners, `timeout` and a closed terminal stop a step: the job is cancelled,
    # its patch collected and its result printed (SIGKILL is the sweep's to end: client_lost). Before the sandbox's
    # thread starts.
    previous = {sig: signal.signal(sig, on_stop) for sig in STOP_SIGNALS}
    try:
        starting, job = submission.start_foreground(spec, before=reap_own_quietly)   # (shared with pid.run)
        jobs.append(job)
        if stopped_by:          # Ctrl-C while it set up: nothing ran, nothing stays
            from pid.worker.sandbox_start import abandon
            abandon(starting)
            job.end(None)
            _interrupted(spec, as_json, stopped_by[0], "interrupted before the job started")
        result = None
        printer: Any = EventPrinter(verbose=verbose)
        if not as_json and on_terminal(err=True):
            from pid.cli.live_view import RunView
            printer = RunView(verbose=verbose)
            views.append(printer)
        try:
            echo(f"job {spec.id}: {spec.model} in {spec.image}", err=True)
            # (--json too: its lines go to stderr, result.json alone to stdout; a CI log shows the retries)
            result = submission.run_foreground(spec, job, starting, api_key=api_key, sink=printer,
                                               on_agent=agents.append)
        finally:
            if views:
                views[0].stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stopped_by and not agents:   # Ctrl-C while it set up: the job ended before its agent started
        _interrupted(spec, as_json, stopped_by[0], f"interrupted; artifacts: {os.path.relpath(spec.job_dir)}",
                     result)
    if views and views[0].showed_reply(result.get("final_message")):
        result = {**result, "final_message": None}   # it streamed onto this terminal already
    print_result(result, spec.job_dir, as_json, said=printer.said)
    sys.exit(128 + stopped_by[0] if stopped_by else exit_code_for(result))


def _interrupted(spec: JobSpec, as_json: bool, signum: int, words: str, result: dict[str, Any] | None = None
                 ) -> NoReturn:
    """`pid run` stopped as it set up: one line, and with --json its result.json on stdout, as a CI step's reader
    expects (whenever the job has one); 128 + the signal's number."""
    echo(words, err=True)
    if as_json and result is None:
        result = submission.local_result(os.path.join(spec.job_dir, "result.json"), spec.id)
    if as_json and result is not None:
        print_result(result, spec.job_dir, as_json)
    sys.exit(128 + signum)


@cli.command()
@job_options(json_help="With --wait: print result.json instead of the summary; without: {\"id\", \"status\", "
                       "\"queue\"} instead of the id alone.")
@click.option("--wait", is_flag=True, help="Block until the job ends; exit with its exit code.")
@MAX_WORKSPACE_OPTION
@QUEUE_OPTION
def submit(api_key: str | None, as_json: bool, no_images: bool, wait: bool, max_workspace: int, queue: str,
           **options: Any) -> None:
    """Queue a job for a worker and print its id. A directory --repo is packed now: the job sees it as it is now."""
    if options["task"] == "-":
        options["task"] = read_stdin_task()
    spec = submission.submit(options, api_key=api_key, no_images=no_images, max_workspace=max_workspace,
                             queue=queue, warn=warn_line)   # what pid.submit calls (pid/api.py)
    from pid.jobs.store import default_store
    queued(default_store(), spec, wait, as_json)


def queued(store: Any, spec: JobSpec, wait: bool, as_json: bool) -> None:
    """A job just queued: print its id, or wait for its end."""
    if not wait:   # (--json: an object, as every --json prints; the id alone otherwise, for $(pid submit ...))
        echo(dumps({"id": spec.id, "status": "queued", "queue": spec.queue}) if as_json else spec.id)
        from pid.jobs.brokers import embedded_broker
        if not embedded_broker():   # (a worker elsewhere: jobs/results.py client_is_local)
            import shlex   # (a new user's: --out was never written, and nothing said so)
            echo(f"pid: a worker keeps this job's artifacts in the job store; `pid result {spec.id} --wait "
                 f"--download {shlex.quote(spec.job_dir)}` puts them in --out", err=True)
        return
    echo(f"job {spec.id} queued", err=True)
    _wait_and_exit(store, spec.id, as_json, follow=True, download=spec.job_dir, own_dir=True)   # (lines: stderr)


def _still_there(store: Any, job_id: str) -> Any:
    """The job's record; one that vanished while waited for (a store flushed, or a Redis without persistence
    restarted) is said so, exit 2: nothing tells how it ended, which exit 1 ("failed") would claim."""
    record = store.get(job_id)
    if record is None:
        raise NoSuchJob(f"job {job_id} is no longer in the job store: its record was lost (was the store flushed, or "
                        "a Redis without persistence restarted?); how it ended cannot be told")
    return record


def _wait_and_exit(store: Any, job_id: str, as_json: bool, follow: bool, download: str | None = None,
                   own_dir: bool = False) -> None:
    """Wait for the job's end, print its result (from the store: the worker may be on another machine) and exit
    with its code; with `download`, its artifacts go there first (see _download)."""
    record = _still_there(store, job_id)
    printer = RecordPrinter(summary_follows=True)
    follower = EventFollower(store, job_id, printer) if follow else None
    signals: list[int] = []

    def stop(signum: int, frame: Any) -> None:   # SIGTERM, SIGHUP (a CI step's timeout): as Ctrl-C, said
        signals.append(signum)
        raise cli_package.Interrupted

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS if sig != signal.SIGINT}
    try:
        wait_for(lambda: _still_there(store, job_id).terminal, follower, tick=_while_waiting(store, job_id))
    except KeyboardInterrupt:
        echo(f"\nstopped waiting; job {job_id} goes on (pid result {job_id} --wait, pid cancel {job_id})",
             err=True)
        if as_json:   # (a pipeline whose step timed out still reads which job goes on, as `pid result --json` says)
            echo(dumps(_not_ended(store, job_id)))
        sys.exit(128 + signals[0] if signals else EXIT_INTERRUPTED)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    result = load_result(store, job_id)
    where = _download(store, job_id, download, own_dir) if download else record.spec.job_dir
    print_result(result, where, as_json, said=printer.said)
    sys.exit(exit_code_for(result))


def _not_ended(store: Any, job_id: str, record: Any = None) -> dict[str, Any]:
    """What --json prints of a job that has not ended: where it is (`record`, else the store's now; "unknown" when
    the store is out of reach)."""
    if record is None:
        try:
            record = store.get(job_id)
        except Exception:
            pass
    return {"id": job_id, "status": record.status if record is not None else "unknown", "ended": False}


def _download(store: Any, job_id: str, dest: str, own_dir: bool) -> str:
    """The job's artifacts from the store into `dest`; returns it. `own_dir`: dest is the job's own out directory
    (`submit --wait`): nothing is fetched when a worker sharing this filesystem already wrote it there. Otherwise a
    non-empty dest must hold this job's earlier download (jobs/artifact_store.py). Failure: one line, exit 2."""
    from pid.jobs.artifact_store import DownloadError, already_local, download
    dest = os.path.abspath(os.path.expanduser(dest))
    if own_dir and already_local(store, job_id, dest):
        return dest
    try:
        download(store, job_id, dest, own=own_dir)
    except DownloadError as exc:
        raise BadInput(str(exc)) from None
    return dest


def _while_waiting(store: Any, job_id: str) -> Callable[[], None]:
    """What a wait does besides polling: say when no worker takes the job, and sweep now and then, so that a job
    whose `pid run` was killed is ended instead of waited for forever."""
    from pid.jobs.sweep import sweep_quietly
    notice = _no_worker_notice(store, job_id)
    next_sweep = time.monotonic() + SWEEP_WHILE_WAITING_S

    def tick() -> None:
        nonlocal next_sweep
        notice()
        if time.monotonic() >= next_sweep:
            next_sweep = time.monotonic() + SWEEP_WHILE_WAITING_S
            sweep_quietly(store)
    return tick


def _no_worker_notice(store: Any, job_id: str, out: Callable[..., None] = echo) -> Callable[[], None]:
    """After PID_NO_WORKER_NOTICE_S in the queue (the tests wait less), and again if the job goes back to it: a job
    still queued means no worker took it. The workers' heartbeats in the store tell whether any is alive, and how
    busy. `out`: echo, or a status line's."""
    from pid.jobs.workers import QueuedNotice
    queued = QueuedNotice(store, job_id, settings.NO_WORKER_NOTICE_S.get())

    def tick() -> None:
        line = queued()
        if line is not None:
            out(line, err=True)
    return tick


def _record_or_fail(job_id: str) -> Any:
    from pid.jobs.store import default_store
    store = default_store()
    return store, submission.job_record(store, job_id)


@cli.command()
@click.argument("job_id", type=JOB_ID, metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="The job's whole record as JSON.")
def status(job_id: str, as_json: bool) -> None:
    """Show a job's status: counts, what it is doing now, its error."""
    from pid.jobs.sweep import sweep_quietly
    sweep_quietly()
    _, record = _record_or_fail(job_id)
    if as_json:
        echo(dumps(record.to_dict(), indent=2))
        return
    flags = " (paused)" if record.held else ""
    flags += " (cancel requested)" if record.cancel_requested and not record.terminal else ""
    echo(f"{record.id}  {record.status}{flags}  turns={record.turns} tool_calls={record.tool_calls}"
         f"  attempts={record.attempts}" + (f"  exit_reason={record.exit_reason}" if record.exit_reason else ""))
    usage = record.total_usage
    echo(f"  {'pid run' if record.kind == 'run' else 'worker job'} · {format_duration(record.duration_s)} · "
         f"{usage['total_tokens']} tokens · {format_cost(usage['cost'])}")
    if record.activity and not record.terminal:
        echo(f"  now: {one_line(record.activity)}")
    if record.last_tool:
        echo(f"  last tool: {one_line(record.last_tool)}")
    if record.check:
        echo("  ", *check_line(record.check))
    if record.error:
        echo(f"  error: {one_line(record.error)}")



@cli.command(short_help="Show a finished job's result; exit with its code.")
@click.argument("job_id", type=JOB_ID, metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print result.json.")
@click.option("--wait", is_flag=True, help="Wait for the job to end first.")
@click.option("--download", metavar="DIR", type=click.Path(file_okay=False),
              help="Write all the job's artifacts (result.json, patch.diff, session.jsonl, files/) under DIR, from "
                   "the job store: works on any machine. DIR is created, or must be empty or hold this job's "
                   "earlier download.")
def result(job_id: str, as_json: bool, wait: bool, download: str | None) -> None:
    """Show a finished job's result; exit with its exit code (5: the job has not ended yet)."""
    store, record = _record_or_fail(job_id)
    if wait:
        _wait_and_exit(store, job_id, as_json, follow=False, download=download)
    if not record.terminal:
        echo(f"pid: job {job_id} is {record.status}: no result yet (--wait waits for it)", err=True)
        if as_json:   # (a JSON reader gets JSON: where the job is, not a result.json)
            echo(dumps(_not_ended(store, job_id, record)))
        sys.exit(EXIT_NOT_FINISHED)
    result = load_result(store, job_id)
    where = _download(store, job_id, download, own_dir=False) if download else _artifacts_here(record)
    print_result(result, where, as_json)
    sys.exit(exit_code_for(result))


def _artifacts_here(record: Any) -> str:
    """Where the job's artifacts are on this machine: its --out directory, or, for a batch's job, its item's folder
    (the batch's spool, DIR/.jobs/<id>, is removed once the item's folder has them)."""
    from pid.jobs.batch import JOBS, BatchDir
    job_dir = record.spec.job_dir
    spool = os.path.dirname(os.path.normpath(job_dir))
    if os.path.isdir(job_dir) or os.path.basename(spool) != JOBS:
        return str(job_dir)
    try:
        bdir = BatchDir.open(os.path.dirname(spool))
    except ValueError:
        return str(job_dir)
    item = next((i for i in bdir.ledger if bdir.current_job(i) == record.id), None)
    return os.path.join(bdir.path, item) if item and os.path.isdir(os.path.join(bdir.path, item)) else str(job_dir)


@cli.command()
@click.argument("job_id", type=JOB_ID, metavar="ID")
def cancel(job_id: str) -> None:
    """Cancel a queued or running job (artifacts so far are kept)."""
    store, record = _record_or_fail(job_id)
    if submission.cancel(store, job_id) == "running":
        who = "its `pid run` stops it" if record.kind == "run" else "its worker stops it"
        echo(f"{job_id}: cancelling ({who} and keeps the artifacts so far)")
    else:
        echo(f"{job_id}: cancelled")  # it had not started, or its process was gone: it ends here and now


def _post(kind: str, job_id: str, message: str) -> None:
    if message == "-":   # (as `pid run -`: a new user's steer sent the model a bare "-")
        message = read_stdin_task(f"the {kind.replace('_', '-')} message")
    from pid.jobs.store import default_store
    submission.post(default_store(), job_id, kind, message)
    echo(f"{job_id}: {kind.replace('_', '-')} queued")


@cli.command(short_help="Send a message for the agent's next model call.")
@click.argument("job_id", type=JOB_ID, metavar="ID")
@click.argument("message")
def steer(job_id: str, message: str) -> None:
    """Send a message delivered after the current tool calls, before the next model call (`-`: read it from
    stdin)."""
    _post("steer", job_id, message)


@cli.command("follow-up", short_help="Send a message for when the agent would stop.")
@click.argument("job_id", type=JOB_ID, metavar="ID")
@click.argument("message")
def follow_up(job_id: str, message: str) -> None:
    """Send a message delivered when the agent would otherwise stop (`-`: read it from stdin)."""
    _post("follow_up", job_id, message)


def _set_paused(job_id: str, paused: bool) -> None:
    from pid.jobs.store import default_store
    changed = submission.set_paused(default_store(), job_id, paused)
    echo(f"{job_id}: {'resumed' if not paused else 'pause requested' if changed else 'already paused'}")


@cli.command(short_help="Hold a job before its next model call.")
@click.argument("job_id", type=JOB_ID, metavar="ID")
def pause(job_id: str) -> None:
    """Hold a job before its next model call (its wall clock keeps running)."""
    _set_paused(job_id, True)


@cli.command()
@click.argument("job_id", type=JOB_ID, metavar="ID")
def resume(job_id: str) -> None:
    """Continue a paused job."""
    _set_paused(job_id, False)


@cli.command("list", short_help="Recent jobs, newest first.")
@click.option("--limit", type=Number(int, 1, None), default=None,
              help="Show at most this many jobs (the newest)  [default: 20; with --batch, all of the batch's]")
@click.option("--status", "status_filter", type=click.Choice(list(JOB_STATUSES)), help="Only jobs in this status.")
@click.option("--json", "as_json", is_flag=True, help="A JSON array of the jobs' records.")
@click.option("--batch", "batch_dir", metavar="DIR", help="Only the jobs of the batch whose directory is DIR.")
def list_jobs(limit: int | None, status_filter: str | None, as_json: bool, batch_dir: str | None) -> None:
    """Recent jobs, newest first: status, duration, cost, exit reason, task (`pid run` jobs too)."""
    from pid.cli.listing import batch_records, job_lines
    from pid.cli.table import terminal_width
    from pid.jobs.store import LIST_LIMIT, default_store
    from pid.jobs.sweep import sweep_quietly
    store = default_store()
    sweep_quietly(store)
    # (one more than shown: whether there are more is said)
    if batch_dir:   # (a batch's: all of them unless --limit)
        records, places = batch_records(store, batch_dir, None if limit is None else limit + 1, status_filter)
    else:
        limit = limit or LIST_LIMIT
        records, places = store.list(limit + 1, status_filter), None
    more, records = limit is not None and len(records) > limit, records[:limit]
    if more:   # (on stderr: stdout stays the table's, or the JSON's)
        echo(f"the newest {limit} shown; more with --limit", err=True)
    if as_json:   # (a batch's: each with its item, and whether it is the item's current job)
        from pid.jobs.batch_control import listed
        echo(dumps(listed(records, places), indent=2))
        return
    if not records:   # (on stderr: stdout stays the table's, empty)
        echo("no jobs" + (f" with status {status_filter}" if status_filter else "")
             + (f" in batch {batch_dir}" if batch_dir else ""), err=True)
    for line in job_lines(records, terminal_width(), places and places[:limit]) if records else []:
        echo(line)


@cli.command(short_help="A job's log: its tool calls, errors and attempts.")
@click.argument("job_id", type=JOB_ID, metavar="ID")
@click.option("--follow", "-f", is_flag=True, help="Keep printing as the job goes on, until it ends.")
@click.option("--json", "as_json", is_flag=True, help="Every record, one JSON object per line.")
@click.option("--verbose", "-v", is_flag=True, help=VERBOSE_HELP)
def logs(job_id: str, follow: bool, as_json: bool, verbose: bool) -> None:
    """A job's log, from any machine that shares its store: a line per tool call (name, summary, duration), model
    errors, and what happened to the job (each attempt's start, hand-backs, its end). With -f on a terminal, a status
    line at the bottom shows what it is doing, its tokens and cost so far."""
    store, record = _record_or_fail(job_id)
    line = None
    if follow and not as_json and on_terminal(err=False):
        from pid.cli.live_view import job_status
        from pid.cli.status_line import StatusLine
        latest = [record]
        line = StatusLine(err=False, describe=lambda: job_status(latest[0]))
    follower = EventFollower(store, job_id, RecordPrinter(as_json, err=False, verbose=verbose,
                                                          out=line.echo if line else echo))
    follower.poll()
    if not follow:
        return
    notice = _no_worker_notice(store, job_id, line.echo if line else echo)   # a job no worker takes has no log yet
    from pid.jobs.outage import WaitingThrough
    outage = WaitingThrough(lambda text: (line.echo if line else echo)(f"pid: {text}", err=True))
    try:
        while True:
            try:
                record = _still_there(store, job_id)
                if line:
                    latest[0] = record
                    line.draw()
                notice()
                follower.poll(wait_s=1.0)
                if record.terminal:
                    follower.poll()
                    return
                outage.reached()
            except Exception as exc:
                if not outage.bear(exc):
                    raise
                time.sleep(1.0)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    finally:
        if line:
            line.stop()


@cli.command(short_help="The workers of this job store.")
@click.option("--all", "show_all", is_flag=True, help="Also workers not heard from lately (stopped or lost).")
@click.option("--json", "as_json", is_flag=True, help="A JSON array of the workers' heartbeats.")
def workers(show_all: bool, as_json: bool) -> None:
    """The workers of this job store, from their heartbeats (every 2 s): host, process, jobs running of how many;
    alive, or (--all) stopped, lost (its process is gone) or silent, and since when."""
    from pid.jobs.workers import worker_state
    from pid.jobs.store import default_store
    store = default_store()
    now = store.now()
    states = [(b, worker_state(b, now)) for b in store.workers()]
    beats = [(b, state) for b, state in states if show_all or state == "alive"]
    if as_json:
        echo(dumps([{**asdict(b), "alive": state == "alive", "state": state} for b, state in beats], indent=2))
        return
    if not beats:
        echo("no live worker" + ("" if show_all else " (pid workers --all: also stopped or lost ones)"))
        return
    from pid.cli.listing import pool_entry, worker_lines
    from pid.cli.table import terminal_width
    header, *lines = worker_lines(beats, now, terminal_width())
    echo(header)
    for line, (b, state) in zip(lines, beats):
        echo(line)
        if b.policy:
            echo("  policy: " + ", ".join(f"{one_line(k)} = {dumps(v)}" for k, v in b.policy.items()))
        if b.pool and state == "alive":
            echo("  warm pool: " + ", ".join(pool_entry(entry) for entry in b.pool))
        if b.alarm:
            echo(styled(f"  !!! {one_line(b.alarm)}", fg="red", bold=True))


@cli.command(short_help="Start a worker that runs queued jobs.")
@click.option("--concurrency", "-c", type=Number(int, 1, 1024), default=8, show_default=True,
              help="Jobs run at once (each a thread of the worker, with its own container). A job mostly waits on "
                   "its model: dozens fit on two cores; the containers' memory is the usual limit.")
@click.option("--loglevel", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              default="WARNING", show_default=True,
              help="Celery's and the libraries' logging (INFO: Celery's banner, every task, every HTTP request); "
                   "pid's own line per job start and end always prints.")
@click.option("--events", is_flag=True, help="Send Celery task events, for monitors such as Flower.")
@click.option("--queue", "-Q", "queues", type=QueueName(many=True), default=DEFAULT_QUEUE, show_default=True,
              envvar=settings.QUEUES.name, show_envvar=True, cls=EnvOption,
              help="The queues this worker takes jobs from, comma-separated (submit --queue routes a job).")
@click.option("--policy", "policy_file", type=click.Path(dir_okay=False), envvar=settings.POLICY.name, show_envvar=True,
              cls=EnvOption, help="A TOML file of the most a job may ask of this worker (memory, CPUs, disk, "
                                  "timeout, cost, root, network, images, endpoints): a job outside it is refused "
                                  "before its container starts (docs/security.md).")
@click.option("--pool", type=PoolSpec(), default="0", show_default=True,
              envvar=settings.POOL.name, show_envvar=True, cls=EnvOption,
              help="Ready sandboxes kept: N in all, shared among the classes (image and limits) of job this worker "
                   "served most recently (in the last 5 minutes); IMAGE=N, comma-separated, gives an image N of "
                   f"its own (`--pool 2,swe-task:latest=8`; {settings.POOL_MAX} at most in all). Such a job skips "
                   "its container's start (~0.3 s). Each is a started container and its disks; none is used twice.")
@click.option("--allow-volatile-store", is_flag=True,
              help="Start on a Redis job store that keeps neither an append-only file nor snapshots (a restart of "
                   "it loses every job); refused otherwise.")
def worker(concurrency: int, loglevel: str, events: bool, queues: str, policy_file: str | None, pool: str,
           allow_volatile_store: bool) -> None:
    """Start a worker that runs queued jobs (Ctrl-C: finish the running jobs, then stop; twice, or SIGTERM, or
    SIGHUP: hand them back to the queue now)."""
    _check_own_endpoint()
    check_broker()
    from pid.jobs import policy
    if policy_file:
        try:
            policy.activate(policy.load(policy_file))
        except policy.PolicyError as exc:
            raise BadInput(str(exc)) from None
    if not allow_volatile_store:
        problem = _volatile_store()
        if problem:
            raise BadInput(problem)
    _check_pool_images(settings.parse_pool(pool))
    os.environ[settings.POOL.name] = pool   # read where the worker is ready (worker/main_process.py)
    from pid.worker.app import app
    from pid.worker.tasks import configure_job_lines, node_name
    configure_job_lines()
    quiet = ["--quiet"] if loglevel.upper() in ("WARNING", "ERROR") else []   # Celery's banner only when asked
    app.worker_main([*quiet, "worker", f"--concurrency={concurrency}", f"--queues={queues}",
                     f"--hostname={node_name()}", f"--loglevel={loglevel.upper()}", "--without-gossip",
                     "--without-mingle", *(["--task-events"] if events else [])])


def _check_pool_images(pool: settings.PoolSizes) -> None:
    """An image the pool names must be in the engine, as a job's must (pid never pulls): else the pool would never
    fill, below a ready line that says it will. An engine not up yet is the worker's to wait for, not refused."""
    for image, count in pool.per_image:
        try:
            problem = submission.image_missing(image) if count else None
        except PidError:
            return
        if problem:
            raise BadInput(f"--pool {image}={count}: {problem}")


def _check_own_endpoint() -> None:
    """A worker's PID_BASE_URL names the endpoint its own API key is for (pid.config.EnvDefaults): a malformed one
    would send the key to no job, without a word."""
    raw = settings.BASE_URL.raw()
    if raw:
        try:
            Url().convert(raw, None, None)
        except click.BadParameter as exc:
            raise BadInput(f"${settings.BASE_URL.name}: {exc.message}") from None


def _volatile_store() -> str | None:
    """Why the job store would lose every job on a restart (jobs/store_watch.py), once it answers: a store not up
    yet is waited for, as Celery waits for its broker; one that refuses the password is not (it never changes its
    mind: one line, exit 2)."""
    from pid.jobs.outage import refused_credentials, transient
    from pid.jobs.store import default_store
    from pid.jobs.store_watch import volatile
    store, said = default_store(), False
    while True:
        try:
            return volatile(store)
        except Exception as exc:
            if not transient(exc) or refused_credentials(exc):
                raise
            if not said:
                echo(f"pid worker: the job store {store.path} is unreachable ({one_line(str(exc))}): waiting for it",
                     err=True)
                said = True
            time.sleep(2)


@cli.command(short_help="Remove expired pid containers and orphaned disks.")
@click.option("--all", "all_owners", is_flag=True,
              help="Also remove expired containers of other pid installations on this engine.")
def reap(all_owners: bool) -> None:
    """Remove this installation's pid containers whose time to live has passed, and orphaned job disks (workers and
    `pid run` also do this on their own)."""
    from pid.sandbox.reaper import reap_installation
    containers, disks = reap_installation(pid_home(), all_owners=all_owners)
    echo(f"removed {len(containers)} container(s) (expired, or a dead worker's warm pool's) and {len(disks)} "
         "orphaned disk(s)")


def reap_own_quietly() -> None:
    """At start, beside the job: what an earlier run of this installation left behind goes (never fatal)."""
    def reap() -> None:
        try:
            from pid.sandbox.reaper import reap_installation
            reap_installation(pid_home())
        except Exception:
            pass
        from pid.jobs.sweep import sweep_quietly
        sweep_quietly()   # a `pid run` killed earlier is ended, with its result.json
    threading.Thread(target=reap, name="pid-reap", daemon=True).start()


_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", BadInput)


def _shown_traceback(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
    """A bug's traceback, as Python prints it, through the sanitiser (its message may quote a server or a model)."""
    import traceback
    echo("".join(traceback.format_exception(kind, exc, tb)).rstrip("\n"), err=True)


def loaded() -> None:
    """pid's code is loaded: a Ctrl-C of the command raises cli.Interrupted from now on, which main() and the commands
    handle (where cli/__init__.py set its handler while it loaded)."""
    if cli_package.LOADING:
        cli_package.LOADING = False
        signal.signal(signal.SIGINT, cli_package.raise_interrupted)


def main() -> None:
    """Every ending is an exit code and at most one line: usage errors included, Ctrl-C anywhere is 130. A library's
    warning (logging's last resort) and a bug's traceback pass through the sanitiser like every other line."""
    try:
        loaded()
        import logging
        from pid.terminal import ShownLogRecords
        if logging.lastResort is not None:
            logging.lastResort.addFilter(ShownLogRecords())
        sys.excepthook = _shown_traceback
        code = cli.main(prog_name="pid", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):   # Ctrl-C (or EOF) outside a command's own handling
        echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except MissingClient as exc:
        echo(f"pid: error: {one_line(str(exc))}", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        if isinstance(exc, (BadInput, _NO_ARGS_IS_HELP)):   # the latter: plain `pid` shows its help
            exc.show()
        else:
            echo(f"pid: error: {one_line(exc.format_message())}", err=True)
        sys.exit(exc.exit_code)
    except PidError as exc:   # (a command turns these into BadInput; one raised outside a command's run is the same)
        echo(f"pid: error: {one_line(str(exc))}", err=True)
        sys.exit(2)
    except Exception as exc:   # a store that cannot be reached is one line too; anything else is a bug's traceback
        from pid.jobs.reach import unreachable_store
        line = unreachable_store(exc)
        if line is None:
            raise
        echo(f"pid: error: {one_line(line)}", err=True)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
