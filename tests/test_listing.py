"""`pid list`'s lines (cli/listing.py), from a real store's records."""
from __future__ import annotations

from pid.cli.listing import job_lines, worker_lines
from pid.jobs.spec import JobSpec
from pid.jobs.sqlite_store import JobStore
from pid.jobs.store import WorkerBeat


def test_a_paused_job_is_listed_as_paused(tmp_path):
    """As `pid status` says it: a user steering from the list sees which jobs are held (a new-user test)."""
    store = JobStore(str(tmp_path / "jobs.db"))
    held, free = (store.create(JobSpec(task=f"task {n}", repo=str(tmp_path), model="m", out_dir=str(tmp_path),
                                       base_url="http://x")) for n in range(2))
    assert store.claim(held.id, "w", lease_s=60) and store.set_paused(held.id, True)
    lines = job_lines([store.get(held.id), store.get(free.id)], 200)
    assert "running (paused)" in lines[1] and "task 0" in lines[1], lines
    assert "paused" not in lines[2] and "queued" in lines[2], lines


def test_a_worker_no_longer_heard_from_shows_no_running_count():
    """Its last beat's count is not what it runs now: a lost worker's jobs are handed back (pid workers --all)."""
    def beat(pid: int, running: int) -> WorkerBeat:
        return WorkerBeat(f"h:{pid}:n", "h", pid, None, 2, running, None, started_at=100.0, beat_at=190.0)
    alive, lost = beat(11, 1), beat(12, 1)
    header, alive_line, lost_line = worker_lines([(alive, "alive"), (lost, "lost")], now=195.0, width=200)
    assert "RUNNING" in header
    assert " 1/2 " in alive_line and "alive" in alive_line, alive_line
    assert " -/2 " in lost_line and " 1/2 " not in lost_line and "lost 5.0s ago" in lost_line, lost_line


def test_a_batchs_jobs_are_listed_with_their_item_and_the_replaced_ones_said(tmp_path):
    """A new user's test: after `--retry-failed`, `pid list --batch DIR` showed 10 jobs for 6 items, with no item
    and the replaced jobs unmarked beside their retries under the same task."""
    from pid.cli.listing import batch_records
    from pid.jobs.batch import BatchDir
    store = JobStore(str(tmp_path / "jobs.db"))
    bdir = BatchDir.create(str(tmp_path / "out"), {})

    def job(n: int) -> str:
        return store.create(JobSpec(id=f"20261205-00000{n}-aaaa0{n}", task="same task", repo=str(tmp_path),
                                    model="m", out_dir=str(tmp_path), base_url="http://x", batch=bdir.batch_id)).id
    first, retry, other, stray = job(1), job(2), job(3), job(4)
    bdir.record_jobs([("fix-a", first), ("fix-b", other)])
    bdir.record_jobs([("fix-a", retry)])   # (stray: in the batch, in no ledger line)
    records, places = batch_records(store, str(tmp_path / "out"), 10, None)
    assert [r.id for r in records] == [stray, other, retry, first]   # newest first
    assert places == [(None, False), ("fix-b", True), ("fix-a", True), ("fix-a", False)]
    header, *lines = job_lines(records, 200, places)
    assert header.split()[:2] == ["ITEM", "ID"]
    assert [line.split()[0] for line in lines] == ["?", "fix-b", "fix-a", "fix-a"]
    assert "fix-a (earlier)" in lines[3] and "(earlier)" not in "".join(lines[:3]), lines
