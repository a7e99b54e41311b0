"""Benchmark: `pid run` to the first model request, for a small repository — everything a job pays before the model
can start: interpreter and imports, the job disk, the container, its servers, the workspace import and base commit.

Target: <= 1.2 s (median).

    python bench/bench_run_startup.py [--runs 7]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.first_request import time_pid  # noqa: E402


def small_repo(root: str) -> str:
    repo = os.path.join(root, "repo")
    os.makedirs(os.path.join(repo, "src"))
    for i in range(20):
        with open(os.path.join(repo, "src", f"m{i}.py"), "w") as f:
            f.write(f"def f{i}():\n    return {i}\n" * 20)
    subprocess.run(["git", "init", "-q", repo], check=True)
    subprocess.run(["git", "-C", repo, "-c", "user.name=b", "-c", "user.email=b@b", "add", "-A"], check=True)
    subprocess.run(["git", "-C", repo, "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "init"],
                   check=True)
    return repo


def one_run(repo: str, home: str, out: str) -> float:
    return time_pid(["run", "t", "--repo", repo, "--out", out, "--json"], home)[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pid-bench-") as tmp:
        repo = small_repo(tmp)
        one_run(repo, os.path.join(tmp, "home"), os.path.join(tmp, "out"))      # warm the page cache
        samples = sorted(one_run(repo, os.path.join(tmp, "home"), os.path.join(tmp, "out")) for _ in range(args.runs))
    print(f"pid run -> first model request: median {statistics.median(samples) * 1000:.0f} ms, "
          f"min {samples[0] * 1000:.0f} ms, max {samples[-1] * 1000:.0f} ms (n={args.runs})")


if __name__ == "__main__":
    main()
