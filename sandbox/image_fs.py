"""The image's own filesystem, writable by the job and bounded by its disk: copy-on-write over the image's layers.

When a job names `--workdir` (a task image's /testbed), the agent works in the image as the task's harness would:
it edits the workdir's files whoever owns them, installs into the image's environments (/opt, /usr/local: a conda
env, pip into the image's Python, npm -g) and, as root, anywhere. Nothing is copied at start, whatever the tree's
size: each writable tree is an overlay whose lower layers are the engine's own layer directories of the image (no
one writes those) and whose upper layer lives on the job's disk, so every byte written there counts against --disk.

- An agent that is not root gets one overlay per tree it may change (the workdir, /opt, where pip and npm write in
  /usr/local: AGENT_TREES), made of *idmapped* layers that swap the agent's uid with the owner of the tree's top
  directory in the image (root's, usually; a task image may give its workdir to a user): in each tree that owner's
  files are the agent's, and what it writes is stored as that owner's. Everything else (/usr/bin, /lib, /etc)
  stays the image's read-only root, so pid's machinery, which runs only from the system directories, runs nothing
  the agent could have replaced (nor loads: the image's loader and shell variables are kept from it, image_env.py).
- A root agent gets the whole image root as one overlay (apt may write anywhere), bound over the read-only root
  directory by directory.
- pid gets the workdir as the image has it, read-only, under /.pid (root only): the patch's base is recorded from it
  while the agent works, since lower layers never change.

Host-side safety: everything here happens before the container exists, on the engine's layer directories (the
image's, not the agent's) and on fresh directories of the job's disk; after the job only lazy unmounts follow, which
never walk into what the agent wrote. Needs the overlay2 storage driver and a root worker (the job's disk does too).
"""
from __future__ import annotations

import os
import posixpath
import stat
from dataclasses import dataclass, field
from typing import Any

from .config import AGENT_HOME
from .errors import BadWorkspace, SandboxError
from .mounts import MountError, agent_userns, attach_clone, detach, mount_overlay

# The image's environments an agent that is not root may change: /opt (a conda env, a venv), and in /usr/local what
# pip, npm -g and make install of programs write (not /usr/local/lib's own libraries, which the loader may take for
# pid's tools); each only when nothing pid runs as root could load or run from it (see reached_by_pid).
AGENT_TREES = ("/opt", "/usr/local/bin", "/usr/local/sbin", "/usr/local/share", "/usr/local/include",
               "/usr/local/src", "/usr/local/etc")
AGENT_LIB_TREES = ("python", "node_modules")   # /usr/local/lib/<these>* too
LOADER_FILES = ("/etc/ld.so.cache", "/etc/ld.so.preload")
LOADER_FILE_MAX = 16 << 20
SYSTEM_BIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")   # pid's PATH in the container
# What pid's machinery runs as root in the container (sandbox/channel.sh, sandbox/workspace.py's scripts)
PID_TOOLS = ("sh", "bash", "dash", "env", "setpriv", "setsid", "git", "head", "tail", "cat", "rm", "mkdir", "mkfifo",
             "chmod", "chown", "mv", "cp", "ln", "stat", "wc", "tr", "sleep", "kill", "tar", "find", "sort", "touch",
             "dd", "truncate", "realpath", "id", "ls", "printf", "test", "[", "xargs", "sed", "awk", "gzip", "grep",
             "fallocate")
MAX_LINKS = 16   # links followed to find what one of PID_TOOLS is (past that, every tree counts as reached)
NOT_BOUND = {"proc", "sys", "dev", "tmp", ".pid", "sbin"}   # top-level directories a root agent's overlay never
                                                           # covers (/sbin: where the engine binds its init)
BASE_TARGET = "/.pid/base/tree"        # the workdir as the image has it, for pid's git (root only)
# A workdir is the agent's to change: never where pid's machinery comes from (the system directories), nor pid's own
# or the kernel's trees, nor what holds any of them. Directories in /usr/local, /usr/src and /usr/share may be.
_SYSTEM = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr", "/etc", "/boot", "/proc", "/sys", "/dev",
           "/run", "/.pid", "/tmp", "/var/tmp", AGENT_HOME)
_ALLOWED_UNDER = ("/usr/local", "/usr/src", "/usr/share")
_NEVER_HELD = ("/usr/local", "/usr/local/lib")   # (its libraries: the loader's, so pid's, whatever else it holds)


class ImageFSError(SandboxError):
    """The image's filesystem cannot be made writable here; the message says why and what to do instead."""


class NoWorkdir(ImageFSError, BadWorkspace):
    """--workdir is no directory in the image: the input's fault (bad_workspace), not the engine's."""


@dataclass
class Tree:
    """One bind mount of the container: `source` on the host (an overlay view) at `target` in the container."""
    target: str
    source: str
    read_only: bool = False


def check_workdir(path: str) -> str:
    """--workdir as pid uses it: absolute, normalised, not the root and not one of pid's or the kernel's trees."""
    if not path.startswith("/") or "\0" in path or "\n" in path:
        raise ValueError(f"--workdir must be an absolute path, not {path!r}")
    norm = posixpath.normpath(path)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    holds = [bad for bad in (*_SYSTEM, *_NEVER_HELD) if _inside(bad, [norm])]
    within = [bad for bad in _SYSTEM if _inside(norm, [bad]) and not _inside(norm, list(_ALLOWED_UNDER))]
    if holds or within:
        raise ValueError(f"--workdir {path} is not a directory pid can give the agent: it "
                         f"{'holds' if holds else 'is in'} {(holds or within)[0]} (system directories, pid's own "
                         "and the kernel's are never the agent's)")
    return norm


def image_layers(info: dict[str, Any], image: str) -> list[str]:
    """The image's layer directories (from its inspect), top first, as the engine's overlay2 driver keeps them."""
    driver = info.get("GraphDriver") or {}
    data = driver.get("Data") or {}
    if driver.get("Name") != "overlay2" or not data.get("UpperDir"):
        raise ImageFSError(f"--workdir needs the engine's overlay2 storage driver (this engine uses "
                           f"{driver.get('Name') or 'another store'}): the image's own layers are what the job "
                           "writes over")
    layers = [data["UpperDir"], *[d for d in (data.get("LowerDir") or "").split(":") if d]]
    for layer in layers:
        if not os.path.isabs(layer) or not os.path.isdir(layer):
            raise ImageFSError(f"the engine reports a layer of {image!r} that is not a directory here ({layer}); "
                               "the worker must run on the engine's host")
    return layers


def subtree_lowers(layers: list[str], path: str) -> list[str]:
    """The directories that make up `path` (absolute) in the image, top layer first, as overlayfs would merge them:
    a layer's whiteout or non-directory on the way hides every layer below, an opaque directory too once it is
    taken. Empty when the image has no such directory; ImageFSError when its top entry is not a directory."""
    parts = [p for p in path.split("/") if p]
    lowers: list[str] = []
    for layer in layers:
        here, hides_below, present = layer, False, True
        for part in parts:
            here = os.path.join(here, part)
            try:
                st = os.lstat(here)
            except FileNotFoundError:
                present = False
                break
            if not stat.S_ISDIR(st.st_mode):   # a whiteout (0/0 character device), a file or a link: ends the tree
                if not lowers and not (stat.S_ISCHR(st.st_mode) and st.st_rdev == 0):
                    link = "/" + os.path.relpath(here, layer) if stat.S_ISLNK(st.st_mode) else None
                    raise ImageFSError(f"{path} is not a directory in the image"
                                       + (f" ({link} is a symbolic link)" if link else ""))
                return lowers
            if _opaque(here):
                hides_below = True
        if present:
            lowers.append(here)
        if hides_below:
            return lowers
    return lowers


def _names(layers: list[str], path: str) -> set[str]:
    """The entries of directory `path` in the image (every layer that makes it up; whiteouts are not looked at:
    a name that is gone is simply not found later)."""
    names: set[str] = set()
    try:
        lowers = subtree_lowers(layers, path)
    except ImageFSError:   # (not a directory in this image)
        return names
    for lower in lowers:
        try:
            names.update(os.listdir(lower))
        except OSError:
            pass
    return names


def reached_by_pid(layers: list[str], trees: list[str]) -> set[str]:
    """The trees pid's own root tools could load or run something from, so never the agent's: one the loader's cache
    or /etc/ld.so.preload names (searched as bytes: the cache shares string tails, and an unparsed mention counts),
    or one a tool pid runs (PID_TOOLS, in the system directories) reaches through its links, however many (Debian's
    /usr/bin/awk -> /etc/alternatives/awk -> /usr/bin/mawk; one through /etc/alternatives into /usr/local/bin would
    have pid run the agent's program as root). Fails closed: ImageFSError, or every tree when links do not end."""
    reached: set[str] = set()
    for path in LOADER_FILES:
        data = _image_file(layers, path)
        reached.update(tree for tree in trees if data is not None and (tree.rstrip("/") + "/").encode() in data)
    for directory in SYSTEM_BIN:
        for tool in PID_TOOLS:
            passed = _lookup_path(layers, posixpath.join(directory, tool))
            if passed is None:
                return set(trees)
            reached.update(tree for tree in trees if any(_inside(path, [tree]) for path in passed))
    return reached


def _lookup_path(layers: list[str], path: str) -> list[str] | None:
    """Every path a lookup of absolute `path` in the image passes through: each directory and entry it looks up,
    through every link it follows (whose target may pass through a tree and leave it again with ".."); None past
    MAX_LINKS links (a loop, say)."""
    passed: list[str] = []
    todo = [part for part in path.split("/") if part]
    done = ""   # the components looked up so far: none of them a link
    links = 0
    while todo:
        part = todo.pop(0)
        if part in (".", ".."):
            done = posixpath.dirname(done).rstrip("/") if part == ".." else done   # ("" is the root)
            continue
        target = _link_target(layers, done or "/", part)
        passed.append(f"{done}/{part}")
        if target is None:
            done = f"{done}/{part}"
            continue
        links += 1
        if links > MAX_LINKS:
            return None
        todo = [p for p in target.split("/") if p] + todo
        done = "" if target.startswith("/") else done
    return passed


def _link_target(layers: list[str], directory: str, name: str) -> str | None:
    """The target of `name` in the image's `directory` (one with no link on its way) when the topmost entry there is
    a link; None when it is anything else or absent."""
    try:
        lowers = subtree_lowers(layers, directory)
    except ImageFSError:
        return None
    for lower in lowers:
        entry = os.path.join(lower, name)
        try:
            st = os.lstat(entry)
        except FileNotFoundError:
            continue
        except OSError:
            return None
        return os.readlink(entry) if stat.S_ISLNK(st.st_mode) else None
    return None


def _image_file(layers: list[str], path: str) -> bytes | None:
    """A regular file of the image (its topmost layer's), at most LOADER_FILE_MAX bytes; None when absent."""
    for lower in subtree_lowers(layers, posixpath.dirname(path)):
        where = os.path.join(lower, posixpath.basename(path))
        try:
            st = os.lstat(where)
        except FileNotFoundError:
            continue
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:   # a whiteout: gone from here down
            return None
        if not stat.S_ISREG(st.st_mode):
            raise ImageFSError(f"the image's {path} is not a regular file: pid cannot tell what its loader loads")
        with open(where, "rb") as f:
            return f.read(LOADER_FILE_MAX)
    return None


def _opaque(path: str) -> bool:
    try:
        return os.getxattr(path, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:
        return False


@dataclass
class ImageFS:
    """The overlays of one job's container, mounted under `root` (a fresh directory of the job's disk)."""
    root: str
    trees: list[Tree] = field(default_factory=list)
    base: Tree | None = None
    _mounted: list[str] = field(default_factory=list)
    _count: int = 0

    @classmethod
    def build(cls, layers: list[str], root: str, *, workdir: str, uid: int, gid: int, image_workspace: bool,
              taken: set[str], init_binary: str | None = None) -> "ImageFS":
        """Mount the job's writable trees (see the module's docstring). `image_workspace`: the workdir is the
        image's own (else pid imports a repository there); `taken`: the container paths pid mounts itself;
        `init_binary`: the engine's init on the host (its /sbin/docker-init), which a root agent's trees hide."""
        fs = cls(root)
        try:
            try:   # (also: no link on its way, into the system or else)
                base_lowers = subtree_lowers(layers, workdir)
            except ImageFSError as exc:
                raise NoWorkdir(f"{exc} (--workdir names a directory itself)") from None
            if image_workspace and not base_lowers:
                raise NoWorkdir(f"the image has no directory {workdir} (--workdir without --repo works in the "
                                "image's own directory)")
            if uid == 0:
                view = fs._overlay(layers, None, dict(uid=0, gid=0, mode=0o755))
                for name in sorted(os.listdir(view)):
                    target = "/" + name
                    if name not in NOT_BOUND and target not in taken and _is_dir(os.path.join(view, name)):
                        fs.trees.append(Tree(target, os.path.join(view, name)))
                fs.trees += _init_again(view, init_binary, {tree.target for tree in fs.trees})
                lowers_of_base = fs._clones(base_lowers, None) if image_workspace else []
            else:
                wanted = [*([workdir] if image_workspace else []), *AGENT_TREES,
                          *(f"/usr/local/lib/{name}" for name in _names(layers, "/usr/local/lib")
                            if name.startswith(AGENT_LIB_TREES))]
                reached = reached_by_pid(layers, wanted)
                if image_workspace and workdir in reached:
                    raise ImageFSError(f"pid's own tools could load or run files of {workdir} (the image's loader "
                                       "names it, or a tool pid runs is a link into it): it cannot be the agent's")
                wanted = [t for t in wanted if t not in reached]
                lowers_of_base = []
                for target in _outermost(wanted):
                    if target in taken:
                        continue
                    try:
                        lowers = subtree_lowers(layers, target)
                    except ImageFSError:
                        if target == workdir:
                            raise
                        continue   # (an environment tree that is a link or a file in this image: not the agent's)
                    if not lowers:
                        continue
                    userns = _swap_with_owner(lowers[0], uid, gid)
                    clones = fs._clones(lowers, userns)
                    view = fs._overlay_of(clones, userns, _attrs(lowers[0]))
                    fs.trees.append(Tree(target, view))
                    if image_workspace and _inside(workdir, [target]):
                        rel = os.path.relpath(workdir, target)
                        lowers_of_base = clones if rel == "." else fs._clones(base_lowers, userns)
            if image_workspace:
                fs.base = Tree(BASE_TARGET, fs._read_only(lowers_of_base), read_only=True)
            return fs
        except BaseException as exc:
            fs.close()
            if isinstance(exc, MountError):
                raise ImageFSError(f"cannot make the image's filesystem writable: {exc.strerror}") from exc
            raise

    def mounts(self) -> list[Tree]:
        """What the container binds: the writable trees, and pid's read-only base."""
        return [*self.trees, *([self.base] if self.base else [])]

    # -- the mounts --------------------------------------------------------------------------------------------
    def _dir(self, owner: dict[str, int] | None = None) -> str:
        """A new directory under root (relative name), root's 0700 unless `owner` gives uid, gid and mode."""
        self._count += 1
        name = f"m{self._count}"
        os.mkdir(os.path.join(self.root, name), 0o700)
        if owner:
            os.chown(os.path.join(self.root, name), owner["uid"], owner["gid"])
            os.chmod(os.path.join(self.root, name), owner["mode"])
        return name

    def _clones(self, lowers: list[str], userns: int | None) -> list[str]:
        """Each lower directory bound (idmapped with `userns`) under root, by a short relative name."""
        names = []
        for lower in lowers:
            name = self._dir()
            attach_clone(lower, os.path.join(self.root, name), userns_fd=userns, read_only=True)
            self._mounted.append(name)
            names.append(name)
        return names

    def _overlay(self, lowers: list[str], userns: int | None, top: dict[str, int]) -> str:
        return self._overlay_of(self._clones(lowers, userns), userns, top)

    def _overlay_of(self, clones: list[str], userns: int | None, top: dict[str, int]) -> str:
        """A writable overlay of `clones`; its upper layer (whose root takes `top`'s owner and mode, as the image's
        directory has them) on the job's disk, seen through the same idmapping as the lower layers."""
        rw = self._dir()
        os.mkdir(os.path.join(self.root, rw, "upper"), top["mode"] & 0o7777)
        os.chown(os.path.join(self.root, rw, "upper"), top["uid"], top["gid"])
        os.chmod(os.path.join(self.root, rw, "upper"), top["mode"] & 0o7777)
        os.mkdir(os.path.join(self.root, rw, "work"), 0o700)
        if userns is not None:
            mapped = self._dir()
            attach_clone(os.path.join(self.root, rw), os.path.join(self.root, mapped), userns_fd=userns)
            self._mounted.append(mapped)
            rw = mapped
        view = self._dir()
        mount_overlay(self.root, clones, view, f"{rw}/upper", f"{rw}/work")
        self._mounted.append(view)
        return os.path.join(self.root, view)

    def _read_only(self, clones: list[str]) -> str:
        """A read-only overlay of `clones` (an empty layer at the bottom: overlayfs wants two without an upper)."""
        empty, view = self._dir(), self._dir()
        mount_overlay(self.root, [*clones, empty], view)
        self._mounted.append(view)
        return os.path.join(self.root, view)

    def close(self) -> None:
        """Detach every mount, newest first (lazily: the container is gone, nothing may block). Never raises."""
        for name in reversed(self._mounted):
            detach(os.path.join(self.root, name))
        self._mounted = []


def _init_again(view: str, init_binary: str | None, bound: set[str]) -> list[Tree]:
    """The engine binds its init at /sbin/docker-init before the job's mounts, so a tree bound over /usr (where a
    merged-/usr image's /sbin leads) hides it: the container could not start. Bind it again where it then lands."""
    try:
        link = os.readlink(os.path.join(view, "sbin"))
    except OSError:
        return []   # a real /sbin is never bound (NOT_BOUND): the engine's own bind stays visible
    landing = posixpath.normpath(posixpath.join("/", link, "docker-init"))
    if init_binary is None or not _inside(landing, sorted(bound)):
        return []
    return [Tree(landing, init_binary, read_only=True)]


def _swap_with_owner(top: str, uid: int, gid: int) -> int | None:
    """The idmapping of a writable tree: its top directory's owner in the image (root, or a task image's own user)
    becomes the agent, for every file of that owner in the tree; None when the agent owns it already."""
    st = os.lstat(top)
    if (st.st_uid, st.st_gid) == (uid, gid):
        return None
    return agent_userns(uid, gid, st.st_uid, st.st_gid)


def _attrs(path: str) -> dict[str, int]:
    st = os.lstat(path)
    return {"uid": st.st_uid, "gid": st.st_gid, "mode": stat.S_IMODE(st.st_mode)}


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _inside(path: str, trees: list[str]) -> bool:
    return any(path == t or path.startswith(t.rstrip("/") + "/") for t in trees)


def _outermost(paths: list[str]) -> list[str]:
    """`paths` without those inside another of them (one overlay covers its subtrees)."""
    unique = sorted(set(paths), key=len)
    kept: list[str] = []
    for path in unique:
        if not _inside(path, kept):
            kept.append(path)
    return kept


__all__ = ["ImageFS", "ImageFSError", "Tree", "check_workdir", "image_layers", "subtree_lowers", "BASE_TARGET"]
