"""`pid continue ID MESSAGE` and `pid retry ID`: a new job made from an earlier one, queued like `submit`.

The new job's spec comes from the job store (jobs/continuation.py), so either works from any machine that shares
it. cli/main.py registers these commands (register), handing over its own module for the helpers `submit` uses
(errors, image and key checks, waiting): this module never imports pid.cli.main, which may be running as __main__.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import click

from pid.cli.ids import JOB_ID
from pid.cli.options import Api, Number, QueueName, Url, api_key_option
from pid.cli.output import echo
from pid.config import EnvDefaults, EnvKey, endpoint, key_endpoint
from pid.jobs import submission
from pid.jobs.spec import JobSpec, spec_field

_main: Any = None   # pid.cli.main (a module), once registered


def register(group: click.Group, main_module: ModuleType) -> None:
    global _main
    _main = main_module
    group.add_command(continue_job)
    group.add_command(retry)


class HomeCommand(click.Command):
    """As pid.cli.main's commands: an unusable PID_HOME stops it before it does anything; a shared check's refusal
    is one line and exit 2."""

    def invoke(self, ctx: click.Context) -> Any:
        from pid.config import HomeUnusable, ensure_pid_home
        try:
            ensure_pid_home()
        except HomeUnusable as exc:
            raise _main.BadInput(str(exc)) from None
        return _main.as_bad_input(lambda: super(HomeCommand, self).invoke(ctx))


def _limit(flag: str, name: str, kind: type) -> Any:
    """An override of one of the earlier job's limits (default: the earlier job's own)."""
    meta = spec_field(name).metadata
    return click.option(flag, name, type=Number(kind, meta["min"], meta["max"]), default=None,
                        help=f"{meta['help']} Default: the earlier job's.")


def queue_options(func: Any) -> Any:
    decorators = [
        click.option("--out", "out_dir", metavar="DIR",
                     help="Artifacts go to DIR/<job id>/. Default: the earlier job's when it can be written here (a "
                          "batch item's: pid-runs), else pid-runs."),
        click.option("--queue", type=QueueName(), default=None,
                     help="The queue the job waits in. Default: the earlier job's."),
        api_key_option("API key; never enters the container (an ended job's key is not kept: give it again)."),
        click.option("--wait", is_flag=True, help="Block until the job ends; exit with its exit code."),
        click.option("--json", "as_json", is_flag=True,
                     help="With --wait: print result.json instead of the summary; without: {\"id\", \"status\", "
                          "\"queue\"} instead of the id alone."),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


@click.command("continue", cls=HomeCommand)
@click.argument("job_id", type=JOB_ID, metavar="ID")
@click.argument("message")
@click.option("--model", default=None, help="Another model carries on (its prices and context window: the model "
                                             "table's). Default: the earlier job's.")
@click.option("--base-url", type=Url(), default=None,
              help="Another endpoint carries on; the API key given here goes to it. Default: the earlier job's.")
@click.option("--api", type=Api(), default=None,
              help="Its wire format (openai or anthropic); without --base-url, an earlier vendor's own endpoint "
                   "becomes this format's own. Default: the earlier job's.")
@_limit("--max-turns", "max_turns", int)
@_limit("--timeout", "timeout_s", float)
@_limit("--max-cost", "max_cost", float)
@queue_options
def continue_job(job_id: str, message: str, model: str | None, base_url: str | None, api: str | None,
                 out_dir: str | None, queue: str | None, api_key: str | None, wait: bool, as_json: bool,
                 **limits: Any) -> None:
    """Continue an ended job as a new job: its conversation, then MESSAGE; on its snapshot with its patch applied,
    so the new job's patch holds both jobs' changes. Prints the new job's id."""
    if not message.strip():
        raise _main.BadInput("the message is empty")
    if model is not None and not model.strip():
        raise _main.BadInput("--model is empty")
    from pid.jobs.continuation import continuation_spec, switch_model

    def make(store: Any) -> JobSpec:
        spec = continuation_spec(store, job_id, message)
        switch_model(spec, model, base_url, api)
        return spec
    _queue(make, out_dir, queue, api_key, wait, as_json, limits, Endpoint(base_url, api))


@click.command(cls=HomeCommand)
@click.argument("job_id", type=JOB_ID, metavar="ID")
@queue_options
def retry(job_id: str, out_dir: str | None, queue: str | None, api_key: str | None, wait: bool,
          as_json: bool) -> None:
    """Run a job again as a new job: the same task and options, on the same workspace snapshot. Prints the new
    job's id."""
    from pid.jobs.continuation import retry_spec
    _queue(lambda store: retry_spec(store, job_id), out_dir, queue, api_key, wait, as_json, {}, Endpoint())


@dataclass
class Endpoint:
    """The endpoint named on this command line (continue's --base-url, --api), which the key given with it is for."""
    base_url: str | None = None
    api: str | None = None


def _queue(make: Any, out_dir: str | None, queue: str | None, api_key: str | None, wait: bool, as_json: bool,
           limits: dict[str, Any], given: Endpoint) -> None:
    """Make the spec, check it as submit checks its own, record it, publish it; then print the id or wait."""
    from pid.jobs.brokers import embedded_broker
    from pid.jobs.continuation import Refused
    from pid.jobs.store import default_store
    _main.check_broker()
    store = default_store()
    try:
        spec: JobSpec = make(store)
    except Refused as exc:
        raise _main.BadInput(str(exc)) from None
    for name, value in limits.items():
        if value is not None:
            setattr(spec, name, value)
    check_prices(spec)
    spec.out_dir = _out_dir(out_dir, spec.out_dir)
    if queue:
        spec.queue = queue
    # The stored job's endpoint may be anyone's (a tasks-file line's): the key given here goes only to the endpoint
    # it is for: the one named beside it (--base-url, --api here, else PID_BASE_URL, PID_API), else the API's own
    # (pid.config.endpoint). No key is ever taken from the earlier job: its own was forgotten when it ended.
    env = EnvDefaults.read()
    home = key_endpoint(api_key, given.api or env.api, given.base_url or env.base_url)
    if api_key and endpoint(spec.api, spec.base_url) != home:
        how = "pass --api-key, or set PID_BASE_URL" if isinstance(api_key, EnvKey) else "pass --base-url"
        echo(f"pid: the API key is for {home}, not this job's "
             f"{endpoint(spec.api, spec.base_url)}: not sent ({how}, to send it there)", err=True)
        api_key = None
    _main.check_api_key(spec, api_key)
    if embedded_broker():   # the worker is on this machine: its image and CPUs must be here too
        _main.check_cpus(spec)
        _main.check_runtime(spec.runtime)
        if spec.image_id:
            _check_image_id(spec)
        else:
            _main.check_image(spec.image)
    _main.queue_job(store, spec, api_key, wait, as_json)



def _check_image_id(spec: JobSpec) -> None:
    """The very image the earlier job ran (its id) must be in the engine: a job runs again on it, not on what its tag
    names now."""
    from pid.jobs.continuation import pinned_image_gone
    from pid.jobs.submission import image_missing
    if image_missing(str(spec.image_id)):
        raise _main.BadInput(pinned_image_gone(spec, "is no longer in the Docker engine"))


def check_prices(spec: JobSpec) -> None:
    """--max-cost (given now, or the earlier job's) needs prices: the earlier job's own, or the model table's, as
    `submit` accepts them (pid.jobs.submission.build_spec)."""
    priced = spec.input_price or spec.output_price or spec.cache_read_price or spec.cache_write_price
    if spec.max_cost is not None and not priced and not submission.table_prices(spec.model):
        raise _main.BadInput("--max-cost needs the model's prices, and neither the earlier job nor the model table "
                             "has them")


def _out_dir(given: str | None, earlier: str) -> str:
    """--out as given (checked), else the earlier job's when this machine can write there (a batch item's: not the
    batch's scratch directory), else submit's default."""
    if given is not None:
        return _main.check_out_dir(given)
    default = os.path.join(os.getcwd(), str(spec_field("out_dir").default))
    from pid.jobs.batch import JOBS, BatchDir
    earlier_path = os.path.normpath(earlier)
    if os.path.basename(earlier_path) == JOBS and BatchDir.exists(os.path.dirname(earlier_path)):
        return _main.check_out_dir(default)   # the batch's scratch, which it empties as it downloads each item
    try:
        return _main.check_out_dir(earlier)
    except click.ClickException:
        return _main.check_out_dir(default)
