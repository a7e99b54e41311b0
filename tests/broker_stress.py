"""A stress run of a kombu filesystem-style broker: producer and consumer processes on one queue folder, then a count
of what was lost, duplicated or unreadable. Used by tests/test_transport.py (pid's transport must come out clean) and
by bench/bench_broker.py (which also runs it against kombu's own `filesystem://` transport, for comparison).

Every process is a spawned interpreter with its own kombu Connection, as separate workers and submitters are.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

QUEUE = "stress"


@dataclass
class StressResult:
    sent: int
    received: int
    lost: int                 # sent, never received
    duplicated: int           # received more than once (extra copies)
    unreadable: int           # errors a consumer got instead of a message, plus messages set aside as bad
    seconds: float
    errors: list[str] = field(default_factory=list)   # the first few error texts, for the report


def transport_options(folder: Path) -> dict[str, Any]:
    queue, control = folder / "queue", folder / "control"
    for f in (queue, control):
        f.mkdir(parents=True, exist_ok=True)
    return {"data_folder_in": str(queue), "data_folder_out": str(queue), "control_folder": str(control),
            "store_processed": False}


def _connect(url: str, options: dict[str, Any]) -> Any:
    import kombu

    if url.startswith("pidfs://"):
        from pid.jobs.transport import register
        register()
    return kombu.Connection(url, transport_options=options)


def _produce(url: str, options: dict[str, Any], producer: int, count: int, start: Any) -> None:
    with _connect(url, options) as conn:
        queue = conn.SimpleQueue(QUEUE)
        start.wait()
        for i in range(count):
            queue.put({"p": producer, "i": i})


def _consume(url: str, options: dict[str, Any], out: str, tmpdir: str | None, start: Any, done: Any) -> None:
    if tmpdir:
        tempfile.tempdir = tmpdir       # where kombu's transport moves a claimed file when store_processed is off
    received: list[list[int]] = []
    errors: list[str] = []
    with _connect(url, options) as conn:
        queue = conn.SimpleQueue(QUEUE)
        start.wait()
        while True:
            producers_done = done.is_set()
            try:
                message = queue.get_nowait()
            except queue.Empty:
                if producers_done:
                    break
                time.sleep(0.001)
                continue
            except Exception as exc:  # noqa: BLE001 - what a broken transport raises is the measurement
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            received.append([message.payload["p"], message.payload["i"]])
            message.ack()
    Path(out).write_text(json.dumps({"received": received, "errors": errors}))


def run(folder: Path, url: str = "pidfs://", producers: int = 2, consumers: int = 2, per_producer: int = 5000,
        tmpdir: str | None = None) -> StressResult:
    """Start the consumers, then the producers at once; when every producer is done the consumers drain the queue
    and stop. `tmpdir`: the consumers' temp directory (kombu's transport moves messages there)."""
    ctx = multiprocessing.get_context("spawn")
    options = transport_options(folder)
    start, done = ctx.Event(), ctx.Event()
    outs = [str(folder / f"consumer-{c}.json") for c in range(consumers)]
    consuming = [ctx.Process(target=_consume, args=(url, options, out, tmpdir, start, done)) for out in outs]
    producing = [ctx.Process(target=_produce, args=(url, options, p, per_producer, start)) for p in range(producers)]
    for proc in consuming + producing:
        proc.start()
    time.sleep(0.5)         # let every interpreter import kombu and connect before the clock starts
    began = time.monotonic()
    start.set()
    for proc in producing:
        proc.join()
    done.set()
    for proc in consuming:
        proc.join()
    seconds = time.monotonic() - began
    if any(proc.exitcode != 0 for proc in consuming + producing):
        raise RuntimeError(f"a stress process failed: {[proc.exitcode for proc in consuming + producing]}")
    received: Counter[tuple[int, int]] = Counter()
    errors: list[str] = []
    for out in outs:
        data = json.loads(Path(out).read_text())
        received.update(tuple(pair) for pair in data["received"])
        errors.extend(data["errors"])
    sent = {(p, i) for p in range(producers) for i in range(per_producer)}
    bad_folder = Path(options["data_folder_in"]) / ".bad"
    set_aside = len(os.listdir(bad_folder)) if bad_folder.is_dir() else 0
    return StressResult(sent=len(sent), received=sum(received.values()), lost=len(sent - set(received)),
                        duplicated=sum(n - 1 for n in received.values() if n > 1),
                        unreadable=len(errors) + set_aside, seconds=round(seconds, 2), errors=errors[:5])
