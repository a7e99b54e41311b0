"""`pid view` as a command (no engine, no browser): a job by id from the job store, a job's directory, a batch
directory; where pages go; one-line errors; --open."""
from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, ctrl_c_default
from tests.view_fixtures import HOSTILE_CALL_IDS, hostile_result, hostile_session, simple_session, write_batch, \
    write_job
from pid.jobs.spec import JobSpec
from pid.jobs.sqlite_store import JobStore

pytestmark = pytest.mark.cli


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """No browser and no display: --open has nothing to open unless a test says so."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PID_", "OPENAI_", "ANTHROPIC_"))
           and k not in ("BROWSER", "DISPLAY", "WAYLAND_DISPLAY")}
    env.update(PID_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))
    return env


def pid(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pid.cli.main", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


def one_line_error(res: subprocess.CompletedProcess, *fragments: str) -> None:
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("pid: error: ") and len(res.stderr.splitlines()) == 1, res.stderr
    for fragment in fragments:
        assert fragment in res.stderr


def calls(page: Path) -> list[str]:
    import html
    return [html.unescape(v) for v in re.findall(r'data-tool-call="([^"]*)"', page.read_text())]


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    (tmp_path / "home").mkdir()
    return JobStore(str(tmp_path / "home" / "jobs.db"))


def stored_job(store: JobStore, tmp_path: Path, artifacts: dict[str, str] | None = None) -> JobSpec:
    """A job whose worker was elsewhere: its artifacts are in the store only."""
    spec = JobSpec(task="t", repo=str(tmp_path), model="m-from-spec", out_dir=str(tmp_path / "worker-disk"))
    store.create(spec)
    for name, text in (artifacts or {}).items():
        store.put_artifact(spec.id, name, io.BytesIO(text.encode()))
    return spec


def test_a_job_by_id_comes_from_the_job_store(store, tmp_path, env):
    spec = stored_job(store, tmp_path)
    stored_job_artifacts = {"result.json": json.dumps(hostile_result(spec.id)), "session.jsonl": hostile_session(),
                            "patch.diff": "+x\n", "files/workspace/big.bin": "x" * 100_000}
    for name, text in stored_job_artifacts.items():
        store.put_artifact(spec.id, name, io.BytesIO(text.encode()))
    store.finish(spec.id, "stop")
    assert not Path(spec.job_dir).exists()
    res = pid(env, tmp_path, "view", spec.id)
    assert res.returncode == 0, res.stderr
    page = Path(res.stdout.strip())
    assert page == tmp_path / f"pid-view-{spec.id}.html"
    assert calls(page) == HOSTILE_CALL_IDS
    assert "CHECK-TAIL-MARK" in page.read_text() and spec.id in page.read_text()


def test_a_running_job_shows_its_transcript_so_far(store, tmp_path, env):
    spec = stored_job(store, tmp_path, {"session.attempt-1.jsonl": simple_session(["c1", "c2"])})
    res = pid(env, tmp_path, "view", spec.id, "-o", "live.html")
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "live.html").read_text()
    assert calls(tmp_path / "live.html") == ["c1", "c2"]
    assert ">queued<" in text and "m-from-spec" in text


def test_a_job_without_artifacts_or_id_is_one_line(store, tmp_path, env):
    spec = stored_job(store, tmp_path)
    one_line_error(pid(env, tmp_path, "view", spec.id), f"job {spec.id} (queued) has no result or transcript yet")
    one_line_error(pid(env, tmp_path, "view", "no-such-job"), "no such job or directory: no-such-job")
    one_line_error(pid(env, tmp_path, "view", str(tmp_path)), "neither a batch directory")
    job = write_job(tmp_path / "job", hostile_result(), hostile_session())
    one_line_error(pid(env, tmp_path, "view", str(job), "-o", str(tmp_path / "missing" / "x.html")),
                   "does not exist")


def test_a_job_directory_and_its_default_page_name(tmp_path, env):
    job = write_job(tmp_path / "job", hostile_result("job/with odd:id"), hostile_session())
    res = pid(env, tmp_path, "view", str(job))
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.strip()) == tmp_path / "pid-view-job_with_odd_id.html"
    bare = write_job(tmp_path / "bare-job", None, simple_session(["c1"]), patch=None)
    res = pid(env, tmp_path, "view", str(bare))
    assert res.returncode == 0 and Path(res.stdout.strip()) == tmp_path / "pid-view-bare-job.html"


def test_a_batch_directory_writes_an_index_and_item_pages(tmp_path, env):
    batch = write_batch(tmp_path / "batch")
    res = pid(env, tmp_path, "view", str(batch))
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.strip()) == batch / "view" / "index.html"
    assert len(list((batch / "view").glob("*.html"))) == 5
    res = pid(env, tmp_path, "view", str(batch), "-o", str(tmp_path / "elsewhere" / "b.html"))
    one_line_error(res, "does not exist")
    (tmp_path / "elsewhere").mkdir()
    res = pid(env, tmp_path, "view", str(batch), "-o", str(tmp_path / "elsewhere" / "b.html"))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == ["b-items", "b.html"]
    assert sorted(p.name for p in (tmp_path / "elsewhere" / "b-items").iterdir()) == \
        sorted(["proj-a-1.html", "proj-b-2.html", "proj-c-3.html", [p.name for p in
                (batch / "view").glob("item-*.html")][0]])
    assert 'href="../b.html"' in (tmp_path / "elsewhere" / "b-items" / "proj-a-1.html").read_text()
    write_job(batch / "view", {"id": "j"}, simple_session(["c"]))   # an item whose id is "view"
    one_line_error(pid(env, tmp_path, "view", str(batch)), "is an item's folder", "pass -o FILE")


def test_open_uses_the_browser_there_is_and_says_when_there_is_none(tmp_path, env):
    job = write_job(tmp_path / "job", hostile_result(), hostile_session())
    res = pid(env, tmp_path, "view", str(job), "--open")   # no BROWSER, no display: the path, and why not opened
    assert res.returncode == 0 and res.stdout.strip().endswith(".html")
    assert res.stderr.strip() == "pid: no browser here (no $BROWSER, no display): open the file above yourself"
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "fake-browser"
    browser.write_text(f'#!/bin/sh\necho "$@" > {opened}\n')
    browser.chmod(0o755)
    res = pid({**env, "BROWSER": str(browser)}, tmp_path, "view", str(job), "--open", "-o", "p age.html")
    assert res.returncode == 0, res.stderr
    assert opened.read_text().strip() == (tmp_path / "p age.html").as_uri()


def test_an_unusable_pid_home_matters_only_for_a_job_id(tmp_path, env):
    (tmp_path / "a-file").write_text("x")
    home = tmp_path / "a-file" / "home"
    broken = {**env, "PID_HOME": str(home)}
    one_line_error(pid(broken, tmp_path, "view", "some-job"), f"PID_HOME {home} is not a writable directory")
    job = write_job(tmp_path / "job", hostile_result(), hostile_session())
    res = pid(broken, tmp_path, "view", str(job))   # a directory needs no state
    assert res.returncode == 0, res.stderr


def test_a_continued_job_links_its_parent_and_the_parent_its_children(store, tmp_path, env):
    parent = stored_job(store, tmp_path, {"result.json": json.dumps({"id": "x", "status": "completed"}),
                                          "session.jsonl": simple_session(["p1"])})
    store.finish(parent.id, "stop")
    kids = []
    for n in range(2):
        kid = JobSpec(task=f"more {n}", repo=str(tmp_path), model="m", out_dir=str(tmp_path / "worker-disk"),
                      parent=parent.id)
        store.create(kid)
        store.put_artifact(kid.id, "session.jsonl", io.BytesIO(simple_session([f"k{n}"]).encode()))
        kids.append(kid)
    other = stored_job(store, tmp_path, {"session.jsonl": simple_session(["o1"])})   # no relation: not linked
    res = pid(env, tmp_path, "view", kids[0].id, "-o", "child.html")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(tmp_path / "child.html")
    child_page = (tmp_path / "child.html").read_text()
    assert f'<a href="pid-view-{parent.id}.html" data-relation="continues"><code>{parent.id}</code></a>' \
        in child_page
    assert calls(tmp_path / "child.html") == ["k0"]
    # The parent's page, written beside: it links this page, and its other child's (which has none here).
    parent_page = (tmp_path / f"pid-view-{parent.id}.html").read_text()
    assert calls(tmp_path / f"pid-view-{parent.id}.html") == ["p1"]
    assert (f'<dt>continued by</dt><dd><a href="child.html" data-relation="continued by"><code>{kids[0].id}</code>'
            f'</a>, <code data-relation="continued by">{kids[1].id}</code>') in parent_page
    assert other.id not in parent_page and other.id not in child_page
    # By the parent's id: both children get pages and links.
    res = pid(env, tmp_path, "view", parent.id)
    assert res.returncode == 0, res.stderr
    parent_page = (tmp_path / f"pid-view-{parent.id}.html").read_text()
    for kid in kids:
        assert f'<a href="pid-view-{kid.id}.html" data-relation="continued by">' in parent_page
        assert f'href="pid-view-{parent.id}.html" data-relation="continues"' in \
            (tmp_path / f"pid-view-{kid.id}.html").read_text()


def watch(job_id: str, page: Path, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """`pid view JOB --watch -o PAGE`, running, its output piped."""
    return subprocess.Popen([sys.executable, "-m", "pid.cli.main", "view", job_id, "--watch", "-o", str(page)],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, preexec_fn=ctrl_c_default)


def test_watch_rewrites_a_running_jobs_page_until_it_ends(store, tmp_path, env):
    spec = stored_job(store, tmp_path, {"session.attempt-1.jsonl": simple_session(["c1"])})
    assert store.claim(spec.id, "w1", 600)
    page = tmp_path / "live.html"
    proc = watch(spec.id, page, tmp_path, env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == str(page)   # printed as soon as the first page is there
        text = page.read_text()
        assert '<meta http-equiv="refresh" content="2">' in text and ">running<" in text
        assert calls(page) == ["c1"]
        # The job goes on: the next rewrite shows its new transcript.
        store.put_artifact(spec.id, "session.attempt-1.jsonl", io.BytesIO(simple_session(["c1", "c2"]).encode()))
        store.append_event(spec.id, {"type": "tool_end"})
        deadline = time.monotonic() + 60
        while calls(page) != ["c1", "c2"]:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.1)
        store.put_artifact(spec.id, "result.json", io.BytesIO(json.dumps({"id": spec.id, "status": "completed"})
                                                              .encode()))
        store.put_artifact(spec.id, "session.jsonl", io.BytesIO(simple_session(["c1", "c2"]).encode()))
        assert store.finish(spec.id, "stop", owner="w1")
        store.append_event(spec.id, {"type": "end"})
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out == ""   # the path was printed once, at the start
    assert f"watching job {spec.id}" in err and "Ctrl-C stops" in err   # it says what it does, on stderr
    text = page.read_text()
    assert 'http-equiv="refresh"' not in text and "live:" not in text and ">completed<" in text


def test_watch_takes_a_job_id(tmp_path, env):
    job = write_job(tmp_path / "job", hostile_result(), hostile_session())
    one_line_error(pid(env, tmp_path, "view", str(job), "--watch"), "--watch takes a job id")


def test_ctrl_c_leaves_a_watched_page_that_no_longer_reloads(store, tmp_path, env):
    spec = stored_job(store, tmp_path, {"session.attempt-1.jsonl": simple_session(["c1"])})
    assert store.claim(spec.id, "w1", 600)
    page = tmp_path / "live.html"
    first = watched_then_ctrl_c(spec.id, page, tmp_path, env)
    assert 'http-equiv="refresh"' in first
    text = page.read_text()
    assert 'http-equiv="refresh"' not in text and calls(page) == ["c1"] and ">running<" in text


def watched_then_ctrl_c(job_id: str, page: Path, cwd: Path, env: dict[str, str]) -> str:
    """`pid view JOB --watch` until its page is written, then Ctrl-C (exit 130, no traceback): the page as it was
    first written."""
    proc = watch(job_id, page, cwd, env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == str(page)
        first = page.read_text()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "Traceback" not in err, err
    return first


def test_ctrl_c_on_a_queued_jobs_watch_leaves_a_page_that_no_longer_reloads(store, tmp_path, env):
    """A new user's: a queued job has no transcript yet, so its watched page is a placeholder, and Ctrl-C left it
    reloading every 2 s for good."""
    spec = stored_job(store, tmp_path)   # queued: nothing of it yet
    page = tmp_path / "queued.html"
    first = watched_then_ctrl_c(spec.id, page, tmp_path, env)
    assert 'http-equiv="refresh"' in first and "no transcript yet" in first
    text = page.read_text()
    assert 'http-equiv="refresh"' not in text and "no transcript yet" in text and "was stopped" in text
