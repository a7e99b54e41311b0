"""The agent as an adversary: each attack on pid itself, against a real container (and, end to end, the real CLI).

The default agent (uid 1000, no capabilities) must fail at the source; where an attack needs root in the container
it is run with `--user root`, and what protects the host then is the host's own bounds (bytes, time, validation).
"""
from __future__ import annotations

import json
import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

import docker
import pytest
import requests

from pid.sandbox_api import OutputPolicy, SandboxLost
from pid.sandbox import DockerSandbox, SandboxConfig, SandboxError, commands, launch, processes
from pid.sandbox.channel import Channel, ProtocolError
from tests import deep_tree, gate
from tests.conftest import RUN_ID, RUNTIME, WAITING_SHELL_MARK, signal_waiting_shells, signalled
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.docker  # the whole module needs an engine

IMAGE = os.environ.get("PID_TEST_IMAGE", "pid-sandbox:latest")
UNMADE = b"pid: the command could not start: its output file could not be made (no space or no inodes left for output)"


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def opts(llm: ScriptedLLM, out: Path, *extra: str) -> list[str]:
    return ["--model", "scripted", "--base-url", llm.base_url, "--out", str(out), "--json",
            *(["--runtime", RUNTIME] if RUNTIME else []), *extra]


def tool_results(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


POOLED = os.environ.get("PID_TEST_POOL") == "1"   # every sandbox below comes from a worker's warm pool
# ...but for the tests of whole jobs (`pid run` makes its own sandbox) and of none: the pooled run would only repeat
# them, as they are (the run without PID_TEST_POOL has them)
not_pooled = pytest.mark.skipif(POOLED, reason="no warm pool's sandbox here: `pid run` makes its own (the run "
                                               "without PID_TEST_POOL has this test)")


def new_box(job_id: str, **config) -> DockerSandbox:
    """A job's sandbox; with PID_TEST_POOL=1, one a warm pool made ready, then taken (worker/warm_pool.py) and
    renamed for its job: the id is this test run's own, as another run's (xdist) would take the same name."""
    box_config = SandboxConfig(image=IMAGE, runtime=RUNTIME, job_id=f"{job_id}-{RUN_ID}", **config)
    return pooled(box_config) if POOLED else DockerSandbox.create(box_config)


def pooled(box_config: SandboxConfig) -> DockerSandbox:
    from pid.worker.warm_pool import WarmPool
    pool = WarmPool(1).start()
    try:
        pool.served(box_config)
        deadline = time.time() + 120
        while not (taken := pool.take(box_config)):
            assert time.time() < deadline, "the warm pool made no sandbox"
            time.sleep(0.05)
        return taken
    finally:
        pool.close()


@pytest.fixture(scope="module")
def box():
    sandbox = new_box("test-trust")   # (the default time to live: a loaded CI run may hold it past 15 min)
    try:
        yield sandbox
    finally:
        sandbox.close()


@pytest.fixture(scope="module")
def root_box():
    sandbox = new_box("test-trust-root", user="root")
    try:
        yield sandbox
    finally:
        sandbox.close()


# -- 1. host memory ---------------------------------------------------------------------------------------------
def test_a_flood_into_the_channel_is_refused_at_the_source(box):
    """A command's shell is a child of pid's drop (its parent, $PPID), a child of the server: the server's reply
    stream, and the drop's request and reply pipes (a request there makes a file as root), are not the agent's."""
    result = box.exec("s=$(cut -d' ' -f4 /proc/$PPID/stat); tr '\\0' ' ' </proc/$s/cmdline; echo; "
                      "head -c 300M /dev/zero > /proc/$s/fd/1; echo rc=$?; "
                      "echo 's /proc/self/fd/0 /tmp/made' > /proc/$PPID/fd/0; echo rc=$?; "
                      ": < /proc/$PPID/fd/1; echo rc=$?; [ -e /tmp/made ] || echo none made", timeout=60)
    lines = result.tail.decode().splitlines()
    assert lines[0].startswith("bash /.pid/channel.sh agent ") and lines.count("rc=1") == 3, lines
    assert "Permission denied" in lines[1] and lines[-1] == "none made", lines


def test_a_root_agent_flooding_the_channel_costs_the_host_no_memory(root_box):
    root_box.exec("true", timeout=10)
    before = rss_mb()
    with pytest.raises(ProtocolError):
        root_box.exec("head -c 300M /dev/zero > /proc/$PPID/fd/1; sleep 2", timeout=60)
    assert rss_mb() - before < 100
    assert root_box.exec("echo fresh", timeout=10).tail == b"fresh\n"   # a new channel carries on


def test_a_root_agent_cannot_plant_the_tools_pid_runs(root_box):
    """The image's filesystem is read-only: not even a root agent can replace tail, git or sh, nor what `localhost`
    names (the engine's /etc/hosts is read-only with a read-only root; pid's own is too: launch.ETC_HOSTS)."""
    result = root_box.exec("printf '#!/bin/sh\\nhead -c 1G /dev/zero\\n' > /usr/local/bin/tail; echo rc=$?; "
                           "cp /bin/true /usr/bin/git; echo rc=$?; echo '10.0.0.1 localhost' >> /etc/hosts; echo rc=$?",
                           timeout=10)
    assert result.tail.count(b"Read-only file system") == 3 and result.tail.count(b"rc=1") == 3, result.tail
    before = rss_mb()
    big = root_box.exec("seq 1 300000", timeout=60,
                        output=OutputPolicy(tail_bytes=1000))   # counted and tailed by pid's own tools
    assert big.total_lines == 300000 and big.tail.endswith(b"300000\n") and rss_mb() - before < 50


# -- 3, 4. disk and file table ------------------------------------------------------------------------------------
def test_the_disk_limit_holds_inside_and_costs_the_host_at_most_that(tmp_path):
    with new_box("test-trust-disk", ttl_s=300, disk=300 << 20) as small:
        image = small.container.disk.image
        # (the command's own output shares the full disk: report after making room)
        result = small.exec("a=$(head -c 1G /dev/zero 2>&1 >/workspace/big); "
                            "b=$(head -c 100M /dev/zero 2>&1 >/tmp/more); "
                            "used=$(du -sm /workspace/big | cut -f1); rm -f /workspace/big /tmp/more; "
                            "echo \"$a\"; echo \"$b\"; "
                            "echo used=$used", timeout=120)
        assert result.tail.count(b"No space left on device") == 2, result.tail
        assert 200 <= int(result.tail.split(b"used=")[1]) < 300, result.tail
        small.exec("head -c 1G /dev/zero > /workspace/big", timeout=120)     # full again, for the host's count
        used = os.stat(image).st_blocks * 512
        assert used < 400 << 20, used
        with pytest.raises(OSError) as full:             # the write tool says so too, plainly
            small.write_file("/home/agent/x.bin", os.urandom(1 << 20))
        assert "No space left" in str(full.value)
        small.exec("rm -f /workspace/big /tmp/more", timeout=30)
        assert small.exec("echo room again > /workspace/ok && cat /workspace/ok", timeout=10).tail == b"room again\n"
    assert not os.path.exists(image)                      # the disk goes with the container


def test_a_disk_out_of_inodes_leaves_the_agents_commands_running_and_its_errors_plain():
    """ext4 keeps blocks for root, not inodes: the agent can use up every inode of the job's disk. pid's own files
    (the commands' output, its pipes, an upload) are on pid's own disk: the agent's later commands still run and
    report, and a write fails with ENOSPC. (A 16 MiB disk: 4,096 inodes to use up, not 16,384: a quarter of the
    work, which gVisor makes slow.)"""
    with new_box("test-trust-inodes", ttl_s=300, disk=16 << 20) as box:
        made = box.exec("cd /tmp && i=0; while { : >f$i; } 2>/dev/null; do i=$((i + 1)); done; echo $i", timeout=120)
        assert int(made.tail) > 1000, made.tail
        with pytest.raises(OSError) as full:
            box.write_file("/workspace/upload.bin", b"k 1\n" * 20000)    # (over 32 KiB: stored by a process)
        assert "No space left" in str(full.value)
        for _ in range(3):   # (both slots: their shells start after the inodes ran out)
            done = box.exec("echo ran; touch /workspace/more", timeout=10)
            assert done.exit_code == 1 and done.tail.startswith(b"ran\ntouch: cannot touch"), done.tail
            assert b"No space left on device" in done.tail and done.disk_full


def test_a_path_too_long_for_git_fails_the_patch_instead_of_leaving_the_file_out(tmp_path):
    """A file whose path passes Linux's PATH_MAX (made one directory at a time) cannot be recorded by git: its patch
    left it out without a word. Now the patch fails, naming the path."""
    if RUNTIME == "runsc":
        pytest.skip("gVisor's getcwd fails past PATH_MAX (bash aborts on glibc's assertion at the first cd there): the "
                    "agent's shell cannot make such a path to begin with")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    with new_box("test-trust-longpath", ttl_s=300) as box:
        box.import_workspace(str(repo))
        made = box.exec("cd /workspace && for i in $(seq 21); do d=$(printf 'd%.0s' $(seq 200)); mkdir $d && cd $d; "
                        "done && echo deep > f && echo b > /workspace/a.txt && echo ok", timeout=60)
        assert made.tail == b"ok\n", made.tail
        with pytest.raises(SandboxError, match="longer than 4095 bytes"):
            box.export_patch(str(tmp_path / "patch.diff"), 1 << 20)


def test_a_file_too_large_for_gits_diff_fails_the_patch_at_once(tmp_path):
    """git's binary diff breaks on a file near 2 GiB or more: past 4 GiB it wrote a truncated patch and exited 0, and
    a sparse file that large costs the agent nothing but had git read all of it first (a minute here). Now such a
    file the workspace had fails the patch at once, naming it; one git ignores (or left unchanged) does not, and a new
    one is left out unread, as any new file over --max-patch is."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    (repo / ".gitignore").write_text("data/\n")
    with new_box("test-trust-hugefile", ttl_s=300) as box:
        box.import_workspace(str(repo))
        made = box.exec("cd /workspace && mkdir data && truncate -s 5G data/ignored.bin && echo b > a.txt && echo ok",
                        timeout=30)
        assert made.tail == b"ok\n", made.tail
        copy = box.export_patch(str(tmp_path / "patch.diff"), 1 << 20, timeout=60)
        assert (tmp_path / "patch.diff").read_bytes().count(b"diff --git") == 1, copy
        box.exec("truncate -s 5G /workspace/huge.bin", timeout=30)
        copy = box.export_patch(str(tmp_path / "patch2.diff"), 1 << 20, timeout=60)
        assert [s.path for s in copy.dropped] == ["huge.bin"] and "--max-patch" in copy.dropped[0].reason
        box.exec("truncate -s 5G /workspace/a.txt", timeout=30)
        with pytest.raises(SandboxError, match="over 2,000,000,000 bytes.*a.txt"):
            box.export_patch(str(tmp_path / "patch3.diff"), 1 << 20, timeout=300)


def test_a_fifo_git_would_read_fails_the_patch_at_once(tmp_path):
    """git opens every .gitignore (and .gitattributes) it meets: a FIFO there held pid's git until the collection's
    deadline removed the container. Now the patch fails at once, saying why."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    with new_box("test-trust-fifo-ignore", ttl_s=300) as box:
        box.import_workspace(str(repo))
        made = box.exec("cd /workspace && mkdir d && mkfifo d/.gitignore && echo b > a.txt && echo ok", timeout=30)
        assert made.tail == b"ok\n", made.tail
        with pytest.raises(SandboxError, match="no regular file.*d/.gitignore"):
            box.export_patch(str(tmp_path / "patch.diff"), 1 << 20, timeout=20)


def test_pid_disk_out_of_inodes_gives_plain_errors_and_never_feeds_an_upload_to_pids_server(monkeypatch):
    """Where pid's own files go can run out of inodes too: a root agent can write there, and keep the host's removal
    of finished outputs from freeing any (hard links; here that removal is simply off). An upload whose file could
    then not be made used to stay on the server's input and be read as its requests (here `k 1`: kill every process
    of the container, as root). Now all of it is read and dropped, the write fails with ENOSPC, and a command whose
    output file cannot be made says so (126). (pid's disk of 16 MiB here, not 1 GiB: 4,096 inodes to use up, not
    65,536.)"""
    monkeypatch.setattr(launch, "PID_DISK", 16 << 20)
    with new_box("test-trust-pid-inodes", ttl_s=300, user="root", disk=64 << 20) as box:
        monkeypatch.setattr(box.commands.outputs.kept, "finished", lambda *args, **kwargs: None)
        box.exec("setsid sleep 4343 >/dev/null 2>&1 &", timeout=10)   # kill -9 -1 would end it
        box.exec("cd /.pid/out && seq -f x%g 1 20000 | xargs touch", timeout=300)
        with pytest.raises(OSError) as full:
            box.write_file("/workspace/upload.bin", b"k 1\n" * 20000)    # (over 32 KiB: stored by a process)
        assert "No space left" in str(full.value)
        assert box.container.client.containers.get(box.container.id).status == "running"
        for _ in range(3):   # (both slots: their shells started before, with their output files; then none)
            done = box.exec("echo ran", timeout=10)
        assert (done.exit_code, done.tail) == (126, UNMADE)
        # (the engine's own exec, as root, not pid's channels; `docker top` would list gVisor's host processes)
        engine = box.container.client.containers.get(box.container.id)
        alive = engine.exec_run(["pgrep", "-x", "-f", "sleep 4343"], user="root")
        assert alive.exit_code == 0 and alive.output.strip().isdigit(), alive


def test_a_long_command_cut_short_by_a_full_disk_is_not_run():
    """A command longer than a page reaches its shell through a file of root's on pid's own disk. With that disk full
    to the last block (a root agent can write there, and take root's reserve too) the file is cut short, and no part
    of the command may run: the shell says so and ends with 125."""
    with new_box("test-trust-cut", ttl_s=300, user="root", disk=64 << 20) as box:
        box.exec("touch /workspace/fill; fallocate -l 2G /.pid/out/fill; head -c 2G /dev/zero >>/.pid/out/fill; sync",
                 timeout=120)
        done = box.exec("rm -f /workspace/fill #" + "A" * 10000, timeout=30)
        assert done.exit_code == 125, (done.exit_code, done.tail)
        assert box.exec("test -e /workspace/fill", timeout=10).exit_code == 0   # (no output fits on the disk)
        box.exec("rm -f /.pid/out/fill", timeout=10)
        done = box.exec(": '" + "A" * 10000 + "'; echo room", timeout=10)
        assert (done.exit_code, done.tail) == (0, b"room\n")


@not_pooled
def test_an_agent_that_uses_up_every_inode_ends_as_it_ended_with_its_patch(run_pid, sample_repo, tmp_path):
    """Issue 21, finding 8: the patch used to need inodes on the job's disk (pid's git wrote its objects and index
    there, and its command's output file), so an agent that used them all up ended `failed`/`artifact_error`."""
    fill = ("cd /tmp && i=0; while { : >f$i; } 2>/dev/null; do i=$((i + 1)); done; echo made $i; "
            "echo '# changed' >> /workspace/hello.py && echo appended")
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": fill}}]},
              {"tool_calls": [{"name": "bash", "arguments": {"command": "touch /workspace/new.txt; echo rc=$?"}}]},
              {"text": "done"}]
    with ScriptedLLM(script) as llm:
        res = run_pid("run", "t", "--repo", str(sample_repo), "--disk", "16m", *opts(llm, tmp_path / "out"))
    result = res.json()
    assert res.code == 0 and result["status"] == "completed", result
    made = tool_results(llm.requests[1])[0]
    assert int(made.split("made ")[1].split()[0]) > 1000 and "appended" in made, made
    seen = tool_results(llm.requests[2])[1]                     # its next command still runs, and says why
    assert "No space left on device" in seen and "rc=1" in seen, seen
    patch = (tmp_path / "out" / result["id"] / "patch.diff").read_text()
    assert "+# changed" in patch and "new.txt" not in patch, patch


@not_pooled
def test_a_write_past_the_disk_shows_the_model_no_space_left(run_pid, sample_repo, tmp_path):
    """Issue 21, finding 9: the command's output file was on the disk its command filled, so the model got
    "(no output)" and no reason."""
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "head -c 1G /dev/zero > /tmp/big"}}]},
              {"text": "done"}]
    with ScriptedLLM(script) as llm:
        res = run_pid("run", "t", "--repo", str(sample_repo), "--disk", "300m", *opts(llm, tmp_path / "out"))
    assert res.code == 0 and res.json()["status"] == "completed", res.json()
    seen = tool_results(llm.requests[1])[0]
    assert seen.startswith("head: error writing 'standard output': No space left on device\n"), seen
    assert "Command exited with code 1" in seen, seen


@pytest.mark.skipif(RUNTIME == "runsc", reason="gVisor's writes reach the host's disk through its own cache: the "
                                              "host's look at the room left may come before them")
def test_an_output_flood_that_fills_pids_room_for_it_is_said_and_a_trimmed_one_is_not(box):
    """A new user's test: `yes` filled pid's ~1 GiB for command output before the host's first trim, failed writing,
    and the model saw only exit 1. 1.25 GiB from dd: either the trims kept up (a slow machine), and all of it is
    counted and nothing said, or its room filled, and the result says output was lost."""
    flood = 80 * (16 << 20)
    result = box.exec("dd if=/dev/zero bs=16M count=80 status=none; echo dd=$?", timeout=60,
                      output=OutputPolicy(tail_bytes=1000))
    lost = result.total_bytes < flood
    assert result.output_lost == lost, (result.total_bytes, result.output_lost)
    if not lost:
        assert result.tail.endswith(b"dd=0\n"), result.tail[-100:]
    quiet = box.exec("seq 1 300000", timeout=30, output=OutputPolicy(tail_bytes=1000))   # (room again: nothing lost)
    assert not quiet.output_lost and quiet.total_lines == 300000


def test_a_huge_output_keeps_only_its_tail_on_disk(box, monkeypatch):
    monkeypatch.setattr(commands, "KEEP_OUTPUT", 1 << 20)
    monkeypatch.setattr(commands, "TRIM_EVERY_S", 0.2)
    result = box.exec("for i in $(seq 1 20); do head -c 1048575 /dev/zero | tr '\\0' x; echo; sleep 0.2; done",
                      timeout=60, output=OutputPolicy(tail_bytes=100))
    assert (result.total_bytes, result.total_lines) == (20 << 20, 20)       # counted whole...
    assert result.output_from >= 10 << 20 and result.tail == b"x" * 99 + b"\n"
    # ...kept as its tail only, on the job's disk (as the host sees it: gVisor's own view counts its cache)
    used = os.stat(os.path.basename(result.output_path), dir_fd=box.commands.outputs.dir_fd).st_blocks * 512
    assert used < 6 << 20, used


def test_processes_times_open_files_stay_well_below_the_host_file_table(box):
    # (the pids cgroup under runc; under gVisor, whose kernel is its own, the agent's RLIMIT_NPROC)
    limits = box.exec("ulimit -n; cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max "
                      "2>/dev/null || ulimit -u", timeout=10).tail.split()
    nofile, pids = int(limits[0]), int(limits[1])
    assert nofile * pids * 4 <= int(Path("/proc/sys/fs/file-max").read_text())


# -- 10. a full process table -------------------------------------------------------------------------------------
def _load_host(seconds: float) -> list[subprocess.Popen]:
    """Both cores busy on the host while the test runs ("also with the machine loaded")."""
    return [subprocess.Popen(["timeout", str(seconds), "sh", "-c", "while :; do :; done"], start_new_session=True)
            for _ in range(2)]


GVISOR_FORK_BOMB = ("gVisor's ptrace platform (Debian's runsc 2022) spends host tasks without bound on forks its "
                    "kernel refuses: under a fork bomb they can grow by ~600/s past any cgroup limit (6,400 and 15,600 "
                    "seen), and the sandbox dies when the limit is hit; see "
                    "test_under_gvisor_a_fork_bomb_ends_at_worst_its_own_sandbox")
# The fork bombs take their turns on one xdist worker (--dist loadgroup): three at once, two with both cores loaded
# besides, ran a CI run's machine past their deadlines (the 600 escaped sleeps took over 10 s to start).
FORK_BOMBS = pytest.mark.xdist_group("fork-bombs")


@FORK_BOMBS
@pytest.mark.skipif(RUNTIME == "runsc", reason=GVISOR_FORK_BOMB)
@pytest.mark.parametrize("loaded", [False, True])
def test_after_a_fork_bomb_the_next_tool_call_works(box, loaded):
    hogs = _load_host(60) if loaded else []
    try:
        bomb = box.exec(":(){ :|:& };:", timeout=5)      # returns soon; the bomb goes on in the background
        time.sleep(3)
        after_bomb = box.exec("sleep 999 >/dev/null 2>&1 & echo alive; ls -d / && echo forked", timeout=60)
        assert bomb.pids_limit_hit or after_bomb.pids_limit_hit  # the model is told...
        assert after_bomb.tail == b"alive\n/\nforked\n"  # ...and the call itself works
        assert box.exec("echo again && ls -d /", timeout=30).tail == b"again\n/\n"
        # the forks the bomb was refused were dealt with: no later clearing kills what the call after it left running
        kept = box.exec("pgrep -u \"$(id -u)\" -x sleep >/dev/null && echo kept", timeout=30)
        assert (kept.tail, kept.pids_limit_hit) == (b"kept\n", False)
        # an escaped bomb (its own sessions, outliving the command) is cleared too
        escaped = box.exec("for i in $(seq 1 600); do setsid sleep 1000 & done 2>/dev/null; echo spawned", timeout=10)
        assert escaped.pids_limit_hit
        after = box.exec("ps -eo user=,args= | grep -c '^1000 *sleep 1000' || true", timeout=30)
        assert after.tail == b"0\n"
        box.write_file("after-bomb.txt", b"ok")
        assert box.read_file("after-bomb.txt") == b"ok"
    finally:
        for hog in hogs:   # the whole group: killing `timeout` alone would leave its loop running
            os.killpg(hog.pid, signal.SIGKILL)
            hog.wait()


@FORK_BOMBS
@pytest.mark.skipif(RUNTIME == "runsc", reason=GVISOR_FORK_BOMB)
@pytest.mark.parametrize("timeout", [20, 4])
def test_a_fork_bomb_then_more_commands_in_one_call_ends_in_time_and_says_so(timeout):
    """A new user's test: with the bomb still forking as the command ended, the server's count of its (long) output
    forked `wc`, which waited on fork retries: the call failed after 20-37 s ("exec channel closed", "did not send
    a whole reply in time"), past --timeout. The host counts the output itself now (and reads a running command's
    output for on_output itself): the call ends with its output, the process-limit note, and at its timeout."""
    policy = OutputPolicy(keep_lines=2000, keep_bytes=51200)   # (the bash tool's: a long output is counted)
    box = new_box(f"test-trust-bomb-{timeout}")   # (its own: the bomb goes on in the background)
    try:
        started = time.monotonic()
        seen: list[bytes] = []
        result = box.exec("bomb() { bomb | bomb & }; bomb; sleep 2; echo bombed", timeout=timeout, output=policy,
                          on_output=seen.append)
        took = time.monotonic() - started
        assert result.pids_limit_hit and took < timeout + 3, (took, result)
        if result.timed_out:
            assert timeout == 4, result
        else:
            # (its last command's status; its "bombed" may be followed by the bomb's own lines, still coming)
            assert result.exit_code == 0 and result.total_lines > 1, result
        assert seen   # (the running command's output came, read on the host)
        assert box.exec("echo next", timeout=30).tail == b"next\n"
    finally:
        box.close()


@FORK_BOMBS
@pytest.mark.skipif(RUNTIME == "runsc", reason=GVISOR_FORK_BOMB)
def test_a_fork_bomb_the_engine_cannot_freeze_is_killed_from_the_host(monkeypatch):
    """cgroup v1's freezer may not settle under a fork bomb on a loaded host (runc: "unable to freeze"). pid's server
    inside is then one task among hundreds under the CPU quota: a CI run's sweep there did not answer in 30 s. The
    host kills instead, pass after pass, and never asks the server."""
    if os.geteuid() != 0:
        pytest.skip("the host sweep needs root")
    with new_box("test-trust-unfrozen", ttl_s=300) as box:
        freezes: list[str] = []

        def unable_to_freeze(container_id: str) -> None:
            freezes.append(container_id)
            raise docker.errors.APIError("Cannot pause container: unable to freeze")

        monkeypatch.setattr(box.container.client.api, "pause", unable_to_freeze)
        asked_inside: list[float] = []
        monkeypatch.setattr(Channel, "kill_agent_processes",
                            lambda self, deadline: asked_inside.append(deadline) or (0, 0, 0))
        hogs = _load_host(60)
        try:
            bomb = box.exec(":(){ :|:& };:", timeout=5)
            time.sleep(3)
            after_bomb = box.exec("echo alive; ls -d /", timeout=60)
            assert bomb.pids_limit_hit or after_bomb.pids_limit_hit
            assert after_bomb.tail == b"alive\n/\n"
            assert freezes and not asked_inside
            left = box.run_as_pid("for f in /proc/[0-9]*/status; do grep -q '^Uid:[[:space:]]*1000[[:space:]]' $f "
                                  "2>/dev/null && ! grep -q '^State:[[:space:]]*Z' $f && echo $f; done; true",
                                  "the agent's processes", 30)
            # (at most pid's two waiting shells and the zygote they are forked from, of the agent's uid; a killed one
            # is a zombie until pid reaps it)
            assert left.count(b"\n") <= 3, left
        finally:
            for hog in hogs:
                os.killpg(hog.pid, signal.SIGKILL)
                hog.wait()


@not_pooled
def test_a_sweep_of_a_container_that_could_not_be_frozen_kills_nothing_outside_it(tmp_path):
    """Unfrozen, a process the sweep listed may end and its number go to another, even outside the container (here
    another user's process of the agent's uid, listed as a stale cgroup.procs would list it): only a process still
    in the container's cgroup is killed."""
    if os.geteuid() != 0:
        pytest.skip("the host sweep needs root")
    victim = subprocess.Popen(["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", "sleep", "100"])
    try:
        stale = tmp_path / "cgroup.procs"
        stale.write_text(f"{victim.pid}\n")
        for _ in range(100):   # (until setpriv has dropped to uid 1000: else the test would prove nothing)
            if processes._real_uid(victim.pid) == 1000:
                break
            time.sleep(0.05)
        assert processes._real_uid(victim.pid) == 1000
        killed: set[tuple[int, str]] = set()
        assert processes._kill_pass(str(stale), 1000, killed, set(), frozen=False) == 0 and not killed
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.skipif(RUNTIME != "runsc", reason="gVisor only (under runc the next tool call works: see above)")
@pytest.mark.timeout(900)   # (the engine can take minutes to remove a sandbox whose runtime spent thousands of tasks)
def test_under_gvisor_a_fork_bomb_ends_at_worst_its_own_sandbox():
    """Under gVisor the agent's processes are bounded by RLIMIT_NPROC (its kernel counts them per sandbox) and the
    host's cgroup bounds what the runtime spends on them. A fork bomb may make the runtime spend past that bound
    (GVISOR_FORK_BOMB): then the sandbox dies and the job fails saying so; else the next call works. Either way
    nothing is left of the container."""
    with new_box("test-trust-gvisor-bomb", ttl_s=300) as box:
        assert box.exec("ulimit -u", timeout=10).tail == b"512\n"
        cgroup = box.container.client.api.inspect_container(box.container.id)["HostConfig"]["PidsLimit"]
        assert cgroup == 512 * launch.HOST_TASKS_PER_GUEST_PROCESS + launch.RUNTIME_HOST_TASKS
        try:
            box.exec(":(){ :|:& };:", timeout=5)
            time.sleep(3)
            outcome = box.exec("echo alive", timeout=60).tail
        except SandboxLost:
            outcome = b"lost"
        assert outcome in (b"alive\n", b"lost"), outcome
        container_id = box.container.id
    # pid asked for its removal (close() returns even when the engine's answer is late); the engine may still be at
    # it, under gVisor's ptrace platform, for minutes: a request it times out does not stop it
    deadline = time.monotonic() + 420
    while True:
        try:
            box.container.client.containers.get(container_id)
        except docker.errors.NotFound:
            break
        except requests.exceptions.RequestException:
            pass   # (the engine holds the container's lock while it removes it)
        assert time.monotonic() < deadline, "the fork bomb's container is still there"
        time.sleep(1)


def _servers(box: DockerSandbox, role: bytes = b"agent") -> list[int]:
    """The host pids of pid's servers of one role's channels in a box (runc: the host sees them)."""
    cgroup = processes.cgroup_dir(box.container.init_pid() or 0, "pids")
    assert cgroup, "the container's cgroup is not on this host"
    procs = Path(cgroup, "cgroup.procs").read_text().split()
    servers = []
    for pid in procs:
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:3] == [b"/.pid/channel.sh", role]:
                servers.append(int(pid))
        except (OSError, IndexError):
            pass
    return servers


@pytest.mark.skipif(RUNTIME == "runsc", reason="the host sees only gVisor's own processes, not pid's servers in it")
def test_a_command_unreported_after_its_kill_ends_its_sandbox(monkeypatch):
    """A command still unreported after the SIGKILL of its group (under gVisor a fork bomb can outpace the kill; here
    its server is stopped from the host) is given as long again (and every process of the agent is killed, were any
    of its group left), then, still unreported, its container is removed: the call fails as SandboxLost and leaves
    nothing running."""
    monkeypatch.setattr(commands, "KILL_GRACE_S", 2.0)
    with new_box("test-trust-unkilled", ttl_s=300) as box:
        container_id = box.container.id
        servers = _servers(box)
        assert servers
        def stop_servers() -> None:
            for pid in servers:
                with contextlib.suppress(ProcessLookupError):   # (a slot shell that ran meanwhile is gone)
                    os.kill(pid, signal.SIGSTOP)
        stopper = threading.Timer(1.0, stop_servers)
        stopper.start()
        started = time.monotonic()
        with pytest.raises(SandboxLost, match="did not end after SIGKILL"):
            box.exec("sleep 120", timeout=3)
        assert time.monotonic() - started < 60
        stopper.join()
    with pytest.raises(docker.errors.NotFound):
        box.container.client.containers.get(container_id)


GVISOR_REFUSES_PTRACE = (
    "gVisor refuses the attack itself: its kernel applies Yama ptrace_scope 1 (its default; the agent can neither "
    "write /proc/sys/kernel/yama/ptrace_scope nor has CAP_SYS_PTRACE), under which a process may ptrace only its own "
    "descendants, and pid's waiting slot shells are children of a root process of pid's: PTRACE_ATTACH fails with "
    "EPERM (and /proc/N/mem with EACCES, process_vm_writev with ENOSYS). The runc host has no Yama: the attack is "
    "tested there")


# The agent's process that ptraces the helper pid's server runs as the agent after a command (linger's pid-scan) and
# never waits for it: the exited helper stays a zombie only its tracer can reap, and the server waits for it.
TRACER = r"""
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
held = [os.open("/dev/null", os.O_RDONLY) for _ in range(550)]   # (a slower scan: many descriptors to look at)
for _ in range(4):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
end = time.time() + 20
while time.time() < end:
    for p in os.listdir("/proc"):
        try:
            line = open(f"/proc/{p}/cmdline", "rb").read()
        except OSError:
            continue
        if b"pid-scan" in line and libc.ptrace(0x4206, int(p), None, None) == 0:   # PTRACE_SEIZE
            open("/tmp/traced", "w").write(p)
            time.sleep(300)
"""


@pytest.mark.skipif(RUNTIME == "runsc", reason=GVISOR_REFUSES_PTRACE)
def test_a_reply_the_agent_holds_up_after_its_command_ended_comes_once_its_processes_are_killed(monkeypatch):
    """A command ends, and a process of the agent's holds up its report (above). When the kill of its group and as
    long again did not bring it, every process of the agent is killed, and the call returns, timed out: the sandbox
    stays (before, with nothing left in the command's group, its container was removed and the job lost)."""
    monkeypatch.setattr(commands, "KILL_GRACE_S", 2.0)
    with new_box("test-trust-held", ttl_s=300) as box:
        box.write_file("/tmp/tracer.py", TRACER.encode())
        for _ in range(3):   # (the tracer must catch a helper that lives a few ms: on a loaded host it may not)
            result = box.exec("setsid -f python3 /tmp/tracer.py </dev/null >/dev/null 2>&1; sleep 2; "
                              "sleep 1 >/dev/null 2>&1 & echo ran", timeout=6)
            if box.exec("cat /tmp/traced", timeout=10).exit_code == 0:
                break
            assert not result.timed_out and result.tail == b"ran\n"   # (uncaught: it ends as any command does)
        else:
            pytest.fail("the tracer never caught the helper")
        assert result.timed_out and result.tail == b"ran\n"
        assert box.exec("echo next", timeout=10).tail == b"next\n"


@pytest.mark.skipif(RUNTIME == "runsc", reason="the host sees only gVisor's own processes, not pid's servers in it")
def test_a_script_of_pids_left_running_is_ended_before_the_next_control_request():
    """pid's control server killed while one of pid's scripts runs (the OOM killer can choose it): the script runs
    again on a new server, and only once its first run is killed. So is a script that outlived its time, before
    whatever pid asks next. Two runs at once of the script that writes the patch could leave a patch of neither."""
    with new_box("test-trust-orphan", ttl_s=300) as box:
        servers = _servers(box, b"control")
        assert servers
        killer = threading.Timer(1.0, lambda: [os.kill(pid, signal.SIGKILL) for pid in servers])
        killer.start()
        script = "echo start >>/.pid/runs; sleep 3; echo end >>/.pid/runs; cat /.pid/runs"
        assert box.run_as_pid(script, "a probe", 60) == b"start\nstart\nend\n"
        killer.join()
        time.sleep(3)   # (when the first run would have ended, had it not been killed)
        assert box.run_as_pid("cat /.pid/runs", "a look", 30) == b"start\nstart\nend\n"
        with pytest.raises(SandboxError, match="did not finish within 1s"):
            box.run_as_pid("rm /.pid/runs; " + script, "a slow probe", 1)
        box.run_as_pid("true", "the next request", 30)
        time.sleep(3)
        assert box.run_as_pid("cat /.pid/runs", "a look", 30) == b"start\n"


def test_an_output_made_terabytes_of_holes_is_counted_within_the_calls_time(box):
    """A command that seeks its own output 2 TiB ahead: the server counted every byte of it (`wc -l` over the holes),
    so the call outlived its timeout by minutes and a root `wc` ran on. The host cuts the front first, reading only
    the file's data."""
    started = time.monotonic()
    result = box.exec("printf 'a\\nb\\n'; head -c1 /dev/zero | dd bs=1 seek=2T 2>/dev/null; echo end", timeout=20)
    assert time.monotonic() - started < 20
    assert (result.exit_code, result.total_lines, result.tail[-4:]) == (0, 3, b"end\n")
    assert result.total_bytes > 2 << 40
    assert b" wc" not in box.exec("ps -eo args", timeout=10).tail


# -- 5. the agent cannot reach pid's machinery ------------------------------------------------------------------------
def test_pids_pipes_files_and_processes_are_out_of_the_agents_reach(box):
    result = box.exec(
        "cd /.pid/run 2>&1 | head -1; cd /.pid/git 2>&1 | head -1; "   # (cd, not ls: gVisor's ls fails its statx)
        "for f in /.pid/run/*; do echo x > $f; done 2>&1 | head -1; "
        "s=$(pgrep -f 'channel.sh control' | head -1); cat /proc/$s/environ 2>&1 | head -c 80; echo; "
        "cd /proc/$s/fd/ 2>&1 | head -1; (echo x >/proc/$s/fd/0) 2>&1 | head -1; (: </proc/$s/fd/1) 2>&1 | head -1; "
        "kill -STOP $s; echo kill=$?; kill -STOP 1; echo init=$?; kill -STOP $(pgrep -x sleep); echo ttl=$?",
        timeout=10)
    text = result.tail.decode()
    # run, git, FIFOs, the control server's environment and fds, its request and reply pipes; no signal to it, to
    # init or to the TTL's sleep. gVisor shows another uid's environment and lists its fds (pid's servers have the
    # agent's own environment), but it too refuses opening them.
    assert text.count("Permission denied") == (5 if RUNTIME == "runsc" else 7), text
    assert "kill=1" in text and "init=1" in text and "ttl=1" in text, text


def test_a_command_left_in_a_stopped_shells_pipe_never_reaches_pids_server():
    """The shells waiting for the agent's next command run as the agent, which can stop them: its next command then
    sits whole in the pipe, and the server drains the pipe before the next shell starts. That drain used to leave
    what it had read in bash's shared read buffer, so the next command's tail was read by the root server as
    requests (a `t` request read back /etc/shadow)."""
    with new_box("test-trust-drain", ttl_s=300) as box:
        forged = "t 0 300 ZZZ /etc/shadow\n" * 150      # (under a page: it goes into the FIFO itself)
        for _ in range(10):
            assert signalled(box.exec(signal_waiting_shells("STOP"), timeout=10).tail) >= 1
            box.exec(f": '\n{forged}'", timeout=1)           # its shell is stopped: it sits in the FIFO, drained
            for n in range(3):
                done = box.exec(f"echo in-step-{n}\n: '\n{forged}'", timeout=10)
                assert (done.exit_code, done.tail) == (0, f"in-step-{n}\n".encode())
        assert b"root:" not in box.exec("cat /etc/shadow 2>&1; echo", timeout=10).tail   # (still the agent's view)


@not_pooled
def test_a_job_is_root_free_by_default_and_root_on_request(run_pid, sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "id -u; grep CapEff /proc/self/status"}}]},
              {"text": "done"}]
    for user, expect in (("1000:1000", "1000\nCapEff:\t0000000000000000"), ("root", "0\nCapEff:")):
        with ScriptedLLM(script) as llm:
            res = run_pid("run", "who am i", "--repo", str(sample_repo), "--user", user,
                          *opts(llm, tmp_path / f"out-{user[:4]}"))
        assert res.code == 0 and res.json()["status"] == "completed", (res.stdout, res.stderr)
        seen = tool_results(llm.requests[1])[0]
        assert seen.startswith(expect), seen


# -- the kernel's surface: socket families, file handles, 32-bit x86 ---------------------------------------------------
SOCKET_PROBE = r"""
import ctypes, errno, socket
libc = ctypes.CDLL(None, use_errno=True)
def made(family, kind=socket.SOCK_STREAM):
    try:
        socket.socket(family, kind).close()
        return "made"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
seen = {name: made(family) for name, family in (("unix", 1), ("inet", 2), ("inet6", 10), ("vsock", 40),
                                                 ("alg", 38), ("bluetooth", 31), ("unspec", 0))}
seen["netlink"] = made(16, socket.SOCK_RAW)
seen["packet"] = made(17, socket.SOCK_RAW)
fd = libc.syscall(41, ctypes.c_long(0x100000028), 1, 0)   # socket(): AF_VSOCK with a high bit set
seen["vsock-high-bits"] = "made" if fd >= 0 else errno.errorcode[ctypes.get_errno()]
try:
    socket.socketpair(socket.AF_INET)
    seen["pair-inet"] = "made"
except OSError as exc:
    seen["pair-inet"] = errno.errorcode.get(exc.errno, str(exc.errno))
seen["pair-unix"] = "made" if socket.socketpair(socket.AF_UNIX) else "?"
print(" ".join("%s=%s" % item for item in sorted(seen.items())))
"""


def i386_program(code: bytes) -> bytes:
    """A static 32-bit x86 ELF executable of `code` alone."""
    import struct
    base, start = 0x08048000, 52 + 32
    header = struct.pack("<4s5B7xHHIIIIIHHHHHH", b"\x7fELF", 1, 1, 1, 0, 0, 2, 3, 1, base + start, 52, 0, 0, 52,
                         32, 1, 0, 0, 0)
    size = start + len(code)
    return header + struct.pack("<8I", 1, 0, base, base, size, size, 5, 0x1000) + code


# socketcall(SYS_SOCKET, {AF_VSOCK, SOCK_STREAM, 0}), then exit with minus its result (a socket: 256 - fd)
I386_VSOCK = bytes.fromhex("6a00" "6a01" "6a28" "89e1" "bb01000000" "b866000000" "cd80"
                           "f7d8" "89c3" "b801000000" "cd80")


NETWORK_PROBE = r"""
import errno, socket
print(sorted(name for _, name in socket.if_nameindex()), socket.gethostbyname("localhost"))
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen()
socket.create_connection(server.getsockname()).sendall(b"x"); print("loopback", server.accept()[0].recv(1))
for host in ("1.1.1.1", "172.17.0.1"):   # (the internet; the engine's default bridge, the host's side of it)
    try:
        socket.create_connection((host, 53), timeout=3); print("reached", host)
    except OSError as exc:
        print(host, errno.errorcode.get(exc.errno, exc))
"""


def test_no_network_is_a_loopback_alone_and_localhost_resolves(box):
    """--network none (the default): the agent's tests may serve and connect on localhost; nothing else is there.
    (Made by the runtime, not the engine's network library: see launch.ETC_HOSTS.)"""
    box.write_file("/tmp/net_probe.py", NETWORK_PROBE.encode())
    lines = box.exec("python3 /tmp/net_probe.py", timeout=30).tail.decode().splitlines()
    assert lines[:2] == ["['lo'] 127.0.0.1", "loopback b'x'"], lines
    assert [line.split()[1] for line in lines[2:]] in (["ENETUNREACH"] * 2, ["EHOSTUNREACH"] * 2), lines   # (gVisor)


def test_the_sandbox_makes_no_socket_of_a_family_it_does_not_need(box):
    """`--network none` left AF_VSOCK open: a socket to the hypervisor was made and a connect to the host answered.
    pid's seccomp profile lets a socket be only AF_UNIX, AF_INET, AF_INET6 or AF_NETLINK (and a pair only AF_UNIX):
    any other family fails with EAFNOSUPPORT, whatever the high bits of the argument. gVisor ignores the profile, but
    its kernel has none of those families to give (AF_PACKET needs CAP_NET_RAW, which no agent has)."""
    box.write_file("/tmp/sockets.py", SOCKET_PROBE.encode())
    result = box.exec("python3 /tmp/sockets.py", timeout=30)
    seen = dict(pair.split("=") for pair in result.tail.decode().split())
    assert all(seen[name] == "made" for name in ("unix", "inet", "inet6", "netlink", "pair-unix")), seen
    refused = {name: seen[name] for name in ("vsock", "vsock-high-bits", "alg", "bluetooth", "unspec", "packet")}
    assert refused == dict.fromkeys(refused, "EAFNOSUPPORT") or (
        RUNTIME == "runsc" and refused == {**dict.fromkeys(refused, "EAFNOSUPPORT"), "packet": "EPERM"}), seen
    assert seen["pair-inet"] == "EAFNOSUPPORT" or RUNTIME == "runsc" and seen["pair-inet"] != "made", seen


# clone(CLONE_PARENT | SIGCHLD), argv[1] times, each child ending at once: made and refused (EPERM) counted.
CLONE_PARENT_PROBE = r"""
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
made = refused = 0
for _ in range(int(sys.argv[1])):
    pid = libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    made += pid > 0
    refused += pid < 0 and ctypes.get_errno() == errno.EPERM
print("made", made, "refused", refused)
"""
# Seen as root: how many zombies wait on pid's drop (the root process that forks the slot shells).
DROPS_ZOMBIES = r"""
import os
seen = {}
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        fields = open("/proc/%s/stat" % p).read().rsplit(") ", 1)[1].split()
        seen[p] = (fields[0], fields[1], open("/proc/%s/cmdline" % p, "rb").read())
    except OSError:
        pass
drops = {p for p, (_, _, command) in seen.items() if command.startswith(b"/.pid/drop\0")}
print(len(drops), sum(state == "Z" and parent in drops for state, parent, _ in seen.values()))
"""


# Run by a command's shell with its parent's pid: what the agent can do to the zygote its shells are forked from.
ZYGOTE_PROBE = r"""
import ctypes, errno, os, sys
zygote = int(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
status = open("/proc/%d/status" % zygote).read()
uid = [line.split()[1] for line in status.splitlines() if line.startswith("Uid:")][0]
refused = []
for name in ("environ", "mem", "maps"):
    try:
        open("/proc/%d/%s" % (zygote, name), "rb").read(1)
    except PermissionError:
        refused.append(name)
traced = libc.ptrace(16, zygote, None, None)   # PTRACE_ATTACH
print(uid, b"zygote.so" in open("/proc/%d/cmdline" % zygote, "rb").read(), ",".join(refused),
      traced == -1 and ctypes.get_errno() == errno.EPERM)
"""
PARENT = 'z=$(cut -d" " -f4 /proc/$$/stat); '   # a command's shell's parent: with pid's drop, its zygote (drop.c)


def test_the_bash_the_shells_are_forked_from_is_out_of_the_agents_reach_and_replaced_when_it_goes():
    """A command's shell is forked from a bash of the agent's own uid that never ran a command (pid's drop's
    zygote): a process of its own ($$, RANDOM), whose zygote the agent can neither trace nor read (not dumpable); it
    may stop or kill it (that command then ends as killed), and every later command still runs, once, in a shell of
    its own."""
    box = new_box("test-trust-zygote")
    try:
        box.write_file("/tmp/zygote.py", ZYGOTE_PROBE.encode())
        for _ in range(5):   # (a shell the drop forked itself, as it does when its zygote just went, has the drop
            seen = box.exec(PARENT + "python3 /tmp/zygote.py $z; echo $$ $BASHPID $RANDOM $z", timeout=30).tail.split()
            if seen[1:2] == [b"True"]:   # for its parent: the next one comes from a new zygote)
                break
        # (gVisor lets its own uid read a process's environment and map even so: the agent's own, as in its shells)
        read_refused = b"mem" if RUNTIME == "runsc" else b"environ,mem,maps"
        listing = as_root(box, "ps", "-eo", "pid,ppid,uid,stat,args")   # (what the shell's parent was, if not)
        assert seen[:4] == [b"1000", b"True", read_refused, b"True"] and seen[4] == seen[5], (seen, listing)
        again = box.exec(PARENT + "echo $$ $BASHPID $RANDOM $z", timeout=10).tail.split()
        assert again[0] == again[1] and again[0] != seen[4] and again[2] != seen[6]   # (either channel's zygote)
        zygotes = {seen[7], again[3]}
        for sig in ("STOP", "KILL", "STOP"):
            gone = box.exec(PARENT + f"kill -{sig} $z; echo $z >>/tmp/zygotes", timeout=10)
            assert gone.exit_code == 128 + signal.SIGKILL, gone   # (its shell's end went with the zygote)
            for i in range(3):
                done = box.exec(PARENT + f"echo {sig}{i} >>/tmp/runs; echo $$ $z", timeout=10)
                assert done.exit_code == 0 and len(done.tail.split()) == 2, done
                zygotes.add(done.tail.split()[1])
        assert box.read_file("/tmp/runs").split() == [f"{s}{i}".encode() for s in ("STOP", "KILL", "STOP")
                                                      for i in range(3)]
        assert len(zygotes) >= 2, zygotes   # replaced ones among them (which channel a call takes varies: two)
    finally:
        box.close()


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe calls clone by its x86-64 number")
def test_a_command_leaves_no_child_to_pids_own_processes(box):
    """A child made with CLONE_PARENT is its maker's sibling: made by a command's own shell, it is a child of pid's
    root drop, which reaps only the shells it made, so each such child, once dead, held a place in the process table
    for the container's life (a review made 501 and filled it). pid's seccomp profile refuses the flag; gVisor, which
    does not apply the profile, leaves no such child to the drop either."""
    box.write_file("/tmp/clone_parent.py", CLONE_PARENT_PROBE.encode())
    # (this module's box is shared: a waiting shell another test killed is the drop's zombie until its slot is used)
    _, before = map(int, as_root(box, "python3", "-c", DROPS_ZOMBIES).split())
    result = box.exec("exec python3 /tmp/clone_parent.py 50", timeout=30)   # (exec: the shell's own process clones)
    assert result.exit_code == 0 and (RUNTIME == "runsc" or result.tail == b"made 0 refused 50\n"), result.tail
    time.sleep(0.5)
    drops, zombies = map(int, as_root(box, "python3", "-c", DROPS_ZOMBIES).split())
    assert drops >= 1 and zombies <= before, (drops, before, zombies)
    assert box.exec("echo after", timeout=10).tail == b"after\n"


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="a 32-bit x86 program needs an x86-64 host")
def test_a_32_bit_x86_program_cannot_get_past_the_socket_families(box):
    """32-bit x86 makes sockets through socketcall(2), whose arguments seccomp cannot see: there the family filter
    cannot hold, so pid's profile has no 32-bit x86 ABI at all: such a program is killed at its first system call
    (SIGSYS). gVisor does not run 32-bit programs."""
    box.write_file("/tmp/i386-vsock", i386_program(I386_VSOCK))
    result = box.exec("chmod +x /tmp/i386-vsock && /tmp/i386-vsock; echo rc=$?", timeout=30)
    assert result.tail.endswith(b"rc=126\n" if RUNTIME == "runsc" else b"rc=159\n"), result.tail


def test_a_root_agent_cannot_open_files_by_handle(root_box):
    """pid's machinery holds CAP_DAC_READ_SEARCH (git reads every file), and a root agent shares it: Docker's default
    profile then allows open_by_handle_at, which opens a file by its inode number anywhere on a mount's filesystem,
    past the container's view ("shocker"). pid's profile refuses it; name_to_handle_at still works."""
    probe = ("import ctypes, os\n"
             "libc = ctypes.CDLL(None, use_errno=True)\n"
             "handle, mount = ctypes.create_string_buffer(8 + 128), ctypes.c_int()\n"
             "ctypes.memmove(handle, (128).to_bytes(4, 'little'), 4)\n"
             "named = libc.name_to_handle_at(-100, b'/etc/hostname', handle, ctypes.byref(mount), 0)\n"
             "print('named', named, 'errno', ctypes.get_errno())\n"
             "fd = os.open('/etc/hostname', os.O_RDONLY)\n"
             "opened = libc.open_by_handle_at(fd, handle, os.O_RDONLY)\n"
             "print('opened', opened, 'errno', ctypes.get_errno())\n")
    root_box.write_file("/tmp/handles.py", probe.encode())
    words = root_box.exec("python3 /tmp/handles.py", timeout=30).tail.split()
    seen = {key.decode(): int(value) for key, value in zip(words[::4], words[1::4])}
    errors = {key.decode(): int(value) for key, value in zip(words[::4], words[3::4])}
    if RUNTIME == "runsc":   # (gVisor has no file handles at all)
        assert seen["opened"] == -1, words
        return
    assert seen["named"] == 0 and (seen["opened"], errors["opened"]) == (-1, 1), words   # EPERM


def test_a_kill_of_a_group_that_is_gone_never_reaches_a_process_not_the_agents(box):
    """pid kills a command by its process group. With no such group it kills the process of that number (a leader
    that moved to another group), but only the agent's: the number may since have gone to a process of pid's (an
    agent can cycle numbers on purpose). Here a root process that leads no group stands for one."""
    engine = box.container.client.containers.get(box.container.id)
    started = engine.exec_run(["sh", "-c", "sleep 4747 & wait"], user="root", detach=True)
    assert started.exit_code is None
    for _ in range(100):
        found = engine.exec_run(["pgrep", "-x", "-f", "sleep 4747"], user="root").output.split()
        if found:
            break
        time.sleep(0.05)
    pid = int(found[0])
    leader = engine.exec_run(["ps", "-o", "pgid=", "-p", str(pid)], user="root").output.strip()
    assert int(leader) != pid   # (it leads no group: `kill -9 -<pid>` finds none)
    assert box.processes.kill_group(pid) is False
    assert engine.exec_run(["kill", "-0", str(pid)], user="root").exit_code == 0   # alive
    engine.exec_run(["kill", "-9", str(pid)], user="root")
    # and the agent's own process that leads no group is killed by its number
    agents = box.exec("sleep 4848 >/dev/null 2>&1 & echo $!", timeout=10)
    # (started by the command's shell: in its group, which it does not lead)
    agent_pid = int(agents.tail)
    assert box.processes.kill_group(agent_pid) is True
    for _ in range(50):   # (dead, or a zombie until the container's init reaps it; a loaded host takes a moment)
        state = box.exec(f"cut -d' ' -f3 /proc/{agent_pid}/stat 2>/dev/null || echo gone", timeout=10).tail
        if state in (b"gone\n", b"Z\n"):
            break
        time.sleep(0.1)
    assert state in (b"gone\n", b"Z\n"), state


# -- 2. a job that never ends ---------------------------------------------------------------------------------------
@pytest.mark.long
@not_pooled
def test_frozen_servers_cannot_keep_a_job_past_its_wall_clock(run_pid, sample_repo, tmp_path):
    freeze = "(sleep 1; pkill -STOP -f channel.sh; pkill -STOP -x sleep) >/dev/null 2>&1 & echo armed"
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": freeze}}]},
              {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 3"}}]},
              {"tool_calls": [{"name": "write", "arguments": {"path": "stuck.txt", "content": "x" * 100000}}]},
              {"text": "never"}]
    with ScriptedLLM(script) as llm:
        started, began = time.monotonic(), time.time()
        res = run_pid("run", "freeze", "--repo", str(sample_repo), "--user", "root", "--timeout", "20",
                      *opts(llm, tmp_path / "out"), timeout=200)
        took = time.monotonic() - started
        asked = list(llm.arrived)
    result = res.json()
    assert len(asked) == 2, asked   # `sleep 3` never came back...
    assert began + 20 - asked[1] > 4, "the wall clock came before the servers froze (a machine too slow)"   # ...held
    # longer than it runs: the servers froze
    assert took < 90, took
    assert res.code == 3 and result["status"] == "limit" and result["exit_reason"] == "wall_clock", result
    assert (tmp_path / "out" / result["id"] / "result.json").exists()


@not_pooled
def test_a_default_agent_cannot_freeze_pid(run_pid, sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {
        "command": "pkill -STOP -f channel.sh; echo rc=$?; pkill -STOP -x sleep; echo rc=$?"}}]},
              {"tool_calls": [{"name": "write", "arguments": {"path": "fine.txt", "content": "fine\n"}}]},
              {"text": "done"}]
    with ScriptedLLM(script) as llm:
        res = run_pid("run", "freeze", "--repo", str(sample_repo), *opts(llm, tmp_path / "out"), timeout=120)
        seen = tool_results(llm.requests[1])[0]
        assert seen.count("Operation not permitted") >= 3 and seen.count("rc=1") == 2, seen
    result = res.json()
    assert res.code == 0 and result["status"] == "completed", result
    assert "+fine" in (tmp_path / "out" / result["id"] / "patch.diff").read_text()


# The agent may ptrace its own processes, pid's waiting slot shells among them (they run as the agent): this script,
# run by the agent, makes every other shell of its channel's server that waits for a command run one system call
# (where the kernel lets it: gVisor's does not, see GVISOR_REFUSES_PTRACE).
PTRACE_INJECT = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
NAMES = "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss fs_base gs_base"
class Regs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in (NAMES + " ds es fs gs").split()]
def ptrace(request, pid, data=None):
    if libc.ptrace(request, pid, None, data) < 0:
        raise OSError(ctypes.get_errno(), "ptrace %d" % request)
def inject(pid, number, *args):   # one system call in a process blocked in read(): it reads on afterwards
    ptrace(16, pid)                                              # PTRACE_ATTACH
    os.waitpid(pid, 0x40000000)
    saved, regs = Regs(), Regs()
    ptrace(12, pid, ctypes.byref(saved))                          # PTRACE_GETREGS
    if (saved.orig_rax, saved.rdi, saved.rax) != (0, 3, 2 ** 64 - 512):   # not stopped in read(3) (-ERESTARTSYS)
        ptrace(17, pid)                                           # (not yet: it goes on, untouched)
        return None
    ctypes.pointer(regs)[0] = saved
    regs.rax, regs.orig_rax, regs.rip = number, 2 ** 64 - 1, saved.rip - 2   # back onto its `syscall` instruction
    for name, value in zip(("rdi", "rsi", "rdx"), args):
        setattr(regs, name, value)
    ptrace(13, pid, ctypes.byref(regs))                           # PTRACE_SETREGS
    ptrace(9, pid)                                                # PTRACE_SINGLESTEP
    os.waitpid(pid, 0x40000000)
    ptrace(12, pid, ctypes.byref(regs))
    # its read restarted by hand, back onto the `syscall`: gVisor decides a restart once, as the task resumes (here
    # for the injected call), and would hand -ERESTARTSYS, restored, to bash's read, which would end the shell
    saved.rax, saved.orig_rax, saved.rip = saved.orig_rax, 2 ** 64 - 1, saved.rip - 2
    ptrace(13, pid, ctypes.byref(saved))
    ptrace(17, pid)                                               # PTRACE_DETACH
    return regs.rax
me, mark = int(sys.argv[1]), sys.argv[2].encode()
server = open("/proc/%d/stat" % me).read().rsplit(") ", 1)[1].split()[1]
done = refused = 0
for attempt in range(300):   # (the other slot's shell may not be waiting yet: it is started after the last command)
    for entry in os.listdir("/proc"):
        try:
            waiting = mark in open("/proc/%s/cmdline" % entry, "rb").read()
            child = open("/proc/%s/stat" % entry).read().rsplit(") ", 1)[1].split()[1] == server
        except OSError:
            continue
        if entry.isdigit() and int(entry) != me and waiting and child:
            for _ in range(100):   # (a shell just started may still be root's setpriv, or not blocked in its read)
                try:
                    try:
                        blocked = open("/proc/%s/syscall" % entry).read().startswith("0 0x3 ")   # read(3): `-u 3`
                    except FileNotFoundError:   # (gVisor has no /proc/N/syscall: asleep; inject checks the registers)
                        blocked = open("/proc/%s/stat" % entry).read().rsplit(") ", 1)[1].startswith("S ")
                    ours = "\nUid:\t%d\t" % os.getuid() in open("/proc/%s/status" % entry).read()
                except OSError:
                    break
                if blocked and ours:
                    try:
                        injected = inject(int(entry), *map(int, sys.argv[3:]))
                    except PermissionError:   # the attach refused (gVisor's Yama: see GVISOR_REFUSES_PTRACE)
                        refused += 1
                        break
                    if injected is not None:
                        done += 1
                        break
                time.sleep(0.01)
    if done or refused:
        break
    time.sleep(0.01)
try:
    scope = open("/proc/sys/kernel/yama/ptrace_scope").read().strip()
except OSError:
    scope = "-"
writable = int(os.access("/proc/sys/kernel/yama/ptrace_scope", os.W_OK))
print("refused", refused, "yama", scope, "writable", writable, "injected", done)
"""
DUP2, FCNTL, F_SETPIPE_SZ = 33, 72, 1031   # x86-64 system call numbers
ptraced = pytest.mark.skipif(os.uname().machine != "x86_64", reason="the injector speaks x86-64 only")


def inject(box: DockerSandbox, *syscall: int) -> None:
    box.write_file("/tmp/inject.py", PTRACE_INJECT.encode())
    result = box.exec(f"python3 /tmp/inject.py $$ {shlex.quote(WAITING_SHELL_MARK)} {' '.join(map(str, syscall))}",
                      timeout=30)
    words = result.tail.split()
    report = dict(zip(words[::2], words[1::2]))
    if (RUNTIME == "runsc" and result.exit_code == 0 and report.get(b"injected") == b"0"
            and report.get(b"refused", b"0") != b"0" and report.get(b"yama") == b"1"
            and report.get(b"writable") == b"0"):
        pytest.skip(GVISOR_REFUSES_PTRACE)   # (refused, as the injector found: not merely nothing injected)
    assert result.exit_code == 0 and int(words[-1]) >= 1, result.tail


def test_the_agents_command_holds_no_descriptor_of_pids_fifos():
    """A slot shell reads its command from a FIFO of pid's (fd 3, opened as root) and closes it before the command
    runs: a command that kept it could read the next command sent to that slot, which then would not run."""
    with new_box("test-trust-fds", ttl_s=300) as box:
        listing = "for f in /proc/$$/fd/*; do readlink \"$f\"; done; true"   # (the glob's own fd is gone by then)
        for command in (listing, listing + "\n#" + "p" * 5000):   # (a short one straight, a long one via a file)
            result = box.exec(command, timeout=20)
            targets = result.tail.decode().split()
            assert result.exit_code == 0 and any(t.startswith("/.pid/out/") for t in targets), result
            assert not [t for t in targets if t.startswith("/.pid/run") or t.startswith("pipe:")], targets


@ptraced
def test_a_waiting_shells_descriptor_cannot_write_its_pipe_or_change_the_servers_reads():
    """A waiting shell's command descriptor, duplicated by ptrace for the agent's next command, used to be the
    server's own read-write open of the FIFO: the command could write bytes of its own there and kill its shell, and
    the server, finding the shell dead with bytes left, ran the command again; and O_NONBLOCK set on it made later
    shells fail their reads. Each shell now opens its FIFO anew, read-only."""
    with new_box("test-trust-ptrace", ttl_s=300) as box:
        for i in range(3):
            inject(box, DUP2, 3, 9)
            pad = "\n#" + "p" * 3800   # (a long command: the server takes longer to read it)
            result = box.exec(f"echo run >>/tmp/count{i}; printf J >&9; echo wrote=$?; kill -9 $${pad}", timeout=20)
            assert b"wrote=1" in result.tail, result.tail
            assert box.read_file(f"/tmp/count{i}") == b"run\n"
        inject(box, DUP2, 3, 9)
        result = box.exec("python3 -c 'import fcntl, os; fcntl.fcntl(9, fcntl.F_SETFL, os.O_NONBLOCK)'; echo set=$?",
                          timeout=20)
        assert result.tail == b"set=0\n"
        for n in range(6):
            done = box.exec(f"echo in-step-{n}", timeout=10)
            assert (done.exit_code, done.tail) == (0, f"in-step-{n}\n".encode())


@ptraced
def test_a_shrunk_pipe_and_a_stopped_shell_cannot_hang_pids_server():
    """The agent can shrink a waiting shell's FIFO to one page (F_SETPIPE_SZ) and stop the shell: the server's write
    of a longer command into it blocked for good. Now a FIFO never gets more than a page: a longer command goes
    through a file."""
    with new_box("test-trust-pipesize", ttl_s=300) as box:
        long = ": '" + "A" * 10000 + "'; "
        inject(box, FCNTL, 3, F_SETPIPE_SZ, 4096)
        done = box.exec(long + "echo long", timeout=20)     # a shrunk pipe alone: the command runs
        assert (done.exit_code, done.tail) == (0, b"long\n")
        for i in range(2):
            inject(box, FCNTL, 3, F_SETPIPE_SZ, 4096)
            assert signalled(box.exec(signal_waiting_shells("STOP"), timeout=10).tail) >= 1
            stopped = box.exec(long + "echo never", timeout=20)   # its shell is stopped: ended, 128 + SIGSTOP
            assert (stopped.exit_code, stopped.tail, stopped.timed_out) == (147, b"", False)
            done = box.exec(long + f"echo next{i}", timeout=20)
            assert (done.exit_code, done.tail) == (0, f"next{i}\n".encode())


# The agent's tracer that never lets go: it PTRACE_ATTACHes (the tracee stops) and never waits, so a shell it holds
# stays stopped, and once killed stays a zombie its parent (pid's server) cannot reap. argv: seconds to live, then
# "waiting" (every waiting slot shell of the agent's, as they come) or one process id.
PTRACE_HOLD = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
mark, held, end = sys.argv[3].encode(), set(), time.time() + float(sys.argv[1])
def hold(pid):
    if libc.ptrace(16, pid, None, None) == 0:                     # PTRACE_ATTACH
        held.add(pid)
        print("attached", pid, flush=True)
    elif ctypes.get_errno() == 1:                                 # EPERM: see GVISOR_REFUSES_PTRACE
        print("refused", pid, flush=True)
        sys.exit(0)
def waiting(entry):
    if mark not in open("/proc/%s/cmdline" % entry, "rb").read() or os.stat("/proc/" + entry).st_uid != os.getuid():
        return False
    try:
        return open("/proc/%s/syscall" % entry).read().startswith("0 0x3 ")   # blocked in read(3): its `-u 3`
    except FileNotFoundError:   # (gVisor has no /proc/N/syscall)
        return open("/proc/%s/stat" % entry).read().rsplit(") ", 1)[1].startswith("S ")
if sys.argv[2] != "waiting":
    hold(int(sys.argv[2]))
while time.time() < end:
    for entry in os.listdir("/proc"):
        try:
            if (sys.argv[2] == "waiting" and entry.isdigit() and int(entry) not in held | {os.getpid()}
                    and waiting(entry)):   # (not itself: the mark is in its arguments, and it reads on fd 3 too)
                hold(int(entry))
        except OSError:
            pass
    time.sleep(0.01)
"""
# Seen as root from outside pid's channels (docker exec): the agent's waiting slot shells, how many of them are
# stopped by a tracer, the agent's zombies, and its tracers still alive. (Not the drop's zygote: the agent's too,
# with the same command line, it forks the shells: its parent is the drop.)
PTRACE_OBSERVE = r"""
import os, sys
mark, seen = sys.argv[1].encode(), dict(waiting=0, traced=0, zombies=0, holders=0)
for entry in filter(str.isdigit, os.listdir("/proc")):
    try:
        command = open("/proc/%s/cmdline" % entry, "rb").read()
        state, parent = open("/proc/%s/stat" % entry).read().rsplit(") ", 1)[1].split()[:2]
        if os.stat("/proc/" + entry).st_uid != 1000 or command.endswith(b"zygote.so\0") and open(
                "/proc/%s/cmdline" % parent, "rb").read().startswith(b"/.pid/drop\0"):
            continue
    except OSError:
        continue
    if state == "Z":
        seen["zombies"] += 1
    elif b"hold.py" in command:
        seen["holders"] += 1
    elif mark in command:
        seen["waiting"] += 1
        seen["traced"] += state == "t"
print(" ".join("%s %d" % item for item in sorted(seen.items())))
"""


def as_root(box: DockerSandbox, *argv: str) -> bytes:
    """A command's output, run as root beside pid's channels (the agent's tracer may hold their shells)."""
    return box.container.client.containers.get(box.container.id).exec_run(list(argv), user="root").output


def observe(box: DockerSandbox) -> dict[str, int]:
    found = as_root(box, "python3", "-c", PTRACE_OBSERVE, WAITING_SHELL_MARK).split()
    return {key.decode(): int(value) for key, value in zip(found[::2], found[1::2])}


def observe_until(box: DockerSandbox, done, what: str) -> dict[str, int]:
    for _ in range(300):
        seen = observe(box)
        if done(seen):
            return seen
        time.sleep(0.1)
    raise AssertionError(f"{what}: never seen ({seen})")


def past_stopped(box: DockerSandbox, command: str, timeout: float):
    """The agent's command on the first of its shells that is not stopped. The other shells a killed tracer held are
    let go stopped (its SIGSTOP is delivered then): a command given to one ends at once with 147, as on any waiting
    shell the agent stopped."""
    for _ in range(8):
        done = box.exec(command, timeout=timeout)
        if (done.exit_code, done.tail) != (147, b""):
            return done
    raise AssertionError(f"every shell was stopped: {command}")


@ptraced
def test_the_agents_tracer_holding_pids_shells_costs_no_call_more_than_its_timeout():
    """The agent may ptrace its own processes, pid's waiting slot shells among them. A tracer that stops them and
    never waits used to make every later call wait its timeout plus 10 s, fail, and leave zombies (held by the tracer)
    in the process table. A waiting shell stopped by a tracer is now replaced before it gets a command, and its tracer
    killed; a command's shell stopped so mid-command ends at its timeout, and the tracer with it."""
    with new_box("test-trust-tracer", ttl_s=300) as box:
        box.write_file("/tmp/hold.py", PTRACE_HOLD.encode())
        mark = shlex.quote(WAITING_SHELL_MARK)
        for n in range(2):
            hold = f"setsid python3 /tmp/hold.py 120 waiting {mark} </dev/null >/tmp/hold{n} 2>&1 &"
            started = past_stopped(box, hold, timeout=10)
            assert started.exit_code == 0, started
            observe_until(box, lambda seen: seen["waiting"] >= 2 and seen["traced"] == seen["waiting"]
                          or as_root(box, "cat", f"/tmp/hold{n}").startswith(b"refused"), "every waiting shell held")
            if as_root(box, "cat", f"/tmp/hold{n}").startswith(b"refused"):
                assert RUNTIME == "runsc"
                pytest.skip(GVISOR_REFUSES_PTRACE)
            done = box.exec(f"echo after-{n}", timeout=5)
            assert (done.exit_code, done.tail, done.timed_out) == (0, f"after-{n}\n".encode(), False)
            observe_until(box, lambda seen: seen["holders"] == seen["zombies"] == 0, "the tracer gone, no zombie")
        held = past_stopped(box, f"setsid python3 /tmp/hold.py 120 $$ {mark} </dev/null >/tmp/hold-mid 2>&1 & sleep 60",
                            timeout=3)
        assert held.timed_out and as_root(box, "cat", "/tmp/hold-mid").startswith(b"attached"), held
        observe_until(box, lambda seen: seen["holders"] == seen["zombies"] == 0, "the tracer gone, no zombie")
        for n in range(3):
            done = past_stopped(box, f"echo next-{n}", timeout=5)
            assert (done.exit_code, done.tail, done.timed_out) == (0, f"next-{n}\n".encode(), False)


# -- 6. a job that lies -----------------------------------------------------------------------------------------------
@not_pooled
def test_a_container_removed_mid_job_fails_the_job(run_pid, pid_env, sample_repo, tmp_path):
    """...and what the agent had done is not lost with it: a fresh container on the job's disks makes the patch."""
    command = f"echo done-before > made.txt; touch {gate.REACHED}; sleep 60"
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}, {"text": "all good, honest"}]
    client = docker.from_env()
    from pid.sandbox.reaper import owner_label
    owner = owner_label(pid_env["PID_HOME"])

    def remove_when_running() -> None:   # (once the command has written its file: not a fixed time after the start,
        deadline = time.time() + 60      # which a loaded gVisor host once outran)
        while time.time() < deadline:
            for box in client.containers.list(filters={"label": f"pid.owner={owner}"}):
                with contextlib.suppress(docker.errors.APIError):
                    if box.exec_run(["test", "-e", gate.REACHED], user="root").exit_code == 0:
                        box.remove(force=True)
                        return
            time.sleep(0.2)

    remover = threading.Thread(target=remove_when_running)
    with ScriptedLLM(script) as llm:
        remover.start()
        res = run_pid("run", "t", "--repo", str(sample_repo), *opts(llm, tmp_path / "out"), timeout=150)
        remover.join()
    result = res.json()
    assert res.code == 1 and result["status"] == "failed" and result["exit_reason"] == "sandbox_error", result
    assert "gone" in result["error"], result["error"]
    # Not at the command's timeout (120 s, the bash tool's default): under gVisor a removed container's exec stream
    # stays open, and only the engine, asked while the command runs, says the container is gone.
    assert result["duration_s"] < 100, result
    assert result["artifacts"].get("patch") == "patch.diff", result["artifacts"]
    assert "+done-before" in (tmp_path / "out" / result["id"] / "patch.diff").read_text()
    assert not client.containers.list(all=True, filters={"label": f"pid.job={result['id']}"})


@not_pooled
def test_a_forged_git_and_hostile_git_state_leave_the_real_change(run_pid, sample_repo, tmp_path):
    attack = (
        "mkdir -p ~/bin && printf '#!/bin/sh\\necho forged\\n' > ~/bin/git && chmod +x ~/bin/git; "
        "printf '#!/bin/sh\\necho forged\\n' > /usr/local/bin/git; "
        "git config core.fsmonitor 'touch /tmp/pwned'; git config filter.slow.clean 'sleep 900'; "
        "echo '* filter=slow' > .gitattributes; mkdir -p .git/hooks; "
        "echo 'touch /tmp/pwned' > .git/hooks/post-checkout; "
        "chmod +x .git/hooks/post-checkout; for f in /.pid/run/*; do echo 'x 1 n - rm -rf /workspace' > $f; done; "
        "echo 'print(\"fixed\")' > hello.py; echo done")
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": attack}}]}, {"text": "fixed"}]
    with ScriptedLLM(script) as llm:
        started = time.monotonic()
        res = run_pid("run", "t", "--repo", str(sample_repo), *opts(llm, tmp_path / "out"), timeout=120)
        took = time.monotonic() - started
    result = res.json()
    assert res.code == 0 and result["status"] == "completed", result
    assert took < 60, took                                # the filter's `sleep 900` never ran
    patch = (tmp_path / "out" / result["id"] / "patch.diff").read_text()
    assert '+print("fixed")' in patch and "+* filter=slow" in patch
    headers = [line for line in patch.splitlines() if line.startswith(("diff --git", "--- ", "+++ "))]
    assert not any(".git/" in line or ".." in line for line in headers), headers
    copy = tmp_path / "apply"
    subprocess.run(["cp", "-r", str(sample_repo), str(copy)], check=True)
    subprocess.run(["git", "-C", str(copy), "apply", str(tmp_path / "out" / result["id"] / "patch.diff")], check=True)
    assert (copy / "hello.py").read_text() == 'print("fixed")\n'


# -- 8, 9. unbounded and hostile artifacts ----------------------------------------------------------------------------
@not_pooled
def test_oversized_and_hostile_artifacts_are_refused_and_listed(run_pid, sample_repo, tmp_path):
    make = ("head -c 3000000 /dev/urandom > blob.bin; mkdir -p evil out/many && "
            "printf 'evil' > \"evil/$(printf 'name\\033]0;pwned\\007\\nx')\" && cd out && ln -s /etc/passwd link && "
            "for i in $(seq 1 50); do echo $i > many/$i; done && echo ok")
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": make}}]}, {"text": "made"}]
    with ScriptedLLM(script) as llm:
        res = run_pid("run", "t", "--repo", str(sample_repo),
                      "--file", "evil", "--file", "out", "--file", "missing.txt",
                      "--max-patch", "1m", "--max-files", "20", *opts(llm, tmp_path / "out"), timeout=120)
    result = res.json()
    job = tmp_path / "out" / result["id"]
    # a new file over the patch's limit alone is left out of it, and said; the rest of the patch is delivered
    assert res.code == 0 and result["status"] == "completed", result
    assert "blob.bin" not in (job / "patch.diff").read_text(errors="replace")
    assert "b/out/many/7" in (job / "patch.diff").read_text()
    refused = {(r["path"], r["reason"]) for r in result["artifacts"]["refused"]}
    assert ("blob.bin", "a new file whose diff alone is over the 1 MB limit (--max-patch): left out, the rest of the "
                        "patch kept") in refused, refused
    assert ("missing.txt", "not found") in refused
    assert any("symlink" in reason for _, reason in refused)
    assert any("control character" in reason and "\\x1b" in path for path, reason in refused), refused
    assert any("entry limit" in reason for _, reason in refused), refused
    assert len(result["artifacts"]["files"]) == 20           # entries the limit allowed, directories included
    written = [p for p in (job / "files").rglob("*")]
    assert not any(p.is_symlink() for p in written)
    assert not any("\x1b" in p.name or "\n" in p.name for p in written)
    json.dumps(result)   # every reason is printable, plain JSON


# -- 7. time outside the wall clock -----------------------------------------------------------------------------------
@not_pooled
def test_collection_that_outruns_its_deadline_fails_the_job(sample_repo, tmp_path, monkeypatch):
    """Artifacts are collected under their own deadline: a patch that takes too long (here: git compressing 300 MB
    of random data against a 2 s deadline) removes the container and fails the job instead of stretching it."""
    import pid.worker.job_collect
    import pid.worker.runner as runner
    from pid.jobs.spec import JobSpec
    monkeypatch.setattr(pid.worker.job_collect, "COLLECT_TIMEOUT_S", 2.0)
    script = [{"tool_calls": [{"name": "bash", "arguments": {
        "command": "head -c 300M /dev/urandom > big.bin && echo made"}}]}, {"text": "done"}]
    with ScriptedLLM(script) as llm:
        spec = JobSpec(task="t", repo=str(sample_repo), model="scripted", out_dir=str(tmp_path / "out"),
                       base_url=llm.base_url)
        started = time.monotonic()
        result = runner.run_job(spec)
        took = time.monotonic() - started
    assert result["status"] == "failed" and result["exit_reason"] == "artifact_error", result
    assert "ran out of time" in result["error"] and took < 60, (result, took)
    assert json.loads((tmp_path / "out" / spec.id / "result.json").read_text())["exit_reason"] == "artifact_error"


@not_pooled
def test_a_file_name_that_is_not_utf8_is_collected_and_listed_escaped(run_pid, worker, sample_repo, tmp_path):
    """A --file directory holding `bad\\377name` used to crash the end of the job (result.json could not be written,
    a worker's artifacts never reached the store). The name stays bytes on disk and is shown escaped."""
    make = "mkdir -p out && printf x > \"out/$(printf 'bad\\377name')\" && printf y > out/ok.txt"
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": make}}]}, {"text": "made"}]
    for how in ("run", "submit"):
        with ScriptedLLM(script) as llm:
            res = run_pid(how, "t", "--repo", str(sample_repo), "--file", "out", *opts(llm, tmp_path / how),
                          *(["--wait"] if how == "submit" else []), timeout=120)
        result = res.json()
        assert (res.code, result["status"]) == (0, "completed"), (res.stdout, res.stderr)
        files = tmp_path / how / result["id"] / "files" / "workspace" / "out"
        if how == "submit":   # (the worker's own copy; the client downloads the store's)
            fetched = run_pid("result", result["id"], "--download", str(tmp_path / "dl"), "--json")
            assert fetched.code == 0, fetched.stderr
            files = tmp_path / "dl" / "files" / "workspace" / "out"
            assert (files / "bad\\xffname").read_bytes() == b"x"   # (the store keeps the shown name)
        else:
            assert (files / os.fsdecode(b"bad\xffname")).read_bytes() == b"x"
        assert (files / "ok.txt").read_bytes() == b"y"
        assert any(p.endswith("out/bad\\xffname") for p in result["artifacts"]["files"]), result["artifacts"]


@not_pooled
def test_a_repository_larger_than_max_workspace_is_refused_before_anything_is_written(run_pid, pid_env,
                                                                                       sample_repo, tmp_path):
    """A 3 GiB sparse file (nothing on disk) in --repo used to become a 3 GB temporary file on the host before the
    job failed. `pid run` counts apparent sizes first, as `submit` limits its pack."""
    with open(sample_repo / "sparse.bin", "wb") as f:
        f.truncate(3 << 30)
    spool = tmp_path / "spool"
    spool.mkdir()
    with ScriptedLLM([{"text": "never"}]) as llm:
        res = run_pid("run", "t", "--repo", str(sample_repo), *opts(llm, tmp_path / "out"),
                      env={**pid_env, "TMPDIR": str(spool)})
        asked = len(llm.requests)
    assert res.code == 2 and "larger than --max-workspace 200m" in res.stderr, (res.stdout, res.stderr)
    assert asked == 0 and not list(spool.iterdir())


@not_pooled
def test_a_repository_deeper_than_pythons_recursion_limit_runs_and_comes_back(run_pid, deep_tmp):
    """A 1,100-level-deep repository failed with RecursionError as `pid run` packed it (and the unpacker walked it one
    call per level too), and so did removing the staging copy of such a tree collected with `--file` after a check:
    all loop now."""
    leaf = deep_tree.make(deep_tmp / "repo")
    script = [{"tool_calls": [{"name": "bash", "arguments": {
        "command": f"cat {leaf} && echo changed > {leaf} && find . -type d | wc -l"}}]},
              {"text": "done"}]
    out = deep_tmp / "out"   # (the collected tree is as deep: pytest's own clean-up could not remove it)
    with ScriptedLLM(script) as llm:
        res = run_pid("run", "deep", "--repo", str(deep_tmp / "repo"), "--file", "d", "--check", "true",
                      *opts(llm, out))
        assert res.code == 0 and res.json()["status"] == "completed", (res.stdout, res.stderr)
        assert tool_results(llm.requests[1])[0] == f"bottom\n{deep_tree.DEPTH + 1}\n"
    job = out / res.json()["id"]
    patch = (job / "patch.diff").read_text()
    assert f"+++ b/{leaf}\n" in patch and "-bottom\n+changed\n" in patch, patch[-300:]
    assert (job / "files" / "workspace" / leaf).read_text() == "changed\n"
    assert not (job / ".files-check").exists()
