"""Moving files between host and container without the host ever interpreting them.

Host side rules: never follow a symlink, never run git, never write outside the destination. Tar streams go
through temporary files or are read incrementally, so memory stays small whatever the size of a repository.
"""
from __future__ import annotations

import os
import re
import stat
import tarfile
import tempfile
from typing import IO

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


def unpack_tar(spool: IO[bytes], dest: str) -> None:
    """Unpack a tar that build_tar made into the host directory `dest`, owners and modes as recorded (the caller is
    root). No member can pass through a link: build_tar never descends into one, so every member's parent is a real
    directory of the same tar. Rewinds `spool` first."""
    spool.seek(0)
    with tarfile.open(fileobj=spool, mode="r") as tar:
        if hasattr(tarfile, "fully_trusted_filter"):   # filter= exists from Python 3.11.4
            tar.extractall(dest, numeric_owner=True, filter="fully_trusted")
        else:                                           # ...and older versions do just that without it
            tar.extractall(dest, numeric_owner=True)


def build_tar(root: str, uid: int = 0, gid: int = 0) -> IO[bytes]:
    """A tar of the directory `root` in a temporary file (rewound), every entry owned by uid:gid (the agent's): links
    stored as links, special files skipped.

    Regular files are opened with O_NOFOLLOW, so a file swapped for a symlink meanwhile is never followed.
    """
    root = os.path.abspath(root)
    if not os.path.isdir(root) or os.path.islink(root):
        raise NotADirectoryError(f"not a directory: {root}")
    spool = tempfile.TemporaryFile(prefix="pid-import-")
    with tarfile.open(fileobj=spool, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                _add(tar, os.path.join(dirpath, name), os.path.relpath(os.path.join(dirpath, name), root), uid, gid)
    spool.seek(0)
    return spool


def _owned(info: tarfile.TarInfo, uid: int, gid: int) -> tarfile.TarInfo:
    info.uid, info.gid = uid, gid
    info.uname = info.gname = ""
    return info


def _add(tar: tarfile.TarFile, path: str, arcname: str, uid: int, gid: int) -> None:
    st = os.lstat(path)
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
        tar.addfile(_owned(tar.gettarinfo(path, arcname=arcname), uid, gid))
    # sockets, FIFOs and devices are not part of a workspace
