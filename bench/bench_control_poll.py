"""What a running job's control relay costs the store: CPU per running job per second, and store writes.

    python bench/bench_control_poll.py [JOBS] [SECONDS]

Every running job has a relay thread that polls the store for cancel, pause and messages, records progress and
renews the lease. This runs JOBS relays in one process against a real store file (as a worker's jobs would, each in
its own process), with no event ("idle": a long tool call) and with an agent event every 0.2 s ("busy"), and counts
the CPU the process spends and the relay's reads and writes (the calls that take the store's write lock).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pid import events as ev  # noqa: E402
from pid.worker.control import ControlRelay  # noqa: E402
from pid.jobs.spec import JobSpec  # noqa: E402
from pid.jobs.sqlite_store import JobStore  # noqa: E402


WRITES = ("renew", "progress", "take_messages")   # the relay's calls that take the store's write lock
READS = ("get", "controls")


def counting(store: JobStore) -> dict[str, int]:
    """Count the relay's calls into the store, reads and writes, whatever the relay's version."""
    counts = {"reads": 0, "writes": 0}
    lock = threading.Lock()
    for kind, names in (("reads", READS), ("writes", WRITES)):
        for name in names:
            if not hasattr(store, name):
                continue
            method = getattr(store, name)

            def wrapper(*a, _m=method, _kind=kind, **k):  # type: ignore[no-untyped-def]
                with lock:
                    counts[_kind] += 1
                return _m(*a, **k)
            setattr(store, name, wrapper)
    return counts


class QuietAgent:
    """Stands for the running agent: takes the relay's calls and does nothing."""

    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def cancel(self) -> None: ...
    def steer(self, text: str) -> None: ...
    def follow_up(self, text: str) -> None: ...


def run(jobs: int, seconds: float, busy: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "jobs.db")
        store = JobStore(path)
        relays = []
        for n in range(jobs):
            spec = JobSpec(task=f"t{n}", repo=tmp, model="m", base_url="http://x", out_dir=tmp)
            store.create(spec)
            owner = f"bench:{n}:x"
            assert store.claim(spec.id, owner, 60)
            relays.append(ControlRelay(store, spec.id, owner))
        for relay in relays:
            relay.attach(QuietAgent())  # type: ignore[arg-type]
        counts = counting(store)
        stop = threading.Event()

        def events() -> None:
            turn = 0
            while not stop.wait(0.2):
                turn += 1
                for relay in relays:
                    relay.on_event(ev.TurnStart(turn=turn))
        feeder = threading.Thread(target=events, daemon=True)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for relay in relays:
            relay.start()
        if busy:
            feeder.start()
        time.sleep(seconds)
        stop.set()
        cpu = time.process_time() - cpu0
        wall = time.perf_counter() - wall0
        reads, writes = counts["reads"], counts["writes"]
        for relay in relays:
            relay._done.set()
        for relay in relays:
            relay._thread.join()
        print(f"{'busy' if busy else 'idle'}: {jobs} jobs for {wall:.1f}s: CPU {cpu * 1000 / jobs / wall:6.2f} ms "
              f"per job-second; store reads {reads / jobs / wall:5.2f}, writes {writes / jobs / wall:5.2f} per "
              "job-second")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("jobs", nargs="?", type=int, default=64, help="relays at once (default 64)")
    parser.add_argument("seconds", nargs="?", type=float, default=20, help="each measurement's length (default 20)")
    args = parser.parse_args()
    jobs, seconds = args.jobs, args.seconds
    run(jobs, seconds, busy=False)
    run(jobs, seconds, busy=True)


if __name__ == "__main__":
    main()
