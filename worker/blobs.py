"""Content-addressed blobs: a job's workspace tar goes in at submit and comes out on the worker, by its digest.

Code uses the `Blobs` Protocol and gets the implementation from `default_blobs()`, the one place that chooses it
(today files under PID_HOME/blobs; a store shared between machines plugs in there). A digest is "sha256:<64 hex>",
the hash of the blob's bytes, so a hundred jobs on one tree store it once (has() first), and a blob is never
rewritten: a reader sees the whole of it or nothing.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
from typing import BinaryIO, Protocol

from pid.config import pid_home

DIGEST_RE = re.compile(r"sha256:([0-9a-f]{64})")
CHUNK = 1 << 20


class BlobMissing(Exception):
    """No blob with this digest (never stored, or expired)."""


class BlobCorrupt(Exception):
    """The bytes do not hash to the digest they were given under."""


class Blobs(Protocol):
    def has(self, digest: str) -> bool:
        """The blob is stored."""
        ...

    def put_file(self, path: str, digest: str) -> None:
        """Store the file at `path` under `digest` (checked: BlobCorrupt when its bytes hash to something else).
        Atomic: until it returns, readers see no blob at all."""
        ...

    def open(self, digest: str) -> BinaryIO:
        """The blob's bytes as a stream (the caller closes it); BlobMissing when there is none."""
        ...


def hex_of(digest: str) -> str:
    """The hex of a "sha256:<hex>" digest; ValueError for anything else (a digest names a path)."""
    match = DIGEST_RE.fullmatch(digest)
    if not match:
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return match.group(1)


class FileBlobs:
    """Blobs as files: ROOT/sha256/<2 hex>/<62 hex>, each written to a temporary file in ROOT and renamed."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _path(self, digest: str) -> str:
        hexd = hex_of(digest)
        return os.path.join(self.root, "sha256", hexd[:2], hexd[2:])

    def has(self, digest: str) -> bool:
        return os.path.isfile(self._path(digest))

    def put_file(self, path: str, digest: str) -> None:
        final = self._path(digest)
        os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".put-", dir=self.root)
        try:
            hasher = hashlib.sha256()
            with open(path, "rb") as src, os.fdopen(fd, "wb") as dst:
                while chunk := src.read(CHUNK):
                    hasher.update(chunk)
                    dst.write(chunk)
                dst.flush()
                os.fsync(dst.fileno())
            if f"sha256:{hasher.hexdigest()}" != digest:
                raise BlobCorrupt(f"{path} does not hash to {digest}")
            os.chmod(tmp, 0o400)
            os.replace(tmp, final)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def open(self, digest: str) -> BinaryIO:
        try:
            return open(self._path(digest), "rb")
        except FileNotFoundError:
            raise BlobMissing(f"no blob {digest}") from None


def default_blobs() -> Blobs:
    """The blob store this installation uses (the one line to change for another implementation)."""
    return FileBlobs(os.path.join(pid_home(), "blobs"))
