"""A container's CPU time so far, from its cgroup: cgroup v2's cpu.stat (usage_usec) or v1's cpuacct.usage
(nanoseconds). What pid spends inside a container (its servers, the commands' shells) is there; the engine's own
processes (dockerd, the shim, runc) are not."""
from __future__ import annotations

import glob


def cgroup_files(cid: str, name: str) -> list[str]:
    """Container `cid`'s cgroup files called `name` (one per hierarchy that has it: v2's, or v1's controllers)."""
    return glob.glob(f"/sys/fs/cgroup/**/*{cid}*/{name}", recursive=True)


def cgroup_cpu_file(cid: str) -> str | None:
    """The file that counts container `cid`'s CPU, or None where no cgroup of it can be read."""
    for path in cgroup_files(cid, "cpu.stat"):
        if "usage_usec" in _read(path):   # (v1's cpu.stat, of the cpu controller, has no usage)
            return path
    hits = cgroup_files(cid, "cpuacct.usage")
    return hits[0] if hits else None


def cpu_seconds(path: str | None) -> float:
    """The CPU seconds `path` (from cgroup_cpu_file) counts; 0 when it cannot be read."""
    text = _read(path) if path else ""
    if path and path.endswith("cpuacct.usage"):
        return int(text) / 1e9 if text.strip().isdigit() else 0.0
    for line in text.splitlines():
        if line.startswith("usage_usec"):
            return int(line.split()[1]) / 1e6
    return 0.0


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
