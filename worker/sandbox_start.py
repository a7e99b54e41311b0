"""The job's sandbox settings, and starting the sandbox early.

Why early: `pid run` spends its first half second loading the agent's code; the container's start is mostly waiting
on the engine. Started from a thread before that loading, the two overlap.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

from pid.config import pid_home
from pid.jobs.spec import JobSpec

if TYPE_CHECKING:
    from pid.sandbox import DockerSandbox, SandboxConfig

# The agent gets its wall clock; past it, and a grace period more, the watchdog removes the container, which ends
# any wait that is still stuck. Artifacts are then collected under their own deadline, and a --check runs under its
# own (--check-timeout, plus the grace period). The container's own time to live covers all of it, so that an orphan
# (its worker died) removes itself after.
GRACE_S = 30.0
COLLECT_TIMEOUT_S = 60.0
CONTAINER_TTL_MARGIN_S = 120.0


def sandbox_config(spec: JobSpec, attempt: int = 1) -> "SandboxConfig":
    from pid.sandbox import SandboxConfig
    from pid.sandbox.reaper import owner_label
    home = pid_home()
    return SandboxConfig(
        image=spec.image_id or spec.image,   # (a retry's or continuation's: the image its earlier job ran, by id)
        job_id=spec.id, memory=spec.memory, cpus=spec.cpus, pids_limit=spec.pids_limit,
        network=spec.network, user=spec.user, disk=spec.disk, runtime=spec.runtime, owner=owner_label(home),
        attempt=attempt, max_workspace=spec.max_workspace, workdir=spec.workspace_dir,
        writable_image=spec.workdir is not None, image_workspace=not spec.repo,
        disk_root=os.path.join(home, "disks"),
        ttl_s=spec.timeout_s + GRACE_S + COLLECT_TIMEOUT_S + CONTAINER_TTL_MARGIN_S
        + (spec.check_timeout_s + GRACE_S + COLLECT_TIMEOUT_S if spec.check else 0.0))


def start_sandbox(spec: JobSpec) -> "Future[DockerSandbox]":
    """DockerSandbox.create for this job, in a thread; the caller owns the result (and closes it)."""
    future: Future[DockerSandbox] = Future()

    def create() -> None:
        try:
            from pid.sandbox import DockerSandbox
            future.set_result(DockerSandbox.create(sandbox_config(spec)))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=create, name="pid-sandbox-start", daemon=True).start()
    return future


def abandon(starting: "Future[DockerSandbox]") -> None:
    """The job will not run after all: its early sandbox goes (never raises)."""
    try:
        starting.result(timeout=300).close()
    except BaseException:
        pass
