"""Benchmark: the CPU a sandbox's start costs inside its container — its servers, their greetings, the waiting shells
(read from the container's cgroup once it is ready and quiet) — beside a bare container of the same image with the
engine's init running `sleep` (what the engine's own start costs there). In a burst the two cores are the limit, so
this is part of how many jobs a worker starts per second.

    python bench/bench_start_cpu.py [--runs 8]      (another checkout's: run that checkout's copy of this script)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.container_cpu import cgroup_cpu_file, cpu_seconds  # noqa: E402

IMAGE = "pid-sandbox:latest"
SETTLE_S = 0.4   # the waiting shells are up well before this


def pid_start_ms(runs: int) -> list[float]:
    from pid.sandbox import DockerSandbox, SandboxConfig
    spent = []
    for n in range(runs):
        with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=f"bench-start-cpu-{os.getpid()}-{n}",
                                                ttl_s=120)) as box:
            time.sleep(SETTLE_S)
            spent.append(cpu_seconds(cgroup_cpu_file(box.container.id)) * 1000)
    return spent


def bare_start_ms(runs: int) -> list[float]:
    import docker
    client = docker.from_env()
    spent = []
    try:
        for _ in range(runs):
            box = client.containers.create(IMAGE, ["sleep", "60"], init=True, network_disabled=True,
                                           labels={"pid-bench-start-cpu": str(os.getpid())})
            try:
                box.start()
                time.sleep(SETTLE_S)
                spent.append(cpu_seconds(cgroup_cpu_file(box.id)) * 1000)
            finally:
                box.remove(force=True)
    finally:
        client.close()
    return spent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=8)
    args = parser.parse_args()
    pid, bare = pid_start_ms(args.runs), bare_start_ms(args.runs)
    print(f"a sandbox's start, its container's CPU: median {statistics.median(pid):.1f} ms "
          f"({min(pid):.1f}-{max(pid):.1f}); a bare container with init: {statistics.median(bare):.1f} ms")


if __name__ == "__main__":
    main()
