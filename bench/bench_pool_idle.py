"""Benchmark: what a warm pool costs an idle worker (issue 24: at most 1 % of a core, its memory reported).

Two workers in turn on the embedded default, one with `--pool N` and one without; each runs one job (which makes the
pool's class known), then idles for `--seconds` while the bench counts the CPU it and everything it keeps spend: the
worker's processes, the containers it keeps (their cgroups) and their containerd shims, and dockerd and containerd
(the engine's idle housekeeping is there with or without a pool: the difference between the two runs is the pool's).
Memory: what `pid workers --json` reports for the pool, and the containers' cgroups as the bench reads them.

    python bench/bench_pool_idle.py [--pool 4] [--seconds 60]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.bench_run_startup import small_repo  # noqa: E402
from bench.container_cpu import cgroup_cpu_file, cgroup_files, cpu_seconds  # noqa: E402
from bench.bench_submit_latency import wait_for_ready_sandbox  # noqa: E402
from tests.scripted_llm import ScriptedLLM  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """Seconds of CPU the process has used (user and system), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def children(pid: int) -> list[int]:
    """The process and all its descendants."""
    parents: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(rest[1]), []).append(int(stat.split("/")[2]))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += parents.get(p, [])
    return found


def pids_named(*names: str) -> list[int]:
    found = []
    for comm in glob.glob("/proc/[0-9]*/comm"):
        try:
            with open(comm) as f:
                if f.read().strip() in names:
                    found.append(int(comm.split("/")[2]))
        except OSError:
            pass
    return found


def shim_of(cid: str) -> list[int]:
    found = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(cmdline, "rb") as f:
                text = f.read()
        except OSError:
            continue
        if cid.encode() in text and b"containerd-shim" in text:
            found.append(int(cmdline.split("/")[2]))
    return found


def kept_containers(home: str) -> list[str]:
    import docker

    from pid.sandbox.reaper import owner_label
    listed = docker.from_env().api.containers(filters={"label": f"pid.owner={owner_label(home)}"})
    return [c["Id"] for c in listed]


def measure(pool: int, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="pid-bench-pool-") as root:
        env = dict(os.environ, PID_HOME=os.path.join(root, "home"), PYTHONPATH=ROOT)
        repo = small_repo(root)
        log_path = os.path.join(root, "worker.log")
        with open(log_path, "w") as log:
            worker = subprocess.Popen([sys.executable, "-m", "pid.cli.main", "worker", "--concurrency", "2",
                                       "--pool", str(pool)], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while "ready" not in open(log_path).read():
                time.sleep(0.05)
            with ScriptedLLM([{"text": "done"}]) as llm:
                subprocess.run([sys.executable, "-m", "pid.cli.main", "submit", "t", "--repo", repo, "--model", "m",
                                "--base-url", llm.base_url, "--api-key", "k", "--wait"], env=env, check=True,
                               capture_output=True)
            if pool:
                deadline = time.time() + 120
                while len(kept_containers(env["PID_HOME"])) < pool and time.time() < deadline:
                    wait_for_ready_sandbox(env["PID_HOME"])
                    time.sleep(0.2)
            time.sleep(3)   # the job's own removal and the last refill settle
            cids = kept_containers(env["PID_HOME"])
            cpu_files = [cgroup_cpu_file(cid) for cid in cids]   # (cgroup v2's or v1's)
            memory = [(cgroup_files(cid, "memory.current") or cgroup_files(cid, "memory.usage_in_bytes") or [None])[0]
                      for cid in cids]
            shims = [p for cid in cids for p in shim_of(cid)]
            engine = pids_named("dockerd", "containerd")

            def snapshot() -> tuple[float, float, float, float]:
                return (sum(process_cpu(p) for p in children(worker.pid)),
                        sum(cpu_seconds(f) for f in cpu_files), sum(process_cpu(p) for p in shims),
                        sum(process_cpu(p) for p in engine))

            before, started = snapshot(), time.time()
            time.sleep(seconds)
            after, elapsed = snapshot(), time.time() - started
            listed = json.loads(subprocess.run([sys.executable, "-m", "pid.cli.main", "workers", "--json"], env=env,
                                               check=True, capture_output=True, text=True).stdout)
            reported = sum(entry.get("memory", 0) for w in (listed if isinstance(listed, list) else [])
                           for entry in (w.get("pool") or []))
            read = 0
            for path in memory:
                if path:
                    with open(path) as f:
                        read += int(f.read())
        finally:
            worker.terminate()
            worker.wait(timeout=120)
        share = [(a - b) / elapsed * 100 for a, b in zip(after, before)]
        return {"containers": len(cids), "worker": share[0], "sandboxes": share[1], "shims": share[2],
                "engine": share[3], "reported_mib": reported / 2**20, "cgroups_mib": read / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pool", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    rows = {n: measure(n, args.seconds) for n in (0, args.pool)}
    for n, row in rows.items():
        print(f"pool {n:2}: {row['containers']} containers kept; % of a core: worker {row['worker']:.2f}, their "
              f"processes {row['sandboxes']:.2f}, shims {row['shims']:.2f}, dockerd+containerd {row['engine']:.2f}; "
              f"memory reported {row['reported_mib']:.1f} MiB, cgroups {row['cgroups_mib']:.1f} MiB")
    cost = sum(rows[args.pool][k] - rows[0][k] for k in ("worker", "sandboxes", "shims", "engine"))
    print(f"the pool of {args.pool} costs the idle worker {cost:.2f} % of a core (target <= 1 %)")


if __name__ == "__main__":
    main()
