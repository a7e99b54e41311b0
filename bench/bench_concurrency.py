"""Benchmark: many jobs at once on one worker — the worker's CPU (a fraction of a core), its memory, and the CPU a
job costs beyond its turns. Every job runs TURNS turns of one bash command against a scripted model that thinks
THINK seconds before each reply; the jobs are queued first, then one `pid worker --concurrency C` runs them all.

The fixed CPU per job is the intercept of the worker's CPU per job over the number of turns: two rounds, with
1 and with TURNS turns per job.

Targets (issue 9): 64 concurrent jobs with a 1 s think time on this 2-core machine, harness CPU below half a core,
fixed CPU per job <= 0.2 s.

    python bench/bench_concurrency.py [--jobs 64] [--turns 6] [--think 1.0] [--pool N]

--pool N: the worker starts first, with `--pool N`; one job makes the class known, the pool fills, and then the jobs
are queued at once (one `pid batch --detach`) instead of before the worker starts.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.bench_run_startup import small_repo  # noqa: E402
from tests.scripted_llm import ScriptedLLM  # noqa: E402


class Model:
    """Job "conc-N" gets `turns` tool calls, then a final answer; every reply after `think` seconds (the scripted
    server waits outside its lock, so replies overlap)."""

    def __init__(self, turns: int, think: float) -> None:
        self.turns, self.think = turns, think

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        done = json.dumps(body.get("messages", [])).count('"role": "tool"')
        if done >= self.turns:
            return {"text": "done", "delay_s": self.think}
        return {"tool_calls": [{"id": f"call-{done}", "name": "bash", "arguments": {"command": "echo hi"}}],
                "delay_s": self.think}


def most_at_once(arrived: list[float], think: float) -> int:
    """How many model requests were waiting at once at most (each waits `think` seconds from its arrival)."""
    times = sorted(arrived)
    return max((sum(1 for u in times if t <= u < t + think) for t in times), default=0)


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1)) / 1024   # type: ignore[union-attr]


@dataclass
class Round:
    jobs: int
    turns: int
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    most_in_flight: int
    completed: int


def one_round(jobs: int, turns: int, think: float, concurrency: int, pool: int = 0) -> Round:
    if pool:
        return pooled_round(jobs, turns, think, concurrency, pool)
    with tempfile.TemporaryDirectory(prefix="pid-bench-conc-") as root:
        home = os.path.join(root, "home")
        env = dict(os.environ, PID_HOME=home, PYTHONPATH=ROOT)
        repo = small_repo(root)
        os.makedirs(os.path.join(root, "out"))
        model = Model(turns, think)
        with ScriptedLLM(responder=model) as llm:
            ids = []
            for n in range(jobs):
                out = subprocess.run([sys.executable, "-m", "pid.cli.main", "submit", f"conc-{n}", "--repo", repo,
                                      "--model", "m", "--base-url", llm.base_url, "--api-key", "k",
                                      "--out", os.path.join(root, "out")],
                                     env=env, capture_output=True, text=True)
                if out.returncode != 0:
                    raise RuntimeError(f"submit failed: {out.stderr}")
                ids.append(out.stdout.strip())
            log_path = os.path.join(root, "worker.log")
            with open(log_path, "w") as log:
                worker = subprocess.Popen([sys.executable, "-m", "pid.cli.main", "worker", "--concurrency",
                                           str(concurrency)], env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                while "ready" not in Path(log_path).read_text():
                    time.sleep(0.05)
                started, cpu_before = time.monotonic(), cpu_s(worker.pid)
                while (text := Path(log_path).read_text()).count(" completed (") + text.count(" failed (") < jobs:
                    if worker.poll() is not None or time.monotonic() - started > 600:
                        raise RuntimeError("the worker stopped or took too long:\n" + text[-3000:])
                    time.sleep(0.2)
                wall, cpu = time.monotonic() - started, cpu_s(worker.pid) - cpu_before
                rss = peak_rss_mb(worker.pid)
                completed = Path(log_path).read_text().count(" completed (")
            finally:
                worker.terminate()
                worker.wait(timeout=120)
        return Round(jobs, turns, wall, cpu, rss, most_at_once(llm.arrived, think), completed)


def pooled_round(jobs: int, turns: int, think: float, concurrency: int, pool: int) -> Round:
    from bench.bench_burst import wait_for_pool
    with tempfile.TemporaryDirectory(prefix="pid-bench-conc-") as root:
        home = os.path.join(root, "home")
        env = dict(os.environ, PID_HOME=home, PYTHONPATH=ROOT)
        repo = small_repo(root)
        cli = [sys.executable, "-m", "pid.cli.main"]
        log_path = os.path.join(root, "worker.log")
        with open(log_path, "w") as log:
            worker = subprocess.Popen([*cli, "worker", "--concurrency", str(concurrency), "--pool", str(pool)],
                                      env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while "ready" not in Path(log_path).read_text():
                time.sleep(0.05)
            with ScriptedLLM(responder=Model(0, 0)) as warm:
                subprocess.run([*cli, "submit", "warm", "--repo", repo, "--model", "m", "--base-url", warm.base_url,
                                "--api-key", "k", "--wait"], env=env, check=True, capture_output=True, timeout=300)
            wait_for_pool(home, pool)
            tasks = os.path.join(root, "tasks.jsonl")
            with open(tasks, "w") as f:
                f.writelines(json.dumps({"id": f"c{n}", "task": f"conc-{n}", "repo": repo}) + "\n"
                             for n in range(jobs))
            with ScriptedLLM(responder=Model(turns, think)) as llm:
                started, cpu_before = time.monotonic(), cpu_s(worker.pid)
                subprocess.run([*cli, "batch", tasks, "--out", os.path.join(root, "out"), "--detach", "--model", "m",
                                "--base-url", llm.base_url, "--api-key", "k"], env=env, check=True,
                               capture_output=True, timeout=300)
                while (text := Path(log_path).read_text()).count(" completed (") + text.count(" failed (") < jobs + 1:
                    if worker.poll() is not None or time.monotonic() - started > 600:
                        raise RuntimeError("the worker stopped or took too long:\n" + text[-3000:])
                    time.sleep(0.2)
                wall, cpu = time.monotonic() - started, cpu_s(worker.pid) - cpu_before
                rss = peak_rss_mb(worker.pid)
                completed = Path(log_path).read_text().count(" completed (") - 1
        finally:
            worker.terminate()
            worker.wait(timeout=120)
        return Round(jobs, turns, wall, cpu, rss, most_at_once(llm.arrived, think), completed)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--think", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=None, help="the worker's (default: --jobs)")
    parser.add_argument("--pool", type=int, default=0, help="the worker's --pool (filled before the jobs go in)")
    args = parser.parse_args()
    concurrency = args.concurrency or args.jobs
    rounds = [one_round(args.jobs, turns, args.think, concurrency, args.pool) for turns in (1, args.turns)]
    for r in rounds:
        print(f"{r.jobs} jobs x {r.turns} turn(s), think {args.think} s, concurrency {concurrency}, pool {args.pool}: "
              f"{r.completed} completed in {r.wall_s:.1f} s; model requests in flight at most {r.most_in_flight}; "
              f"worker CPU {r.cpu_s:.1f} s = {r.cpu_s / r.wall_s:.2f} core, {r.cpu_s / r.jobs:.3f} s per job; "
              f"peak RSS {r.peak_rss_mb:.0f} MB")
    short, long = rounds
    per_turn = (long.cpu_s - short.cpu_s) / (long.jobs * (long.turns - short.turns))
    fixed = short.cpu_s / short.jobs - short.turns * per_turn
    print(f"worker CPU per turn {per_turn * 1000:.1f} ms; fixed CPU per job {fixed:.3f} s (target <= 0.2 s); "
          f"memory per job ~{(long.peak_rss_mb) / long.jobs:.1f} MB of the worker's peak")


if __name__ == "__main__":
    main()
