"""Benchmark: the cost of one whole agent turn that is ours — stream a reply from an instant scripted model, run its
tool call in the container, record the session — measured in wall time and in this process's CPU time.

Target: <= 5 ms of wall and of CPU per turn (pi ~50 ms, mini-swe-agent ~85 ms).
The scripted model runs in a separate process so its CPU is not counted as ours; its own time per request (it parses
the whole conversation, as a real service does, in Python) is the model's latency, reported and also taken out.

    python bench/bench_agent_turn.py [--turns 200] [--tool bash|read|write]
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
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.yardstick import fork_exec_ms  # noqa: E402
from pid import events as ev  # noqa: E402
from pid.agent import Agent, Limits  # noqa: E402
from pid.providers import make_provider  # noqa: E402
from pid.providers.base import ProviderConfig  # noqa: E402
from pid.session import SessionWriter  # noqa: E402
from pid.tools.base import ToolContext  # noqa: E402
from pid.tools.registry import default_registry  # noqa: E402
from pid.sandbox import DockerSandbox, SandboxConfig  # noqa: E402

CALLS = {
    "bash": {"name": "bash", "arguments": {"command": "echo hi"}},
    "read": {"name": "read", "arguments": {"path": "README.md"}},
    "write": {"name": "write", "arguments": {"path": "out.txt", "content": "hello\n"}},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--tool", choices=sorted(CALLS), default="bash")
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="pid-bench-")
    script = os.path.join(tmp, "script.json")
    with open(script, "w") as f:
        json.dump([{"tool_calls": [CALLS[args.tool]]}] * args.turns + [{"text": "done"}], f)
    server = subprocess.Popen([sys.executable, "-m", "tests.scripted_llm", "--script", script],
                              stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    base_url = server.stdout.readline().strip()
    repo = os.path.join(tmp, "repo")
    os.makedirs(repo)
    with open(os.path.join(repo, "README.md"), "w") as f:
        f.write("# bench\n" * 20)

    marks: list[tuple[float, float]] = []

    def sink(event: ev.Event) -> None:
        if isinstance(event, ev.TurnStart):
            marks.append((time.perf_counter(), time.process_time()))

    handling: list[float] = []
    try:
        with DockerSandbox.create(SandboxConfig(job_id="bench-agent-turn", ttl_s=600)) as sandbox:
            sandbox.import_workspace(repo)
            provider = make_provider(ProviderConfig(model="bench", base_url=base_url))
            with SessionWriter(os.path.join(tmp, "session.jsonl")) as session:
                agent = Agent(provider, default_registry(), ToolContext(sandbox=sandbox), "You are a benchmark.",
                              session=session, sink=sink, limits=Limits(max_turns=args.turns + 5))
                outcome = agent.run("benchmark")
        with urllib.request.urlopen(base_url.rsplit("/v1", 1)[0] + "/_state", timeout=30) as reply:
            handling = json.load(reply)["handling_s"]
    finally:
        server.terminate()
        server.wait()
    assert outcome.status == "completed", outcome
    # Turn i spans TurnStart(i) -> TurnStart(i+1); skip the first few (connection set-up, warm caches).
    walls = [(b[0] - a[0]) * 1000 for a, b in zip(marks, marks[1:])][5:]
    cpus = [(b[1] - a[1]) * 1000 for a, b in zip(marks, marks[1:])][5:]
    model = [s * 1000 for s in handling[:len(marks) - 1]][5:]   # turn i asks the model once: request i
    q = lambda xs, p: sorted(xs)[int(len(xs) * p)]  # noqa: E731
    print(f"agent turn with one {args.tool} call, {len(walls)} turns measured")
    print(f"  wall  median {statistics.median(walls):.2f} ms  p95 {q(walls, 0.95):.2f} ms")
    print(f"  cpu   median {statistics.median(cpus):.2f} ms  p95 {q(cpus, 0.95):.2f} ms   (this process, all threads)")
    if len(model) == len(walls):
        ours = [w - m for w, m in zip(walls, model)]
        print(f"  the scripted model's own time per request: median {statistics.median(model):.2f} ms")
        print(f"  wall less the model's time: median {statistics.median(ours):.2f} ms  p95 {q(ours, 0.95):.2f} ms")
    print(f"  yardstick (bench/yardstick.py): a local fork+exec {fork_exec_ms():.2f} ms")
    print("  target: <= 5 ms wall and cpu")


if __name__ == "__main__":
    main()
