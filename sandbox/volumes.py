"""The image's VOLUMEs as pid makes them: each a fresh directory of the job's disk, bounded by --disk and gone with
the job (the engine's own volume would live on its storage, past --disk, and outlive a forced removal).

A volume is at a path the image names, and the image may make that path a link, which the runtime follows as it
mounts (a link to /etc would put the empty directory there): a volume with a link on its way in the image is refused,
as is one in a system directory or pid's own, one pid's root tools could load or run from (image_fs's rule for the
agent's trees), and one inside a tree pid gives the job itself (the workdir, /tmp, the agent's home; at the tree's own
top it is that tree). The directory is owned as the image's own is (root's, 0755,
where the image's layers cannot be read here); the image's content there is not copied.
"""
from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Any

from pid.sandbox_api import BadWorkspace

from .image_fs import ImageFSError, reached_by_pid, check_workdir, image_layers, subtree_lowers


class BadVolume(BadWorkspace):
    """A VOLUME of the image pid cannot make: the image's fault (bad_workspace), said in one line."""


@dataclass
class Volume:
    target: str
    uid: int = 0
    gid: int = 0
    mode: int = 0o755


def image_volumes(inspected: dict[str, Any], image: str, trees: tuple[str, ...]) -> list[Volume]:
    """The image's volumes, but those at the top of one of `trees` (pid's own mounts for the job, which they are)."""
    try:
        layers: list[str] | None = image_layers(inspected, image)
    except ImageFSError:   # (another storage driver: nothing to look at, nothing owned but by root)
        layers = None
    volumes: list[Volume] = []
    for path in volume_paths(inspected):
        target = _target(path, trees)
        if target is not None:
            volumes.append(_as_in_image(target, layers))
    return volumes


def volume_paths(inspected: dict[str, Any]) -> list[str]:
    """The image's VOLUME paths (an image inspect's Config.Volumes), normalised as the engine does, each once; a
    relative one (no engine takes it) as it is, for the refusal to name."""
    paths = {"/" + posixpath.normpath(p).lstrip("/") if p.startswith("/") else p   # (normpath keeps a leading "//")
             for p in (inspected.get("Config") or {}).get("Volumes") or {}}
    return sorted(paths)


def _target(path: str, trees: tuple[str, ...]) -> str | None:
    """Where the volume goes; None for the top of one of `trees`; BadVolume where it cannot be."""
    if path in trees:
        return None
    inside = [tree for tree in trees if path.startswith(tree.rstrip("/") + "/")]
    if inside:
        raise BadVolume(f"the image declares VOLUME {path}, inside {inside[0]}, which pid gives the job itself; "
                        "remove the VOLUME from the image")
    try:
        return check_workdir(path)
    except ValueError:
        raise BadVolume(f"the image declares VOLUME {path}: pid makes every volume a directory of the job's disk, "
                        "which it cannot be in a system directory or pid's own; remove it from the image") from None


def _as_in_image(target: str, layers: list[str] | None) -> Volume:
    """The volume, owned as its directory in the image is; BadVolume when a link is on its way there."""
    if layers is None:
        return Volume(target)
    try:
        lowers = subtree_lowers(layers, target)
    except ImageFSError as exc:
        raise BadVolume(f"the image declares VOLUME {target}, and {exc}; remove the VOLUME from the image") from None
    try:
        reached = reached_by_pid(layers, [target])
    except ImageFSError:   # (fails closed: what pid's tools load cannot be told)
        reached = {target}
    if reached:   # a library or tool there would run in pid's root processes (its git, its servers)
        raise BadVolume(f"the image declares VOLUME {target}, where pid's own tools could load or run something from "
                        "(the loader's cache names it, or a tool's link leads there); remove the VOLUME from the image")
    if not lowers:   # (the image has no such directory: the engine would make it root's)
        return Volume(target)
    st = os.lstat(lowers[0])
    return Volume(target, st.st_uid, st.st_gid, st.st_mode & 0o7777)
