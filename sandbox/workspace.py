"""Moving files between host and container without the host ever interpreting them.

Host side rules: never follow a symlink, never run git, never write outside the destination. Tar streams go
through temporary files or are read incrementally, so memory stays small whatever the size of a repository.

A workspace tar may come from another machine (`pid submit` packs it on the client): it is unpacked member by member
under checks (unpack_tar), never trusted.
"""
from __future__ import annotations

import hashlib
import os
import re
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from typing import IO
from urllib.parse import urlsplit

# The base commit and the patch are made by pid, as root, with git state the agent cannot reach: a repository in
# /.pid/git (root, 0700) whose work tree is the workspace; the workspace's own .git is just files to it (git never
# looks into a path component named .git). Configuration comes only from /.pid/gitconfig and the command line: no
# hooks, no fsmonitor, no filters, textconv or external diff; attributes in the workspace cannot convert content
# (info/attributes outranks every .gitattributes).
_GIT_ENV = ("export GIT_DIR=/.pid/git GIT_WORK_TREE={workdir} GIT_CONFIG_GLOBAL=/.pid/gitconfig GIT_CONFIG_NOSYSTEM=1 "
            "HOME=/.pid GIT_TERMINAL_PROMPT=0 GIT_OPTIONAL_LOCKS=0 LC_ALL=C\n"
            "git() {{ command git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.untrackedCache=false "
            "-c core.excludesFile=/dev/null -c core.attributesFile=/dev/null "
            "-c commit.gpgsign=false -c user.name=pid -c user.email=pid@localhost \"$@\"; }}\n")

_GITCONFIG = """[safe]
\tdirectory = *
[core]
\thooksPath = /dev/null
\tfsmonitor = false
\tautocrlf = false
\tquotePath = true
[gc]
\tauto = 0
"""


def base_script(workdir: str) -> str:
    """Make pid's repository and commit the imported workspace as the base; prints the commit.

    It runs before the first model request, so it forks little: the config is written by a builtin, the repository
    gets no template (sample hooks pid never runs), and the commit id is read from its ref rather than by git.
    """
    assert "'" not in _GITCONFIG
    return (_GIT_ENV.format(workdir=workdir) + "set -e\numask 077\n"
            f"printf '%s' '{_GITCONFIG}' > /.pid/gitconfig\n"
            "git init -q -b main --template=\n"
            "mkdir -p /.pid/git/info\n"
            "echo '* -text -filter -ident -eol !diff -working-tree-encoding' > /.pid/git/info/attributes\n"
            "git add -A\n"
            "git commit -q --no-verify --allow-empty -m 'pid: base (workspace as imported)'\n"
            "read -r head < /.pid/git/refs/heads/main\n"
            "echo \"$head\"\n")


def patch_script(workdir: str, base: str, dest: str) -> str:
    """Write the workspace's changes since `base` (new and binary files too) as a patch to `dest`."""
    if not re.fullmatch(r"[0-9a-f]{40,64}", base):
        raise ValueError(f"not a commit id: {base!r}")
    return (_GIT_ENV.format(workdir=workdir) + "set -e\numask 077\n"
            "git add -A\n"
            "git -c diff.noprefix=false -c diff.mnemonicPrefix=false diff --cached --binary --no-color --no-ext-diff "
            f"--no-textconv --no-renames --src-prefix=a/ --dst-prefix=b/ {base} -- > {dest}\n")


GIT_SCHEMES = ("https", "http", "ssh", "git", "file")
_REF_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/+@-]{0,254}")


def check_git_source(url: str, ref: str | None) -> None:
    """Raise ValueError unless `url` is a git URL pid clones (scheme, no spaces or option-like parts) and `ref` a
    plain ref name or commit id (None: the default branch)."""
    parts = urlsplit(url)
    if parts.scheme not in GIT_SCHEMES or re.search(r"[\s\x00-\x1f]", url) or url.startswith("-"):
        raise ValueError(f"not a git URL pid clones ({', '.join(s + '://' for s in GIT_SCHEMES)}): {url!r}")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ValueError(f"a file:// URL names a path on the worker (file:///path): {url!r}")
    elif not parts.hostname or parts.hostname.startswith("-"):
        raise ValueError(f"no host in {url!r}")
    if ref is not None and (not _REF_RE.fullmatch(ref) or ".." in ref or ref.endswith((".lock", "/", "."))):
        raise ValueError(f"not a branch, tag or commit id: {ref!r}")


class WorkspaceTooLarge(Exception):
    """The packed workspace would pass its size limit (nothing usable was written)."""


class UnsafeTar(tarfile.TarError):
    """A workspace tar holds a member pid will not unpack (the whole import fails; the message names it)."""


@dataclass
class Packed:
    digest: str    # "sha256:<hex>" of the tar's bytes
    size: int      # bytes


def build_tar(root: str, uid: int = 0, gid: int = 0) -> IO[bytes]:
    """A tar of the directory `root` in a temporary file (rewound), every entry owned by uid:gid (the agent's): links
    stored as links, special files skipped (see pack_tar)."""
    spool = tempfile.TemporaryFile(prefix="pid-import-")
    pack_tar(root, spool, uid, gid)
    spool.seek(0)
    return spool


def pack_tar(root: str, out: IO[bytes], uid: int = 0, gid: int = 0, max_bytes: int = 0) -> Packed:
    """Write a tar of the directory `root` to `out` as a stream, hashing it as it goes; at most `max_bytes` (0: no
    limit, else WorkspaceTooLarge as soon as it is passed).

    Every entry of the tree: links stored as links (never followed), special files skipped, no git run. Regular
    files are opened with O_NOFOLLOW, so a file swapped for a symlink meanwhile is never followed. Deterministic:
    members in sorted order, owned by uid:gid with no names, whole-second mtimes, so the same tree gives the same
    bytes (and the same digest: a hundred jobs on one tree store it once).
    """
    root = os.path.abspath(root)
    if not os.path.isdir(root) or os.path.islink(root):
        raise NotADirectoryError(f"not a directory: {root}")
    sink = _HashingSink(out, max_bytes)
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                _add(tar, os.path.join(dirpath, name), os.path.relpath(os.path.join(dirpath, name), root), uid, gid)
    return Packed(f"sha256:{sink.hash.hexdigest()}", sink.size)


class _HashingSink:
    """A write-only stream that hashes, counts and bounds what passes to `out`."""

    def __init__(self, out: IO[bytes], max_bytes: int) -> None:
        self.out, self.max_bytes = out, max_bytes
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.max_bytes and self.size > self.max_bytes:
            raise WorkspaceTooLarge(f"larger than {self.max_bytes} bytes once packed")
        self.hash.update(data)
        self.out.write(data)
        return len(data)

    def close(self) -> None:
        pass


def _owned(info: tarfile.TarInfo, uid: int, gid: int) -> tarfile.TarInfo:
    info.uid, info.gid = uid, gid
    info.uname = info.gname = ""
    info.mtime = int(info.mtime)
    return info


def _add(tar: tarfile.TarFile, path: str, arcname: str, uid: int, gid: int) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return  # vanished since the walk
    if stat.S_ISREG(st.st_mode):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            return  # vanished or swapped for a link since the walk: skip it
        with os.fdopen(fd, "rb") as fileobj:
            info = tar.gettarinfo(arcname=arcname, fileobj=fileobj)
            if info.isreg() or info.islnk():
                tar.addfile(_owned(info, uid, gid), fileobj if info.isreg() else None)
    elif stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode):
        try:
            tar.addfile(_owned(tar.gettarinfo(path, arcname=arcname), uid, gid))
        except FileNotFoundError:
            return
    # sockets, FIFOs and devices are not part of a workspace


# -- unpacking a tar pid did not necessarily make ------------------------------------------------------------------
def printable(name: str, limit: int = 300) -> str:
    """A member name fit for a one-line message: control characters escaped, bounded."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)
    return text if len(text) <= limit else text[:limit] + "…"


class MemberCheck:
    """The rules every member of a workspace tar must pass, as a tarfile extraction filter.

    Regular files, directories, symlinks and hard links only (no devices, FIFOs); relative names without '..'; each
    name once; nothing below a link or a file of the same tar (so no write goes through a link); a hard link only to
    a regular file unpacked before it. Symlinks are stored as they are, whatever they point at: they are links inside
    the sandbox, never followed by pid. Owners become uid:gid; modes lose setuid, setgid and sticky bits. Unpacked
    into an empty directory, these rules alone keep every write below it (nothing else is there to lead elsewhere).
    """

    def __init__(self, uid: int, gid: int) -> None:
        self.uid, self.gid = uid, gid
        self.kinds: dict[str, str] = {}   # name -> "dir" | "implicit" | "file" | "link"

    def __call__(self, member: tarfile.TarInfo, path: str = "") -> tarfile.TarInfo | None:
        name = self._name(member.name, member.name)
        if name is None:
            return None                       # the root directory itself ("." or "./")
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            raise UnsafeTar(f"{printable(member.name)}: not a regular file, directory or link")
        parts = name.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            kind = self.kinds.setdefault(parent, "implicit")
            if kind not in ("dir", "implicit"):
                raise UnsafeTar(f"{printable(member.name)}: below a {kind}, not a directory")
        seen = self.kinds.get(name)
        if seen is not None and not (seen == "implicit" and member.isdir()):
            raise UnsafeTar(f"{printable(member.name)}: appears twice")
        changes: dict = {}
        if member.islnk():
            target = self._name(member.linkname, member.name)
            if target is None or self.kinds.get(target) != "file":
                raise UnsafeTar(f"{printable(member.name)}: a hard link to {printable(member.linkname)}, which is "
                                f"not a regular file before it in the archive")
            changes["linkname"] = target
        self.kinds[name] = "dir" if member.isdir() else "link" if member.issym() else "file"
        return member.replace(name=name, uid=self.uid, gid=self.gid, uname="", gname="", mode=member.mode & 0o777,
                              deep=False, **changes)

    def _name(self, raw: str, member: str) -> str | None:
        if raw.startswith("/") or "\0" in raw:
            raise UnsafeTar(f"{printable(member)}: an absolute path")
        parts = [p for p in raw.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise UnsafeTar(f"{printable(member)}: a path with '..'")
        return "/".join(parts) or None


def unpack_tar(stream: IO[bytes], dest: str, uid: int, gid: int) -> None:
    """Unpack a workspace tar, read as a stream (never whole in memory, never seeked), into the empty host directory
    `dest`, every member checked by MemberCheck just before it is written (the caller is root: owners become
    uid:gid). Raises UnsafeTar (or tarfile.TarError for a broken archive, OSError for the disk)."""
    if os.listdir(dest):   # MemberCheck's rules hold only for an empty destination (no link of someone else's)
        raise UnsafeTar(f"{dest} is not empty")
    check = MemberCheck(uid, gid)
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        if hasattr(tarfile, "data_filter"):   # Python >= 3.11.4: extraction filters
            tar.extractall(dest, numeric_owner=True, filter=check)
            return
        for member in tar:   # older (Debian bookworm's 3.11.2): the same check, member by member
            info = check(member, dest)
            if info is not None:
                tar.extract(info, dest, numeric_owner=True)


def sanitize_tar(stream: IO[bytes], out: IO[bytes], uid: int, gid: int) -> None:
    """Copy a workspace tar to `out` keeping only what MemberCheck lets through, as checked: for a destination pid
    cannot write itself (the engine unpacks it inside the container). Raises UnsafeTar like unpack_tar."""
    check = MemberCheck(uid, gid)
    with tarfile.open(fileobj=stream, mode="r|") as src, \
            tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as dst:
        for member in src:
            info = check(member)
            if info is not None:
                dst.addfile(info, src.extractfile(member) if info.isreg() else None)
