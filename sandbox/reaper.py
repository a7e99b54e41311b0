"""Remove pid containers whose time is up: the safety net for workers that died without cleaning up.

Every pid container carries `pid.job` and `pid.expires`; its main process also exits by itself at expiry
(auto-remove), so this only matters for containers that are stuck or were created with another TTL.
"""
from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
from datetime import datetime, timezone
from typing import Any

import docker
import docker.errors

from .config import LABEL_ATTEMPT, LABEL_EXPIRES, LABEL_JOB, LABEL_OWNER, LABEL_POOL, POOL_JOB_PREFIX, taken_name
from .docker_client import connected
from pid import settings

log = logging.getLogger(__name__)

# A test run marks every container it makes with its own id (conftest sets the variable), so that its leak check
# counts, and removes, only its own containers on an engine that other runs and real workers share.
TEST_RUN_ENV = settings.TEST_RUN.name
LABEL_TEST_RUN = "pid.test-run"


def run_labels() -> dict[str, str]:
    """Labels a new container carries beyond pid's own: the test run's mark, when there is one."""
    run = settings.TEST_RUN.get()
    return {LABEL_TEST_RUN: run} if run else {}


def owner_label(pid_home: str) -> str:
    """The installation's mark on its containers: this host and its PID_HOME, so two installations sharing an
    engine (or a test run beside a real worker) never reap each other's containers."""
    digest = hashlib.sha256(os.path.realpath(pid_home).encode()).hexdigest()[:16]
    return f"{socket.gethostname()}:{digest}"


def parse_time(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def force_remove(client: docker.DockerClient, container_id: str) -> bool:
    """Force-remove; True when it is gone (or already going: 409 is a removal in progress). Never raises."""
    return remove_container(client, container_id) in ("removed", "going")


def remove_container(client: docker.DockerClient, container_id: str) -> str:
    """Force-remove: "removed" (by this request), "going" (a removal already in progress: 409), "gone" (there was
    none) or "failed". Never raises. An engine that fails the request otherwise (busy, a kill it did not see end) is
    asked once more before giving up (the container's own time to live and the reaper remain)."""
    error: Exception | None = None
    for attempt in range(2):
        if attempt:
            time.sleep(0.5)
        try:
            client.api.remove_container(container_id, force=True, v=True)   # (v: an anonymous volume too)
            return "removed"
        except docker.errors.NotFound:
            return "gone"
        except Exception as exc:
            if getattr(exc, "status_code", None) == 409:
                return "going"
            error = exc
    log.warning("cannot remove container %s: %s", container_id[:12], error)
    return "failed"


def list_containers(client: docker.DockerClient, labels: list[str]) -> list[dict[str, Any]]:
    """The containers carrying all these label filters ("key" or "key=value"), as the engine lists them ("Id",
    "Labels", "State", ...). One request and no inspection per container: one that vanishes meanwhile (auto-removed,
    another reaper) cannot fail the listing; it is simply in it or not."""
    try:
        return client.api.containers(all=True, filters={"label": labels})
    except docker.errors.NotFound:
        return []


def remove_job_containers(job_id: str, client: docker.DockerClient | None = None,
                          attempt: int | None = None) -> list[str]:
    """Force-remove the containers of one job (of one of its attempts): a retried job first clears what its lost
    attempts left behind; a sweeper removes a lost attempt's, never the next attempt's."""
    labels = [f"{LABEL_JOB}={job_id}"] + ([f"{LABEL_ATTEMPT}={attempt}"] if attempt is not None else [])
    with connected(client) as client:
        found = {c["Id"] for c in list_containers(client, labels)} | set(taken_containers(client, job_id, attempt))
        return [container_id for container_id in found if force_remove(client, container_id)]


def taken_containers(client: docker.DockerClient, job_id: str, attempt: int | None = None) -> list[str]:
    """The warm pool's containers a job took (of one attempt, or of any): found by the name the job gave them
    (config.taken_name), matched exactly (the engine's name filter matches any part of a name)."""
    prefix = taken_name(job_id, 0)[:-1]   # "pid-job-<id>-a"
    try:
        listed = client.api.containers(all=True, filters={"label": [LABEL_POOL], "name": [prefix]})
    except docker.errors.NotFound:
        return []
    wanted = {"/" + taken_name(job_id, attempt)} if attempt is not None else None
    return [c["Id"] for c in listed for name in (c.get("Names") or [])
            if (name in wanted if wanted is not None else
                name.startswith("/" + prefix) and name[len(prefix) + 1:].isdigit())]


def reap_orphan_pools(owner: str | None, client: docker.DockerClient | None = None) -> list[str]:
    """Force-remove the warm-pool containers (ready, or taken by a job) of installation `owner` (None: of every
    installation) whose worker process is gone: a worker killed with SIGKILL had no chance to remove them. Only a
    process on this machine can be known gone (pid.jobs.identity); others' containers wait for their expiry."""
    from pid.jobs.identity import mark_gone
    labels = [LABEL_POOL] + ([f"{LABEL_OWNER}={owner}"] if owner is not None else [])
    with connected(client) as client:
        # (a pool's containers are the ones whose job is the pool's own, `pool-…`, which only pid sets: an image's
        # own pid.pool label is merged into its job's container's labels)
        orphans = [c["Id"] for c in list_containers(client, labels)
                   if str((c.get("Labels") or {}).get(LABEL_JOB, "")).startswith(POOL_JOB_PREFIX)
                   and mark_gone(str((c.get("Labels") or {}).get(LABEL_POOL, "")))]
        return [container_id for container_id in orphans if force_remove(client, container_id)]


def reap_expired(owner: str | None, client: docker.DockerClient | None = None,
                 now: datetime | None = None) -> list[str]:
    """Force-remove the expired pid containers of installation `owner` (None: of every installation); their ids.

    A container that vanishes while this runs (auto-removed, or another reaper) is simply not counted.
    """
    now = now or datetime.now(timezone.utc)
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)
    labels = [LABEL_JOB] + ([f"{LABEL_OWNER}={owner}"] if owner is not None else [])
    with connected(client) as client:
        expired = [c["Id"] for c in list_containers(client, labels)
                   if (expires := parse_time((c.get("Labels") or {}).get(LABEL_EXPIRES, ""))) is not None
                   and expires <= now]
        return [container_id for container_id in expired if force_remove(client, container_id)]


def reap_installation(pid_home: str, *, all_owners: bool = False,
                      client: docker.DockerClient | None = None) -> tuple[list[str], list[str]]:
    """What `pid reap`, `pid run` and every worker do: remove this installation's expired containers (every
    installation's with all_owners) and those of warm pools whose worker is gone, then the per-job disks whose job
    process is gone. (container ids, disk names)"""
    owner = None if all_owners else owner_label(pid_home)
    with connected(client) as client:   # (one client for both)
        expired = reap_expired(owner, client)
        pools, disks = reap_gone(pid_home, owner, client)
    return expired + pools, disks


def reap_gone(pid_home: str, owner: str | None, client: docker.DockerClient | None = None
              ) -> tuple[list[str], list[str]]:
    """The warm pools of workers known gone (reap_orphan_pools), then the per-job disks whose process is gone: always
    together, since a pool's containers run on disks the second removes (left, they ran on deleted disks until
    their expiry). (container ids, disk names)"""
    from .disk import reap_disks
    return reap_orphan_pools(owner, client), reap_disks(os.path.join(pid_home, "disks"))
