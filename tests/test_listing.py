"""`pid list`'s lines (cli/listing.py), from a real store's records."""
from __future__ import annotations

from pid.cli.listing import job_lines
from pid.jobs.spec import JobSpec
from pid.jobs.sqlite_store import JobStore


def test_a_paused_job_is_listed_as_paused(tmp_path):
    """As `pid status` says it: a user steering from the list sees which jobs are held (a new-user test)."""
    store = JobStore(str(tmp_path / "jobs.db"))
    held, free = (store.create(JobSpec(task=f"task {n}", repo=str(tmp_path), model="m", out_dir=str(tmp_path),
                                       base_url="http://x")) for n in range(2))
    assert store.claim(held.id, "w", lease_s=60) and store.set_paused(held.id, True)
    lines = job_lines([store.get(held.id), store.get(free.id)], 200)
    assert "running (paused)" in lines[1] and "task 0" in lines[1], lines
    assert "paused" not in lines[2] and "queued" in lines[2], lines
