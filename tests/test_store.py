"""The job store decides "never lost, never twice": one claimer wins, leases lapse, stale owners cannot finish."""
from __future__ import annotations

import multiprocessing
import time

from worker.jobs import JobSpec
from worker.store import JobStore


def spec(tmp_path, **kw) -> JobSpec:
    return JobSpec(task="t", repo=str(tmp_path), model="m", out_dir=str(tmp_path / "out"), base_url="http://x", **kw)


def _claim(path: str, job_id: str, owner: str, q) -> None:
    q.put((owner, JobStore(path).claim(job_id, owner, 60)))


def test_exactly_one_of_many_concurrent_claimers_wins(tmp_path):
    path = str(tmp_path / "jobs.db")
    job = JobStore(path).create(spec(tmp_path))
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(path, job.id, f"w{i}", q)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    outcomes = [q.get(timeout=5) for _ in procs]
    winners = [owner for owner, won in outcomes if won]
    assert len(winners) == 1
    record = JobStore(path).get(job.id)
    assert record.status == "running" and record.owner == winners[0] and record.attempts == 1


def test_redelivery_while_leased_is_refused_and_lapsed_lease_is_reclaimed(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(spec(tmp_path))
    assert store.claim(job.id, "a", lease_s=0.3)
    assert not store.claim(job.id, "b", lease_s=60)        # duplicate delivery while a is alive
    assert store.renew(job.id, "a", lease_s=0.3)
    time.sleep(0.5)                                         # a stopped renewing: dead
    assert [r.id for r in store.lapsed()] == [job.id]
    assert store.claim(job.id, "b", lease_s=60)
    assert not store.renew(job.id, "a", lease_s=60)         # the old owner learns it lost the job
    assert not store.finish(job.id, "stop", owner="a")  # ...and cannot overwrite the ending
    assert store.finish(job.id, "stop", owner="b", turns=3, tool_calls=2)
    record = store.get(job.id)
    assert (record.status, record.attempts, record.turns, record.exit_reason) == ("completed", 2, 3, "stop")
    assert not store.claim(job.id, "c", lease_s=60)         # finished jobs are never run again


def test_cancel_of_a_queued_job_ends_it_and_blocks_claims(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(spec(tmp_path))
    assert store.request_cancel(job.id) == "cancelled"
    assert not store.claim(job.id, "w", 60)
    assert not store.post(job.id, "steer", "too late")


def test_messages_are_delivered_once_in_order(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(spec(tmp_path))
    assert store.post(job.id, "steer", "one")
    assert store.post(job.id, "follow_up", "two")
    assert store.post(job.id, "steer", "three")
    assert store.take_messages(job.id) == [("steer", "one"), ("follow_up", "two"), ("steer", "three")]
    assert store.take_messages(job.id) == []


def test_spec_round_trips_and_ignores_unknown_fields(tmp_path):
    s = spec(tmp_path, tools=["read"], files=["/workspace/x"])
    data = s.to_dict() | {"from_a_newer_version": 1}
    assert JobSpec.from_dict(data) == s


def test_a_cancelled_job_whose_worker_died_ends_cancelled_with_a_result(tmp_path):
    from worker.tasks import sweep
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(spec(tmp_path))
    assert store.claim(job.id, "dead-worker", lease_s=0.2)
    assert store.request_cancel(job.id) == "running"   # the worker would have stopped it, but it died
    time.sleep(0.3)
    sweep(store)
    record = store.get(job.id)
    assert (record.status, record.exit_reason) == ("cancelled", "cancelled")
    assert '"status": "cancelled"' in (tmp_path / "out" / job.id / "result.json").read_text()


def test_the_sweeper_never_ends_a_job_that_was_just_claimed_again(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(spec(tmp_path))
    assert store.claim(job.id, "a", lease_s=60)
    assert not store.finish(job.id, "worker_lost", lapsed_only=True)
    assert store.get(job.id).status == "running"
