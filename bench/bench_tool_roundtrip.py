"""Tool-call round trip through the Docker sandbox's exec channel, against a plain `docker exec`.

    python bench/bench_tool_roundtrip.py [N] [RUNTIME]      (RUNTIME: an engine runtime, e.g. runsc for gVisor)

"back-to-back" sends the next call as soon as the previous one returns (worst case for the pre-started
command shells); "paced" leaves 20 ms between calls, as an LLM's tool calls are seconds apart. "cpu" is this
process's CPU per call, "box cpu" the container's (its cgroup: pid's server, the command's fresh shell and its
start; bench/container_cpu.py). The last line is the yardstick (bench/yardstick.py): a plain local fork+exec, to
compare runs on different days by.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.container_cpu import cgroup_cpu_file, cpu_seconds  # noqa: E402
from bench.yardstick import fork_exec_ms  # noqa: E402
from pid.sandbox import DockerSandbox, SandboxConfig  # noqa: E402


def measure(name: str, call: Callable[[], object], n: int, pause_s: float = 0.0,
            box_cpu: Callable[[], float] | None = None) -> None:
    call()
    time.sleep(0.05)   # (the last call's successor shell is up: its start is counted with the call that caused it)
    box_before = box_cpu() if box_cpu else 0.0
    samples, cpu = [], []
    for _ in range(n):
        if pause_s:
            time.sleep(pause_s)
        start, start_cpu = time.perf_counter(), time.process_time()
        call()
        samples.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    box = ""
    if box_cpu:
        time.sleep(0.05)
        box = f"   box cpu {(box_cpu() - box_before) / n * 1000:6.3f} ms"
    samples.sort()
    p95 = samples[min(len(samples) - 1, int(len(samples) * 0.95))]
    print(f"{name:<34} median {statistics.median(samples):7.3f} ms   p95 {p95:7.3f} ms   "
          f"cpu {statistics.median(cpu):6.3f} ms{box}   (n={n})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n", nargs="?", type=int, default=300, help="calls per measurement (default 300)")
    parser.add_argument("runtime", nargs="?", help="an engine runtime, e.g. runsc for gVisor")
    args = parser.parse_args()
    n, runtime = args.n, args.runtime
    with DockerSandbox.create(SandboxConfig(job_id="bench-tool-roundtrip", ttl_s=600, runtime=runtime)) as sb:
        sb.write_file("small.txt", b"hello world\n" * 20)
        page = bytes(range(256)) * 16                    # binary: NULs and backslashes included
        text = b"    return compute(value, other)  # comment\n" * 93
        counter = cgroup_cpu_file(sb.container.id)
        box = (lambda: cpu_seconds(counter)) if counter else None
        for pause, label in ((0.0, "back-to-back"), (0.02, "paced")):
            print(f"-- {label}")
            measure("exec('true')", lambda: sb.exec("true", timeout=10), n, pause, box)
            measure("exec('echo hi')", lambda: sb.exec("echo hi", timeout=10), n, pause, box)
            measure("read_file(small, max_bytes=64KiB)",
                    lambda: sb.read_file("small.txt", max_bytes=65536), n, pause, box)
            measure("read_file(small)", lambda: sb.read_file("small.txt"), n, pause, box)
            measure("write_file(4 KiB)", lambda: sb.write_file("w.bin", page), n, pause, box)
            measure("write_file(4 KiB text)", lambda: sb.write_file("w.txt", text), n, pause, box)
        print("-- for comparison")
        container = sb.container.client.containers.get(sb.container.id)
        measure("docker exec true (exec_run)", lambda: container.exec_run(["true"]), max(10, n // 10))
    print(f"{'yardstick: local fork+exec, paced':<34} median {fork_exec_ms(n):7.3f} ms")


if __name__ == "__main__":
    main()
