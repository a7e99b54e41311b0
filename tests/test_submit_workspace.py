"""`pid submit` packs the repository at submit and the worker runs on that snapshot, whatever happens to the
directory afterwards; the same tree is stored once; an over-size tree is refused before anything is queued; a git
URL runs at its ref. Real CLI, real worker, real engine, scripted LLM server."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import start_worker, stop_worker
from tests.scripted_llm import ScriptedLLM
from pid.jobs.sqlite_store import JobStore

pytestmark = [pytest.mark.docker, pytest.mark.cli]


def blob_files(home: str) -> list[Path]:
    """The job store's blobs (SQLite's: PID_HOME/blobs/<hex>)."""
    folder = Path(home) / "blobs"
    return [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")] if folder.exists() else []


def test_the_job_runs_on_the_tree_as_submitted_even_after_the_repo_is_gone(run_pid, pid_env, sample_repo, tmp_path):
    os.symlink("/etc/hostname", sample_repo / "host-link")          # a link is packed as a link, not followed
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "readlink host-link; cat README.md"}}]},
              {"tool_calls": [{"name": "write", "arguments": {"path": "README.md", "content": "# agent\n"}}]},
              {"text": "done"}]
    with ScriptedLLM(script) as llm:
        args = ["t", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url,
                "--out", str(tmp_path / "out")]
        first = run_pid("submit", *args)
        assert first.code == 0, first.stderr
        second = run_pid("submit", *args)           # the same tree again: stored once
        assert second.code == 0, second.stderr
        blobs = blob_files(pid_env["PID_HOME"])
        assert len(blobs) == 1
        digest = f"sha256:{blobs[0].name}"
        run_pid("cancel", second.stdout.strip())
        readme = (sample_repo / "README.md").read_text()
        shutil.rmtree(sample_repo)                  # gone before any worker started
        worker = start_worker(pid_env, tmp_path, tmp_path / "worker.log")
        try:
            done = run_pid("result", first.stdout.strip(), "--wait", "--json")
        finally:
            stop_worker(worker)
    result = done.json()
    assert done.code == 0 and result["status"] == "completed", (result, done.stderr)
    assert result["workspace"] == {"kind": "tar", "digest": digest} and result["repo"] == str(sample_repo)
    tool_output = json.dumps(llm.requests[1]["messages"][-1])
    assert "/etc/hostname" in tool_output and "uncommitted line" in tool_output
    patch = (tmp_path / "out" / first.stdout.strip() / "patch.diff").read_text()
    assert patch == ("diff --git a/README.md b/README.md\n" + patch.split("\n", 1)[1])
    assert "-" + "\n-".join(readme.splitlines()) + "\n+# agent\n" in patch   # relative to the tree at submit


def test_an_oversize_repo_is_refused_at_submit_and_nothing_is_queued(run_pid, pid_env, sample_repo, tmp_path):
    (sample_repo / "big.bin").write_bytes(os.urandom(200_000))
    res = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--max-workspace", "100k")
    assert res.code == 2
    assert res.stderr == (f"pid: error: --repo {sample_repo} is larger than --max-workspace 100k once packed; "
                          f"nothing was queued (raise --max-workspace or PID_MAX_WORKSPACE, or submit a git URL)\n")
    res = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m",
                  env={**pid_env, "PID_MAX_WORKSPACE": "150k"})
    assert res.code == 2 and "larger than --max-workspace 150k" in res.stderr
    assert run_pid("list", "--json").json() == []
    assert blob_files(pid_env["PID_HOME"]) == []
    assert not list(Path(pid_env["PID_HOME"]).glob(".pid-pack-*"))


def test_a_missing_image_is_refused_at_submit_in_one_line(run_pid, sample_repo):
    res = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--image", "pid-no-such-image:latest")
    assert res.code == 2
    assert res.stderr.startswith("pid: error: sandbox image 'pid-no-such-image:latest' not found in the local Docker "
                                 "engine") and res.stderr.count("\n") == 1
    assert run_pid("list", "--json").json() == []


def test_a_bad_git_url_is_refused_at_submit(run_pid):
    res = run_pid("submit", "t", "--repo", "ftp://host/r.git", "--model", "m")
    assert res.code == 2 and res.stderr.startswith("pid: error: --repo: not a git URL pid clones")
    res = run_pid("submit", "t", "--repo", "https://host/r.git#-x", "--model", "m")
    assert res.code == 2 and res.stderr == "pid: error: --repo: not a branch, tag or commit id: '-x'\n"
    assert run_pid("list", "--json").json() == []


@pytest.fixture
def bare_repo(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """main: a.txt 'two'; tag v1: 'one'; branch feature: 'three'."""
    src = tmp_path / "gsrc"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(src)]
    subprocess.run(["git", "init", "-q", "-b", "main", str(src)], check=True)
    commits: dict[str, str] = {}

    def commit(name: str, text: str) -> None:
        (src / "a.txt").write_text(text + "\n")
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", text], check=True)
        commits[name] = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                                       text=True).stdout.strip()
    commit("v1", "one")
    subprocess.run([*git, "tag", "v1"], check=True)
    commit("main", "two")
    subprocess.run([*git, "checkout", "-qb", "feature"], check=True)
    commit("feature", "three")
    subprocess.run([*git, "checkout", "-q", "main"], check=True)
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(bare)], check=True)
    return bare, commits


def test_git_url_jobs_run_at_a_branch_a_tag_and_a_commit(run_pid, pid_env, bare_repo, tmp_path):
    bare, commits = bare_repo
    refs = {"feature": "three", "v1": "one", commits["main"]: "two"}
    script = []
    for _ in refs:
        script += [{"tool_calls": [{"name": "write", "arguments": {"path": "a.txt", "content": "agent\n"}}]},
                   {"text": "done"}]
    with ScriptedLLM(script) as llm:
        worker = start_worker(pid_env, tmp_path, tmp_path / "worker.log")
        try:
            jobs = {}
            for ref in refs:
                res = run_pid("submit", "t", "--repo", f"file://{bare}#{ref}", "--model", "m",
                              "--base-url", llm.base_url, "--out", str(tmp_path / "out"))
                assert res.code == 0, res.stderr
                jobs[ref] = res.stdout.strip()
                done = run_pid("result", jobs[ref], "--wait", "--json")   # one at a time: the script is in order
                assert done.code == 0, (done.stdout, done.stderr, (tmp_path / "worker.log").read_text())
                result = done.json()
                expected = commits.get(ref, ref)
                assert result["workspace"] == {"kind": "git", "url": f"file://{bare}", "ref": ref,
                                               "commit": expected}
                patch = (tmp_path / "out" / jobs[ref] / "patch.diff").read_text()
                assert f"-{refs[ref]}\n+agent\n" in patch, patch
            # A ref the repository lacks, or a path that is no directory on the worker: the input's fault, which
            # no retry mends (exit 2, as bad usage), not the sandbox's (exit 1); no model call was made
            for url, why in [(f"file://{bare}#nope", "no branch, tag or commit named nope"),
                             (f"file://{tmp_path}/missing.git#main", "is not a directory on this worker")]:
                res = run_pid("submit", "t", "--repo", url, "--model", "m", "--base-url", llm.base_url,
                              "--out", str(tmp_path / "out"))
                assert res.code == 0, res.stderr
                done = run_pid("result", res.stdout.strip(), "--wait", "--json")
                assert done.code == 2, (done.stdout, done.stderr)
                assert done.json()["exit_reason"] == "bad_workspace" and why in done.json()["error"], done.stdout
        finally:
            stop_worker(worker)
    store = JobStore(os.path.join(pid_env["PID_HOME"], "jobs.db"))
    assert [store.get(job_id).spec.workspace for job_id in jobs.values()] == [None] * len(jobs)   # nothing packed
