"""The store across fork(): a worker's main process writes to it from its housekeeping thread while its pool forks a
process per job. A child forked while that thread was inside SQLite used to inherit a held mutex (deadlock) or a
half-done write ("disk I/O error", "database disk image is malformed"). Every fork now waits for the store."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from pid.jobs.spec import JobSpec
from pid.jobs.sqlite_store import JobStore

FORKS = 300
CHILD_TIMEOUT_S = 20.0


def _spec(tmp_path, n: int) -> JobSpec:
    return JobSpec(task=f"t{n}", repo=str(tmp_path), model="m", base_url="http://x", out_dir=str(tmp_path / "out"))


def _child(store: JobStore, job_id: str) -> int:
    """What a pool process does first: claim its job, read it, record progress."""
    try:
        owner = f"child:{os.getpid()}:x"
        ok = store.claim(job_id, owner, 60) and store.get(job_id).status == "running"
        ok = ok and store.progress(job_id, owner, 1, 1, {"input": 1}, lease_s=60)
        return 0 if ok else 3
    except BaseException:
        return 4


@pytest.mark.cli   # 300 real processes: seconds, not the fast tier's milliseconds
def test_hundreds_of_forks_while_another_thread_writes_give_no_error_and_no_deadlock(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    jobs = [store.create(_spec(tmp_path, n)).id for n in range(FORKS)]
    busy = store.create(_spec(tmp_path, -1)).id
    assert store.claim(busy, "parent", 60)
    stop = threading.Event()
    writes = [0]

    def write() -> None:   # the housekeeping thread: heartbeats, sweeps, progress, without pause
        while not stop.is_set():
            store.beat("node", "host", os.getpid(), None, 4, 1, True)
            store.progress(busy, "parent", writes[0], 0, {"input": writes[0]})
            store.suspects("host")
            writes[0] += 1

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    children: dict[int, float] = {}
    codes: list[int] = []
    hung = 0
    try:
        for job_id in jobs:
            pid = os.fork()
            if pid == 0:
                os._exit(_child(store, job_id))
            children[pid] = time.monotonic()
            while len(children) >= 8:
                hung += _reap(children, codes)
        while children:
            hung += _reap(children, codes)
    finally:
        stop.set()
        writer.join(timeout=30)
    assert writes[0] > 50, "the writer thread barely ran: the test proves nothing"
    assert hung == 0, f"{hung} of {FORKS} children deadlocked"
    assert codes.count(0) == FORKS, {code: codes.count(code) for code in set(codes)}
    assert all(store.get(j).status == "running" for j in jobs)


def _reap(children: dict[int, float], codes: list[int]) -> int:
    """Collect finished children; kill (and count) those stuck past the timeout."""
    hung = 0
    for pid, started in list(children.items()):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            codes.append(os.waitstatus_to_exitcode(status))
            del children[pid]
        elif time.monotonic() - started > CHILD_TIMEOUT_S:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            del children[pid]
            hung += 1
    time.sleep(0.001)
    return hung
