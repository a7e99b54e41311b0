"""A new job made from an ended one: `pid retry` and `pid continue`, Job.retry() and Job.continue_() (pid.api).

The new job's spec comes from the job store (continuation.py), so either works from any machine that shares it. It is
checked as `submit` checks its own (submission.py) and goes out through the same enqueue; every refusal is a
PidError with the line `pid` prints for it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

from pid.config import EnvDefaults, EnvKey, endpoint, key_endpoint
from pid.errors import PidError
from pid.jobs import submission
from pid.jobs.spec import PRICES, JobSpec, message_problem, spec_field

LIMITS = ("max_turns", "timeout_s", "max_cost")   # what `continue` may change of the earlier job's limits


@dataclass
class Rerun:
    """What the caller names beside the earlier job; None (or nothing) keeps the earlier job's."""
    out_dir: str | None = None
    queue: str | None = None
    api_key: str | None = None
    model: str | None = None      # who answers now (the endpoint named here is the one the key given with it is
    base_url: str | None = None   # for)
    api: str | None = None
    limits: dict[str, Any] = field(default_factory=dict)


def retry(job_id: str, given: Rerun, warn: Callable[[str], None]) -> tuple[Any, JobSpec]:
    """Queue the ended job again as a new job: the same task and options, on the same workspace snapshot;
    given.model, .base_url and .api switch who answers (an endpoint that moved)."""
    _check_model(given)
    from pid.jobs.continuation import retry_spec, switch_model

    def make(store: Any) -> JobSpec:
        spec = retry_spec(store, job_id)
        switch_model(spec, given.model, given.base_url, given.api)
        return spec
    return requeue(make, given, warn)


def _check_model(given: Rerun) -> None:
    if given.model is not None and not given.model.strip():
        raise PidError("--model is empty")


def continue_job(job_id: str, message: str, given: Rerun, warn: Callable[[str], None]) -> tuple[Any, JobSpec]:
    """Queue a new job that carries on the ended one's conversation with `message`, on its snapshot with its patch
    applied (so the new patch holds both jobs' changes); given.model, .base_url and .api switch who answers."""
    if (problem := message_problem("the message", message)) is not None:
        raise PidError(problem)
    _check_model(given)
    from pid.jobs.continuation import continuation_spec, switch_model

    def make(store: Any) -> JobSpec:
        spec = continuation_spec(store, job_id, message)
        switch_model(spec, given.model, given.base_url, given.api)
        return spec
    return requeue(make, given, warn)


def requeue(make: Callable[[Any], JobSpec], given: Rerun, warn: Callable[[str], None]) -> tuple[Any, JobSpec]:
    """Make the spec from the job store, check it as submit checks its own, record it and publish it; returns the
    store and the spec, queued."""
    from pid.jobs.brokers import embedded_broker
    from pid.jobs.continuation import Refused
    from pid.jobs.store import default_store
    submission.check_broker()
    store = default_store()
    try:
        spec = make(store)
    except Refused as exc:
        raise PidError(str(exc)) from None
    for name, value in given.limits.items():   # (LIMITS: the command's and the API's only)
        if value is not None:
            setattr(spec, name, value)
    check_prices(spec)
    spec.out_dir = out_dir(given.out_dir, spec.out_dir, warn)
    if given.queue:
        spec.queue = given.queue
    api_key = _key_for(spec, given, warn)
    submission.check_api_key(spec, api_key)
    if embedded_broker():   # the worker is on this machine: its image and CPUs must be here too
        submission.check_cpus(spec)
        submission.check_runtime(spec.runtime, spec.network)
        if spec.image_id:
            _check_image_id(spec)
        else:
            submission.check_image(spec.image)
    submission.enqueue(store, spec, api_key)
    return store, spec


def _key_for(spec: JobSpec, given: Rerun, warn: Callable[[str], None]) -> str | None:
    """The key given now, if it is for this job's endpoint. The stored job's endpoint may be anyone's (a tasks-file
    line's): the key goes only to the endpoint it is for, the one named beside it (base_url, api here, else
    PID_BASE_URL, PID_API), else the API's own (pid.config.endpoint). No key is ever taken from the earlier job:
    its own was forgotten when it ended."""
    api_key = given.api_key
    env = EnvDefaults.read()
    home = key_endpoint(api_key, given.api or env.api, given.base_url or env.base_url)
    if api_key and endpoint(spec.api, spec.base_url) != home:
        how = "pass --api-key, or set PID_BASE_URL" if isinstance(api_key, EnvKey) else "pass --base-url"
        warn(f"the API key is for {home}, not this job's {endpoint(spec.api, spec.base_url)}: not sent ({how}, to "
             "send it there)")
        return None
    return api_key


def _check_image_id(spec: JobSpec) -> None:
    """The very image the earlier job ran (its id) must be in the engine: a job runs again on it, not on what its tag
    names now."""
    from pid.jobs.continuation import pinned_image_gone
    if submission.image_missing(str(spec.image_id)):
        raise PidError(pinned_image_gone(spec, "is no longer in the Docker engine"))


def check_prices(spec: JobSpec) -> None:
    """max_cost (given now, or the earlier job's) needs prices: the earlier job's own, or the model table's, which
    the job then carries, as `submit` has it (submission.build_spec)."""
    if spec.max_cost is None or any(getattr(spec, name) for name in PRICES):
        return
    priced = submission.table_prices(spec.model)
    if not priced:
        raise PidError("--max-cost needs the model's prices, and neither the earlier job nor the model table has "
                       "them")
    for name, value in priced.items():
        setattr(spec, name, value)


def out_dir(given: str | None, earlier: str, warn: Callable[[str], None]) -> str:
    """The directory given (checked), else the earlier job's when this machine can write there (a batch item's: not
    the batch's scratch directory), else submit's default (and `warn` says why, when the earlier one was not a
    batch's)."""
    if given is not None:
        return submission.check_out_dir(given)
    default = os.path.join(os.getcwd(), str(spec_field("out_dir").default))
    from pid.jobs.batch import JOBS, BatchDir
    earlier_path = os.path.normpath(earlier)
    if os.path.basename(earlier_path) == JOBS and BatchDir.exists(os.path.dirname(earlier_path)):
        return submission.check_out_dir(default)   # the batch's scratch, which it empties as it downloads each item
    try:
        return submission.check_out_dir(earlier)
    except PidError as exc:
        warn(f"the earlier job's artifacts directory is of no use here ({exc.args[0].removeprefix('--out ')}): "
             f"this job's go to {default}")
        return submission.check_out_dir(default)
