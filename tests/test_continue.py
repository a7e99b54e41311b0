"""`pid continue`, `pid retry` and the system prompt files, end to end: the real CLI, one real worker for the module,
real containers, the scripted LLM server (its request log is what the model saw).

A continued job sees the earlier conversation and the new message, runs on the snapshot with the earlier patch
applied (inside its container), and its patch is the whole change against the original tree. Everything it needs
comes from the job store: the earlier job's local out directory is deleted before it is continued."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IMAGE, ROOT, RUN_ID, CliResult, own_build, start_worker, stop_worker
from tests.scripted_llm import ScriptedLLM
from pid.sandbox.reaper import TEST_RUN_ENV
from pid.jobs.sqlite_store import JobStore

pytestmark = [pytest.mark.docker, pytest.mark.cli]

TASK = "Write the greeting file."


class Env:
    """One worker and one scripted server for the module's tests; each test adds its own turns."""

    def __init__(self, root: Path, llm: ScriptedLLM) -> None:
        self.root, self.llm = root, llm
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PID_", "OPENAI_", "ANTHROPIC_"))}
        self.env.update(PID_HOME=str(root / "home"), PID_IMAGE=IMAGE, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1",
                        **{TEST_RUN_ENV: RUN_ID})
        self.out = root / "out"

    def pid(self, *args: str, timeout: float = 240, extra_env: dict[str, str] | None = None) -> CliResult:
        proc = subprocess.run([sys.executable, "-m", "pid.cli.main", *args], cwd=self.root,
                              env={**self.env, **(extra_env or {})},
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    def submit(self, repo: Path, *extra: str, task: str = TASK) -> CliResult:
        return self.pid("submit", task, "--repo", str(repo), "--model", "scripted", "--base-url", self.llm.base_url,
                        "--out", str(self.out), *extra)

    def requests_during(self, turns: list[dict[str, Any]], run: Any) -> tuple[Any, list[dict[str, Any]]]:
        """Run `run()` with these turns scripted: what it returned, and the requests the server got meanwhile."""
        start = len(self.llm.requests)
        self.llm.add(*turns)
        got = run()
        return got, self.llm.requests[start:]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("continue")
    with ScriptedLLM() as llm:
        e = Env(root, llm)
        worker = start_worker(e.env, root, root / "worker.log")
        try:
            yield e
        finally:
            stop_worker(worker)


def make_repo(path: Path, files: dict[str, str]) -> Path:
    """A small git repository with an uncommitted change on top (the snapshot must hold it)."""
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(path)]
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    with open(path / "hello.py", "a") as f:
        f.write("# uncommitted\n")
    return path


ORIGINAL = {"hello.py": 'print("hello")\n', "keep.txt": "unchanged\n"}


def tool(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def texts(request: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of each message of an OpenAI request; tool calls as their JSON."""
    out = []
    for m in request["messages"]:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content)
        out.append((m["role"], (content or "") + json.dumps(m.get("tool_calls") or "")))
    return out


def test_continue_sees_the_conversation_and_its_patch_is_the_whole_change(env: Env, tmp_path: Path):
    repo = make_repo(tmp_path / "repo", ORIGINAL)
    first, _ = env.requests_during(
        [tool("write", path="greeting.txt", content="hello from job one\n"), {"text": "FIRST-DONE"}],
        lambda: env.submit(repo, "--wait", "--json"))
    assert first.code == 0, first.stderr
    parent = first.json()["id"]
    shutil.rmtree(env.out / parent)           # the continuation gets everything from the job store

    turns = [tool("bash", command="cat greeting.txt"),
             tool("edit", path="greeting.txt", edits=[{"oldText": "job one", "newText": "jobs one and two"}]),
             tool("write", path="second.txt", content="made by job two\n"),
             {"text": "SECOND-DONE"}]
    done, requests = env.requests_during(turns, lambda: env.pid("continue", parent, "NOW-MESSAGE-TWO", "--wait",
                                                                "--json"))
    assert done.code == 0, (done.stdout, done.stderr)
    result = done.json()
    assert result["status"] == "completed" and result["parent"] == parent and result["task"] == "NOW-MESSAGE-TWO"
    assert result["final_message"] == "SECOND-DONE" and result["turns"] == 4

    # The model saw the earlier conversation, then the new message, on its first call.
    seen = texts(requests[0])
    assert [role for role, _ in seen] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert seen[1][1].startswith(TASK) and "greeting.txt" in seen[2][1] and seen[4][1].startswith("FIRST-DONE")
    assert seen[5][1].startswith("NOW-MESSAGE-TWO")
    # It ran on the earlier job's work: the file job one wrote is there.
    assert "hello from job one" in texts(requests[1])[-1][1]

    # Its patch is the whole change, against the original tree (uncommitted line included).
    job_dir = env.out / result["id"]
    patch = (job_dir / "patch.diff").read_text()
    assert "+hello from jobs one and two" in patch and "+made by job two" in patch
    fresh = make_repo(tmp_path / "fresh", ORIGINAL)
    subprocess.run(["git", "-C", str(fresh), "apply", "--check", str(job_dir / "patch.diff")], check=True)
    subprocess.run(["git", "-C", str(fresh), "apply", str(job_dir / "patch.diff")], check=True)
    assert (fresh / "greeting.txt").read_text() == "hello from jobs one and two\n"
    assert (fresh / "second.txt").read_text() == "made by job two\n"
    assert (fresh / "hello.py").read_text() == 'print("hello")\n# uncommitted\n'

    # Its transcript is a new session naming its parent's, the parent's entries first, as they were.
    lines = [json.loads(line) for line in (job_dir / "session.jsonl").read_text().splitlines()]
    header, entries = lines[0], lines[1:]
    assert header["type"] == "session" and header["parentSession"] == str(env.out / parent / "session.jsonl")
    env.pid("result", parent, "--download", str(tmp_path / "parent"))
    parent_entries = [json.loads(line) for line in (tmp_path / "parent" / "session.jsonl").read_text().splitlines()][1:]
    assert entries[:len(parent_entries)] == parent_entries
    assert header["id"] != json.loads((tmp_path / "parent" / "session.jsonl").read_text().splitlines()[0])["id"]
    new = [e for e in entries[len(parent_entries):] if e["type"] == "message"]
    assert new[0]["message"]["role"] == "user" and new[0]["message"]["content"][0]["text"] == "NOW-MESSAGE-TWO"
    assert entries[len(parent_entries)]["parentId"] == parent_entries[-1]["id"]   # one chain

    # A continuation of the continuation still applies to the original tree, all three changes in its patch.
    third, _ = env.requests_during(
        [tool("write", path="third.txt", content="three\n"), {"text": "THIRD"}],
        lambda: env.pid("continue", result["id"], "and a third", "--wait", "--json", "--out", str(tmp_path / "o3")))
    assert third.code == 0, third.stderr
    patch3 = (tmp_path / "o3" / third.json()["id"] / "patch.diff").read_text()
    assert all(s in patch3 for s in ("+hello from jobs one and two", "+made by job two", "+three"))


def test_retry_runs_the_same_task_on_the_same_snapshot_as_a_new_job(env: Env, tmp_path: Path):
    repo = make_repo(tmp_path / "repo", ORIGINAL)
    first, _ = env.requests_during([{"text": "ONE"}], lambda: env.submit(repo, "--wait", "--json",
                                                                         task="RETRY-TASK-9"))
    assert first.code == 0, first.stderr
    original = first.json()
    (repo / "hello.py").write_text("changed after submit\n")   # the retry runs on the snapshot, not on this
    turns = [tool("bash", command="cat hello.py"), {"text": "AGAIN"}]
    again, requests = env.requests_during(turns, lambda: env.pid("retry", original["id"], "--wait", "--json"))
    assert again.code == 0, again.stderr
    result = again.json()
    assert result["id"] != original["id"] and result["retry_of"] == original["id"] and "parent" not in result
    assert result["task"] == "RETRY-TASK-9" and result["workspace"] == original["workspace"]
    assert [role for role, _ in texts(requests[0])] == ["system", "user"]
    assert texts(requests[0])[1][1].startswith("RETRY-TASK-9")
    assert "# uncommitted" in texts(requests[1])[-1][1] and "changed after submit" not in texts(requests[1])[-1][1]

    # Without --wait: the new id, alone on stdout.
    queued, _ = env.requests_during([{"text": "x"}], lambda: env.pid("retry", original["id"]))
    assert queued.code == 0 and queued.stdout.strip() != original["id"] and len(queued.stdout.split()) == 1
    assert env.pid("result", queued.stdout.strip(), "--wait").code == 0

    # Another endpoint and model (a new user's: the endpoint had moved, and retry could not say so)
    with ScriptedLLM([{"text": "MOVED"}]) as moved:
        switched = env.pid("retry", original["id"], "--base-url", moved.base_url, "--model", "other", "--wait",
                           "--json")
        assert switched.code == 0, switched.stderr
        assert len(moved.requests) == 1 and moved.requests[0]["model"] == "other"
    assert switched.json()["model"] == "other" and switched.json()["final_message"] == "MOVED"


def test_a_pid_run_job_is_continued_and_retried_on_the_tree_it_saw(env: Env, tmp_path: Path):
    repo = make_repo(tmp_path / "repo", ORIGINAL)
    out = tmp_path / "out"
    first, _ = env.requests_during(
        [tool("write", path="greeting.txt", content="hello from the foreground\n"), {"text": "RUN-DONE"}],
        lambda: env.pid("run", "RUN-TASK-5", "--repo", str(repo), "--model", "scripted", "--base-url",
                        env.llm.base_url, "--out", str(out), "--json"))
    assert first.code == 0, first.stderr
    ran = first.json()
    assert ran["workspace"]["kind"] == "dir" and ran["workspace"]["digest"].startswith("sha256:")
    (repo / "hello.py").write_text("changed after the run\n")   # the new jobs run on the snapshot, not on this
    shutil.rmtree(out / ran["id"])                               # ...and get the rest from the job store

    turns = [tool("bash", command="cat greeting.txt hello.py"), {"text": "CONTINUED"}]
    done, requests = env.requests_during(turns, lambda: env.pid("continue", ran["id"], "MORE-7", "--wait", "--json",
                                                                "--out", str(tmp_path / "o2")))
    assert done.code == 0, (done.stdout, done.stderr)
    result = done.json()
    assert result["parent"] == ran["id"] and result["workspace"] == {"kind": "tar",
                                                                    "digest": ran["workspace"]["digest"]}
    assert texts(requests[0])[1][1].startswith("RUN-TASK-5") and texts(requests[0])[-1][1].startswith("MORE-7")
    seen = texts(requests[1])[-1][1]
    assert "hello from the foreground" in seen and "# uncommitted" in seen and "changed after the run" not in seen

    again, requests = env.requests_during([tool("bash", command="cat hello.py"), {"text": "AGAIN"}],
                                          lambda: env.pid("retry", ran["id"], "--wait", "--json",
                                                          "--out", str(tmp_path / "o3")))
    assert again.code == 0, again.stderr
    assert again.json()["retry_of"] == ran["id"] and texts(requests[0])[1][1].startswith("RUN-TASK-5")
    assert "# uncommitted" in texts(requests[1])[-1][1] and "changed after" not in texts(requests[1])[-1][1]


def test_continue_and_retry_refuse_clearly(env: Env, tmp_path: Path):
    repo = make_repo(tmp_path / "repo", ORIGINAL)
    assert env.pid("continue", "no-such-job", "hi").stderr == \
        "pid: error: no such job: no-such-job (a job's whole id, or its end: its last 4 characters or more)\n"
    assert env.pid("retry", "no-such-job").code == 2
    waiting = env.submit(repo, "--queue", "nobody-consumes-this")   # stays queued: no worker takes it
    assert waiting.code == 0, waiting.stderr
    job = waiting.stdout.strip()
    res = env.pid("continue", job, "more")
    assert res.code == 2 and res.stderr.startswith(f"pid: error: job {job} is queued: only a job that has ended "
                                                   "can be continued"), res.stderr
    assert env.pid("continue", job, "  ").stderr == "pid: error: the message is empty\n"
    env.pid("cancel", job)
    jobs = len(env.pid("list", "--json", "--limit", "1000").json())
    res = env.pid("continue", job, "more")
    assert res.stderr == f"pid: error: job {job} ended (cancelled) before it ran: it has no conversation to continue\n"
    assert len(env.pid("list", "--json", "--limit", "1000").json()) == jobs   # nothing was queued

    ended, _ = env.requests_during([{"text": "ok"}], lambda: env.submit(repo, "--wait", "--json"))
    job = ended.json()["id"]
    JobStore(os.path.join(env.env["PID_HOME"], "jobs.db")).delete_artifact(job, "patch.diff")   # as if expired
    res = env.pid("continue", job, "more")
    assert res.code == 2 and res.stderr.startswith(f"pid: error: job {job} has no patch.diff in the job store "
                                                   "(expired after the retention period"), res.stderr


def test_system_md_append_system_md_and_system_prompt_reach_the_model(env: Env, tmp_path: Path):
    repo = make_repo(tmp_path / "repo", {**ORIGINAL, ".pi/SYSTEM.md": "You are REPO-SYSTEM-41.\n",
                                         ".pi/APPEND_SYSTEM.md": "REPO-APPEND-42 applies.\n",
                                         "AGENTS.md": "AGENTS-43\n"})
    done, requests = env.requests_during([{"text": "ok"}], lambda: env.submit(repo, "--wait"))
    assert done.code == 0, done.stderr
    system = requests[0]["messages"][0]["content"]
    assert system.startswith("You are REPO-SYSTEM-41.\n\nREPO-APPEND-42 applies.\n\n# Project Context")
    assert "AGENTS-43" in system and "expert coding assistant" not in system

    mine = tmp_path / "my-prompt.md"
    mine.write_text("You are CLI-SYSTEM-44.\n")
    done, requests = env.requests_during([{"text": "ok"}],
                                         lambda: env.submit(repo, "--wait", "--system-prompt", str(mine)))
    assert done.code == 0, done.stderr
    system = requests[0]["messages"][0]["content"]
    assert system.startswith("You are CLI-SYSTEM-44.\n\nREPO-APPEND-42 applies.") and "REPO-SYSTEM-41" not in system

    mine.write_text("x" * (64 * 1024 + 1))
    res = env.submit(repo, "--system-prompt", str(mine))
    assert res.code == 2 and res.stderr == (f"pid: error: Invalid value for '--system-prompt': {mine} is larger "
                                            "than 64k\n"), res.stderr


def test_a_git_url_job_is_continued_at_the_commit_it_ran_on_though_its_branch_moved(env: Env, tmp_path: Path):
    src = make_repo(tmp_path / "src", ORIGINAL)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(src)]
    subprocess.run([*git, "commit", "-qam", "two"], check=True)
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(bare)], check=True)
    first, _ = env.requests_during(
        [tool("write", path="hello.py", content="by job one\n"), {"text": "ONE"}],
        lambda: env.pid("submit", TASK, "--repo", f"file://{bare}#main", "--model", "scripted", "--base-url",
                        env.llm.base_url, "--out", str(env.out), "--wait", "--json"))
    assert first.code == 0, first.stderr
    ran_on = first.json()["workspace"]["commit"]
    (src / "keep.txt").write_text("moved on\n")                  # the branch moves on after the job
    subprocess.run([*git, "commit", "-qam", "three"], check=True)
    subprocess.run([*git, "push", "-q", str(bare), "HEAD:main"], check=True)

    turns = [tool("bash", command="cat hello.py keep.txt"), {"text": "TWO"}]
    done, requests = env.requests_during(turns, lambda: env.pid("continue", first.json()["id"], "go on", "--wait",
                                                                "--json"))
    assert done.code == 0, done.stderr
    result = done.json()
    assert result["workspace"] == {"kind": "git", "url": f"file://{bare}", "ref": ran_on, "commit": ran_on}
    assert texts(requests[1])[-1][1].startswith("by job one\nunchanged\n")
    assert "+by job one" in (env.out / result["id"] / "patch.diff").read_text()


def test_another_model_at_another_endpoint_continues_with_the_key_given_for_it(env: Env, tmp_path: Path):
    """continue --model --base-url: the new job's calls reach the new endpoint with the new model's name; a key goes
    only to the endpoint it was given for (never the earlier job's), and the policy check sees the new endpoint."""
    repo = make_repo(tmp_path / "repo", ORIGINAL)
    first, _ = env.requests_during([tool("write", path="a.txt", content="A\n"), {"text": "FIRST"}],
                                   lambda: env.submit(repo, "--input-price", "7", "--wait", "--json"))
    assert first.code == 0, first.stderr
    parent = first.json()["id"]
    with ScriptedLLM([tool("bash", command="cat a.txt"), {"text": "SECOND"}]) as other:
        before = len(env.llm.requests)
        done = env.pid("continue", parent, "carry on", "--model", "other-model", "--base-url", other.base_url,
                       "--api-key", "KEY-FOR-OTHER", "--wait", "--json",
                       extra_env={"PID_BASE_URL": env.llm.base_url, "PID_API_KEY": "KEY-FOR-FIRST"})
        assert done.code == 0, (done.stdout, done.stderr)
        assert len(env.llm.requests) == before                        # nothing went to the earlier endpoint
        assert [r["model"] for r in other.requests] == ["other-model", "other-model"]
        assert {h.get("authorization") for h in other.request_headers} == {"Bearer KEY-FOR-OTHER"}
        assert "A" in texts(other.requests[1])[-1][1]                   # on the earlier job's work
        result = done.json()
        assert result["model"] == "other-model" and result["parent"] == parent and result["status"] == "completed"
        child = result["id"]

        # Continuing the child without --base-url: its endpoint (the other one) stays; a key bound to another
        # endpoint (PID_BASE_URL's) is not sent there, and it says so.
        other.add({"text": "THIRD"})
        third = env.pid("continue", child, "once more", "--wait", "--json",
                        extra_env={"PID_BASE_URL": env.llm.base_url, "PID_API_KEY": "KEY-FOR-FIRST"})
        assert third.code == 0, third.stderr
        assert f"the API key is for {env.llm.base_url}, not this job's {other.base_url}: not sent" in third.stderr
        assert "authorization" not in other.request_headers[-1] and other.requests[-1]["model"] == "other-model"

    # A worker policy that admits only the first endpoint: continuing onto another is refused up front.
    store = JobStore(os.path.join(env.env["PID_HOME"], "jobs.db"))
    store.beat("policed-node", "elsewhere", 1, None, 1, 0, True, ["policed"], {"base_urls": [env.llm.base_url]})
    jobs = len(env.pid("list", "--json", "--limit", "1000").json())
    refused = env.pid("continue", parent, "more", "--queue", "policed", "--base-url", "http://127.0.0.1:9/v1")
    assert refused.code == 2 and "base_urls" in refused.stderr and "nothing was queued" in refused.stderr, \
        refused.stderr
    assert len(env.pid("list", "--json", "--limit", "1000").json()) == jobs
    admitted = env.pid("continue", parent, "more", "--queue", "policed")
    assert admitted.code == 0, admitted.stderr
    env.pid("cancel", admitted.stdout.strip())


def test_a_retry_runs_on_the_image_its_job_ran_though_its_tag_moved(env: Env, tmp_path: Path):
    """A task image's tag rebuilt since: retry and continue run on the image the job ran (result.json's image_id), as
    the check does (a retry ran on the new image, a continuation's patch then did not apply: a new-user test's)."""
    tag = f"pid-test-moving:{RUN_ID.lower()}"
    ids = []

    def build(marker: str) -> None:
        (tmp_path / "img").mkdir(exist_ok=True)
        (tmp_path / "img" / "Dockerfile").write_text(own_build(f"FROM {IMAGE}\nRUN echo {marker} > /etc/pid-marker\n"))
        subprocess.run(["docker", "build", "-q", "-t", tag, str(tmp_path / "img")], check=True, capture_output=True,
                       timeout=300)
        ids.append(subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", tag], check=True,
                                  capture_output=True, text=True).stdout.strip())
    try:
        build("one")
        repo = make_repo(tmp_path / "repo", ORIGINAL)
        first, _ = env.requests_during([tool("bash", command="cat /etc/pid-marker"), {"text": "ONE"}],
                                       lambda: env.submit(repo, "--image", tag, "--wait", "--json"))
        assert first.code == 0, first.stderr
        assert first.json()["image_id"] == ids[0]
        build("two")
        again, requests = env.requests_during([tool("bash", command="cat /etc/pid-marker"), {"text": "AGAIN"}],
                                              lambda: env.pid("retry", first.json()["id"], "--wait", "--json"))
        assert again.code == 0, again.stderr
        assert again.json()["image_id"] == ids[0] != ids[1]
        assert texts(requests[1])[-1][1].startswith("one\n")
        subprocess.run(["docker", "rmi", ids[0]], check=True, capture_output=True, timeout=120)
        gone = env.pid("retry", first.json()["id"])
        assert gone.code == 2 and "no longer in the Docker engine" in gone.stderr, gone.stderr
    finally:
        subprocess.run(["docker", "rmi", "-f", tag, *ids], capture_output=True, timeout=120)
