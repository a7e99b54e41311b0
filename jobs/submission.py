"""A job from its options to the queue (or to a foreground run): every check made once, for the `pid` command and
the Python API alike (pid/api.py). A refusal is a PidError whose message is the one line `pid` prints for it, and
nothing has started or been recorded when it is raised."""
from __future__ import annotations

import errno
import json
import os
import re
import tempfile
import time
from typing import Any, Callable
from urllib.parse import urlsplit

from pid.config import API_KEY_ENV, KEYED_HOSTS, base_url_for, bound_key, endpoint, key_endpoint, pid_home
from pid.errors import PidError
from pid.terminal import escaped
from pid.jobs.spec import PRICES, JobSpec, command_problem, message_problem
from pid.sandbox.config import SandboxConfig, container_path
from pid.sandbox.disk import format_size

SCP_LIKE = re.compile(r"([\w.-]+@[\w.-]+):(?!//)(\S+)")   # user@host:path
RESULT_GRACE_S = 10.0   # an ended job's result.json may follow its end by this much (a sweep, a cancel write it then)


def build_spec(options: dict[str, Any], no_images: bool, warn: Callable[[str], None]) -> JobSpec:
    """The job the options (the `run`/`submit` options, as parsed) describe, every value checked. `warn` gets what
    is allowed but worth saying (a sandbox on the network)."""
    task, repo, model = options.pop("task"), options.pop("repo"), options.pop("model")
    if (problem := message_problem("the task", task)) is not None:
        raise PidError(problem)
    repo_path = check_repo(repo) if repo else None
    if repo_path is None and not options.get("workdir"):
        raise PidError("no workspace: pass --repo DIR|URL, or --workdir PATH to work in the image's own directory")
    check_together(options)
    options["check_original"] = check_originals(options.get("check_original") or (), options.get("check"),
                                                options.get("workdir"))
    if not model:
        raise PidError("no model configured: pass --model or set PID_MODEL")
    problem = command_problem(options.get("check"))
    if problem:
        raise PidError(f"--check: {problem}")
    priced = table_prices(model)   # (the models file read now, as the job will read it: a bad one refuses here)
    if options["max_cost"] is not None and not any(options[p] for p in PRICES):
        if not priced:
            raise PidError("--max-cost needs the model's prices: pass --input-price and/or --output-price (or "
                           "describe the model in models.json)")
        options.update(priced)   # the job carries the prices its cap was accepted on: the worker's table may lack them
    out_dir = check_out_dir(options.pop("out_dir"))
    spec = JobSpec(task=task, repo=repo_path, model=model, out_dir=out_dir, images=not no_images,
                   **{**options, "files": list(options["files"]), "runtime": options["runtime"] or None})
    spec.base_url = base_url_for(spec.api, spec.base_url)   # the spec records the endpoint the job really uses
    if spec.network != "none":
        warn(f"--network {spec.network}: the sandbox can reach the network and is reachable from it")
    warn_missing_originals(spec, warn)
    return spec


def warn_missing_originals(spec: JobSpec, warn: Callable[[str], None]) -> None:
    """Each --check-original path a directory repo does not have, said before the job runs: the check would see it
    absent, and a misspelt path protects nothing (a new-user test: under --json the only word of it was in
    result.json, after the gate had passed). A git URL's or an image's workspace is the worker's to look at: the
    check's result says it then (`original_missing`)."""
    if not spec.repo or not os.path.isdir(spec.repo):
        return
    for path in spec.check_original:
        if not os.path.lexists(os.path.join(spec.repo, path)):
            warn(f"--check-original {path}: {spec.repo} has no such path, so the check will see none there (right "
                 "for a file the patch adds; else a misspelt path, which protects nothing)")


def prepare_run(options: dict[str, Any], *, api_key: str | None, no_images: bool, max_workspace: int,
                warn: Callable[[str], None]) -> JobSpec:
    """A foreground job's spec (`pid run`, pid.run), checked as far as can be before its sandbox starts."""
    spec = build_spec(options, no_images, warn)
    spec.max_workspace = max_workspace
    check_api_key(spec, api_key, warn)
    check_workspace_size(spec, max_workspace)
    check_cpus(spec)
    check_runtime(spec.runtime, spec.network)
    return spec


def submit(options: dict[str, Any], *, api_key: str | None, no_images: bool, max_workspace: int, queue: str,
           warn: Callable[[str], None]) -> JobSpec:
    """Check, pack, record and publish one job (`pid submit`, pid.submit); returns its spec once it is queued."""
    check_broker()
    spec = build_spec(options, no_images, warn)
    spec.queue = queue
    spec.max_workspace = max_workspace
    warn_unsent_key(spec, api_key, warn)   # (no key may be right: the worker's own may be for this endpoint)
    from pid.jobs.brokers import embedded_broker
    from pid.jobs.store import default_store
    if embedded_broker():  # the worker is on this machine: its image and CPUs must be here too
        check_cpus(spec)
        check_runtime(spec.runtime, spec.network)
        check_image(spec.image)
    pack_workspace(spec, max_workspace)
    enqueue(default_store(), spec, api_key)
    return spec


def enqueue(store: Any, spec: JobSpec, api_key: str | None) -> None:
    """Record the job, keep its key, publish it (submit, continue, retry)."""
    api_key = bound_key(api_key, spec.api, spec.base_url)
    from pid.jobs.dispatch import dispatch
    check_policies(store, spec)
    store.create(spec)
    try:
        # The key goes into the store for the life of the job, never into the broker's message: any worker that
        # runs the job (again) reads it there.
        if api_key and not store.set_secret(spec.id, api_key):
            raise RuntimeError("the job store did not keep its API key")
        dispatch(spec.id, store=store)
    except Exception as exc:  # the broker refused: the job must not sit queued forever
        store.finish_if_queued(spec.id, "dispatch_failed", error=str(exc))   # (not one a worker took meanwhile)
        from pid.jobs.reach import unreachable_broker
        raise PidError(unreachable_broker(exc, spec.id)) from None


def table_prices(model: str) -> dict[str, float]:
    """The model table's (pid/models.py) prices of this model, by the spec's names; empty when it has no input or
    output price."""
    from pid.models import ModelsFileError, model_info
    try:
        info = model_info(model)
    except ModelsFileError as exc:
        raise PidError(str(exc)) from None
    if not (info.input_price or info.output_price):
        return {}
    return {name: getattr(info, name) for name in PRICES if getattr(info, name)}


def check_together(options: dict[str, Any]) -> None:
    """What options may not be together, or empty, beyond each one's own check (a command's or a tasks-file line's)."""
    if options.get("workdir") and options.get("disk") == 0:   # (the image's trees are made writable on that disk)
        raise PidError("--workdir needs the job's own disk: pass a --disk size other than 0")
    if any(not str(path).strip() for path in options.get("files") or ()):   # ("" named the whole workdir)
        raise PidError("--file: an empty path (name a file or directory of the container)")
    workdir = options.get("workdir") or SandboxConfig.workdir
    for path in options.get("files") or ():   # (collection refuses it too, but only after the job ran)
        if container_path(str(path), workdir) == "/":
            raise PidError(f"--file {escaped(str(path))}: the whole filesystem: name the directories to collect")


def check_originals(paths: Any, check: str | None, workdir: str | None) -> list[str]:
    """--check-original as the spec keeps it: workdir-relative paths, only beside a --check."""
    if not paths:
        return []
    if not check:
        raise PidError("--check-original needs --check (it says what the check sees as the original has it)")
    from pid.jobs.spec import original_paths
    from pid.sandbox.config import SandboxConfig
    try:
        return original_paths(list(paths), workdir or SandboxConfig.workdir)
    except ValueError as exc:
        raise PidError(str(exc)) from None


def check_repo(repo: str) -> str:
    """--repo as the spec keeps it: a git URL (checked, kept as given) or an existing directory (absolute)."""
    from pid.jobs.snapshot import git_source
    try:
        if git_source(repo) is not None:
            return repo
    except ValueError as exc:
        raise PidError(f"--repo: {exc}") from None
    repo_path = os.path.abspath(os.path.expanduser(repo))
    if not os.path.exists(repo_path):
        scp = SCP_LIKE.fullmatch(repo)   # git's short form of an ssh URL, `git@host:org/repo.git`
        raise PidError(f"repo path does not exist: {escaped(repo)}" + (
            f" (pid takes a git URL written in full, such as ssh://{scp[1]}/{scp[2].lstrip('/')})" if scp else ""))
    if not os.path.isdir(repo_path):
        raise PidError(f"repo path is not a directory: {escaped(repo)}")
    return repo_path


def pack_workspace(spec: JobSpec, max_bytes: int) -> None:
    """A directory --repo is packed now and stored as a blob (once per tree): the job runs on the tree as it is at
    submit, on whatever machine takes it. A git URL is cloned by the worker instead."""
    from pid.jobs.snapshot import git_source, pack_and_store
    if not spec.repo or git_source(spec.repo) is not None:
        return
    from pid.sandbox.workspace import WorkspaceTooLarge, pack_error
    from pid.jobs.blobs import default_blobs
    try:
        spec.workspace = pack_and_store(spec.repo, default_blobs(), max_bytes, tmp_dir=pid_home()).digest
    except WorkspaceTooLarge:
        raise PidError(f"--repo {spec.repo} is larger than --max-workspace {format_size(max_bytes)} once packed; "
                       "nothing was queued (raise --max-workspace or PID_MAX_WORKSPACE, or submit a git URL)"
                       ) from None
    except OSError as exc:
        raise PidError(f"cannot pack --repo {spec.repo}: {pack_error(exc)}") from None


def check_workspace_size(spec: JobSpec, max_bytes: int) -> None:
    """A directory --repo larger than --max-workspace once packed is refused before anything is written (its size
    from lstat: a sparse file of terabytes used to become as large a file on the host before the job failed)."""
    from pid.jobs.snapshot import git_source
    if not spec.repo or git_source(spec.repo) is not None or max_bytes <= 0:
        return
    from pid.sandbox.workspace import tree_size
    if tree_size(spec.repo, max_bytes) > max_bytes:
        raise PidError(f"--repo {spec.repo} is larger than --max-workspace {format_size(max_bytes)} once packed; "
                       "nothing ran (raise --max-workspace or PID_MAX_WORKSPACE)")


def check_out_dir(out: str) -> str:
    """OUT must be a directory pid can write in, or one it can create (its parent exists and is writable)."""
    path = os.path.abspath(os.path.expanduser(out))
    if os.path.islink(path):   # (a repository's own `pid-runs` link sent a job's output, files and all, elsewhere)
        raise PidError(f"--out {escaped(out)}: a symbolic link (to {escaped(os.readlink(path))}): pid writes no output "
                       "through one, as a repository may have put it there; name the directory itself")
    if os.path.exists(path) and not os.path.isdir(path):
        raise PidError(f"--out {out}: not a directory")
    where = path if os.path.isdir(path) else os.path.dirname(path)
    if not os.path.isdir(where):
        raise PidError(f"--out {out}: its parent directory {where} does not exist")
    try:  # a real write: permission bits say nothing for root or a read-only filesystem
        fd, probe = tempfile.mkstemp(prefix=".pid-write-check-", dir=where)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:   # (/proc and /sys answer "No such file" to a new file in a directory they have)
        why = "it takes no new files" if exc.errno == errno.ENOENT else exc.strerror or str(exc)
        raise PidError(f"--out {out}: cannot write in {where} ({why})") from None
    return path


def check_api_key(spec: JobSpec, key: str | None, warn: Callable[[str], None] | None = None) -> None:
    """The vendors' endpoints need a key (the same rule as the providers'); an endpoint of one's own may not. A key
    from the environment that is for another endpoint is not this job's (warn_unsent_key)."""
    keyed = bound_key(key, spec.api, spec.base_url)
    if warn is not None:
        warn_unsent_key(spec, key, warn)
    host = urlsplit(spec.base_url or "").hostname
    if keyed or host not in KEYED_HOSTS:
        return
    elsewhere = f" (the key in the environment is for {key_endpoint(key, spec.api, spec.base_url)} only)" \
        if key else ""
    raise PidError(f"no API key: {host} needs one; pass --api-key or set {' or '.join(API_KEY_ENV)}, or point "
                   f"--base-url at an endpoint of your own{elsewhere}")


def warn_unsent_key(spec: JobSpec, key: str | None, warn: Callable[[str], None]) -> None:
    """Say so when a key from the environment will not go with this job: it goes only to the environment's endpoint
    (PID_BASE_URL, else the API's own; pid.config.key_endpoint), never to another a command line names."""
    if key and bound_key(key, spec.api, spec.base_url) is None:
        warn(f"the API key in the environment is for {key_endpoint(key, spec.api, spec.base_url)}, not this job's "
             f"{endpoint(spec.api, spec.base_url)}: not sent (pass --api-key, or set PID_BASE_URL, to send it there)")


def check_policies(store: Any, spec: JobSpec) -> None:
    """Refuse at once a job that no live worker of its queue would admit (their policies come with their
    heartbeats), with the message a worker would give."""
    from pid.jobs.workers import live_workers
    from pid.jobs.policy import refusal_by_workers
    refusal = refusal_by_workers(live_workers(store), spec)
    if refusal:
        raise PidError(f"{refusal}; nothing was queued")


def check_broker() -> None:
    """A PID_BROKER_URL no transport serves is refused before anything is recorded."""
    from pid.jobs.brokers import broker_problem
    problem = broker_problem()
    if problem:
        raise PidError(problem)


def check_cpus(spec: JobSpec) -> None:
    """More CPUs than the engine has is refused before a container is asked for (the engine would refuse it with a
    400). Only a count above one is worth asking about; an engine that does not answer is left to say so itself."""
    if spec.cpus <= 1:
        return
    from pid.sandbox.engine_probe import engine_cpus
    have = engine_cpus()
    if have is not None and spec.cpus > have:
        raise PidError(f"--cpus {spec.cpus:g}: the Docker engine has only {have} CPU{'s' if have != 1 else ''}")


def check_runtime(runtime: str | None, network: str = "none") -> None:
    """A --runtime the engine does not offer is refused before a container is asked for (the engine would fail the
    job at its start), and so is a network the engine's arguments to that runtime take away (gVisor set up with
    `--network=none`, as docs/gvisor.md suggests: the sandbox would have none, while pid said it could reach out)."""
    if not runtime:
        return
    from pid.sandbox.engine_probe import engine_runtimes
    have = engine_runtimes()
    if have is None:
        return
    if runtime not in have:
        raise PidError(f"--runtime {runtime}: the Docker engine has no such runtime (it has {', '.join(sorted(have))})")
    if network != "none" and "--network=none" in have[runtime]:
        raise PidError(f"--network {network} with --runtime {runtime}: the Docker engine runs {runtime} with "
                       "--network=none (its runtimeArgs), so the sandbox would have no network; keep --network none, "
                       f"or give the engine a {runtime} runtime without that argument (docs/gvisor.md)")


def check_image(image: str) -> None:
    problem = image_missing(image)
    if problem:
        raise PidError(problem)


def image_missing(image: str) -> str | None:
    """Why `image` is not in the engine (pid never pulls), or None when it is; PidError when the engine is gone."""
    from pid.sandbox.engine_probe import image_present
    if image_present(image):   # (the engine's socket, without loading the Docker SDK)
        return None
    from pid.sandbox import DockerUnavailable, ImageNotFound, ensure_image
    try:
        ensure_image(image)
    except ImageNotFound as exc:
        return str(exc)
    except DockerUnavailable as exc:
        raise PidError(str(exc)) from None
    return None


def job_record(store: Any, job_id: str) -> Any:
    """The job's record, or a PidError: no such job."""
    record = store.get(job_id)
    if record is None:
        raise PidError(f"no such job: {escaped(job_id)}")   # (a name from anyone: one line, nothing raw)
    return record


def post(store: Any, job_id: str, kind: str, message: str) -> None:
    """A steer or follow-up message for a job (`pid steer`, Job.steer)."""
    if not isinstance(message, str):
        raise PidError(f"the {kind.replace('_', '-')} message must be text, not {type(message).__name__}")
    if (problem := message_problem(f"the {kind.replace('_', '-')} message", message)) is not None:
        raise PidError(problem)
    record = job_record(store, job_id)
    if record.cancel_requested:   # (it would never be read: the job stops at its next step)
        raise PidError(f"job {job_id} is {'cancelled' if record.terminal else 'being cancelled'}: it takes no more "
                       "messages")
    _refuse_once_agent_ended(record, "it takes no more messages")   # (a new user's: "queued", then never delivered)
    if not store.post(job_id, kind, message):
        raise PidError(f"job {job_id} is {record.status}: it takes no more messages")


def _refuse_once_agent_ended(record: Any, what: str) -> None:
    """A job whose agent has ended (its check or its artifacts under way) reads no message and holds at no model
    call: a PidError saying so and `what`, rather than a message queued for no one."""
    from pid.jobs.store import AGENT_ENDED
    if not record.terminal and record.activity in AGENT_ENDED:
        raise PidError(f"job {record.id}'s agent has ended (now: {record.activity}): {what}")


def set_paused(store: Any, job_id: str, paused: bool) -> bool:
    """Hold a job before its next model call, or let it go on (`pid pause`/`pid resume`, Job.pause/resume).
    False: it was paused already (a pause asked twice is no error; a resume of a job not paused is one, as saying
    "resumed" would claim what did not happen)."""
    record = job_record(store, job_id)
    if not paused and not record.held and not record.terminal:
        raise PidError(f"job {job_id} is {record.status}, not paused: nothing to resume")
    if paused:
        _refuse_once_agent_ended(record, "nothing to pause")   # (it said nothing, and held nothing)
    if not store.set_paused(job_id, paused):
        raise PidError(f"job {job_id} is {store.get(job_id).status}: nothing to {'pause' if paused else 'resume'}")
    return not (paused and record.held)


def load_result(store: Any, job_id: str) -> dict[str, Any]:
    """An ended job's result.json from the job store, wherever the worker ran; for a job recorded before results
    went there, from its local out directory. Neither: a PidError."""
    from pid.jobs.artifact_store import DownloadError, read_result
    record = store.get(job_id)
    path = os.path.join(record.spec.job_dir, "result.json")
    ended = record.finished_at if record.finished_at is not None else store.now()
    deadline = time.monotonic() + max(0.0, RESULT_GRACE_S - (store.now() - ended))
    while True:
        try:
            result = read_result(store, job_id)
        except DownloadError as exc:
            raise PidError(str(exc)) from None
        if result is None:
            result = local_result(path, job_id)
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            raise PidError(f"job {job_id} ({record.status}): its result.json is neither in the job store (expired "
                           f"after the retention period?) nor at {path}")
        time.sleep(0.2)


def local_result(path: str, job_id: str) -> dict[str, Any] | None:
    """The result.json at `path`, if it is job `job_id`'s."""
    try:
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) and result.get("id") == job_id else None


def cancel(store: Any, job_id: str) -> str:
    """Cancel a queued or running job (`pid cancel`, Job.cancel); returns "running" (its process stops it and keeps
    the artifacts so far) or "cancelled" (it ended here and now)."""
    record = job_record(store, job_id)
    if record.terminal:
        raise PidError(f"job {job_id} has ended ({record.status}): nothing to cancel")
    from pid.jobs.sweep import cancel_job
    status = cancel_job(store, job_id)
    if status not in ("running", "cancelled"):
        raise PidError(f"job {job_id} has ended ({status}): nothing to cancel")
    return status


def start_foreground(spec: JobSpec, before: Callable[[], None] = lambda: None) -> tuple[Any, Any]:
    """A foreground job's start (`pid run`, pid.run): its container starts while the agent's code loads, and the job
    enters the store (list, status, steer, pause, cancel reach it). Returns (starting sandbox, ForegroundJob); on any
    failure nothing stays behind. `before` runs once the container is on its way (the CLI's housekeeping)."""
    from pid.worker.sandbox_start import abandon, start_sandbox
    starting = start_sandbox(spec)
    try:
        check_image(spec.image)
        before()
        from pid.worker.control import ForegroundJob
        from pid.worker.runner import run_job  # noqa: F401 - the agent's code loads while the container starts, before
        return starting, ForegroundJob.start(spec)   # the job is in the store (a Ctrl-C then stops it before it runs)
    except BaseException:
        abandon(starting)
        raise


def run_foreground(spec: JobSpec, job: Any, starting: Any, *, api_key: str | None, sink: Callable[[Any], None],
                   on_agent: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Run a started foreground job to its end and record that end (whatever stops it); returns result.json's
    data. `sink` sees the agent's events; `on_agent` the agent, once it exists (after the job's own attach)."""
    from pid.worker.runner import run_job

    def attach(agent: Any) -> None:
        job.attach(agent)
        if on_agent is not None:
            on_agent(agent)
    result = None
    failure: str | None = None
    try:
        result = run_job(spec, api_key=bound_key(api_key, spec.api, spec.base_url), sink=job.sink(sink),
                         on_agent=attach, check_in=job.check_in, cancel=job.cancel, starting=starting, keep=job.store)
        return result
    except KeyboardInterrupt:   # (pid.run's caller's Ctrl-C: run_job wrote result.json so, `interrupted`)
        raise
    except BaseException as exc:   # not the job's own failure (run_job records those)
        failure = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        job.end(result, failure)
