"""From a tasks file and the options to a batch's Run (pid/jobs/batch_run.py): every line checked and every item's
JobSpec built (all problems at once, nothing submitted), directory repos packed once, the output directory opened or
created (a rerun must be the same batch), the batch's budget and running limit in the job store, and the local
workers (`--workers N`). Then run_batch(): a whole batch in one call, returning its items and summary as data.

Refusals are PidError (BadTasks for the tasks file's lines): `pid batch` prints them as its one line and exits 2;
pid.batch raises them. The lines are parsed by the CLI's own option types (pid/cli/batch_tasks.py): one set of rules.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

from pid.errors import PidError
from pid.sandbox.disk import format_size
from pid.terminal import one_line
from pid.jobs.batch import BatchDir, changed_options, hold, kept_options, other_tasks, release
from pid.jobs.batch_run import Display, Progress, Run, ignore, next_step
from pid.jobs.spec import PRICES, JobSpec, job_id_time
from pid.output_dirs import make_marked

if TYPE_CHECKING:
    from pid.cli.batch_tasks import Item

WORKER_STOP_S = 60.0


class BadTasks(PidError):
    """Lines of the tasks file that cannot run ("line N: why" each, in line order): nothing was submitted."""

    def __init__(self, tasks: str, lines: list[str]) -> None:
        self.tasks, self.lines = tasks, lines
        self.summary = f"{len({e.split(':', 1)[0] for e in lines})} bad line(s) in {tasks}; nothing was submitted"
        super().__init__(self.summary + ": " + "; ".join(one_line(e) for e in self.grouped()))

    def grouped(self, shown: int = 10) -> list[str]:
        """Each reason once, with the lines it is about: "lines 1, 2, 3: why" (the first `shown` numbers named).
        A reason every line shares (a batch option, a model without prices) is told once, not once a line."""
        numbers: dict[str, list[str]] = {}
        for error in self.lines:
            where, sep, why = error.partition(": ")
            if where.startswith("line ") and sep:
                numbers.setdefault(why, []).append(where[len("line "):])
            else:
                numbers.setdefault(error, [])
        told = []
        for why, lines in numbers.items():
            if len(lines) <= 1:
                told.append(f"line {lines[0]}: {why}" if lines else why)
                continue
            more = f" and {len(lines) - shown} more" if len(lines) > shown else ""
            told.append(f"lines {', '.join(lines[:shown])}{more}: {why}")
        return told


@dataclass
class Options:
    """A batch's own options (the job options are every item's defaults, under their JobSpec names: `job`)."""
    job: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = None
    no_images: bool = False
    repo: str | None = None
    queue: str = "default"
    max_workspace: int = 200 << 20
    workers: int | None = None
    max_total_cost: float | None = None
    max_running: int | None = None
    allow_outside: bool = False
    retry_failed: bool = False


def prepare(tasks: str, out: str, opts: Options, warn: Callable[[str], None] = ignore) -> Run:
    """The batch's Run over `out` (created, or resumed), its items checked and their specs built, with its local
    workers started (Run.close() stops them). `tasks` is a path, or "-" for stdin. PidError for any refusal."""
    from pid.jobs.submission import check_broker, check_out_dir
    check_broker()
    out = check_out_dir(out)
    if os.path.isdir(out) and os.listdir(out) and not BatchDir.exists(out):
        raise PidError(f"--out {out}: not empty and not a batch's output directory")
    items, errors = read_items(tasks, opts.allow_outside)
    tasks_path = os.path.abspath(os.path.expanduser(tasks)) if tasks != "-" else "-"
    options = dict(opts.job)
    defined = {**options, "repo": opts.repo, "queue": opts.queue, "no_images": opts.no_images,
               "max_workspace": opts.max_workspace}
    digests = item_digests(items)
    if BatchDir.exists(out):
        _same_batch(open_dir(out), tasks_path, digests, defined, opts.retry_failed)
    from pid.config import key_endpoint as endpoint_of_key
    key_endpoint = endpoint_of_key(opts.api_key, options["api"], options.get("base_url"))   # its key goes there only
    specs = build_specs(items, options, repo=opts.repo, queue=opts.queue, no_images=opts.no_images,
                        api_key=opts.api_key, jobs_dir=os.path.join(out, ".jobs"), max_workspace=opts.max_workspace,
                        need_prices=opts.max_total_cost is not None, tasks=tasks, errors=errors,
                        key_endpoint=key_endpoint, warn=warn)
    settings = {"tasks": tasks_path, "max_total_cost": opts.max_total_cost, "max_running": opts.max_running,
                "options": kept_options(defined), "items": digests}
    lock = hold(out)
    try:
        bdir = open_dir(out) if BatchDir.exists(out) else BatchDir.create(out, settings)
        bdir.lock = lock
        bdir.mark_cancelled(False)   # (a run that submits resumes a cancelled batch)
        bdir.set_order([item.id for item in items], settings)
        store = default_store()
        store.set_batch(bdir.batch_id, opts.max_total_cost, opts.max_running)
        local = (LocalWorkers.start(opts.workers, sorted({s.queue for s in specs.values()}), out) if opts.workers
                 else None)
    except BaseException:
        release(lock)
        raise
    return Run(bdir, store, opts.retry_failed, specs=specs, api_key=opts.api_key, key_endpoint=key_endpoint,
               max_running=opts.max_running, local=local, warn=warn)


class Items:
    """A Display that keeps each item's row as it ends (and passes everything on to `then`, if any)."""

    def __init__(self, then: Display | None = None) -> None:
        self.rows: list[dict[str, Any]] = []
        self.then = then

    def item_ended(self, row: dict[str, Any], progress: Progress) -> None:
        self.rows.append(row)
        if self.then is not None:
            self.then.item_ended(row, progress)

    def update(self, progress: Progress) -> None:
        if self.then is not None:
            self.then.update(progress)

    def note(self, text: str) -> None:
        if self.then is not None:
            self.then.note(text)

    def stop(self) -> None:
        if self.then is not None:
            self.then.stop()


def run_batch(tasks: str, out: str, opts: Options, display: Display | None = None,
              warn: Callable[[str], None] = ignore) -> dict[str, Any]:
    """A whole batch, in the calling thread: prepared, submitted, followed to its end. Returns {"items": [each
    item's batch.jsonl row, as it ended in this run], "summary": summary.json's data} (what `pid batch --json`
    prints). See follow() for an interrupt."""
    run = prepare(tasks, out, opts, warn)
    try:
        try:
            run.start()
        except KeyboardInterrupt:
            _cancel_after_interrupt(run, warn)
            raise
        return follow(run, display, warn)
    finally:
        run.close()


def submit_batch(tasks: str, out: str, opts: Options, warn: Callable[[str], None] = ignore) -> Run:
    """`pid batch --detach`: the batch's jobs submitted (or resumed), nothing followed; the Run says how many
    (submitted, tracked). Its items end whoever follows them: wait_batch(), `pid batch --wait DIR`."""
    if opts.workers:
        raise PidError("--detach and --workers: the local workers would stop as the command returns")
    run = prepare(tasks, out, opts, warn)
    try:
        run.start()
    except KeyboardInterrupt:
        _cancel_after_interrupt(run, warn)
        raise
    finally:
        run.close()   # (the directory's lock: whoever follows the batch takes it)
    return run


def wait_batch(out: str, display: Display | None = None, warn: Callable[[str], None] = ignore,
               timeout: float | None = None) -> dict[str, Any]:
    """`pid batch --wait DIR`: the jobs of the batch in `out` that have not been recorded as ended, followed to
    their end (downloaded, recorded); returns as run_batch() does. After `timeout` seconds, TimeoutError: the jobs
    go on, and what ended meanwhile is recorded (the next wait follows the rest)."""
    run = Run(open_held(out), default_store(), retry_failed=False, warn=warn)
    if timeout is not None:
        run.deadline = time.monotonic() + timeout
    try:
        run.collect_existing()
        followed = follow(run, display, warn)
    finally:
        run.close()
    if run.timed_out:
        raise TimeoutError(f"batch {run.bdir.batch_id}: {run.timed_out} job(s) not ended after {timeout:g}s (they go "
                           "on; wait() again follows them)")
    return followed


def follow(run: Run, display: Display | None, warn: Callable[[str], None]) -> dict[str, Any]:
    """The run followed to its end, its items kept as they end. A KeyboardInterrupt meanwhile cancels the jobs
    it waits for (queued ones end now, running ones through their workers: not waited for), writes batch.jsonl and
    summary.json as far as they got, and propagates; another exception leaves the jobs to go on, as a `pid batch`
    that dies does. Either way the same call resumes the batch."""
    items = Items(display)
    try:
        summary = run.follow(items)
    except KeyboardInterrupt:
        _cancel_after_interrupt(run, warn)
        raise
    return {"items": items.rows, "summary": summary}


def _cancel_after_interrupt(run: Run, warn: Callable[[str], None]) -> None:
    try:
        run.cancel_tracked()
        run.summary()
    except Exception as exc:   # (the interrupt is what the caller hears of)
        warn(f"pid: after the interrupt: {type(exc).__name__}: {exc}")


def default_store() -> Any:
    from pid.jobs.store import default_store as store
    return store()


def open_held(path: str) -> BatchDir:
    """An existing batch's output directory, held for this run to follow (hold()): PidError if another run follows
    it, or it is no batch's (Run.close() lets it go)."""
    open_dir(path)   # (no batch there: say so, and make nothing)
    lock = hold(path)
    try:
        bdir = open_dir(path)
    except BaseException:
        release(lock)
        raise
    bdir.lock = lock
    return bdir


def open_dir(path: str) -> BatchDir:
    """An existing batch's output directory; PidError if it is none."""
    try:
        return BatchDir.open(path)
    except ValueError as exc:
        raise PidError(str(exc)) from None


def item_digests(items: list[Item]) -> dict[str, str]:
    """Each item's definition (its task, repository and fields; not its line's number) by a digest: batch.json keeps
    them, so that a rerun can tell a line edited or removed since its item's job was submitted."""
    return {item.id: hashlib.sha256(json.dumps([item.task, item.repo, item.fields], sort_keys=True, default=str)
                                    .encode("utf-8", "surrogatepass")).hexdigest()[:32] for item in items}


def _same_batch(bdir: BatchDir, tasks: str, digests: dict[str, str], options: dict[str, Any],
                retry_failed: bool) -> None:
    """A rerun resumes its batch: another tasks file, other options, or another line for an item whose job stands
    (ended and not to run again, or still queued or running) would be merged into it. Refused (exit 2)."""
    again = (f"resume it with the command that started it (pid batch {shlex.quote(str(bdir.meta.get('tasks')))} "
             f"--out {shlex.quote(bdir.path)} and the same options), or give this run another --out directory")
    if other_tasks(bdir.meta, tasks, list(digests)):
        raise PidError(f"--out {bdir.path} holds batch {bdir.batch_id} of another tasks file "
                       f"({one_line(str(bdir.meta.get('tasks')))}): {again}")
    changed = changed_options(bdir.meta, options)
    if changed:
        from pid.cli.options import JOB_OPTIONS
        # (an option read from the environment too is named with its variable: the command line may be the same)
        flags = {option.name: option.flag + (f" (or ${option.envvar})" if option.envvar else "")
                 for option in JOB_OPTIONS}
        before, now = bdir.meta.get("options") or {}, kept_options(options)
        named = "; ".join(f"{flags.get(name, '--' + name.replace('_', '-'))} was {_shown(before.get(name))}, "
                          f"now {_shown(now.get(name))}" for name in changed)
        raise PidError(f"--out {bdir.path} holds batch {bdir.batch_id}, started with other options ({named}): "
                       f"{again}")
    foreign = _foreign_rows(bdir)
    if foreign:
        said = ", ".join(one_line(i) for i in foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5
                                                              else "")
        raise PidError(f"--out {bdir.path}: its results name jobs this job store never had, though it would keep them "
                       f"still ({said}): a batch directory from elsewhere (a repository can carry one) is not resumed; "
                       "give this run another --out directory (or resume with the job store the batch ran on)")
    recorded = bdir.meta.get("items")   # (none in a batch.json from before they were kept)
    if isinstance(recorded, dict):
        changed = [i for i in bdir.order if bdir.ledger.get(i) and i in recorded and digests.get(i) != recorded[i]
                   and (i not in digests or _stands(bdir, i, retry_failed))]
        if changed:
            said = ", ".join(f"{one_line(i)} ({'removed' if i not in digests else 'edited'})" for i in changed[:5])
            more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
            raise PidError(f"--out {bdir.path} holds batch {bdir.batch_id}, whose tasks file changed for items "
                           f"whose jobs stand (their lines, or files the lines name): {said}{more}: put their lines "
                           "back as they were, or give this run another --out directory (added lines are fine, and "
                           "so is a new line for an item to run again: cancelled, or failed with --retry-failed)")


def _foreign_rows(bdir: BatchDir) -> list[str]:
    """Items whose ended row names a job the job store does not have, though its retention would keep it still: a
    rerun would take such a row as the item's result (a forged `completed` with a passed check, and exit 0)."""
    from pid.jobs.store import default_store, retention_s
    store, now, keep = default_store(), time.time(), retention_s()
    foreign = []
    for item_id, row in bdir.rows.items():
        job_id = str(row.get("job_id") or "")
        made = job_id_time(job_id)
        if made is None or (now - made < keep and store.get(job_id) is None):
            foreign.append(item_id)
    return foreign


def _stands(bdir: BatchDir, item_id: str, retry_failed: bool) -> bool:
    """Whether the item's current job stands: this run would wait for it or skip it (batch_run.next_step, as
    Run.start decides), or it ended unwatched (a Ctrl-C while submitting, a `pid cancel`, a SIGTERM) in a way that
    does not run it again."""
    from pid.jobs.store import default_store
    job_id = bdir.current_job(item_id)
    record = default_store().get(job_id) if job_id else None
    step = next_step(bdir, item_id, record, retry_failed)
    if step != "record" or record is None:
        return step != "submit"
    return record.status != "cancelled" and not (retry_failed and record.status != "completed")


def _shown(value: Any) -> str:
    """An option's value in a message: as JSON, on one line, cut short (a long text is kept by its digest)."""
    if value is None:
        return "not given"
    text = one_line(json.dumps(value, ensure_ascii=False))
    return text if len(text) <= 60 else text[:59] + "…"


# A tasks file is read a line at a time, each line bounded: a task is at most 1 MiB (jobs/spec.py), and its line is
# JSON, where an escaped character takes up to six bytes. The file as a whole is bounded too (its items are held):
# /dev/zero or an endless stdin given as one is refused, not read into memory without end.
TASKS_LINE_MAX = 8 << 20
TASKS_FILE_MAX = 512 << 20


def read_items(tasks: str, allow_outside: bool) -> tuple[list[Item], list[str]]:
    """Every line read and parsed, its paths relative to the tasks file's directory (batch_tasks.local_path); the
    bad ones are reported with the others build_specs finds."""
    from pid.cli.batch_tasks import parse
    base = None if tasks == "-" else os.path.dirname(os.path.abspath(os.path.expanduser(tasks)))
    too_long: list[int] = []
    try:
        if tasks == "-":   # (a stdin replaced by a text stream, as in a notebook, has no bytes underneath)
            stdin = sys.stdin
            parsed = parse(_lines(stdin.buffer if hasattr(stdin, "buffer") else _Encoded(stdin), tasks, too_long),
                           base, allow_outside)
        else:
            with open(os.path.expanduser(tasks), "rb") as f:
                parsed = parse(_lines(f, tasks, too_long), base, allow_outside)
    except OSError as exc:
        raise PidError(f"cannot read {tasks}: {exc.strerror or exc}") from None
    errors = parsed.errors + [f"line {n}: longer than {_mib(TASKS_LINE_MAX)} (a task is at most 1 MiB)"
                              for n in too_long]
    if not parsed.items and not errors:
        raise PidError(f"{tasks}: no tasks")
    return parsed.items, errors


def _lines(stream: Any, tasks: str, too_long: list[int]) -> Iterator[str]:
    """The tasks file's lines, decoded, one at a time as they are parsed (none is held longer): a line over
    TASKS_LINE_MAX is read past and given blank, its number put in `too_long`. PidError for a file over
    TASKS_FILE_MAX or a line that is not UTF-8."""
    total = number = 0
    while True:
        raw = stream.readline(TASKS_LINE_MAX + 1)
        if not raw:
            return
        number += 1
        total += len(raw)
        if len(raw) > TASKS_LINE_MAX and not raw.endswith(b"\n"):   # the rest is read past, a bounded piece at a time
            while raw and not raw.endswith(b"\n") and total <= TASKS_FILE_MAX:
                raw = stream.readline(TASKS_LINE_MAX)
                total += len(raw)
            too_long.append(number)
            raw = b""
        if total > TASKS_FILE_MAX:
            raise PidError(f"cannot read {tasks}: larger than {_mib(TASKS_FILE_MAX)}: split it into several "
                           "batches")
        if number == 1:
            raw = raw.removeprefix(b"\xef\xbb\xbf")   # a byte order mark (some editors write one) is not part of line 1
        try:
            yield raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as exc:
            raise PidError(f"cannot read {tasks}: line {number}: not UTF-8 (byte {raw[exc.start]:#04x}: "
                           f"{exc.reason})") from None


def _mib(size: int) -> str:
    return f"{size / (1 << 20):g} MiB"


class _Encoded:
    """A text stream read as UTF-8 bytes, a line at a time (for a stdin with no bytes underneath)."""

    def __init__(self, text: Any) -> None:
        self.text = text

    def readline(self, limit: int) -> bytes:
        return self.text.readline(limit).encode("utf-8", "surrogatepass")


def _refuse(errors: list[str], tasks: str) -> None:
    if not errors:
        return
    errors.sort(key=lambda e: int(e.split(":", 1)[0].split()[-1]) if e.startswith("line ") else 0)
    raise BadTasks(tasks, errors)


def build_specs(items: list[Item], options: dict[str, Any], *, repo: str | None, queue: str, no_images: bool,
                api_key: str | None, jobs_dir: str, max_workspace: int, need_prices: bool,
                tasks: str = "TASKS", errors: list[str] | None = None,
                key_endpoint: str | None = None, warn: Callable[[str], None] = ignore) -> dict[str, JobSpec]:
    """Each item's JobSpec: the command line's options, then its line's fields; checked as `pid submit` checks
    one (repos, model, prices, key), every directory repo packed once. Any problem: all of them, exit 2. The key
    goes with the items whose endpoint is `key_endpoint` (the command line's) only: a line naming another endpoint
    runs without it (pid.config.endpoint)."""
    from pid.jobs.submission import check_api_key, check_originals, check_repo, check_together, warn_missing_originals
    from pid.config import base_url_for, endpoint
    from pid.jobs.spec import command_problem
    errors = list(errors or [])
    specs: dict[str, JobSpec] = {}
    repos: dict[str, str | BaseException] = {}
    table: dict[str, dict[str, float]] = {}   # model -> the model table's prices of it (asked once per model)
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
            check_together(fields)
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
        warn_missing_originals(spec, lambda text: warn(f"pid: warning: {where}: {text}"))
    try:   # (with the other lines' errors, before packing: every bad line is told at once)
        errors += _missing_images(items, specs)
    except PidError:   # the engine cannot be asked: the lines' own errors are told first, if any
        if not errors:
            raise
    _refuse(errors, tasks)
    errors += _pack(items, specs, max_workspace)
    errors += _policy_refusals(items, specs)
    _refuse(errors, tasks)
    if any(s.network != "none" for s in specs.values()):
        warn("pid: warning: some items use --network bridge: their sandboxes can reach the network and are "
             "reachable from it")
    _check_engine(specs)
    return specs


def _price_problem(model: str, fields: dict[str, Any], need_prices: bool,
                   table: dict[str, dict[str, float]]) -> str | None:
    """Why an item's cost could not be bounded (its max_cost, or the batch's --max-total-cost), or None. Prices are
    accepted as `pid submit` accepts them: given (on the command line or the line), else the model table's (asked
    once per model: `table`), which then go into `fields`: the job carries them, as a submitted one does (the
    worker's own table may lack the model)."""
    tabled = _table_prices(model, table)   # (read for every model: a models file that is missing or bad refuses the
    priced = any(fields.get(p) for p in PRICES)   # batch here, as it refuses `pid submit`)
    if not priced and (need_prices or fields.get("max_cost") is not None):
        fields.update(tabled)
        priced = any(fields.get(p) for p in PRICES)
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
    beats = live_workers(default_store())
    refusals = ((item, refusal_by_workers(beats, specs[item.id])) for item in items if item.id in specs)
    return [f"line {item.line}: {refusal}" for item, refusal in refusals if refusal]


def _table_prices(model: str, seen: dict[str, dict[str, float]]) -> dict[str, float]:
    from pid.jobs.submission import table_prices
    if model not in seen:
        seen[model] = table_prices(model)
    return seen[model]


def _pack(items: list[Item], specs: dict[str, JobSpec], max_bytes: int) -> list[str]:
    """Each directory repo packed and stored once (the same tree, whatever the number of items on it)."""
    from pid.config import pid_home
    from pid.sandbox.workspace import WorkspaceTooLarge, pack_error
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
                failed[spec.repo] = f"cannot pack repo {spec.repo}: {pack_error(exc)}"
        if spec.repo in failed:
            errors.append(f"line {item.line}: {failed[spec.repo]}")
        else:
            spec.workspace = packed[spec.repo]
    return errors


def _missing_images(items: list[Item], specs: dict[str, JobSpec]) -> list[str]:
    """With the embedded queue the worker is on this machine: each line whose image is not in its engine, said as
    `line N: …` (an engine that cannot be reached is the command's error, said once)."""
    from pid.jobs.brokers import embedded_broker
    if not embedded_broker():
        return []
    from pid.jobs.submission import image_missing
    missing = {image: why for image in sorted({s.image for s in specs.values()}) if (why := image_missing(image))}
    return [f"line {item.line}: {missing[specs[item.id].image]}" for item in items
            if item.id in specs and specs[item.id].image in missing]


def _check_engine(specs: dict[str, JobSpec]) -> None:
    from pid.jobs.brokers import embedded_broker
    if not embedded_broker():
        return
    from pid.jobs.submission import check_cpus, check_runtime
    for runtime, network in sorted({(s.runtime, s.network) for s in specs.values() if s.runtime}):
        check_runtime(runtime, network)
    item, most = max(specs.items(), key=lambda pair: pair[1].cpus, default=(None, None))
    if most is not None:
        try:
            check_cpus(most)
        except PidError as exc:
            raise PidError(f"item {item}: {exc}; nothing was submitted") from None


class LocalWorkers:
    """`--workers N`: a `pid worker --concurrency N` child for the life of the command, on the batch's queues, in
    its own session (a Ctrl-C at the terminal is the batch's to handle); its log in DIR/.worker.log."""

    def __init__(self, proc: subprocess.Popen[bytes], log_path: str) -> None:
        self.proc, self.log_path = proc, log_path

    @classmethod
    def start(cls, n: int, queues: list[str], out: str) -> "LocalWorkers":
        log_path = os.path.join(out, ".worker.log")
        make_marked(out)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "pid.cli.main", "worker", "--concurrency", str(n),
                                     "--queue", ",".join(queues)], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=_die_with_parent())
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


def _die_with_parent() -> Callable[[], None] | None:
    """For the local worker's child, before exec: SIGTERM when the batch's process dies, however it dies (Linux), so
    a killed `pid batch` leaves no worker behind (SIGTERM hands its running jobs back to the queue). prctl is found
    here, in the parent: the child, forked from a process that may run threads (pid.batch in a thread), only calls
    it (an import or a dlopen there could wait forever on a lock another thread held at the fork)."""
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    death_signal = int(signal.SIGTERM)

    def set_death_signal() -> None:
        prctl(1, death_signal)   # PR_SET_PDEATHSIG
    return set_death_signal
