"""Benchmark: a burst — N jobs submitted together to one idle `pid worker --concurrency N` — until the last of them
reaches the model, beside the engine's own rate of starting containers in parallel, measured in the same run.

The jobs go in by one `pid batch --detach` (the repository packed once, every job queued at once); the clock starts
as the command starts and stops at the last job's first model request. The model thinks `--think` seconds (5) before
it replies, as a real one does: a job that reached it keeps waiting, instead of ending and being torn down (its patch
collected, its container and disks removed) while the others still start. This machine is CPU-bound in a burst, so
with `--think 0` those ends share the CPU with the starts, and the figure mixes the two. `--tree DIR` runs another
checkout's pid (an older commit, for a comparison in the same minutes). The engine alone: 32 containers of the
sandbox image created and started 16 at a time with the docker SDK (no pid, none removed until the count is done),
before and after the burst.

Targets (issue 24): 32 jobs all at the model within 8 s; jobs started per second >= 80 % of the engine's rate.

    python bench/bench_burst.py [--jobs 32] [--pool 0] [--rounds 2] [--think 5] [--tree DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.bench_run_startup import small_repo  # noqa: E402
from tests.scripted_llm import ScriptedLLM  # noqa: E402

IMAGE = "pid-sandbox:latest"


def engine_rate(count: int = 32, parallel: int = 16) -> float:
    """Containers per second the engine creates and starts, `parallel` at a time (hardened roughly as pid's are)."""
    import docker
    client = docker.from_env(max_pool_size=parallel)   # (the default 10 connections for 16 threads dropped some)
    label = f"pid-bench-engine-rate={os.getpid()}"

    def one(_: int) -> None:
        container = client.containers.create(IMAGE, ["sleep", "60"], network_mode="none", mem_limit="2g",
                                             pids_limit=512, cap_drop=["ALL"], security_opt=["no-new-privileges"],
                                             labels=dict([label.split("=")]))
        container.start()

    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(parallel) as pool:
            list(pool.map(one, range(count)))
        return count / (time.perf_counter() - started)
    finally:   # every container of this run, by its label: also one whose create failed half-way or never returned
        made = [c["Id"] for c in client.api.containers(all=True, filters={"label": label})]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda cid: client.api.remove_container(cid, force=True), made))
        client.close()


def wait_for_pool(home: str, want: int, timeout: float = 300) -> None:
    import docker

    from pid.sandbox.reaper import owner_label
    client = docker.from_env()
    deadline = time.time() + timeout
    while time.time() < deadline:
        listed = client.api.containers(filters={"label": ["pid.pool", f"pid.owner={owner_label(home)}"]})
        if sum(not any(n.startswith("/pid-job-") for n in c.get("Names") or []) for c in listed) >= want:
            return
        time.sleep(0.2)
    client.close()
    raise SystemExit(f"the worker's warm pool did not reach {want} ready sandboxes")


def burst(jobs: int, pool: int, tree: str, think: float) -> tuple[float, float]:
    """(seconds from the submission to the last job's first model request, the submission's own seconds)."""
    pid_cli = [sys.executable, "-m", "pid.cli.main" if os.path.isdir(os.path.join(tree, "pid", "cli")) else "cli.main"]
    with tempfile.TemporaryDirectory(prefix="pid-bench-burst-") as root:
        home = os.path.join(root, "home")
        env = dict(os.environ, PID_HOME=home, PYTHONPATH=tree)
        repo = small_repo(root)
        log_path = os.path.join(root, "worker.log")
        with open(log_path, "w") as log:
            worker = subprocess.Popen([*pid_cli, "worker", "--concurrency", str(jobs),
                                       *(["--pool", str(pool)] if pool else [])],
                                      env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tree)
        try:
            while "ready" not in Path(log_path).read_text():
                if worker.poll() is not None:
                    raise SystemExit(Path(log_path).read_text())
                time.sleep(0.05)
            model = ["--model", "m", "--base-url", "", "--api-key", "k"]
            with ScriptedLLM(responder=lambda body: {"text": "done", "delay_s": think}) as llm:
                model[3] = llm.base_url
                if pool:   # one job first makes the class known; then the pool fills
                    subprocess.run([*pid_cli, "submit", "warm", "--repo", repo, *model, "--wait"], env=env,
                                   cwd=tree, check=True, capture_output=True, timeout=300)
                    wait_for_pool(home, pool)
                    llm.arrived.clear()
                tasks = os.path.join(root, "tasks.jsonl")
                with open(tasks, "w") as f:
                    for n in range(jobs):
                        f.write(json.dumps({"id": f"b{n}", "task": f"burst {n}", "repo": repo}) + "\n")
                time.sleep(1)   # the worker idle
                started = time.time()
                subprocess.run([*pid_cli, "batch", tasks, "--out", os.path.join(root, "out"), "--detach", *model],
                               env=env, cwd=tree, check=True, capture_output=True, timeout=300)
                submitted = time.time() - started
                deadline = time.time() + 300
                while len(llm.arrived) < jobs:
                    if time.time() > deadline or worker.poll() is not None:
                        raise SystemExit(f"{len(llm.arrived)} of {jobs} reached the model:\n"
                                         + Path(log_path).read_text()[-3000:])
                    time.sleep(0.01)
                return max(llm.arrived) - started, submitted
        finally:
            worker.terminate()
            worker.wait(timeout=300)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=32)
    parser.add_argument("--pool", type=int, default=0, help="the worker's --pool (filled before the burst)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--think", type=float, default=5.0, help="seconds the model takes to reply (0: at once)")
    parser.add_argument("--tree", default=ROOT, help="the checkout whose pid runs (default: this one)")
    args = parser.parse_args()
    rates, took = [engine_rate()], []
    for _ in range(args.rounds):
        last, submitted = burst(args.jobs, args.pool, os.path.abspath(args.tree), args.think)
        took.append(last)
        print(f"{args.jobs} jobs, pool {args.pool}, think {args.think:g} s: the last at the model {last:.2f} s after "
              f"the submission began (the submission itself {submitted:.2f} s)", flush=True)
        rates.append(engine_rate())
    engine = statistics.median(rates)
    jobs_rate = args.jobs / statistics.median(took)
    print(f"engine alone: {engine:.1f} containers/s, 16 at a time ({', '.join(f'{r:.1f}' for r in rates)}); "
          f"pid: {jobs_rate:.1f} jobs/s to the model = {jobs_rate / engine:.0%} of the engine's rate; median "
          f"{statistics.median(took):.2f} s for all {args.jobs} (target <= 8 s for 32)")


if __name__ == "__main__":
    main()
