"""Benchmark: `pid batch` itself. (1) Submit throughput: a 1,000-line tasks file over one repository, `--detach`
(check every line, pack the repo once, ledger, create and dispatch every job), items per second, embedded and Redis.
(2) The command's own CPU per item while it follows a batch run by a separate worker (the model answers at once):
`pid batch --wait DIR`'s user+system CPU (wait4) divided by the items, beyond the model's time. Goal: <= 0.2 s.

    python bench/bench_batch.py [--items 1000] [--follow-items 24] [--broker embedded|redis|both]
"""
from __future__ import annotations

import argparse
import json
import os
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


def write_tasks(path: str, repo: str, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"t{i}", "task": f"task {i}", "repo": repo}) + "\n")


def run_cpu(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall time, the process's own CPU (user + system, its waited-for children included: none here), exit code."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.monotonic() - started, usage.ru_utime + usage.ru_stime, proc.returncode


def measure(broker: str, items: int, follow_items: int) -> None:
    with tempfile.TemporaryDirectory(prefix="pid-bench-batch-") as root:
        env = dict(os.environ, PID_HOME=os.path.join(root, "home"), PYTHONPATH=ROOT)
        redis = None
        if broker == "redis":
            redis = RedisServer(Path(root) / "redis")
            redis.start()
            env["PID_BROKER_URL"] = redis.url
        try:
            repo = small_repo(root)
            tasks = os.path.join(root, "tasks.jsonl")
            write_tasks(tasks, repo, items)
            base = [sys.executable, "-m", "pid.cli.main", "batch"]
            wall, cpu, code = run_cpu([*base, tasks, "--out", os.path.join(root, "big"), "--model", "m",
                                       "--base-url", "http://127.0.0.1:9/v1", "--detach"], env)
            assert code == 0, code
            print(f"{broker:9} submit {items} items: {wall:.2f} s wall ({items / wall:.0f} items/s), "
                  f"{cpu:.2f} s CPU ({cpu / items * 1000:.1f} ms per item)")
            follow(broker, root, env, repo, follow_items)
        finally:
            if redis is not None:
                redis.stop()


def follow(broker: str, root: str, env: dict[str, str], repo: str, n: int) -> None:
    tasks = os.path.join(root, "small.jsonl")
    write_tasks(tasks, repo, n)
    out = os.path.join(root, "small")
    log_path = os.path.join(root, "worker.log")
    with ScriptedLLM(responder=lambda body: {"text": "done"}) as llm:
        base = [sys.executable, "-m", "pid.cli.main", "batch"]
        subprocess.run([*base, tasks, "--out", out, "--model", "m", "--base-url", llm.base_url, "--detach",
                        "--queue", "bench"], env=env, check=True, capture_output=True)
        with open(log_path, "w") as log:
            worker = subprocess.Popen([sys.executable, "-m", "pid.cli.main", "worker", "--concurrency", "4", "--queue",
                                       "bench"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wall, cpu, code = run_cpu([*base, "--wait", out, "--json"], env)
        finally:
            worker.terminate()
            worker.wait(timeout=120)
    summary = json.load(open(os.path.join(out, "summary.json")))
    print(f"{broker:9} follow {n} items (worker elsewhere, instant model): {wall:.1f} s wall, the command's CPU "
          f"{cpu:.2f} s = {cpu / n * 1000:.0f} ms per item (exit {code}, {summary['by_status']})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--follow-items", type=int, default=24)
    parser.add_argument("--broker", choices=["redis", "embedded", "both"], default="both")
    args = parser.parse_args()
    for broker in (["embedded", "redis"] if args.broker == "both" else [args.broker]):
        measure(broker, args.items, args.follow_items)


if __name__ == "__main__":
    main()
