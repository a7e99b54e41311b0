"""The `pid` command. Thin: parse, call, print. Exit codes: 0 completed, 1 failed, 2 bad usage or input,
3 a limit was hit (timeout, max turns, max cost)."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
from typing import Any, Callable

import click

from pid import events as ev
from pid.config import EnvDefaults, pid_home
from cli.output import EventPrinter, SessionFollower, print_result, wait_for
from worker.jobs import JobSpec, exit_code_for

TOOL_NAMES = ("read", "bash", "edit", "write")
API_NAMES = {"openai": "openai-completions", "anthropic": "anthropic-messages"}
JOB_STATUSES = ("queued", "running", "completed", "failed", "timeout", "cancelled")


class BadInput(click.ClickException):
    """One line on stderr and exit code 2, never a traceback."""
    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"pid: error: {self.format_message()}", err=True)


def job_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options `run` and `submit` share: they describe the same job."""
    options = [
        click.argument("task"),
        click.option("--repo", required=True, help="Repository or directory to work on (copied, never modified)."),
        click.option("--model", help="Model name [env PID_MODEL]."),
        click.option("--base-url", help="Model endpoint [env PID_BASE_URL, default OpenAI]."),
        click.option("--api-key", help="API key [env PID_API_KEY or OPENAI_API_KEY]; never enters the container."),
        click.option("--api", type=click.Choice(sorted(API_NAMES)), help="Wire format [env PID_API, default openai]."),
        click.option("--image", help="Sandbox image [env PID_IMAGE, default pid-sandbox:latest]."),
        click.option("--out", default="pid-runs", show_default=True, help="Artifacts go to OUT/<job id>/."),
        click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=3600, show_default=True,
                     help="Wall-clock limit for the whole job, in seconds."),
        click.option("--max-turns", type=click.IntRange(min=1), default=100, show_default=True),
        click.option("--max-cost", type=click.FloatRange(min=0), help="Stop when the cost in USD exceeds this."),
        click.option("--input-price", type=click.FloatRange(min=0), default=0.0,
                     help="USD per million input tokens (for usage.cost and --max-cost)."),
        click.option("--output-price", type=click.FloatRange(min=0), default=0.0,
                     help="USD per million output tokens."),
        click.option("--no-images", is_flag=True, help="The model takes no images: read's images reach it as a note."),
        click.option("--tools", help="Active tools, comma-separated (default: read,bash,edit,write)."),
        click.option("--file", "files", multiple=True, help="In-container path to collect as an artifact (repeatable)."),
        click.option("--memory", default="2g", show_default=True, help="Container memory limit (swap = memory)."),
        click.option("--cpus", type=click.FloatRange(min=0.01), default=1.0, show_default=True),
        click.option("--pids", "pids_limit", type=click.IntRange(min=16), default=512, show_default=True),
        click.option("--network", default="none", show_default=True, help="Container network (none: no network)."),
        click.option("--user", default="1000:1000", show_default=True,
                     help="The agent's UID[:GID] in the container; 'root' is an explicit opt-in (weaker isolation)."),
        click.option("--disk", default="10g", show_default=True,
                     help="Everything the job may write (workspace, /tmp, home, kept output); 0: no limit."),
        click.option("--runtime", help="Engine runtime for the container, e.g. runsc (gVisor)."),
        click.option("--max-patch", default="100m", show_default=True, help="Largest patch.diff accepted."),
        click.option("--max-files-size", default="100m", show_default=True, help="--file collection: bytes in all."),
        click.option("--max-files", type=click.IntRange(min=1), default=10000, show_default=True,
                     help="--file collection: entries in all."),
        click.option("--json", "as_json", is_flag=True, help="Print result.json instead of the summary."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def build_spec(task: str, repo: str, model: str | None, base_url: str | None, api: str | None, image: str | None,
               out: str, timeout_s: float, max_turns: int, max_cost: float | None, input_price: float,
               output_price: float, no_images: bool, tools: str | None, files: tuple[str, ...], memory: str,
               cpus: float, pids_limit: int, network: str, user: str, disk: str, runtime: str | None,
               max_patch: str, max_files_size: str, max_files: int) -> JobSpec:
    env = EnvDefaults.read()
    if not task.strip():
        raise BadInput("the task is empty")
    repo_path = os.path.abspath(os.path.expanduser(repo))
    if not os.path.exists(repo_path):
        raise BadInput(f"repo path does not exist: {repo}")
    if not os.path.isdir(repo_path):
        raise BadInput(f"repo path is not a directory: {repo}")
    model = model or env.model
    if not model:
        raise BadInput("no model configured: pass --model or set PID_MODEL")
    if max_cost is not None and not (input_price or output_price):
        raise BadInput("--max-cost needs the model's prices: pass --input-price and/or --output-price")
    active = None
    if tools:
        active = [t.strip() for t in tools.split(",") if t.strip()]
        unknown = sorted(set(active) - set(TOOL_NAMES))
        if unknown or not active:
            raise BadInput(f"unknown tool(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(TOOL_NAMES)}")
    from sandbox.config import parse_user
    from sandbox.disk import parse_size
    try:
        parse_user(user)
        disk_bytes = 0 if disk.strip() in ("0", "none") else parse_size(disk)
        patch_bytes, files_bytes = parse_size(max_patch), parse_size(max_files_size)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return JobSpec(task=task, repo=repo_path, model=model, out_dir=os.path.abspath(out),
                   base_url=base_url or env.base_url, api=API_NAMES[api] if api else env.api,
                   image=image or env.image, timeout_s=timeout_s, max_turns=max_turns, max_cost=max_cost,
                   input_price=input_price, output_price=output_price, images=not no_images, tools=active, files=list(files), memory=memory, cpus=cpus, pids_limit=pids_limit, network=network,
                   user=user.strip(), disk=disk_bytes, runtime=runtime or None, max_patch=patch_bytes,
                   max_files_bytes=files_bytes, max_files=max_files)


def check_image(image: str) -> None:
    from sandbox import DockerUnavailable, ImageNotFound, ensure_image
    try:
        ensure_image(image)
    except (ImageNotFound, DockerUnavailable) as exc:
        raise BadInput(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pid")
def cli() -> None:
    """pid runs LLM coding agents in Docker sandboxes, in the foreground or through a queue."""


@cli.command()
@job_options
def run(api_key: str | None, as_json: bool, **options: Any) -> None:
    """Run one job in the foreground (no queue)."""
    spec = build_spec(**options)
    from worker.sandbox_start import abandon, start_sandbox
    starting = start_sandbox(spec)    # the container starts while the agent's code loads
    try:
        check_image(spec.image)
        reap_own_quietly()
        from worker.runner import run_job
    except BaseException:             # bad input or Ctrl-C before the job: nothing may stay behind
        abandon(starting)
        raise
    key = api_key or EnvDefaults.read().api_key
    agents: list[Any] = []
    from worker.control import ForegroundJob
    job = ForegroundJob.start(spec)   # in the job store: list, status, steer, pause, cancel reach it from elsewhere
    result = None

    def on_sigint(signum: int, frame: Any) -> None:
        if not agents:  # still setting up: the runner's finally removes what exists
            raise KeyboardInterrupt
        if not agents[0].cancel_event.is_set():
            click.echo("\ncancelling: collecting the patch and removing the container…", err=True)
            agents[0].cancel()
        else:  # cleanup is short and bounded; interrupting it would leak the container and lose the result
            click.echo("still cleaning up…", err=True)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        click.echo(f"job {spec.id}: {spec.model} in {spec.image}", err=True)
        result = run_job(spec, api_key=key, sink=job.sink(ev.ignore if as_json else EventPrinter()),
                         on_agent=lambda agent: (agents.append(agent), job.attach(agent)), cancel=job.cancel,
                         starting=starting)
    except KeyboardInterrupt:  # Ctrl-C during set-up: run_job removed the container and wrote result.json on its way out
        click.echo(f"interrupted; artifacts: {os.path.relpath(spec.job_dir)}", err=True)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGINT, previous)
        job.end(result)
    print_result(result, spec.job_dir, as_json)
    sys.exit(exit_code_for(result))


@cli.command()
@job_options
@click.option("--wait", is_flag=True, help="Block until the job ends; exit with its exit code.")
def submit(api_key: str | None, as_json: bool, wait: bool, **options: Any) -> None:
    """Queue a job for a worker and print its id."""
    from worker.app import embedded_broker
    from worker.store import default_store
    from worker.tasks import dispatch
    spec = build_spec(**options)
    if embedded_broker():  # the worker is on this machine: its image must be here too
        check_image(spec.image)
    store = default_store()
    store.create(spec)
    try:
        dispatch(spec.id, api_key)
    except Exception as exc:  # the broker refused: the job must not sit queued forever
        store.finish(spec.id, "failed", exit_reason="dispatch_failed", error=str(exc))
        raise click.ClickException(f"could not queue job {spec.id}: {exc}") from None
    if not wait:
        click.echo(spec.id)
        return
    click.echo(f"job {spec.id} queued", err=True)
    _wait_and_exit(store, spec.id, as_json, follow=not as_json)


def _wait_and_exit(store: Any, job_id: str, as_json: bool, follow: bool) -> None:
    record = store.get(job_id)
    result_path = os.path.join(record.spec.job_dir, "result.json")
    follower = SessionFollower(os.path.join(record.spec.job_dir, "session.jsonl")) if follow else None
    try:
        wait_for(lambda: store.get(job_id).terminal, follower)
        wait_for(lambda: os.path.exists(result_path), None, timeout_s=10)  # written just before or after the end
    except KeyboardInterrupt:
        click.echo(f"\nstopped waiting; job {job_id} goes on (pid result {job_id} --wait, pid cancel {job_id})",
                   err=True)
        sys.exit(130)
    result = _load_result(store, job_id)
    print_result(result, record.spec.job_dir, as_json)
    sys.exit(exit_code_for(result))


def _load_result(store: Any, job_id: str) -> dict[str, Any]:
    path = os.path.join(store.get(job_id).spec.job_dir, "result.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot read the result of job {job_id} at {path}: {exc}") from None


def _record_or_fail(job_id: str) -> Any:
    from worker.store import default_store
    store = default_store()
    record = store.get(job_id)
    if record is None:
        raise BadInput(f"no such job: {job_id}")
    return store, record


@cli.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
def status(job_id: str, as_json: bool) -> None:
    """Show a job's status: counts, what it is doing now, its error."""
    from worker.sweep import sweep_quietly
    sweep_quietly()
    _, record = _record_or_fail(job_id)
    if as_json:
        click.echo(json.dumps(record.to_dict(), indent=2))
        return
    flags = " (paused)" if record.paused and not record.terminal else ""
    flags += " (cancel requested)" if record.cancel_requested and not record.terminal else ""
    click.echo(f"{record.id}  {record.status}{flags}  turns={record.turns} tool_calls={record.tool_calls}"
               f"  attempts={record.attempts}" + (f"  exit_reason={record.exit_reason}" if record.exit_reason else ""))
    usage = record.total_usage
    click.echo(f"  {'pid run' if record.kind == 'run' else 'worker job'} · {_duration(record.duration_s)} · "
               f"{usage['total_tokens']} tokens · ${usage['cost']:.4f}")
    if record.activity and not record.terminal:
        click.echo(f"  now: {record.activity}")
    if record.last_tool:
        click.echo(f"  last tool: {record.last_tool}")
    if record.error:
        click.echo(f"  error: {record.error}")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


@cli.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print result.json.")
@click.option("--wait", is_flag=True, help="Wait for the job to end first.")
def result(job_id: str, as_json: bool, wait: bool) -> None:
    """Show a finished job's result; exit with its exit code."""
    store, record = _record_or_fail(job_id)
    if wait:
        _wait_and_exit(store, job_id, as_json, follow=False)
    if not record.terminal:
        raise click.ClickException(f"job {job_id} is {record.status}; use --wait to wait for it")
    result = _load_result(store, job_id)
    print_result(result, record.spec.job_dir, as_json)
    sys.exit(exit_code_for(result))


@cli.command()
@click.argument("job_id")
def cancel(job_id: str) -> None:
    """Cancel a queued or running job (artifacts so far are kept)."""
    from worker.tasks import cancel_job
    store, _ = _record_or_fail(job_id)
    click.echo(f"{job_id}: {cancel_job(store, job_id)}")


def _post(kind: str, job_id: str, message: str) -> None:
    store, record = _record_or_fail(job_id)
    if not store.post(job_id, kind, message):
        raise BadInput(f"job {job_id} is {record.status}: it takes no more messages")
    click.echo(f"{job_id}: {kind.replace('_', '-')} queued")


@cli.command()
@click.argument("job_id")
@click.argument("message")
def steer(job_id: str, message: str) -> None:
    """Send a message delivered after the current tool calls, before the next model call."""
    _post("steer", job_id, message)


@cli.command("follow-up")
@click.argument("job_id")
@click.argument("message")
def follow_up(job_id: str, message: str) -> None:
    """Send a message delivered when the agent would otherwise stop."""
    _post("follow_up", job_id, message)


def _set_paused(job_id: str, paused: bool) -> None:
    store, record = _record_or_fail(job_id)
    if not store.set_paused(job_id, paused):
        raise BadInput(f"job {job_id} is {record.status}")
    click.echo(f"{job_id}: {'pause requested' if paused else 'resumed'}")


@cli.command()
@click.argument("job_id")
def pause(job_id: str) -> None:
    """Hold a job before its next model call (its wall clock keeps running)."""
    _set_paused(job_id, True)


@cli.command()
@click.argument("job_id")
def resume(job_id: str) -> None:
    """Continue a paused job."""
    _set_paused(job_id, False)


@cli.command("list")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--status", "status_filter", type=click.Choice(list(JOB_STATUSES)), help="Only jobs in this status.")
@click.option("--json", "as_json", is_flag=True, help="A JSON array of the jobs' records.")
def list_jobs(limit: int, status_filter: str | None, as_json: bool) -> None:
    """Recent jobs, newest first: status, duration, cost, exit reason, task (`pid run` jobs too)."""
    from worker.store import default_store
    from worker.sweep import sweep_quietly
    store = default_store()
    sweep_quietly(store)
    records = store.list(limit, status_filter)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in records], indent=2))
        return
    for record in records:
        task = " ".join(record.spec.task.split())
        cost = record.total_usage["cost"]
        click.echo(f"{record.id}  {record.status:<9}  {_duration(record.duration_s):>8}  "
                   f"{f'${cost:.4f}':>9}  {record.exit_reason or '-':<16}  {task[:50]}")


@cli.command()
@click.option("--concurrency", "-c", type=click.IntRange(min=1), default=1, show_default=True,
              help="Jobs run at once (each in its own process and container).")
@click.option("--loglevel", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              default="WARNING", show_default=True,
              help="Celery's and the libraries' logging (INFO: Celery's banner, every task, every HTTP request); "
                   "pid's own line per job start and end always prints.")
def worker(concurrency: int, loglevel: str) -> None:
    """Start a worker that runs queued jobs (Ctrl-C: finish the running jobs, then stop; twice: stop now)."""
    from worker.app import QUEUE, app
    from worker.tasks import configure_job_lines
    configure_job_lines()
    quiet = ["--quiet"] if loglevel.upper() in ("WARNING", "ERROR") else []   # Celery's banner only when asked
    app.worker_main([*quiet, "worker", f"--concurrency={concurrency}", f"--queues={QUEUE}",
                     f"--loglevel={loglevel.upper()}", "--without-gossip", "--without-mingle", "--without-heartbeat"])


@cli.command()
@click.option("--all", "all_owners", is_flag=True,
              help="Also remove expired containers of other pid installations on this engine.")
def reap(all_owners: bool) -> None:
    """Remove this installation's pid containers whose time to live has passed, and orphaned job disks (workers and
    `pid run` also do this on their own)."""
    from sandbox.reaper import reap_installation
    containers, disks = reap_installation(pid_home(), all_owners=all_owners)
    click.echo(f"removed {len(containers)} expired container(s) and {len(disks)} orphaned disk(s)")


def reap_own_quietly() -> None:
    """At start, beside the job: what an earlier run of this installation left behind goes (never fatal)."""
    def reap() -> None:
        try:
            from sandbox.reaper import reap_installation
            reap_installation(pid_home())
        except Exception:
            pass
        from worker.sweep import sweep_quietly
        sweep_quietly()   # a `pid run` killed earlier is ended, with its result.json
    threading.Thread(target=reap, name="pid-reap", daemon=True).start()


def main() -> None:
    from worker.clients import MissingClient
    try:
        cli(prog_name="pid")
    except MissingClient as exc:
        click.echo(f"pid: error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
