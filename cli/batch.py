"""`pid batch TASKS.jsonl`: many jobs from one file, in one process with one store and one broker connection;
followed live, resumable from its output directory, with a budget and a running limit kept in the job store.

    check every line -> pack each repo once -> ledger, create, dispatch (in chunks) -> follow -> download -> summary

The output directory is the batch's memory (jobs/batch.py): a rerun of the same command skips the items that
completed, waits for those whose job is still queued or running (never a second job beside it), submits the rest
again; --retry-failed also reruns failed and limit-hit items. Here: the command and what it prints. The batch
itself is pid/jobs/batch_setup.py (its checks, specs, directory, local workers) and pid/jobs/batch_run.py (a run's
submitting and following), which pid.batch (pid/api.py) calls too; cli/batch_run.py follows a run on the terminal.
"""
from __future__ import annotations

import os
import shlex
import sys
from typing import Any

import click
from click.core import ParameterSource

from pid.cli.batch_run import EXIT_INTERRUPTED, follow
from pid.cli.options import JOB_OPTIONS, EnvOption, Number, QueueName, Size, format_size, spec_options
from pid.cli.output import echo
from pid.terminal import dumps, one_line
from pid.jobs.batch import BatchDir
from pid.jobs.spec import DEFAULT_QUEUE, spec_field
from pid import settings


def _bad(message: str) -> click.ClickException:
    from pid.cli.main import BadInput
    return BadInput(message)


class BatchCommand(click.Command):
    """`batch --help` shows batch's own options first, then the job options every item takes as defaults."""
    JOB_PARAMS = {option.name for option in JOB_OPTIONS} | {"api_key", "no_images"}

    def invoke(self, ctx: click.Context) -> Any:
        """A shared check's refusal (PidError) is one line and exit 2, as everywhere."""
        from pid.errors import PidError
        from pid.jobs.batch_setup import BadTasks
        try:
            return super().invoke(ctx)
        except click.ClickException:
            raise
        except BadTasks as exc:   # each reason with its lines, then what they mean
            for error in exc.grouped():
                echo(f"pid: error: {exc.tasks}: {one_line(error)}", err=True)
            raise _bad(exc.summary) from None
        except PidError as exc:
            raise _bad(str(exc)) from None

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows: dict[bool, list[tuple[str, str]]] = {False: [], True: []}
        for param in self.get_params(ctx):
            row = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if row is not None:
                rows[param.name in self.JOB_PARAMS].append(row)
        width = min(30, max(len(flag) for flag, _ in rows[False] + rows[True]))   # one column for both sections
        for title, is_job in (("Batch options", False), ("Job options (every item's defaults; a line's own values "
                                                          "win)", True)):
            with formatter.section(title):
                formatter.write_dl([(flag.ljust(width), text) for flag, text in rows[is_job]])


@click.command("batch", cls=BatchCommand, short_help="Run one job per line of a tasks file (JSONL).")
@click.argument("tasks", required=False, metavar="TASKS.jsonl|-")
@click.option("--repo", metavar="DIR|URL",
              help=spec_field("repo").metadata["help"].rstrip(".") + ". Every item's, unless its line names one.")
@click.option("--queue", type=QueueName(), default=DEFAULT_QUEUE, show_default=True, envvar=settings.QUEUE.name,
              show_envvar=True, cls=EnvOption, help=spec_field("queue").metadata["help"])
@click.option("--max-workspace", type=Size(), default=format_size(200 << 20), show_default=True,
              envvar=settings.MAX_WORKSPACE.name, show_envvar=True, cls=EnvOption,
              help="Largest packed size of a directory repo (each is packed once, at submit).")
@click.option("--workers", type=Number(int, 1, 256), default=None,
              help="Also run N job slots here (a `pid worker` for the life of the command).")
@click.option("--max-total-cost", type=Number(float, 0, None), default=None,
              help="USD for the whole batch, across every worker: once its jobs have spent it, queued items are "
                   "cancelled and running ones stop before their next model call (exit reason batch_budget).")
@click.option("--max-running", type=Number(int, 1, None), default=None,
              help="The batch's jobs running at once at most, whichever workers take them (the job store "
                   "enforces it).")
@click.option("--allow-outside", is_flag=True,
              help="Let the tasks file name repositories and files outside its own directory (its paths are "
                   "relative to it).")
@click.option("--retry-failed", is_flag=True,
              help="Also rerun items that failed or hit a limit (or whose check failed).")
@click.option("--detach", is_flag=True, help="Submit and return at once (then --status DIR, --wait DIR).")
@click.option("--status", "status_dir", metavar="DIR", help="Show a batch's progress from its output directory.")
@click.option("--wait", "wait_dir", metavar="DIR", help="Wait for a (detached) batch's items, download, summarize.")
@click.option("--cancel", "cancel_dir", metavar="DIR",
              help="Cancel every job of the batch in DIR that has not ended (a rerun resumes them).")
@spec_options(json_help="No live table: a JSON line per item as it ends (its batch.jsonl object), then "
                        "{\"summary\": ...}.")
def batch(tasks: str | None, api_key: str | None, as_json: bool, no_images: bool, repo: str | None, queue: str,
          max_workspace: int, workers: int | None, max_total_cost: float | None, max_running: int | None,
          allow_outside: bool, retry_failed: bool, detach: bool, status_dir: str | None, wait_dir: str | None,
          cancel_dir: str | None, **options: Any) -> None:
    """Run one job per line of TASKS.jsonl (`-`: stdin): {"id", "task", "repo", and any job option as a field};
    the command line's options are every item's defaults. --out DIR holds one folder per item, batch.jsonl and
    summary.json; running the same command again resumes the batch. Exit code: 0 when every item completed (and
    passed its check), else the worst item's (docs/batches.md)."""
    from pid.cli.main import before_command
    before_command()
    if status_dir or wait_dir or cancel_dir:
        if tasks or len([d for d in (status_dir, wait_dir, cancel_dir) if d]) > 1:
            raise _bad("--status DIR, --wait DIR and --cancel DIR take no tasks file, and one at a time")
        path = os.path.abspath(os.path.expanduser(status_dir or wait_dir or cancel_dir or ""))
        if status_dir:
            _status(_open(path), as_json)
            return
        if cancel_dir:
            _cancel(_open(path))
            return
        from pid.jobs.batch_run import Run
        from pid.jobs.batch_setup import open_held
        run = Run(open_held(path), _store(), retry_failed=False, warn=_warn)   # (its PidError: exit 2)
        try:
            follow(run, as_json, None, existing=True)
        finally:
            run.close()
        return   # (follow exits)
    if not tasks:
        raise _bad("pid batch needs a tasks file (TASKS.jsonl, or - for stdin), or --status DIR / --wait DIR / "
                   "--cancel DIR")
    ctx = click.get_current_context()
    if ctx.get_parameter_source("out_dir") in (ParameterSource.DEFAULT, None):
        raise _bad("pid batch needs --out DIR: the batch's results, and its memory when it runs again")
    if detach and workers:
        raise _bad("--detach and --workers: the local workers would stop as the command returns")
    from pid.jobs.batch_run import KeyNotKept
    from pid.jobs.batch_setup import Options, prepare
    out = options.pop("out_dir")
    opts = Options(job=options, api_key=api_key, no_images=no_images, repo=repo, queue=queue,
                   max_workspace=max_workspace, workers=workers, max_total_cost=max_total_cost,
                   max_running=max_running, allow_outside=allow_outside, retry_failed=retry_failed)
    run = prepare(tasks, out, opts, warn=_warn)
    try:
        try:
            run.start()
        except KeyboardInterrupt:   # mid-submit: what was submitted goes, and the ledger keeps it for a rerun
            echo("\ninterrupted while submitting: cancelling the jobs submitted so far", err=True)
            run.cancel_tracked()
            from pid.cli.batch_run import this_command
            echo(f"resume with: {this_command()}", err=True)
            sys.exit(EXIT_INTERRUPTED)
        if detach:
            path = run.bdir.path
            echo(f"batch {run.bdir.batch_id}: {run.submitted} job(s) submitted, {len(run.tracked)} item(s) to "
                 f"wait for; later: pid batch --status {shlex.quote(path)} / pid batch --wait {shlex.quote(path)}")
            return
        follow(run, as_json, tasks)
    except KeyNotKept as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        run.close()


for _param in batch.params:   # the job option --out is the batch's own directory here
    if _param.name == "out_dir" and isinstance(_param, click.Option):
        _param.help = ("The batch's directory (required): DIR/<item id>/ per item, batch.jsonl, summary.json; its "
                       "memory when the same command runs again.")
        _param.show_default = False


def _warn(text: str) -> None:
    echo(text, err=True)


def _store() -> Any:
    from pid.jobs.store import default_store
    return default_store()


def _open(path: str) -> BatchDir:
    from pid.jobs.batch_setup import open_dir
    return open_dir(path)   # (its PidError: exit 2, BatchCommand.invoke)


def _status(bdir: BatchDir, as_json: bool) -> None:
    """--status DIR: every item by its current job's status (or its recorded end), the spend, no waiting."""
    from pid.jobs.batch_control import status
    now = status(bdir, _store())
    if as_json:
        echo(dumps(now.as_dict()))
        return
    from pid.cli.batch_control import item_lines
    from pid.cli.batch_progress import spend_words
    from pid.cli.table import terminal_width
    info = now.info
    counts = ", ".join(f"{n} {s}" for s, n in sorted(now.counts.items()))
    budget = None if info is None else info.max_total_cost
    cost = spend_words(now.cost, 0.0 if info is None else info.spent, budget)
    echo(f"batch {bdir.batch_id}: {len(bdir.order)} items: {counts}; cost {cost}")
    for line in item_lines(bdir, now.records, terminal_width()):
        echo(line)


def _cancel(bdir: BatchDir) -> None:
    """--cancel DIR: a line per job cancelled, then how many."""
    from pid.cli.batch_control import cancel_lines
    from pid.jobs.batch_control import cancel
    cancelled = cancel(bdir, _store())
    for line in cancel_lines(cancelled):
        echo(line)
    ended = sum(job["status"] == "cancelled" for job in cancelled)
    told = len(cancelled) - ended   # running: their workers stop them, at their next step
    said = [f"{ended} job(s) cancelled"] * bool(ended) + [f"{told} being stopped by their workers"] * bool(told)
    echo(f"batch {bdir.batch_id}: " + (", ".join(said) if said else "nothing to cancel (every job has ended)"))
