"""A job's artifacts travel through the job store, so that a client on any machine gets them.

The worker uploads what the job left in its directory (result.json, patch.diff, the transcripts, the collected files
under files/), each streamed and under its own size limit, named by its path relative to the job's directory
("files/workspace/out.txt"). result.json goes last: a client that finds it finds everything else, and the worker
uploads before it records the job's end. What the store refuses is said in result.json and in the job's error;
nothing here raises on the worker's side.

The client downloads them into a directory of its own (`pid result ID --download DIR`, `pid submit --wait --out`):
names are checked (relative, no `..`), nothing is written through a symlink (directories are opened with O_NOFOLLOW
relative to their parent, files are written under a temporary name and renamed over whatever was there), created
directories are 0700 and files 0600. A non-empty DIR is written into only when it is this job's own: its earlier
download (it holds this job's result.json, or the marker an interrupted download leaves) or, for `submit --wait`,
the job's own out directory.
"""
from __future__ import annotations

import errno
import io
import json
import logging
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

from pid.endings import status_of
from pid.jobs.spec import JobSpec, json_text, storable
from pid.jobs.store import ARTIFACT_LIMIT, BlobMissing, JobAttachments, TooLarge
from pid.output_dirs import mark

log = logging.getLogger("pid.worker")

RESULT = "result.json"
SESSION = "session.jsonl"
PATCH = "patch.diff"
FILES = "files"
MARKER = ".pid-download"               # in a download directory until the download is whole: names the job
RESULT_READ_LIMIT = 64 << 20           # a result.json larger than this is not one pid wrote
_ATTEMPT_SESSION = re.compile(r"session\.attempt-\d+\.jsonl")
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class DownloadError(Exception):
    """A download that cannot be done: its message is one line for the user."""


@dataclass
class Upload:
    name: str    # the artifact's name: its path relative to the job's directory, "/"-separated
    path: str    # the local file
    limit: int   # bytes at most


# -- the worker's side -------------------------------------------------------------------------------------------

def result_bytes(result: dict[str, Any]) -> bytes:
    """result.json's bytes, as write_json_atomic writes them."""
    return (json.dumps(json_text(result), indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def job_uploads(spec: JobSpec, job_dir: str, result: dict[str, Any]) -> list[Upload]:
    """What of the job's directory goes to the store: the transcripts (earlier attempts' too), the patch, and the
    files this attempt collected (result.json's artifacts.files; regular files only, never through a symlink)."""
    uploads: list[Upload] = []
    try:
        top = sorted(os.listdir(job_dir))
    except OSError:
        top = []
    for name in top:
        if _ATTEMPT_SESSION.fullmatch(name) or name == SESSION:
            limit = ARTIFACT_LIMIT
        elif name == PATCH:
            limit = spec.max_patch
        else:
            continue
        path = os.path.join(job_dir, name)
        if _regular(path):
            uploads.append(Upload(name, path, limit))
    files_dir = os.path.join(job_dir, FILES)
    collected = (result.get("artifacts") or {}).get("files") or []
    for path in collected if isinstance(collected, list) else []:
        path = os.path.join(job_dir, str(path))   # (relative to the job's directory; an older result's absolute)
        rel = os.path.relpath(path, job_dir)
        if rel.startswith(FILES + os.sep) and os.path.commonpath([files_dir, str(path)]) == files_dir \
                and _regular(str(path)):
            uploads.append(Upload(storable(rel.replace(os.sep, "/")), str(path), spec.max_files_bytes))
    return uploads


def upload_artifacts(store: JobAttachments, spec: JobSpec, job_dir: str, result: dict[str, Any]) -> None:
    """Every artifact of the job's directory, then result.json, which lists each stored one's digest in
    result["artifacts"]["digests"] (name -> "sha256:<hex>": what a download can be checked against). What the store
    refused, and why, is listed in result["artifacts"]["not_stored"]; a completed job whose artifacts are not all
    stored ends `artifact_error` (as one whose artifacts could not be collected). `result` is amended in place,
    before it is stored."""
    refused = _upload_all(store, spec, job_dir, result)
    if refused:
        result.setdefault("artifacts", {})["not_stored"] = refused
        _fail(result, "artifacts not stored in the job store: " +
              "; ".join(f"{r['name']}: {r['reason']}" for r in refused[:3]) +
              (f" (and {len(refused) - 3} more)" if len(refused) > 3 else ""))
    store_result(store, spec.id, result)


def keep_run_artifacts(store: JobAttachments, spec: JobSpec, job_dir: str, result: dict[str, Any]) -> None:
    """A `pid run` job's artifacts into the store as a worker's job leaves them, so that `continue`, `retry` and
    `result --download` work on it from any machine. Its out directory has them already: what the store refuses is
    logged (one line), and the job's result stays as it is."""
    refused = _upload_all(store, spec, job_dir, result)
    why = _put_bytes(store, spec.id, RESULT, result_bytes(result))
    if refused or why:
        log.warning("job %s: not all its artifacts are kept in the job store (%s): continue and retry may not find "
                    "them", spec.id, refused[0]["reason"] if refused else why)


def _upload_all(store: JobAttachments, spec: JobSpec, job_dir: str, result: dict[str, Any]) -> list[dict[str, str]]:
    """Every artifact of the job's directory (job_uploads) into the store; what it refused, and why."""
    refused: list[dict[str, str]] = []
    digests: dict[str, str] = {}
    files_left = spec.max_files_bytes   # --file collection's byte budget holds for the upload too
    for upload in job_uploads(spec, job_dir, result):
        limit = min(upload.limit, files_left) if upload.name.startswith(FILES + "/") else upload.limit
        why = _put_file(store, spec.id, upload.name, upload.path, limit, digests)
        if why is None:
            if upload.name.startswith(FILES + "/"):
                files_left -= _size(upload.path)
        else:
            refused.append({"name": upload.name, "reason": why})
    if digests:
        result.setdefault("artifacts", {})["digests"] = digests
    return refused


def store_result(store: JobAttachments, job_id: str, result: dict[str, Any]) -> bool:
    """result.json into the store; if it is refused, the job fails saying so (the caller then records that end).
    False when it is not stored."""
    why = _put_bytes(store, job_id, RESULT, result_bytes(result))
    if why is None:
        return True
    _fail(result, f"result.json not stored in the job store: {why}")
    if _put_bytes(store, job_id, RESULT, result_bytes(result)) is None:   # a smaller one may pass its limit
        return True
    return False


def upload_transcript(store: JobAttachments, job_id: str, job_dir: str, attempt: int) -> str | None:
    """An attempt that ends without ending the job (handed back, or taken over by another worker): its transcript is
    kept in the store as session.attempt-N.jsonl, beside the one of the attempt that finishes the job. Its digest,
    or None when it was not stored."""
    path = os.path.join(job_dir, SESSION)
    digests: dict[str, str] = {}
    name = f"session.attempt-{attempt}.jsonl"
    if _regular(path) and _put_file(store, job_id, name, path, ARTIFACT_LIMIT, digests) is None:
        return digests[name]
    return None


class TranscriptSync:
    """While an attempt runs, its transcript goes to the store now and then as session.attempt-N.jsonl, so that a
    worker killed mid-job (SIGKILL, a machine lost) still leaves the attempt's transcript to the client. A copy is
    made when the file has grown by a quarter since the last one (at most every MIN_INTERVAL_S), and a loss costs at
    most its last quarter. Each copy's blob goes once the next one is stored (a long job's copies together came to
    five times its transcript, kept for the whole retention). The attempt's own end keeps the last copy (handed
    back) or discards it (the job's session.jsonl is the same transcript)."""

    MIN_INTERVAL_S = 5.0
    GROWTH = 1.25

    def __init__(self, store: JobAttachments, job_id: str, job_dir: str, attempt: int) -> None:
        self.store, self.job_id, self.job_dir, self.attempt = store, job_id, job_dir, attempt
        self.name = f"session.attempt-{attempt}.jsonl"
        self._synced = 0
        self._digest: str | None = None   # the copy in the store now
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pid-transcript-sync", daemon=True)

    def start(self) -> "TranscriptSync":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def discard(self) -> None:
        """The attempt ended the job, whose session.jsonl holds this transcript: the copy goes, and its blob unless
        session.jsonl is the very same bytes. After stop(). Never raises."""
        try:
            self.store.delete_artifact(self.job_id, self.name)
        except Exception as exc:   # a copy left behind ages out with the retention
            log.info("job %s: cannot discard %s: %s", self.job_id, self.name, exc)
            return
        self.stored(None)

    def _run(self) -> None:
        while not self._stop.wait(self.MIN_INTERVAL_S):
            size = _size(os.path.join(self.job_dir, SESSION))
            if size > 0 and size >= self._synced * self.GROWTH:
                digest = upload_transcript(self.store, self.job_id, self.job_dir, self.attempt)
                if digest is not None:
                    self.stored(digest)
                self._synced = size

    def stored(self, digest: str | None) -> None:
        """A newer copy is in the store (None: none is needed any more): the older one's blob goes. Never raises."""
        old, self._digest = self._digest, digest
        if old is not None and old != digest:
            try:
                self.store.drop_own_blob(self.job_id, old)
            except Exception as exc:   # the store unreachable: that copy ages out with the retention instead
                log.info("job %s: cannot drop an older copy of its transcript: %s", self.job_id, exc)


def _put_file(store: JobAttachments, job_id: str, name: str, path: str, limit: int,
              digests: dict[str, str] | None = None) -> str | None:
    """None when stored (its digest then in `digests`), else why not (one line)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            digest = store.put_artifact(job_id, name, f, limit)
        if digests is not None:
            digests[name] = digest
        return None
    except TooLarge:
        return f"larger than its limit of {limit} bytes"
    except Exception as exc:   # the store unreachable, the file gone: said in the result, never a crash
        log.warning("job %s: storing artifact %s: %s", job_id, name, exc)
        return _one_line(exc)


def _put_bytes(store: JobAttachments, job_id: str, name: str, data: bytes) -> str | None:
    try:
        store.put_artifact(job_id, name, io.BytesIO(data), ARTIFACT_LIMIT)
        return None
    except TooLarge:
        return f"larger than its limit of {ARTIFACT_LIMIT} bytes"
    except Exception as exc:
        log.warning("job %s: storing artifact %s: %s", job_id, name, exc)
        return _one_line(exc)


def _fail(result: dict[str, Any], problem: str) -> None:
    """A completed job with missing artifacts has failed (artifact_error); any other ending keeps its own reason,
    and the problem is added to its error."""
    if result.get("status") == "completed":
        result["exit_reason"] = "artifact_error"
        result["status"] = status_of("artifact_error")
        result["error"] = problem
    else:
        result["error"] = f"{result['error']}; {problem}" if result.get("error") else problem


def _regular(path: str) -> bool:
    try:
        import stat
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _size(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


# -- the client's side -------------------------------------------------------------------------------------------

def read_result(store: JobAttachments, job_id: str, wait_s: float = 0.0) -> dict[str, Any] | None:
    """The job's result.json from the store, or None if it has none (waiting up to wait_s for one: a job ended
    by a sweep or a cancel gets it just after its end is recorded)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            data = _read_all(store.open_artifact(job_id, RESULT), RESULT_READ_LIMIT)
        except BlobMissing:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.2)
            continue
        try:
            result = json.loads(data)
        except ValueError as exc:
            raise DownloadError(f"job {job_id}: its result.json in the job store is not JSON ({exc})") from None
        if not isinstance(result, dict):
            raise DownloadError(f"job {job_id}: its result.json in the job store is not a JSON object")
        return result


def stored_result_bytes(store: JobAttachments, job_id: str) -> bytes | None:
    try:
        return _read_all(store.open_artifact(job_id, RESULT), RESULT_READ_LIMIT)
    except BlobMissing:
        return None


def _read_all(chunks: Iterator[bytes], limit: int) -> bytes:
    data = bytearray()
    for chunk in chunks:
        data += chunk
        if len(data) > limit:
            raise DownloadError(f"result.json is larger than {limit} bytes: not one pid wrote")
    return bytes(data)


def check_name(name: str) -> list[str]:
    """An artifact's name as path components under the download directory; DownloadError for one that could
    leave it (absolute, `..`) or is not a plain relative path."""
    parts = name.split("/")
    if (not name or "\0" in name or name.startswith("/") or any(p in ("", ".", "..") for p in parts)
            or parts[0] == MARKER or ".pid-tmp-" in parts[-1]):
        raise DownloadError(f"the job store names an artifact {name[:100]!r}, which is not a safe relative path: "
                            "nothing was written for it")
    return parts


def already_local(store: JobAttachments, job_id: str, job_dir: str) -> bool:
    """The job's directory here already holds the result the store has (a worker that shares this machine's
    filesystem wrote it): nothing to download."""
    stored = stored_result_bytes(store, job_id)
    if stored is None:
        return False
    try:
        fd = os.open(os.path.join(job_dir, RESULT), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            return f.read(len(stored) + 1) == stored
    except OSError:
        return False


def download(store: JobAttachments, job_id: str, dest: str, own: bool = False) -> list[str]:
    """Every artifact of the job into `dest` (created 0700 if missing); returns the names written. `own`: dest is
    the job's own out directory, written into whatever it holds. Otherwise a non-empty dest must be this job's
    earlier download. DownloadError (one line) when nothing or not everything could be written."""
    names = store.artifact_names(job_id)
    if RESULT not in names:
        raise DownloadError(f"job {job_id} has no artifacts in the job store (expired after the retention period, "
                            "or it ended before pid stored them)" if not names else
                            f"job {job_id} has no result.json in the job store yet")
    checked = {name: check_name(name) for name in names}
    root = _open_dest(dest, job_id, own)
    try:
        _write_file(root, [MARKER], dest, iter([job_id.encode() + b"\n"]))
        for name in sorted(names, key=lambda n: (n == RESULT, n)):   # result.json last
            try:
                chunks = store.open_artifact(job_id, name)
                _write_file(root, checked[name], dest, chunks)
            except BlobMissing:
                raise DownloadError(f"job {job_id}: artifact {name} is no longer in the job store (expired?)"
                                    ) from None
        os.unlink(MARKER, dir_fd=root)
    finally:
        os.close(root)
    mark(dest)   # (pid's output: no workspace packed around it takes it in)
    return names


def _open_dest(dest: str, job_id: str, own: bool) -> int:
    """The download directory, opened (created 0700 if missing); DownloadError if it is not a directory, or holds
    something other than this job's earlier download."""
    try:
        os.makedirs(dest, mode=0o700, exist_ok=True)
        fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise DownloadError(f"{dest}: cannot make or open the directory ({exc.strerror or exc})") from None
    try:
        if own or not os.listdir(fd) or _is_download_of(fd, job_id):
            return fd
    except OSError as exc:
        os.close(fd)
        raise DownloadError(f"{dest}: cannot read the directory ({exc.strerror or exc})") from None
    os.close(fd)
    raise DownloadError(f"{dest} is not empty and holds no earlier download of job {job_id}: nothing was "
                        "overwritten (choose a new or empty directory)")


def _is_download_of(fd: int, job_id: str) -> bool:
    """The directory holds this job's download: its result.json, or the marker of an interrupted one."""
    for name in (MARKER, RESULT):
        try:
            f = os.fdopen(os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd), "rb")
        except OSError:
            continue
        with f:
            data = f.read(RESULT_READ_LIMIT)
        if name == MARKER and data.strip() == job_id.encode():
            return True
        if name == RESULT:
            try:
                if json.loads(data).get("id") == job_id:
                    return True
            except (ValueError, AttributeError):
                pass
    return False


def _write_file(root: int, parts: list[str], dest: str, chunks: Iterator[bytes]) -> None:
    """Write one file at parts (under the opened root): its directories made 0700 and opened without following a
    symlink; the file written under a temporary name, then renamed over what was there (a symlink there is
    replaced, not followed)."""
    shown = os.path.join(dest, *parts)
    fds: list[int] = []
    here = root
    try:
        for part in parts[:-1]:
            try:
                os.mkdir(part, 0o700, dir_fd=here)
            except FileExistsError:
                pass
            try:
                here = os.open(part, _OPEN_DIR, dir_fd=here)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise DownloadError(f"{shown}: {part} is a symlink or not a directory there; not followed, "
                                        "nothing written") from None
                raise
            fds.append(here)
        tmp = f".{parts[-1][:100]}.pid-tmp-{secrets.token_hex(4)}"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                      0o600, dir_fd=here)
        try:
            with os.fdopen(out, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
            os.replace(tmp, parts[-1], src_dir_fd=here, dst_dir_fd=here)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=here)
            except OSError:
                pass
            raise
    except OSError as exc:
        raise DownloadError(f"{shown}: cannot write it ({exc.strerror or exc})") from None
    finally:
        for fd in fds:
            os.close(fd)
