"""The job store decides "never lost, never twice": one claimer wins, leases lapse, stale owners cannot finish."""
from __future__ import annotations

import gc
import multiprocessing
import threading
import time

from pid.jobs.spec import JobSpec
from pid.session import iso_time
from pid.jobs.sqlite_store import JobStore
from tests.conftest import open_descriptors


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
    assert store.claim(job.id, "a", lease_s=60)
    assert not store.claim(job.id, "b", lease_s=60)        # duplicate delivery while a is alive
    assert store.renew(job.id, "a", lease_s=0.05)          # its last renewal: then a stopped renewing: dead
    time.sleep(0.1)
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
    from pid.jobs.sweep import sweep
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(spec(tmp_path))
    a_worker_reaches_the_store(store)
    assert store.claim(job.id, "dead-worker", lease_s=0.2)
    assert store.request_cancel(job.id) == "running"   # the worker would have stopped it, but it died
    time.sleep(0.3)
    a_worker_reaches_the_store(store)
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


def test_a_job_taken_up_again_keeps_the_earlier_attempts_counts_and_usage(tmp_path):
    from pid.jobs.results import with_earlier_attempts
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(spec(tmp_path))
    assert store.claim(job.id, "a", lease_s=0.2)
    used = {"input": 1000, "output": 50, "cache_read": 0, "cache_write": 0, "reasoning": 20, "total_tokens": 1050,
            "cost": 0.5}
    assert store.progress(job.id, "a", 2, 3, used, "turn 2: running bash sleep 9", "bash ls (ok, 0.1s)")
    assert not store.progress(job.id, "intruder", 9, 9, used)   # only the lease holder records progress
    time.sleep(0.3)
    assert store.claim(job.id, "b", lease_s=60)
    record = store.get(job.id)
    assert (record.turns, record.tool_calls, record.usage, record.activity) == (0, 0, {}, None)
    assert record.earlier == [{"attempt": 1, "turns": 2, "tool_calls": 3, "usage": used}]
    assert record.total_usage["total_tokens"] == 1050 and record.total_usage["cost"] == 0.5
    result = {"turns": 1, "tool_calls": 0, "usage": dict(used, input=10, total_tokens=60, cost=0.25),
              "duration_s": 0.01}
    before = time.time()
    with_earlier_attempts(result, record.earlier, record.started_at)
    after = time.time()
    assert result["usage"]["input"] == 1010 and result["usage"]["cost"] == 0.75
    assert result["usage"]["reasoning"] == 40   # every field result.json's usage has, summed (it was dropped)
    assert "estimated" not in result["usage"]
    from pid.jobs.store import sum_usage
    assert sum_usage(used, dict(used, estimated=True))["estimated"] is True   # (one attempt's tokens were counted)
    assert set(result["usage"]) == set(used) and set(result["per_attempt"][0]["usage"]) == set(used)
    assert [a["attempt"] for a in result["per_attempt"]] == [1, 2]
    # its duration is the job's, from the first attempt's start, as pid list shows it; this attempt's is kept
    assert result["per_attempt"][-1]["duration_s"] == 0.01
    assert before - record.started_at - 0.001 <= result["duration_s"] <= after - record.started_at + 0.001
    assert result["started_at"] == iso_time(record.started_at) and result["duration_s"] >= 0.3
    assert store.finish(job.id, "stop", owner="b", usage=result["per_attempt"][-1]["usage"])
    assert store.get(job.id).total_usage["cost"] == 0.75


def test_list_filters_by_status(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    queued, done = store.create(spec(tmp_path)), store.create(spec(tmp_path))
    store.request_cancel(done.id)
    assert [r.id for r in store.list(status="queued")] == [queued.id]
    assert [r.id for r in store.list(status="cancelled")] == [done.id]
    assert len(store.list()) == 2


def test_a_store_made_by_an_older_pid_gets_the_new_columns(tmp_path):
    import sqlite3
    path = str(tmp_path / "jobs.db")
    old = sqlite3.connect(path)
    old.executescript("CREATE TABLE jobs (id TEXT PRIMARY KEY, spec TEXT NOT NULL, status TEXT NOT NULL, owner TEXT, "
                      "lease_until REAL, attempts INTEGER NOT NULL DEFAULT 0, cancel_requested INTEGER NOT NULL "
                      "DEFAULT 0, paused INTEGER NOT NULL DEFAULT 0, turns INTEGER NOT NULL DEFAULT 0, tool_calls "
                      "INTEGER NOT NULL DEFAULT 0, exit_reason TEXT, error TEXT, created_at REAL NOT NULL, "
                      "started_at REAL, finished_at REAL);")
    s = spec(tmp_path)
    old.execute("INSERT INTO jobs (id, spec, status, created_at) VALUES (?, ?, 'queued', 1)",
                (s.id, __import__("json").dumps(s.to_dict())))
    old.commit()
    old.close()
    store = JobStore(path)
    record = store.get(s.id)
    assert (record.kind, record.usage, record.earlier) == ("worker", {}, [])
    assert store.claim(s.id, "w", 60) and store.progress(s.id, "w", 1, 1, {"input": 5})


def test_the_sweep_ends_a_lost_pid_run_but_not_a_stopped_one(tmp_path):
    import os
    import socket
    import subprocess
    from pid.jobs.sweep import sweep
    store = JobStore(str(tmp_path / "jobs.db"))
    dead = subprocess.Popen(["true"])
    dead.wait()
    lost, stopped = store.create(spec(tmp_path), kind="run"), store.create(spec(tmp_path), kind="run")
    host = socket.gethostname()
    assert store.claim(lost.id, f"{host}:{dead.pid}:x", lease_s=0.2)
    assert store.claim(stopped.id, f"{host}:{os.getpid()}:y", lease_s=0.2)   # alive, only not renewing
    assert store.progress(lost.id, f"{host}:{dead.pid}:x", 3, 2, {"input": 700, "output": 30, "cost": 0.01})
    time.sleep(0.3)
    assert sweep(store) == [lost.id]
    record = store.get(lost.id)
    assert (record.status, record.exit_reason, record.turns, record.tool_calls) == ("failed", "client_lost", 3, 2)
    assert "`pid run` process" in record.error and f"pid {dead.pid}" in record.error
    result = __import__("json").loads((tmp_path / "out" / lost.id / "result.json").read_text())
    assert (result["status"], result["exit_reason"], result["turns"], result["tool_calls"]) == \
        ("failed", "client_lost", 3, 2)
    assert result["usage"]["input"] == 700 and result["error"] == record.error
    assert store.get(stopped.id).status == "running"
    assert store.renew(stopped.id, f"{host}:{os.getpid()}:y", 60)   # it goes on where it was


def test_a_live_workers_lapsed_lease_waits_out_a_store_outage_then_goes(tmp_path, monkeypatch):
    """A worker alive on this host whose lease lapsed (the job store was out of reach, so nobody could renew) keeps
    its job for ALIVE_GRACE_S, and renews it where it was; past that, a stopped or hung one loses it to the queue
    (a new-user test: after a 40 s Redis outage the job ran again from the start beside the first attempt)."""
    import os
    import socket
    from pid.jobs import sweep as sweeping
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(spec(tmp_path))
    owner = f"{socket.gethostname()}:{os.getpid()}:w"
    assert store.claim(job.id, owner, lease_s=0.1)
    time.sleep(0.2)
    assert sweeping.sweep(store) == [] and store.get(job.id).status == "running"
    assert store.renew(job.id, owner, 0.1)   # the store is back: it goes on where it was
    time.sleep(0.2)
    monkeypatch.setattr(sweeping, "ALIVE_GRACE_S", 0.05)
    assert sweeping.sweep(store) == [] and store.get(job.id).status == "queued"
    assert not store.renew(job.id, owner, 60)


def test_a_live_workers_job_that_wrote_its_result_is_ended_from_it_within_the_grace(tmp_path):
    """The grace is for a job still running: one whose result.json is written (its end could not reach the store)
    ends from it at the next sweep, as before, not 5 minutes later (a review)."""
    import json
    import os
    import socket
    from pid.jobs.sweep import sweep
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(spec(tmp_path))
    assert store.claim(job.id, f"{socket.gethostname()}:{os.getpid()}:w", lease_s=0.1)
    os.makedirs(job.spec.job_dir)
    with open(os.path.join(job.spec.job_dir, "result.json"), "w") as f:
        json.dump({"id": job.id, "status": "completed", "exit_reason": "stop", "turns": 2, "tool_calls": 1}, f)
    time.sleep(0.2)
    assert sweep(store) == [job.id]
    assert (store.get(job.id).status, store.get(job.id).exit_reason) == ("completed", "stop")


def test_a_lapsed_lease_held_on_another_host_waits_while_the_heartbeats_say_the_store_is_just_back(tmp_path,
                                                                                                  monkeypatch):
    """From another host the holder cannot be seen: its lease lapsed because it died, or because the store was out
    of everyone's reach (a new-user test: after a 40 s Redis outage, the compose stack's other replica ran a live
    worker's job again). The sweep holds off while the heartbeats say the store is only just back, and puts the job
    back once they say the workers reach it and the holder stays silent; past ALIVE_GRACE_S, whatever they say."""
    from pid.jobs import sweep as sweeping
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(spec(tmp_path))
    owner = "elsewhere:4242:w.boot-4242-1"
    monkeypatch.setattr(sweeping, "ALIVE_WITHIN_S", 0.2)   # (a worker not heard from for 0.2 s: not reaching it)
    store.beat("v@other", "other", 7, None, 1, 0, True, identity="boot-7-1")
    assert store.claim(job.id, owner, lease_s=0.1)
    time.sleep(0.3)
    store.beat("new@third", "third", 8, None, 1, 0, True, identity="boot-8-1")   # started after the lapse
    assert sweeping.sweep(store) == [] and store.get(job.id).status == "running"   # none of the others is back yet
    store.beat("w@elsewhere", "elsewhere", 4242, None, 1, 1, True, identity="boot-4242-1")
    assert sweeping.sweep(store) == [] and store.get(job.id).status == "running"   # the holder beats: it renews
    assert store.renew(job.id, owner, 0.1)
    time.sleep(0.2)
    store.beat("v@other", "other", 7, None, 1, 0, True, identity="boot-7-1", silent_s=0.2)   # silent since before
    assert sweeping.sweep(store) == [] and store.get(job.id).status == "running"   # the lapse: it is back, so may w
    monkeypatch.setattr(sweeping, "LEASE_S", 0.0)   # v's return is a lease ago; v beats, w is silent: w is gone
    assert sweeping.sweep(store) == [] and store.get(job.id).status == "queued"
    assert not store.renew(job.id, owner, 60)

    monkeypatch.setattr(sweeping, "LEASE_S", 60.0)
    assert store.claim(job.id, owner, lease_s=0.1)
    time.sleep(0.2)
    store.beat("w@elsewhere", "elsewhere", 4242, None, 1, 1, True, identity="boot-4242-1")
    monkeypatch.setattr(sweeping, "ALIVE_GRACE_S", 0.05)   # the grace bounds every hold-off
    assert sweeping.sweep(store) == [] and store.get(job.id).status == "queued"


def test_a_workers_return_holds_off_only_the_leases_that_lapsed_while_it_was_away(tmp_path, monkeypatch):
    """A worker back from a silence that ended before the lease lapsed (a laptop that slept, a blip) says nothing of
    this lease. A `pid run` on another host has no heartbeat, and nobody runs it again: it has the grace alone (its
    machine may be suspended), then ends client_lost."""
    from pid.jobs import sweep as sweeping
    store = JobStore(str(tmp_path / "jobs.db"))
    store.beat("v@other", "other", 7, None, 1, 0, True, identity="boot-7-1")
    time.sleep(0.3)
    store.beat("v@other", "other", 7, None, 1, 0, True, identity="boot-7-1", silent_s=0.2)   # back, just now
    job, run = store.create(spec(tmp_path)), store.create(spec(tmp_path), kind="run")
    assert store.claim(job.id, "elsewhere:4242:w.boot-4242-1", lease_s=0.1)
    assert store.claim(run.id, "elsewhere:4243:r.boot-4243-1", lease_s=0.1)
    time.sleep(0.2)
    store.beat("v@other", "other", 7, None, 1, 0, True, identity="boot-7-1")
    assert sweeping.sweep(store) == [] and store.get(job.id).status == "queued"
    assert store.get(run.id).status == "running"   # within the grace: its machine may only be asleep
    monkeypatch.setattr(sweeping, "ALIVE_GRACE_S", 0.05)
    removed: list[str] = []
    monkeypatch.setattr(sweeping, "_remove_containers", lambda job_id, attempt: removed.append(job_id))
    assert sweeping.sweep(store) == [run.id] and store.get(run.id).exit_reason == "client_lost"
    assert removed == []   # its container stays for it to come back to (on a shared engine); else the reaper's TTL
    assert "has not been heard from for" in store.get(run.id).error and "killed, or its machine away" in \
        store.get(run.id).error


def a_worker_reaches_the_store(store: JobStore) -> None:
    """A live worker elsewhere, there before the lease lapsed, beats: a lapsed lease held on another host is then its
    holder's death, not the store's outage (jobs/sweep.store_just_back)."""
    store.beat("live@elsewhere", "elsewhere", 1, None, 1, 0, True, identity="boot-1-1")


def test_a_worker_logs_its_end_when_a_sweep_recorded_it_from_its_result_but_not_another_attempts(tmp_path):
    """The store refuses a worker's end when the job had ended or is another's: a sweep that ended it from the
    result.json this worker wrote (a store outage) leaves it this worker's to log; a job another worker holds does
    not (its log is that attempt's)."""
    from pid.worker.control import record_end
    from pid.worker.tasks import _still_mine
    store = JobStore(str(tmp_path / "jobs.db"))
    mine, taken = store.create(spec(tmp_path)), store.create(spec(tmp_path))
    for job in (mine, taken):
        assert store.claim(job.id, "h:1:me", lease_s=60)
    assert store.finish(mine.id, "stop", owner="h:1:me")   # the sweep, from this worker's result.json
    assert store.requeue(taken.id, "h:1:me", lapsed_only=False) and store.claim(taken.id, "h:2:next", lease_s=60)
    for job, still in ((mine, True), (taken, False)):
        assert not record_end(store, job.id, "h:1:me", {"exit_reason": "stop"}, attempts=1)
        assert _still_mine(store, job.id, "h:1:me") is still


def test_the_sweep_fails_a_job_whose_attempts_are_used_up_with_its_counts(tmp_path):
    from pid.jobs.sweep import MAX_ATTEMPTS, sweep
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(spec(tmp_path))
    a_worker_reaches_the_store(store)
    for attempt in range(MAX_ATTEMPTS):
        assert store.claim(job.id, f"w{attempt}", lease_s=0.1)
        store.progress(job.id, f"w{attempt}", 1, 1, {"input": 100, "output": 10, "total_tokens": 110, "cost": 0.1})
        time.sleep(0.2)
    a_worker_reaches_the_store(store)
    assert sweep(store) == [job.id]
    record = store.get(job.id)
    assert (record.status, record.exit_reason) == ("failed", "worker_lost")
    assert f"worker lost {MAX_ATTEMPTS} time(s)" in record.error
    result = __import__("json").loads((tmp_path / "out" / job.id / "result.json").read_text())
    assert result["usage"]["input"] == 100 * MAX_ATTEMPTS and len(result["per_attempt"]) == MAX_ATTEMPTS


def test_a_job_that_wrote_its_result_then_died_keeps_that_result(tmp_path):
    """Killed between writing result.json and telling the store: the sweep takes the written ending, never an
    'unrun' one over it."""
    import json
    import os
    import socket
    import subprocess

    from pid.jobs.sweep import sweep
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(spec(tmp_path), kind="run")
    assert store.claim(job.id, "nohost:1:x", lease_s=0.2)
    os.makedirs(job.spec.job_dir)
    written = {"id": job.id, "status": "completed", "exit_reason": "stop", "final_message": "all done", "turns": 4,
               "tool_calls": 3}
    path = os.path.join(job.spec.job_dir, "result.json")
    with open(path, "w") as f:
        json.dump(written, f)
    time.sleep(0.3)
    assert sweep(store) == [job.id]
    record = store.get(job.id)
    assert (record.status, record.exit_reason, record.turns, record.tool_calls) == ("completed", "stop", 4, 3)
    with open(path) as f:
        assert json.load(f) == written

    # a worker's job: the result.json an earlier attempt left is not this attempt's ending
    again = store.create(spec(tmp_path))
    assert store.claim(again.id, "nohost:1:a", lease_s=0.2)
    os.makedirs(again.spec.job_dir)
    with open(os.path.join(again.spec.job_dir, "result.json"), "w") as f:
        json.dump({**written, "id": again.id, "attempt": 1}, f)
    time.sleep(0.3)
    dead = subprocess.Popen(["true"])   # the second attempt's worker, here, is gone
    dead.wait()
    assert store.requeue(again.id, "nohost:1:a", lapsed_only=True)
    assert store.claim(again.id, f"{socket.gethostname()}:{dead.pid}:b", 0.2)
    os.utime(os.path.join(again.spec.job_dir, "result.json"))   # written since, by its time: its attempt tells
    time.sleep(0.3)
    assert sweep(store) == [] and store.get(again.id).status == "queued"   # lost: back in the queue, not "stop"


def test_waiting_on_a_job_whose_record_vanishes_says_so(tmp_path, monkeypatch):
    """`submit --wait` on a job whose record the store lost (flushed, a Redis without persistence restarted): one
    line, exit 2, not a traceback and exit 1 as if the job had failed (a new-user test)."""
    import sqlite3
    import threading

    import pytest

    from pid.cli.ids import NoSuchJob
    from pid.cli.main import _wait_and_exit
    monkeypatch.setenv("PID_HOME", str(tmp_path / "home"))
    path = str(tmp_path / "jobs.db")
    store = JobStore(path)
    job = store.create(spec(tmp_path))

    def lose() -> None:
        with sqlite3.connect(path) as db:
            db.execute("DELETE FROM jobs WHERE id = ?", (job.id,))

    threading.Timer(0.3, lose).start()
    with pytest.raises(NoSuchJob, match="no longer in the job store") as raised:
        _wait_and_exit(store, job.id, as_json=True, follow=False)
    assert raised.value.exit_code == 2


def test_following_the_log_of_a_job_whose_record_vanishes_says_so(tmp_path, monkeypatch):
    """`pid logs -f` on a job whose record the store lost ended at once, exit 0, with nothing said."""
    import sqlite3

    from click.testing import CliRunner

    from pid.cli.main import cli
    monkeypatch.setenv("PID_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PID_BROKER_URL", raising=False)
    path = str(tmp_path / "home" / "jobs.db")
    job = JobStore(path).create(spec(tmp_path))

    from pid.cli.output import EventFollower
    first_poll = EventFollower.poll

    def lose_then_poll(self, *args, **kwargs):   # (its first poll comes after the job was found)
        with sqlite3.connect(path) as db:
            db.execute("DELETE FROM jobs WHERE id = ?", (job.id,))
        return first_poll(self, *args, **kwargs)

    monkeypatch.setattr(EventFollower, "poll", lose_then_poll)
    res = CliRunner().invoke(cli, ["logs", "-f", job.id])
    assert res.exit_code == 2 and "no longer in the job store" in res.output, res.output


def test_a_replacement_worker_that_reaches_the_store_does_not_hold_off_a_dead_workers_job(tmp_path):
    """The dead worker's replacement (a new pod) started after the lease lapsed: once it has reached the store for a
    while, the holder would have beaten too if it could; the job goes back to the queue, not after the whole grace."""
    from pid.jobs.store import ALIVE_WITHIN_S, WorkerBeat
    from pid.jobs.sweep import store_just_back
    store = JobStore(str(tmp_path / "jobs.db"))
    job = store.create(spec(tmp_path))
    assert store.claim(job.id, "old-pod:7:w.boot-7-1", lease_s=60)
    record = store.get(job.id)
    lapse = record.lease_until

    def new_pod(started: float, now: float) -> WorkerBeat:
        return WorkerBeat("w@new-pod", "new-pod", 7, None, 1, 0, now, started, now, identity="boot-7-9")
    just_started = lapse + 5
    assert store_just_back(record, [new_pod(just_started, just_started + 1)], just_started + 1)   # too soon to tell
    later = just_started + 2 * ALIVE_WITHIN_S + 1
    assert not store_just_back(record, [new_pod(just_started, later)], later)


def test_the_connection_a_finished_thread_kept_for_reading_is_closed(tmp_path):
    """Each job's control thread keeps a connection for its frequent reads. A connection is in a reference cycle, so
    the thread's end left it open until a garbage collection: a worker soak saw dozens open at once. The next thread
    to open one closes those of threads that have ended."""
    path = str(tmp_path / "jobs.db")
    store = JobStore(path)
    job = store.create(spec(tmp_path))
    gc.collect()
    gc.disable()   # (what a collection would close is what this looks for)
    try:
        for _ in range(10):
            reader = threading.Thread(target=lambda: store.events(job.id))
            reader.start()
            reader.join()
        left = len(open_descriptors(path))   # (the database, its -wal and -shm files)
    finally:
        gc.enable()
    assert 0 < left <= 3, left   # the last thread's alone (its files), closed when the next one opens
    assert store.events(job.id) is not None   # (the main thread's own goes on being used)
