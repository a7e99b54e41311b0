"""A job's first phase: everything the agent needs before its first model call.

    the model and its provider -> the sandbox (the early one, or a new one) -> the workspace in it (and a continued
    job's patch) -> the session -> the agent

Whatever it opens is recorded on the JobRun as it is opened, so that what follows closes it whatever happens.
Raises JobCancelled for a cancel that arrives before the agent starts; any other failure is the job's (the runner
makes it the ending).
"""
from __future__ import annotations

import os
from typing import Callable

from pid import events as ev
from pid.agent import Agent, Limits
from pid.compaction import Compactor
from pid.endings import ExitReason
from pid.messages import Message
from pid.models import ModelInfo, model_info, silent_truncation_warning, unknown_model_warning
from pid.prompt import build_system_prompt
from pid.providers import make_provider
from pid.providers.base import Provider, ProviderConfig
from pid.session import SessionWriter
from pid.tools.base import ToolContext
from pid.tools.registry import ToolRegistry, default_registry
from pid.jobs.artifact_store import TranscriptSync
from pid.jobs.blobs import Blobs, StoreBlobs
from pid.jobs.continuation import Parent, apply_patch, load_parent, start_session
from pid.worker.job_run import JobRun
from pid.jobs.spec import JobSpec
from pid.worker.sandbox_start import GRACE_S, sandbox_config
from pid.jobs.snapshot import DirSnapshot, import_into, is_directory_repo, open_packed
from pid.jobs.store import Store, default_store, sum_usage

Gate = Callable[[], "tuple[ExitReason, str] | None"]   # asked before every model call (pid/agent.py Limits.gate)
CheckIn = Callable[[], None]   # asked before every model call and as the agent would stop (pid/agent.py Agent)


class JobCancelled(Exception):
    """Cancel arrived before the agent started."""


def prepare(job: JobRun, *, api_key: str | None, keep: Store | None, artifact_store: Store | None,
            gate: Gate | None, check_in: CheckIn | None = None) -> Agent:
    """The job's agent, ready to run in its sandbox on its workspace."""
    spec = job.spec
    model = job_model(spec)
    provider = job.provider = job_provider(spec, model, api_key)
    tools = default_registry()
    if spec.tools:
        tools = tools.subset(spec.tools)
    take_sandbox(job)
    import_workspace(job, keep)
    parent: Parent | None = None
    earlier: list[tuple[str | None, Message]] = []
    if spec.parent:   # `pid continue`: the parent's patch onto the same snapshot, its conversation loaded
        assert job.sandbox is not None
        parent, earlier = load_parent(artifact_store or default_store(), spec.parent, job.job_dir)
        apply_patch(job.sandbox, parent.patch)
    if job.cancel.is_set():
        raise JobCancelled
    open_session(job, parent, artifact_store, provider)
    agent = job_agent(job, model, provider, tools, gate, check_in)
    # a continued job's conversation so far (already in its session file)
    agent.load_history(earlier, parent.latest_compaction if parent else None)
    return agent


def job_model(spec: JobSpec) -> ModelInfo:
    """The model as this worker knows it, with the job's overrides. A --max-cost needs its prices."""
    model = model_info(spec.model, {"context_window": spec.context_window,
                                    "input_price": spec.input_price or None,
                                    "output_price": spec.output_price or None,
                                    "cache_read_price": spec.cache_read_price or None,
                                    "cache_write_price": spec.cache_write_price or None})
    if spec.max_cost is not None and not (model.input_price or model.output_price or model.cache_read_price
                                          or model.cache_write_price):
        # The client found prices (its own model table); this worker's table has none: the cap could never
        # stop the job, so it does not start.
        raise ValueError(f"--max-cost needs the model's prices, and {spec.model!r} has none where the job runs "
                         "(this worker's model table does not price it): pass --input-price/--output-price")
    return model


def job_provider(spec: JobSpec, model: ModelInfo, api_key: str | None) -> Provider:
    return make_provider(ProviderConfig(model=spec.model, base_url=spec.base_url, api_key=api_key,
                                        api=spec.api, provider=_provider_label(spec),
                                        input_cost_per_mtok=model.input_price,
                                        output_cost_per_mtok=model.output_price,
                                        cache_read_cost_per_mtok=model.cache_read_price,
                                        cache_write_cost_per_mtok=model.cache_write_price,
                                        model_max_tokens=model.max_tokens if model.known else None,
                                        max_tokens=spec.max_tokens,
                                        thinking=spec.thinking,
                                        max_retry_wait_s=spec.max_retry_wait,
                                        retry_budget_s=spec.retry_budget, images=spec.images))


def _provider_label(spec: JobSpec) -> str:
    return "anthropic" if spec.api.startswith("anthropic") else "openai"


def take_sandbox(job: JobRun) -> None:
    """The job's sandbox: the one started early, else a new one (a packed workspace unpacked while it starts); the
    wall clock's watchdog armed on it."""
    spec = job.spec
    if job.starting is not None:
        job.sandbox, job.starting = job.starting.result(), None
    if job.cancel.is_set():
        raise JobCancelled
    if job.sandbox is None:
        if job.attempt > 1:   # an earlier attempt's container, left by a worker that died (a first has none)
            job.sandboxes.clear_job(spec.id)
        if spec.workspace:   # unpacked while the container starts
            job.packed = open_packed(spec.workspace, job.blobs)
        job.sandbox = job.sandboxes.create(sandbox_config(spec, job.attempt), workspace=job.packed)
    job.watchdog.arm(spec.timeout_s - job.elapsed() + GRACE_S, job.sandbox.kill, "wall_clock")


def import_workspace(job: JobRun, keep: Store | None) -> None:
    """The workspace into the sandbox. A directory (`pid run`) is snapshot as the job sees it; with `keep`, the
    snapshot is stored once the model's first reply begins."""
    spec = job.spec
    assert job.sandbox is not None
    if is_directory_repo(spec.repo, spec.workspace):
        assert spec.repo is not None
        job.snapshot = DirSnapshot(spec.repo, spec.max_workspace)
    job.workspace = import_into(job.sandbox, spec.repo, spec.workspace, job.blobs, job.packed, job.snapshot)
    if job.snapshot is not None and keep is not None:
        job.sink = _keeping_once_answered(job.sink, job.snapshot, StoreBlobs(keep))


def _keeping_once_answered(sink: ev.EventSink, snapshot: DirSnapshot, blobs: Blobs) -> ev.EventSink:
    """The sink, which also starts storing the snapshot once the model's first reply begins: during the wait for
    it, nothing competes with the job's start."""
    def events(event: ev.Event) -> None:
        sink(event)
        if isinstance(event, (ev.TextDelta, ev.ModelRetry)) or (isinstance(event, ev.MessageEnd)
                                                                 and event.message.role == "assistant"):
            snapshot.keep(blobs)
    return events


def open_session(job: JobRun, parent: Parent | None, artifact_store: Store | None, provider: Provider) -> None:
    """The job's transcript (session.jsonl, a continued job's starting from its parent's), synced to the store
    while the job runs when there is one."""
    assert job.sandbox is not None
    session = job.session = SessionWriter(_fresh(os.path.join(job.job_dir, "session.jsonl")),
                                          cwd=job.sandbox.workdir,
                                          parent_session=parent.session_path if parent else None)
    if parent:
        start_session(session, parent)
    if artifact_store is not None:
        job.syncing = TranscriptSync(artifact_store, job.spec.id, job.job_dir, job.attempt).start()
    session.model_change(provider.config.provider, job.spec.model)
    session.thinking_level_change(job.spec.thinking)


def _fresh(path: str) -> str:
    """A retried job starts a new transcript; the interrupted attempt's is kept beside it (session.attempt-1.jsonl),
    not appended to."""
    if os.path.exists(path):
        stem, ext = os.path.splitext(path)
        attempt = 1
        while os.path.exists(f"{stem}.attempt-{attempt}{ext}"):
            attempt += 1
        os.replace(path, f"{stem}.attempt-{attempt}{ext}")
    return path


def job_agent(job: JobRun, model: ModelInfo, provider: Provider, tools: ToolRegistry, gate: Gate | None,
              check_in: CheckIn | None = None) -> Agent:
    """The agent, its limits what the job's wall clock has left after set-up."""
    spec = job.spec
    assert job.sandbox is not None
    remaining = max(1.0, spec.timeout_s - job.elapsed())
    system_prompt = build_system_prompt(tools.specs(), job.sandbox, custom=spec.system_prompt)
    return Agent(provider, tools, ToolContext(sandbox=job.sandbox, cancel=job.cancel), system_prompt,
                 session=job.session, sink=job.sink, check_in=check_in,
                 limits=Limits(max_turns=spec.max_turns, wall_clock_s=remaining, max_cost=spec.max_cost, gate=gate,
                               spent_cost=float(sum_usage(*(a.get("usage") or {} for a in job.earlier))["cost"])),
                 compactor=Compactor(provider, model.context_window, max_output_tokens=model.max_tokens),
                 notices=[w for w in (
                     None if model.known else unknown_model_warning(model, window_given=bool(spec.context_window)),
                     None if spec.context_window else silent_truncation_warning(model, spec.base_url)) if w])
