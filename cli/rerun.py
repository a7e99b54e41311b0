"""`pid continue ID MESSAGE` and `pid retry ID`: a new job made from an earlier one (jobs/requeue.py), queued like
`submit`.

cli/main.py registers these commands (register), handing over its own module for what `submit` shows (errors, the
id, the wait): this module never imports pid.cli.main, which may be running as __main__.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

import click

from pid.cli.ids import JOB_ID
from pid.cli.options import Api, Number, QueueName, Url, api_key_option
from pid.cli.output import echo
from pid.jobs import requeue
from pid.jobs.requeue import Rerun
from pid.jobs.spec import spec_field

_main: Any = None   # pid.cli.main (a module), once registered


def register(group: click.Group, main_module: ModuleType) -> None:
    global _main
    _main = main_module
    group.add_command(continue_job)
    group.add_command(retry)


class HomeCommand(click.Command):
    """As pid.cli.main's commands (before_command); a shared check's refusal is one line and exit 2."""

    def invoke(self, ctx: click.Context) -> Any:
        _main.before_command()
        return _main.as_bad_input(lambda: super(HomeCommand, self).invoke(ctx))


def _limit(flag: str, name: str, kind: type) -> Any:
    """An override of one of the earlier job's limits (default: the earlier job's own)."""
    meta = spec_field(name).metadata
    return click.option(flag, name, type=Number(kind, meta["min"], meta["max"]), default=None,
                        help=f"{meta['help']} Default: the earlier job's.")


def _stacked(func: Any, decorators: list[Any]) -> Any:
    """func with `decorators` applied as if written above it, in that order."""
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def queue_options(func: Any) -> Any:
    return _stacked(func, [
        click.option("--out", "out_dir", metavar="DIR",
                     help="Artifacts go to DIR/<job id>/. Default: the earlier job's when it can be written here (a "
                          "batch item's: pid-runs), else pid-runs."),
        click.option("--queue", type=QueueName(), default=None,
                     help="The queue the job waits in. Default: the earlier job's."),
        api_key_option("API key; never enters the container (an ended job's key is not kept: give it again). It is "
                       "sent only to the endpoint it is for: the API's own, or the --base-url given with it."),
        click.option("--wait", is_flag=True, help="Block until the job ends; exit with its exit code."),
        click.option("--json", "as_json", is_flag=True,
                     help="With --wait: print result.json instead of the summary; without: {\"id\", \"status\", "
                          "\"queue\"} instead of the id alone."),
    ])


def model_options(func: Any) -> Any:
    """Who answers the new job: the earlier job's model and endpoint, or those named here."""
    return _stacked(func, [
        click.option("--model", default=None, help="Another model answers (its prices and context window: the model "
                                                   "table's). Default: the earlier job's."),
        click.option("--base-url", type=Url(), default=None,
                     help="Another endpoint answers; the API key given here goes to it. Default: the earlier job's."),
        click.option("--api", type=Api(), default=None,
                     help="Its wire format (openai or anthropic); without --base-url, an earlier vendor's own "
                          "endpoint becomes this format's own. Default: the earlier job's."),
    ])


@click.command("continue", cls=HomeCommand, short_help="Continue an ended job as a new job.")
@click.argument("job_id", type=JOB_ID, metavar="ID")
@click.argument("message")
@model_options
@_limit("--max-turns", "max_turns", int)
@_limit("--timeout", "timeout_s", float)
@_limit("--max-cost", "max_cost", float)
@queue_options
def continue_job(job_id: str, message: str, model: str | None, base_url: str | None, api: str | None,
                 out_dir: str | None, queue: str | None, api_key: str | None, wait: bool, as_json: bool,
                 **limits: Any) -> None:
    """Continue an ended job as a new job: its conversation, then MESSAGE; on its snapshot with its patch applied,
    so the new job's patch holds both jobs' changes. Prints the new job's id."""
    given = Rerun(out_dir, queue, api_key, model, base_url, api, limits)
    store, spec = requeue.continue_job(job_id, message, given, _note)
    _main.queued(store, spec, wait, as_json)


@click.command(cls=HomeCommand, short_help="Run a job again as a new job.")
@click.argument("job_id", type=JOB_ID, metavar="ID")
@model_options
@queue_options
def retry(job_id: str, model: str | None, base_url: str | None, api: str | None, out_dir: str | None,
          queue: str | None, api_key: str | None, wait: bool, as_json: bool) -> None:
    """Run a job again as a new job: the same task and options, on the same workspace snapshot (--model,
    --base-url, --api: another model or endpoint answers). Prints the new job's id."""
    store, spec = requeue.retry(job_id, Rerun(out_dir, queue, api_key, model, base_url, api), _note)
    _main.queued(store, spec, wait, as_json)


def _note(text: str) -> None:
    echo(f"pid: {text}", err=True)
