"""The base snapshot's git objects and index, written while the workspace is unpacked (no second pass over it).

Why: `git add -A` over 10,000 files re-reads every file and writes 10,000 loose objects, 2-3 s on this VM, before
the agent's first command. The unpacker holds each file's bytes anyway: hashing them is ~3 µs, and it can write
their blobs into one pack and an index whose stat data is the files' own (so git finds them clean without reading
them). pid's git then only drops what the workspace's .gitignore files ignore and commits (base_seeded_script).

The pack's objects are stored, not compressed: deflate would cost more than the rest of the unpacking, and the
pack lives only on the job's disk for the job's life. Disk: the pack holds the workspace's size again, and while a
deferred pack is written the tar is spooled there too (the workspace three times at the peak, each at most
--max-workspace; `git add -A`'s compressed objects took about a third).

A tree git itself would not add as plain files (a nested repository, a name git refuses such as `.GIT` or
`git~1`) makes the seed `unusable`: the caller records the base the slow way, with git doing all of it.
"""
from __future__ import annotations

import hashlib
import os
import struct
import zlib
from typing import IO, Callable

_BLOB = 3
_FINAL = struct.Struct("<BHH").pack
_ADLER = struct.Struct(">I").pack


def _stat_fields(st: os.stat_result) -> tuple[int, ...]:
    m = 0xFFFFFFFF
    return (int(st.st_ctime) & m, st.st_ctime_ns % 1_000_000_000, int(st.st_mtime) & m,
            st.st_mtime_ns % 1_000_000_000, st.st_dev & m, st.st_ino & m, st.st_uid & m, st.st_gid & m,
            st.st_size & m)


def _refused_name(part: bytes) -> bool:
    """A path component git's own add would not take as a plain file of this tree."""
    low = part.lower()
    return low.rstrip(b". ") == b".git" or low.startswith(b"git~")


class GitSeed:
    """Collects blobs and index entries as files are written; write() puts the index (and the pack) in a git dir.

    `deferred`: blobs are only hashed while unpacking; the pack is written later by fill(), from the same tar read
    again, once the agent has started (the base commit is made without its blobs: `write-tree --missing-ok`).
    Nothing reads a base blob before the patch is made, and the patch waits for fill().
    """

    def __init__(self, git_dir: str, deferred: bool = False) -> None:
        """`git_dir`: pid's repository-to-be, with objects/pack in it (the caller makes them)."""
        self.git_dir = git_dir
        self.deferred = deferred
        self.pack_path = os.path.join(git_dir, "objects", "pack", "tmp_pack_pid")
        self._pack: IO[bytes] | None = None
        if not deferred:
            self._open_pack()
        self._offset = 12
        self._objects: dict[bytes, tuple[int, int]] = {}   # sha -> (crc32, offset)
        self.entries: dict[bytes, tuple[int, bytes, os.stat_result]] = {}   # name -> (mode, blob id, stat)
        self.unusable: str | None = None   # why git must make the base itself
        self._relinked = False   # a hard link changed an inode's ctime after it was recorded: restat at the end

    def _open_pack(self) -> None:
        self._pack = open(self.pack_path, "xb", buffering=0)   # (whole records in one system call each)
        self._pack.write(b"PACK" + struct.pack(">II", 2, 0))   # the count is set when it is finished

    # -- while unpacking -------------------------------------------------------------------------------------
    def check_name(self, name: bytes, is_dir: bool) -> bool:
        """Whether a member named so goes into the index (the workspace's own top-level .git does not). A name git
        would treat otherwise makes the seed unusable."""
        if name == b".git" or name.startswith(b".git/"):
            return False
        if self.unusable is None and b"git" in name.lower() and any(_refused_name(p) for p in name.split(b"/")):
            self.unusable = f"a path git treats specially: {name[:200]!r}"
        return not is_dir

    def blob(self, data: bytes) -> bytes:
        """Store `data` as a blob object (once) and return its id."""
        size = len(data)
        sha = hashlib.sha1(b"blob %d\0" % size)
        sha.update(data)
        digest = sha.digest()
        if not self.deferred and digest not in self._objects:
            self._store(data, digest)
        return digest

    def _store(self, data: bytes, digest: bytes) -> None:
        """`data` into the pack as blob `digest` (stored deflate blocks)."""
        size = len(data)
        if size > 65535:
            writer = _BlobWriter(self, size)
            writer.update(data)
            writer.finish()
            return
        head = _object_header(_BLOB, size) + b"\x78\x01" + _FINAL(1, size, size ^ 0xFFFF)
        tail = _ADLER(zlib.adler32(data))
        self._objects[digest] = (zlib.crc32(tail, zlib.crc32(data, zlib.crc32(head))), self._offset)
        assert self._pack is not None
        _write_all(self._pack.fileno(), [head, data, tail])
        self._offset += len(head) + size + 4

    def blob_writer(self, size: int) -> "_BlobWriter | _BlobHasher":
        """A blob of `size` bytes, given in pieces (update) as they stream past; finish() returns its id."""
        return _BlobHasher(size) if self.deferred else _BlobWriter(self, size)

    def file(self, name: bytes, sha: bytes, st: os.stat_result) -> None:
        self.entries[name] = (0o100755 if st.st_mode & 0o100 else 0o100644, sha, st)

    def symlink(self, name: bytes, sha: bytes, st: os.stat_result) -> None:
        """A symbolic link whose target was stored as blob `sha`."""
        self.entries[name] = (0o120000, sha, st)

    def hard_link(self, name: bytes, target: bytes) -> None:
        """`name` is a second name of `target`'s inode: the same blob (stat'ed again at the end: a link changes the
        inode's ctime)."""
        entry = self.entries.get(target)
        if entry is not None:
            self.entries[name] = entry
            self._relinked = True

    # -- at the end -----------------------------------------------------------------------------------------
    def discard(self) -> None:
        """Not used after all: its temporary pack goes."""
        if self._pack is not None:
            self._pack.close()
        try:
            os.unlink(self.pack_path)
        except FileNotFoundError:
            pass

    def write(self, restat: Callable[[bytes], os.stat_result]) -> None:
        """Write the index (and, unless deferred, finish the pack). `restat(name)` stats a workspace file again
        without following links."""
        if self._relinked:
            for name, (mode, sha, _) in self.entries.items():
                if mode != 0o120000:
                    self.entries[name] = (mode, sha, restat(name))
        if not self.deferred:
            self._finish_pack()
        _write_new(os.path.join(self.git_dir, "index"), _index(self.entries))

    def fill(self, stream: IO[bytes]) -> None:
        """A deferred seed's pack: every blob the index names, read from the workspace tar again (its names are
        not used: only contents and link targets are)."""
        from .tarstream import REG, SYM, TarReader
        needed = {sha for _, sha, _ in self.entries.values()}
        self._open_pack()
        reader = TarReader(stream)
        for member in reader:
            if member.kind == REG and member.size > 1 << 20:
                writer = _BlobWriter(self, member.size, needed)   # (dropped again unless needed and new)
                for chunk in reader.chunks():
                    writer.update(chunk)
                writer.finish()
                continue
            if member.kind == REG:
                data = reader.content()
            elif member.kind == SYM:
                data = member.linkname
            else:
                continue
            sha = hashlib.sha1(b"blob %d\0" % len(data))
            sha.update(data)
            digest = sha.digest()
            if digest in needed and digest not in self._objects:
                self._store(data, digest)
        self._finish_pack()

    def _finish_pack(self) -> None:
        """The pack's object count and trailer, then its .idx: from then on git sees its objects."""
        assert self._pack is not None
        self._pack.seek(8)
        self._pack.write(struct.pack(">I", len(self._objects)))
        self._pack.close()
        trailer = hashlib.sha1()
        with open(self.pack_path, "rb") as f:
            while chunk := f.read(1 << 20):
                trailer.update(chunk)
        pack_sha = trailer.digest()
        with open(self.pack_path, "ab") as f:
            f.write(pack_sha)
        name = os.path.join(self.git_dir, "objects", "pack", f"pack-{pack_sha.hex()}")
        _write_new(name + ".idx", _idx(self._objects, pack_sha))
        os.replace(self.pack_path, name + ".pack")


class _BlobHasher:
    """A deferred seed's blob_writer: the id only."""

    def __init__(self, size: int) -> None:
        self.sha = hashlib.sha1(b"blob %d\0" % size)

    def update(self, data: bytes) -> None:
        self.sha.update(data)

    def finish(self) -> bytes:
        return self.sha.digest()


class _BlobWriter:
    """One blob appended to the pack as stored deflate blocks, hashed as it goes; dropped again if the pack has it."""

    def __init__(self, seed: GitSeed, size: int, needed: set[bytes] | None = None) -> None:
        self.seed, self.size, self.needed = seed, size, needed
        self.sha = hashlib.sha1(b"blob %d\0" % size)
        self.adler = 1
        self.left = size
        self.pending = b""
        head = _object_header(_BLOB, size) + b"\x78\x01"
        self.crc = zlib.crc32(head)
        self.written = len(head)
        assert seed._pack is not None
        seed._pack.write(head)
        if size == 0:
            self._block(b"", True)

    def _block(self, data: bytes, final: bool) -> None:
        frame = struct.pack("<BHH", 1 if final else 0, len(data), len(data) ^ 0xFFFF)
        self.crc = zlib.crc32(data, zlib.crc32(frame, self.crc))
        pack = self.seed._pack
        assert pack is not None
        pack.write(frame)
        pack.write(data)
        self.written += 5 + len(data)

    def update(self, data: bytes) -> None:
        if len(data) > self.left:
            raise ValueError("more bytes than the blob's size")
        self.left -= len(data)
        self.sha.update(data)
        self.adler = zlib.adler32(data, self.adler)
        if self.pending:
            data = self.pending + data
        while len(data) >= 65535 or (data and not self.left):
            block, data = data[:65535], data[65535:]
            self._block(block, not self.left and not data)
        self.pending = data

    def finish(self) -> bytes:
        if self.left:
            raise ValueError("fewer bytes than the blob's size")
        tail = struct.pack(">I", self.adler)
        self.crc = zlib.crc32(tail, self.crc)
        assert self.seed._pack is not None
        self.seed._pack.write(tail)
        self.written += 4
        digest = self.sha.digest()
        seed = self.seed
        assert seed._pack is not None
        if digest in seed._objects or (self.needed is not None and digest not in self.needed):   # (not kept)
            seed._pack.seek(seed._offset)
            seed._pack.truncate()
        else:
            seed._objects[digest] = (self.crc, seed._offset)
            seed._offset += self.written
        return digest


def _object_header(kind: int, size: int) -> bytes:
    out = bytearray()
    byte = (kind << 4) | (size & 0x0F)
    size >>= 4
    while size:
        out.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    out.append(byte)
    return bytes(out)


def _idx(objects: dict[bytes, tuple[int, int]], pack_sha: bytes) -> bytes:
    """A version 2 pack index."""
    shas = sorted(objects)
    fanout = [0] * 256
    for sha in shas:
        fanout[sha[0]] += 1
    total = 0
    for i in range(256):
        total += fanout[i]
        fanout[i] = total
    small: list[int] = []
    large: list[int] = []
    for sha in shas:
        offset = objects[sha][1]
        if offset < 0x80000000:
            small.append(offset)
        else:
            small.append(0x80000000 | len(large))
            large.append(offset)
    body = (b"\xfftOc" + struct.pack(">I", 2) + struct.pack(">256I", *fanout) + b"".join(shas)
            + struct.pack(f">{len(shas)}I", *(objects[s][0] for s in shas))
            + struct.pack(f">{len(shas)}I", *small) + struct.pack(f">{len(large)}Q", *large) + pack_sha)
    return body + hashlib.sha1(body).digest()


def _index(entries: dict[bytes, tuple[int, bytes, os.stat_result]]) -> bytes:
    """A version 2 index: entries sorted by name, each padded to 8 bytes."""
    parts = [b"DIRC" + struct.pack(">II", 2, len(entries))]
    pack = struct.Struct(">10I20sH").pack
    for name in sorted(entries):
        mode, sha, st = entries[name]
        ctime_s, ctime_ns, mtime_s, mtime_ns, dev, ino, uid, gid, size = _stat_fields(st)
        parts.append(pack(ctime_s, ctime_ns, mtime_s, mtime_ns, dev, ino, mode, uid, gid, size, sha,
                          min(len(name), 0xFFF)))
        parts.append(name + b"\0" * (8 - (62 + len(name)) % 8))
    body = b"".join(parts)
    return body + hashlib.sha1(body).digest()


def _write_all(fd: int, parts: list[bytes]) -> None:
    """writev, to the end (a regular file takes it whole; a short write is continued)."""
    total = sum(len(p) for p in parts)
    done = os.writev(fd, parts)
    if done < total:
        rest = b"".join(parts)[done:]
        while rest:
            rest = rest[os.write(fd, rest):]


def _write_new(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
