"""Settings of one sandbox container, and the labels every pid container carries."""
from __future__ import annotations

from dataclasses import dataclass

LABEL_JOB = "pid.job"          # which job owns the container; its presence marks a pid container
LABEL_CREATED = "pid.created"  # ISO 8601 UTC
LABEL_EXPIRES = "pid.expires"  # ISO 8601 UTC; after this the reaper may remove the container

# Every command sees these: tools must never wait for a pager or paint colours into the model's context.
BASE_ENV = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "TERM": "dumb",
    "NO_COLOR": "1",
    "GIT_TERMINAL_PROMPT": "0",
}


@dataclass
class SandboxConfig:
    image: str = "pid-sandbox:latest"
    job_id: str = "adhoc"
    memory: str = "2g"            # swap equal to memory (memswap_limit == mem_limit): no swap at all
    cpus: float = 1.0
    pids_limit: int = 512
    network: str = "none"
    ttl_s: float = 3600.0         # the container's main process exits by itself after this (wall clock + margin)
    workdir: str = "/workspace"
