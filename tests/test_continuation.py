"""The pieces of `pid continue`: the parent's session chain copied into a new session that names its parent (pi's
fork), and the parent's patch applied inside the sandbox: as the agent's user, never through a link, whatever the
workspace's own git configuration says. The end-to-end behaviour is tests/test_continue.py's."""
from __future__ import annotations

import json

import pytest

from pid.messages import AssistantMessage, TextContent, UserMessage
from pid.session import SessionWriter, read_session
from tests.tool_sandbox import get, put
from pid.jobs.continuation import PATCH_IN_SANDBOX, Parent, Refused, apply_patch, session_chain, start_session


def entry(id_: str, parent: str | None, kind: str = "message", text: str = "") -> dict:
    body = {"message": UserMessage.text(text).to_dict()} if kind == "message" else {"thinkingLevel": "off"}
    return {"type": kind, "id": id_, "parentId": parent, "timestamp": "2026-01-01T00:00:00.000Z", **body}


def test_the_chain_is_the_path_from_the_root_to_the_last_entry_and_a_torn_line_ends_the_file():
    header = {"type": "session", "version": 3, "id": "s", "timestamp": "t", "cwd": "/workspace"}
    lines = [header, entry("a", None, text="one"), entry("b", "a", text="abandoned branch"),
             entry("c", "a", "thinking_level_change"), entry("d", "c", text="two")]
    text = "\n".join(json.dumps(x) for x in lines) + '\n{"type":"message","id":"e","par'
    assert [e["id"] for e in session_chain(text)] == ["a", "c", "d"]


def test_a_continued_session_names_its_parent_copies_its_entries_and_goes_on_from_its_leaf(tmp_path):
    parent_path = tmp_path / "parent.jsonl"
    with SessionWriter(str(parent_path)) as parent:
        parent.model_change("openai", "m")
        parent.message(UserMessage.text("first task"))
        parent.message(AssistantMessage(content=[TextContent("first answer")]))
    entries = session_chain(parent_path.read_text())
    child_path = tmp_path / "child.jsonl"
    with SessionWriter(str(child_path), parent_session="/out/job-1/session.jsonl") as child:
        start_session(child, Parent("job-1", "/out/job-1/session.jsonl", entries, b""))
        child.message(UserMessage.text("second task"))
    lines = [json.loads(line) for line in child_path.read_text().splitlines()]
    assert lines[0]["parentSession"] == "/out/job-1/session.jsonl" and lines[0]["version"] == 3
    assert lines[0]["id"] != json.loads(parent_path.read_text().splitlines()[0])["id"]
    assert lines[1:4] == entries and lines[4]["parentId"] == entries[-1]["id"]
    _, messages = read_session(str(child_path))
    assert [(m.role, m.content[0].text) for m in messages] == [("user", "first task"), ("assistant", "first answer"),
                                                               ("user", "second task")]
    plain = json.loads(parent_path.read_text().splitlines()[0])
    assert "parentSession" not in plain


PATCH = b"""diff --git a/cont-old.txt b/cont-old.txt
--- a/cont-old.txt
+++ b/cont-old.txt
@@ -1 +1 @@
-old
+new
diff --git a/cont-dir/made.txt b/cont-dir/made.txt
new file mode 100644
--- /dev/null
+++ b/cont-dir/made.txt
@@ -0,0 +1 @@
+made
diff --git a/cont-gone.txt b/cont-gone.txt
deleted file mode 100644
--- a/cont-gone.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
"""


@pytest.mark.docker
def test_the_patch_is_applied_in_the_sandbox_as_the_agent_and_the_patch_file_is_gone(docker_sandbox):
    box = docker_sandbox
    put(box, "cont-old.txt", "old\n")
    put(box, "cont-gone.txt", "bye\n")
    apply_patch(box, PATCH)
    assert get(box, "cont-old.txt") == b"new\n" and get(box, "cont-dir/made.txt") == b"made\n"
    done = box.exec(f"test ! -e cont-gone.txt && test ! -e {PATCH_IN_SANDBOX} && stat -c %u cont-dir/made.txt && id -u",
                    timeout=10)
    owner, me = done.tail.decode().split()
    assert done.exit_code == 0 and owner == me        # the agent's own files
    apply_patch(box, b"")                             # a parent that changed nothing: nothing to do


@pytest.mark.docker
def test_a_patch_that_does_not_apply_fails_with_gits_reason(docker_sandbox):
    put(docker_sandbox, "cont-other.txt", "something else\n")
    bad = PATCH.replace(b"cont-old.txt", b"cont-other.txt").split(b"diff --git a/cont-dir")[0]
    with pytest.raises(Refused, match=r"^the parent job's patch does not apply to its snapshot: error: .*cont-other"):
        apply_patch(docker_sandbox, bad)
    assert get(docker_sandbox, "cont-other.txt") == b"something else\n"


@pytest.mark.docker
def test_a_patch_never_writes_through_a_link_and_the_workspaces_git_config_has_no_say(docker_sandbox):
    box = docker_sandbox
    box.exec("mkdir -p /tmp/cont-target && ln -sfn /tmp/cont-target cont-link && mkdir -p .git && "
             "printf '[core]\\n\\tfsmonitor = touch /tmp/cont-fsmonitor-ran\\n' > .git/config", timeout=10)
    through = b"""diff --git a/cont-link/evil.txt b/cont-link/evil.txt
new file mode 100644
--- /dev/null
+++ b/cont-link/evil.txt
@@ -0,0 +1 @@
+evil
"""
    with pytest.raises(Refused, match="beyond a symbolic link"):
        apply_patch(box, through)
    apply_patch(box, through.replace(b"cont-link/evil", b"cont-made-2"))   # beside the workspace's .git
    done = box.exec("ls /tmp/cont-target; test -e /tmp/cont-fsmonitor-ran && echo RAN; cat cont-made-2.txt",
                    timeout=10)
    assert done.tail.decode() == "evil\n"    # applied; nothing through the link; the repository's config unread


def _store(tmp_path):
    from pid.jobs.sqlite_store import JobStore
    return JobStore(str(tmp_path / "jobs.db"))


def _ended(store, spec, artifacts=("result.json", "session.jsonl", "patch.diff")):
    import io
    store.create(spec)
    assert store.claim(spec.id, "w", 60)
    store.finish(spec.id, "stop", owner="w")
    for name in artifacts:
        store.put_artifact(spec.id, name, io.BytesIO(b"{}"))
    return spec


def test_retry_keeps_the_snapshot_and_refuses_what_it_cannot_run_again(tmp_path):
    import io
    from pid.jobs.continuation import continuation_spec, retry_spec
    from pid.jobs.spec import JobSpec
    store = _store(tmp_path)
    digest = store.put_blob(io.BytesIO(b"a tar"))
    job = _ended(store, JobSpec(task="t", repo="/r", model="m", workspace=digest, system_prompt="SYS"))
    again = retry_spec(store, job.id)
    assert (again.retry_of, again.task, again.workspace, again.system_prompt) == (job.id, "t", digest, "SYS")
    assert again.id != job.id and again.parent is None
    more = continuation_spec(store, job.id, "more")
    assert (more.task, more.parent, more.retry_of, more.workspace) == ("more", job.id, None, digest)

    dir_job = _ended(store, JobSpec(task="t", repo=str(tmp_path), model="m"))      # `pid run` read a directory
    with pytest.raises(Refused, match=r"read its directory .* when it started \(`pid run`\), and the job store has "
                                      "no snapshot"):
        retry_spec(store, dir_job.id)
    gone = _ended(store, JobSpec(task="t", repo="/r", model="m", workspace="sha256:" + "0" * 64))
    with pytest.raises(Refused, match="its workspace snapshot .* is no longer in the job store"):
        retry_spec(store, gone.id)
    # a continuation retried continues the same parent: whose transcript must still be there
    child = _ended(store, JobSpec(task="t", repo="/r", model="m", workspace=digest, parent=job.id))
    store.delete_artifact(job.id, "session.jsonl")
    with pytest.raises(Refused, match=f"job {job.id} has no session.jsonl in the job store"):
        retry_spec(store, child.id)


def test_retry_refuses_a_job_still_queued_or_running_and_neither_new_job_joins_the_earlier_ones_batch(tmp_path):
    import io
    from pid.jobs.continuation import continuation_spec, retry_spec
    from pid.jobs.spec import JobSpec
    store = _store(tmp_path)
    digest = store.put_blob(io.BytesIO(b"a tar"))
    queued = JobSpec(task="t", repo="/r", model="m", workspace=digest)
    store.create(queued)
    with pytest.raises(Refused, match=f"job {queued.id} is queued: only a job that has ended can be retried"):
        retry_spec(store, queued.id)
    assert store.claim(queued.id, "w", 60)
    with pytest.raises(Refused, match=f"job {queued.id} is running: only a job that has ended can be retried"):
        retry_spec(store, queued.id)
    # a batch item's: its batch's spent budget (or running limit) must not end or hold the new job
    item = _ended(store, JobSpec(task="t", repo="/r", model="m", workspace=digest, batch="b-1"))
    assert retry_spec(store, item.id).batch is None
    assert continuation_spec(store, item.id, "more").batch is None


def test_a_pid_run_job_is_retried_and_continued_on_the_snapshot_its_result_names(tmp_path):
    """`pid run` keeps its directory's snapshot as a blob and names it in result.json: the new job runs on it."""
    import io
    from pid.jobs.continuation import continuation_spec, retry_spec
    from pid.jobs.spec import JobSpec
    store = _store(tmp_path)
    digest = store.put_blob(io.BytesIO(b"the directory, packed"))
    spec = JobSpec(task="t", repo=str(tmp_path), model="m")
    store.create(spec, kind="run")
    assert store.claim(spec.id, "w", 60)
    store.finish(spec.id, "stop", owner="w")
    result = {"id": spec.id, "workspace": {"kind": "dir", "path": str(tmp_path), "digest": digest}}
    for name, data in (("result.json", json.dumps(result).encode()), ("session.jsonl", b""), ("patch.diff", b"")):
        store.put_artifact(spec.id, name, io.BytesIO(data))
    again = retry_spec(store, spec.id)
    assert (again.workspace, again.repo, again.retry_of) == (digest, str(tmp_path), spec.id)
    more = continuation_spec(store, spec.id, "more")
    assert (more.workspace, more.parent, more.task) == (digest, spec.id, "more")

    missing = {**result, "workspace": {**result["workspace"], "digest": "sha256:" + "1" * 64}}
    store.put_artifact(spec.id, "result.json", io.BytesIO(json.dumps(missing).encode()))
    with pytest.raises(Refused, match="its workspace snapshot .* is not in the job store"):
        retry_spec(store, spec.id)


def test_a_job_whose_agent_never_started_says_so_when_continued(tmp_path):
    """A new user's: a job that failed bad_workspace (its worker took it, its --repo ref did not exist) was said to
    have no session "expired after the retention period, or the job ended without them"."""
    import io
    from pid.jobs.continuation import continuation_spec
    from pid.jobs.spec import JobSpec
    from pid.jobs.sqlite_store import JobStore
    store = JobStore(str(tmp_path / "jobs.db"))
    spec = JobSpec(task="t", repo=str(tmp_path), model="m", out_dir=str(tmp_path / "out"))
    store.create(spec)
    assert store.claim(spec.id, "w1", 600)
    store.put_artifact(spec.id, "result.json", io.BytesIO(b'{"exit_reason": "bad_workspace"}'))
    assert store.finish(spec.id, "bad_workspace", owner="w1", error="no branch, tag or commit named nope")
    with pytest.raises(Refused) as refused:
        continuation_spec(store, spec.id, "go on")
    assert str(refused.value) == (f"job {spec.id} ended (failed: bad_workspace) before its agent started: it has no "
                                  f"conversation to continue (pid status {spec.id} says why)")

    # An attempt that ran (7 turns), handed back, then one whose sandbox failed at once: its agent did start once.
    ran = JobSpec(task="t", repo=str(tmp_path), model="m", out_dir=str(tmp_path / "out2"))
    store.create(ran)
    assert store.claim(ran.id, "w1", 600) and store.progress(ran.id, "w1", 7, 7)
    assert store.hand_back(ran.id, "w1", 7, 7, None) == "queued"
    assert store.claim(ran.id, "w2", 600)
    assert store.finish(ran.id, "sandbox_error", owner="w2", error="the container vanished")
    with pytest.raises(Refused) as refused:
        continuation_spec(store, ran.id, "go on")
    assert "before its agent started" not in str(refused.value) and "no result.json" in str(refused.value)
