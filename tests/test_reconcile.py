"""The store's side of never losing a job: hand-back, dispatch records, the reconciler's rules, heartbeats, and
telling a dead lease holder from a live one. No broker here: `dispatch` is given."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from typing import Callable

from pid.worker.control import new_owner
from pid.jobs.workers import ALIVE_WITHIN_S, worker_state
from pid.worker.housekeeping import RECONCILE_S, reconcile
from pid.jobs.spec import JobSpec
from pid.jobs.identity import process_identity
from pid.jobs.sqlite_store import JobStore
from pid.jobs.store import JobRecord, WorkerBeat
from pid.jobs.sweep import owner_alive


def spec(tmp_path, n: int = 0) -> JobSpec:
    return JobSpec(task=f"t{n}", repo=str(tmp_path), model="m", out_dir=str(tmp_path / "out"), base_url="http://x")


def batch_jobs(store: JobStore, tmp_path, n: int, max_running: int) -> list[JobRecord]:
    """`n` queued jobs of the batch "b", which runs at most `max_running` at once."""
    store.set_batch("b", max_total_cost=None, max_running=max_running)
    jobs = []
    for i in range(n):
        s = spec(tmp_path, i)
        s.batch = "b"
        jobs.append(store.create(s))
    return jobs


def broker_down(store: JobStore, attempts: list[str] | None = None) -> Callable[..., bool]:
    """A dispatch whose publish fails, with pid.jobs.dispatch.dispatch's bookkeeping of it; `attempts` notes each."""
    def refused(job_id: str, **kw) -> bool:
        if attempts is not None:
            attempts.append(job_id)
        store.mark_dispatched(job_id, kw.get("previous"), only_if=kw.get("reconcile", False))
        store.mark_undispatched(job_id, "ConnectionRefusedError: the broker is down")
        raise ConnectionRefusedError("the broker is down")
    return refused


def test_a_handed_back_job_is_queued_with_its_counts_and_is_not_a_loss(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(spec(tmp_path))
    assert store.claim(job.id, "w1", 60)
    assert store.hand_back(job.id, "w1", 2, 3, {"input": 50}) == "queued"
    record = store.get(job.id)
    assert (record.status, record.owner, record.dispatched_at, record.handbacks, record.losses) == \
        ("queued", None, None, 1, 0)
    assert store.hand_back(job.id, "w1", 2, 3, None) is None          # no longer its to hand back
    assert store.claim(job.id, "w2", 60)
    assert store.get(job.id).earlier == [{"attempt": 1, "turns": 2, "tool_calls": 3,
                                          "usage": {"input": 50, "output": 0, "cache_read": 0, "cache_write": 0,
                                                    "reasoning": 0, "total_tokens": 0, "cost": 0.0}}]


def test_a_job_cancelled_then_handed_back_ends_cancelled_instead_of_waiting_forever(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(spec(tmp_path))
    assert store.claim(job.id, "w1", 60)
    assert store.request_cancel(job.id) == "running"
    assert store.hand_back(job.id, "w1", 1, 1, None) == "cancelled"
    record = store.get(job.id)
    assert (record.status, record.exit_reason) == ("cancelled", "cancelled") and record.finished_at


def test_the_reconciler_dispatches_what_needs_it_and_one_worker_wins_each(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    fresh, sent = store.create(spec(tmp_path, 0)), store.create(spec(tmp_path, 1))
    assert store.mark_dispatched(sent.id)
    calls: list[str] = []

    def publish(job_id: str, **kw) -> bool:   # pid.jobs.dispatch.dispatch's bookkeeping, with a publish that works
        if not store.mark_dispatched(job_id, kw.get("previous"), only_if=kw.get("reconcile", False)):
            return False
        calls.append(job_id)
        store.mark_published(job_id)
        return True

    assert reconcile(store, dispatch=publish) == [fresh.id]   # never dispatched: at once; the sent one waits
    assert reconcile(store, dispatch=publish) == []            # dispatched now: not again
    # a message is presumed lost only once a live worker has had a free process for RECONCILE_S
    store.beat("w@h", "h", 1, None, 2, 0, True)
    with store._db() as db:
        db.execute("UPDATE workers SET free_since = ?", (time.time() - RECONCILE_S - 1,))
        db.execute("UPDATE jobs SET dispatched_at = ?", (time.time() - RECONCILE_S - 1,))
    assert sorted(reconcile(store, dispatch=publish)) == sorted([fresh.id, sent.id])
    assert store.mark_dispatched(sent.id, 12.0, only_if=True) is False   # another worker re-dispatched it already


def test_a_free_worker_says_a_message_is_lost_only_for_the_queues_it_consumes(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    routed = spec(tmp_path, 0)
    routed.queue = "big"
    big, plain = store.create(routed), store.create(spec(tmp_path, 1))
    for job in (big, plain):
        assert store.mark_dispatched(job.id)
        store.mark_published(job.id)
    store.beat("w@h", "h", 1, None, 2, 0, True)   # consumes the default queue only
    with store._db() as db:
        db.execute("UPDATE workers SET free_since = ?", (time.time() - RECONCILE_S - 1,))
        db.execute("UPDATE jobs SET dispatched_at = ?", (time.time() - RECONCILE_S - 1,))
    sent: list[str] = []
    assert reconcile(store, dispatch=lambda job_id, **kw: sent.append(job_id) or True) == [plain.id]


def test_a_busy_worker_is_not_free_and_a_stopping_one_neither(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    store.beat("a@h", "h", 1, "boot", 2, 1, True)
    store.beat("b@h", "h", 2, "boot", 2, 2, True)
    store.beat("c@h", "h", 3, "boot", 2, 0, False)
    free = {w.node: w.free_since is not None for w in store.workers(alive_within_s=10)}
    assert free == {"a@h": True, "b@h": False, "c@h": False}
    first = store.workers()[0].free_since
    time.sleep(0.01)
    store.beat("a@h", "h", 1, "boot", 2, 0, True)
    assert store.workers()[0].free_since == first          # free since then, continuously
    store.worker_stopped("a@h")
    assert [w.node for w in store.workers(alive_within_s=10)] == ["b@h", "c@h"]


def test_a_job_that_cannot_be_dispatched_for_long_ends_failed_even_the_oldest(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    jobs = [store.create(spec(tmp_path, n)) for n in range(2)]
    with store._db() as db:   # their publishes have failed for an hour
        db.execute("UPDATE jobs SET undispatched_since = ?, dispatch_error = 'down'", (time.time() - 3600,))

    assert reconcile(store, dispatch=broker_down(store)) == []
    for job in jobs:
        record = store.get(job.id)
        assert (record.status, record.exit_reason) == ("failed", "dispatch_failed"), record
        assert "the broker is down" in record.error
        result = json.loads((tmp_path / "out" / job.id / "result.json").read_text())
        assert result["exit_reason"] == "dispatch_failed"


def test_a_failed_publish_ends_no_job_its_batch_held_back_nor_one_a_worker_took(tmp_path):
    """--max-running: a batch's jobs past its slots are parked (batch_budget.refused), never tried. A failed publish
    ends only the jobs whose own publishes have failed for long: not those, however long they were parked, nor one a
    worker took meanwhile; and it starts the clock of every job a pass cut short never tried."""
    from pid.jobs import batch_budget
    store = JobStore(str(tmp_path / "jobs.db"))
    batch = batch_jobs(store, tmp_path, 3, max_running=1)
    first = store.create(spec(tmp_path, 8))   # unbatched, before the batch's jobs in the queue
    assert store.claim(batch[0].id, "w", 60)
    for job in batch[1:]:   # refused a claim by the full batch: parked
        assert batch_budget.refused(store, store.get(job.id)) == "parked"
    taken = store.create(spec(tmp_path, 10))
    other = store.create(spec(tmp_path, 11))
    with store._db() as db:   # all an hour old; `first` and `taken` have failed to publish for that long
        db.execute("UPDATE jobs SET created_at = created_at - 3600, undispatched_since = undispatched_since - 3600")
        db.execute("UPDATE jobs SET created_at = created_at - 60, dispatch_error = 'down', undispatched_since = ? "
                   "WHERE id IN (?, ?)", (time.time() - 3600, first.id, taken.id))
    attempts: list[str] = []
    refused = broker_down(store, attempts)
    read = store.to_dispatch

    def then_taken(stale_before):   # a worker takes `taken` from a late message while the give-up looks
        waiting = read(stale_before)
        if stale_before is None and store.get(taken.id).status == "queued":
            assert store.claim(taken.id, "w2", 60)
        return waiting
    store.to_dispatch = then_taken
    assert reconcile(store, dispatch=refused) == [] and attempts == [first.id]   # a pass stops at its first failure
    assert (store.get(first.id).status, store.get(first.id).exit_reason) == ("failed", "dispatch_failed")
    said = [record.get("note", "") for _, record in store.events(first.id)]   # its log says how it ended
    assert any(note.startswith("dispatch_failed: could not be dispatched for ") for note in said), said
    assert (store.get(taken.id).status, store.get(taken.id).owner) == ("running", "w2")
    for job in batch[1:]:
        assert store.get(job.id).status == "queued", store.get(job.id)   # parked, never failing
        assert store.get(job.id).undispatched_since is None
    assert store.get(other.id).status == "queued"
    assert store.get(other.id).undispatched_since > time.time() - 60   # its clock started with the outage
    assert reconcile(store, dispatch=refused) == [] and attempts == [first.id, other.id]
    assert store.get(other.id).status == "queued"
    assert store.finish(batch[0].id, "stop", owner="w")   # a slot is free: a parked job's first failure starts
    attempts.clear()                                      # its clock then, however long it was parked
    reconcile(store, dispatch=refused)
    assert attempts and store.get(attempts[0]).status == "queued"
    for job in batch[1:]:
        assert store.get(job.id).status == "queued"


def test_a_short_broker_outage_fails_nothing(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(spec(tmp_path))

    def refused(job_id: str, **kw) -> bool:
        store.mark_undispatched(job_id, "down")
        raise ConnectionRefusedError("down")
    reconcile(store, dispatch=refused)
    record = store.get(job.id)
    assert (record.status, record.dispatch_error) == ("queued", "down")


def test_a_lease_holder_is_known_alive_or_dead_only_where_that_can_be_told(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    alive, dead, elsewhere = (store.create(spec(tmp_path, n)) for n in range(3))
    assert store.claim(alive.id, new_owner(), 60)
    child = subprocess.Popen(["sleep", "30"])
    from pid.worker.control import process_identity
    identity = process_identity(child.pid)
    child.kill()
    child.wait()
    host = socket.gethostname()
    assert store.claim(dead.id, f"{host}:{child.pid}:abcd.{identity}", 60)
    assert store.claim(elsewhere.id, f"{host}:{os.getpid()}:abcd.0000-1-{identity.rsplit('-', 1)[1]}", 60)
    assert owner_alive(store.get(alive.id)) is True
    assert owner_alive(store.get(dead.id)) is False
    assert owner_alive(store.get(elsewhere.id)) is None   # another boot of a host with this name: the lease decides


def test_the_reconciler_dispatches_a_batchs_waiting_jobs_only_into_its_free_slots(tmp_path):
    """--max-running: jobs the store refused wait undispatched; a reconciler pass fills the batch's free slots and
    no more (other jobs are not held back)."""
    store = JobStore(str(tmp_path / "jobs.db"))
    jobs = batch_jobs(store, tmp_path, 5, max_running=2)
    other = store.create(spec(tmp_path, 9))
    assert store.claim(jobs[0].id, "w", 60)
    sent: list[str] = []

    def publish(job_id: str, **kw) -> bool:
        if not store.mark_dispatched(job_id, kw.get("previous"), only_if=kw.get("reconcile", False)):
            return False
        sent.append(job_id)
        return True

    assert reconcile(store, dispatch=publish) == [jobs[1].id, other.id]   # one slot of two is free
    assert reconcile(store, dispatch=publish) == []                       # it is taken (dispatched)... until
    assert store.claim(jobs[1].id, "w", 60) and store.finish(jobs[0].id, "stop", owner="w")
    assert reconcile(store, dispatch=publish) == [jobs[2].id]


def test_a_worker_s_heartbeat_is_judged_by_the_same_rule_as_a_lease_holder(tmp_path):
    child = subprocess.Popen(["sleep", "30"])
    dead = process_identity(child.pid)
    child.kill()
    child.wait()
    assert dead is not None
    host, now = socket.gethostname(), time.time()

    def state(pid: int, identity: str | None, host: str = host, beat_at: float = now, **kw) -> str:
        return worker_state(WorkerBeat("n", host, pid, None, 1, 0, None, now - 60, beat_at, identity=identity, **kw),
                            now)
    assert state(os.getpid(), process_identity(os.getpid())) == "alive"
    assert state(child.pid, dead) == "lost"                            # gone at once, whatever its last beat's age
    assert state(child.pid, dead, host="another-host") == "alive"      # elsewhere: only the silence tells
    assert state(child.pid, "0000-1-" + dead.rsplit("-", 1)[1]) == "alive"   # another boot of a host of this name
    assert state(child.pid, None, beat_at=now - ALIVE_WITHIN_S - 1) == "silent"
    assert state(child.pid, dead, stopped_at=now) == "stopped"


def test_a_beat_on_its_way_when_the_worker_stops_never_lands_after_the_stop(monkeypatch):
    """A slow store: the stop waits STOP_WAIT_S for the heartbeat thread, then returns; the beat that was on its way
    lands later, and the stop is still the last word (pid workers --all: stopped, not alive)."""
    import threading

    from pid.worker import housekeeping

    class SlowStore:
        def __init__(self) -> None:
            self.writes: list[str] = []
            self.in_beat, self.release = threading.Event(), threading.Event()

        def beat(self, *args, **kw) -> None:
            self.in_beat.set()
            self.release.wait(30)
            self.writes.append("beat")

        def worker_stopped(self, node: str) -> None:
            self.writes.append("stopped")

    store = SlowStore()
    monkeypatch.setattr("pid.jobs.store.default_store", lambda: store)
    monkeypatch.setattr(housekeeping, "STOP_WAIT_S", 0.1)
    monkeypatch.setattr(housekeeping.Housekeeping, "_loop", lambda self: None)   # only the heartbeat thread here
    keeping = housekeeping.Housekeeping("n", 1, lambda: 0, lambda: True)
    keeping.start()
    assert store.in_beat.wait(30)
    keeping.stop()            # the beat is still on its way
    store.release.set()
    keeping._beating.join(30)
    assert store.writes == ["beat", "stopped"]


def test_a_store_that_keeps_refusing_beats_is_said_once_and_its_return_once(monkeypatch, caplog):
    """A store outage must not fill the worker's log with a traceback every BEAT_S: one line when beats start to
    fail, one when they are recorded again."""
    import logging
    import threading

    from pid.worker import housekeeping

    class FlakyStore:
        def __init__(self) -> None:
            self.beats = 0
            self.recovered = threading.Event()

        def beat(self, *args, **kw) -> None:
            self.beats += 1
            if self.beats <= 4:
                raise ConnectionError("the store is down")
            self.recovered.set()

        def worker_stopped(self, node: str) -> None:
            pass

    store = FlakyStore()
    monkeypatch.setattr("pid.jobs.store.default_store", lambda: store)
    monkeypatch.setattr(housekeeping, "BEAT_S", 0.01)
    monkeypatch.setattr(housekeeping.Housekeeping, "_loop", lambda self: None)   # only the heartbeat thread here
    caplog.set_level(logging.INFO, logger="pid.worker")
    keeping = housekeeping.Housekeeping("n", 1, lambda: 0, lambda: True)
    keeping.start()
    try:
        assert store.recovered.wait(30)
    finally:
        keeping.stop()
    said = [r.getMessage() for r in caplog.records if "heartbeat" in r.getMessage()]
    assert said == ["recording this worker's heartbeat: the store is down", "this worker's heartbeat is recorded again"]
    assert not any(r.exc_info for r in caplog.records)


def test_a_housekeeping_pass_that_cannot_reach_the_store_says_one_line_and_stops(caplog):
    """A Redis restarting is no bug: one warning for the pass (no traceback per step), and the pass ends there; a
    step failing for another reason still gets its traceback."""
    import logging

    import redis

    from pid.worker import housekeeping

    class DownStore:
        def __init__(self, error: Exception) -> None:
            self.error, self.calls = error, []

        def __getattr__(self, name: str):
            def call(*args, **kwargs):
                self.calls.append(name)
                raise self.error
            return call

    caplog.set_level(logging.INFO, logger="pid.worker")
    keeping = housekeeping.Housekeeping("n", 1, lambda: 0, lambda: True)
    keeping._next_reap = keeping._next_prune = float("inf")   # the steps that reach the store only
    down = DownStore(redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"))
    keeping.once(down)
    assert [(r.levelno, r.exc_info) for r in caplog.records] == [(logging.WARNING, None)]
    assert "the job store is unreachable (Redis is loading the dataset in memory)" in caplog.records[0].getMessage()
    assert down.calls == ["now"]   # the sweep's first look, then nothing more this pass

    caplog.clear()
    broken = DownStore(redis.exceptions.ResponseError("WRONGTYPE"))
    keeping.once(broken)
    assert len(caplog.records) >= 2 and all(r.exc_info for r in caplog.records)


def test_the_engine_timing_out_while_reaping_is_not_called_the_store(caplog, monkeypatch):
    """Reaping asks the engine: its timeout is logged as itself (with its traceback), and the store's steps go on."""
    import logging

    from pid.worker import housekeeping

    def engine_times_out() -> None:
        raise TimeoutError("the engine did not answer")

    calls: list[str] = []

    class QuietStore:
        def __getattr__(self, name: str):
            def call(*args, **kwargs):
                calls.append(name)
                return [] if name in ("suspects", "list", "workers") else None
            return call

    monkeypatch.setattr(housekeeping.Housekeeping, "_reap", staticmethod(engine_times_out))
    monkeypatch.setattr(housekeeping, "reconcile", lambda store, on_end=None: calls.append("reconcile"))
    caplog.set_level(logging.INFO, logger="pid.worker")
    keeping = housekeeping.Housekeeping("n", 1, lambda: 0, lambda: True)
    keeping._next_prune = float("inf")
    keeping.once(QuietStore())
    reaping = [r for r in caplog.records if r.getMessage() == housekeeping.REAPING]
    assert len(reaping) == 1 and reaping[0].exc_info is not None
    assert not [r for r in caplog.records if "job store is unreachable" in r.getMessage()]
    assert "forget_silent_workers" in calls and "reconcile" in calls


def test_a_wait_says_a_job_is_queued_once_a_stay_and_again_when_it_goes_back(tmp_path):
    """`pid result --wait` and Job.wait: a job still queued after the notice time is said once; one that ran and
    went back to the queue (its worker killed) is said again, not left in silence."""
    from pid.jobs.workers import QueuedNotice
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(spec(tmp_path))
    notice = QueuedNotice(store, job.id, 0.05)
    assert notice() is None                      # too soon
    time.sleep(0.06)
    first = notice()
    assert first is not None and first.startswith(f"job {job.id} is still queued after 0.05s: no worker")
    time.sleep(0.06)
    assert notice() is None                      # said once for this stay
    assert store.claim(job.id, "h:1:w", 60)
    time.sleep(0.06)
    assert notice() is None                      # it runs
    assert store.requeue(job.id, "h:1:w", lapsed_only=False)
    time.sleep(0.06)
    again = notice()
    assert again is not None and again.startswith(f"job {job.id} is back in the queue: no worker")
    time.sleep(0.06)
    assert notice() is None


def test_a_batch_s_failing_publish_takes_its_free_slot_and_a_held_back_job_s_clock_is_stopped(tmp_path):
    """--max-running 1, one slot free: the publish of the job that was to take it fails. The batch's next job stays
    held back (no failure clock of its own, found by an operator's test: it was ended dispatch_failed at the next
    outage, for time it had only waited); and a held-back job with a clock loses it at the next pass."""
    store = JobStore(str(tmp_path / "jobs.db"))
    jobs = batch_jobs(store, tmp_path, 3, max_running=1)

    def publish(job_id: str, **kw) -> bool:
        return store.mark_dispatched(job_id, kw.get("previous"), only_if=kw.get("reconcile", False))

    assert reconcile(store, dispatch=broker_down(store)) == []
    assert store.get(jobs[0].id).undispatched_since is not None   # its publish failed: its clock runs
    assert [store.get(j.id).dispatch_error for j in jobs[1:]] == [None, None]   # held back, not failing
    with store._db() as db:   # a clock an earlier pass started on a job that is held back now
        db.execute("UPDATE jobs SET undispatched_since = 1, dispatch_error = 'down' WHERE id = ?", (jobs[2].id,))
    assert reconcile(store, dispatch=publish) == [jobs[0].id]
    assert store.get(jobs[2].id).undispatched_since is None and store.get(jobs[2].id).status == "queued"


def test_a_wait_names_the_workers_it_has_not_heard_from_lately(tmp_path, monkeypatch):
    """After a store outage every worker is silent until it beats again: "no worker is consuming queue 'pid' (start
    one)" alone sent an on-call operator to start workers for nothing. The silent ones are named beside it."""
    from pid.jobs.sqlite_store import JobStore
    from pid.jobs.workers import still_queued
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(JobSpec(task="t", repo=str(tmp_path), model="m", out_dir=str(tmp_path)))
    alone = still_queued(store, job.id, 10)
    assert alone == f"job {job.id} is still queued after 10s: no worker is consuming queue 'pid' (start one with " \
                    "`pid worker`)"
    store.beat("w@elsewhere", "elsewhere", 1, None, 2, 0, True)
    later = time.time() + ALIVE_WITHIN_S + 30
    monkeypatch.setattr(time, "time", lambda: later)
    said = still_queued(store, job.id, 10)
    assert said is not None and said.startswith(alone + "; 1 worker(s) that take it were last heard from "), said
    assert said.endswith("s ago (cut off from the job store, frozen, or gone)"), said
    monkeypatch.setattr(time, "time", lambda: later + 3600)   # long gone: not named
    assert still_queued(store, job.id, 10) == alone
