"""The model server of docker/compose-smoke.sh: tests/scripted_llm.py answering each job by its task, so that jobs
running at once on several workers get their own answers. It runs in a container on the compose stack's network
(the worker image's Python; only the standard library), reached by the workers as http://model:8000/v1.

A task names its job, "smoke-<name>": the first request of an attempt gets one bash call, the request that carries
its result gets the final answer. The command writes <name>.txt in the workspace (the patch); a task with "slow" in
its name sleeps SLOW_S in its first attempt, so that its worker can be killed while it runs, and not in the next.
GET /_state lists the requests, so the smoke can tell each attempt apart.

    python3 -m tests.compose_model --port 8000
"""
from __future__ import annotations

import argparse
import json
import re
import threading
from typing import Any

from tests.scripted_llm import ScriptedLLM, serve_until_signalled

SLOW_S = 300


class ComposeModel:
    def __init__(self) -> None:
        self.attempts: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps(body.get("messages", []))
        found = re.search(r"smoke-[a-z0-9-]+", text)
        name = found.group(0) if found else "smoke-unnamed"
        if f'"call-{name}-' in text:
            return {"text": f"done {name}"}
        with self._lock:
            attempt = self.attempts[name] = self.attempts.get(name, 0) + 1
        command = f"printf '%s\\n' {name} > {name}.txt"
        if "slow" in name and attempt == 1:
            command += f" && sleep {SLOW_S}"
        return {"tool_calls": [{"id": f"call-{name}-{attempt}", "name": "bash", "arguments": {"command": command}}]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    llm = ScriptedLLM(responder=ComposeModel(), host=args.host, port=args.port).start()
    serve_until_signalled(llm, f"serving on port {llm.port}")


if __name__ == "__main__":
    main()
