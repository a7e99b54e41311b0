"""Benchmark: the embedded broker under producers and consumers in separate processes — messages lost, duplicated
or unreadable, and the wall time — for pid's transport (`pidfs://`, jobs/transport.py) and, for comparison,
kombu's own `filesystem://` (which reads files still being written; not a test: how often it fails is luck).

Target for pidfs: 0 lost, 0 duplicated, 0 unreadable (issue 8).

    python bench/bench_broker.py [--transport pidfs|filesystem|both] [--per-producer 5000] [--runs 1]
                                 [--tmpdir /dev/shm]   # consumers' temp dir: kombu moves claimed files there
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.broker_stress import run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transport", choices=["pidfs", "filesystem", "both"], default="both")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--per-producer", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--tmpdir", default=None, help="the consumers' temp directory (kombu's transport uses it)")
    args = parser.parse_args()
    names = ["pidfs", "filesystem"] if args.transport == "both" else [args.transport]
    for name in names:
        for n in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="pid-bench-broker-") as folder:
                result = run(Path(folder), f"{name}://", args.producers, args.consumers, args.per_producer,
                             tmpdir=args.tmpdir)
            print(f"{name:10} run {n + 1}: sent {result.sent}  received {result.received}  lost {result.lost}  "
                  f"duplicated {result.duplicated}  unreadable {result.unreadable}  {result.seconds:.1f} s"
                  + (f"  first error: {result.errors[0]}" if result.errors else ""))


if __name__ == "__main__":
    main()
