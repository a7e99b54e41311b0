"""Benchmark: the cost of one streamed model call that is ours — a 3-chunk reply from a local scripted server, in
both wire formats, client and server together (the server runs in this process).

    python bench/bench_provider_call.py [--calls 300]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pid.messages import ToolSpec, UserMessage  # noqa: E402
from pid.providers import ProviderConfig, make_provider  # noqa: E402
from tests.scripted_llm import ScriptedLLM  # noqa: E402

BASH = ToolSpec("bash", "Run a command.", {"type": "object", "properties": {"command": {"type": "string"}},
                                           "required": ["command"]})
HELLO = [UserMessage.text("hello")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    n = parser.parse_args().calls
    for api in ("openai-completions", "anthropic-messages"):
        with ScriptedLLM([{"text": "one two three"}] * (n + 20)) as llm:
            provider = make_provider(ProviderConfig(model="bench", base_url=llm.base_url, api=api))
            for _ in range(20):
                provider.stream("system", HELLO, [BASH])
            times = []
            for _ in range(n):
                started = time.perf_counter()
                reply = provider.stream("system", HELLO, [BASH], cancel=threading.Event())
                times.append(time.perf_counter() - started)
            assert reply.text == "one two three", reply.error_message
            provider.close()
        times.sort()
        print(f"{api}: streamed 3-chunk reply, median {statistics.median(times) * 1e3:.2f} ms, "
              f"p95 {times[int(n * 0.95)] * 1e3:.2f} ms over {n} calls (client + local server)")


if __name__ == "__main__":
    main()
