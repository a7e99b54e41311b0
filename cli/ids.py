"""Job ids as people type them, resolved in one place for every command that takes one: the whole id, any unique
end of it of MIN_END characters or more (`70a672`: the random part, which `pid list` keeps when it must shorten an
id; `pid cancel 1` must not pick whichever job ends in 1), `last` (the newest job), or BATCHDIR/ITEM (a batch item's
current job, from the batch directory's ledger)."""
from __future__ import annotations

import os
from typing import Any

import click

LAST = "last"
CANDIDATES = 4   # shown for an ambiguous suffix
MIN_END = 4      # characters of an id's end, at least, that name it


class NoSuchJob(click.ClickException):
    """One line, exit 2 (pid.cli.main prints ClickExceptions as `pid: error: ...`)."""
    exit_code = 2


def resolve(store: Any, ref: str) -> str:
    """The full id of the job `ref` names in `store`; NoSuchJob when none, or when a suffix ends several ids."""
    if not ref:
        raise NoSuchJob("no such job: (an empty id)")
    if ref == LAST:
        newest = store.list(1)
        if not newest:
            raise NoSuchJob("no job yet: `last` names the newest one")
        return str(newest[0].id)
    if store.get(ref) is not None:
        return ref
    if "/" in ref or os.sep in ref:
        return _batch_item(store, ref)
    found = store.ids_ending(ref, CANDIDATES + 1) if len(ref) >= MIN_END else []
    if len(found) == 1:
        return str(found[0])
    if not found:
        from pid.jobs.batch import BatchDir
        if BatchDir.exists(os.path.abspath(os.path.expanduser(ref))):   # a batch's directory, without an item
            return _batch_item(store, ref)
        if len(ref) < MIN_END:
            raise NoSuchJob(f"no such job: {ref} (an id's end names a job from {MIN_END} characters on: `pid list` "
                            "shows the ids)")
        raise NoSuchJob(f"no such job: {ref} (a job's whole id, or its end: its last {MIN_END} characters or more)")
    shown = ", ".join(sorted(found)[:CANDIDATES]) + (", …" if len(found) > CANDIDATES else "")
    raise NoSuchJob(f"ambiguous job id {ref}: it ends {shown} (type more of it)")


def _batch_item(store: Any, ref: str) -> str:
    """BATCHDIR/ITEM: the item's current job (its newest), as the batch's ledger (jobs.jsonl) records it."""
    from pid.jobs.batch import BatchDir
    whole = os.path.abspath(os.path.expanduser(ref))
    if BatchDir.exists(whole):
        raise NoSuchJob(f"{ref} is a batch's output directory: name one of its items ({ref.rstrip('/')}/ITEM; "
                        f"pid batch --status {ref.rstrip('/')} lists them)")
    directory, item = os.path.split(ref.rstrip("/"))
    path = os.path.abspath(os.path.expanduser(directory or "."))
    if not BatchDir.exists(path):
        raise NoSuchJob(f"no such job: {ref} (and {directory or '.'} is not a batch's output directory)")
    try:
        bdir = BatchDir.open(path)
    except ValueError as exc:
        raise NoSuchJob(str(exc)) from None
    if item not in bdir.order:
        raise NoSuchJob(f"batch {directory}: no item {item}")
    job_id = bdir.current_job(item)
    if job_id is None:
        raise NoSuchJob(f"batch {directory}: item {item} has no job yet")
    if store.get(job_id) is None:
        raise NoSuchJob(f"batch {directory}: item {item}'s job {job_id} is not in this job store (expired, or "
                        "another store's)")
    return job_id


class JobId(click.ParamType):
    """A command's JOB argument: resolved to the full id before the command runs."""
    name = "job"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if ctx is not None and ctx.resilient_parsing:   # shell completion: nothing is run
            return str(value)
        from pid.config import HomeUnusable, ensure_pid_home
        from pid.jobs.store import default_store
        try:
            ensure_pid_home()
        except HomeUnusable as exc:
            raise NoSuchJob(str(exc)) from None
        return resolve(default_store(), str(value))


JOB_ID = JobId()
