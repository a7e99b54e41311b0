"""Remove pid containers whose time is up: the safety net for workers that died without cleaning up.

Every pid container carries `pid.job` and `pid.expires`; its main process also exits by itself at expiry
(auto-remove), so this only matters for containers that are stuck or were created with another TTL.
"""
from __future__ import annotations

import logging
from datetime import datetime, timezone

import docker
import docker.errors

from .config import LABEL_EXPIRES, LABEL_JOB
from .docker_client import connect

log = logging.getLogger(__name__)


def parse_time(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _remove(container) -> bool:
    """Force-remove; True when it is gone (or already going: 409 is a removal in progress)."""
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        return False
    except docker.errors.APIError as exc:
        if exc.status_code != 409:
            log.warning("cannot remove container %s: %s", container.short_id, exc)
            return False
    return True


def remove_job_containers(job_id: str, client: docker.DockerClient | None = None) -> list[str]:
    """Force-remove the containers of one job: a retried job first clears what its lost attempt left behind."""
    client = connect(client)
    return [c.id for c in client.containers.list(all=True, filters={"label": f"{LABEL_JOB}={job_id}"})
            if _remove(c)]


def reap_expired(client: docker.DockerClient | None = None, now: datetime | None = None) -> list[str]:
    """Force-remove every container labelled `pid.job` whose `pid.expires` has passed; returns their ids."""
    client = connect(client)
    now = now or datetime.now(timezone.utc)
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)
    expired = [c for c in client.containers.list(all=True, filters={"label": LABEL_JOB})
               if (expires := parse_time(c.labels.get(LABEL_EXPIRES, ""))) is not None and expires <= now]
    return [c.id for c in expired if _remove(c)]
