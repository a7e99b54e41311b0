"""A batch's Run followed against a real job store (SQLite under a private PID_HOME), its downloads faked: what an
interrupt, a cancel from elsewhere and a second follower do. No broker, no engine: the jobs never run; the test
ends them in the store."""
from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from pid.jobs import batch_run
from pid.jobs.batch import BatchDir, row_for
from pid.jobs.batch_run import Run
from pid.jobs.spec import JobSpec
from pid.jobs.store import open_store

WAIT_S = 20.0   # what a fake download waits for the test at most (never reached when the code is right)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [n for n in os.environ if n.startswith("PID_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PID_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(batch_run, "POLL_S", 0.05)
    return tmp_path


def make_run(tmp_path: Path, items: list[str], bdir: BatchDir | None = None) -> Run:
    """A Run over a new batch directory whose items' jobs are created in the store but never published."""
    if bdir is None:
        bdir = BatchDir.create(str(tmp_path / "out"), {})
        bdir.set_order(items, {})
    specs = {i: JobSpec(task="t", model="m", out_dir=bdir.jobs_dir, workdir="/testbed") for i in items}
    run = Run(bdir, open_store(None), retry_failed=False, specs=specs)
    run._publish = lambda specs: None   # type: ignore[method-assign]
    return run


def end_all(run: Run) -> None:
    for job_id in run.tracked:
        assert run.store.request_cancel(job_id) == "cancelled"


class Quiet:
    """A Display that calls `on_update` at each poll."""

    def __init__(self, on_update: Any = None) -> None:
        self.on_update = on_update
        self.notes: list[str] = []

    def item_ended(self, row: dict[str, Any], progress: Any) -> None:
        pass

    def update(self, progress: Any) -> None:
        if self.on_update is not None:
            self.on_update()

    def note(self, text: str) -> None:
        self.notes.append(text)

    def stop(self) -> None:
        pass


def wait_for(predicate: Any) -> None:
    done = threading.Event()
    for _ in range(int(WAIT_S / 0.01)):
        if predicate():
            return
        done.wait(0.01)
    raise AssertionError("never happened")


def test_an_interrupted_follow_drops_the_downloads_not_begun(home, monkeypatch):
    """Ctrl-C: the downloads still queued are not made (each can wait out a result's grace, a store's outage)."""
    monkeypatch.setattr(batch_run, "DOWNLOADS", 1)
    run = make_run(home, ["a", "b", "c"])
    run.submit(["a", "b", "c"])
    end_all(run)
    made: list[str] = []

    def finish(job_id: str, item_id: str, record: Any) -> dict[str, Any]:
        made.append(item_id)
        wait_for(lambda: run.stopping)
        return row_for(item_id, job_id, {"status": "cancelled"}, False)

    monkeypatch.setattr(run, "_finish_item", finish)
    run.follow(Quiet(lambda: run.interrupt()))
    assert len(made) == 1, made


def test_a_further_ctrl_c_ends_the_wait_for_the_downloads(home, monkeypatch):
    """`pid batch`: Ctrl-C while the end-of-run downloads are waited for is a KeyboardInterrupt (as before the
    batch's library layer), not one more count."""
    from pid.cli.batch_run import follow
    monkeypatch.setattr(batch_run, "DOWNLOADS", 1)
    run = make_run(home, ["a", "b"])
    run.submit(["a", "b"])
    end_all(run)
    release = threading.Event()

    def finish(job_id: str, item_id: str, record: Any) -> dict[str, Any]:
        os.kill(os.getpid(), signal.SIGINT)          # the first Ctrl-C: cancel...
        wait_for(lambda: run.interrupted == 1)
        os.kill(os.getpid(), signal.SIGINT)          # ...the second: stop waiting for the jobs...
        wait_for(lambda: run.stopping)
        os.kill(os.getpid(), signal.SIGINT)          # ...a third, while the downloads are waited for
        release.wait(WAIT_S)
        return row_for(item_id, job_id, {"status": "cancelled"}, False)

    monkeypatch.setattr(run, "_finish_item", finish)
    try:
        with pytest.raises(KeyboardInterrupt):
            follow(run, as_json=True, tasks=None, existing=False)
    finally:
        release.set()
    assert (home / "out" / "batch.jsonl").exists()


def test_an_interrupt_cancels_the_jobs_before_the_downloads_are_waited_for(home, monkeypatch):
    """pid.batch: a KeyboardInterrupt cancels the jobs at once, not once every queued download has run."""
    run = make_run(home, ["a", "b"])
    run.submit(["a", "b"])
    ended, live = list(run.tracked)
    assert run.store.request_cancel(ended) == "cancelled"
    seen: list[str] = []

    def finish(job_id: str, item_id: str, record: Any) -> dict[str, Any]:
        wait_for(lambda: run.stopping)
        seen.append(run.store.get(live).status)
        return row_for(item_id, job_id, {"status": "cancelled"}, False)

    def interrupt() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "_finish_item", finish)
    with pytest.raises(KeyboardInterrupt):
        run.follow(Quiet(interrupt))
    assert seen == ["cancelled"]


def test_a_job_created_just_before_an_interrupt_is_cancelled_with_the_others(home, monkeypatch):
    """An interrupt between the store's creating a chunk (dispatched) and the run's next step: cancelled too."""
    run = make_run(home, ["a"])
    create = run.store.create_many

    def create_then_interrupt(specs: list[JobSpec], dispatched: bool = False) -> None:
        create(specs, dispatched=dispatched)
        if specs:
            raise KeyboardInterrupt

    monkeypatch.setattr(run.store, "create_many", create_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        run.submit(["a"])
    run.cancel_tracked()
    job_id = run.bdir.current_job("a")
    assert job_id is not None and run.store.get(job_id).status == "cancelled"


def test_a_second_follower_of_a_batch_directory_is_refused_in_the_same_process(home):
    """pid.batch in one thread, Batch.wait in another: both would download every item and rewrite batch.jsonl."""
    import pid
    from pid.jobs.batch_setup import open_held
    bdir = BatchDir.create(str(home / "out"), {})
    held = open_held(bdir.path)
    try:
        with pytest.raises(pid.PidError, match=f"^another run follows {home / 'out'} "):
            pid.open_batch(home / "out").wait()
    finally:
        make_run(home, [], held).close()
    assert pid.open_batch(home / "out").wait()["summary"]["items"] == 0   # let go: the next one follows


@pytest.mark.cli
def test_pid_batch_wait_beside_another_follower_exits_2_with_one_line(home, run_pid, pid_env):
    from pid.jobs.batch_setup import open_held
    env = {**pid_env, "PID_HOME": str(home / "home")}
    bdir = BatchDir.create(str(home / "out"), {})
    held = open_held(bdir.path)
    try:
        r = run_pid("batch", "--wait", bdir.path, env=env)
    finally:
        make_run(home, [], held).close()
    assert r.code == 2 and r.stderr.startswith("pid: error: another run follows ") and "Traceback" not in r.stderr, \
        r.stderr


def test_the_batch_directory_s_temporary_files_are_unique_per_write_not_per_process(home, monkeypatch):
    """Threads share a pid: two writers naming their temporary file by it would write into one file."""
    from pid.jobs import spec
    bdir = BatchDir.create(str(home / "out"), {})
    (home / "fresh1").mkdir()
    (home / "fresh2").mkdir()
    moved: list[tuple[str, str]] = []
    replace = os.replace

    def record(src: str, dst: str) -> None:
        moved.append((src, dst))
        replace(src, dst)

    monkeypatch.setattr(os, "replace", record)
    bdir.write_rows()
    bdir.write_rows()
    spec.write_json_atomic(str(home / "x.json"), {})
    spec.write_json_atomic(str(home / "x.json"), {})
    rows, meta = [m[0] for m in moved[0:2]], [m[0] for m in moved[2:4]]
    assert rows[0] != rows[1] and meta[0] != meta[1], moved


def test_a_rerun_items_folder_keeps_what_its_earlier_jobs_left(home):
    """A rerun's job may end without having run (the batch cancelled, its budget spent): its empty patch replaced
    the work of the job before it (a new-user test lost five turns' session and patch so). Each earlier job's
    folder is kept, by its id, under `earlier/`."""
    bdir = BatchDir.create(str(home / "out"), {})
    for n in (1, 2, 3):
        fresh = home / f"fresh{n}"
        fresh.mkdir()
        (fresh / "result.json").write_text(json.dumps({"id": f"job-{n}"}))
        (fresh / "patch.diff").write_text(f"patch {n}\n")
        bdir.replace_item_dir("a", str(fresh))
    item = Path(bdir.item_dir("a"))
    assert (item / "patch.diff").read_text() == "patch 3\n"
    assert sorted(p.name for p in (item / "earlier").iterdir()) == ["job-1", "job-2"]
    assert (item / "earlier" / "job-1" / "patch.diff").read_text() == "patch 1\n"
    assert not (item / "earlier" / "job-2" / "earlier").exists()   # (one level: each job's folder beside the others)
    again = home / "again"   # the same job downloaded twice (a run's rows are written every few seconds)
    again.mkdir()
    (again / "result.json").write_text(json.dumps({"id": "job-3"}))
    (again / "patch.diff").write_text("patch 3, again\n")
    bdir.replace_item_dir("a", str(again))
    assert (item / "patch.diff").read_text() == "patch 3, again\n"
    assert sorted(p.name for p in (item / "earlier").iterdir()) == ["job-1", "job-2"]


class Stops(Quiet):
    """A Display that stops the run (two interrupts) once `done()` or after many polls: a test that would wait for
    a job that never runs ends, and fails on its assertions instead."""

    def __init__(self, run: Run, done: Any = lambda: False) -> None:
        super().__init__()
        self.polls = 0

        def check() -> None:
            self.polls += 1
            if done() or self.polls > 100:
                run.interrupt()
                run.interrupt()
        self.on_update = check


def finished(job_id: str, item_id: str, record: Any) -> dict[str, Any]:
    return row_for(item_id, job_id, {"status": record.status, "exit_reason": record.exit_reason}, False)


def test_an_earlier_run_s_job_cancelled_while_this_run_follows_it_is_not_submitted_again(home, monkeypatch):
    from pid.jobs.sweep import cancel_job
    first = make_run(home, ["a"])
    first.submit(["a"])
    (job_id,) = first.tracked
    run = make_run(home, ["a"], BatchDir.open(first.bdir.path))
    run.start()
    assert run.tracked == {job_id: "a"}
    monkeypatch.setattr(run, "_finish_item", finished)
    cancelled: list[str] = []

    def cancel_once() -> bool:
        if not cancelled:
            cancelled.append(str(cancel_job(run.store, job_id)))   # `pid cancel JOB`, or Batch.cancel
        return run.submitted > 0
    run.follow(Stops(run, cancel_once))
    assert cancelled == ["cancelled"] and run.submitted == 0 and run.bdir.ledger["a"] == [job_id]
    assert run.bdir.rows["a"]["status"] == "cancelled"


def test_a_rerun_says_an_earlier_run_s_cancel_as_such_not_as_an_ending_of_its_own(home, monkeypatch):
    """Ctrl-C twice left a job cancelled and not yet recorded: the rerun records it, says it ended in the earlier
    run and submits its item again; it does not show it as one of this run's endings (a new-user test read the
    earlier run's endings printed first as the rerun's)."""
    first = make_run(home, ["a", "b"])
    first.submit(["a", "b"])
    end_all(first)   # (the first run's cancel, still ending when it stopped waiting)
    run = make_run(home, ["a", "b"], BatchDir.open(first.bdir.path))
    run.start()
    assert sorted(run.tracked.values()) == ["a", "b"] and run.submitted == 0
    monkeypatch.setattr(run, "_finish_item", finished)
    display = Stops(run, lambda: run.submitted == 2)
    ended: list[str] = []
    display.item_ended = lambda row, progress: ended.append(row["id"])   # type: ignore[method-assign]
    run.follow(display)
    assert ended == [] and run.submitted == 2, (ended, display.notes)
    assert sorted(n for n in display.notes if "its earlier job ended cancelled: submitted again" in n) == \
        ["pid: a: its earlier job ended cancelled: submitted again",
         "pid: b: its earlier job ended cancelled: submitted again"]


def test_a_batch_cancelled_while_it_is_submitted_submits_no_more_and_cancels_what_it_just_did(home, monkeypatch):
    """Batch.cancel in another thread while pid.batch submits its chunks: the store has no job of it yet when the
    cancel looks (the worst case); none of its jobs goes on, and no later chunk is submitted."""
    from pid.jobs.batch_control import cancel
    monkeypatch.setattr(batch_run, "CHUNK", 1)
    run = make_run(home, ["a", "b", "c"])
    create = run.store.create_many
    said: list[list[dict[str, str]]] = []

    def cancel_then_create(specs: list[JobSpec], dispatched: bool = False) -> None:
        if specs and not said:
            said.append(cancel(BatchDir.open(run.bdir.path), run.store))
        create(specs, dispatched=dispatched)

    monkeypatch.setattr(run.store, "create_many", cancel_then_create)
    monkeypatch.setattr(run, "_finish_item", finished)
    run.start()
    summary = run.follow(Stops(run))
    assert said == [[]] and run.submitted == 1 and list(run.bdir.ledger) == ["a"], run.bdir.ledger
    assert [r.status for r in run.store.batch_jobs(run.bdir.batch_id)] == ["cancelled"]
    assert summary["by_status"] == {"cancelled": 1} and summary["not_ended"] == 2


def test_the_local_worker_s_child_only_calls_prctl_found_before_the_fork(home, monkeypatch):
    """pid.batch(workers=N) in a thread of a threaded process: the forked child imports and loads nothing."""
    import ctypes
    import subprocess
    from pid.jobs import batch_setup
    calls: list[tuple[Any, ...]] = []

    class Libc:
        def prctl(self, *args: Any) -> None:
            calls.append(("prctl", *args))

    def cdll(*args: Any, **kwargs: Any) -> Libc:
        calls.append(("CDLL",))
        return Libc()

    started: dict[str, Any] = {}

    class Popen:
        def __init__(self, args: list[str], **kwargs: Any) -> None:
            started.update(kwargs)

    monkeypatch.setattr(ctypes, "CDLL", cdll)
    monkeypatch.setattr(subprocess, "Popen", Popen)
    batch_setup.LocalWorkers.start(1, ["default"], str(home / "out"))
    before_fork = list(calls)
    started["preexec_fn"]()   # what the child runs
    assert before_fork == [("CDLL",)] and calls[1:] == [("prctl", 1, int(signal.SIGTERM))], calls


def test_a_store_outage_while_the_batch_is_followed_is_waited_through(home, monkeypatch):
    """A Redis that restarts: the run says so (its display's notes) and goes on when the store is back."""
    run = make_run(home, ["a"])
    run.submit(["a"])
    (job_id,) = run.tracked
    monkeypatch.setattr(run, "_finish_item", finished)
    batch_jobs = run.store.batch_jobs
    polls = {"n": 0}

    def flaky(batch_id: str) -> list[Any]:
        polls["n"] += 1
        if polls["n"] in (2, 3):
            raise ConnectionError("Connection refused")
        if polls["n"] == 4:
            run.store.request_cancel(job_id)   # it ends during the outage
        return batch_jobs(batch_id)

    monkeypatch.setattr(run.store, "batch_jobs", flaky)
    display = Stops(run)
    summary = run.follow(display)
    assert summary["by_status"] == {"cancelled": 1} and display.polls < 100, summary
    said = [n.split(" (")[0] for n in display.notes]
    assert said == ["pid: the job store is unreachable", "pid: the job store is back"], display.notes


def test_a_rerun_of_a_batch_whose_budget_is_spent_submits_nothing(tmp_path):
    """Each job would have ended batch_budget without a model call, its item's folder holding nothing of the work
    before it: the run says so instead."""
    run = make_run(tmp_path, ["a", "b"])
    said: list[str] = []
    run.warn = said.append
    run.store.set_batch(run.bdir.batch_id, 1.0, None)
    run.store.add_batch_spend(run.bdir.batch_id, 1.25)
    run.start()
    assert run.tracked == {} and run.submitted == 0
    assert said == ["pid: the batch's --max-total-cost ($1) is spent ($1.2500): 2 items not submitted (a higher "
                    "--max-total-cost runs them)"], said


def test_the_status_line_and_the_live_table_say_the_spend_the_budget_is_held_against(home, capsys):
    """A budget of $5 spent, then raised to $7: `--status` said "cost $2.03 of $7.00" (the latest jobs' cost) while
    every job had spent $7.36, over the $7 (a new user's test): both now say what the budget counts."""
    from pid.cli.batch import _status
    from pid.cli.batch_progress import render, spend_words
    assert spend_words(2.03, 7.36, 7.0) == "$2.03 ($7.36 with earlier jobs) of $7.00"
    assert spend_words(2.03, 2.03, 7.0) == "$2.03 of $7.00" and spend_words(2.03, 9.0, None) == "$2.03"
    run = make_run(home, ["a"])
    run.store.set_batch(run.bdir.batch_id, 7.0, None)
    run.store.add_batch_spend(run.bdir.batch_id, 7.36)
    run.bdir.rows["a"] = {"id": "a", "job_id": "j2", "status": "completed", "exit_code": 0, "cost": 2.03, "turns": 2}
    _status(run.bdir, as_json=False)
    assert "; cost $2.03 ($7.36 with earlier jobs) of $7.00" in capsys.readouterr().out
    following = batch_run._Following(batch_run.Progress(total=1, cost=2.03), display=None,  # type: ignore[arg-type]
                                      downloads=None, outage=None)  # type: ignore[arg-type]
    run._check_budget(following)   # (what each pass of the live table reads from the store)
    assert (following.progress.budget, following.progress.spent) == (7.0, pytest.approx(7.36))
    assert "$2.03 ($7.36 with earlier jobs) of $7.00" in str(render(following.progress, 200).renderables[0])


def test_cancel_says_which_jobs_ended_and_which_their_workers_stop(home, capsys):
    """It said "3 job(s) cancelled" with one of them still running, being stopped (a new user's test)."""
    from pid.cli.batch import _cancel
    from pid.worker.control import new_owner
    run = make_run(home, ["s1", "s2", "s3"])
    run.submit(["s1", "s2", "s3"])
    running = next(job_id for job_id, item in run.tracked.items() if item == "s1")
    assert run.store.claim(running, new_owner(), 60)   # (this process holds it: alive, its worker stops it)
    _cancel(run.bdir)
    lines = capsys.readouterr().out.splitlines()
    assert f"s1  {running}: cancelling (its worker stops it)" in lines
    assert lines[-1] == f"batch {run.bdir.batch_id}: 2 job(s) cancelled, 1 being stopped by their workers"


def test_the_summary_counts_what_earlier_jobs_spent_too(home):
    """cost.total counts each item's latest job; a rerun's earlier jobs were paid for too (a new-user test read a
    smaller total than the batch had spent): `all_jobs` is the store's count, which --max-total-cost holds against,
    and the summary's text says it when it is more."""
    from pid.cli.batch_progress import summary_text
    run = make_run(home, ["a"])
    run.store.set_batch(run.bdir.batch_id, None, None)
    run.store.add_batch_spend(run.bdir.batch_id, 0.25)   # an earlier job of item a
    run.bdir.rows["a"] = {"id": "a", "job_id": "j2", "status": "completed", "exit_code": 0, "cost": 0.1, "turns": 2}
    summary = run.summary()
    assert summary["cost"]["total"] == pytest.approx(0.1)
    assert summary["cost"]["all_jobs"] == pytest.approx(0.25)
    assert json.loads((home / "out" / "summary.json").read_text())["cost"]["all_jobs"] == pytest.approx(0.25)
    assert "$0.25 with earlier jobs" in summary_text(summary, "out")
    run.bdir.rows["a"]["cost"] = 0.25   # nothing paid beyond the latest jobs: nothing more said
    assert "earlier" not in summary_text(run.summary(), "out")
