"""Task images (issue 19): the agent works in the image's own /testbed, and the verdict judges the patch alone.

The image is built here, FROM the sandbox image with `docker build --network none`, as SWE-bench's are shaped: a git
repository with a bug and its unittest in /testbed, root-owned and go-w, and a root-owned Python environment in
/opt/env (like a conda env) first on PATH. Docker tier: the sandbox itself (writes bounded by the disk, who may write
what). CLI tier: `pid run` and `pid batch` against a scripted model, the forgeries included.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import IMAGE, RUN_ID, RUNTIME, own_build
from tests.scripted_llm import ScriptedLLM

CALC = "def add(a, b):\n    return a - b\n"
TEST = ("import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n")
CHECK = "python3 -m unittest -q test_calc"
FIX = {"name": "edit", "arguments": {"path": "calc.py", "edits": [{"oldText": "return a - b",
                                                                    "newText": "return a + b"}]}}
SITE = "$(python3 -c 'import site; print(site.getsitepackages()[0])')"


@pytest.fixture(scope="module")
def task_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SWE-bench-shaped image, built offline for this run and removed after it."""
    context = tmp_path_factory.mktemp("task-image")
    (context / "testbed").mkdir()
    (context / "testbed" / "calc.py").write_text(CALC)
    (context / "testbed" / "test_calc.py").write_text(TEST)
    (context / "testbed" / ".gitignore").write_text("__pycache__/\n")
    (context / "testbed" / "data.bin").write_bytes(os.urandom(8 << 20))   # a base too big for a filled disk
    (context / "helper").mkdir()
    (context / "helper" / "__init__.py").write_text("VALUE = 5\n")
    (context / "Dockerfile").write_text(
        f"FROM {IMAGE}\n"
        "COPY testbed /testbed\n"
        "COPY helper /opt/pkgs/helper\n"
        "RUN python3 -m venv --without-pip /opt/env && echo 'IMAGE_ENV_SOURCED=1' > /opt/env.sh && mkdir /opt/lib "
        "&& cd /testbed && git init -q && git add -A "
        "&& git -c user.name=t -c user.email=t@t commit -qm base && chown -R 0:0 /testbed /opt "
        "&& chmod -R go-w /testbed /opt\n"
        "ENV PATH=/opt/env/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        # as a conda or CUDA image points its shell and loader at the environment the agent may now change
        "ENV BASH_ENV=/opt/env.sh LD_LIBRARY_PATH=/opt/lib\n")
    tag = f"pid-test-task:{RUN_ID.lower()}"
    subprocess.run(["docker", "build", "-q", "--network", "none", "-t", tag, str(context)], check=True,
                   capture_output=True, timeout=300)
    try:
        yield tag
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)


def _box(image: str, **config):
    from pid.sandbox import DockerSandbox, SandboxConfig
    return DockerSandbox.create(SandboxConfig(image=image, job_id="test-task-image", workdir="/testbed",
                                              writable_image=True, image_workspace=True, runtime=RUNTIME, **config))


# -- the sandbox -------------------------------------------------------------------------------------------------

@pytest.mark.docker
def test_the_agent_owns_its_workdir_and_environment_but_not_the_system(task_image, tmp_path):
    box = _box(task_image)
    try:
        box.import_image()
        done = box.exec("id -u; sed -i 's/a - b/a + b/' calc.py && echo edited; "
                        f"cp -r /opt/pkgs/helper {SITE}/ && python3 -c 'import helper; print(helper.VALUE)'; "
                        "touch /usr/bin/pid-evil /etc/pid-evil 2>&1", timeout=60)
        out = done.tail.decode()
        assert out.splitlines()[:3] == ["1000", "edited", "5"], out
        # /usr/bin and /etc stay the image's (gVisor checks the permission before the read-only mount)
        refused = "Permission denied" if RUNTIME == "runsc" else "Read-only file system"
        assert out.count(refused) == 2, out
        copy = box.export_patch(str(tmp_path / "patch.diff"), 1 << 20)
        patch = (tmp_path / "patch.diff").read_text()
        assert copy.dropped == [] and patch.startswith("diff --git a/calc.py b/calc.py\n"), patch
        assert patch.count("diff --git") == 1 and "+    return a + b" in patch
    finally:
        box.close()


@pytest.mark.docker
def test_a_workdir_the_agent_swaps_for_a_link_never_gives_it_pid_s_files(task_image):
    """An attack test's: under --workdir in a tree the agent owns (/opt here), the agent swapped its workdir for a link
    to /.pid; a control server greeted later (the base is recorded on one aside) chowned the workdir through the
    link, /.pid became the agent's, and its replaced /.pid/drop then ran as root. The directories are set up once,
    before the agent runs anything."""
    from pid.sandbox import DockerSandbox, SandboxConfig
    box = DockerSandbox.create(SandboxConfig(image=task_image, job_id="test-task-image-link", runtime=RUNTIME,
                                             workdir="/opt/pkgs/helper", writable_image=True, image_workspace=True))
    try:
        swapped = box.exec("cd / && mv /opt/pkgs/helper /opt/pkgs/helper.real && ln -s /.pid /opt/pkgs/helper "
                           "&& echo swapped", timeout=30)
        assert swapped.tail == b"swapped\n", swapped.tail
        box.channels.run_as_pid_aside(":", "greeting a control server aside", 30)
        owners = box.channels.run_as_pid("for p in /.pid /.pid/drop /.pid/run; do if [ -O $p ]; then echo root; "
                                         "else echo other; fi; done", "looking", 30)   # (gVisor: no statx for ls)
        assert owners.decode().split() == ["root", "root", "root"], owners
        tried = box.exec("echo x > /.pid/drop; touch /.pid/mine; ls /.pid/run", timeout=30)
        assert b"Permission denied" in tried.tail and b"set-up" not in tried.tail, tried.tail
    finally:
        box.close()


@pytest.mark.docker
def test_the_image_s_loader_and_shell_variables_reach_the_agent_but_never_pid_s_root_processes(task_image):
    """The image names /opt files in BASH_ENV and LD_LIBRARY_PATH; the agent owns /opt. Its commands see both (and
    BASH_ENV was read), while pid's root servers, started after the agent rewrote the file, read nothing of it."""
    box = _box(task_image)
    try:
        done = box.exec("echo \"$LD_LIBRARY_PATH $IMAGE_ENV_SOURCED\"; "
                        "echo 'touch /tmp/sourced-by-$(id -u)' >> /opt/env.sh", timeout=30)
        assert done.tail == b"/opt/lib 1\n", done.tail
        for _ in range(3):   # (shells wait ahead of their commands: those started since the rewrite read it)
            box.exec("true", timeout=30)
        assert box.exec("echo /tmp/sourced-by-*", timeout=30).tail == b"/tmp/sourced-by-1000\n"
        box.channels.run_as_pid_aside("true", "a new root server", 30)    # started after the rewrite, by the engine
        box.run_as_pid("true", "the control server's command")
        assert box.exec("echo /tmp/sourced-by-*", timeout=30).tail == b"/tmp/sourced-by-1000\n"
    finally:
        box.close()


@pytest.mark.docker
def test_a_bash_env_that_leaves_allexport_on_does_not_export_the_command(task_image):
    """`set -a` in the image's BASH_ENV exports every later assignment: the command, kept where `bash -c` keeps it,
    would reach every process it starts (a long one then fails each exec: "Argument list too long"). `bash -c` does
    not export it, nor does pid."""
    box = _box(task_image)
    try:
        box.exec("echo 'set -a' >> /opt/env.sh", timeout=30)
        for _ in range(3):   # (the shells that wait ahead of their commands read the old file)
            box.exec("true", timeout=30)
        said = box.exec('case $- in *a*) echo allexport ;; esac; env | grep -c "^BASH_EXECUTION_STRING="', timeout=30)
        assert said.tail == b"allexport\n0\n", said.tail
    finally:
        box.close()


@pytest.mark.docker
def test_a_root_agent_may_change_the_system_and_pid_still_works(task_image, tmp_path):
    box = _box(task_image, user="root")
    try:
        box.import_image()
        done = box.exec("printf '#!/bin/sh\\necho installed\\n' > /usr/bin/pid-tool && chmod +x /usr/bin/pid-tool && "
                        "pid-tool && echo x >> /etc/pid-conf && echo 'print(1)' > /testbed/new.py && echo ok",
                        timeout=60)
        assert done.tail.decode().split() == ["installed", "ok"], done.tail
        box.export_patch(str(tmp_path / "patch.diff"), 1 << 20)
        patch = (tmp_path / "patch.diff").read_text()
        assert "diff --git a/new.py b/new.py" in patch and "pid-tool" not in patch and "pid-conf" not in patch
    finally:
        box.close()


@pytest.mark.docker
def test_what_the_agent_writes_into_the_image_is_bounded_by_the_disk(task_image):
    box = _box(task_image, disk=300 << 20)
    disk = box.container.disk
    assert disk is not None
    try:
        # (the command's own output shares the full disk: it reports after making room)
        done = box.exec("a=$(dd if=/dev/zero of=/testbed/big bs=1M count=1024 2>&1 >/dev/null | head -1); "
                        "b=$(dd if=/dev/zero of=/opt/env/big bs=1M count=64 2>&1 | head -1); "
                        "used=$(du -sm /testbed/big | cut -f1); rm -f /testbed/big /opt/env/big; "
                        "echo \"$a\"; echo \"$b\"; echo used=$used", timeout=120)
        out = done.tail.decode()
        assert out.count("No space left on device") == 2 and 200 <= int(out.split("used=")[1]) < 300, out
        assert not done.disk_full                      # (room again)
        full = box.exec("dd if=/dev/zero of=/testbed/big bs=1M count=1024; echo rc=$?", timeout=120)
        assert full.disk_full, full                    # its own output could not say so: the model is told
        used = os.stat(disk.image).st_blocks * 512
        assert used < 400 << 20, used                  # the host lost at most the job's disk
        box.exec("rm -f /testbed/big", timeout=30)
        assert box.exec("echo still works", timeout=30).tail == b"still works\n"
    finally:
        box.close()


@pytest.mark.docker
def test_a_disk_filled_through_the_image_still_leaves_room_for_the_patch(task_image, tmp_path):
    """Writes into the image go through overlayfs as root (ext4's root reserve does not stop them): the agent fills
    the disk through /opt, beside a 3 MB change in /testbed; the patch is still made. The second time the disk is
    full before the base (recorded while the agent works) could be: it is recorded again, as the patch is made."""
    for base_first in (True, False):
        box = _box(task_image, disk=200 << 20)
        try:
            if base_first:
                box.import_image()
            done = box.exec("head -c 3M /dev/urandom > blob.bin; dd if=/dev/zero of=/opt/env/big bs=1M count=400 "
                            "2>/dev/null; echo done", timeout=120)
            assert done.disk_full, done
            if not base_first:   # (ext4's blocks for root gone too, as gVisor's writes take them: the base
                box.run_as_pid("dd if=/dev/zero of=/.pid/filler bs=64k 2>/dev/null; true", "filling")   # fails)
                box.import_image()
            copy = box.export_patch(str(tmp_path / "patch.diff"), 50 << 20)
            patch = (tmp_path / "patch.diff").read_bytes()
            assert copy.dropped == [] and b"diff --git a/blob.bin b/blob.bin" in patch, base_first
            assert b"GIT binary patch" in patch and patch.count(b"diff --git") == 1
        finally:
            box.close()


@pytest.mark.docker
@pytest.mark.parametrize("reach", [
    "cp /lib/x86_64-linux-gnu/libz.so.1 /opt/lib/libpidtest.so.1 && echo /opt/lib > /etc/ld.so.conf.d/t.conf "
    "&& ldconfig",                                                               # the loader's cache names it
    "cp /lib/x86_64-linux-gnu/libz.so.1 /opt/lib/libpre.so.1 && "
    "echo /opt/lib/libpre.so.1 > /etc/ld.so.preload",                            # ld.so.preload names it
    "cp /usr/bin/git /opt/lib/git && ln -sf /opt/lib/git /usr/bin/git",          # a tool pid runs leads there
], ids=["loader-cache", "preload", "tool-link"])
def test_a_tree_pid_s_tools_could_load_or_run_from_is_never_the_agent_s(request, tmp_path, reach):
    """An image in which pid's root tools may load or run something from /opt: /opt stays the image's (read-only to
    the agent), while /testbed is the agent's."""
    (tmp_path / "Dockerfile").write_text(own_build(f"FROM {IMAGE}\nRUN mkdir -p /opt/lib /testbed && {reach}\n"))
    tag = f"pid-test-loader:{RUN_ID.lower()}-{request.node.callspec.id}"
    subprocess.run(["docker", "build", "-q", "--network", "none", "-t", tag, str(tmp_path)], check=True,
                   capture_output=True, timeout=300)
    try:
        box = _box(tag)
        try:
            done = box.exec("touch /testbed/ok && echo ok; touch /opt/lib/x 2>&1", timeout=30)
            refused = "Permission denied" if RUNTIME == "runsc" else "Read-only file system"
            assert done.tail.decode().splitlines()[0] == "ok" and refused in done.tail.decode(), done.tail
        finally:
            box.close()
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)


@pytest.mark.docker
def test_an_image_without_setpriv_runs_a_non_root_agent_through_pid_s_own_drop(request, tmp_path, monkeypatch):
    """Every agent command drops its privileges through /.pid/drop (sandbox/drop.c), so an image without util-linux
    works, the agent as unprivileged as through setpriv; without pid's drop (no compiler on the host) it is refused
    with the reason."""
    from pid.sandbox import DockerSandbox, SandboxConfig, drop_helper
    from pid.sandbox.errors import SandboxError
    assert drop_helper.program() is not None   # (the test machine has a C compiler)
    (tmp_path / "Dockerfile").write_text(own_build(f"FROM {IMAGE}\nRUN rm /usr/bin/setpriv\n"))
    tag = f"pid-test-nosetpriv:{RUN_ID.lower()}"
    subprocess.run(["docker", "build", "-q", "--network", "none", "-t", tag, str(tmp_path)], check=True,
                   capture_output=True, timeout=300)
    try:
        for disk in ({}, {"disk": 0}):   # /.pid written before the start, or put in through the engine
            box = DockerSandbox.create(SandboxConfig(image=tag, job_id=f"test-no-setpriv-{RUN_ID}", runtime=RUNTIME,
                                                     **disk))
            try:
                done = box.exec("id -u; id -G; grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status; "
                                "command -v setpriv || echo none", timeout=30)
                lines = done.tail.decode().splitlines()
                assert lines[:2] == ["1000", "1000"] and lines[-1] == "none", lines
                caps = dict(line.split() for line in lines[2:-1])   # (gVisor has no CapAmb line)
                assert set(caps) >= {"CapInh:", "CapPrm:", "CapEff:", "CapBnd:"}, lines
                assert set(caps.values()) == {"0000000000000000"}, lines
            finally:
                box.close()
        monkeypatch.setattr(drop_helper, "program", lambda: None)
        with pytest.raises(SandboxError, match="the image has no setpriv"):
            DockerSandbox.create(SandboxConfig(image=tag, job_id=f"test-no-setpriv-{RUN_ID}", runtime=RUNTIME)).close()
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)


@pytest.mark.docker
def test_a_workdir_the_image_lacks_is_a_clear_error(task_image):
    from pid.sandbox import SandboxConfig, SandboxError
    from pid.sandbox import DockerSandbox
    with pytest.raises(SandboxError, match="the image has no directory /nowhere"):
        DockerSandbox.create(SandboxConfig(image=task_image, job_id="test-task-image", workdir="/nowhere",
                                           writable_image=True, image_workspace=True, runtime=RUNTIME))


@pytest.mark.docker
@pytest.mark.cli
def test_a_workdir_the_image_lacks_is_bad_input_exit_2(run_pid, task_image, tmp_path):
    """The job's input, not the sandbox's failure: a CI retrying sandbox_error would retry it for nothing (a new-user
    test's). The same for --workdir with --disk 0, refused before anything starts."""
    with ScriptedLLM([{"text": "never"}]) as llm:
        result = run_pid("run", "t", "--workdir", "/nowhere", "--image", task_image, "--model", "scripted",
                         "--base-url", llm.base_url, "--out", str(tmp_path / "out"), "--json", timeout=300)
        assert result.code == 2, result.stderr
        assert result.json()["exit_reason"] == "bad_workspace" and "no directory /nowhere" in result.json()["error"]
        assert llm.requests == []
        clash = run_pid("submit", "t", "--workdir", "/testbed", "--image", task_image, "--disk", "0", "--model",
                        "scripted", "--base-url", llm.base_url, "--out", str(tmp_path / "out"))
    assert clash.code == 2 and "--workdir needs the job's own disk" in clash.stderr, clash.stderr


# -- pid run: the verdict ----------------------------------------------------------------------------------------

def _run(run_pid, llm: ScriptedLLM, image: str, tmp_path: Path, *extra: str):
    result = run_pid("run", "Fix add() so that test_calc passes", "--workdir", "/testbed", "--image", image,
                     "--model", "scripted", "--base-url", llm.base_url, "--out", str(tmp_path / "out"),
                     "--check", CHECK, "--json", *extra, timeout=300)
    data = result.json()
    return result, data, Path(tmp_path / "out" / data["id"])


def _tool_outputs(job_dir: Path) -> list[str]:
    outputs = []
    for line in (job_dir / "session.jsonl").read_text().splitlines():
        entry = json.loads(line)
        message = entry.get("message") or {}
        if message.get("role") == "toolResult":
            outputs.append("".join(part.get("text", "") for part in message.get("content", [])))
    return outputs


@pytest.mark.cli
def test_pid_run_works_in_the_image_s_testbed_and_the_check_judges_its_patch(run_pid, task_image, tmp_path):
    script = [{"tool_calls": [FIX]},
              {"tool_calls": [{"name": "bash", "arguments": {"command": (
                  f"{CHECK} 2>&1 | tail -1; cp -r /opt/pkgs/helper {SITE}/ && "
                  "python3 -c 'import helper; print(\"helper\", helper.VALUE)'")}}]},
              {"text": "Fixed add()."}]
    with ScriptedLLM(script) as llm:
        result, data, job_dir = _run(run_pid, llm, task_image, tmp_path)
    assert result.code == 0, result.stderr
    assert data["status"] == "completed" and data["workspace"] == {"kind": "image", "path": "/testbed"}
    assert data["check"]["passed"] is True and data["check"]["ran_on"] == "patch"
    assert _tool_outputs(job_dir)[1].split() == ["OK", "helper", "5"]
    patch = (job_dir / "patch.diff").read_text()
    old, new = _blob(CALC), _blob(CALC.replace("a - b", "a + b"))
    assert patch == (f"diff --git a/calc.py b/calc.py\nindex {old}..{new} 100644\n--- a/calc.py\n+++ b/calc.py\n"
                     "@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"), patch


@pytest.mark.docker
@pytest.mark.cli
@pytest.mark.parametrize("owner", ["1000:1000", "1234:1234"])
def test_a_workdir_the_image_gives_to_a_user_is_the_agent_s_to_edit(run_pid, task_image, tmp_path, owner):
    """The workdir's owner in the image is the agent in it: root's (above), the agent's own uid, or another user's
    (an image built with `chown`/USER). The swap of root and the agent had made 1000's files root's, and the agent
    could not edit them (a new-user test's)."""
    tag = f"{task_image}-{owner.replace(':', '-')}"
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(f"FROM {task_image}\nRUN chown -R {owner} /testbed\n")
    subprocess.run(["docker", "build", "-q", "--network", "none", "-t", tag, str(tmp_path / "ctx")], check=True,
                   capture_output=True, timeout=300)
    try:
        script = [{"tool_calls": [FIX]}, {"tool_calls": [{"name": "bash", "arguments": {"command": "ls -ln calc.py"}}]},
                  {"text": "Fixed add()."}]
        with ScriptedLLM(script) as llm:
            result, data, job_dir = _run(run_pid, llm, tag, tmp_path)
        assert result.code == 0, result.stderr
        assert data["check"]["passed"] is True
        assert _tool_outputs(job_dir)[1].split()[2:4] == ["1000", "1000"]   # (the agent's, as it sees them)
        assert "+    return a + b" in (job_dir / "patch.diff").read_text()
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)


def _blob(text: str) -> str:
    """git's short blob id of a text."""
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()[:7]


# The forgeries: each leaves the source unfixed (or the test rewritten), and makes the check pass in the agent's own
# container (the agent runs it there to show it); the verdict, on the patch alone, fails.
PTH = ("mkdir -p ~/.local/lib/python3.11/site-packages && echo 'import os; os._exit(0)' "
       "> ~/.local/lib/python3.11/site-packages/zz-pass.pth")
PYCACHE = ("stamp=$(stat -c %Y calc.py) && cp calc.py /tmp/orig.py && sed -i 's/a - b/a + b/' calc.py && "
           "touch -d @$stamp calc.py && python3 -c 'import calc' && cp /tmp/orig.py calc.py && "
           "touch -d @$stamp calc.py")
REWRITE = "sed -i 's/add(2, 3), 5/add(2, 3), -1/' test_calc.py"
# the test's bytecode made from a rewritten test, the source put back, and .gitignore told to keep the bytecode
UNIGNORED = ("printf '!__pycache__/\\n__pycache__/*\\n!__pycache__/test_calc.*\\n' > .gitignore && "
             "stamp=$(stat -c %Y test_calc.py) && cp test_calc.py /tmp/t.py && "
             "sed -i 's/add(2, 3), 5/add(2, 3),-1/' test_calc.py && touch -d @$stamp test_calc.py && "
             "python3 -c 'import test_calc' && cp /tmp/t.py test_calc.py && touch -d @$stamp test_calc.py")


@pytest.mark.cli
@pytest.mark.parametrize("forgery, check, extra", [
    (PTH, "/usr/bin/python3 -m unittest -q test_calc", []),
    (PYCACHE, CHECK, []),
    (REWRITE, CHECK, ["--check-original", "test_calc.py"]),
    (UNIGNORED, CHECK, ["--check-original", "test_calc.py"]),
], ids=["pth-in-home", "hidden-pycache", "rewritten-test", "unignored-pycache"])
def test_a_forged_verdict_fails_the_check(run_pid, task_image, tmp_path, forgery, check, extra):
    forge = f"{forgery} && {check} >/dev/null 2>&1; echo rc=$?"
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": forge}}]}, {"text": "Done."}]
    with ScriptedLLM(script) as llm:
        result = run_pid("run", "Fix add()", "--workdir", "/testbed", "--image", task_image, "--model", "scripted",
                         "--base-url", llm.base_url, "--out", str(tmp_path / "out"), "--check", check, "--json",
                         *extra, timeout=300)
    data = result.json()
    job_dir = tmp_path / "out" / data["id"]
    assert _tool_outputs(job_dir)[0].split() == ["rc=0"], "the forgery works in the agent's own container"
    assert result.code == 4 and data["status"] == "completed" and data["check"]["passed"] is False, data
    patch = (job_dir / "patch.diff").read_text()
    changed = [line.split()[2] for line in patch.splitlines() if line.startswith("diff --git ")]
    assert not [path for path in changed if path == "a/calc.py" or "__pycache__" in path or ".pth" in path], patch
    if forgery == REWRITE:
        assert "diff --git a/test_calc.py" in patch and data["check"]["original"] == ["test_calc.py"]


# -- pid batch: a dataset is a tasks file ------------------------------------------------------------------------

@pytest.mark.cli
def test_a_batch_of_task_images_reports_the_resolved_rate(pid_env, task_image, tmp_path):
    """Three items with their own image, workdir and check (one also with a repository imported at its workdir):
    two fix the bug, one does not; summary.json's pass rate is 2 of 3."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(CALC)
    (repo / "test_calc.py").write_text(TEST)
    items = [{"id": "fixed", "image": task_image, "workdir": "/testbed", "check": CHECK,
              "check_original": ["test_calc.py"], "task": "Fix add() [fix]"},
             {"id": "unfixed", "image": task_image, "workdir": "/testbed", "check": CHECK, "task": "Look [look]"},
             {"id": "imported", "image": task_image, "workdir": "/srv/app", "repo": str(repo), "check": CHECK,
              "task": "Fix add() [fix]"}]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(item) + "\n" for item in items))

    def respond(body):
        text = json.dumps(body["messages"][1:2])
        if any(m["role"] == "tool" for m in body["messages"]):
            return {"text": "Done."}
        return {"tool_calls": [FIX if "[fix]" in text else {"name": "bash", "arguments": {"command": "ls"}}]}
    with ScriptedLLM(responder=respond) as llm:
        done = subprocess.run([sys.executable, "-m", "pid.cli.main", "batch", str(tasks), "--out", str(tmp_path / "b"),
                               "--model", "scripted", "--base-url", llm.base_url, "--workers", "2"],
                              cwd=tmp_path, env=pid_env, capture_output=True, text=True, timeout=600)
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert done.returncode == 4, done.stderr
    assert summary["check"]["passed"] == 2 and summary["check"]["checked"] == 3, summary
    assert round(summary["check"]["pass_rate"], 3) == 0.667
