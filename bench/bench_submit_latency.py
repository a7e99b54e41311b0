"""Benchmark: `pid submit` to the job's first model request, on an idle worker — the client's start-up and packing,
the broker, the worker taking the job, its sandbox and workspace import. With Redis as broker and store (a private
redis-server started here) and on the embedded default. `--api`: pid.submit(...) called in this (running) process
instead of the command, which leaves out the CLI's own start.

Targets: issue 9, <= 1 s with Redis (median); issue 24, <= 0.30 s for `pid submit` and <= 0.15 s for pid.submit.

    python bench/bench_submit_latency.py [--runs 7] [--broker redis|embedded|both] [--api] [--pool N]

--pool N: the worker keeps N ready sandboxes (`pid worker --pool N`); the first, unmeasured, job makes its class
known; before each measured submit the bench waits (unmeasured) until the worker has one ready, so that each job
takes one: an idle warm worker, as the target says.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.bench_run_startup import small_repo  # noqa: E402
from tests.brokers import RedisServer  # noqa: E402
from tests.scripted_llm import ScriptedLLM  # noqa: E402


def submit_with_cli(env: dict[str, str], task: str, repo: str, base_url: str, out: str) -> None:
    subprocess.run([sys.executable, "-m", "pid.cli.main", "submit", task, "--repo", repo, "--model", "m", "--base-url",
                    base_url, "--api-key", "k", "--out", out], env=env, check=True, capture_output=True)


def submit_with_api(env: dict[str, str], task: str, repo: str, base_url: str, out: str) -> None:
    os.environ.update({k: v for k, v in env.items() if k.startswith("PID_")})   # (read as each call is made)
    import pid
    pid.submit(task, repo, model="m", base_url=base_url, api_key="k", out_dir=out)


def measure(broker: str, runs: int, submit=submit_with_cli, pool: int = 0) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="pid-bench-submit-") as root:
        env = dict(os.environ, PID_HOME=os.path.join(root, "home"), PYTHONPATH=ROOT)
        redis = None
        if broker == "redis":
            redis = RedisServer(Path(root) / "redis")
            redis.start()
            env["PID_BROKER_URL"] = redis.url
        repo = small_repo(root)
        os.makedirs(os.path.join(root, "out"))
        log_path = os.path.join(root, "worker.log")
        with open(log_path, "w") as log:
            worker = subprocess.Popen([sys.executable, "-m", "pid.cli.main", "worker", "--concurrency", "2",
                                       "--pool", str(pool)],
                                      env=env, stdout=log, stderr=subprocess.STDOUT)
        samples = []
        try:
            while "ready" not in open(log_path).read():
                time.sleep(0.05)
            for n in range(runs + 1):   # the first warms the engine's and the OS's caches
                if pool and n:
                    wait_for_ready_sandbox(env["PID_HOME"])
                with ScriptedLLM([{"text": "done"}]) as llm:
                    started = time.time()
                    submit(env, f"t{n}", repo, llm.base_url, os.path.join(root, "out"))
                    while not llm.arrived:
                        time.sleep(0.005)
                    if n:
                        samples.append(llm.arrived[0] - started)
                    time.sleep(1.5)   # the job ends; the worker is idle again
        finally:
            worker.terminate()
            worker.wait(timeout=120)
            if redis is not None:
                redis.stop()
        return samples


def wait_for_ready_sandbox(home: str, timeout: float = 60) -> None:
    """Until the worker's warm pool has a sandbox ready (labelled pid.pool, not yet renamed for a job)."""
    import docker

    from pid.sandbox.reaper import owner_label
    client = docker.from_env()
    deadline = time.time() + timeout
    while time.time() < deadline:
        listed = client.api.containers(filters={"label": ["pid.pool", f"pid.owner={owner_label(home)}"]})
        if any(not name.startswith("/pid-job-") for c in listed for name in c.get("Names") or []):
            return
        time.sleep(0.05)
    raise SystemExit("the worker's warm pool made no sandbox")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--broker", choices=["redis", "embedded", "both"], default="both")
    parser.add_argument("--api", action="store_true", help="pid.submit(...) in this process, not `pid submit`")
    parser.add_argument("--pool", type=int, default=0, help="the worker's --pool (0: none)")
    args = parser.parse_args()
    if args.api and args.broker == "both":
        parser.error("--api measures one broker per process (pid's store and broker connections are kept per process)")
    what = "pid.submit" if args.api else "pid submit"
    for broker in (["redis", "embedded"] if args.broker == "both" else [args.broker]):
        samples = sorted(measure(broker, args.runs, submit_with_api if args.api else submit_with_cli, args.pool))
        print(f"{broker:9} pool {args.pool} {what} -> first model request: median {statistics.median(samples):.3f} s "
              f"(min {samples[0]:.3f}, max {samples[-1]:.3f}, n={len(samples)})")


if __name__ == "__main__":
    main()
