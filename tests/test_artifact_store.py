"""Artifacts through the job store (jobs/artifact_store.py): what a worker uploads, under which limits, and how a
client writes them to its disk without ever leaving the directory it was given. Fast tier: a SQLite store in
tmp_path, plus a few real `pid result` subprocesses (no engine)."""
from __future__ import annotations

import dataclasses
import io
import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from pid.jobs.artifact_store import (MARKER, DownloadError, TranscriptSync, already_local, download, read_result,
                                   store_result, upload_artifacts, upload_transcript)
from pid.jobs.spec import JobSpec
from pid.jobs.sqlite_store import JobStore


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(str(tmp_path / "home" / "jobs.db"))


def make_job(store: JobStore, tmp_path: Path, **over) -> JobSpec:
    spec = JobSpec(task="t", repo=str(tmp_path), model="m", out_dir=str(tmp_path / "worker-out"), **over)
    store.create(spec)
    return spec


def job_dir_with_artifacts(spec: JobSpec, patch: bytes = b"+change\n") -> tuple[Path, dict]:
    """What the runner leaves: transcripts, a patch, collected files (one a symlink the container made)."""
    job_dir = Path(spec.job_dir)
    (job_dir / "files" / "workspace" / "sub").mkdir(parents=True)
    (job_dir / "session.jsonl").write_text('{"type": "session"}\n')
    (job_dir / "session.attempt-1.jsonl").write_text('{"type": "session", "attempt": 1}\n')
    (job_dir / "patch.diff").write_bytes(patch)
    (job_dir / "stray.txt").write_text("not an artifact")
    out = job_dir / "files" / "workspace" / "out.txt"
    out.write_text("made by the agent\n")
    deep = job_dir / "files" / "workspace" / "sub" / "deep.bin"
    deep.write_bytes(b"\0" * 100)
    link = job_dir / "files" / "workspace" / "link"
    link.symlink_to("/etc/passwd")
    result = {"id": spec.id, "status": "completed", "exit_reason": "stop", "artifacts": {
        "session": "session.jsonl", "patch": "patch.diff",
        "files": [str(job_dir / "files" / "workspace"), str(out), str(deep.parent), str(deep), str(link)]}}
    return job_dir, result


def stored(store: JobStore, job_id: str, name: str) -> bytes:
    return b"".join(store.open_artifact(job_id, name))


def test_a_job_s_artifacts_are_uploaded_by_their_relative_names_result_last(store, tmp_path):
    spec = make_job(store, tmp_path)
    job_dir, result = job_dir_with_artifacts(spec)
    order: list[str] = []
    put = store.put_artifact
    store.put_artifact = lambda job_id, name, stream, limit: (order.append(name), put(job_id, name, stream, limit))[1]
    upload_artifacts(store, spec, str(job_dir), result)
    assert order[-1] == "result.json" and sorted(order) == sorted(store.artifact_names(spec.id))
    assert store.artifact_names(spec.id) == ["files/workspace/out.txt", "files/workspace/sub/deep.bin",
                                             "patch.diff", "result.json", "session.attempt-1.jsonl",
                                             "session.jsonl"]   # no symlink, no stray file, no directory
    assert stored(store, spec.id, "files/workspace/out.txt") == b"made by the agent\n"
    assert json.loads(stored(store, spec.id, "result.json")) == result == read_result(store, spec.id)
    assert result["status"] == "completed" and "not_stored" not in result["artifacts"]
    # result.json names every other artifact's digest: a download can be checked against it
    assert sorted(result["artifacts"]["digests"]) == sorted(set(order) - {"result.json"})
    for name, digest in result["artifacts"]["digests"].items():
        assert digest == "sha256:" + hashlib.sha256(stored(store, spec.id, name)).hexdigest()


def test_an_artifact_over_its_limit_is_refused_and_the_job_fails_saying_so(store, tmp_path):
    spec = make_job(store, tmp_path, max_patch=10, max_files_bytes=50)
    job_dir, result = job_dir_with_artifacts(spec, patch=b"x" * 11)
    upload_artifacts(store, spec, str(job_dir), result)
    kept = read_result(store, spec.id)
    assert kept == result
    assert (kept["status"], kept["exit_reason"]) == ("failed", "artifact_error")
    refused = {r["name"]: r["reason"] for r in kept["artifacts"]["not_stored"]}
    assert refused == {"patch.diff": "larger than its limit of 10 bytes",
                       # the --file byte budget holds over all files: 18 bytes fit, the 100-byte one not
                       "files/workspace/sub/deep.bin": "larger than its limit of 32 bytes"}
    assert kept["error"].startswith("artifacts not stored in the job store: ")
    assert "patch.diff" in kept["error"]
    assert "patch.diff" not in store.artifact_names(spec.id)


def test_a_job_that_failed_keeps_its_reason_and_the_refusal_is_added_to_its_error(store, tmp_path):
    spec = make_job(store, tmp_path, max_patch=1)
    job_dir, result = job_dir_with_artifacts(spec)
    result.update(status="limit", exit_reason="max_turns", error="max turns reached")
    upload_artifacts(store, spec, str(job_dir), result)
    assert read_result(store, spec.id)["exit_reason"] == "max_turns"
    assert result["error"].startswith("max turns reached; artifacts not stored in the job store: patch.diff")


def test_a_store_that_fails_is_said_in_the_result_never_raised(store, tmp_path):
    spec = make_job(store, tmp_path)
    job_dir, result = job_dir_with_artifacts(spec)

    def broken(*_a, **_k):
        raise ConnectionError("the store is down")
    store.put_artifact = broken
    upload_artifacts(store, spec, str(job_dir), result)
    assert result["exit_reason"] == "artifact_error"
    assert "the store is down" in result["error"] and "result.json not stored" in result["error"]
    assert not store_result(store, spec.id, dict(result))


def test_a_handed_back_attempt_keeps_its_transcript_in_the_store(store, tmp_path):
    spec = make_job(store, tmp_path)
    job_dir, _ = job_dir_with_artifacts(spec)
    upload_transcript(store, spec.id, str(job_dir), attempt=2)
    assert store.artifact_names(spec.id) == ["session.attempt-2.jsonl"]
    assert stored(store, spec.id, "session.attempt-2.jsonl") == b'{"type": "session"}\n'


def test_a_running_attempts_transcript_copies_leave_one_blob_and_none_once_the_job_keeps_its_own(store, tmp_path):
    """Each copy of a running attempt's transcript was a blob of its own, kept for the whole retention after the
    next copy replaced it: a long job left five times its transcript in the store (1.5 GB for three jobs)."""
    spec = make_job(store, tmp_path)
    job_dir = Path(spec.job_dir)
    job_dir.mkdir(parents=True)
    session = job_dir / "session.jsonl"
    blobs = lambda: sorted(p.name for p in Path(store.blob_dir).iterdir() if not p.name.startswith("."))  # noqa: E731
    sync = TranscriptSync(store, spec.id, str(job_dir), attempt=1)
    sync.MIN_INTERVAL_S = 0.02
    sync.start()
    try:
        for n in range(1, 6):   # the transcript doubles: each time a new copy
            session.write_text('{"type": "message"}\n' * 2 ** n)
            deadline = time.monotonic() + 10
            while stored_or_none(store, spec.id, "session.attempt-1.jsonl") != session.read_bytes():
                assert time.monotonic() < deadline, f"copy {n} never stored"
                time.sleep(0.02)
            while len(blobs()) != 1:   # the copy before it goes (just after the new one is in: a loaded run saw it)
                assert time.monotonic() < deadline, (n, blobs())
                time.sleep(0.02)
    finally:
        sync.stop()
    result = {"id": spec.id, "status": "completed", "exit_reason": "stop", "artifacts": {"session": "session.jsonl"}}
    upload_artifacts(store, spec, str(job_dir), result)   # the job's own session.jsonl: the same bytes as the copy
    sync.discard()
    assert store.artifact_names(spec.id) == ["result.json", "session.jsonl"]
    assert stored(store, spec.id, "session.jsonl") == session.read_bytes()   # its blob was the copy's, and stays
    sync.stored(store.put_artifact(spec.id, "session.attempt-1.jsonl", io.BytesIO(b"an older copy\n")))
    sync.discard()   # a copy that differs from session.jsonl goes, blob and all
    assert store.artifact_names(spec.id) == ["result.json", "session.jsonl"] and len(blobs()) == 2


def stored_or_none(store: JobStore, job_id: str, name: str) -> bytes | None:
    try:
        return stored(store, job_id, name)
    except KeyError:
        return None


def uploaded_job(store: JobStore, tmp_path: Path) -> JobSpec:
    spec = make_job(store, tmp_path)
    job_dir, result = job_dir_with_artifacts(spec)
    upload_artifacts(store, spec, str(job_dir), result)
    return spec


def test_download_writes_every_artifact_private_and_again_into_its_own_download(store, tmp_path):
    spec = uploaded_job(store, tmp_path)
    dest = tmp_path / "client" / "dl"
    names = download(store, spec.id, str(dest))
    assert len(names) == 6
    assert (dest / "files" / "workspace" / "out.txt").read_text() == "made by the agent\n"
    assert (dest / "patch.diff").read_bytes() == b"+change\n"
    assert json.loads((dest / "result.json").read_text())["id"] == spec.id
    assert not (dest / MARKER).exists()
    assert stat.S_IMODE((dest / "files").stat().st_mode) == 0o700
    assert stat.S_IMODE((dest / "patch.diff").stat().st_mode) == 0o600
    assert sorted(p.name for p in dest.iterdir()) == [".pid-output", "files", "patch.diff", "result.json",
                                                      "session.attempt-1.jsonl", "session.jsonl"]   # (output_dirs)
    (dest / "patch.diff").write_text("edited by the user")
    download(store, spec.id, str(dest))          # its own earlier download: written again
    assert (dest / "patch.diff").read_bytes() == b"+change\n"
    assert already_local(store, spec.id, str(dest))


def test_download_refuses_a_directory_that_holds_something_else(store, tmp_path):
    spec = uploaded_job(store, tmp_path)
    other = uploaded_job(store, tmp_path / "other")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep me")
    with pytest.raises(DownloadError, match="is not empty and holds no earlier download of job"):
        download(store, spec.id, str(busy))
    assert os.listdir(busy) == ["mine.txt"]
    download(store, other.id, str(tmp_path / "dl"))
    with pytest.raises(DownloadError, match="no earlier download"):   # another job's download is not this one's
        download(store, spec.id, str(tmp_path / "dl"))
    interrupted = tmp_path / "interrupted"
    interrupted.mkdir()
    (interrupted / MARKER).write_text(spec.id + "\n")
    (interrupted / "session.jsonl").write_text("half")
    download(store, spec.id, str(interrupted))    # an interrupted download of this job goes on
    assert (interrupted / "result.json").exists() and not (interrupted / MARKER).exists()


def test_download_never_follows_a_symlink_inside_its_directory(store, tmp_path):
    spec = uploaded_job(store, tmp_path)
    dest, outside = tmp_path / "dl", tmp_path / "outside"
    outside.mkdir()
    (outside / "patch.diff").write_text("outside")
    download(store, spec.id, str(dest))
    (dest / "patch.diff").unlink()
    (dest / "patch.diff").symlink_to(outside / "patch.diff")   # a leaf symlink is replaced, not written through
    download(store, spec.id, str(dest))
    assert not (dest / "patch.diff").is_symlink() and (outside / "patch.diff").read_text() == "outside"
    import shutil
    shutil.rmtree(dest / "files")
    (dest / "files").symlink_to(outside)                        # a directory symlink is not entered
    with pytest.raises(DownloadError, match="files is a symlink or not a directory there; not followed"):
        download(store, spec.id, str(dest))
    assert os.listdir(outside) == ["patch.diff"]


@pytest.mark.parametrize("name", ["../escape.txt", "/tmp/abs.txt", "files/../../escape.txt", "a//b", "./x"])
def test_download_refuses_a_name_that_could_leave_its_directory(store, tmp_path, name):
    spec = uploaded_job(store, tmp_path)
    store.put_artifact(spec.id, name, io.BytesIO(b"evil"))
    dest = tmp_path / "deep" / "dl"
    with pytest.raises(DownloadError, match="not a safe relative path"):
        download(store, spec.id, str(dest))
    assert not (tmp_path / "deep" / "escape.txt").exists() and not (tmp_path / "escape.txt").exists()
    assert not dest.exists() or os.listdir(dest) == []


def test_download_of_a_job_without_artifacts_says_so(store, tmp_path):
    spec = make_job(store, tmp_path)
    with pytest.raises(DownloadError, match="has no artifacts in the job store .expired"):
        download(store, spec.id, str(tmp_path / "dl"))
    assert read_result(store, spec.id) is None


# -- through the real CLI (no engine: the worker's part is played by the store calls above) --------------------------

def pid(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pid.cli.main", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PID_", "OPENAI_", "ANTHROPIC_"))}
    env.update(PID_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))
    return env


@pytest.mark.cli
def test_pid_result_reads_the_store_and_downloads_without_the_worker_s_directory(store, tmp_path, cli_env):
    spec = uploaded_job(store, tmp_path)
    store.finish(spec.id, "stop")
    import shutil
    shutil.rmtree(spec.job_dir)                   # the worker's disk: not this machine's
    res = pid(cli_env, tmp_path, "result", spec.id, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["id"] == spec.id
    res = pid(cli_env, tmp_path, "result", spec.id)   # (never a path to a directory that is not there)
    assert res.returncode == 0, res.stderr
    assert f"artifacts: not here (pid result {spec.id} --download DIR fetches them)" in res.stderr, res.stderr
    res = pid(cli_env, tmp_path, "result", spec.id, "--download", "dl")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "dl" / "files" / "workspace" / "out.txt").read_text() == "made by the agent\n"
    assert "artifacts: dl" in res.stderr
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    res = pid(cli_env, tmp_path, "result", spec.id, "--download", "busy")
    assert res.returncode == 2 and res.stderr.startswith("pid: error: ") and len(res.stderr.splitlines()) == 1
    assert "is not empty" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.cli
def test_a_result_gone_from_the_store_is_one_line_and_exit_2(store, tmp_path, cli_env):
    spec = make_job(store, tmp_path)
    store.finish(spec.id, "stop")
    with store._db() as db:   # long ended: no grace period to wait for a late result.json
        db.execute("UPDATE jobs SET finished_at = finished_at - 3600 WHERE id = ?", (spec.id,))
    for args in (["result", spec.id], ["result", spec.id, "--download", "dl"]):
        res = pid(cli_env, tmp_path, *args)
        assert res.returncode == 2, res.stderr
        assert len(res.stderr.splitlines()) == 1 and res.stderr.startswith("pid: error: job "), res.stderr
        assert "not in the job store" in res.stderr or "neither in the job store" in res.stderr
    assert not (tmp_path / "dl").exists()


@pytest.mark.cli
def test_a_result_from_before_the_store_kept_them_is_read_from_the_job_dir(store, tmp_path, cli_env):
    spec = make_job(store, tmp_path)
    store.finish(spec.id, "stop")
    os.makedirs(spec.job_dir)
    Path(spec.job_dir, "result.json").write_text(json.dumps({"id": spec.id, "status": "completed",
                                                             "exit_reason": "stop", "final_message": "old"}))
    res = pid(cli_env, tmp_path, "result", spec.id)
    assert res.returncode == 0 and res.stdout.strip() == "old", res.stderr


# -- the runner: a worker's job stores its artifacts before it returns (on the in-memory sandbox) -------------------

def runner_spec(repo: Path, out: Path, llm, **extra) -> JobSpec:
    return JobSpec(task="greet", repo=str(repo), model="m", out_dir=str(out), base_url=llm.base_url, **extra)


def test_a_worker_job_whose_out_dir_cannot_be_made_here_spools_and_stores_everything(sample_repo, tmp_path,
                                                                                      monkeypatch):
    from tests.memory_sandbox import MemoryProvider
    from tests.scripted_llm import ScriptedLLM
    from pid.worker.runner import run_job
    monkeypatch.setenv("PID_HOME", str(tmp_path / "worker-home"))
    store = JobStore(str(tmp_path / "jobs.db"))
    blocker = tmp_path / "out"
    blocker.write_text("the client's --out does not exist on this machine")
    script = [{"tool_calls": [{"name": "write", "arguments": {"path": "hello.py", "content": "print(1)\n"}}]},
              {"text": "done"}]
    with ScriptedLLM(script) as llm:
        spec = runner_spec(sample_repo, blocker, llm, files=["hello.py"])
        store.create(spec)
        result = run_job(spec, sandboxes=MemoryProvider({}), artifact_store=store)
    assert (result["status"], result["final_message"]) == ("completed", "done"), result
    assert store.artifact_names(spec.id) == ["files/workspace/hello.py", "patch.diff", "result.json",
                                             "session.jsonl"]
    assert read_result(store, spec.id) == result
    assert "+print(1)" in stored(store, spec.id, "patch.diff").decode()
    assert os.listdir(tmp_path / "worker-home" / "spool") == []   # the spool goes once its files are stored


def test_a_stale_attempt_that_ends_leaves_the_next_attempt_s_spool_alone(sample_repo, tmp_path, monkeypatch):
    """A worker froze, another took its job over, and the first woke up: its attempt ended (not the owner's) and
    removed the spool, the next attempt's working directory with it; the job then failed, its patch gone (a CI
    tester's find, with workers sharing one PID_HOME). Each attempt has a spool of its own."""
    import threading
    from tests.memory_sandbox import MemoryProvider
    from tests.scripted_llm import ScriptedLLM
    from pid.worker.runner import run_job
    monkeypatch.setenv("PID_HOME", str(tmp_path / "worker-home"))
    store = JobStore(str(tmp_path / "jobs.db"))
    blocker = tmp_path / "out"
    blocker.write_text("the client's --out does not exist on this machine")
    write = {"tool_calls": [{"name": "write", "arguments": {"path": "hello.py", "content": "print(1)\n"}}]}
    later = threading.Event()
    with ScriptedLLM([write, {"text": "done", "hold": later}]) as new, ScriptedLLM([{"text": "stale"}]) as old:
        spec = runner_spec(sample_repo, blocker, new, files=["hello.py"])
        store.create(spec)
        results: list[dict] = []
        second = threading.Thread(target=lambda: results.append(run_job(
            spec, sandboxes=MemoryProvider({}), artifact_store=store, attempt=2)))
        second.start()
        deadline = time.monotonic() + 30
        while len(new.requests) < 2 and time.monotonic() < deadline:   # attempt 2 is at work: its file written
            time.sleep(0.01)
        stale = run_job(dataclasses.replace(spec, base_url=old.base_url), sandboxes=MemoryProvider({}),
                        artifact_store=store, attempt=1, still_owner=lambda: False)
        later.set()
        second.join(60)
    assert stale["final_message"] == "stale" and results, stale
    assert (results[0]["status"], results[0]["final_message"]) == ("completed", "done"), results[0]
    assert "+print(1)" in stored(store, spec.id, "patch.diff").decode()
    assert os.listdir(tmp_path / "worker-home" / "spool") == []


def test_a_pid_run_whose_out_dir_cannot_be_made_still_fails_saying_so(sample_repo, tmp_path):
    from tests.memory_sandbox import MemoryProvider
    from tests.scripted_llm import ScriptedLLM
    from pid.worker.runner import run_job
    blocker = tmp_path / "out"
    blocker.write_text("x")
    with ScriptedLLM([{"text": "never asked"}]) as llm:
        result = run_job(runner_spec(sample_repo, blocker, llm), sandboxes=MemoryProvider({}))
    assert result["exit_reason"] == "error" and "cannot create the job's directory" in result["error"]


def test_an_attempt_that_no_longer_owns_its_job_stores_only_its_transcript(sample_repo, tmp_path):
    from tests.memory_sandbox import MemoryProvider
    from tests.scripted_llm import ScriptedLLM
    from pid.worker.runner import run_job
    store = JobStore(str(tmp_path / "jobs.db"))
    with ScriptedLLM([{"text": "done"}]) as llm:
        spec = runner_spec(sample_repo, tmp_path / "out", llm)
        store.create(spec)
        run_job(spec, sandboxes=MemoryProvider({}), artifact_store=store, still_owner=lambda: False, attempt=3)
    assert store.artifact_names(spec.id) == ["session.attempt-3.jsonl"]


def test_a_job_that_stored_its_result_then_died_keeps_that_result_on_any_machine(store, tmp_path):
    """Its worker (elsewhere: no local result.json) stored result.json and died before recording the end: the
    sweep takes the stored ending of this attempt, never runs the job again; an earlier attempt's does not count."""
    import time as _time

    from pid.jobs.sweep import sweep
    spec = make_job(store, tmp_path)
    store.beat("live@elsewhere", "elsewhere", 2, None, 1, 0, True)   # the store is reachable: the holder is gone
    assert store.claim(spec.id, "elsewhere:1:x", lease_s=0.2)
    store_result(store, spec.id, {"id": spec.id, "status": "completed", "exit_reason": "stop", "turns": 4,
                                  "tool_calls": 3, "attempt": 2})   # not this attempt's: ignored
    _time.sleep(0.3)
    assert sweep(store) == [] and store.get(spec.id).status == "queued"
    assert store.claim(spec.id, "elsewhere:2:y", lease_s=0.2)   # attempt 2
    _time.sleep(0.3)
    assert sweep(store) == [spec.id]
    record = store.get(spec.id)
    assert (record.status, record.exit_reason, record.turns, record.tool_calls) == ("completed", "stop", 4, 3)
    assert not os.path.exists(spec.job_dir)


def test_an_attempt_that_lost_its_lease_after_collecting_stores_only_its_transcript(sample_repo, tmp_path):
    """Its lease held when its artifacts were made, then lapsed and went to another attempt (a long check): asked
    once more before they are stored, it stores only its transcript, not over the new owner's patch and result."""
    from tests.memory_sandbox import MemoryProvider
    from tests.scripted_llm import ScriptedLLM
    from pid.worker.runner import run_job
    store = JobStore(str(tmp_path / "jobs.db"))
    asked: list[str] = []
    with ScriptedLLM([{"text": "done"}]) as llm:
        spec = runner_spec(sample_repo, tmp_path / "out", llm)
        store.create(spec)
        result = run_job(spec, sandboxes=MemoryProvider({}), artifact_store=store, attempt=2,
                         still_owner=lambda: asked.append("collect") or True,
                         holds_lease=lambda: asked.append("store") or False)
    assert asked == ["collect", "store"] and result["exit_reason"] == "stop"
    assert store.artifact_names(spec.id) == ["session.attempt-2.jsonl"]
    assert not os.path.exists(os.path.join(spec.job_dir, "result.json"))


@pytest.mark.parametrize("session_fits", [True, False])
def test_a_job_whose_transcript_the_store_refused_keeps_its_last_copy(store, tmp_path, monkeypatch, session_fits):
    """A long job's session.jsonl over the store's limit was lost whole: the end of the attempt also discarded the
    last copy the running job had stored. That copy now stays; a job whose session.jsonl is stored discards it."""
    import threading
    import pid.jobs.artifact_store as artifact_store
    from pid.agent import Outcome
    from pid.worker.job_record import record
    from pid.worker.job_run import JobRun
    spec = make_job(store, tmp_path)
    job_dir = Path(spec.job_dir)
    job_dir.mkdir(parents=True)
    (job_dir / "session.jsonl").write_text('{"type": "message"}\n' * 100)
    sync = TranscriptSync(store, spec.id, str(job_dir), attempt=1)
    sync.MIN_INTERVAL_S = 3600   # (it runs, and makes no copy of its own: the one below stands for them)
    sync.start()
    sync.stored(upload_transcript(store, spec.id, str(job_dir), attempt=1))   # a copy made while it ran
    (job_dir / "session.jsonl").write_text('{"type": "message"}\n' * 200)     # it grew on
    if not session_fits:
        monkeypatch.setattr(artifact_store, "ARTIFACT_LIMIT", 3000)
    job = JobRun(spec, str(job_dir), time.time(), 1, threading.Event(), None, None, lambda _e: None,   # type: ignore
                 outcome=Outcome("stop", final_message="done"), artifacts={"session": "session.jsonl"}, syncing=sync)
    result = record(job, owner=True, spool=None, amend_result=None, artifact_store=store, keep=None)
    names = store.artifact_names(spec.id)
    if session_fits:
        assert result["status"] == "completed" and names == ["result.json", "session.jsonl"]
    else:
        assert result["exit_reason"] == "artifact_error" and names == ["result.json", "session.attempt-1.jsonl"]
        assert stored(store, spec.id, "session.attempt-1.jsonl") == b'{"type": "message"}\n' * 100
