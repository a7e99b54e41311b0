"""`pid batch TASKS.jsonl`: many jobs from one file, in one process with one store and one broker connection;
followed live, resumable from its output directory, with a budget and a running limit kept in the job store.

    check every line -> pack each repo once -> ledger, create, dispatch (in chunks) -> follow -> download -> summary

The output directory is the batch's memory (jobs/batch.py): a rerun of the same command skips the items that
completed, waits for those whose job is still queued or running (never a second job beside it), submits the rest
again; --retry-failed also reruns failed and limit-hit items. Here: the command, its checks, the local worker; one
run's submitting and following is cli/batch_run.py.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from typing import Any

import click
from click.core import ParameterSource

from pid.cli.batch_progress import Progress
from pid.cli.batch_run import EXIT_INTERRUPTED, Run, count
from pid.cli.batch_tasks import Item, parse
from pid.cli.options import JOB_OPTIONS, EnvOption, Number, QueueName, Size, format_size, spec_options
from pid.cli.output import echo
from pid.terminal import dumps, one_line
from pid.jobs.batch import BatchDir, changed_options, kept_options, other_tasks
from pid.jobs.spec import DEFAULT_QUEUE, JobSpec, spec_field
from pid import settings

WORKER_STOP_S = 60.0


def _bad(message: str) -> click.ClickException:
    from pid.cli.main import BadInput
    return BadInput(message)


class BatchCommand(click.Command):
    """`batch --help` shows batch's own options first, then the job options every item takes as defaults."""
    JOB_PARAMS = {option.name for option in JOB_OPTIONS} | {"api_key", "no_images"}

    def invoke(self, ctx: click.Context) -> Any:
        """A shared check's refusal (PidError) is one line and exit 2, as everywhere."""
        from pid.errors import PidError
        try:
            return super().invoke(ctx)
        except click.ClickException:
            raise
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


@click.command("batch", cls=BatchCommand)
@click.argument("tasks", required=False, metavar="TASKS.jsonl|-")
@click.option("--repo", metavar="DIR|URL",
              help=spec_field("repo").metadata["help"].rstrip(".") + ". Every item's, unless its line names one.")
@click.option("--queue", type=QueueName(), default=DEFAULT_QUEUE, show_default=True, envvar=settings.QUEUE.name,
              show_envvar=True, cls=EnvOption, help=spec_field("queue").metadata["help"])
@click.option("--max-workspace", type=Size(), default=format_size(200 << 20), show_default=True,
              envvar=settings.MAX_WORKSPACE.name, show_envvar=True, cls=EnvOption,
              help="Largest packed size of a directory repo (each is packed once, at submit).")
@click.option("--workers", type=click.IntRange(1, 256), default=None,
              help="Also run N job slots here (a `pid worker` for the life of the command).")
@click.option("--max-total-cost", type=Number(float, 0, None), default=None,
              help="USD for the whole batch, across every worker: once its jobs have spent it, queued items are "
                   "cancelled and running ones stop before their next model call (exit reason batch_budget).")
@click.option("--max-running", type=click.IntRange(min=1), default=None,
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
    from pid.config import HomeUnusable, ensure_pid_home
    try:
        ensure_pid_home()
    except HomeUnusable as exc:
        raise _bad(str(exc)) from None
    if status_dir or wait_dir or cancel_dir:
        if tasks or len([d for d in (status_dir, wait_dir, cancel_dir) if d]) > 1:
            raise _bad("--status DIR, --wait DIR and --cancel DIR take no tasks file, and one at a time")
        path = os.path.abspath(os.path.expanduser(status_dir or wait_dir or cancel_dir or ""))
        bdir = _open(path)
        if status_dir:
            _status(bdir, as_json)
            return
        if cancel_dir:
            _cancel(bdir)
            return
        Run(bdir, _store(), as_json, retry_failed=False).follow_existing()
        return
    if not tasks:
        raise _bad("pid batch needs a tasks file (TASKS.jsonl, or - for stdin), or --status DIR / --wait DIR")
    ctx = click.get_current_context()
    if ctx.get_parameter_source("out_dir") in (ParameterSource.DEFAULT, None):
        raise _bad("pid batch needs --out DIR: the batch's results, and its memory when it runs again")
    if detach and workers:
        raise _bad("--detach and --workers: the local workers would stop as the command returns")
    from pid.jobs.submission import check_broker, check_out_dir
    check_broker()
    out = check_out_dir(options.pop("out_dir"))
    if os.path.isdir(out) and os.listdir(out) and not BatchDir.exists(out):
        raise _bad(f"--out {out}: not empty and not a batch's output directory")
    items, errors = _read_items(tasks, allow_outside)
    tasks_path = os.path.abspath(os.path.expanduser(tasks)) if tasks != "-" else "-"
    defined = {**options, "repo": repo, "queue": queue, "no_images": no_images, "max_workspace": max_workspace}
    if BatchDir.exists(out):
        _same_batch(_open(out), tasks_path, [item.id for item in items], defined)
    from pid.config import endpoint
    key_endpoint = endpoint(options["api"], options.get("base_url"))   # the command line's key goes there only
    specs = build_specs(items, options, repo=repo, queue=queue, no_images=no_images, api_key=api_key,
                        jobs_dir=os.path.join(out, ".jobs"), max_workspace=max_workspace,
                        need_prices=max_total_cost is not None, tasks=tasks, errors=errors, key_endpoint=key_endpoint)
    settings = {"tasks": tasks_path, "max_total_cost": max_total_cost, "max_running": max_running,
                "options": kept_options(defined)}
    bdir = _open(out) if BatchDir.exists(out) else BatchDir.create(out, settings)
    bdir.set_order([item.id for item in items], settings)
    store = _store()
    store.set_batch(bdir.batch_id, max_total_cost, max_running)
    local = LocalWorkers.start(workers, sorted({s.queue for s in specs.values()}), out) if workers else None
    run = Run(bdir, store, as_json, retry_failed, specs=specs, api_key=api_key, key_endpoint=key_endpoint,
              max_running=max_running, local=local, tasks=tasks)
    try:
        try:
            run.start()
        except KeyboardInterrupt:   # mid-submit: what was submitted goes, and the ledger keeps it for a rerun
            echo("\ninterrupted while submitting: cancelling the jobs submitted so far", err=True)
            run.cancel_tracked()
            sys.exit(EXIT_INTERRUPTED)
        if detach:
            echo(f"batch {bdir.batch_id}: {run.submitted} job(s) submitted, {len(run.tracked)} item(s) to "
                 f"wait for; later: pid batch --status {shlex.quote(out)} / pid batch --wait {shlex.quote(out)}")
            return
        run.follow()
    finally:
        if local is not None:
            local.stop()


for _param in batch.params:   # the job option --out is the batch's own directory here
    if _param.name == "out_dir" and isinstance(_param, click.Option):
        _param.help = ("The batch's directory (required): DIR/<item id>/ per item, batch.jsonl, summary.json; its "
                       "memory when the same command runs again.")
        _param.show_default = False


def _store() -> Any:
    from pid.jobs.store import default_store
    return default_store()


def _open(path: str) -> BatchDir:
    try:
        return BatchDir.open(path)
    except ValueError as exc:
        raise _bad(str(exc)) from None


def _same_batch(bdir: BatchDir, tasks: str, item_ids: list[str], options: dict[str, Any]) -> None:
    """A rerun resumes its batch: another tasks file, or other options, would be merged into it. Refused (exit 2)."""
    again = (f"resume it with the command that started it (pid batch {shlex.quote(str(bdir.meta.get('tasks')))} "
             f"--out {shlex.quote(bdir.path)} and the same options), or give this run another --out directory")
    if other_tasks(bdir.meta, tasks, item_ids):
        raise _bad(f"--out {bdir.path} holds batch {bdir.batch_id} of another tasks file "
                   f"({one_line(str(bdir.meta.get('tasks')))}): {again}")
    changed = changed_options(bdir.meta, options)
    if changed:
        flags = {option.name: option.flag for option in JOB_OPTIONS}
        named = ", ".join(flags.get(name, "--" + name.replace("_", "-")) for name in changed)
        raise _bad(f"--out {bdir.path} holds batch {bdir.batch_id}, started with other options ({named} "
                   f"differ): {again}")


def _read_items(tasks: str, allow_outside: bool) -> tuple[list[Item], list[str]]:
    """Every line read and parsed, its paths relative to the tasks file's directory (batch_tasks.local_path); the
    bad ones are reported with the others build_specs finds."""
    try:
        if tasks == "-":
            lines = sys.stdin.read().removeprefix("\ufeff").splitlines()
        else:   # utf-8-sig: a byte order mark (some editors write one) is not part of line 1
            with open(os.path.expanduser(tasks), encoding="utf-8-sig") as f:
                lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise _bad(f"cannot read {tasks}: {getattr(exc, 'strerror', None) or exc}") from None
    base = None if tasks == "-" else os.path.dirname(os.path.abspath(os.path.expanduser(tasks)))
    parsed = parse(lines, base, allow_outside)
    if not parsed.items and not parsed.errors:
        raise _bad(f"{tasks}: no tasks")
    return parsed.items, parsed.errors


def _refuse(errors: list[str], tasks: str) -> None:
    if not errors:
        return
    errors.sort(key=lambda e: int(e.split(":", 1)[0].split()[-1]) if e.startswith("line ") else 0)
    for error in errors:
        echo(f"pid: error: {tasks}: {one_line(error)}", err=True)
    lines = len({e.split(":", 1)[0] for e in errors})
    raise _bad(f"{lines} bad line(s) in {tasks}; nothing was submitted")


PRICES = ("input_price", "output_price", "cache_read_price", "cache_write_price")


def build_specs(items: list[Item], options: dict[str, Any], *, repo: str | None, queue: str, no_images: bool,
                api_key: str | None, jobs_dir: str, max_workspace: int, need_prices: bool,
                tasks: str = "TASKS", errors: list[str] | None = None,
                key_endpoint: str | None = None) -> dict[str, JobSpec]:
    """Each item's JobSpec: the command line's options, then its line's fields; checked as `pid submit` checks
    one (repos, model, prices, key), every directory repo packed once. Any problem: all of them, exit 2. The key
    goes with the items whose endpoint is `key_endpoint` (the command line's) only: a line naming another endpoint
    runs without it (pid.config.endpoint)."""
    from pid.errors import PidError
    from pid.jobs.submission import check_api_key, check_originals, check_repo
    from pid.config import base_url_for, endpoint
    from pid.jobs.spec import command_problem
    errors = list(errors or [])
    specs: dict[str, JobSpec] = {}
    repos: dict[str, str | BaseException] = {}
    table: dict[str, bool] = {}   # model -> the model table prices it (asked once per model)
    for item in items:
        where = f"line {item.line}"
        given = item.repo or repo
        fields = {**options, **item.fields}
        checked: str | BaseException | None = None
        if not given and not fields.get("workdir"):
            errors.append(f"{where}: no repo (a \"repo\" field, or --repo for every item) and no workdir (the "
                          "image's own directory)")
            continue
        if given:
            if given not in repos:
                try:
                    repos[given] = check_repo(given)
                except PidError as exc:
                    repos[given] = exc
            checked = repos[given]
        if isinstance(checked, BaseException):
            errors.append(f"{where}: {checked}")
            continue
        try:
            fields["check_original"] = check_originals(fields.get("check_original") or (), fields.get("check"),
                                                       fields.get("workdir"))
        except PidError as exc:
            errors.append(f"{where}: {exc}")
            continue
        model = fields.pop("model", None)
        if not model:
            errors.append(f"{where}: no model (a \"model\" field, --model or PID_MODEL)")
            continue
        problem = command_problem(fields.get("check"))
        problem = f"check: {problem}" if problem else _price_problem(model, fields, need_prices, table)
        if problem:
            errors.append(f"{where}: {problem}")
            continue
        item_queue = fields.pop("queue", queue)
        images = fields.pop("images", not no_images)
        spec = JobSpec(task=item.task, repo=checked, model=model, out_dir=jobs_dir, images=images,
                       **{**fields, "files": list(fields.get("files") or []), "runtime": fields.get("runtime") or None})
        spec.queue = item_queue
        spec.base_url = base_url_for(spec.api, spec.base_url)
        keyed = api_key if key_endpoint is None or endpoint(spec.api, spec.base_url) == key_endpoint else None
        try:
            check_api_key(spec, keyed)
        except PidError as exc:
            mine = f" (the command line's key is for {key_endpoint} only)" if api_key and not keyed else ""
            errors.append(f"{where}: {exc}{mine}")
            continue
        specs[item.id] = spec
    _refuse(errors, tasks)
    errors += _pack(items, specs, max_workspace)
    errors += _policy_refusals(items, specs)
    _refuse(errors, tasks)
    if any(s.network != "none" for s in specs.values()):
        echo("pid: warning: some items use --network bridge: their sandboxes can reach the network and are "
             "reachable from it", err=True)
    _check_images(specs)
    return specs


def _price_problem(model: str, fields: dict[str, Any], need_prices: bool, table: dict[str, bool]) -> str | None:
    """Why an item's cost could not be bounded (its max_cost, or the batch's --max-total-cost), or None. Prices are
    accepted as `pid submit` accepts them: given (on the command line or the line), else the model table's (asked
    once per model: `table`)."""
    priced = any(fields.get(p) for p in PRICES) or (
        (need_prices or fields.get("max_cost") is not None) and _priced_in_table(model, table))
    if fields.get("max_cost") is not None and not priced:
        return "max_cost needs the model's prices (input_price and/or output_price, or the model table's)"
    if need_prices and not priced:
        return ("--max-total-cost needs the model's prices (--input-price and/or --output-price, or the line's "
                "fields, or the model table's)")
    return None


def _policy_refusals(items: list[Item], specs: dict[str, JobSpec]) -> list[str]:
    """A line per item that no live worker of its queue would admit (their policies come with their heartbeats)."""
    from pid.jobs.workers import live_workers
    from pid.jobs.policy import refusal_by_workers
    beats = live_workers(_store())
    refusals = ((item, refusal_by_workers(beats, specs[item.id])) for item in items if item.id in specs)
    return [f"line {item.line}: {refusal}" for item, refusal in refusals if refusal]


def _priced_in_table(model: str, seen: dict[str, bool]) -> bool:
    from pid.jobs.submission import table_prices
    if model not in seen:
        seen[model] = table_prices(model)
    return seen[model]


def _pack(items: list[Item], specs: dict[str, JobSpec], max_bytes: int) -> list[str]:
    """Each directory repo packed and stored once (the same tree, whatever the number of items on it)."""
    from pid.config import pid_home
    from pid.sandbox.workspace import WorkspaceTooLarge
    from pid.jobs.blobs import default_blobs
    from pid.jobs.snapshot import git_source, pack_and_store
    packed: dict[str, str | str] = {}
    failed: dict[str, str] = {}
    errors = []
    blobs = None
    for item in items:
        spec = specs.get(item.id)
        if spec is None or not spec.repo or git_source(spec.repo) is not None:
            continue
        if spec.repo not in packed and spec.repo not in failed:
            blobs = blobs or default_blobs()
            try:
                packed[spec.repo] = pack_and_store(spec.repo, blobs, max_bytes, tmp_dir=pid_home()).digest
            except WorkspaceTooLarge:
                failed[spec.repo] = (f"repo {spec.repo} is larger than --max-workspace {format_size(max_bytes)} "
                                     "once packed")
            except OSError as exc:
                failed[spec.repo] = f"cannot pack repo {spec.repo}: {exc.strerror or exc}"
        if spec.repo in failed:
            errors.append(f"line {item.line}: {failed[spec.repo]}")
        else:
            spec.workspace = packed[spec.repo]
    return errors


def _check_images(specs: dict[str, JobSpec]) -> None:
    from pid.jobs.brokers import embedded_broker
    if not embedded_broker():
        return
    from pid.errors import PidError
    from pid.jobs.submission import check_cpus, check_image
    for image in sorted({s.image for s in specs.values()}):
        check_image(image)
    item, most = max(specs.items(), key=lambda pair: pair[1].cpus, default=(None, None))
    if most is not None:
        try:
            check_cpus(most)
        except PidError as exc:
            raise _bad(f"item {item}: {exc}; nothing was submitted") from None


class LocalWorkers:
    """`--workers N`: a `pid worker --concurrency N` child for the life of the command, on the batch's queues, in
    its own session (a Ctrl-C at the terminal is the batch's to handle); its log in DIR/.worker.log."""

    def __init__(self, proc: subprocess.Popen[bytes], log_path: str) -> None:
        self.proc, self.log_path = proc, log_path

    @classmethod
    def start(cls, n: int, queues: list[str], out: str) -> "LocalWorkers":
        log_path = os.path.join(out, ".worker.log")
        os.makedirs(out, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "pid.cli.main", "worker", "--concurrency", str(n),
                                     "--queue", ",".join(queues)], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent)
        return cls(proc, log_path)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM: a job still running goes back to the queue (none does at a batch's normal end)."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=WORKER_STOP_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _die_with_parent() -> None:
    """In the local worker's child, before exec: SIGTERM when the batch's process dies, however it dies (Linux), so
    a killed `pid batch` leaves no worker behind (SIGTERM hands its running jobs back to the queue)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except Exception:
        pass

def _status(bdir: BatchDir, as_json: bool) -> None:
    """--status DIR: every item by its current job's status (or its recorded end), the spend, no waiting."""
    store = _store()
    records = {r.id: r for r in store.batch_jobs(bdir.batch_id)}
    live = {bdir.current_job(i): i for i in bdir.order if bdir.current_job(i) in records
            and not records[bdir.current_job(i)].terminal}
    progress = Progress(total=len(bdir.order))
    count(progress, bdir, records, {j: i for j, i in live.items() if j})
    info = store.batch(bdir.batch_id)
    if as_json:
        echo(dumps({"batch": bdir.batch_id, "items": len(bdir.order), "counts": progress.counts,
                    "cost": round(progress.cost, 6),
                    "budget": None if info is None else {"max_total_cost": info.max_total_cost, "spent": info.spent,
                                                         "max_running": info.max_running}}))
        return
    from pid.cli.batch_control import item_lines
    from pid.cli.table import terminal_width
    from pid.costs import format_cost
    counts = ", ".join(f"{n} {s}" for s, n in sorted(progress.counts.items()))
    budget = f" of {format_cost(info.max_total_cost)}" if info is not None and info.max_total_cost is not None else ""
    echo(f"batch {bdir.batch_id}: {len(bdir.order)} items: {counts}; cost {format_cost(progress.cost)}{budget}")
    for line in item_lines(bdir, records, terminal_width()):
        echo(line)


def _cancel(bdir: BatchDir) -> None:
    """--cancel DIR: a line per job cancelled, then how many."""
    from pid.cli.batch_control import cancel_batch
    lines = cancel_batch(bdir, _store())
    for line in lines:
        echo(line)
    echo(f"batch {bdir.batch_id}: " + (f"{len(lines)} job(s) cancelled" if lines else "nothing to cancel (every "
                                        "job has ended)"))

