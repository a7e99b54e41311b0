"""Benchmark: a task image's own workdir (`--workdir /testbed`, no --repo), small and large, and what --check costs.

- start to first model request for a 3-file and a 20,000-file /testbed (issue 19's target: the large one within 1.5x
  of the small one: nothing of the image's tree is copied at start);
- a whole one-turn `pid run` with and without `--check true` (the check's fresh container is the difference).

The images are built here, FROM the sandbox image, offline, and removed afterwards. Runs alternate between the
variants, so that the VM's drift hits them alike.

    python bench/bench_task_image.py [--runs 7]
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

BASE = os.environ.get("PID_IMAGE", "pid-sandbox:latest")


def build(tmp: str, tag: str, dirs: int, per_dir: int) -> str:
    """An image whose /testbed is a git repository of dirs x per_dir small Python files."""
    context = os.path.join(tmp, tag.replace(":", "-"))
    os.makedirs(context)
    with open(os.path.join(context, "Dockerfile"), "w") as f:
        f.write(f"FROM {BASE}\n"
                f"RUN mkdir /testbed && cd /testbed && for d in $(seq 1 {dirs}); do mkdir d$d; "
                f"for i in $(seq 1 {per_dir}); do printf 'def f():\\n    return %s\\n' $i > d$d/m$i.py; done; done "
                "&& git init -q && git add -A && git -c user.name=b -c user.email=b@b commit -qm base\n")
    subprocess.run(["docker", "build", "-q", "--network", "none", "-t", tag, context], check=True,
                   capture_output=True, timeout=900)
    return tag


def one_run(image: str, home: str, out: str, check: bool = False) -> tuple[float, float]:
    """(seconds to the first model request, seconds to the end of `pid run`)."""
    return time_pid(["run", "t", "--workdir", "/testbed", "--image", image, "--out", out, "--json",
                     *(["--check", "true"] if check else [])], home)


def ms(samples: list[float]) -> str:
    samples = sorted(samples)
    return f"median {statistics.median(samples) * 1000:.0f} ms (min {samples[0] * 1000:.0f}, max " \
           f"{samples[-1] * 1000:.0f}, n={len(samples)})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    tags = [f"pid-bench-task:{os.getpid()}-3", f"pid-bench-task:{os.getpid()}-20k"]
    with tempfile.TemporaryDirectory(prefix="pid-bench-") as tmp:
        try:
            small, large = build(tmp, tags[0], 1, 3), build(tmp, tags[1], 200, 100)
            home, out = os.path.join(tmp, "home"), os.path.join(tmp, "out")
            for image in (small, large):   # warm the page cache
                one_run(image, home, out)
            first: dict[str, list[float]] = {"3 files": [], "20,000 files": []}
            ended: dict[str, list[float]] = {"3 files": [], "20,000 files": []}
            whole: dict[str, list[float]] = {"without --check": [], "with --check true": []}
            for _ in range(args.runs):
                for name, image in (("3 files", small), ("20,000 files", large)):
                    to_first, to_end = one_run(image, home, out)
                    first[name].append(to_first)
                    ended[name].append(to_end)
                whole["without --check"].append(one_run(small, home, out)[1])
                whole["with --check true"].append(one_run(small, home, out, check=True)[1])
        finally:
            subprocess.run(["docker", "rmi", "-f", *tags], capture_output=True, timeout=120)
    for name, samples in first.items():
        print(f"--workdir /testbed, {name}: pid run -> first model request {ms(samples)}")
    ratio = statistics.median(first["20,000 files"]) / statistics.median(first["3 files"])
    print(f"  20,000 files / 3 files: {ratio:.2f}x")
    for name, samples in ended.items():   # (the patch's base, recorded while the agent works, is waited for)
        print(f"--workdir /testbed, {name}: a one-turn pid run to its end {ms(samples)}")
    for name, samples in whole.items():
        print(f"a one-turn pid run, {name}: {ms(samples)}")
    extra = statistics.median(whole["with --check true"]) - statistics.median(whole["without --check"])
    print(f"  the check's fresh container: +{extra * 1000:.0f} ms")


if __name__ == "__main__":
    main()
