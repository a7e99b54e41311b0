"""Settings of one sandbox container, and the labels every pid container carries."""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

DEFAULT_IMAGE = "pid-sandbox:latest"   # the one docker/build-offline.sh makes

LABEL_JOB = "pid.job"          # which job owns the container; its presence marks a pid container
LABEL_CREATED = "pid.created"  # ISO 8601 UTC
LABEL_EXPIRES = "pid.expires"  # ISO 8601 UTC; after this the reaper may remove the container
LABEL_OWNER = "pid.owner"      # which installation (PID_HOME) made it: `pid reap` removes only its own
LABEL_ATTEMPT = "pid.attempt"  # which attempt of its job: a lost attempt's is removed, never the next one's
LABEL_POOL = "pid.pool"        # a worker's warm pool made it: "host:pid:identity" of that worker process (its
# pid.job is then `pool-...`; a job that takes it renames it, see taken_name)
# Nothing of an image's configuration runs but what pid starts (every container pid creates from a job's image): an
# ENTRYPOINT would run as root before pid, a HEALTHCHECK as root beside the agent, with its files.
IMAGE_RUNS_NOTHING = {"entrypoint": [], "healthcheck": {"test": ["NONE"]}}
POOL_JOB_PREFIX = "pool-"      # a pool's container's pid.job (an image's own pid.pool label may be on a job's)

AGENT_HOME = "/home/agent"
DEFAULT_USER = "1000:1000"
DEFAULT_DISK = 10 << 30
MIN_DISK = 16 << 20     # the least a job's disk can work with
MIN_MEMORY = 6 << 20    # the Docker engine refuses less
DEFAULT_MAX_WORKSPACE = 200 << 20

# Every command sees these: tools must never wait for a pager or paint colours into the model's context.
BASE_ENV = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "TERM": "dumb",
    "NO_COLOR": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "HOME": AGENT_HOME,
    "TMPDIR": "/tmp",
}


def parse_user(text: str) -> tuple[int, int]:
    """'root', 'UID' or 'UID:GID' -> (uid, gid). The agent's identity inside the container."""
    text = text.strip()
    if text == "root":
        return 0, 0
    match = re.fullmatch(r"(\d{1,9})(?::(\d{1,9}))?", text)
    if not match:
        raise ValueError(f"--user takes 'root', UID or UID:GID (numbers), not {text!r}")
    uid = int(match.group(1))
    return uid, int(match.group(2)) if match.group(2) is not None else uid


@dataclass
class SandboxConfig:
    image: str = DEFAULT_IMAGE
    job_id: str = "adhoc"
    memory: str = "2g"            # swap equal to memory (memswap_limit == mem_limit): no swap at all
    cpus: float = 1.0
    pids_limit: int = 512
    network: str = "none"
    ttl_s: float = 3600.0         # the container's main process exits by itself after this (wall clock + margin)
    workdir: str = "/workspace"
    user: str = DEFAULT_USER      # the agent's uid:gid; "root" is an explicit opt-in
    disk: int = DEFAULT_DISK      # bytes the job may write in all (workspace, /tmp, home); 0: no limit
    disk_root: str | None = None  # where per-job disk images live (under PID_HOME); None: the default there
    runtime: str | None = None    # an engine runtime such as runsc (gVisor)
    owner: str = ""               # the installation's label value (see reaper.owner_label)
    attempt: int = 1              # the job's attempt this sandbox serves
    max_workspace: int = DEFAULT_MAX_WORKSPACE   # bytes a git URL's clone may take (its .git and checkout)
    writable_image: bool = False  # the image's own filesystem is the job's to change, copy-on-write on its disk
    image_workspace: bool = False  # the workspace is the image's own workdir as it is (nothing is imported)
    pool: str = ""                # made ready for a warm pool: the pool's process (LABEL_POOL's value); "" for a job's


def container_path(path: str, workdir: str) -> str:
    """`path` as the container names it: absolute (a relative one is the workdir's), cleaned as the engine cleans it
    (`..` taken back, and "//" is "/", which posixpath keeps)."""
    return "/" + posixpath.normpath(posixpath.join(workdir, path)).lstrip("/")


def taken_name(job_id: str, attempt: int) -> str:
    """The name a warm pool's container takes when a job takes it: its labels still name the pool, so cancel, the
    sweep of a lost attempt and a retry find the job's containers by this name as well as by label."""
    return f"pid-job-{job_id}-a{attempt}"
