"""pid's Python API (pid/api.py): bad values refused with the CLI's own line, a submitted job followed to its end by
a real worker, cancel and steer on a running job, and pid.run in this process. A real worker, a real container, a
scripted model (tests/scripted_llm.py)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import pid
from tests.gate import gated, open_gate, reached
from tests.scripted_llm import ScriptedLLM

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def api_env(pid_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This process sees what the `pid` subprocesses of pid_env see: the same home, image, no stray PID_*."""
    for name in [n for n in os.environ if n.startswith(("PID_", "OPENAI_", "ANTHROPIC_"))]:
        monkeypatch.delenv(name)
    for name, value in pid_env.items():
        monkeypatch.setenv(name, value)
    return pid_env


def wait_until(predicate, timeout: float = 120, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# The same mistakes through the API and through `pid submit`: keyword -> command-line words.
MISTAKES = [
    ({"timeout_s": "soon"}, ["--timeout", "soon"]),
    ({"timeout_s": float("nan")}, ["--timeout", "nan"]),
    ({"max_turns": 0}, ["--max-turns", "0"]),
    ({"network": "host"}, ["--network", "host"]),
    ({"memory": "1k"}, ["--memory", "1k"]),
    ({"disk": "20t"}, ["--disk", "20t"]),   # (a new user's: accepted, then the job failed making the disk)
    ({"disk": "1m"}, ["--disk", "1m"]),     # (every command then said the disk was full)
    ({"tools": ["read", "nope"]}, ["--tools", "read,nope"]),
    ({"max_cost": 1.0}, ["--max-cost", "1.0"]),   # no prices for an unknown model
    ({"check": " "}, ["--check", " "]),
    ({"files": [""]}, ["--file", ""]),   # (it named the whole workdir)
    ({"check": "true", "check_original": ["tests/*.py"]}, ["--check", "true", "--check-original", "tests/*.py"]),
]


def test_bad_values_raise_pid_error_with_the_messages_of_the_shared_checks(api_env, sample_repo, tmp_path):
    assert issubclass(pid.PidError, ValueError)
    with pytest.raises(pid.PidError, match="^Invalid value for '--timeout': 'soon' is not a number$"):
        pid.submit("t", repo=sample_repo, model="m", timeout_s="soon")
    with pytest.raises(pid.PidError, match="^repo path does not exist: /nonexistent$"):
        pid.submit("t", repo="/nonexistent", model="m")
    # a name with a terminal's escapes in it is shown with them escaped: stripped, it named a path that exists
    with pytest.raises(pid.PidError, match=r"^repo path does not exist: .*repo\\x1b\]0;T\\x07$"):
        pid.submit("t", repo=f"{sample_repo}\x1b]0;T\x07", model="m")
    with pytest.raises(pid.PidError, match=r"^repo path does not exist: git@github.com:x/y.git \(pid takes a git URL "
                                           r"written in full, such as ssh://git@github.com/x/y.git\)$"):
        pid.submit("t", repo="git@github.com:x/y.git", model="m")
    with pytest.raises(pid.PidError, match="^no model configured: pass --model or set PID_MODEL$"):
        pid.run("t", repo=sample_repo)
    with pytest.raises(pid.PidError, match="^the task is empty$"):
        pid.submit("  ", repo=sample_repo, model="m")
    with pytest.raises(pid.PidError, match=r"^the task is larger than 1 MiB \(1,048,577 bytes\); it goes whole "):
        pid.submit("é" * (1 << 19) + "x", repo=sample_repo, model="m")   # (counted in UTF-8 bytes, as it is sent)
    with pytest.raises(pid.PidError, match="takes no option 'verbose'"):
        pid.run("t", repo=sample_repo, model="m", verbose=True)   # the terminal's options are not the API's
    with pytest.raises(pid.PidError, match="^--no-images: 'yes' is not True or False$"):
        pid.submit("t", repo=sample_repo, model="m", no_images="yes")
    with pytest.raises(pid.PidError, match=r"^no such job: nope \(pid.job\(\) takes a job's whole id"):
        pid.job("nope")
    # values of the wrong type are refused as bad values too, not as Python's own errors (a new-user test's)
    with pytest.raises(pid.PidError, match="^repo must be a path or a URL, not int$"):
        pid.submit("t", repo=5, model="m")   # type: ignore[arg-type]
    with pytest.raises(pid.PidError, match=r"^--file takes strings or paths \(or a list of them\), not dict$"):
        pid.submit("t", repo=sample_repo, model="m", files={"a": 1})   # (it became a path named "{'a': 1}")
    with pytest.raises(pid.PidError, match=r"^--file takes strings or paths \(or a list of them\), not int$"):
        pid.submit("t", repo=sample_repo, model="m", files=5)   # (it was queued as the file "5", as no tasks file does)
    with pytest.raises(pid.PidError, match=r"^--api-key takes a string, not int$"):
        pid.submit("t", repo=sample_repo, model="m", api_key=5)
    for whole in ("/", "..", "/tmp/../"):   # refused by the collection too, but only after the job had run (a tester's)
        with pytest.raises(pid.PidError, match=r"^--file .*: the whole filesystem: name the directories to collect$"):
            pid.submit("t", repo=sample_repo, model="m", files=["src", whole])
    with pytest.raises(pid.PidError, match=r"^--timeout takes a number \(int or float\) or a string, not dict$"):
        pid.submit("t", repo=sample_repo, model="m", timeout_s={"s": 1})
    with pytest.raises(pid.PidError, match="^Invalid value for '--base-url': 'http://\\[::1' is not an http"):
        pid.submit("t", repo=sample_repo, model="m", base_url="http://[::1")   # (it raised UnboundLocalError)


def test_the_environment_gives_the_same_defaults_as_on_the_command_line(api_env, sample_repo, monkeypatch):
    monkeypatch.setenv("PID_MODEL", "")
    with pytest.raises(pid.PidError, match="no model configured"):
        pid.submit("t", repo=sample_repo)
    monkeypatch.setenv("PID_THINKING", "extreme")
    with pytest.raises(pid.PidError, match=r"^Invalid value for '--thinking' \(env var: 'PID_THINKING'\)|"
                                           r"^Invalid value for '--thinking'"):
        pid.submit("t", repo=sample_repo, model="m")


def test_what_every_command_checks_first_is_checked_before_anything_is_queued(api_env, sample_repo, monkeypatch):
    """A new user's: PID_LEASE_S=abc made `pid submit` refuse, while pid.submit queued the job (and its wait raised).
    A store that cannot be reached raised redis' own exception, not the CLI's line."""
    from pid.jobs.sqlite_store import JobStore
    for name, value in (("PID_LEASE_S", "abc"), ("PID_MAX_ATTEMPTS", "0"), ("PID_SWEEP_S", "-1")):
        with monkeypatch.context() as env:
            env.setenv(name, value)
            with pytest.raises(pid.PidError, match=rf"^\${name}: '{value}' "):
                pid.submit("t", repo=sample_repo, model="m")
            with pytest.raises(pid.PidError, match=rf"^\${name}: "):
                pid.job("nope")
    assert JobStore(os.path.join(api_env["PID_HOME"], "jobs.db")).list() == []
    monkeypatch.setenv("PID_STORE_URL", "redis://127.0.0.1:1/0")
    for call in (lambda: pid.job("x"), lambda: pid.Job("x").status(), lambda: pid.Job("x").wait(1),
                 lambda: list(pid.Job("x").logs(follow=False))):
        with pytest.raises(pid.PidError, match=r"^cannot use the job store at redis://127.0.0.1:1/0 \(PID_STORE_URL\)"):
            call()


def test_values_of_the_wrong_type_are_refused_before_anything_starts(api_env, sample_repo, tmp_path):
    """A new user's: each was a TypeError after the work had begun, or read as something else."""
    from decimal import Decimal
    with pytest.raises(pid.PidError, match="^on_start must be a function \\(or None\\), not int$"):
        pid.run("t", repo=sample_repo, model="m", on_start=5)
    with pytest.raises(pid.PidError, match="^on_item must be a function \\(or None\\), not int$"):
        pid.batch(tmp_path / "tasks.jsonl", tmp_path / "b", on_item=5)
    for call in (lambda: pid.batch(tmp_path / "tasks.jsonl", 5), lambda: pid.submit_batch(tmp_path / "t.jsonl", 5),
                 lambda: pid.open_batch(5)):
        with pytest.raises(pid.PidError, match="^the batch's directory must be a path, not int$"):
            call()
    with pytest.raises(pid.PidError, match=r"^--timeout takes a number \(int or float\) or a string, not Decimal$"):
        pid.submit("t", repo=sample_repo, model="m", timeout_s=Decimal("60"))
    with pytest.raises(pid.PidError, match="^follow must be True or False, not 'no'$"):
        pid.Job("x").logs(follow="no")   # (at the call, not at the first item)
    for bad in (5, None):
        with pytest.raises(pid.PidError, match="^pid.job\\(\\) takes a job's id, a string, not "):
            pid.job(bad)
    assert not (tmp_path / "b").exists()


def test_list_jobs_gives_the_newest_as_pid_list_json_does_and_a_batchs_with_their_items(api_env, run_pid, tmp_path):
    """There was no pid.list(): an eval harness shelled out to `pid list --json`."""
    from pid.jobs.batch import BatchDir
    from pid.jobs.spec import JobSpec
    from pid.jobs.sqlite_store import JobStore
    store = JobStore(str(Path(api_env["PID_HOME"]) / "jobs.db"))
    bdir = BatchDir.create(str(tmp_path / "batch"), {})
    made = [store.create(JobSpec(id=f"20261205-00000{n}-bbbb0{n}", task=f"t{n}", repo=str(tmp_path), model="m",
                                 out_dir=str(tmp_path), base_url="http://127.0.0.1:9/v1",
                                 batch=bdir.batch_id if n < 2 else None)).id for n in range(3)]
    bdir.record_jobs([("item-a", made[0]), ("item-a", made[1])])   # (made[1]: item-a's retry)
    store.claim(made[2], "w", lease_s=60)
    listed, cli = pid.list_jobs(), json.loads(run_pid("list", "--json").stdout)
    assert [(j["id"], j["status"], sorted(j)) for j in listed] == [(j["id"], j["status"], sorted(j)) for j in cli]
    assert [j["id"] for j in pid.list_jobs()] == made[::-1] and [j["id"] for j in pid.list_jobs(limit=1)] == [made[2]]
    assert [j["id"] for j in pid.list_jobs(status="running")] == [made[2]] and pid.list_jobs(status="completed") == []
    in_batch = pid.list_jobs(batch=tmp_path / "batch")
    assert [(j["id"], j["item"], j["current"]) for j in in_batch] == [(made[1], "item-a", True),
                                                                    (made[0], "item-a", False)]
    cli = json.loads(run_pid("list", "--json", "--batch", str(tmp_path / "batch")).stdout)
    assert [(j["id"], j["item"], j["current"], sorted(j)) for j in in_batch] == \
        [(j["id"], j["item"], j["current"], sorted(j)) for j in cli]
    for bad, why in ((0, "limit is a whole number"), (True, "limit is a whole number"), ("5", "limit is a whole")):
        with pytest.raises(pid.PidError, match=why):
            pid.list_jobs(limit=bad)
    with pytest.raises(pid.PidError, match="no job status 'done'"):
        pid.list_jobs(status="done")
    with pytest.raises(pid.PidError, match="is not a batch"):
        pid.list_jobs(batch=tmp_path)


def test_a_batch_s_listing_shows_every_item_in_the_batch_s_order(api_env, run_pid, tmp_path):
    """`pid list --batch` stopped at 20 rows (a script counting them got 20 of 60), and its note called them the
    newest when they were the first: jobs submitted at once share their created_at."""
    from pid.jobs.batch import BatchDir
    from pid.jobs.spec import JobSpec
    from pid.jobs.sqlite_store import JobStore
    store = JobStore(str(Path(api_env["PID_HOME"]) / "jobs.db"))
    bdir = BatchDir.create(str(tmp_path / "batch"), {})
    items = [f"i{n:02d}" for n in range(25)]
    made = [store.create(JobSpec(id=f"20261205-000000-cccc{n:02d}", task=item, repo=str(tmp_path), model="m",
                                 out_dir=str(tmp_path), base_url="http://127.0.0.1:9/v1", batch=bdir.batch_id)).id
            for n, item in enumerate(items)]
    bdir.record_jobs(list(zip(items, made)))
    with store._db() as db:   # (as `pid batch` makes them: thousands a second, in one moment)
        db.execute("UPDATE jobs SET created_at = 1000")
    listed = run_pid("list", "--json", "--batch", str(tmp_path / "batch"))
    assert [j["item"] for j in listed.json()] == items and "shown" not in listed.stderr
    assert [j["item"] for j in pid.list_jobs(batch=tmp_path / "batch")] == items
    assert len(run_pid("list", "--json").json()) == 20 and len(pid.list_jobs()) == 20
    few = run_pid("list", "--json", "--batch", str(tmp_path / "batch"), "--limit", "3")
    assert [j["item"] for j in few.json()] == items[:3] and "the newest 3 shown" in few.stderr


@pytest.mark.cli
def test_a_wait_on_a_job_no_worker_takes_says_so_as_pid_result_wait_does(api_env, sample_repo, monkeypatch):
    """A new user's: Job.wait() waited in silence (forever with no timeout) where the CLI says no worker takes it."""
    monkeypatch.setenv("PID_NO_WORKER_NOTICE_S", "0.5")
    job = pid.submit("t", repo=sample_repo, model="m", base_url="http://127.0.0.1:9/v1", queue="nobody-listens")
    with pytest.warns(UserWarning, match=rf"^pid: job {job.id} is still queued after 0.5s: no worker is consuming "
                                         r"queue 'nobody-listens' \(start one with `pid worker --queue "):
        with pytest.raises(TimeoutError, match="still queued after 1.5s"):
            job.wait(1.5)
    job.cancel()


@pytest.mark.cli   # (submit asks the engine whether the image is there)
def test_jobs_held_by_an_eval_share_one_store_and_hold_no_descriptors_each(api_env, sample_repo):
    """An API tester's: each Job opened its own SQLite store, which kept a connection (two descriptors) per Job for
    its reads; an eval holding its Jobs ran out of descriptors at ~500 of them (a raw sqlite3 error)."""
    jobs = [pid.submit("t", repo=sample_repo, model="m", base_url="http://127.0.0.1:9/v1", queue="nobody-listens")
            for _ in range(3)]
    for job in jobs:
        job.cancel()
    before = len(os.listdir("/proc/self/fd"))
    held = [pid.job(job.id) for job in jobs for _ in range(20)]
    for job in held:
        assert [r["status"] for r in job.logs() if r.get("status")][-1:] == ["cancelled"]
        assert job.status() == "cancelled"
    assert len(os.listdir("/proc/self/fd")) - before < 6
    assert len({id(job._store()) for job in held}) == 1


@pytest.mark.cli
def test_a_mistake_is_the_cli_s_one_line(api_env, run_pid, sample_repo):
    """Each mistake: the API's message is exactly what `pid submit` prints after `pid: error: `."""
    for keywords, words in MISTAKES:
        with pytest.raises(pid.PidError) as raised:
            pid.submit("t", repo=sample_repo, model="m", **keywords)
        done = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", *words)
        assert done.code == 2, (words, done.stderr)
        assert done.stderr.strip() == f"pid: error: {raised.value}", (keywords, done.stderr)


CLIENT = """
import sys
import pid
job = pid.submit("a task", repo=sys.argv[1], model="m", base_url="http://127.0.0.1:9/v1")
print("status", job.status(), pid.job(job.id).id == job.id)
print("loaded:", sorted({m for m in sys.modules if m.split(".")[0] in ("celery", "docker") or
                         m.startswith("pid.worker")}))
"""


@pytest.mark.cli   # (as tests/test_publish.py's: an engine that answers says the image is there through its socket)
def test_import_pid_and_submit_load_neither_celery_nor_docker_nor_the_worker(tmp_path, sample_repo):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PID_")}
    env.update(PID_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT), PID_BROKER_URL="")
    done = subprocess.run([sys.executable, "-c", CLIENT, str(sample_repo)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "status queued True" in done.stdout, done.stdout
    assert "loaded: []" in done.stdout, done.stdout


@pytest.mark.docker
@pytest.mark.cli
def test_a_submitted_job_is_followed_to_its_end(api_env, worker, sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {
        "command": "echo api >> hello.py && printf 'caf\\351 = 1\\n' > latin.py"}}]},   # (a Latin-1 file)
              {"text": "done"}]
    with ScriptedLLM(script) as llm:
        job = pid.submit("append a line", repo=sample_repo, model="scripted", base_url=llm.base_url,
                         out_dir=str(tmp_path / "out"), files=["hello.py"])
        assert job.status() in ("queued", "running")
        records = list(job.logs(follow=True))   # until the job ends
        assert job.done()
        result = job.wait(timeout=120)
    assert result["id"] == job.id and result["status"] == "completed", result
    assert job.result() == result and job.status() == "completed"
    assert any("bash" in str(record) for record in records), records
    patch, raw = job.patch(), job.patch_bytes()
    assert patch is not None and "+api" in patch, patch
    assert raw is not None and b"+caf\xe9 = 1" in raw and patch == raw.decode("utf-8", "surrogateescape")
    applied = tmp_path / "applied"
    shutil.copytree(sample_repo, applied)
    subprocess.run(["git", "apply", "-"], input=raw, cwd=applied, check=True)   # byte for byte
    assert (applied / "latin.py").read_bytes() == b"caf\xe9 = 1\n"
    assert len(llm.requests) == 2
    # every artifact, from the store, as `pid result --download` writes them
    dest = job.download(tmp_path / "dl")
    assert dest == str(tmp_path / "dl") and (tmp_path / "dl" / "patch.diff").read_bytes() == raw
    assert json.loads((tmp_path / "dl" / "result.json").read_text())["id"] == job.id
    assert (tmp_path / "dl" / "files" / "workspace" / "hello.py").read_text().endswith("api\n")
    assert (tmp_path / "dl" / "session.jsonl").exists()
    assert job.download(tmp_path / "dl") == dest   # again: its own earlier download
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "mine.txt").write_text("keep")
    with pytest.raises(pid.PidError, match="other"):
        job.download(tmp_path / "other")
    with pytest.raises(pid.PidError, match="^dest must be a directory's path, not ''$"):
        job.download("")
    assert (tmp_path / "other" / "mine.txt").read_text() == "keep"


@pytest.mark.docker
@pytest.mark.cli
def test_an_ended_job_is_continued_and_retried_as_new_jobs(api_env, worker, sample_repo, tmp_path):
    """Job.continue_() and Job.retry(), as `pid continue` and `pid retry`: new jobs from the store, checked alike."""
    def append(line: str) -> list[dict]:
        return [{"tool_calls": [{"name": "bash", "arguments": {"command": f"echo {line} >> hello.py"}}]},
                {"text": "done"}]
    with ScriptedLLM(append("one")) as llm:
        job = pid.submit("append one", repo=sample_repo, model="scripted", base_url=llm.base_url,
                         out_dir=str(tmp_path / "out"))
        with pytest.raises(pid.PidError, match=f"^job {job.id} is (queued|running): only a job that has ended can "
                                               "be retried"):
            job.retry()
        assert job.wait(timeout=120)["status"] == "completed"
        with pytest.raises(pid.PidError, match="^the message is empty$"):
            job.continue_("  ")
        with pytest.raises(pid.PidError, match="^Invalid value for '--max-turns'"):
            job.continue_("more", max_turns=0)
        with pytest.raises(pid.PidError, match=r"^pid.Job.retry\(\) takes no option 'max_turns' \(it takes api, "
                                               r"api_key, base_url, model, out_dir, queue\)$"):
            job.retry(max_turns=3)   # (the same job again: its limits are its own; who answers may change)
        llm.add(*append("two"))
        then = job.continue_("now append two", max_turns=5)
        assert then != job and then.wait(timeout=120)["status"] == "completed"
        both = then.patch()
        assert both is not None and "+one" in both and "+two" in both, both   # the new patch holds both changes
        assert "now append two" in json.dumps(llm.requests[-2]) and "append one" in json.dumps(llm.requests[-2])
        llm.add(*append("three"))
        again = job.retry(out_dir=str(tmp_path / "again"))
        assert again.wait(timeout=120)["status"] == "completed"
        patch = again.patch()
        assert patch is not None and "+three" in patch and "+one" not in patch, patch   # the first job's snapshot
        assert (tmp_path / "again").is_dir()
    assert len(llm.requests) == 6


@pytest.mark.docker
@pytest.mark.cli
def test_steer_pause_resume_then_cancel_a_running_job(api_env, worker, sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": gated("true")}}]},
              {"tool_calls": [{"name": "bash", "arguments": {"command": "touch /tmp/.pid-test-reached; sleep 100"}}]},
              {"text": "never"}]
    with ScriptedLLM(script) as llm:
        job = pid.submit("t", repo=sample_repo, model="scripted", base_url=llm.base_url,
                         out_dir=str(tmp_path / "out"))
        with pytest.raises(pid.PidError, match="no result yet"):
            job.result()
        wait_until(lambda: len(llm.requests) >= 1, what="the first model call")
        job.steer("STEER-API-1")
        open_gate(job.id)   # the steer was sent while the first command ran
        wait_until(lambda: reached(job.id), what="the second command")
        assert "STEER-API-1" in str(llm.requests[1])   # delivered before the next model call
        job.pause()   # (held before its next model call: the command it runs goes on)
        assert job.paused() and job.status() == "running"
        with pytest.raises(TimeoutError, match=r"is still running \(paused: resume\(\) lets it go on\)"):
            job.wait(timeout=0.3)
        job.resume()
        assert not job.paused()
        with pytest.raises(pid.PidError, match="^job .* is running, not paused: nothing to resume$"):
            job.resume()
        with pytest.raises(TimeoutError):
            job.wait(timeout=0.5)   # it runs on
        assert job.cancel() == "running"
        result = job.wait(timeout=120)
    assert result["status"] == "cancelled", result
    assert job.status() == "cancelled"
    with pytest.raises(pid.PidError, match="nothing to cancel"):
        job.cancel()
    with pytest.raises(pid.PidError, match="^job .* is cancelled: it takes no more messages$"):
        job.steer("too late")   # (not "being cancelled": it has ended)
    with pytest.raises(pid.PidError, match="^job .* is cancelled: nothing to pause$"):
        job.pause()
    with pytest.raises(pid.PidError, match="must be text, not NoneType"):
        job.steer(None)   # type: ignore[arg-type]
    for bad in ("x", -1, float("nan")):
        with pytest.raises(pid.PidError, match="timeout must be a number of seconds"):
            job.wait(timeout=bad)   # type: ignore[arg-type]


@pytest.mark.docker
@pytest.mark.cli
def test_run_in_this_process_returns_the_result(api_env, sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo ran >> hello.py"}}]},
              {"text": "done"}]
    with ScriptedLLM(script) as llm, pytest.warns(UserWarning) as warned:
        result = pid.run("append a line", repo=sample_repo, model="scripted", base_url=llm.base_url,
                         out_dir=str(tmp_path / "out"))
    assert result["status"] == "completed", result
    # `pid run` warns of a model not in the model table (no prices, an assumed window): pid.run too, at this line
    unknown = [w for w in warned if "'scripted' is not in the model table" in str(w.message)]
    assert unknown and unknown[0].filename == __file__, [(str(w.message), w.filename) for w in warned]
    job = pid.job(result["id"])
    assert job.status() == "completed" and job.result()["id"] == result["id"] and not job.paused()
    patch = (tmp_path / "out" / result["id"] / "patch.diff").read_text()
    assert "+ran" in patch and job.patch() == patch
    assert {job: 1}[pid.job(result["id"])] == 1 and len({job, pid.job(result["id"])}) == 1   # a job is its id


@pytest.mark.docker
@pytest.mark.cli
def test_run_hands_its_job_over_as_it_starts_and_another_thread_cancels_it(api_env, sample_repo, tmp_path):
    """pid.run blocks; on_start gives the caller the Job while it runs (it had no id to steer or cancel by)."""
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60"}}]}, {"text": "never"}]
    started: list[pid.Job] = []
    with ScriptedLLM(script) as llm:
        def cancel_once_running() -> None:
            wait_until(lambda: started and len(llm.requests) >= 1, what="the job's first model call")
            assert started[0].status() == "running"
            started[0].cancel()
        canceller = threading.Thread(target=cancel_once_running)
        canceller.start()
        result = pid.run("wait", repo=sample_repo, model="scripted", base_url=llm.base_url,
                         out_dir=str(tmp_path / "out"), on_start=started.append)
        canceller.join(timeout=30)
    assert [job.id for job in started] == [result["id"]]
    assert (result["status"], result["exit_reason"]) == ("cancelled", "cancelled"), result


@pytest.mark.docker
@pytest.mark.cli
def test_run_warns_of_a_check_original_path_the_workspace_lacks(api_env, sample_repo, tmp_path):
    """Where the CLI prints a warning line, the API gives a Python warning: before the job, and with its result."""
    with ScriptedLLM([{"text": "done"}]) as llm:
        with pytest.warns(UserWarning) as said:
            result = pid.run("t", repo=sample_repo, model="scripted", base_url=llm.base_url,
                             out_dir=str(tmp_path / "out"), check="true", check_original=["tests/nope.py"])
    assert result["check"]["original_missing"] == ["tests/nope.py"]
    texts = [str(w.message) for w in said]
    assert any("has no such path" in t for t in texts) and any("not in the original workspace" in t for t in texts)


@pytest.mark.docker
@pytest.mark.cli
def test_run_s_on_start_that_raises_ends_the_job_and_leaves_no_sandbox(api_env, sample_repo, tmp_path):
    from pid.jobs.sqlite_store import JobStore
    from tests.conftest import pid_containers

    def refuse(job: pid.Job) -> None:
        raise RuntimeError("no room for it")
    with ScriptedLLM([{"text": "never"}]) as llm:
        with pytest.raises(RuntimeError, match="no room"):
            pid.run("t", repo=sample_repo, model="scripted", base_url=llm.base_url, out_dir=str(tmp_path / "out"),
                    on_start=refuse)
        assert llm.requests == []
    (record,) = JobStore(os.path.join(api_env["PID_HOME"], "jobs.db")).list()
    assert (record.status, record.error) == ("failed", "on_start raised RuntimeError: no room for it")
    result = pid.job(record.id).wait(5)   # (it had no result.json: wait, result and patch all failed)
    assert (result["status"], result["exit_reason"]) == ("failed", "error"), result
    assert result["error"] == "on_start raised RuntimeError: no room for it" and pid.job(record.id).patch() is None
    wait_until(lambda: not [c for c in pid_containers() if c.labels.get("pid.job") == record.id
                            and c.status != "removing"], timeout=15, what="the job's sandbox to go")


@pytest.mark.docker
@pytest.mark.cli
def test_a_keyboard_interrupt_in_pid_run_is_recorded_alike_in_result_json_and_the_store(api_env, sample_repo,
                                                                                        tmp_path):
    """pid.run installs no signal handler: a Ctrl-C in its process is a KeyboardInterrupt, which propagates. The job's
    ending is the one result.json has (`interrupted`): the store said failed, error "KeyboardInterrupt: " (a new-user
    test's)."""
    import _thread
    import signal
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60"}}]}, {"text": "never"}]
    # (Python's own Ctrl-C, as a program started from a terminal has it: a run started in the background by a
    # non-interactive shell ignores SIGINT, and interrupt_main then does nothing)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    with ScriptedLLM(script) as llm:
        timer = threading.Timer(4.0, _thread.interrupt_main)
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                pid.run("wait", repo=sample_repo, model="scripted", base_url=llm.base_url,
                        out_dir=str(tmp_path / "out"))
        finally:
            timer.cancel()
            signal.signal(signal.SIGINT, previous)
    result = json.loads(next((tmp_path / "out").glob("*/result.json")).read_text())
    assert (result["status"], result["exit_reason"]) == ("cancelled", "interrupted"), result
    assert pid.job(result["id"]).status() == "cancelled"
    stored = pid.job(result["id"]).result()
    assert stored["exit_reason"] == "interrupted"
    # the run's own result, with its patch, not a bare one written over it as the run ended
    assert "patch" in result["artifacts"] and "patch" in stored["artifacts"], (result, stored)


def test_dir_of_pid_names_the_api_though_it_loads_when_used():
    assert set(pid.__all__) <= set(dir(pid)) and not {"MYPY", "annotations"} & set(dir(pid))


def test_a_job_goes_to_another_process_by_its_id(api_env, tmp_path):
    """An eval harness hands jobs to worker processes (multiprocessing pickles them): its store stays behind."""
    import pickle
    job = pid.Job("some-job")
    job._cached_store = threading.local()   # (what a used Job holds: a store with its thread-local connections)
    again = pickle.loads(pickle.dumps(job))
    assert again.id == "some-job" and again._cached_store is None


def test_a_bad_batch_option_is_refused_before_anything_runs(api_env, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a", "task": "t", "workdir": "/testbed"}\n')
    with pytest.raises(pid.PidError, match=r"^Invalid value for '--max-running': 0 is out of range \(at least 1\)$"):
        pid.batch(tasks, tmp_path / "out", model="m", max_running=0)
    with pytest.raises(pid.PidError, match=r"^Invalid value for '--workers': -1 is out of range \(1 to 256\)$"):
        pid.batch(tasks, tmp_path / "out", model="m", workers=-1)   # (in the words every other option uses)
    with pytest.raises(pid.PidError, match="takes no option 'detach'") as refused:
        pid.batch(tasks, tmp_path / "out", model="m", detach=True)
    assert "out_dir" not in str(refused.value)   # (the options it lists are the ones it takes)
    with pytest.raises(pid.PidError, match=r"^pid\.submit_batch\(\) takes no option 'workers'"):
        pid.submit_batch(tasks, tmp_path / "out", model="m", workers=2)
    with pytest.raises(pid.PidError, match=r"^pid\.batch\(\) takes no option 'out_dir': the batch's directory is"):
        pid.batch(tasks, tmp_path / "out", model="m", out_dir=tmp_path / "elsewhere")
    with pytest.raises(pid.PidError, match="is not a batch's output directory"):
        pid.open_batch(tmp_path)
    assert not (tmp_path / "out").exists()


def test_a_batch_s_bad_lines_are_raised_with_their_numbers_and_nothing_is_printed(api_env, tmp_path, capfd):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a", "task": "t", "workdir": "/testbed"}\n{"id": "b", "workdir": "/testbed"}\n'
                     '{"id": "c", "task": "t", "workdir": "/testbed", "max_turns": "many"}\n')
    with pytest.raises(pid.PidError, match="^2 bad line\\(s\\) in .*nothing was submitted: line 2: ") as raised:
        pid.batch(tasks, tmp_path / "out", model="m", base_url="http://127.0.0.1:9/v1")
    assert [line.split(":")[0] for line in raised.value.lines] == ["line 2", "line 3"], raised.value.lines
    assert capfd.readouterr() == ("", "")   # (the API raises what the command prints)
    assert not (tmp_path / "out").exists()


@pytest.mark.docker
@pytest.mark.cli
def test_a_batch_runs_to_its_summary_in_any_thread_its_items_told_as_they_end(api_env, worker, sample_repo,
                                                                               tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(f'{{"id": "item{n}", "task": "t{n}", "repo": "{sample_repo}"}}\n' for n in range(2)))
    told: list[dict] = []
    ran: dict = {}
    with ScriptedLLM([{"text": "done"}] * 2) as llm:   # (signal handlers can be set in the main thread only)
        thread = threading.Thread(target=lambda: ran.update(pid.batch(
            tasks, tmp_path / "out", on_item=told.append, model="scripted", base_url=llm.base_url)))
        thread.start()
        thread.join(timeout=300)
    assert ran["summary"]["by_status"] == {"completed": 2} and ran["summary"]["exit_code"] == 0, ran
    assert sorted(item["id"] for item in ran["items"]) == ["item0", "item1"] and told == ran["items"], ran
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == ran["summary"]


@pytest.mark.docker
@pytest.mark.cli
def test_a_keyboard_interrupt_in_pid_batch_cancels_what_has_not_ended_records_what_has_and_propagates(
        api_env, worker, sample_repo, tmp_path):
    """pid.batch's documented contract: the interrupt (here on_item's, after the first item) cancels the jobs that
    have not ended, writes batch.jsonl and summary.json as far as they got, and propagates."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(f'{{"id": "item{n}", "task": "t{n}", "repo": "{sample_repo}"}}\n' for n in range(2)))
    script = [{"text": "done"},   # the first job to ask (one worker slot: the other waits, or runs next)...
              {"tool_calls": [{"name": "bash", "arguments": {"command": gated("true")}}]},   # ...never ends alone
              {"text": "never"}]
    told: list[dict] = []

    def interrupt(row: dict) -> None:
        told.append(row)
        raise KeyboardInterrupt

    with ScriptedLLM(script) as llm:
        with pytest.raises(KeyboardInterrupt):
            pid.batch(tasks, tmp_path / "out", on_item=interrupt, model="scripted", base_url=llm.base_url)
        ledger = [json.loads(line) for line in (tmp_path / "out" / "jobs.jsonl").read_text().splitlines()]
        other = next(entry["job_id"] for entry in ledger if entry["id"] != told[0]["id"])
        assert pid.job(other).wait(timeout=120)["status"] == "cancelled"
    rows = [json.loads(line) for line in (tmp_path / "out" / "batch.jsonl").read_text().splitlines()]
    assert [(row["id"], row["status"]) for row in rows] == [(told[0]["id"], "completed")], rows
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ended"] == 1 and summary["not_ended"] == 1, summary


@pytest.mark.docker
@pytest.mark.cli   # (the embedded queue checks the image at submit)
def test_a_submitted_batch_is_seen_cancelled_and_waited_for_from_its_directory(api_env, sample_repo, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(f'{{"id": "item{n}", "task": "t{n}", "repo": "{sample_repo}"}}\n' for n in range(2)))
    batch = pid.submit_batch(tasks, tmp_path / "out", model="m", base_url="http://127.0.0.1:9/v1")   # no worker
    assert batch.out == str(tmp_path / "out") and batch.id.startswith("b-")
    assert batch.status()["counts"] == {"queued": 2}, batch.status()
    with pytest.raises(pid.PidError, match="^timeout must be a number of seconds"):
        batch.wait(timeout=-1)
    with pytest.raises(TimeoutError, match=r"^batch b-\S+: 2 job\(s\) not ended after 0.5s \(they go on; wait"):
        batch.wait(timeout=0.5)
    assert batch.status()["counts"] == {"queued": 2}   # they go on, and the directory is free again:
    again = pid.open_batch(tmp_path / "out")
    assert sorted((c["item"], c["status"]) for c in again.cancel()) == [("item0", "cancelled"), ("item1", "cancelled")]
    told: list[dict] = []
    waited = again.wait(on_item=told.append, timeout=0)   # one look, enough for jobs that have ended
    assert waited["summary"]["by_status"] == {"cancelled": 2} and waited["summary"]["exit_code"] == 1, waited
    assert sorted(row["id"] for row in told) == ["item0", "item1"] and told == waited["items"]
    assert again.cancel() == [] and again.status()["counts"] == {"cancelled": 2}


def test_a_warning_says_pid_once():
    """The API's warnings start "pid: " once, whether the note it carries had that prefix (a batch's) or not."""
    import warnings

    from pid import api
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        api._warn("pid: the batch was cancelled")
        api._warn("the sandbox is on the network")
    assert [str(w.message) for w in caught] == ["pid: the batch was cancelled", "pid: the sandbox is on the network"]


def test_a_set_of_tools_is_taken_as_their_list():
    """tools={"read", "bash"} is a list of names in no order; it was refused as if --tools wanted a number."""
    from pid.api import _args, _command
    assert _args(_command("submit"), "submit", {"tools": {"read", "bash"}}) == ["--tools=bash,read"]
