"""One contract, two stores: every test here runs against the SQLite JobStore and the RedisStore (a private
redis-server; skipped where none is installed). What pid relies on: one claimer wins, a lease lapses, a stale owner
is refused, the end is recorded once, the mailboxes, dispatch records and heartbeats, and the newer blobs, events,
artifacts, API keys and retention."""
from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from pid.jobs.spec import JobSpec
from pid.jobs.sqlite_store import JobStore
from pid.jobs.store import BlobMissing, Store, TooLarge, default_store, open_store, retention_s

KINDS = ["sqlite", "redis"]


def spec(tmp_path: Path, n: int = 0) -> JobSpec:
    return JobSpec(task=f"t{n}", repo=str(tmp_path), model="m", out_dir=str(tmp_path / "out"), base_url="http://x")


@pytest.fixture(params=KINDS)
def make_store(request, tmp_path) -> Callable[..., Store]:
    """A factory of stores of one kind, all on the same data: make_store(retention=None)."""
    if request.param == "sqlite":
        return lambda retention=None: JobStore(str(tmp_path / "jobs.db"), retention=retention)
    server = request.getfixturevalue("redis_server")
    from pid.jobs.redis_store import RedisStore
    return lambda retention=None: RedisStore(server.url, retention=retention)


@pytest.fixture
def store(make_store) -> Store:
    return make_store()


def leftovers(store: Store) -> list[str]:
    """Half-written blobs left behind (temporary files, upload keys)."""
    if isinstance(store, JobStore):
        return [n for n in os.listdir(store.blob_dir) if n.startswith(".tmp-")] if os.path.isdir(store.blob_dir) else []
    return [k.decode() for k in store._r.scan_iter(match="pid:upload:*")]


# -- leases ---------------------------------------------------------------------------------------------------------

def test_claim_is_refused_while_leased_and_taken_once_lapsed(store, tmp_path):
    job = store.create(spec(tmp_path))
    assert (job.status, job.attempts, job.kind, job.owner) == ("queued", 0, "worker", None)
    assert store.claim(job.id, "h:1:a", lease_s=60)
    assert not store.claim(job.id, "h:2:b", lease_s=60)          # a duplicate delivery while a lives
    assert store.renew(job.id, "h:1:a", lease_s=60)
    running = store.get(job.id)
    assert running.status == "running" and running.owner == "h:1:a" and running.attempts == 1
    assert running.started_at is not None and running.claimed_at is not None
    assert running.lease_until > store.now()
    assert store.lapsed() == []
    assert store.renew(job.id, "h:1:a", lease_s=0.05)            # its last renewal: then a stopped renewing
    time.sleep(0.1)
    assert [r.id for r in store.lapsed()] == [job.id]
    assert store.claim(job.id, "h:2:b", lease_s=60)
    assert not store.renew(job.id, "h:1:a", lease_s=60)          # the old owner learns it lost the job
    assert not store.progress(job.id, "h:1:a", 9, 9)
    assert not store.finish(job.id, "stop", owner="h:1:a")       # ...and cannot overwrite the ending
    record = store.get(job.id)
    assert (record.owner, record.attempts, record.turns, record.status) == ("h:2:b", 2, 0, "running")
    assert store.claim("no-such-job", "x", 60) is False


def test_a_new_attempt_starts_with_no_activity_or_last_tool_of_the_one_before(store, tmp_path):
    """`pid status` of attempt 2 must not show what attempt 1 was doing when its worker died."""
    job = store.create(spec(tmp_path))
    assert store.claim(job.id, "h:1:a", lease_s=0.05)
    assert store.progress(job.id, "h:1:a", 3, 2, activity="running bash", last_tool="bash: make (exit 0, 1.0s)")
    time.sleep(0.1)
    assert store.claim(job.id, "h:2:b", lease_s=60)
    record = store.get(job.id)
    assert (record.attempts, record.turns, record.tool_calls) == (2, 0, 0)
    assert (record.activity, record.last_tool) == (None, None)
    assert record.earlier[0]["turns"] == 3


def test_progress_renews_and_keeps_counts_and_a_new_attempt_keeps_the_earlier_ones(store, tmp_path):
    job = store.create(spec(tmp_path))
    assert store.claim(job.id, "a", lease_s=0.3)
    usage = {"input": 10, "output": 5, "cost": 0.25}
    assert store.progress(job.id, "a", 2, 3, usage, activity="bash: ls", last_tool="read", lease_s=60)
    r = store.get(job.id)
    assert (r.turns, r.tool_calls, r.usage, r.activity, r.last_tool) == (2, 3, usage, "bash: ls", "read")
    assert r.lease_until > store.now() + 30
    assert store.progress(job.id, "a", 3, 3, activity=None)       # usage and last tool kept; activity cleared
    r = store.get(job.id)
    assert (r.turns, r.usage, r.activity, r.last_tool) == (3, usage, None, "read")
    assert store.requeue(job.id, lapsed_only=False)              # its process is gone
    r = store.get(job.id)
    assert (r.status, r.owner, r.lease_until, r.dispatched_at) == ("queued", None, None, None)
    assert r.undispatched_since is not None and r.exit_reason is None and r.finished_at is None
    assert store.claim(job.id, "b", lease_s=60)
    r = store.get(job.id)
    assert r.attempts == 2 and r.turns == 0 and r.usage == {}
    assert [(e["attempt"], e["turns"], e["tool_calls"], e["usage"]["input"], e["usage"]["cost"]) for e in r.earlier] \
        == [(1, 3, 3, 10, 0.25)]
    assert r.total_usage["input"] == 10 and r.losses == 2
    assert store.finish(job.id, "stop", owner="b", turns=1, tool_calls=1, usage={"input": 1, "cost": 0.5})
    r = store.get(job.id)
    assert r.total_usage["input"] == 11 and r.total_usage["cost"] == 0.75


def test_an_ending_keeps_its_check_and_the_record_says_its_exit_code(store, tmp_path):
    """--check's verdict is in the record (status, list --json, a waiting submit), and the exit code follows it."""
    checked, plain = store.create(spec(tmp_path, 1)), store.create(spec(tmp_path, 2))
    check = {"command": "python3 -m unittest", "exit_code": 1, "passed": False, "duration_s": 0.2,
             "output_tail": "FAILED (failures=1)", "timed_out": False}
    for job in (checked, plain):
        assert store.claim(job.id, "h:1:a", lease_s=30)
        assert store.get(job.id).exit_code is None                  # running: no exit code yet
    assert store.finish(checked.id, "stop", owner="h:1:a", check=check)
    assert store.finish(plain.id, "stop", owner="h:1:a")
    r = store.get(checked.id)
    assert (r.status, r.check, r.exit_code) == ("completed", check, 4)
    assert r.to_dict()["check"] == check and r.to_dict()["exit_code"] == 4
    assert (store.get(plain.id).check, store.get(plain.id).exit_code) == (None, 0)
    assert {x.id: x.check for x in store.list(10)} == {checked.id: check, plain.id: None}


def test_requeue_only_lapsed_or_by_owner_and_a_cancelled_one_ends(store, tmp_path):
    job = store.create(spec(tmp_path))
    assert store.claim(job.id, "h:1:a", lease_s=60)
    assert not store.requeue(job.id)                               # still leased
    assert not store.requeue(job.id, owner="h:9:z", lapsed_only=False)
    assert [r.id for r in store.suspects("h")] == [job.id]        # owned by a process on host h
    assert store.suspects("other") == []
    assert store.renew(job.id, "h:1:a", lease_s=0.05)             # its last renewal
    time.sleep(0.1)
    assert [r.id for r in store.suspects("other")] == [job.id]    # lapsed
    assert store.requeue(job.id)
    assert store.get(job.id).status == "queued"
    assert not store.requeue(job.id)                               # not running
    assert store.claim(job.id, "h:1:b", lease_s=60)
    assert store.request_cancel(job.id) == "running"               # its worker will stop it
    assert store.requeue(job.id, owner="h:1:b", lapsed_only=False)
    r = store.get(job.id)
    assert (r.status, r.exit_reason) == ("cancelled", "cancelled") and r.finished_at is not None
    assert not store.claim(job.id, "c", 60)


# -- the end, recorded once -------------------------------------------------------------------------------------------

def test_the_end_is_recorded_once(store, tmp_path):
    job = store.create(spec(tmp_path))
    assert store.claim(job.id, "a", lease_s=60)
    assert not store.finish(job.id, "error", lapsed_only=True)     # the sweeper: a live lease, not its to end
    assert store.finish(job.id, "stop", owner="a", turns=4, tool_calls=2, error=None)
    first = store.get(job.id)
    assert (first.status, first.exit_reason, first.turns, first.lease_until) == ("completed", "stop", 4, None)
    assert not store.finish(job.id, "error", error="late")         # a second ending does not overwrite
    assert not store.finish(job.id, "error", owner="a")
    assert not store.finish_if_queued(job.id, "cancelled")
    assert not store.finish_if_queued(job.id, "dispatch_failed", error="late")
    again = store.get(job.id)
    assert (again.status, again.exit_reason, again.error, again.finished_at) == \
        ("completed", "stop", None, first.finished_at)
    assert not store.claim(job.id, "b", 60) and not store.set_paused(job.id, True)

    # a `pid run` the sweep ended client_lost (its machine asleep past the grace) comes back: it ends its job truly
    run = store.create(spec(tmp_path, 1), kind="run")
    assert store.claim(run.id, "laptop:1:r", lease_s=0.05)
    time.sleep(0.1)
    assert store.finish(run.id, "client_lost", owner="laptop:1:r", error="not heard from", lapsed_only=True)  # a sweep
    assert not store.finish(run.id, "client_lost", owner="laptop:1:r", lapsed_only=True)   # another sweep, late
    assert not store.finish(run.id, "stop", owner="laptop:1:r")            # an ending not said to be the return
    assert not store.finish(run.id, "stop", owner="elsewhere:2:x", returning=True)   # only its own process
    assert not store.finish(run.id, "stop", returning=True)                # nor an ending without an owner
    assert store.finish(run.id, "stop", owner="laptop:1:r", turns=3, returning=True)
    back = store.get(run.id)
    assert (back.status, back.exit_reason, back.error, back.turns) == ("completed", "stop", None, 3)
    assert [r.id for r in store.list(10, "completed")] == [run.id, job.id]
    assert not store.finish(run.id, "error", owner="laptop:1:r", returning=True)   # and once
    # a lapsed job may be ended by the sweeper, with its error
    other = store.create(spec(tmp_path, 1))
    assert store.claim(other.id, "a", lease_s=0.05)
    time.sleep(0.1)
    assert store.finish(other.id, "error", error="worker lost", lapsed_only=True)
    r = store.get(other.id)
    assert (r.status, r.error) == ("failed", "worker lost")
    queued = store.create(spec(tmp_path, 2))
    assert store.finish_if_queued(queued.id, "cancelled") and store.get(queued.id).status == "cancelled"


def test_hand_back_returns_the_job_to_the_queue_without_counting_a_loss(store, tmp_path):
    job = store.create(spec(tmp_path))
    assert store.claim(job.id, "a", lease_s=60)
    assert store.hand_back(job.id, "z", 1, 1, None) is None          # not its holder
    assert store.hand_back(job.id, "a", 3, 4, {"input": 7}) == "queued"
    r = store.get(job.id)
    assert (r.status, r.owner, r.handbacks, r.attempts, r.losses, r.turns, r.tool_calls, r.usage) == \
        ("queued", None, 1, 1, 0, 3, 4, {"input": 7})
    assert r.dispatched_at is None and r.undispatched_since is not None
    assert store.claim(job.id, "b", lease_s=60)
    assert store.get(job.id).earlier[0]["turns"] == 3
    store.request_cancel(job.id)
    assert store.hand_back(job.id, "b", 0, 0, None) == "cancelled"  # nothing would run it again
    assert store.get(job.id).finished_at is not None


# -- mailboxes ------------------------------------------------------------------------------------------------------

def test_cancel_pause_steer_and_follow_up(store, tmp_path):
    job = store.create(spec(tmp_path))
    assert store.claim(job.id, "a", lease_s=60)
    assert store.controls(job.id, "a") == store.controls(job.id, "a")
    c = store.controls(job.id, "a")
    assert (c.owned, c.cancel_requested, c.paused, c.mail) == (True, False, False, False)
    assert not store.controls(job.id, "b").owned
    assert store.controls("no-such-job", "a") is None
    assert store.post(job.id, "steer", "look at b.py")
    assert store.post(job.id, "follow_up", "then add a test")
    assert store.post(job.id, "steer", "x" * 10_000)
    assert store.set_paused(job.id, True)
    c = store.controls(job.id, "a")
    assert c.mail and c.paused
    assert store.take_messages(job.id) == [("steer", "look at b.py"), ("follow_up", "then add a test"),
                                           ("steer", "x" * 10_000)]
    assert store.take_messages(job.id) == []                       # delivered once
    assert not store.controls(job.id, "a").mail
    # a new attempt (a hand-back, a worker lost) starts the conversation again: it is given every message again
    assert store.hand_back(job.id, "a", 1, 1, None) == "queued" and store.claim(job.id, "b", lease_s=60)
    assert store.controls(job.id, "b").mail
    assert store.post(job.id, "steer", "sent since")
    assert store.take_messages(job.id) == [("steer", "look at b.py"), ("follow_up", "then add a test"),
                                           ("steer", "x" * 10_000), ("steer", "sent since")]
    assert store.take_messages(job.id) == [] and not store.controls(job.id, "b").mail
    store.hand_back(job.id, "b", 0, 0, None)
    assert store.claim(job.id, "a", lease_s=60)
    assert store.set_paused(job.id, False) and not store.controls(job.id, "a").paused
    assert store.request_cancel(job.id) == "running"
    assert store.controls(job.id, "a").cancel_requested and store.get(job.id).cancel_requested
    assert store.finish(job.id, "cancelled", owner="a")
    assert store.get(job.id).status == "cancelled"
    assert not store.post(job.id, "steer", "too late")
    assert store.request_cancel("no-such-job") is None
    queued = store.create(spec(tmp_path, 1))
    assert store.post(queued.id, "follow_up", "waits for the run")
    assert store.request_cancel(queued.id) == "cancelled"          # a queued job ends on the spot
    assert not store.claim(queued.id, "a", 60)
    assert store.request_cancel(queued.id) == "cancelled"


# -- dispatch records and heartbeats --------------------------------------------------------------------------------

def test_dispatch_records(store, tmp_path):
    fresh = store.create(spec(tmp_path, 0))
    sent = store.create(spec(tmp_path, 1))
    run = store.create(spec(tmp_path, 2), kind="run")
    assert [r.id for r in store.to_dispatch(None)] == [fresh.id, sent.id]   # oldest first; never a `pid run`
    assert run.kind == "run"
    assert store.mark_dispatched(sent.id)
    store.mark_published(sent.id)
    r = store.get(sent.id)
    assert r.dispatched_at is not None and r.undispatched_since is None and r.dispatch_error is None
    assert [r.id for r in store.to_dispatch(None)] == [fresh.id]
    assert [r.id for r in store.to_dispatch(store.now() + 1)] == [fresh.id, sent.id]   # presumed lost
    previous = store.get(sent.id).dispatched_at
    assert not store.mark_dispatched(sent.id, previous + 1, only_if=True)   # someone else dispatched it since
    assert store.mark_dispatched(sent.id, previous, only_if=True)
    assert not store.mark_dispatched(sent.id, previous, only_if=True)       # of two re-dispatchers, one wins
    assert store.mark_dispatched(fresh.id, None, only_if=True)
    assert not store.mark_dispatched(fresh.id, None, only_if=True)
    time.sleep(0.01)
    store.mark_undispatched(fresh.id, "ConnectionRefusedError: down " + "x" * 1000)
    r = store.get(fresh.id)
    assert r.dispatched_at is None and r.dispatch_error.startswith("ConnectionRefusedError") \
        and len(r.dispatch_error) == 500
    # the clock of failed publishes starts at the first failure (a job its batch held back was waiting, not failing)
    assert r.undispatched_since > fresh.undispatched_since
    store.mark_undispatched(fresh.id, "down again")
    assert store.get(fresh.id).undispatched_since == r.undispatched_since   # and runs on through later ones
    store.mark_undispatched(fresh.id, "waiting for a free slot", parked=True)   # held back by its batch: not failing
    parked = store.get(fresh.id)
    assert (parked.dispatch_error, parked.undispatched_since) == ("waiting for a free slot", None)
    store.mark_undispatched(fresh.id, "down")
    assert store.get(fresh.id).undispatched_since is not None   # its next failure starts the clock again
    store.request_cancel(fresh.id)
    assert fresh.id not in [r.id for r in store.to_dispatch(None)]
    assert not store.mark_dispatched(fresh.id)


def test_heartbeats(store):
    store.beat("a@h", "h", 1, "boot", 2, 1, True)
    store.beat("b@h", "h", 2, "boot", 2, 2, True, ["big", "pid"])
    store.beat("c@h", "h", 3, None, 2, 0, False)
    free = {w.node: w.free_since is not None for w in store.workers(alive_within_s=10)}
    assert free == {"a@h": True, "b@h": False, "c@h": False}
    assert [w.queues for w in store.workers()] == [["pid"], ["big", "pid"], ["pid"]]   # the default queue unless named
    a = store.workers()[0]
    assert (a.node, a.host, a.pid, a.boot_id, a.concurrency, a.running) == ("a@h", "h", 1, "boot", 2, 1)
    assert store.workers()[2].boot_id is None
    time.sleep(0.05)
    store.beat("a@h", "h", 1, "boot", 2, 0, True)
    assert store.workers()[0].free_since == a.free_since            # free since then, continuously
    assert store.workers()[0].beat_at > a.beat_at and store.workers()[0].started_at == a.started_at
    store.beat("a@h", "h", 1, "boot", 2, 2, True)
    assert store.workers()[0].free_since is None                    # busy
    store.worker_stopped("a@h")                                     # kept, marked stopped; never alive
    assert [w.node for w in store.workers(alive_within_s=10)] == ["b@h", "c@h"]
    stopped = store.workers()[0]
    assert stopped.node == "a@h" and stopped.stopped_at is not None and stopped.running == 0
    store.beat("b@h", "h", 2, "boot", 2, 2, True, ["big", "pid"], identity="boot-1-2")
    assert store.workers()[1].identity == "boot-1-2" and store.workers()[1].stopped_at is None
    time.sleep(0.5)
    store.beat("c@h", "h", 3, None, 2, 0, False)
    # a window just shorter than b's silence, on the store's own clock: b is out of it whatever the machine's load;
    # c (0.5 s after b) is in it unless the next call alone takes half a second
    assert [w.node for w in store.workers(alive_within_s=silent_for(store, "b@h") - 0.01)] == ["c@h"]
    store.forget_silent_workers(silent_s=silent_for(store, "b@h") - 0.01)   # the stopped one too, once silent
    assert [w.node for w in store.workers()] == ["c@h"]


def silent_for(store: Store, node: str) -> float:
    """How long ago `node` beat last, on the store's clock (read last: the caller's next call comes right after)."""
    beat_at = {w.node: w.beat_at for w in store.workers()}[node]
    return store.now() - beat_at


def test_a_heartbeat_carries_its_worker_s_policy(store):
    store.beat("a@h", "h", 1, "boot", 2, 0, True, ["pid"], {"max_memory": 4 << 30, "images": ["pid-sandbox:*"]})
    store.beat("b@h", "h", 2, "boot", 2, 0, True)
    policies = {w.node: w.policy for w in store.workers()}
    assert policies == {"a@h": {"max_memory": 4 << 30, "images": ["pid-sandbox:*"]}, "b@h": {}}
    store.beat("a@h", "h", 1, "boot", 2, 0, True, ["pid"], None)   # the worker now admits everything
    assert store.workers()[0].policy == {}


def test_a_heartbeat_carries_identity_and_alarm_and_a_stop_keeps_them_until_the_next_beat(store):
    store.beat("a@h", "h", 1, "boot", 2, 0, True, identity="boot-1-2", alarm="the store was EMPTIED")
    (beat,) = store.workers()
    assert (beat.identity, beat.alarm, beat.stopped_at) == ("boot-1-2", "the store was EMPTIED", None)
    store.worker_stopped("a@h")
    (stopped,) = store.workers()
    assert (stopped.identity, stopped.alarm) == ("boot-1-2", "the store was EMPTIED") and stopped.stopped_at
    assert store.workers(alive_within_s=60) == []
    store.beat("a@h", "h", 1, "boot", 2, 0, True)   # started again: no identity known, no alarm, not stopped
    (again,) = store.workers(alive_within_s=60)
    assert (again.identity, again.alarm, again.stopped_at, again.pool) == (None, None, None, [])
    store.worker_stopped("gone@h")                  # a worker never heard from: nothing to mark
    assert [w.node for w in store.workers()] == ["a@h"]


def test_a_heartbeat_carries_the_workers_warm_pool(store):
    pool = [{"image": "pid-sandbox:latest", "ready": 2, "memory": 3 << 20}]
    store.beat("a@h", "h", 1, "boot", 2, 0, True, pool=pool)
    (beat,) = store.workers()
    assert beat.pool == pool
    store.beat("a@h", "h", 1, "boot", 2, 0, True, pool=[])   # drained
    (beat,) = store.workers()
    assert beat.pool == []
    store.beat("a@h", "h", 1, "boot", 2, 0, True, pool=pool)
    store.worker_stopped("a@h")   # a stopped worker's pool is removed as it stops: none is shown
    (stopped,) = store.workers()
    assert stopped.stopped_at and stopped.pool == []


def test_list_newest_first_by_status(store, tmp_path):
    jobs = [store.create(spec(tmp_path, n)) for n in range(5)]
    assert [r.id for r in store.list()] == [j.id for j in reversed(jobs)]
    assert [r.id for r in store.list(limit=2)] == [jobs[4].id, jobs[3].id]
    assert store.claim(jobs[1].id, "a", 60)
    assert [r.id for r in store.list(status="running")] == [jobs[1].id]
    store.request_cancel(jobs[2].id)
    assert [r.id for r in store.list(status="cancelled")] == [jobs[2].id]
    assert [r.id for r in store.list(status="queued")] == [jobs[4].id, jobs[3].id, jobs[0].id]
    assert store.get("no-such-job") is None
    d = store.get(jobs[0].id).to_dict()
    assert {"id", "status", "task", "total_usage", "dispatched_at", "undispatched_since", "earlier"} <= set(d)
    assert not {"pinned", "api_key", "secret"} & set(d)


def test_ids_ending_finds_jobs_by_the_end_of_their_id(store, tmp_path):
    from dataclasses import replace
    ids = ["20261201-000000-70a672", "20261201-000001-80a672", "20261201-000002-abcdef", "20261201-000003-abcdez"]
    store.create(replace(spec(tmp_path), id=ids[0]))
    store.create_many([replace(spec(tmp_path, n), id=i) for n, i in enumerate(ids[1:])])
    assert store.ids_ending("70a672") == [ids[0]]
    assert sorted(store.ids_ending("0a672")) == ids[:2]
    assert len(store.ids_ending("a672", limit=1)) == 1
    assert store.ids_ending("abcdez") == [ids[3]] and store.ids_ending("abcdef") == [ids[2]]
    assert store.ids_ending(ids[2]) == [ids[2]]
    assert store.ids_ending("x" + ids[2]) == [] and store.ids_ending("0a67") == [] and store.ids_ending("") == []


# -- blobs ------------------------------------------------------------------------------------------------------------

def test_blobs_are_content_addressed_and_deduplicated(store, tmp_path):
    data = b"hello blob\n"
    digest = store.put_blob(io.BytesIO(data))
    assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert store.has_blob(digest) and b"".join(store.open_blob(digest)) == data
    assert store.put_blob(io.BytesIO(data)) == digest
    empty = store.put_blob(io.BytesIO(b""))
    assert empty == "sha256:" + hashlib.sha256(b"").hexdigest() and b"".join(store.open_blob(empty)) == b""
    missing = "sha256:" + "0" * 64
    assert not store.has_blob(missing)
    with pytest.raises(BlobMissing):
        store.open_blob(missing)
    for bad in ("sha256:xyz", "md5:" + "0" * 32, "sha256:../../etc/passwd"):
        with pytest.raises(ValueError):
            store.has_blob(bad)
    # a file whose digest is known and stored is neither read nor sent again
    assert store.put_blob_file(str(tmp_path / "does-not-exist"), digest) == digest
    path = tmp_path / "f.bin"
    path.write_bytes(b"file content")
    assert store.put_blob_file(str(path)) == "sha256:" + hashlib.sha256(b"file content").hexdigest()
    with pytest.raises(ValueError):
        store.put_blob_file(str(path), "sha256:" + "1" * 64)
    assert leftovers(store) == []


def test_a_large_blob_goes_in_chunks_and_is_never_seen_in_part(store):
    data = os.urandom(3 * 1024 * 1024 + 12345)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    seen_during_upload = []

    class Watched(io.BytesIO):
        def read(self, n: int = -1) -> bytes:
            assert 0 < n <= 1024 * 1024                                 # asked for in chunks, not whole
            seen_during_upload.append(store.has_blob(digest))
            return super().read(n)

    assert store.put_blob(Watched(data)) == digest
    assert len(seen_during_upload) >= 4 and not any(seen_during_upload)
    chunks = list(store.open_blob(digest))
    assert len(chunks) >= 4 and max(map(len, chunks)) <= 1024 * 1024 and b"".join(chunks) == data

    class Broken(io.BytesIO):
        def read(self, n: int = -1) -> bytes:
            if self.tell() >= 2 * 1024 * 1024:
                raise OSError("the client died")
            return super().read(n)

    other = os.urandom(3 * 1024 * 1024)
    with pytest.raises(OSError):
        store.put_blob(Broken(other))
    assert not store.has_blob("sha256:" + hashlib.sha256(other).hexdigest())
    assert not store.has_blob("sha256:" + hashlib.sha256(other[:2 * 1024 * 1024]).hexdigest())
    assert leftovers(store) == []


# -- events ------------------------------------------------------------------------------------------------------------

def test_events_in_order_after_a_number_and_waiting(store, tmp_path):
    job = store.create(spec(tmp_path))
    assert store.events(job.id) == []
    numbers = [store.append_event(job.id, {"type": "turn_start", "turn": n, "text": "é"}) for n in range(5)]
    assert numbers == [1, 2, 3, 4, 5]
    assert [e["turn"] for _, e in store.events(job.id)] == [0, 1, 2, 3, 4]
    assert store.events(job.id, after=3) == [(4, {"type": "turn_start", "turn": 3, "text": "é"}),
                                             (5, {"type": "turn_start", "turn": 4, "text": "é"})]
    assert store.events(job.id, after=5) == []
    started = time.monotonic()
    assert store.events(job.id, after=5, wait_s=0.3) == []            # waits, then gives up
    assert 0.25 <= time.monotonic() - started < 2
    threading.Timer(0.3, lambda: store.append_event(job.id, {"type": "late"})).start()
    started = time.monotonic()
    assert store.events(job.id, after=5, wait_s=10) == [(6, {"type": "late"})]   # woken by the event
    assert time.monotonic() - started < 2
    with pytest.raises(KeyError):
        store.append_event("no-such-job", {"type": "x"})


def test_events_are_bounded_per_job(store, tmp_path):
    job = store.create(spec(tmp_path))
    other = store.create(spec(tmp_path, 1))
    store.append_event(other.id, {"n": 0})
    store.events_kept = 50
    for n in range(1, 301):
        store.append_event(job.id, {"n": n})
    kept = store.events(job.id)
    numbers = [seq for seq, _ in kept]
    assert numbers == list(range(numbers[0], 301)) and [e["n"] for _, e in kept] == numbers
    assert 50 <= len(kept) <= 150 and numbers[0] > 1                 # Redis trims whole stream nodes (~100)
    assert store.events(other.id) == [(1, {"n": 0})]


def test_a_log_read_past_what_was_dropped_says_so_once(store, tmp_path):
    """A long job's log keeps its newest records only: `pid logs` and Job.logs() start with a line saying how many
    went, not silently at some later tool call (a 3,000-call job's log started at its 2,006th record)."""
    from pid.cli.output import EventFollower, RecordPrinter
    job = store.create(spec(tmp_path))
    store.events_kept = 50
    for n in range(1, 301):
        store.append_event(job.id, {"type": "job", "note": f"record {n}"})
    lines: list[str] = []
    shown = RecordPrinter(out=lambda text, **_: lines.append(str(getattr(text, "text", text))))   # (Styled text)
    follower = EventFollower(store, job.id, shown)
    follower.poll()
    first = [seq for seq, _ in store.events(job.id)][0]
    assert lines[0] == f"· {first - 1} log record(s) dropped (a job's log keeps its newest 10,000 records)"
    assert lines[1:] == [f"· record {n}" for n in range(first, 301)]
    store.append_event(job.id, {"type": "job", "note": "record 301"})
    follower.poll()
    assert lines[-1] == "· record 301" and sum("dropped" in line for line in lines) == 1


# -- artifacts and API keys -------------------------------------------------------------------------------------------

def test_a_replaced_blob_of_the_jobs_own_goes_at_once_unless_an_artifact_names_it(store, tmp_path):
    job = store.create(spec(tmp_path))
    first = store.put_artifact(job.id, "session.attempt-1.jsonl", io.BytesIO(b"copy 1\n"))
    second = store.put_artifact(job.id, "session.attempt-1.jsonl", io.BytesIO(b"copy 1\ncopy 2\n"))
    store.put_artifact(job.id, "session.jsonl", io.BytesIO(b"copy 1\ncopy 2\n"))   # the same bytes: one blob
    assert store.drop_own_blob(job.id, first) and not store.has_blob(first)
    assert not store.drop_own_blob(job.id, first)                      # gone already
    assert not store.drop_own_blob(job.id, second) and store.has_blob(second)   # named (twice)
    store.delete_artifact(job.id, "session.attempt-1.jsonl")
    assert not store.drop_own_blob(job.id, second)                     # session.jsonl still names it
    assert b"".join(store.open_artifact(job.id, "session.jsonl")) == b"copy 1\ncopy 2\n"


def test_artifacts_with_a_size_cap(store, tmp_path):
    job = store.create(spec(tmp_path))
    digest = store.put_artifact(job.id, "patch.diff", io.BytesIO(b"--- a\n+++ b\n"))
    store.put_artifact(job.id, "files/src/a.py", io.BytesIO(b"print(1)\n"))
    assert store.has_blob(digest)
    assert store.artifact_names(job.id) == ["files/src/a.py", "patch.diff"]
    assert b"".join(store.open_artifact(job.id, "patch.diff")) == b"--- a\n+++ b\n"
    store.put_artifact(job.id, "patch.diff", io.BytesIO(b"new"))                # replaced
    assert b"".join(store.open_artifact(job.id, "patch.diff")) == b"new"
    assert store.delete_artifact(job.id, "files/src/a.py") is True
    assert store.delete_artifact(job.id, "files/src/a.py") is False
    assert store.artifact_names(job.id) == ["patch.diff"]
    assert store.put_artifact(job.id, "exact", io.BytesIO(b"x" * 100), limit=100)
    with pytest.raises(TooLarge, match="larger than its limit of 100 bytes"):
        store.put_artifact(job.id, "big", io.BytesIO(b"x" * 101), limit=100)
    with pytest.raises(TooLarge):
        store.put_artifact(job.id, "bigger", io.BytesIO(os.urandom(3 * 1024 * 1024)), limit=2 * 1024 * 1024)
    assert "big" not in store.artifact_names(job.id) and leftovers(store) == []
    with pytest.raises(BlobMissing):
        store.open_artifact(job.id, "big")
    with pytest.raises(KeyError):
        store.put_artifact("no-such-job", "x", io.BytesIO(b"x"))
    with pytest.raises(ValueError):
        store.put_artifact(job.id, "", io.BytesIO(b"x"))
    assert store.artifact_names("no-such-job") == []


def test_an_api_key_lives_only_as_long_as_its_job_and_never_in_its_record(store, tmp_path):
    key = "sk-secret-0123456789"
    job = store.create(spec(tmp_path))
    assert store.set_secret(job.id, key) and store.secret(job.id) == key
    assert store.claim(job.id, "a", lease_s=60)
    assert store.secret(job.id) == key                               # a re-dispatched job keeps it
    record = store.get(job.id)
    assert key not in repr(record.to_dict()) and key not in repr(record)
    assert store.finish(job.id, "stop", owner="a")
    assert store.secret(job.id) is None
    assert not store.set_secret(job.id, key)                          # ended: not taken
    assert not store.set_secret("no-such-job", key)
    queued = store.create(spec(tmp_path, 1))
    assert store.set_secret(queued.id, key)
    assert store.request_cancel(queued.id) == "cancelled" and store.secret(queued.id) is None
    lost = store.create(spec(tmp_path, 2))
    assert store.set_secret(lost.id, key) and store.claim(lost.id, "a", 60)
    store.request_cancel(lost.id)
    assert store.requeue(lost.id, lapsed_only=False) and store.secret(lost.id) is None


# -- retention -------------------------------------------------------------------------------------------------------

def test_retention_forgets_ended_jobs_and_old_blobs_unless_pinned(make_store, tmp_path):
    retention = 0.1 if isinstance(make_store(), JobStore) else 1   # Redis's TTLs count whole seconds
    store = make_store(retention=retention)
    ended = store.create(spec(tmp_path, 0))
    kept = store.create(spec(tmp_path, 1))
    live = store.create(spec(tmp_path, 2))
    for job in (ended, kept):
        store.append_event(job.id, {"type": "x"})
        store.put_artifact(job.id, f"result-{job.id}.json", io.BytesIO(job.id.encode()))
        store.post(job.id, "steer", "s")
    assert store.pin_job(kept.id) and not store.pin_job("no-such-job")
    loose = store.put_blob(io.BytesIO(b"loose"))
    pinned = store.put_blob(io.BytesIO(b"pinned"))
    assert store.pin_blob(pinned) and not store.pin_blob("sha256:" + "2" * 64)
    ended_blob = store.put_blob(io.BytesIO(ended.id.encode()))
    for job in (ended, kept):
        assert store.finish_if_queued(job.id, "cancelled")
    assert store.get(ended.id) is not None                            # not yet
    time.sleep(2.2 * retention)
    removed = store.prune()
    assert set(removed) == {"jobs", "blobs"}
    assert store.get(ended.id) is None and store.events(ended.id) == [] and store.artifact_names(ended.id) == []
    assert ended.id not in [r.id for r in store.list()]
    assert not store.has_blob(loose) and not store.has_blob(ended_blob)
    assert store.has_blob(pinned)
    assert store.get(kept.id).status == "cancelled" and store.events(kept.id) != []
    assert b"".join(store.open_artifact(kept.id, f"result-{kept.id}.json")) == kept.id.encode()
    assert store.get(live.id).status == "queued"                     # a job that has not ended is never forgotten
    assert [r.id for r in store.list()] == [live.id, kept.id]
    assert store.prune()["jobs"] == 0


def test_retention_setting():
    assert retention_s("") == 7 * 86400 and retention_s("3600") == 3600 and retention_s("7d") == 7 * 86400
    assert retention_s("12h") == 43200 and retention_s("1.5m") == 90 and retention_s("2w") == 14 * 86400
    for bad in ("soon", "-1", "0", "7 days", "d"):
        with pytest.raises(ValueError, match="PID_RETENTION"):
            retention_s(bad)


# -- choosing the store -----------------------------------------------------------------------------------------------

def test_the_store_url_chooses_the_store(tmp_path, monkeypatch):
    monkeypatch.delenv("PID_STORE_URL", raising=False)
    monkeypatch.delenv("PID_BROKER_URL", raising=False)
    monkeypatch.setenv("PID_HOME", str(tmp_path / "home"))
    s = default_store()
    assert isinstance(s, JobStore) and s.path == str(tmp_path / "home" / "jobs.db")
    monkeypatch.setenv("PID_BROKER_URL", "pidfs://")
    assert isinstance(default_store(), JobStore)
    monkeypatch.setenv("PID_STORE_URL", f"sqlite://{tmp_path}/elsewhere/x.db")
    assert default_store().path == f"{tmp_path}/elsewhere/x.db"
    from pid.jobs.redis_store import RedisStore
    monkeypatch.setenv("PID_STORE_URL", "redis://:hunter2@127.0.0.1:1/3")
    r = default_store()
    assert isinstance(r, RedisStore) and "hunter2" not in r.path and r is default_store()
    monkeypatch.delenv("PID_STORE_URL")
    monkeypatch.setenv("PID_BROKER_URL", "redis://127.0.0.1:2/0")   # the broker's Redis
    assert isinstance(default_store(), RedisStore) and default_store().path == "redis://127.0.0.1:2/0"
    for bad in ("sqlite://relative.db", "sqlite:///", "postgres://x/y", "jobs.db"):
        with pytest.raises(ValueError, match="sqlite:///ABS/PATH.db"):
            open_store(bad)
    monkeypatch.setenv("PID_STORE_URL", "postgres://me:pw@db/x")
    with pytest.raises(ValueError) as bad:
        default_store()
    assert str(bad.value) == ("PID_STORE_URL=postgres://…: not a store pid knows: use sqlite:///ABS/PATH.db or "
                              "redis://HOST:PORT/DB")
    monkeypatch.setenv("PID_RETENTION", "forever")
    for url in ("redis://127.0.0.1:4/0", None):   # (SQLite's too: it reads it only at its first prune)
        with pytest.raises(ValueError, match="PID_RETENTION"):
            open_store(url)


# -- Redis under contention and across fork() ------------------------------------------------------------------------

def _claim_in_child(store: Any, job_id: str, owner: str, q: Any) -> None:
    q.put((owner, store.claim(job_id, owner, 60)))


def test_redis_one_of_many_concurrent_claimers_wins(redis_server, tmp_path):
    from pid.jobs.redis_store import RedisStore
    store = RedisStore(redis_server.url)
    for round_ in range(5):
        job = store.create(spec(tmp_path, round_))
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        procs = [ctx.Process(target=_claim_in_child, args=(store, job.id, f"p{i}", q)) for i in range(8)]
        results: list[tuple[str, bool]] = []
        threads = [threading.Thread(target=lambda i=i: results.append((f"t{i}", store.claim(job.id, f"t{i}", 60))))
                   for i in range(16)]
        for p in procs:
            p.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for p in procs:
            p.join(30)
        results += [q.get(timeout=5) for _ in procs]
        winners = [owner for owner, won in results if won]
        assert len(results) == 24 and len(winners) == 1
        record = store.get(job.id)
        assert record.owner == winners[0] and record.attempts == 1


def test_redis_store_across_fork_while_another_thread_uses_it(redis_server, tmp_path):
    """A worker's pool forks while its housekeeping thread talks to Redis: each child gets its own connection."""
    from pid.jobs.redis_store import RedisStore
    store = RedisStore(redis_server.url)
    busy = store.create(spec(tmp_path, -1)).id
    assert store.claim(busy, "parent", 60)
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            store.beat("node", "host", os.getpid(), None, 4, 1, True)
            store.progress(busy, "parent", n, 0, {"input": n})
            store.suspects("host")
            n += 1

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        for n in range(30):
            job = store.create(spec(tmp_path, n)).id
            pid = os.fork()
            if pid == 0:   # the child: what a pool process does first
                code = 1
                try:
                    owner = f"child:{os.getpid()}:x"
                    ok = store.claim(job, owner, 60) and store.get(job).status == "running"
                    code = 0 if ok and store.progress(job, owner, 1, 1, lease_s=60) else 3
                finally:
                    os._exit(code)
            deadline = time.time() + 20
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    assert os.waitstatus_to_exitcode(status) == 0
                    break
                assert time.time() < deadline, "a forked child hung"
                time.sleep(0.01)
            assert store.get(job).owner.startswith("child:")
    finally:
        stop.set()
        writer.join(10)
    assert store.progress(busy, "parent", 1, 1)                      # the parent's connection still works


def test_redis_leases_are_on_the_servers_clock_not_the_workers(redis_server, tmp_path, monkeypatch):
    """A worker whose clock runs an hour behind claims a job: another worker must not find its lease lapsed, and
    one whose clock runs ahead must not keep a lapsed lease alive."""
    from pid.jobs.redis_store import RedisStore
    store = RedisStore(redis_server.url)
    job = store.create(spec(tmp_path))
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 3600)          # the slow machine
    assert store.claim(job.id, "slow:1:x", lease_s=60)
    monkeypatch.setattr(time, "time", real)
    assert store.lapsed() == [] and not store.claim(job.id, "h:2:y", lease_s=60)
    assert not store.requeue(job.id) and not store.finish(job.id, "error", lapsed_only=True)
    other = store.create(spec(tmp_path, 1))
    monkeypatch.setattr(time, "time", lambda: real() + 3600)          # the fast machine
    assert store.claim(other.id, "fast:1:x", lease_s=0.05)
    monkeypatch.setattr(time, "time", real)
    time.sleep(0.1)
    assert [r.id for r in store.lapsed()] == [other.id] and store.claim(other.id, "h:2:y", lease_s=60)
    assert abs(store.now() - real()) < 5


def test_redis_a_script_sent_again_after_a_lost_reply_does_not_run_twice(redis_server, tmp_path):
    """redis-py sends a command again when the connection breaks before the reply: the second send of a claim must
    not refuse the claimer, nor a second take_messages lose the messages."""
    import json

    from pid.jobs.redis_store import PREFIX, RedisStore
    store = RedisStore(redis_server.url)
    client, scripts = store._connection()
    job = store.create(spec(tmp_path))

    def send(script: str, token: str, **args: Any) -> Any:
        return scripts[script](args=[PREFIX, str(store.retention), job.id, json.dumps(args), token], client=client)

    assert send("claim", "t1", owner="a", lease_s=60) == 1
    assert send("claim", "t1", owner="a", lease_s=60) == 1            # the same call, sent again
    assert send("claim", "t2", owner="a", lease_s=60) == 0            # a new claim is refused
    assert store.get(job.id).attempts == 1
    store.post(job.id, "steer", "one")
    taken = send("take_messages", "t3")
    assert send("take_messages", "t3") == taken and len(taken) == 1
    assert send("requeue", "t4", owner="a", lapsed_only=False, handback=True, turns=1, tool_calls=1, usage=None,
                cancelled_status="cancelled") == b"queued"
    assert send("requeue", "t4", owner="a", lapsed_only=False, handback=True, turns=1, tool_calls=1, usage=None,
                cancelled_status="cancelled") == b"queued"
    assert store.get(job.id).handbacks == 1


# -- batches ----------------------------------------------------------------------------------------------------------

def batch_spec(tmp_path: Path, n: int, batch: str) -> JobSpec:
    s = spec(tmp_path, n)
    s.batch = batch
    return s


def test_a_batch_budget_adds_up_atomically_and_stops_claims_once_spent(store, tmp_path):
    assert store.batch("b1") is None
    assert store.add_batch_spend("b1", 1.0) is None              # an unknown batch: nothing recorded
    info = store.set_batch("b1", max_total_cost=1.0, max_running=None)
    assert (info.spent, info.max_total_cost, info.max_running, info.running, info.exhausted) == (0, 1.0, None, 0, False)
    jobs = [store.create(batch_spec(tmp_path, n, "b1")) for n in range(3)]
    other = store.create(spec(tmp_path, 9))
    assert [r.id for r in store.batch_jobs("b1")] == [j.id for j in jobs]   # one query; not the other job
    assert store.claim(jobs[0].id, "w", 60)
    threads = [threading.Thread(target=store.add_batch_spend, args=("b1", 0.01)) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    info = store.batch("b1")
    assert info.spent == pytest.approx(0.4) and info.running == 1 and not info.exhausted
    assert store.add_batch_spend("b1", 0.6).exhausted
    assert not store.claim(jobs[1].id, "w", 60)                  # the budget is spent: no job of it starts
    assert store.get(jobs[1].id).status == "queued"
    assert store.claim(other.id, "w", 60)                        # other jobs are not concerned
    again = store.set_batch("b1", max_total_cost=5.0, max_running=None)   # a rerun raises the budget: spend is kept
    assert again.spent == pytest.approx(1.0) and not again.exhausted
    assert store.claim(jobs[1].id, "w", 60)


def test_a_batch_runs_at_most_max_running_jobs_whoever_claims(store, tmp_path):
    store.set_batch("b2", max_total_cost=None, max_running=2)
    jobs = [store.create(batch_spec(tmp_path, n, "b2")) for n in range(4)]
    assert store.claim(jobs[0].id, "w1", 60) and store.claim(jobs[1].id, "w2", 60)
    assert not store.claim(jobs[2].id, "w3", 60)                 # over the limit: it waits, queued
    assert store.get(jobs[2].id).status == "queued" and store.batch("b2").running == 2
    assert store.finish(jobs[0].id, "stop", owner="w1")
    assert store.claim(jobs[2].id, "w3", 60)                     # a slot of the batch is free again
    assert not store.claim(jobs[3].id, "w4", 60)
    assert store.renew(jobs[1].id, "w2", 0.05)                   # jobs[1]'s worker's last renewal; it died...
    time.sleep(0.1)                                              # ...and its lapsed lease...
    assert store.claim(jobs[1].id, "w5", 60)                     # ...is taken over: the same job, not one more
    assert store.batch("b2").running == 2
    assert store.requeue(jobs[1].id, owner="w5", lapsed_only=False)
    assert store.claim(jobs[3].id, "w4", 60)
    assert not store.claim(jobs[1].id, "w6", 60)


def test_create_many_makes_queued_jobs_at_once_dispatched_or_not(store, tmp_path):
    made = [batch_spec(tmp_path, n, "b3") for n in range(5)]
    store.create_many(made[:3], dispatched=True)
    store.create_many(made[3:])
    records = {r.id: r for r in store.batch_jobs("b3")}
    assert list(records) == [s.id for s in made]
    for n, s in enumerate(made):
        r = records[s.id]
        assert (r.status, r.kind, r.spec.task, r.attempts) == ("queued", "worker", s.task, 0)
        assert (r.dispatched_at is not None) == (n < 3) and (r.undispatched_since is None) == (n < 3)
    waiting = {r.id for r in store.to_dispatch(stale_before=None)}
    assert waiting >= {s.id for s in made[3:]} and not waiting & {s.id for s in made[:3]}
    with pytest.raises(ValueError):
        store.create_many([made[0]])
    assert store.claim(made[0].id, "w", 60)


def test_a_heartbeat_after_a_silence_from_the_same_process_says_when_it_resumed(store):
    """silent_since, resumed_at: a silence longer than silent_s, from the beat before it to the one after, and only
    from the process that beat before (the same identity); a worker started again under the same name, or beating
    on time, did not resume."""
    store.beat("a@h", "h", 1, "boot", 2, 0, True, identity="boot-1-2", silent_s=0.2)
    store.beat("a@h", "h", 1, "boot", 2, 0, True, identity="boot-1-2", silent_s=0.2)
    (on_time,) = store.workers()
    assert on_time.resumed_at is None and on_time.silent_since is None
    time.sleep(0.3)
    store.beat("a@h", "h", 1, "boot", 2, 0, True, identity="boot-1-2", silent_s=0.2)
    (back,) = store.workers()
    assert (back.silent_since, back.resumed_at) == (on_time.beat_at, back.beat_at)   # silent for 0.3 s, then back
    time.sleep(0.3)
    store.beat("a@h", "h", 9, "boot", 2, 0, True, identity="boot-9-9", silent_s=0.2)   # another process
    (restarted,) = store.workers()
    assert restarted.resumed_at == back.resumed_at
    store.worker_stopped("a@h")
    time.sleep(0.3)
    store.beat("a@h", "h", 9, "boot", 2, 0, True, identity="boot-9-9", silent_s=0.2)   # a stop is no silence
    assert store.workers()[0].resumed_at == back.resumed_at


def test_redis_a_write_whose_reply_is_lost_is_sent_again_and_done_once(redis_server, tmp_path):
    """The store goes away just after a script ran, its reply lost: the same call is sent again with its token and
    returns what the first run did (once.lua). Without it, a steer taken in that instant was lost and a batch's spend
    counted twice. When it stays away a while, the job's Patience tries the write again: the same once."""
    from pid.jobs.outage import Patience, patient
    from pid.jobs.redis_store import RedisStore
    from tests.reply_cutter import ReplyCutter
    cutter = ReplyCutter(redis_server.port)
    try:
        store = RedisStore(cutter.url)
        job = store.create(spec(tmp_path))
        store.set_batch("b", max_total_cost=10.0, max_running=None)
        assert store.take_messages(job.id) == [] and store.add_batch_spend("b", 0.0).spent == 0   # (scripts loaded:
        store.post(job.id, "steer", "one")                               # the reply cut is the script's, not NOSCRIPT)
        sha = {name: script.sha.encode() for name, script in store._connection()[1].items()}   # (what EVALSHA sends)
        cutter.cut_after = sha["take_messages"]
        assert store.take_messages(job.id) == [("steer", "one")]
        assert cutter.cut.is_set() and store.take_messages(job.id) == []

        cutter.cut.clear()
        cutter.cut_after, cutter.down_after_cut_s = sha["add_batch_spend"], 1.0   # the send again fails too
        info = patient(store, Patience(job.id, time.monotonic() + 3600)).add_batch_spend("b", 0.25)
        assert cutter.cut.is_set() and info is not None and info.spent == 0.25
        assert RedisStore(redis_server.url).batch("b").spent == 0.25   # counted once
        direct = RedisStore(redis_server.url)._r   # a patient write's run is remembered as long as it may be tried
        kept = sorted(direct.ttl(key) for key in direct.scan_iter(match="pid:done:*"))
        assert kept[0] <= 600 and kept[-1] > 3600, kept
    finally:
        cutter.close()
