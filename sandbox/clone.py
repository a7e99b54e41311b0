"""Cloning a git URL for a job's workspace, in a short-lived container of its own: git never runs on the host.

Why a separate container and not the job's: the job's container has no network by default, and a `file://`
repository must be mounted to be read; a step of its own gets network (for https/ssh/git URLs) or the read-only mount
(for file://) for the clone only, and the agent never sees either. The step writes the checkout as a tar on its
stdout; the job's sandbox unpacks it with the checks every workspace tar passes (workspace.unpack_tar).

The container's root filesystem is read-only; git writes only to a tmpfs at /tmp (the clone, HOME, git's config)
of the job's workspace limit (`--max-workspace`, and at most its disk): a repository larger than that fails the
clone with a clear error instead of filling the engine's disk. tmpfs pages count as the container's memory, so the
container may use that much memory more than the job's limit.

git runs with hooks and external helpers off: no hooks, no fsmonitor, no credential helper or prompt, no submodules,
only the URL's own protocol allowed (so no `ext::` and no redirect to another transport), no system or global
configuration. The checkout is shallow: `--depth 1 --branch REF` for a branch or tag; a full commit id is fetched
alone at depth 1, and if the server refuses that, the whole history is cloned and the commit checked out.
"""
from __future__ import annotations

import io
import os
import re
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import IO, Any, Callable, Iterator
from urllib.parse import urlsplit

import docker
import docker.errors

from .config import IMAGE_RUNS_NOTHING, LABEL_CREATED, LABEL_EXPIRES, LABEL_JOB, LABEL_OWNER, SandboxConfig
from .disk import parse_size
from .errors import BadWorkspace, SandboxError
from .launch import start_created
from .reaper import force_remove, run_labels
from .seccomp import SECURITY_OPT
from .volumes import volume_paths
from .workspace import check_git_source

CLONE_TMP = "/tmp"            # the clone's only writable place: a tmpfs of clone_limit() bytes
SOURCE_MOUNT = "/pid-src"     # where a file:// repository appears, read-only, in the clone's container
CLONE_DIR = "/tmp/pid-clone"
_SHA_RE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
NO_REF = 3                    # the clone script's exit status when the repository has no such ref

_SCRIPT = r"""
set -u
export HOME=/tmp GIT_TERMINAL_PROMPT=0 GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/tmp/.pid-gitconfig \
  GIT_ASKPASS=/bin/false SSH_ASKPASS=/bin/false GIT_SSH_COMMAND='ssh -o BatchMode=yes' LC_ALL=C
# git reads safe.directory from the global configuration only (not -c): a mounted repository has another owner
printf '[safe]\n\tdirectory = *\n' > /tmp/.pid-gitconfig
url=$1 ref=$2 scheme=$3
g() { git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c credential.helper= -c protocol.allow=never \
  -c "protocol.$scheme.allow=always" -c safe.directory='*' -c submodule.recurse=false -c advice.detachedHead=false \
  -c init.defaultBranch=main "$@"; }
fail() { echo "pid-clone-error $*" >&2; exit 1; }
sha=; printf '%s' "$ref" | grep -Eqx '[0-9a-f]{40}|[0-9a-f]{64}' && sha=1
full() {
  cd /tmp && rm -rf "$dir" && g clone -q --no-checkout --no-recurse-submodules -- "$url" "$dir" || fail "cannot clone"
  # A name may be a branch other than the default, origin's only after a clone without a checkout; a commit id is
  # that commit, never a branch a repository named so. No such ref: exit NO_REF (the repository was reached).
  cd "$dir" || fail "no clone"
  if [ -n "$sha" ]; then commit=$(g rev-parse -q --verify "$ref^{commit}")
  else commit=$(g rev-parse -q --verify "refs/remotes/origin/$ref^{commit}" || g rev-parse -q --verify "$ref^{commit}")
  fi || { echo "pid-clone-error no branch, tag or commit named $ref" >&2; exit NO_REF; }
  g checkout -q --detach "$commit" || fail "cannot check out $ref"
}
dir=CLONE_DIR
if [ -z "$ref" ]; then
  g clone -q --depth 1 --no-recurse-submodules -- "$url" "$dir" || fail "cannot clone"
elif [ -n "$sha" ]; then
  { mkdir -p "$dir" && cd "$dir" && g init -q && g remote add origin "$url" &&
    g fetch -q --depth 1 origin "$ref" && g checkout -q --detach FETCH_HEAD; } 2>/dev/null || full
else
  g clone -q --depth 1 --branch "$ref" --no-recurse-submodules -- "$url" "$dir" 2>/dev/null || full
fi
cd "$dir" || fail "no checkout"
echo "pid-commit $(g rev-parse HEAD)" >&2
exec tar -cf - --numeric-owner .
""".replace("CLONE_DIR", CLONE_DIR).replace("NO_REF", str(NO_REF))


class _Stdout(io.RawIOBase):
    """The clone's stdout (the tar) as a readable stream; its stderr lines are kept apart."""

    def __init__(self, frames: Iterator[tuple[bytes | None, bytes | None]]) -> None:
        self.frames = frames
        self.pending = b""
        self.stderr = bytearray()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending:
            try:
                out, err = next(self.frames)
            except StopIteration:
                return 0
            if err:
                self.stderr += err[: max(0, 65536 - len(self.stderr))]
            if out:
                self.pending = out
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n

    def drain(self) -> None:
        while self.readinto(bytearray(65536)):
            pass


def clone_into(client: docker.DockerClient, config: SandboxConfig, url: str, ref: str | None,
               unpack: Callable[[IO[bytes]], None], timeout: float) -> str:
    """Clone `url` at `ref` in a container of its own and hand the checkout, as a tar stream, to `unpack`. Returns the
    commit checked out. Raises SandboxError with git's reason (or the time limit) when it cannot."""
    check_git_source(url, ref)
    scheme = urlsplit(url).scheme
    mounts: list[docker.types.Mount] = []
    inside = url
    if scheme == "file":
        source = os.path.realpath(urlsplit(url).path)
        if not os.path.isdir(source):
            raise BadWorkspace(f"cannot clone {url}: {source} is not a directory on this worker")
        mounts.append(docker.types.Mount(SOURCE_MOUNT, source, type="bind", read_only=True))
        inside = f"file://{SOURCE_MOUNT}"
    limit = clone_limit(config)
    tmpfs = {CLONE_TMP: f"rw,nosuid,nodev,noexec,size={limit},mode=1777"}
    tmpfs.update({path: "ro,size=4k,mode=755" for path in _image_volumes(client, config.image)
                  if path.startswith("/") and path not in tmpfs})
    now = datetime.now(timezone.utc)
    labels = {LABEL_JOB: config.job_id, LABEL_OWNER: config.owner, LABEL_CREATED: _iso(now),
              LABEL_EXPIRES: _iso(now + timedelta(seconds=timeout + 60)), **run_labels()}
    try:
        created = client.api.create_container(
            config.image, ["sh", "-c", _SCRIPT, "pid-clone", inside, ref or "", scheme],
            **IMAGE_RUNS_NOTHING,
            user=config.user if config.user != "root" else "0:0", labels=labels, environment={"HOME": "/tmp"},
            network_disabled=scheme == "file",   # (a local path: no network at all, the faster start: launch.ETC_HOSTS)
            host_config=client.api.create_host_config(
                network_mode="none" if scheme == "file" else "bridge", mounts=mounts, read_only=True,
                tmpfs=tmpfs,
                mem_limit=_memory(config.memory, limit), memswap_limit=_memory(config.memory, limit),
                nano_cpus=int(config.cpus * 1e9),
                pids_limit=config.pids_limit, security_opt=SECURITY_OPT, cap_drop=["ALL"],
                log_config={"type": "none"}, runtime=config.runtime or None, init=True))
    except docker.errors.DockerException as exc:
        raise SandboxError(f"cannot start the clone of {url}: {exc}") from exc
    cid = created["Id"]
    timer = threading.Timer(timeout, lambda: force_remove(client, cid))
    timer.daemon = True
    try:
        stdout = _Stdout(_start_attached(client, cid, f"cannot start the clone of {url}"))
        started = time.monotonic()
        timer.start()
        problem: BaseException | None = None
        try:
            unpack(io.BufferedReader(stdout, 1 << 16))
        except Exception as exc:   # the tar was cut short or refused: git's own reason comes first, if any
            problem = exc
        stdout.drain()
        try:
            code = client.api.wait(cid, timeout=max(1.0, timeout - (time.monotonic() - started)))["StatusCode"]
        except Exception:
            code = None
        lines = stdout.stderr.decode("utf-8", "replace").splitlines()
        commit = next((ln.split()[1] for ln in lines if ln.startswith("pid-commit ") and len(ln.split()) == 2), None)
        if time.monotonic() - started >= timeout:
            raise SandboxError(f"cloning {url} took longer than {timeout:g}s")
        if code != 0 and any("No space left on device" in ln for ln in lines):
            raise SandboxError(f"cannot clone {url}{f' at {ref}' if ref else ''}: the clone is larger than the "
                               f"workspace limit of {_mib(limit)} (raise --max-workspace, or the job's --disk)")
        if code != 0 or commit is None or not _SHA_RE.fullmatch(commit):
            git_said = _last(lines)
            why = f"cannot clone {url}{f' at {ref}' if ref else ''}: {git_said or f'exit status {code}'}"
            # (the script said so by its status, never by text a repository could print: the repository was reached,
            # and has no such ref, which no retry mends)
            raise BadWorkspace(why) if code == NO_REF else SandboxError(why)
        if ref and _SHA_RE.fullmatch(ref) and commit != ref:
            raise SandboxError(f"cannot clone {url} at {ref}: the clone checked out {commit}, another commit")
        if problem is not None:
            raise problem
        return commit
    finally:
        timer.cancel()
        force_remove(client, cid)


def _start_attached(client: docker.DockerClient, cid: str, failed: str) -> Iterator[tuple[bytes | None, bytes | None]]:
    """Start the clone's container, attached to first: its output's frames (stdout, stderr). A start the engine fails
    ends what was attached (moby's cleanup), so each try attaches anew (launch.start_created)."""
    attached: list[Any] = []

    def attach() -> None:
        for stream in attached:
            stream.close()
        try:
            attached[:] = [client.api.attach(cid, stdout=True, stderr=True, stream=True, logs=False, demux=True)]
        except docker.errors.DockerException as exc:
            raise SandboxError(f"{failed}: {exc}") from exc

    attach()
    start_created(client, cid, failed, again=attach)
    return attached[0]


def _image_volumes(client: docker.DockerClient, image: str) -> list[str]:
    """The image's VOLUME paths: each gets an empty read-only tmpfs in the clone's container, where the engine would
    make a volume of its own, on its storage, past every limit."""
    try:
        return volume_paths(client.api.inspect_image(image))
    except docker.errors.DockerException as exc:
        raise SandboxError(f"cannot inspect {image!r}: {exc}") from exc


def clone_limit(config: SandboxConfig) -> int:
    """Bytes the clone may write: the job's workspace limit, and no more than its disk."""
    limits = [n for n in (config.max_workspace, config.disk) if n > 0]
    return min(limits) if limits else SandboxConfig.max_workspace


def _memory(memory: str, tmpfs: int) -> int | str:
    """The clone container's memory limit: the job's, plus its tmpfs (whose pages are charged to it)."""
    try:
        return parse_size(memory) + tmpfs
    except ValueError:   # a form the engine reads but parse_size does not: the job's own limit, as before
        return memory


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.0f} MiB" if size >= 1 << 20 else f"{size} bytes"


def _last(lines: list[str]) -> str:
    """Why the clone failed: the script's reason, with git's last "fatal:" or "error:" line."""
    ours = [ln[len("pid-clone-error "):] for ln in lines if ln.startswith("pid-clone-error ")]
    ours = [reason for reason in ours if reason != "cannot clone"]   # (what the message says first already)
    git = [ln.strip() for ln in lines if ln.startswith(("fatal:", "error:"))]
    text = "; ".join(x[-1] for x in (ours, git) if x)
    return text[:500]


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
