"""Messages to a job (`pid steer`, `pid follow-up`, Job.steer): refused where nobody would read them."""
from __future__ import annotations

import pytest

from pid.jobs.spec import JobSpec
from pid.jobs.sqlite_store import JobStore


@pytest.fixture
def store(tmp_path):
    return JobStore(str(tmp_path / "jobs.db"))


def job(store: JobStore) -> JobSpec:
    spec = JobSpec(task="t", repo="/r", model="m", out_dir="/o")
    store.create(spec)
    return spec


def test_a_job_being_cancelled_takes_no_more_messages(store):
    """`pid follow-up` on a job whose cancel is on its way said "queued" for a message nobody would read."""
    from pid.errors import PidError
    from pid.jobs.submission import post
    spec = job(store)
    assert store.claim(spec.id, "w1", 60)
    post(store, spec.id, "steer", "first")
    assert store.request_cancel(spec.id) == "running"
    for kind in ("steer", "follow_up"):
        with pytest.raises(PidError, match="is being cancelled: it takes no more messages"):
            post(store, spec.id, kind, "too late")
