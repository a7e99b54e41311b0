"""Moving files between host and container without the host ever interpreting them.

Host side rules: never follow a symlink, never run git, never write outside the destination. Tar streams go
through temporary files or are read incrementally, so memory stays small whatever the size of a repository.

A workspace tar may come from another machine (`pid submit` packs it on the client): it is unpacked member by member
under checks (unpack_tar), never trusted.
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import shlex
import stat
import tarfile
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from typing import IO
from urllib.parse import urlsplit

from pid.output_dirs import is_marked
from pid.terminal import escaped

from . import tarstream
from .errors import SandboxError
from .gitseed import GitSeed

# The base commit and the patch are made by pid, as root, with git state the agent cannot reach: a repository in
# /.pid/git (root, 0700) whose work tree is the workspace; the workspace's own .git is just files to it (git never
# looks into a path component named .git). Configuration comes only from /.pid/gitconfig and the command line: no
# hooks, no fsmonitor, no filters, textconv or external diff; attributes in the workspace cannot convert content
# (info/attributes outranks every .gitattributes).
_GIT_FLAGS = ("-c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.untrackedCache=false "
              "-c core.excludesFile=/dev/null -c core.attributesFile=/dev/null")
_GIT_ENV = ("export GIT_DIR=/.pid/git GIT_WORK_TREE={workdir} GIT_CONFIG_GLOBAL=/.pid/gitconfig GIT_CONFIG_NOSYSTEM=1 "
            "HOME=/.pid GIT_TERMINAL_PROMPT=0 GIT_OPTIONAL_LOCKS=0 LC_ALL=C\n"
            f"git() {{{{ command git {_GIT_FLAGS} "
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


# What the agent's own runs generate is not part of the patch, whether or not the workspace ignores it: pid's default
# excludes (untracked files that match are left out of the base and the patch alike; a workspace's own .gitignore
# outranks them, `!node_modules/` there keeps those). Python's bytecode is never in the patch, whatever any ignore
# file says: a check's Python runs a .pyc whose source's size and time it matches, so a .pyc in the patch could pass
# a check on code that the diff shows unchanged.
GENERATED = ("__pycache__/", "'*.py[cod]'", ".pytest_cache/", ".mypy_cache/", ".ruff_cache/", "'*.egg-info/'",
             "node_modules/")
BYTECODE = ("**/__pycache__/**", "**/*.py[cod]")


def base_script(workdir: str, seeded: bool = False, deferred: bool = False) -> str:
    """Make pid's repository and commit the imported workspace as the base; prints the commit.

    It runs before the first model request, so it forks little: the config is written by a builtin, the repository
    gets no template (sample hooks pid never runs), and the commit id is read from its ref rather than by git.
    `seeded`: the unpacker already wrote the workspace's blobs and index (pid.sandbox.gitseed), with every file in it;
    git only drops what the workspace's .gitignore files ignore (as `git add -A` would not have added it) and
    commits, reading no file's content. `deferred`: the blobs are not there yet (gitseed.GitSeed.fill writes them
    later): the tree is written without them and the commit made from it.
    """
    assert "'" not in _GITCONFIG
    if seeded:
        add = ("git ls-files -z -c -i --exclude-standard > /.pid/git/pid-ignored\n"
               # (update-index, not `git rm --cached`: rm compares each entry with a file it looks up from the
               # current directory, /, not the workspace: an ignored etc/hostname failed the base)
               "if [ -s /.pid/git/pid-ignored ]; then git update-index --force-remove -z --stdin "
               "< /.pid/git/pid-ignored; fi\n"
               "rm -f /.pid/git/pid-ignored\n")
    else:
        add = "git add -A\n"
    return (_GIT_ENV.format(workdir=workdir) + "set -e\numask 077\n"
            f"printf '%s' '{_GITCONFIG}' > /.pid/gitconfig\n"
            "git init -q -b main --template=\n"
            "mkdir -p /.pid/git/info\n"
            "echo '* -text -filter -ident -eol !diff -working-tree-encoding' > /.pid/git/info/attributes\n"
            + add + _KEEP_TRACKED +
            # what the agent's runs generate is left out of the patch when new (GENERATED, from here on); a file the
            # workspace had is in the base, and diffed (bytecode never: BYTECODE, in patch_script)
            f"printf '%s\\n' {' '.join(GENERATED)} > /.pid/git/info/exclude\n"
            + (_COMMIT_DEFERRED if deferred else _COMMIT))


# A file the workspace's own repository tracks though its .gitignore matches it (a committed dist/, `git add -f`) is
# the project's, as git itself treats it: it stays in the base, and the patch carries the agent's changes to it
# (left out, they were lost without a word). Read from that repository's index alone (never its config or hooks),
# before the agent runs. (Bytecode stays out of the patch all the same: BYTECODE.)
_KEEP_TRACKED = (
    'theirs="$GIT_WORK_TREE/.git/index"\n'
    'if [ -f "$theirs" ] && [ ! -L "$GIT_WORK_TREE/.git" ] && [ ! -L "$theirs" ]; then\n'
    '  GIT_INDEX_FILE="$theirs" git ls-files -z -c -i --exclude-per-directory=.gitignore > /.pid/git/pid-kept '
    '2>/dev/null || : > /.pid/git/pid-kept\n'
    # (one entry update-index refuses, a tracked file now a directory, stops it whole: then each is tried alone)
    '  if [ -s /.pid/git/pid-kept ]; then git update-index --add --remove -z --stdin < /.pid/git/pid-kept '
    '2>/dev/null || { head -z -n 10000 /.pid/git/pid-kept | xargs -0 -r -n 1 git ' + _GIT_FLAGS + ' update-index '
    '--add --remove -- 2>/dev/null || true; }; fi\n'
    '  rm -f /.pid/git/pid-kept\n'
    'fi\n')


_COMMIT = ("git commit -q --no-verify --allow-empty -m 'pid: base (workspace as imported)'\n"
           "read -r head < /.pid/git/refs/heads/main\n"
           "echo \"$head\"\n")
_COMMIT_DEFERRED = ("tree=$(git write-tree --missing-ok)\n"
                    "head=$(git commit-tree \"$tree\" -m 'pid: base (workspace as imported)' < /dev/null)\n"
                    "git update-ref refs/heads/main \"$head\"\n"
                    "echo \"$head\"\n")


def patch_script(workdir: str, base: str, room: str, max_patch: int) -> str:
    """Write the workspace's changes since `base` (new and binary files too) as a patch to `room`/patch.diff.

    Everything git writes for it goes into `room` (a directory of root's on pid's own disk, see launch.PID_DISK): a
    copy of the base's index, and the objects of the changed files (the base's are read from pid's repository as
    alternates). pid's repository, on the job's disk that the agent may have filled to the last block and inode, is
    only read. The copy keeps the index's time (cp -p): git re-reads a file whose time is not older than its index's,
    as one that may have changed unseen in the second the index was written. The changed files' content goes into
    one pack (every non-empty file counts as "big": git streams those into a single pack as it adds), so the patch
    takes a few inodes however many files changed, and no file is read whole into memory.
    """
    if not re.fullmatch(r"[0-9a-f]{40,64}", base):
        raise ValueError(f"not a commit id: {base!r}")
    if not re.fullmatch(r"/[A-Za-z0-9_./-]+", room):
        raise ValueError(f"not a directory pid names: {room!r}")
    max_patch = int(max_patch)
    return (_GIT_ENV.format(workdir=workdir) + "set -e\numask 077\n"
            f"rm -rf {room}/objects {room}/index {room}/index.lock {room}/patch.diff\n"
            f"mkdir -p {room}/objects\n"
            f"if [ -f /.pid/git/index ]; then cp -p /.pid/git/index {room}/index; fi\n"
            f"export GIT_INDEX_FILE={room}/index GIT_OBJECT_DIRECTORY={room}/objects "
            "GIT_ALTERNATE_OBJECT_DIRECTORIES=/.pid/git/objects\n"
            # git cannot record a path longer than MAX_NAME, and would leave it out of the patch without a word
            f"too_long=$(find \"$GIT_WORK_TREE\" -path \"$GIT_WORK_TREE/.git\" -prune -o -regextype posix-extended "
            f"-regex '.{{{len(workdir.rstrip('/')) + MAX_NAME + 2},}}' -print -quit 2>/dev/null | head -c 200)\n"
            f"if [ -n \"$too_long\" ]; then echo \"a path of the workspace is longer than {MAX_NAME} bytes (git "
            "cannot record it in the patch): $too_long...\" >&2; exit 3; fi\n"
            # git opens every .gitignore and .gitattributes it meets (and .gitmodules, beside a new repository), and
            # would wait forever on a FIFO there
            "odd=$(find \"$GIT_WORK_TREE\" -path \"$GIT_WORK_TREE/.git\" -prune -o \\( -name .gitignore -o -name "
            ".gitattributes -o -name .gitmodules \\) \\( -type p -o -type c -o -type b \\) -print -quit 2>/dev/null "
            "| head -c 200)\n"
            "if [ -n \"$odd\" ]; then echo \"a .gitignore, .gitattributes or .gitmodules of the workspace is no "
            "regular file (git would wait on it forever): $odd...\" >&2; exit 3; fi\n"
            # git's binary diff of a file near 2 GiB or more is broken (2.39 fails on a malloc of a negative size;
            # past 4 GiB it writes a truncated patch and exits 0), and a sparse file that large takes no room but has
            # git read all of it first. So one over MAX_FILE that git would add fails the patch at once.
            + _big_new_files(room, max_patch) +
            "too_big=$(GIT_LITERAL_PATHSPECS=1 find \"$GIT_WORK_TREE\" -path \"$GIT_WORK_TREE/.git\" -prune -o "
            f"-type f -size +{MAX_FILE}c -exec git {_GIT_FLAGS} ls-files -m -o --exclude-standard -- {{}} + "
            f"2>/dev/null | grep -vxFf {room}/big.lines | head -c 200)\n"
            f"if [ -n \"$too_big\" ]; then echo \"a file of the workspace is over {MAX_FILE:,} bytes (git cannot "
            "write a patch of it): $too_big...\" >&2; exit 3; fi\n"
            # What git cannot record (a new repository with no commit yet, as `git init` or `cargo new` leave; a FIFO
            # or a device) is left out; git's words go to the host (unrecorded), which fails the patch on any others.
            # It reads them a line each: a name with a control character (a line break could forge a line) fails it,
            # whatever the file: git's errors name any file it could not add (an invalid path), and each of them
            # must be read as it is, never taken for one of the errors that leave a path out.
            f"if ! git -c core.bigFileThreshold=0 add -A --ignore-errors $spec 2>{room}/add.err; then\n"
            "  if [ -n \"$(find \"$GIT_WORK_TREE\" -path \"$GIT_WORK_TREE/.git\" -prune -o -name '*[[:cntrl:]]*' "
            f"-print 2>/dev/null | head -c 1)\" ]; then cat {room}/add.err >&2; exit 1; fi\n"
            f"  echo '{UNRECORDED_MARK}'; head -c {UNRECORDED_MAX + 1} {room}/add.err\n"
            "fi\n"
            # A new FIFO or socket git passes over without a word: listed (NUL-separated, a counted length), unless
            # the workspace's .gitignore files ignore it
            "find \"$GIT_WORK_TREE\" -path \"$GIT_WORK_TREE/.git\" -prune -o \\( -type p -o -type s -o -type c "
            f"-o -type b \\) -print0 2>/dev/null | head -z -n {SPECIAL_COUNT} > {room}/special 2>/dev/null || true\n"
            f"if [ -s {room}/special ]; then git check-ignore --no-index -z --stdin -n -v < {room}/special "
            f"2>/dev/null | head -c {SPECIAL_MAX} > {room}/special.v || true\n"
            f"  echo '{SPECIAL_MARK}' $(wc -c < {room}/special.v); cat {room}/special.v; fi\n"
            + _said_in_hex(BIG_MARK, f"{room}/big") +
            # A repository inside the workspace is one entry to pid's git (its commit): what changes in it is in no
            # patch. Named (from pid's index alone: git never runs in it, its config and hooks are the agent's).
            f"git -c core.quotePath=true ls-files -s | grep '^160000 ' | cut -f2- | head -n {NESTED_COUNT} "
            f"> {room}/nested 2>/dev/null || true\n"
            + _said_in_hex(NESTED_MARK, f"{room}/nested") +
            "git -c diff.noprefix=false -c diff.mnemonicPrefix=false diff --cached --binary --no-color --no-ext-diff "
            f"--no-textconv --no-renames --src-prefix=a/ --dst-prefix=b/ {base} -- . "
            + " ".join(f"':(exclude,glob){pattern}'" for pattern in BYTECODE) + f" > {room}/patch.diff\n")


def _said_in_hex(mark: str, path: str) -> str:
    """The part of patch_script that says file `path` (when not empty) after `mark`, in hex: on a line of its own,
    at most BIG_MAX bytes of it, nothing in it a mark (_hex_section reads it back)."""
    return (f"if [ -s {path} ]; then echo; printf '%s ' '{mark}'; "
            f"head -c {BIG_MAX} {path} | od -An -v -tx1 | tr -d ' \\n'; fi\n")


def _big_new_files(room: str, max_patch: int) -> str:
    """The part of patch_script that leaves out, before git reads them, the new files whose diff alone would be over
    --max-patch: each would take its size twice on pid's disk (its objects, then its diff) before the host left it out
    anyway (artifacts.py), and a 480 MB one filled that disk. A text file's diff is at least its size; a binary one's
    (git's deflate, in base85) at least its `gzip -1` size; one over MAX_FILE goes whatever it holds (git cannot diff
    it). `$spec` then holds git add's pathspec options, and room/big the paths (NUL-separated; big.lines the ones on
    one line, for the check below). A git without pathspec files (before 2.25) leaves nothing out."""
    judge = ('for f; do p="$GIT_WORK_TREE/$f"; [ -f "$p" ] && [ ! -L "$p" ] || continue; '
             f'[ "$(wc -c < "$p")" -gt {MAX_FILE} ] || '
             '[ "$(head -c 8000 "$p" | tr -d "\\000" | wc -c)" = "$(head -c 8000 "$p" | wc -c)" ] || '
             f'[ "$(gzip -1 -c < "$p" | head -c {max_patch + 1} | wc -c)" -gt {max_patch} ] || continue; '
             'printf "%s\\0" "$f"; done')
    return (f": > {room}/big; : > {room}/big.lines; spec=\n"
            "if git add -h 2>&1 | grep -q pathspec-from-file; then\n"
            f"  find \"$GIT_WORK_TREE\" -path \"$GIT_WORK_TREE/.git\" -prune -o -type f -size +{max_patch}c -print0 "
            "2>/dev/null | xargs -0 -r git ls-files -z -o --exclude-standard -- 2>/dev/null "
            f"| xargs -0 -r sh -c {shlex.quote(judge)} pid-big 2>/dev/null | head -z -n {BIG_COUNT} > {room}/big "
            "|| true\n"
            f"  if [ -s {room}/big ] && printf ':(top)\\0' > {room}/spec && "
            f"xargs -0 printf ':(exclude,top,literal)%s\\0' < {room}/big >> {room}/spec && "
            f"tr '\\0' '\\n' < {room}/big > {room}/big.lines; then\n"
            f"    spec=\"--pathspec-from-file={room}/spec --pathspec-file-nul\"; fi\n"
            "fi\n")


NESTED_MARK = "pid: repositories of their own:"   # (then their names, in hex: said after BIG_MARK's)
NESTED_COUNT = 32   # of them named at most
NESTED_WHY = ("a git repository of its own that came with the workspace: git records only its commit, so no change "
              "inside it is in the patch")
BIG_MARK = "pid: new files over --max-patch:"   # (then their NUL-separated names, in hex: nothing in them is a mark)
BIG_COUNT = 32   # of them left out at most (the others' fate is the host's filter: artifacts.py)
BIG_MAX = 500    # bytes of their names said (with git's words and SPECIAL_MAX, within the 16 KiB the host reads)
UNRECORDED_MARK = "pid: what git could not record:"   # (patch_script's output, before git's words)
UNRECORDED_MAX = 11000
SPECIAL_MARK = "pid: no files:"   # (then the length of git check-ignore's records of the FIFOs, sockets and devices)
SPECIAL_COUNT = 64   # of them looked up, whole names (GNU head -z; elsewhere none is listed)
SPECIAL_MAX = 4000   # bytes of their records read back: with git's words, within the script's output the host reads
_NO_FILE = "not a regular file, a link or a directory"
_UNRECORDED = ((re.compile(rb"error: '(.+)/' does not have a commit checked out"), "a git repository of its own with "
                "no commit yet (git init, cargo new): git cannot record it (without its .git, its files are in the "
                "patch)"),
               (re.compile(rb"error: (.+): can only add regular files, symbolic links or git-directories"), _NO_FILE))
_GITS_ASIDES = re.compile(rb"hint:.*|warning: adding embedded git repository: .+")


def unrecorded(said: bytes, workdir: str, max_patch: int) -> list[tuple[str, str]]:
    """(path, why) for each path the patch script's git left out: what git said after UNRECORDED_MARK, then the
    FIFOs, sockets and devices no .gitignore ignores (after SPECIAL_MARK), the new files over --max-patch the script
    left out (after BIG_MARK), then the repositories of their own (after NESTED_MARK, said last); SandboxError when
    git said anything else (any other error), or too much to read."""
    said, nested = _nested(said)
    said, big = _big_left_out(said, max_patch)
    said, _, special = (b"\n" + said).partition(b"\n" + SPECIAL_MARK.encode() + b" ")
    found = _git_left_out(said[1:])
    known = {path for path, _ in found}
    return found + [(path, _NO_FILE) for path in _no_files(special, workdir) if path not in known] + big + nested


def _nested(said: bytes) -> tuple[bytes, list[tuple[str, str]]]:
    """The script's output without its NESTED_MARK section (said last), and the repositories that section names (as
    git quotes an unusual name)."""
    rest, names = _hex_section(said, NESTED_MARK, b"\n")
    return rest, [(name, NESTED_WHY) for name in names if name]


def _hex_section(said: bytes, mark: str, separator: bytes) -> tuple[bytes, list[str]]:
    """The script's output without its last section `mark` (_said_in_hex), and the names that section holds: a
    name cut by BIG_MAX is left out of the list."""
    rest, found, tail = said.rpartition(b"\n" + mark.encode() + b" ")
    if not found:
        return said, []
    try:
        names = bytes.fromhex(tail.strip().decode("ascii")).split(separator)
    except ValueError:
        return rest, []
    return rest, [name.decode("utf-8", "surrogateescape") for name in names[:-1]]


def _big_left_out(said: bytes, max_patch: int) -> tuple[bytes, list[tuple[str, str]]]:
    """The script's output without its BIG_MARK section, and the files that section names (a name cut by BIG_MAX is
    left out of the list, not of the patch's leaving out)."""
    from .artifacts import new_file_over
    rest, names = _hex_section(said, BIG_MARK, b"\0")
    return rest, [(name, new_file_over(max_patch)) for name in names]


def _no_files(special: bytes, workdir: str) -> list[str]:
    """The paths git check-ignore -z -n -v did not find ignored, in SPECIAL_MARK's counted records (source, line,
    pattern, path; an empty source or a "!" pattern: not ignored). A record cut short by its bound is left out."""
    length, _, records = special.partition(b"\n")
    if not length.isdigit() or int(length) > len(records):
        return []
    fields = records[:int(length)].split(b"\0")
    prefix = workdir.rstrip("/") + "/"
    paths = []
    for source, _, pattern, path in zip(*[iter(fields[:len(fields) - 1])] * 4):
        name = path.decode("utf-8", "surrogateescape")
        if (not source or pattern.startswith(b"!")) and name.startswith(prefix):
            paths.append(name[len(prefix):])
    return paths


def _git_left_out(said: bytes) -> list[tuple[str, str]]:
    mark = UNRECORDED_MARK.encode() + b"\n"
    if mark not in said:
        return []
    words = said.split(mark, 1)[1]
    if len(words) > UNRECORDED_MAX:
        raise SandboxError(f"making the patch failed: git could not record many paths: {_shown(words[:300])}")
    found = []
    for line in words.split(b"\n"):
        if not line or _GITS_ASIDES.fullmatch(line):
            continue
        for pattern, why in _UNRECORDED:
            if match := pattern.fullmatch(line):
                found.append((match[1].decode("utf-8", "surrogateescape"), why))
                break
        else:
            raise SandboxError(f"making the patch failed: {_shown(line[:300])}")
    return found


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
        # One reading only: the worker mounts the path as written, so no %-escape (a check that decoded it would
        # judge another path) and no . or .. segment (what a link resolves them to is the worker's to say)
        if "%" in parts.path or any(segment in (".", "..") for segment in parts.path.split("/")):
            raise ValueError(f"a file:// URL's path is taken as written: no %-escapes, no . or .. segments: {url!r}")
    elif not parts.hostname or parts.hostname.startswith("-"):
        raise ValueError(f"no host in {url!r}")
    if ref is not None and (not _REF_RE.fullmatch(ref) or ".." in ref or ref.endswith((".lock", "/", "."))):
        raise ValueError(f"not a branch, tag or commit id: {ref!r}")


# The longest path a workspace may hold, relative to its root: Linux's PATH_MAX (with its NUL). No longer one can be
# opened by its path from the workspace's root (nor checked out by git), and it bounds a directory's depth (2,048).
MAX_NAME = 4095
MAX_FILE = 2_000_000_000   # bytes: git 2.39's binary diff fails from ~2 GiB on (see patch_script)


class WorkspaceTooLarge(Exception):
    """The packed workspace would pass its size limit (nothing usable was written)."""


class UnsafeTar(tarfile.TarError):
    """A workspace tar holds a member pid will not unpack (the whole import fails; the message names it)."""


@dataclass
class Packed:
    digest: str    # "sha256:<hex>" of the tar's bytes
    size: int      # bytes


def build_tar(root: str, uid: int = 0, gid: int = 0, max_bytes: int = 0) -> IO[bytes]:
    """A tar of the directory `root` in a temporary file (rewound), every entry owned by uid:gid (the agent's): links
    stored as links, special files skipped (see pack_tar); WorkspaceTooLarge past `max_bytes` (0: no limit)."""
    spool = tempfile.TemporaryFile(prefix="pid-import-")
    try:
        pack_tar(root, spool, uid, gid, max_bytes)
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    return spool


def tree_size(root: str, limit: int) -> int:
    """About the bytes a tar of the directory `root` takes (a header per entry, regular files' apparent sizes in
    whole blocks), from lstat alone: nothing is read, no link followed. The walk stops once past `limit`, so a tree
    too large is told at once, before anything is written (a sparse file of terabytes takes no room on disk, and
    its tar would take all of it)."""
    total = 0
    stack = [root]
    while stack and total <= limit:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue   # (the packer reports what it cannot read)
        with entries:   # (read as it goes: a directory of millions of entries is never held whole)
            for entry in entries:
                total += tarstream.BLOCK
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if not is_marked(entry.path):   # (pid's output: left out, see pack_tar)
                            stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += -(-entry.stat(follow_symlinks=False).st_size // tarstream.BLOCK) * tarstream.BLOCK
                except OSError:
                    pass
                if total > limit:
                    break
    return total


def pack_error(exc: OSError) -> str:
    """Why a tree could not be packed, in one line: the reason and the path, shortened (a path may be 4 KB)."""
    name = exc.filename
    name = os.fsdecode(name) if isinstance(name, (str, bytes)) else "" if name is None else str(name)
    if len(name) > 160:
        name = f"{name[:70]}…{name[-70:]}"
    return f"{exc.strerror or exc}{f' ({name})' if name else ''}"


def pack_tar(root: str, out: IO[bytes], uid: int = 0, gid: int = 0, max_bytes: int = 0) -> Packed:
    """Write a tar of the directory `root` to `out` as a stream, hashing it as it goes; at most `max_bytes` (0: no
    limit, else WorkspaceTooLarge as soon as it is passed).

    Every entry of the tree: links stored as links (never followed), special files skipped, no git run, and no
    directory below `root` that is pid's own output (pid/output_dirs.py). Files are
    opened with O_NOFOLLOW, and everything below a directory through a descriptor of it, so neither a file nor a
    directory swapped for a symlink meanwhile is followed. Deterministic: members in sorted order (per directory: its
    subdirectories and links to directories, then the rest), owned by uid:gid with no names, whole-second mtimes, so
    the same tree gives the same bytes (and the same digest: a hundred jobs on one tree store it once). Written by
    pid.sandbox.tarstream: ~30 µs of Python per file.
    """
    root = os.path.abspath(root)
    if not os.path.isdir(root) or os.path.islink(root):
        raise NotADirectoryError(f"not a directory: {root}")
    sink = _HashingSink(out, max_bytes)
    inodes: dict[tuple[int, int], bytes] = {}
    # Directories still to pack, the next one last: depth first in sorted order, as a loop (a tree of any depth).
    # Each with the (device, inode) its parent listed: one swapped meanwhile (for a link, or a link put on its way)
    # is not the one opened, and is skipped.
    todo: list[tuple[str, str, tuple[int, int] | None]] = [(root, "", None)]
    while todo:
        path, arc, listed = todo.pop()
        subdirs = _pack_dir(path, arc, listed, sink, uid, gid, inodes)
        todo.extend((os.path.join(path, name), arc + name + "/", key) for name, key in reversed(subdirs))
    sink.write(tarstream.end())
    sink.pad(tarstream.BLOCK * 20)   # as tar and tarfile: whole records of 10 KiB
    sink.flush()
    return Packed(f"sha256:{sink.hash.hexdigest()}", sink.size)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _pack_dir(path: str, arc: str, listed: tuple[int, int] | None, sink: "_HashingSink", uid: int, gid: int,
              inodes: dict[tuple[int, int], bytes]) -> list[tuple[str, tuple[int, int]]]:
    """The entries of one directory, read through a descriptor of it (nothing below is looked up by a path that
    could be swapped); returns its subdirectories to walk (name, (device, inode)), in order."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return []   # vanished, or swapped for a link, since its parent was read
        if exc.errno == errno.ENAMETOOLONG:
            raise OSError(errno.ENAMETOOLONG, f"a path longer than Linux allows ({MAX_NAME} bytes from /)",
                          path) from None
        raise
    try:
        st = os.fstat(fd)
        if listed is not None and (st.st_dev, st.st_ino) != listed:
            return []   # another directory than its parent listed: a link was put on its way meanwhile
        entries = list(os.scandir(fd))
        dirs: list[os.DirEntry[str]] = []
        files: list[os.DirEntry[str]] = []
        for entry in entries:
            try:
                (dirs if entry.is_dir() else files).append(entry)   # as os.walk: a link to a directory is a "directory"
            except OSError:
                files.append(entry)
        dirs.sort(key=lambda e: e.name)
        files.sort(key=lambda e: e.name)
        walk: list[tuple[str, tuple[int, int]]] = []
        for entry in dirs + files:
            name = arc + entry.name
            if len(os.fsencode(name)) > MAX_NAME:
                raise OSError(errno.ENAMETOOLONG, f"a path in the tree longer than {MAX_NAME} bytes",
                              os.path.join(path, entry.name))
            kept = _pack_entry(entry, fd, path, name, sink, uid, gid, inodes)
            if kept is not None:
                walk.append((entry.name, kept))
        return walk
    finally:
        os.close(fd)


def _pack_entry(entry: os.DirEntry, dir_fd: int, dir_path: str, arc: str, sink: "_HashingSink", uid: int, gid: int,
                inodes: dict[tuple[int, int], bytes]) -> tuple[int, int] | None:
    """One entry of the directory open as `dir_fd`; a directory's (device, inode), to walk it, else None."""
    name = os.fsencode(arc)
    try:
        if entry.is_file(follow_symlinks=False):   # (the directory's entry type: no system call)
            _pack_file(entry.name, dir_fd, os.path.join(dir_path, entry.name), name, sink, uid, gid, inodes)
            return None
        st = entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None   # vanished since the directory was read
    if stat.S_ISDIR(st.st_mode):
        if is_marked(entry.name, dir_fd):
            return None   # pid's own output (pid/output_dirs.py): no part of a workspace
        sink.write(tarstream.header(name + b"/", tarstream.DIR, 0, st.st_mode, int(st.st_mtime), uid, gid))
        return st.st_dev, st.st_ino
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(os.fsencode(entry.name), dir_fd=dir_fd)
        except OSError:
            return None
        sink.write(tarstream.header(name, tarstream.SYM, 0, st.st_mode, int(st.st_mtime), uid, gid, target))
    elif stat.S_ISREG(st.st_mode):   # (an entry type the directory did not say)
        _pack_file(entry.name, dir_fd, os.path.join(dir_path, entry.name), name, sink, uid, gid, inodes)
    # sockets, FIFOs and devices are not part of a workspace
    return None


def _pack_file(entry_name: str, dir_fd: int, path: str, name: bytes, sink: "_HashingSink", uid: int, gid: int,
               inodes: dict[tuple[int, int], bytes]) -> None:
    """A regular file of the directory open as `dir_fd`, opened without following a link (a file swapped for one
    since the walk is skipped); `path` names it in errors."""
    try:
        fd = os.open(entry_name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return   # vanished or swapped for a link since the walk: skip it
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in inodes:   # a second name of a file packed already: a hard link
            sink.write(tarstream.header(name, tarstream.LNK, 0, st.st_mode, int(st.st_mtime), uid, gid,
                                        inodes[key]))
            return
        if st.st_nlink > 1:
            inodes[key] = name
        sink.write(tarstream.header(name, tarstream.REG, st.st_size, st.st_mode, int(st.st_mtime), uid, gid))
        left = st.st_size
        while left:
            data = os.read(fd, min(left, 1 << 20))
            if not data:
                raise OSError(f"{path} shrank while it was packed")
            sink.write(data)
            left -= len(data)
        sink.pad(tarstream.BLOCK)
    finally:
        os.close(fd)


class _HashingSink:
    """A write-only stream that hashes, counts and bounds what passes to `out`, in writes of about 1 MiB."""

    def __init__(self, out: IO[bytes], max_bytes: int) -> None:
        self.out, self.max_bytes = out, max_bytes
        self.hash = hashlib.sha256()
        self.size = 0
        self.buffer: list[bytes] = []
        self.buffered = 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.max_bytes and self.size > self.max_bytes:
            raise WorkspaceTooLarge(f"larger than {self.max_bytes} bytes once packed")
        self.buffer.append(data)
        self.buffered += len(data)
        if self.buffered >= 1 << 20:
            self.flush()
        return len(data)

    def pad(self, unit: int) -> None:
        """Zeros up to the next multiple of `unit` bytes."""
        if self.size % unit:
            self.write(bytes(unit - self.size % unit))

    def flush(self) -> None:
        data = b"".join(self.buffer)
        self.buffer, self.buffered = [], 0
        self.hash.update(data)
        self.out.write(data)


# -- unpacking a tar pid did not necessarily make ------------------------------------------------------------------
class _Rules:
    """MemberCheck's rules on raw names (bytes), shared by the tarfile filter and the fast unpacker."""

    def __init__(self) -> None:
        self.kinds: dict[bytes, str] = {}   # name -> "dir" | "implicit" | "file" | "link"

    def check(self, raw: bytes, kind: str, linkname: bytes) -> tuple[bytes | None, bytes]:
        """(the member's normalised name or None for the root itself, its hard link's normalised target)."""
        name = self._name(raw)
        if name is None:
            return None, linkname
        if len(name) > MAX_NAME:
            raise UnsafeTar(f"{_shown(raw)}: a path of {len(name)} bytes (at most {MAX_NAME})")
        if kind not in (tarstream.REG, tarstream.DIR, tarstream.SYM, tarstream.LNK):
            raise UnsafeTar(f"{_shown(raw)}: not a regular file, directory or link")
        kinds = self.kinds
        parent = name.rpartition(b"/")[0]
        if parent and kinds.get(parent) not in ("dir", "implicit"):   # (a known directory's ancestors were checked)
            parts = name.split(b"/")
            for i in range(1, len(parts)):
                ancestor = b"/".join(parts[:i])
                seen = kinds.setdefault(ancestor, "implicit")
                if seen not in ("dir", "implicit"):
                    raise UnsafeTar(f"{_shown(raw)}: below a {seen}, not a directory")
        known = kinds.get(name)
        if known is not None and not (known == "implicit" and kind == tarstream.DIR):
            raise UnsafeTar(f"{_shown(raw)}: appears twice")
        if kind == tarstream.LNK:
            target = self._name(linkname, raw)
            if target is None or kinds.get(target) != "file":
                raise UnsafeTar(f"{_shown(raw)}: a hard link to {_shown(linkname)}, which is not a regular file "
                                f"before it in the archive")
            linkname = target
        kinds[name] = "dir" if kind == tarstream.DIR else "link" if kind == tarstream.SYM else "file"
        return name, linkname

    @staticmethod
    def _name(raw: bytes, member: bytes | None = None) -> bytes | None:
        if raw.startswith(b"/") or b"\0" in raw:
            raise UnsafeTar(f"{_shown(member or raw)}: an absolute path")
        if raw and not (b"//" in raw or b".." in raw or b"/./" in raw or raw.startswith(b"./") or raw == b"."
                        or raw.endswith((b"/", b"/."))):
            return raw   # the common name: nothing to normalise
        parts = [p for p in raw.split(b"/") if p not in (b"", b".")]
        if b".." in parts:
            raise UnsafeTar(f"{_shown(member or raw)}: a path with '..'")
        return b"/".join(parts) or None


def _shown(raw: bytes) -> str:
    return escaped(os.fsdecode(raw))   # a member name fit for a one-line message


_TARFILE_KINDS = {tarfile.REGTYPE: tarstream.REG, tarfile.AREGTYPE: tarstream.REG, tarfile.CONTTYPE: tarstream.REG,
                  tarfile.DIRTYPE: tarstream.DIR, tarfile.SYMTYPE: tarstream.SYM, tarfile.LNKTYPE: tarstream.LNK}


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
        self.rules = _Rules()

    def __call__(self, member: tarfile.TarInfo, path: str = "") -> tarfile.TarInfo | None:
        kind = _TARFILE_KINDS.get(member.type, "other")
        name, target = self.rules.check(os.fsencode(member.name), kind, os.fsencode(member.linkname))
        if name is None:
            return None                       # the root directory itself ("." or "./")
        changes: dict = {"linkname": os.fsdecode(target)} if kind == tarstream.LNK else {}
        return member.replace(name=os.fsdecode(name), uid=self.uid, gid=self.gid, uname="", gname="",
                              mode=member.mode & 0o777, deep=False, **changes)


def unpack_tar(stream: IO[bytes], dest: str, uid: int, gid: int, seed: GitSeed | None = None) -> None:
    """Unpack a workspace tar, read as a stream (never whole in memory, never seeked), into the empty host directory
    `dest`, every member checked by MemberCheck's rules before it is written (the caller is root: owners become
    uid:gid). With `seed`, each file's blob and index entry are recorded as it is written (gitseed), and the seed is
    written out at the end unless it became unusable. Raises UnsafeTar (or tarfile.TarError for a broken archive,
    OSError for the disk)."""
    if os.listdir(dest):   # the rules hold only for an empty destination (no link of someone else's)
        raise UnsafeTar(f"{dest} is not empty")
    with _Unpacker(dest, uid, gid, seed) as unpacker:
        unpacker.reader = reader = tarstream.TarReader(stream)
        try:
            for member in reader:
                unpacker.add(member)
        except tarstream.TarFormatError as exc:
            raise tarfile.ReadError(str(exc)) from None
        unpacker.finish()


class _Unpacker:
    """Writes checked members below a directory through directory descriptors (openat, O_NOFOLLOW at every step)
    and sets owners and modes on the open files: a few system calls per file, no path resolved twice.

    (One thread: a second one making the files while this one reads and hashes measured no faster on a loaded
    2-core machine, where the container starting beside it takes the other core.)
    """

    MAX_DIR_FDS = 256
    WHOLE = 1 << 20          # files up to this size are read, written and hashed in one piece (others stream)

    def __init__(self, dest: str, uid: int, gid: int, seed: GitSeed | None) -> None:
        self.uid, self.gid, self.seed = uid, gid, seed
        self.rules = _Rules()
        self.root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.dirs: OrderedDict[bytes, int] = OrderedDict()   # open descriptors of directories below root, the
        # most recently used last
        self.dir_attrs: list[tuple[bytes, int, int]] = []   # (name, mode, mtime), set once their content is in
        self.reader: tarstream.TarReader | None = None

    def __enter__(self) -> "_Unpacker":
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self.dirs.values():
            os.close(fd)
        self.dirs.clear()
        os.close(self.root)
        if self.seed is not None and exc[0] is not None:
            self.seed.discard()

    def _dir(self, name: bytes) -> int:
        """A descriptor of the directory `name` (b"": the root), made (owned by uid:gid) if the tar implies it: from
        its nearest open ancestor down, one level at a time, in a loop (a tree of any depth). The levels passed on
        the way stay open while there is room (MAX_DIR_FDS); `name` itself always does, until _bound_fds."""
        if not name:
            return self.root
        fd = self.dirs.get(name)
        if fd is not None:
            self.dirs.move_to_end(name)
            return fd
        below = [name]   # name and its ancestors that are not open, nearest to name first
        parent_fd = self.root
        ancestor = name.rpartition(b"/")[0]
        while ancestor:
            fd = self.dirs.get(ancestor)
            if fd is not None:
                self.dirs.move_to_end(ancestor)
                parent_fd = fd
                break
            below.append(ancestor)
            ancestor = ancestor.rpartition(b"/")[0]
        kept = True   # parent_fd is the root or in self.dirs (else it is closed once its child is open)
        for level in reversed(below):
            try:
                fd = self._open_below(parent_fd, level.rpartition(b"/")[2])
            finally:
                if not kept:
                    os.close(parent_fd)
            kept = level == name or len(self.dirs) < self.MAX_DIR_FDS
            if kept:
                self.dirs[level] = fd
            parent_fd = fd
        return parent_fd

    def _open_below(self, parent_fd: int, base: bytes) -> int:
        """The directory `base` in parent_fd, opened without following a link; made (owned by uid:gid) if absent."""
        try:
            os.mkdir(base, 0o755, dir_fd=parent_fd)
            made = True
        except FileExistsError:
            made = False
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        if made:
            os.fchown(fd, self.uid, self.gid)
        return fd

    def _bound_fds(self) -> None:
        """Called before a member takes its descriptors: past the bound, the least recently used half are closed
        (reopened when needed; the recent ones are those a tree walked in order needs next, however deep it is)."""
        if len(self.dirs) >= self.MAX_DIR_FDS:
            for _ in range(len(self.dirs) - self.MAX_DIR_FDS // 2):
                os.close(self.dirs.popitem(last=False)[1])

    def _make_dir(self, name: bytes) -> None:
        self._bound_fds()
        self._dir(name)

    def _make_file(self, name: bytes, data: bytes | None, mode: int, mtime: int, sha: bytes | None) -> None:
        """A regular file with `data` (None: the reader's current member, as it streams)."""
        self._bound_fds()
        parent, _, base = name.rpartition(b"/")
        fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=self._dir(parent))
        try:
            if data is not None:
                _write_all(fd, data)
            else:
                sha = self._stream_content(fd, sha is not None)
            os.fchown(fd, self.uid, self.gid)
            os.fchmod(fd, mode)
            os.utime(fd, (mtime, mtime))
            if sha is not None:
                self.seed.file(name, sha, os.fstat(fd))   # type: ignore[union-attr]
        finally:
            os.close(fd)

    def _stream_content(self, fd: int, indexed: bool) -> bytes | None:
        assert self.reader is not None
        blob = self.seed.blob_writer(self.reader.left) if indexed and self.seed is not None else None
        for chunk in self.reader.chunks():
            _write_all(fd, chunk)
            if blob is not None:
                blob.update(chunk)
        return blob.finish() if blob is not None else None

    def _make_symlink(self, name: bytes, target: bytes, sha: bytes | None) -> None:
        self._bound_fds()
        parent, _, base = name.rpartition(b"/")
        parent_fd = self._dir(parent)
        os.symlink(target, base, dir_fd=parent_fd)
        os.chown(base, self.uid, self.gid, dir_fd=parent_fd, follow_symlinks=False)
        if sha is not None:
            self.seed.symlink(name, sha, os.stat(base, dir_fd=parent_fd, follow_symlinks=False))  # type: ignore

    def _make_link(self, name: bytes, target: bytes, indexed: bool) -> None:
        self._bound_fds()
        parent, _, base = name.rpartition(b"/")
        target_parent, _, target_base = target.rpartition(b"/")
        parent_fd = self._dir(parent)
        os.link(target_base, base, src_dir_fd=self._dir(target_parent), dst_dir_fd=parent_fd,
                follow_symlinks=False)
        if indexed:
            self.seed.hard_link(name, target)   # type: ignore[union-attr]

    def _set_dir_attrs(self) -> None:
        for name, mode, mtime in self.dir_attrs:   # now that nothing more is made in them
            self._bound_fds()
            fd = self._dir(name)
            os.fchmod(fd, mode)
            os.utime(fd, (mtime, mtime))

    def add(self, member: tarstream.Member) -> None:
        name, target = self.rules.check(member.name, member.kind, member.linkname)
        if name is None:
            return
        seed = self.seed
        indexed = seed is not None and seed.check_name(name, member.kind == tarstream.DIR)
        kind = member.kind
        if kind == tarstream.REG:
            assert self.reader is not None
            if member.size <= self.WHOLE:
                data = self.reader.content()
                self._make_file(name, data, member.mode & 0o777, member.mtime,
                                seed.blob(data) if indexed else None)   # type: ignore[union-attr]
            else:   # written as it streams
                self._make_file(name, None, member.mode & 0o777, member.mtime, b"" if indexed else None)
        elif kind == tarstream.DIR:
            self._make_dir(name)
            self.dir_attrs.append((name, member.mode & 0o777, member.mtime))
        elif kind == tarstream.SYM:
            self._make_symlink(name, member.linkname,
                               seed.blob(member.linkname) if indexed else None)   # type: ignore[union-attr]
        else:
            self._make_link(name, target, indexed)

    def finish(self) -> None:
        self._set_dir_attrs()
        if self.seed is not None and self.seed.unusable is None:
            root = self.root
            self.seed.write(lambda name: os.stat(name, dir_fd=root, follow_symlinks=False))   # (no links on the way)
        elif self.seed is not None:
            self.seed.discard()


def _write_all(fd: int, data: bytes) -> None:
    done = os.write(fd, data)
    if done < len(data):
        view = memoryview(data)[done:]
        while view:
            view = view[os.write(fd, view):]


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
