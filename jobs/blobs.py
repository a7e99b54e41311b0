"""Content-addressed blobs: a job's workspace tar goes in at submit and comes out on the worker, by its digest.

Code uses the `Blobs` Protocol and gets the implementation from `default_blobs()`, the one place that chooses it
(the job store's: shared by every machine that shares the store). A digest is "sha256:<64 hex>",
the hash of the blob's bytes, so a hundred jobs on one tree store it once (has() first), and a blob is never
rewritten: a reader sees the whole of it or nothing.
"""
from __future__ import annotations

import io
import re
from typing import BinaryIO, Protocol

from pid.sandbox.artifacts import ChunkReader
from pid.jobs.store import BlobMissing, BlobStore, default_store

__all__ = ["BlobCorrupt", "BlobMissing", "Blobs", "StoreBlobs", "default_blobs", "hex_of"]

DIGEST_RE = re.compile(r"sha256:([0-9a-f]{64})")
CHUNK = 1 << 20


class BlobCorrupt(ValueError):
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


class StoreBlobs:
    """The job store's blobs as `Blobs`: files beside the SQLite database (jobs/sqlite_store.py), or chunks in Redis
    (jobs/redis_store.py), so a workspace packed on one machine is read on another through the store both use."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store

    def has(self, digest: str) -> bool:
        hex_of(digest)
        return self.store.has_blob(digest)

    def put_file(self, path: str, digest: str) -> None:
        hex_of(digest)
        try:
            self.store.put_blob_file(path, digest)
        except ValueError as exc:
            raise BlobCorrupt(f"{path} does not hash to {digest}") from exc

    def open(self, digest: str) -> BinaryIO:
        hex_of(digest)
        return io.BufferedReader(ChunkReader(self.store.open_blob(digest)), CHUNK)


def default_blobs() -> Blobs:
    """The blob store this installation uses: the job store's."""
    return StoreBlobs(default_store())
