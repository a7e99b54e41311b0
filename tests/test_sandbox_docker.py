"""The Docker sandbox against a real engine: exec channel, files, limits, lifecycle, workspace and patch."""
from __future__ import annotations

import errno
import gc
import os
import shutil
import signal
import subprocess
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import docker
import docker.errors
import pytest

from pid.config import pid_home
from pid.sandbox_api import OutputPolicy, SandboxError
from pid.sandbox import (DockerSandbox, ImageNotFound, SandboxConfig, ensure_image, reap_expired,
                         remove_job_containers)
from pid.sandbox.artifacts import FilesBudget
from pid.sandbox import fileops
from pid.sandbox.channel import DIRECT_MAX, Channel, request_line
from pid.sandbox.config import BASE_ENV
from pid.sandbox.reaper import owner_label, run_labels
from pid.sandbox.workspace import NESTED_WHY
from tests.conftest import WAITING_SHELL_MARK, open_descriptors, signal_waiting_shells, signalled
from tests.services import missing

pytestmark = pytest.mark.docker  # the whole module needs an engine

IMAGE = os.environ.get("PID_TEST_IMAGE", "pid-sandbox:latest")
JOB = "test-sandbox"
OWNER = owner_label(pid_home())


@pytest.fixture(scope="module")
def client() -> docker.DockerClient:
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        missing(f"no Docker engine: {exc}")
    return client


@pytest.fixture(scope="module")
def sb(client):
    box = DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB), client)   # (the default time to live: a
    # loaded CI run may hold a module's container past 15 min)
    try:
        yield box
    finally:
        box.close()


def gone(client, container_id: str, wait_s: float = 10.0) -> bool:
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            client.containers.get(container_id)
        except docker.errors.NotFound:
            return True
        time.sleep(0.1)
    return False


def rss_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


# -- exec ---------------------------------------------------------------------------------------------------
def test_workdir(sb):
    assert sb.workdir == "/workspace"


def test_exec_exit_code_and_merged_output(sb):
    result = sb.exec("echo out; echo err >&2; printf 'no newline'; exit 3", timeout=10)
    assert result.exit_code == 3
    assert result.tail == b"out\nerr\nno newline"
    assert (result.total_bytes, result.total_lines) == (18, 3)
    assert not result.timed_out and not result.cancelled and result.output_path is None
    assert sb.exec("true", timeout=10).exit_code == 0
    assert sb.exec("false", timeout=10).exit_code == 1


def test_exec_environment_cwd_stdin_and_quoting(sb):
    result = sb.exec("""A="x 'y' \\z"; pwd; echo "$PAGER $GIT_PAGER $TERM $NO_COLOR $HOME [$A]"; cat; """
                     """echo 'it''s' "a\\\\b" $'t\\tx'""", timeout=10)
    assert result.tail == b"/workspace\ncat cat dumb 1 /home/agent [x 'y' \\z]\nits a\\b t\tx\n"


def test_agent_commands_keep_their_locale(client, sb):
    # The server reads and counts in the C locale; the agent's commands run in theirs: the image's LANG, or an LC_ALL
    # of the environment, as it was (never the server's C). Commands and output are bytes either way.
    assert sb.exec('x=é✓; echo "${LC_ALL-unset} $LANG ${#x}"; echo ✓', timeout=10).tail == \
        "unset C.UTF-8 2\n✓\n".encode()
    channel = Channel.open_exec(client.api, sb.container.id, 900, role="agent", workdir=sb.workdir,
                                uid=sb.container.uid, gid=sb.container.gid, env={**BASE_ENV, "LC_ALL": "C.UTF-8"})
    try:
        for _ in range(3):   # the first slot shells and their successors
            channel.start('x=é✓; echo "$LC_ALL ${#x}"; env | grep -c ^LC_ALL=', 100, time.monotonic() + 10)
            done = channel.finish(time.monotonic() + 10)
            assert done is not None and done.head == b"C.UTF-8 2\n1\n" and done.exit_code == 0
    finally:
        channel.close()


@pytest.mark.parametrize("host_outputs", [True, False])
def test_a_server_told_that_the_host_removes_the_outputs_leaves_them_to_it(client, sb, host_outputs):
    """The host removes the agent's outputs, and holds the last ones it removed, to cut one back should a process the
    command left behind write on (outputs.py); the server's own sweep of its files (32 at a time) would remove some
    first, out of the host's reach. Told at its hello (`h n o`), it leaves them, and removes its other files (here an
    upload's) at the next request instead."""
    cid = 902 + host_outputs
    channel = Channel.open_exec(client.api, sb.container.id, cid, role="agent", workdir=sb.workdir,
                                uid=sb.container.uid, gid=sb.container.gid, env=BASE_ENV, host_outputs=host_outputs)
    outputs = []
    try:
        for _ in range(40):
            outputs.append(channel.start("true", 0, time.monotonic() + 10)[1])
            assert channel.finish(time.monotonic() + 10) is not None
        for upload in (b"data", None):
            channel.start('cat "${1:-/dev/null}"', 10, time.monotonic() + 10, upload=upload)
            assert channel.finish(time.monotonic() + 10) is not None
    finally:
        channel.close()
    names = {n for n in os.listdir(sb.container.pid_disk.path("out")) if n.startswith(f"{cid}.")}   # (pid's disk)
    left = [out for out in outputs if out.rsplit("/", 1)[1] in names]
    uploads = [n for n in names if n.endswith(".in")]
    if host_outputs:
        assert left == outputs and uploads == []
    else:   # (the server removed the first 32 as the 33rd command came; the upload waits for 31 more)
        assert left == outputs[32:] and len(uploads) == 1


def test_a_command_the_host_gave_up_sending_never_runs(client, sb):
    """Issue 21, finding 6: a host that stops sending a command half-way (its start ran out of time) closes the
    channel. The server used to run what it had read of it; now it runs nothing and ends."""
    channel = Channel.open_exec(client.api, sb.container.id, 901, role="agent", workdir=sb.workdir,
                                uid=sb.container.uid, gid=sb.container.gid, env=BASE_ENV)
    command = b"touch /tmp/cut-short; exit 0 #" + b"x" * 100
    try:
        channel.link.send(request_line(b"r n0nce 0 - %d -" % (len(command) + 100)) + command, time.monotonic() + 10)
    finally:
        channel.close()
    for _ in range(300):   # until that server has read to its end (and so started whatever it was going to)
        if sb.exec("ps -eo args | grep -c '[c]hannel.sh agent 901 '; true", timeout=10).tail == b"0\n":
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the channel's server did not end")
    assert sb.exec("ls /tmp/cut-short", timeout=10).exit_code != 0


def _execs(client, container_id: str) -> int:
    return len(client.api.inspect_container(container_id)["ExecIDs"] or [])


def test_the_first_servers_start_with_the_container_on_fifos_that_nothing_else_can_open(client):
    box = DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-entry", ttl_s=300), client)
    try:
        # Two tool calls at once, a file read and the control channel's kill: no `docker exec` at all.
        results: list[object] = []
        calls = [threading.Thread(target=lambda: results.append(box.exec("sleep 0.3; echo hi", timeout=10)))
                 for _ in range(2)]
        for call in calls:
            call.start()
        for call in calls:
            call.join()
        assert [r.tail for r in results] == [b"hi\n", b"hi\n"]   # type: ignore[attr-defined]
        assert box.read_file("/.pid/channel.sh").startswith(b"# pid exec channel")
        assert box.exec("sleep 30", timeout=0.5).timed_out
        assert _execs(client, box.container.id) == 0
        # Once answered, the FIFOs' names are gone from /.pid/run (the slot shells' command FIFOs too, which the host
        # writes short commands into); the servers keep their ends.
        run_dir = os.listdir(box.container.pid_disk.path("run"))   # (on pid's own disk)
        assert sorted(n for n in run_dir if n.startswith("cmd.")) == ["cmd.2.s", "cmd.3.s"], run_dir
        assert not [n for n in run_dir if n.startswith(("req.", "rep."))]
        # A server that dies is replaced through the engine, and calls go on.
        # (a server's own forked subshell shows the same command line for a moment: only servers not forked by one)
        rows = client.api.top(box.container.id, ps_args="-eo pid,ppid,args")["Processes"]
        named = {int(row[0]): int(row[1]) for row in rows if "channel.sh agent" in row[2]}
        servers = [pid for pid, parent in named.items() if parent not in named]
        assert len(servers) == 2
        for pid in servers:
            os.kill(pid, 9)
        end = time.monotonic() + 10
        for pid in servers:   # (dead, not dying: a command handed to a dying server's shell may run, see below)
            while _state(pid) not in ("Z", "") and time.monotonic() < end:
                time.sleep(0.01)
        assert box.exec("echo again", timeout=10).tail == b"again\n"
        assert _execs(client, box.container.id) >= 1
    finally:
        box.close()
    assert gone(client, box.container.id)


def without_pids_drop(monkeypatch) -> None:
    """The sandboxes made from now on drop through the image's setpriv, as where the host has no compiler: the server
    then forks the slot shells itself (with pid's drop, the drop forks them)."""
    from pid.sandbox import drop_helper
    monkeypatch.setattr(drop_helper, "program", lambda: None)


@pytest.mark.parametrize("drop", ["pid's", "setpriv"])
def test_a_short_command_runs_exactly_once_whatever_the_agent_did_to_its_waiting_shells(client, monkeypatch, drop):
    """A short command goes straight into the waiting slot shell's FIFO (the server only waits for it). A shell the
    agent killed first gets a successor with the server's own copy; a shell it stopped is ended (128 + SIGSTOP) and
    its command never runs, long or short (a long one goes through a file: nothing can block on a stopped shell);
    either way every later command runs once, in step."""
    if drop == "setpriv":
        without_pids_drop(monkeypatch)
    box = DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-direct", ttl_s=300), client)
    try:
        parent = box.exec("tr '\\0' ' ' </proc/$PPID/cmdline", timeout=10).tail   # who started the shell
        assert parent.startswith(b"/.pid/drop " if drop == "pid's" else b"bash /.pid/channel.sh agent "), parent
        idle = box.channels._pool._idle
        assert idle and all(len(ch.link.slot_fds) == 2 for ch in idle)   # the direct path is taken
        for i in range(4):
            assert signalled(box.exec(signal_waiting_shells("KILL"), timeout=10).tail) >= 1
            done = box.exec(f"echo {i} >>/tmp/once; echo ran{i}", timeout=10)
            assert (done.exit_code, done.tail) == (0, f"ran{i}\n".encode())
        assert box.read_file("/tmp/once") == b"0\n1\n2\n3\n"
        for i in range(3):
            assert signalled(box.exec(signal_waiting_shells("STOP"), timeout=10).tail) >= 1
            stopped = box.exec("echo never >>/tmp/never", timeout=5)   # ended with its shell: 128 + SIGSTOP
            assert (stopped.exit_code, stopped.tail) == (147, b"")
            for j in range(3):
                done = box.exec(f"echo {i}{j} >>/tmp/once; echo ran{i}{j}", timeout=10)
                assert (done.exit_code, done.tail) == (0, f"ran{i}{j}\n".encode())
        assert box.read_file("/tmp/once").split() == [b"0", b"1", b"2", b"3"] + [b"%d%d" % (i, j) for i in range(3)
                                                                                for j in range(3)]
        assert box.exec("cat /tmp/never 2>&1", timeout=10).tail.endswith(b"No such file or directory\n")
        for i in range(2):   # (the server used to hang writing it, with the host long gone)
            assert signalled(box.exec(signal_waiting_shells("STOP"), timeout=10).tail) >= 1
            big = box.exec(": '" + "A" * 70000 + "'; echo big >>/tmp/never", timeout=10)
            assert (big.exit_code, big.tail) == (147, b"")
            big = box.exec(": '" + "A" * 70000 + f"'; echo big{i}", timeout=10)
            assert (big.exit_code, big.tail) == (0, f"big{i}\n".encode())
        assert box.exec("cat /tmp/never 2>&1", timeout=10).tail.endswith(b"No such file or directory\n")
    finally:
        box.close()


@pytest.mark.parametrize("direct", [True, False])
def test_commands_around_a_page_run_whole_and_see_only_their_own_variables(client, direct):
    """A command of up to 4,000 bytes goes into its shell's FIFO (from the host, or from the server), a longer one
    through a file: both sides of that line, counted in bytes (a multibyte character counts as its bytes), run whole,
    and the slot shell's own variables (n, f, c) are not the command's."""
    box = DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-page", ttl_s=300), client)
    try:
        if not direct:
            box.processes.has_room = lambda: False   # every command goes through the server
        probe = 'echo "[${n-unset}][${f-unset}][${c-unset}]"'
        for pad in ("", "#" + "é" * 3000):    # short; 6,000 bytes in 3,000 characters
            done = box.exec(probe + "\n" + pad, timeout=10)
            assert (done.exit_code, done.tail) == (0, b"[unset][unset][unset]\n"), (len(pad), done.tail)
        for size in (3999, 4000, 4001, 4002):
            head = f"printf %s {size}; printf '%s' '"
            body = "é" * ((size - len(head) - 1) // 2)
            command = (head + body + "A" * (size - len(head) - 1 - 2 * len(body)) + "'").encode()
            assert len(command) == size
            done = box.exec(command.decode(), timeout=10)
            assert (done.exit_code, done.tail) == (0, str(size).encode() + command[len(head):-1]), size
    finally:
        box.close()


def test_a_table_filled_after_a_reply_is_cleared_before_the_next_short_command(client):
    """A short command goes to its waiting shell with no server to refuse it, so the host looks at the process table
    first: one the agent's background fork bomb filled is cleared, and the command runs whole (not into the full
    table: fork retries for ~15 s, then "Resource temporarily unavailable" in its output). The forks the bomb had
    been refused are not the command's: the table is not cleared again after it, which would kill what it left
    running."""
    box = DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-full", ttl_s=300, pids_limit=128), client)
    try:
        assert box.exec("(sleep 1; b() { b | b & }; b) >/dev/null 2>&1 & echo armed", timeout=10).tail == b"armed\n"
        time.sleep(4)
        done = box.exec("sleep 100 >/dev/null 2>&1 & echo alive; ls -d / && echo forked", timeout=60)
        assert (done.exit_code, done.tail) == (0, b"alive\n/\nforked\n") and done.pids_limit_hit
        left = box.exec("pgrep -u \"$(id -u)\" -x sleep >/dev/null && echo left running", timeout=10)
        assert (left.tail, left.pids_limit_hit) == (b"left running\n", False)
    finally:
        box.close()


def _not_dead(pid: int, started: str | None = None) -> tuple[int, str] | None:
    """(host pid, start time) of a process that has not died (neither gone nor a zombie), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if fields[0] in ("Z", "X") or started not in (None, fields[19]):
        return None
    return pid, fields[19]


def test_clearing_a_full_table_returns_once_every_killed_process_has_died(client):
    """The host kills the agent's processes with the container frozen, and a SIGKILL acts only after the thaw, when
    the process gets the CPU. The clearing returns after they died: a waiting shell about to die would otherwise
    still look alive to the server, which would hand it the next command (that command then ends 137, unrun)."""
    if os.geteuid() != 0:
        pytest.skip("the clearing from the host needs root (elsewhere the server inside clears, and does not wait)")
    box = DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-dead", ttl_s=300, pids_limit=128), client)
    try:
        # (a process that holds much memory takes a while to die: its memory is freed first)
        assert box.exec("(dd if=/dev/zero of=/dev/null bs=768M count=100000 &) >/dev/null 2>&1; (sleep 1; "
                        "b() { b | b & }; b) >/dev/null 2>&1 & echo armed", timeout=10).tail == b"armed\n"
        time.sleep(4)
        _pause(client, box.container.id)
        try:
            rows = client.api.top(box.container.id, ps_args="-eo pid,uid")["Processes"]
            before = [alive for pid, uid in rows if int(uid) == box.container.uid and (alive := _not_dead(int(pid)))]
        finally:
            client.api.unpause(box.container.id)
        assert len(before) > 64
        assert box.processes.clear() >= len(before) // 2
        assert [alive for pid, started in before if (alive := _not_dead(pid, started))] == []
    finally:
        box.close()


def _pause(client, container_id: str, attempts: int = 5) -> None:
    """Freeze the container for the test's look at its process table. runc gives up freezing a cgroup whose fork bomb
    outruns it ("unable to freeze"), more often on a loaded machine: the test's own instrument tries again."""
    for attempt in range(attempts):
        try:
            client.api.pause(container_id)
            return
        except docker.errors.APIError as exc:
            if "unable to freeze" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.5)


def _next_callers_server(client, box) -> tuple[int, list[int]]:
    """The host pids of the server whose channel the box's next call takes, and of its waiting slot shells (both
    up: a call ran, then half a second passed)."""
    box.exec("true", timeout=10)
    time.sleep(0.5)   # the next shells are up
    deadline = time.monotonic() + 30   # (a channel still warming up, once ready, would be the next call's instead: CI
    while box.channels._pool._warming and time.monotonic() < deadline:   # under load, just after the sandbox's start)
        time.sleep(0.05)
    channel = box.channels._pool._idle[-1]   # the one the next call takes
    rows = client.api.top(box.container.id, ps_args="-eo pid,ppid,args")["Processes"]
    server = [int(row[0]) for row in rows if f"channel.sh agent {channel.channel_id} " in row[2]][0]
    # (the shells are the children of pid's drop, which the server started to fork them, or of its zygote:
    # sandbox/drop.c, serve)
    parents = {server} | {int(row[0]) for row in rows if int(row[1]) == server and row[2].startswith("/.pid/drop ")}
    parents |= {int(row[0]) for row in rows if int(row[1]) in parents and row[2].endswith(" z /.pid/zygote.so")}
    return server, [int(row[0]) for row in rows if int(row[1]) in parents and int(row[0]) not in parents
                    and WAITING_SHELL_MARK in row[2]]


def _v1_freezer(pid: int) -> Path | None:
    """The host's cgroup v1 freezer directory of a process, or None. (cgroup v2's freezer lets a SIGKILL kill a
    frozen process at once: no use here.)"""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "freezer" in controllers.split(",") and Path(f"/sys/fs/cgroup/freezer{path}/freezer.state").exists():
            return Path(f"/sys/fs/cgroup/freezer{path}")
    return None


def test_a_waiting_shell_killed_but_not_yet_dead_gets_no_command(client):
    """A SIGKILL acts only once its process runs: a waiting shell killed while frozen (as the clearing of a full
    table does) is still there, asleep, after the kill. The server must count it as gone (its SIGKILL is pending)
    and give the next command a new shell; handed to the dying one, the command would end 137, never run. Here the
    host freezes the two waiting shells alone (a cgroup of their own), kills them, and thaws them a second later."""
    box = DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-dying", ttl_s=300), client)
    try:
        _, shells = _next_callers_server(client, box)
        assert len(shells) == 2
        parent = _v1_freezer(shells[0])
        if parent is None:
            pytest.skip("no cgroup v1 freezer on this host")
        frozen = parent / "pid-test-frozen"   # (inside this test's own container's cgroup)
        frozen.mkdir()
        thaw = threading.Timer(1.0, lambda: (frozen / "freezer.state").write_text("THAWED"))
        try:
            for shell in shells:
                (frozen / "cgroup.procs").write_text(str(shell))
            (frozen / "freezer.state").write_text("FROZEN")
            time.sleep(0.3)
            for shell in shells:
                os.kill(shell, signal.SIGKILL)
            assert all(_not_dead(shell) for shell in shells)   # killed, not dead
            thaw.start()
            done = box.exec("echo ran", timeout=30)
            assert (done.exit_code, done.tail) == (0, b"ran\n")
        finally:
            thaw.cancel()
            if thaw.is_alive():
                thaw.join()
            (frozen / "freezer.state").write_text("THAWED")
            for pid in (frozen / "cgroup.procs").read_text().split():   # (none, once the killed are reaped)
                try:
                    (parent / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            for _ in range(100):
                try:
                    frozen.rmdir()
                    break
                except OSError:   # a killed shell not reaped yet
                    time.sleep(0.05)
    finally:
        box.close()


def test_a_server_that_dies_after_the_host_handed_its_shell_a_command_does_not_make_it_run_twice(client):
    """The host wrote a command into a waiting shell's FIFO, then the server died. If the shell took it, the call
    fails (it may have run) and is not retried on another channel; if nothing took it, the host takes it back and
    another channel runs it. Either way it runs once."""
    box = DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-dies", ttl_s=300), client)
    try:
        for shells_up, file in ((True, "/tmp/taken"), (False, "/tmp/back")):
            server, shells = _next_callers_server(client, box)
            os.kill(server, signal.SIGSTOP)   # (the host's pid namespace: the tests run as root, as the worker does)
            if not shells_up:
                for shell in shells:
                    os.kill(shell, signal.SIGKILL)
            outcome: list[object] = []

            def call() -> None:
                try:
                    outcome.append(box.exec(f"echo once >>{file}; echo ran", timeout=20))
                except SandboxError as exc:
                    outcome.append(exc)

            caller = threading.Thread(target=call)
            caller.start()
            time.sleep(1.0)
            os.kill(server, signal.SIGKILL)
            caller.join(30)
            if shells_up:
                assert isinstance(outcome[0], SandboxError) and "broke as a command started" in str(outcome[0])
            else:
                assert outcome[0].tail == b"ran\n"   # type: ignore[attr-defined]
            time.sleep(0.5)
            assert box.read_file(file) == b"once\n"
    finally:
        box.close()


def _state(pid: int) -> str:
    """A host process's state letter ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][:1]
    except OSError:
        return ""


def _open_on_disk(box) -> list[str]:
    """This process's descriptors that point into the sandbox's disks (the job's, and pid's own beside it)."""
    return open_descriptors(box.container.disk.mountpoint)


def test_first_servers_that_do_not_answer_are_replaced_through_the_engine(client, monkeypatch):
    # An entry that starts no server (as under a runtime that cannot open the host's FIFOs): the control server
    # and the agents' come through `docker exec` instead, after a short wait, and nothing stays open on the disk.
    import pid.sandbox.exec_channels
    import pid.sandbox.launch
    monkeypatch.setattr(pid.sandbox.exec_channels, "PRESTARTED_HELLO_S", 1.0)
    monkeypatch.setattr(pid.sandbox.launch, "entry_command", lambda ttl, *_: ["sleep", str(ttl)])
    started = time.monotonic()
    box = DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-silent", ttl_s=300), client)
    try:
        assert box.exec("echo hi", timeout=30).tail == b"hi\n"
        assert time.monotonic() - started < 20
        assert _execs(client, box.container.id) >= 2
        assert not [t for t in _open_on_disk(box) if "/run/" in t]
    finally:
        box.close()


def test_a_server_that_refuses_the_sandbox_says_why_at_once(client, monkeypatch, caplog):
    import pid.sandbox.channel as ch
    monkeypatch.setattr(ch, "SCRIPT", b'read -r h n; printf "F %s 24\\nthe image has no setpriv" "$n"; read -r l\n')
    started = time.monotonic()
    with pytest.raises(SandboxError, match="sandbox setup failed: the image has no setpriv"):
        DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-refused", ttl_s=300), client)
    assert time.monotonic() - started < 8   # no wait for an answer, no second try through the engine
    assert "did not answer" not in caplog.text
    assert not client.containers.list(all=True, filters={"label": f"pid.job={JOB}-refused"})


def test_an_engine_whose_default_runtime_is_not_runc_gets_no_fifos(client, monkeypatch):
    import pid.sandbox.launch as ds
    assert ds.default_runtime(client) == client.info()["DefaultRuntime"]
    monkeypatch.setitem(ds._default_runtimes, str(client.api.base_url), "runsc")
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-runsc-default", ttl_s=300), client) as box:
        assert client.api.inspect_container(box.container.id)["Config"]["Cmd"] == ["sleep", "300"]
        assert box.exec("echo hi", timeout=10).tail == b"hi\n"


def test_without_a_job_disk_the_servers_start_through_the_engine(client):
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-nodisk", ttl_s=300, disk=0), client) as box:
        assert box.exec("echo hi", timeout=10).tail == b"hi\n"
        assert box.exec("sleep 30", timeout=0.5).timed_out
        assert client.api.inspect_container(box.container.id)["Config"]["Cmd"] == ["sleep", "300"]
        assert _execs(client, box.container.id) >= 2   # the control channel and an agent channel


def test_without_a_job_disk_an_output_stays_until_the_host_counted_it(client, monkeypatch):
    """Without pid's disk the server removes finished outputs 32 at a time; a removal in the quiet after a reply
    took the 32nd before the host, a little slow (a busy machine), asked for its count and tail (a review)."""
    slow = Channel.count

    def count_late(self, *args, **kwargs):
        time.sleep(0.005)
        return slow(self, *args, **kwargs)
    monkeypatch.setattr(Channel, "count", count_late)
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-nodisk-count", ttl_s=300, disk=0),
                              client) as box:
        for i in range(100):   # (a counted output is kept apart: the `true`s make up the 32)
            result = box.exec("seq 1 20000" if i % 10 == 9 else "true", timeout=30)
            assert i % 10 != 9 or result.tail.endswith(b"19999\n20000\n"), (i, result)


def test_exec_runs_in_own_process_group_and_fresh_shell(sb):
    out = sb.exec("echo $$ $BASHPID; ps -o pgid= -p $$; echo $0", timeout=10).tail.split()
    assert out[0] == out[1] == out[2]      # own pid, leader of its own group
    assert out[3] == b"bash"


def test_a_command_s_lines_are_numbered_as_bash_c_numbers_them(sb):
    """The model reads "line N" to find its mistake: the lines of its command count from 1, as in `bash -c`
    (the waiting shell's own lines came first: a syntax error on line 3 was said to be on line 8)."""
    assert sb.exec("echo $LINENO\necho $LINENO", timeout=10).tail == b"1\n2\n"
    said = sb.exec("echo a\nnosuchcommand\nfi", timeout=10).tail.decode()
    assert "line 2: nosuchcommand: command not found" in said and "line 3: syntax error" in said, said


def test_a_command_sees_what_bash_c_would_show_it_of_itself(sb):
    """bash quotes the line it could not parse; it quoted pid's own words with it ("`unset c; echo )'"). The
    command is where `bash -c` keeps it, BASH_EXECUTION_STRING; the waiting shell's script, its variables and its
    own `cd` are nowhere to be seen. (Only the source's name differs from `bash -c`'s: bash calls an evaluated
    string "eval", not "-c".)"""
    said = sb.exec("echo )", timeout=10)
    assert said.exit_code == 2 and said.tail.decode().endswith("line 1: `echo )'\n"), said
    assert sb.exec('printf %s "$BASH_EXECUTION_STRING"', timeout=10).tail == b'printf %s "$BASH_EXECUTION_STRING"'
    assert sb.exec('echo "none${c+ c}${n+ n}${f+ f}"', timeout=10).tail == b"none\n"
    assert sb.exec("cd -", timeout=10).tail == b"bash: line 1: cd: OLDPWD not set\n"   # (as in `bash -c`: not "/")
    moved = sb.exec("declare -p OLDPWD; cd /tmp && sh -c 'echo \"$OLDPWD\"'", timeout=10)   # (exported, as there)
    assert moved.tail == b"declare -x OLDPWD\n/workspace\n", moved.tail


def test_output_file_mode_and_tail_when_large(sb):
    result = sb.exec("seq 1 100000", timeout=30, output=OutputPolicy(tail_bytes=100))
    assert result.total_lines == 100000
    assert result.total_bytes == len(b"".join(b"%d\n" % i for i in range(1, 100001)))
    assert result.tail.endswith(b"99999\n100000\n") and len(result.tail) == 100
    assert result.output_path
    # pid's file in pid's directory: the agent may read it, not replace it nor list its neighbours
    mode = sb.exec(f"stat -c '%a %u' {result.output_path} $(dirname {result.output_path})", timeout=10).tail.split()
    assert mode == [b"644", b"0", b"711", b"0"]
    assert sb.read_file(result.output_path, max_bytes=8) == b"1\n2\n3\n4\n"


def test_output_with_many_lines_is_kept_when_asked(sb):
    small = sb.exec("seq 1 3000", timeout=30, output=OutputPolicy(tail_bytes=65536))
    assert small.output_path is None and small.total_lines == 3000  # all of it fits the tail: nothing kept
    kept = sb.exec("seq 1 3000", timeout=30, output=OutputPolicy(tail_bytes=65536, keep_lines=2000))
    assert kept.output_path and kept.total_lines == 3000 and kept.tail.startswith(b"1\n2\n")
    assert sb.read_file(kept.output_path) == b"".join(b"%d\n" % i for i in range(1, 3001))
    few = sb.exec("seq 1 10", timeout=30, output=OutputPolicy(keep_lines=2000))
    assert few.output_path is None and few.tail == b"".join(b"%d\n" % i for i in range(1, 11))


def test_background_process_does_not_block_reply(sb):
    started = time.monotonic()
    result = sb.exec("sleep 100 & echo started", timeout=20)
    assert result.exit_code == 0 and result.tail == b"started\n"
    assert time.monotonic() - started < 5
    sb.exec("pkill -f '^sleep 100$' || true", timeout=10)


def test_timeout_kills_whole_group(sb):
    started = time.monotonic()
    result = sb.exec("sleep 1000 & sleep 1001; echo never", timeout=1)
    assert time.monotonic() - started < 5
    assert result.timed_out and result.exit_code is None and not result.cancelled
    ps = sb.exec("ps -eo pid,pgid,stat,args", timeout=10).tail.decode()
    assert "sleep 100" not in ps, ps      # neither the foreground nor the background sleep survived


def test_cancel_within_two_seconds(sb):
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    result = sb.exec("sleep 60", timeout=120, cancel=cancel)
    assert time.monotonic() - started < 2
    assert result.cancelled and result.exit_code is None and not result.timed_out


def test_on_output_receives_progress(sb):
    chunks: list[bytes] = []
    result = sb.exec("for i in 1 2 3 4; do echo tick $i; sleep 0.5; done", timeout=20, on_output=chunks.append)
    assert result.exit_code == 0
    assert len(chunks) >= 2 and b"tick 1" in b"".join(chunks)


def test_huge_output_keeps_host_memory_bounded(sb):
    sb.exec("true", timeout=10)
    before = rss_kb()
    result = sb.exec("head -c 200000000 /dev/zero | tr '\\0' x", timeout=120)
    growth_mb = (rss_kb() - before) / 1024
    assert result.exit_code == 0
    assert result.total_bytes == 200_000_000 and result.total_lines == 1
    assert result.tail == b"x" * 65536
    assert growth_mb < 10, growth_mb
    sb.exec(f"rm -f {result.output_path}", timeout=10)


def test_concurrent_execs_use_several_channels(sb):
    results: dict[int, object] = {}

    def run(i: int) -> None:
        results[i] = sb.exec(f"sleep 1; echo {i}", timeout=30)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert time.monotonic() - started < 3.5     # serial would take 4 s
    assert {i: r.tail for i, r in results.items()} == {i: b"%d\n" % i for i in range(4)}


def test_a_quick_command_runs_once_even_when_its_shell_ends_before_the_server_looks(sb):
    """A command handed straight to its waiting shell could be taken, run and ended by that shell between the
    server's two looks (is the FIFO still full? is the shell dead?): the server took the shell for one that died
    before taking it and gave the command to a new shell, which ran it again (3 of 1,000 here, the host busy)."""
    hogs = [subprocess.Popen(["timeout", "120", "sh", "-c", "while :; do :; done"], start_new_session=True)
            for _ in range(4)]
    try:
        for _ in range(1000):
            sb.exec("echo x >> /tmp/runs-once", timeout=30)
    finally:
        for hog in hogs:
            os.killpg(hog.pid, signal.SIGKILL)
            hog.wait()
    assert sb.exec("wc -l < /tmp/runs-once", timeout=30).tail == b"1000\n"


def test_agent_cannot_signal_pids_servers(sb):
    """The servers are root's, the agent's commands are not: pkill finds them and is refused."""
    result = sb.exec("pkill -9 -f channel.sh; echo rc=$?; kill -STOP 1; echo rc=$?", timeout=10)
    assert result.tail.count(b"rc=1") == 2 and b"Operation not permitted" in result.tail, result.tail
    assert sb.exec("echo alive", timeout=10).tail == b"alive\n"


def test_channel_recovers_after_a_root_agent_kills_servers(client):
    """A root agent kills every one of pid's servers while a command runs: that command fails, and the next one runs
    on fresh channels. The killer runs in a session of its own, so that the host's kill of the failed command's group
    cannot stop it halfway (a server still dying as the next command starts leaves that command's fate unknown, an
    honest error the test does not look for)."""
    def servers(box) -> set[bytes]:
        return {line.split()[-4] for line in box.exec("ps -eo args", timeout=10).tail.splitlines()
                if line.startswith(b"bash /.pid/channel.sh agent")}

    def left_on_host(box) -> list[str]:   # (read by the engine from the host: no channel needed)
        return [" ".join(p) for p in client.api.top(box.container.id, ps_args="-eo pid,args")["Processes"] or []
                if "channel.sh agent" in " ".join(p) or "pkill" in " ".join(p)]

    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-rootkill", ttl_s=300, user="root"),
                              client) as box:
        before = servers(box)
        assert before
        box.exec("setsid -f sh -c 'until pgrep -x -f \"sleep 4243\"; do sleep 0.05; done; "
                 "pkill -9 -f \"channel.sh agent\"' </dev/null >/dev/null 2>&1", timeout=10)
        with pytest.raises(SandboxError):   # the server running this very command dies with the others
            box.exec("sleep 4243", timeout=60)
        deadline = time.monotonic() + 30
        while left_on_host(box) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left_on_host(box)
        assert box.exec("echo alive", timeout=10).tail == b"alive\n"
        assert servers(box).isdisjoint(before)  # fresh channels replaced every killed one


@pytest.mark.long
def test_the_in_container_sweep_kills_the_agent_and_keeps_the_control_channel_in_step(client):
    """The sweep pid's control server runs when the host cannot freeze the container (a worker that is not root on
    the engine's host): it reads every process's status with builtins. It used to leave the rest of a status file
    in bash's read buffer when that process exited mid-read, and the next request's command began with it (a CI
    run's patch failed with "exit 127" and status lines in its output). Processes that come and go beside it make
    that race likely within seconds (the old server failed about one round in 70)."""
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-sweep", ttl_s=300), client) as box:
        assert box.container.uid != 0
        box.exec("sleep 4242 >/dev/null 2>&1 &", timeout=10)
        killed, refused, _ = box.channels.with_control(lambda ch: ch.kill_agent_processes(time.monotonic() + 30))
        assert killed >= 1 and refused == 0
        # (pid's own waiting shells of the agent's uid may be started again at once: only the agent's sleep counts)
        # (killed is not yet gone: a loaded machine takes a moment to end it)
        for _ in range(100):
            asleep = box.run_as_pid("for f in /proc/[0-9]*/cmdline; do case $(tr '\\0' ' ' 2>/dev/null <$f) in "
                                    "'sleep 4242 ') echo left ;; esac; done", "finding the agent's sleep", 30)
            if asleep == b"":
                break
            time.sleep(0.1)
        assert asleep == b""
        # root's processes: one asleep, four forking all the time; the sweep reads them all, never kills them
        for command in ["sleep 3131", *["while :; do /bin/true; done"] * 4]:
            exec_id = client.api.exec_create(box.container.id, ["sh", "-c", command], user="0:0")["Id"]
            client.api.exec_start(exec_id, detach=True)
        deadline = time.monotonic() + 20   # ~600 rounds on an idle machine, fewer when it is busy
        for _ in range(600):
            box.channels.with_control(lambda ch: ch.kill_agent_processes(time.monotonic() + 30))
            assert box.run_as_pid("echo in-step", "a probe", 30) == b"in-step\n"
            if time.monotonic() > deadline:
                break
        asleep = box.run_as_pid("for f in /proc/[0-9]*/cmdline; do case $(tr '\\0' ' ' 2>/dev/null <$f) in "
                                "'sleep 3131 ') echo asleep ;; esac; done", "finding root's sleep", 30)
        assert asleep == b"asleep\n"


# -- files ---------------------------------------------------------------------------------------------------
def test_binary_roundtrip_all_byte_values(sb):
    data = bytes(range(256)) * 3
    sb.write_file("bin/all.bin", data)
    assert sb.read_file("/workspace/bin/all.bin") == data
    assert sb.read_file("bin/all.bin", max_bytes=10) == data[:10]
    sb.write_file("bin/small.txt", b"line\n\\0 x\r\n")
    assert sb.read_file("bin/small.txt") == b"line\n\\0 x\r\n"
    sb.write_file("bin/empty", b"")
    assert sb.read_file("bin/empty") == b""


def test_reads_count_bytes_and_keep_nul_bytes(sb):
    text = "héllo wörld ✓\n".encode() * 50
    sb.write_file("utf8.txt", text)
    for limit in (0, 1, 2, 7, 100, len(text) - 1, len(text), len(text) + 5):
        assert sb.read_file("utf8.txt", max_bytes=limit) == text[:limit]
    few_nuls = b"a\0\0b\0" + b"xyz" * 100 + b"\0"
    many_nuls = bytes(5000) + b"tail" + bytes(100)
    for data in (few_nuls, many_nuls, b"\0", b"\n\0\n"):
        sb.write_file("nul.bin", data)
        assert sb.read_file("nul.bin") == data
        for limit in (1, 3, 70, len(data) - 1, len(data), len(data) + 1):
            assert sb.read_file("nul.bin", max_bytes=limit) == data[:limit], (data[:10], limit)
    result = sb.exec("printf 'a\\0b\\0\\0c'", timeout=10)
    assert result.tail == b"a\0b\0\0c" and result.total_bytes == 6 and result.total_lines == 1


def test_three_megabyte_file(sb):
    data = os.urandom(3 * 1024 * 1024)
    sb.write_file("/tmp/big.bin", data)
    assert sb.read_file("/tmp/big.bin") == data
    assert sb.exec("wc -c < /tmp/big.bin", timeout=10).tail == b"3145728\n"


def test_write_data_that_looks_like_escapes_or_options(sb):
    """Small writes are decoded by the shell (printf %b): nothing in the data may act as an escape or option."""
    cases = [b"\0" + b"0123", b"\\c stop here", b"\\0000 \\\\ \\x41 %s %b \\n", b"-n", b"-e \\t", b"-E",
             b"\x01\x7f\x01\x01\x7f\x7f", b"\n\n\n", b"a\r\n\0", b"\xff\xfe\x80", bytes([1]) * 100, b"\0" * 300,
             os.urandom(20000)]
    for i, data in enumerate(cases):
        sb.write_file(f"enc/{i}.bin", data)
        assert sb.read_file(f"enc/{i}.bin") == data, (i, data[:40])
    sizes = sb.exec("wc -c enc/*.bin | grep -v total", timeout=10).tail.split(b"\n")
    assert sorted(int(line.split()[0]) for line in sizes if line) == sorted(len(d) for d in cases)


def test_writes_around_the_size_that_carries_the_data_in_the_command(sb):
    """A write whose command fits one write into the slot shell's FIFO carries its data in it (printf %b, escaped and
    quoted): every byte value, either side of that size, mode kept."""
    sb.exec("printf x > inline.bin && chmod 604 inline.bin", timeout=10)
    pattern = b"'\\\0%b\n\\c" + bytes(range(256))
    inlined = []
    for size in (0, 1, 1000, 1900, 2100, 3000, 3500, 3900, 4100):
        data = (pattern * (size // len(pattern) + 1))[:size]
        inlined.append(fileops.inline_write_snippet("/workspace/inline.bin", data, DIRECT_MAX) is not None)
        sb.write_file("inline.bin", data)
        assert sb.read_file("inline.bin") == data, size
        assert sb.exec("stat -c '%a %s' inline.bin", timeout=10).tail == b"604 %d\n" % size
    assert inlined[0] and not inlined[-1] and True in inlined[3:] and False in inlined[:-1]   # both ways, twice


def test_write_sizes_around_the_builtin_limit_keep_mode(sb):
    sb.exec("printf x > limit.bin && chmod 640 limit.bin", timeout=10)
    for size in (32767, 32768, 32769, 100000):          # both sides of the in-shell limit (channel.py)
        data = (bytes(range(256)) * (size // 256 + 1))[:size]
        sb.write_file("limit.bin", data)
        assert sb.read_file("limit.bin") == data, size
        assert sb.exec("stat -c '%a %s' limit.bin", timeout=10).tail == b"640 %d\n" % size


def test_exec_output_at_the_tail_boundary(sb):
    for size, kept in ((99, False), (100, False), (101, True)):
        result = sb.exec(f"printf '%0{size}d' 7", timeout=10, output=OutputPolicy(tail_bytes=100))
        assert result.tail == (b"0" * (size - 1) + b"7")[-100:], size
        assert (result.total_bytes, result.total_lines) == (size, 1)
        assert (result.output_path is not None) == kept, size


def test_sequential_calls_reuse_the_warm_channels(client):
    """Back-to-back tool calls must not open new exec channels (each costs a `docker exec`): the two warmed at
    create (one at once, one in the background for the first parallel batch) serve them all."""
    def servers(box) -> set[str]:   # a set: a server caught between fork and exec shows twice
        lines = box.exec("ps -eo args", timeout=10).tail.decode().splitlines()
        return {line for line in lines if line.startswith("bash /.pid/channel.sh agent")}

    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-warm", ttl_s=300), client) as box:
        deadline = time.monotonic() + 10
        while len(servers(box)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(servers(box)) == 2
        for i in range(20):
            assert box.exec(f"echo {i}", timeout=10).tail == b"%d\n" % i
            box.write_file("w.txt", b"%d" % i)
            assert box.read_file("w.txt") == b"%d" % i
        assert len(servers(box)) == 2, servers(box)


def test_paths_with_spaces_and_newlines(sb):
    path = "odd dir/new\nline 'q' $x.txt"
    sb.write_file(path, b"ok")
    assert sb.read_file(path) == b"ok"


def test_write_keeps_mode(sb):
    sb.exec("printf x > tool.sh && chmod 751 tool.sh", timeout=10)
    sb.write_file("tool.sh", b"#!/bin/sh\necho run\n")
    assert sb.exec("stat -c %a tool.sh; ./tool.sh", timeout=10).tail == b"751\nrun\n"


def test_file_errors(sb):
    with pytest.raises(FileNotFoundError):
        sb.read_file("does/not/exist")
    with pytest.raises(IsADirectoryError):
        sb.read_file("/workspace")
    with pytest.raises(IsADirectoryError):
        sb.write_file("/tmp", b"x")
    sb.write_file("plainfile", b"x")
    with pytest.raises(NotADirectoryError):
        sb.write_file("plainfile/child", b"data")
    assert sb.read_file("plainfile") == b"x"      # the channel is still in step after errors


def test_fifos_and_devices_are_refused_not_blocked_on(sb):
    sb.write_file("plainfile", b"x")   # (its own: under xdist the test that writes it may run on another worker)
    sb.exec("rm -f pipe; mkfifo pipe", timeout=10)
    started = time.monotonic()
    for attempt in (lambda: sb.read_file("pipe"), lambda: sb.write_file("pipe", b"x"),
                    lambda: sb.read_file("/dev/zero")):
        with pytest.raises(OSError) as raised:
            attempt()
        assert type(raised.value) is OSError and raised.value.errno == errno.EINVAL
    assert time.monotonic() - started < 5
    assert sb.read_file("plainfile") == b"x"


def test_readable_files_is_one_look_that_names_only_readable_regular_files(sb):
    sb.exec("rm -rf look && mkdir -p look/dir && cd look && echo a > plain && echo b > \"it's\n odd\" && "
            "echo c > locked && chmod 000 locked && ln -sf plain link && ln -sf gone dangling && mkfifo pipe",
            timeout=10)
    names = ["look/plain", "look/it's\n odd", "look/locked", "look/link", "look/dangling", "look/pipe",
             "look/dir", "look/missing", "/dev/zero", "/workspace/look/plain"]
    assert sb.readable_files(names) == {"look/plain", "look/it's\n odd", "look/link", "/workspace/look/plain"}
    assert sb.readable_files([]) == set()
    assert sb.read_file("look/plain") == b"a\n"   # the channel is still in step


def test_a_drop_that_cannot_run_here_leaves_the_drop_to_setpriv(client, monkeypatch):
    """pid's drop is tried once, by the first server to greet, and the answer kept for later ones (/.pid/run,
    root's): one that cannot run here (built for another architecture) is not used, and setpriv drops instead."""
    from pid.sandbox import drop_helper
    for program, kept in ((drop_helper.program(), "1"), (b"\x7fELF" + b"\0" * 60, "0")):
        monkeypatch.setattr(drop_helper, "program", lambda program=program: program)
        box = DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-drop", ttl_s=300), client)
        try:
            done = box.exec("id -u; grep -E '^CapEff' /proc/self/status", timeout=30)
            assert done.tail.decode().split() == ["1000", "CapEff:", "0000000000000000"], done.tail
            answer = client.containers.get(box.container.id).exec_run(["cat", "/.pid/run/drop.ok"])
            assert answer.output.decode().strip() == kept
        finally:
            box.close()


def test_the_agent_is_unprivileged_and_git_works(sb):
    result = sb.exec("set -e; id -u; id -g; grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status; "
                     "cd /tmp && rm -rf g && git init -q g && cd g && echo a > f && git add f && "
                     "git -c user.name=t -c user.email=t@t commit -qm m && chmod 600 f && "
                     "sleep 30 & kill $! && echo ok", timeout=30)
    assert result.exit_code == 0 and result.tail.endswith(b"ok\n"), result.tail
    lines = result.tail.decode().splitlines()
    assert lines[:2] == ["1000", "1000"]
    assert all(line.split()[1] == "0000000000000000" for line in lines[2:6]), lines[2:6]


# -- container ------------------------------------------------------------------------------------------------
def test_limits_and_labels(client, sb):
    attrs = client.api.inspect_container(sb.container.id)
    host = attrs["HostConfig"]
    assert host["Memory"] == 2 * 1024 ** 3 and host["MemorySwap"] == host["Memory"]
    assert host["NanoCpus"] == 1_000_000_000
    assert host["PidsLimit"] == 512
    assert host["NetworkMode"] == "none"
    assert host["Init"] is True and host["AutoRemove"] is True
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["LogConfig"]["Type"] == "none"   # nothing the container writes is kept on the host's disk
    assert host["CapDrop"] == ["ALL"] and "NET_RAW" not in host["CapAdd"] and "DAC_OVERRIDE" not in host["CapAdd"]
    assert host["ReadonlyRootfs"] is True      # all writes go to the job's disk, or pid's own (its /.pid/*)
    assert sorted(m["Destination"] for m in attrs["Mounts"]) == ["/.pid", "/.pid/out", "/.pid/patch", "/.pid/run",
                                                                   "/etc/hosts", "/home/agent", "/tmp", "/var/tmp",
                                                                   "/workspace"]
    assert attrs["Config"].get("NetworkDisabled") is True   # no network library's namespace: launch.ETC_HOSTS
    assert [m["RW"] for m in attrs["Mounts"] if m["Destination"] == "/etc/hosts"] == [False]
    nofile = [u for u in host["Ulimits"] if u["Name"] == "nofile"][0]
    assert 512 * nofile["Hard"] * 8 <= int(Path("/proc/sys/fs/file-max").read_text())
    labels = attrs["Config"]["Labels"]
    assert labels["pid.job"] == JOB and labels["pid.owner"] == OWNER
    created = datetime.fromisoformat(labels["pid.created"].replace("Z", "+00:00"))
    expires = datetime.fromisoformat(labels["pid.expires"].replace("Z", "+00:00"))
    assert expires - created == timedelta(seconds=3600)
    # The entry starts pid's first servers, then becomes the time-to-live `sleep`, root's: the agent cannot stop it.
    assert attrs["Config"]["Cmd"][3:5] == ["pid-entry", "3600"]
    top = client.api.top(sb.container.id, ps_args="-eo pid,user,args")
    assert ["root", "sleep 3600"] in [row[1:] for row in top["Processes"]]


def test_close_removes_container_and_is_idempotent(client):
    box = DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-close", ttl_s=300), client)
    try:
        assert box.exec("echo hi", timeout=10).exit_code == 0
    finally:
        box.close()
    box.close()
    assert gone(client, box.container.id)


def test_exception_inside_with_removes_container(client):
    holder = {}
    with pytest.raises(ZeroDivisionError):
        with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-with", ttl_s=300), client) as box:
            holder["id"] = box.container.id
            1 / 0
    assert gone(client, holder["id"])


def test_reap_expired_removes_expired_labelled_container(client):
    # Expiry in the future for any other reaper running on this engine; "now" is moved past it for ours.
    now = datetime.now(timezone.utc)
    stamp = lambda moment: moment.strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    mine = {"pid.job": JOB + "-reap", "pid.owner": OWNER, **run_labels()}   # this test run's, for the leak check
    expired = client.containers.run(IMAGE, ["sleep", "300"], detach=True,
                                    labels={**mine, "pid.expires": stamp(now + timedelta(minutes=30))})
    alive = client.containers.run(IMAGE, ["sleep", "300"], detach=True,
                                  labels={**mine, "pid.expires": stamp(now + timedelta(hours=2))})
    other = client.containers.run(IMAGE, ["sleep", "300"], detach=True,   # another installation's: not ours to reap
                                  labels={**mine, "pid.owner": OWNER + "-other",
                                          "pid.expires": stamp(now + timedelta(minutes=30))})
    try:
        removed = reap_expired(OWNER, client, now=now + timedelta(hours=1))
        assert expired.id in removed and alive.id not in removed and other.id not in removed
        assert gone(client, expired.id)
        for container in (alive, other):
            container.reload()
            assert container.status == "running"
    finally:
        for container in (expired, alive, other):
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass


def test_image_not_found_message(client):
    with pytest.raises(ImageNotFound) as info:
        DockerSandbox.create(SandboxConfig(image="pid-no-such-image:never", job_id=JOB + "-noimg"), client)
    assert "pid-no-such-image:never" in str(info.value) and "load it (`docker load`) or build it" in str(info.value)
    assert "build-offline.sh" not in str(info.value)   # (it would make a plain Debian image under a task's name)
    assert "build it with `docker/build-offline.sh`" in str(ImageNotFound("pid-sandbox:latest"))


def test_the_api_version_is_negotiated_once_per_engine_not_once_per_sandbox(monkeypatch):
    """The engine runs runc and docker-init to answer /version: a worker asks it once, then pings."""
    import requests
    from pid.sandbox import docker_client
    paths: list[str] = []
    send = requests.Session.send

    def counted(self, request, **kwargs):
        paths.append(request.path_url)
        return send(self, request, **kwargs)
    monkeypatch.setattr(requests.Session, "send", counted)
    monkeypatch.setattr(docker_client, "_api_versions", {})
    clients = [docker_client.connect() for _ in range(3)]
    try:
        assert sum(path.endswith("/version") for path in paths) == 1, paths
        assert len({c.api.api_version for c in clients}) == 1 and clients[0].api.api_version
        assert sum(path.endswith("/_ping") for path in paths) == 2, paths   # (the later ones: the engine answers)
    finally:
        for c in clients:
            c.close()


# -- workspace ------------------------------------------------------------------------------------------------
def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "edit.txt").write_text("one\ntwo\n")
    (repo / "blob.bin").write_bytes(bytes(range(256)))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "init")
    (repo / "edit.txt").write_text("one\ntwo\nuncommitted\n")   # part of the base, not of the patch
    (repo / "untracked.txt").write_text("also base\n")
    os.symlink("/etc/passwd", repo / "passwd-link")
    return repo


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): (os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_symlink() or p.is_file()}


def test_import_plain_directory(client, tmp_path):
    plain = tmp_path / "plain"
    (plain / "sub").mkdir(parents=True)
    (plain / "sub" / "a.txt").write_text("hello\n")
    (plain / "run.sh").write_text("#!/bin/sh\n")
    (plain / "run.sh").chmod(0o755)
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-plain", ttl_s=300), client) as box:
        box.import_workspace(str(plain))
        assert box.read_file("sub/a.txt") == b"hello\n"
        out = box.exec("stat -c '%a %u'  run.sh; ls -a", timeout=20).tail
        assert out == b"755 1000\n.\n..\nrun.sh\nsub\n"     # pid's base repository is not in the workspace
        box.write_file("new.txt", b"new\n")
        dest = tmp_path / "plain.patch"
        assert box.export_patch(str(dest), 1 << 20).size == dest.stat().st_size > 0
        assert b"+++ b/new.txt" in dest.read_bytes()
    assert not (plain / ".git").exists()


def test_import_before_any_agent_command_writes_the_job_disk_directly(client, tmp_path, monkeypatch):
    src = tmp_path / "src"
    (src / "d" / "empty").mkdir(parents=True)
    (src / "d" / "f.txt").write_text("f\n")
    (src / "d" / "f.txt").chmod(0o640)
    os.utime(src / "d" / "f.txt", (1_000_000_000, 1_000_000_000))
    os.symlink("/etc/hostname", src / "abs")          # links stay links, whatever they point at
    os.symlink("d/f.txt", src / "rel")
    os.link(src / "d" / "f.txt", src / "hard")
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-direct", ttl_s=300), client) as box:
        if box.container.disk is None:
            missing("no job disk on this host (per-job disks need root and loop devices): the workspace goes "
                    "through the engine")
        real = box.container.client.api.put_archive
        calls: list[str] = []
        monkeypatch.setattr(box.container.client.api, "put_archive",
                            lambda cid, path, data: calls.append(path) or real(cid, path, data))
        box.import_workspace(str(src))
        assert calls == []                               # no engine request
        out = box.exec("stat -c '%n %a %u:%g' d d/empty; stat -c '%n %a %u:%g %Y %h' d/f.txt; readlink abs rel; "
                       "stat -c '%u' abs; cat rel", timeout=20).tail
        assert out == (b"d 755 1000:1000\nd/empty 755 1000:1000\nd/f.txt 640 1000:1000 1000000000 2\n"
                       b"/etc/hostname\nd/f.txt\n1000\nf\n")
        assert Path("/etc/hostname").stat().st_uid == 0   # the host's file the link names was not touched
        box.write_file("new.txt", b"new\n")             # after an agent request, imports go through the engine
        box.import_workspace(str(src))
        assert calls == [box.workdir]


def test_import_of_a_worktree_whose_git_is_a_file(client, tmp_path):
    tree = tmp_path / "wt"
    tree.mkdir()
    (tree / ".git").write_text("gitdir: /somewhere/else/.git/worktrees/wt\n")
    (tree / "a.txt").write_text("a\n")
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-wt", ttl_s=300), client) as box:
        box.import_workspace(str(tree))
        box.write_file("a.txt", b"b\n")
        dest = tmp_path / "wt.patch"
        box.export_patch(str(dest), 1 << 20)
        assert b"-a\n+b\n" in dest.read_bytes()
    assert (tree / ".git").read_text().startswith("gitdir:")  # the host copy is untouched


def test_git_repo_patch_roundtrip(client, tmp_path):
    repo = make_repo(tmp_path)
    before = snapshot(repo)
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-git", ttl_s=300), client) as box:
        box.import_workspace(str(repo))
        # the repository's own history arrives as it was: uncommitted changes stay uncommitted for the agent
        assert box.exec("git status --porcelain", timeout=20).tail == b" M edit.txt\n?? passwd-link\n?? untracked.txt\n"
        assert box.exec("readlink passwd-link", timeout=10).tail == b"/etc/passwd\n"
        box.write_file("edit.txt", b"one\nTWO\nuncommitted\n")
        box.write_file("added/new.txt", b"brand new\n")
        box.write_file("blob.bin", bytes(reversed(range(256))))
        box.write_file("img.bin", b"\x89PNG\0\1\2\xff" * 100)
        patch = tmp_path / "out.patch"
        size = box.export_patch(str(patch), 1 << 20).size
        text = patch.read_bytes()
        assert size == len(text)
        assert b"+TWO" in text and b"b/added/new.txt" in text and b"GIT binary patch" in text
        assert b"uncommitted" not in text.replace(b" uncommitted\n", b"")   # context only, not a change

        box.exec("ln -s /etc etc-link && ln -s /.pid deep-link && mkdir -p /tmp/o && ln -s /etc/passwd /tmp/o/pl && "
                 "ln -s /etc/passwd added/pl", timeout=10)   # (the engine follows them as root)
        copied, skipped = box.export_files(["passwd-link", "added", "missing-file", "etc-link/passwd",
                                            "deep-link/git/config", "etc-link/", "nothere/../deep-link/git",
                                            "/tmp/o/pl"],
                                           str(tmp_path / "files"), FilesBudget(1 << 20, 100))
    assert snapshot(repo) == before                      # the host repo was never modified
    # export: the link to /etc/passwd is refused, nothing of the host file leaks; the directory arrives
    files = tmp_path / "files" / "workspace"   # the in-container path is kept under dest_dir
    assert copied == [str(files / "added"), str(files / "added" / "new.txt")]
    assert sorted((s.path, s.reason) for s in skipped) == [   # (each named as asked for)
        ("/tmp/o/pl", "symlink"), ("added/pl", "symlink"),
        ("deep-link/git/config", "a link on its way"), ("etc-link/", "a link on its way"),
        ("etc-link/passwd", "a link on its way"), ("missing-file", "not found"),
        ("nothere/../deep-link/git", "a link on its way"), ("passwd-link", "symlink")]
    assert (files / "added" / "new.txt").read_bytes() == b"brand new\n"
    assert not os.path.lexists(files / "passwd-link")
    assert not os.path.lexists(tmp_path / "files" / "tmp")   # (nothing came of /tmp/o/pl: no folders for it)
    host_passwd = Path("/etc/passwd").read_bytes()
    assert all(p.read_bytes() != host_passwd for p in files.rglob("*") if p.is_file())

    fresh = tmp_path / "fresh"
    shutil.copytree(repo, fresh, symlinks=True)
    subprocess.run(["git", "apply", "--check", str(patch)], cwd=fresh, check=True)
    subprocess.run(["git", "apply", str(patch)], cwd=fresh, check=True)
    assert (fresh / "added" / "new.txt").read_text() == "brand new\n"
    assert (fresh / "blob.bin").read_bytes() == bytes(reversed(range(256)))
    assert (fresh / "edit.txt").read_text() == "one\nTWO\nuncommitted\n"


def test_files_asked_for_in_any_spelling_land_once_under_their_in_container_path(client, tmp_path):
    """A new user's test: `--file .` put the workspace's files at files/a.py where `--file a.py` put it at
    files/workspace/a.py (and with both, in both places); `--file d` with `--file /workspace/d/sub/` warned that the
    files below sub were left out, as there already; `--file /` was refused file by file, as absolute paths."""
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-files", ttl_s=300), client) as box:
        box.exec("mkdir -p d/sub && echo a > a.py && echo b > d/sub/b.txt", timeout=10)
        dest = tmp_path / "files"
        copied, skipped = box.export_files([".", "a.py", "./a.py", "d", "/workspace/d/sub/", "../workspace/a.py"],
                                           str(dest), FilesBudget(1 << 20, 100))
        assert skipped == []
        files = dest / "workspace"
        assert sorted(copied) == sorted({str(files), str(files / "a.py"), str(files / "d"), str(files / "d" / "sub"),
                                         str(files / "d" / "sub" / "b.txt")})
        assert (files / "a.py").read_text() == "a\n" and sorted(os.listdir(dest)) == ["workspace"]

        copied, skipped = box.export_files(["/", "a.py", "d/*.txt", "//"], str(tmp_path / "again"),
                                           FilesBudget(1 << 20, 100))
        assert copied == [str(tmp_path / "again" / "workspace" / "a.py")]
        assert [(s.path, s.reason) for s in skipped] == [   # ("//" was the whole root: posixpath keeps it so)
            ("/", "the whole filesystem: name the directories to collect"),
            ("d/*.txt", "not found (a path, not a pattern: name the directory)")]


def test_under_runc_the_patch_comes_from_pids_disk_without_the_engine(client, monkeypatch, tmp_path):
    """The engine's archive of the patch cost a `docker-tar` process per job (~30 ms of CPU): under runc the host
    reads the file on pid's disk, where pid's git wrote it. (gVisor's writes may wait in its own cache: there the
    engine still copies it; the gVisor tier's patch tests take that way.)"""
    repo = make_repo(tmp_path)
    config = SandboxConfig(image=IMAGE, runtime="runc", job_id=JOB + "-patch-host", ttl_s=300)
    with DockerSandbox.create(config, client) as box:
        assert box.container.host_kernel and box.container.pid_disk is not None
        box.import_workspace(str(repo))
        box.write_file("added/new.txt", b"brand new\n")

        def no_engine(*args, **kwargs):
            raise AssertionError("the patch went through the engine")
        monkeypatch.setattr(box.container.client.api, "get_archive", no_engine)
        patch = tmp_path / "out.patch"
        assert box.export_patch(str(patch), 1 << 20).size == patch.stat().st_size
    assert b"+brand new" in patch.read_bytes() and b"b/added/new.txt" in patch.read_bytes()


def test_a_repository_that_came_with_the_workspace_is_said_to_be_left_out(client, tmp_path):
    """A hostile-repository test's: a workspace holding a repository of its own (`vendor/lib/.git`, committed): the
    agent's changes inside it were in no patch, and nothing said so. It is named in the report now; the rest of the
    patch is made as before."""
    repo = make_repo(tmp_path)
    nested = repo / "vendor" / "lib"
    nested.mkdir(parents=True)
    git(nested, "init", "-q")
    (nested / "lib.c").write_text("int x;\n")
    git(nested, "add", "-A")
    git(nested, "commit", "-qm", "lib")
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-nested", ttl_s=300), client) as box:
        box.import_workspace(str(repo))
        assert box.exec("echo 'int y;' >> vendor/lib/lib.c && echo more >> edit.txt && echo ok",
                        timeout=30).tail == b"ok\n"
        copy = box.export_patch(str(tmp_path / "out.patch"), 1 << 20)
    text = (tmp_path / "out.patch").read_bytes()
    assert b"+more" in text and b"lib.c" not in text
    assert [(s.path, s.reason) for s in copy.dropped] == [("vendor/lib", NESTED_WHY)]


def test_what_git_cannot_record_is_left_out_of_the_patch_and_said(client, tmp_path):
    """A new directory with a repository of its own (`cargo new` runs `git init`): with no commit yet, git refused it
    and with it the whole patch; with one, git recorded only that commit and its files were gone without a word. A
    tracked file the agent replaced with a FIFO failed the whole patch too. Now the rest of the patch is made, and
    each is in its report; so is a new FIFO, which git passed over without a word (unless a .gitignore ignores it)."""
    repo = make_repo(tmp_path)
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-gitlink", ttl_s=300), client) as box:
        box.import_workspace(str(repo))
        box.write_file("edit.txt", b"changed\n")
        assert box.exec("mkdir -p fresh committed && echo a > fresh/a.rs && echo b > committed/b.rs && "
                        "git -C fresh init -q && git -C committed init -q && "
                        "git -C committed -c user.name=a -c user.email=a@b commit -q --allow-empty -m x && "
                        "rm untracked.txt && mkfifo untracked.txt && mkfifo new.fifo skip.fifo && "
                        "echo skip.fifo > .gitignore && ln -s .gitignore fresh/.gitignore && mkfifo fresh/f && "
                        "echo ok", timeout=30).tail == b"ok\n"   # (a looping .gitignore: git's warning is no error)
        copy = box.export_patch(str(tmp_path / "out.patch"), 1 << 20)
        # a name with a line break could forge git's words: with one about, git's errors fail the patch again
        assert box.exec("d=$'q\\nhint: z'; mkdir -p \"$d\" && git -C \"$d\" init -q && echo ok", timeout=30).tail == \
            b"ok\n"
        with pytest.raises(SandboxError, match="making the patch failed"):
            box.export_patch(str(tmp_path / "again.patch"), 1 << 20)
    text = (tmp_path / "out.patch").read_bytes()
    assert b"+changed" in text and b"b/committed" not in text and b"b/fresh" not in text
    assert sorted((s.path, s.reason.split(" (")[0]) for s in copy.dropped) == [
        ("committed", "a git repository of its own"),
        ("fresh", "a git repository of its own with no commit yet"),
        ("fresh/f", "not a regular file, a link or a directory"),
        ("new.fifo", "not a regular file, a link or a directory"),   # (git said nothing of it: pid looked)
        ("untracked.txt", "not a regular file, a link or a directory")]


@pytest.fixture
def image_without_bash(client):
    """The default image with bash removed: the channel must work with POSIX sh alone."""
    base = client.containers.create(IMAGE, ["sh", "-c", "rm -f /usr/bin/bash /bin/bash"])
    try:
        base.start()
        base.wait(timeout=30)
        image = base.commit(repository="pid-test-nobash", tag=f"{os.getpid()}")
    finally:
        base.remove(force=True)
    yield image.tags[0]
    docker.from_env(timeout=600).images.remove(image.id, force=True)


def test_a_start_the_engine_fails_is_tried_again_and_a_refused_one_is_not(client, monkeypatch):
    """containerd may time out starting a container on a loaded host (a 5xx from the engine; once in CI: "opening w/o
    fifo ... context deadline exceeded"): the container, still only created, is started again. A start the engine
    refuses (a 4xx), or one that keeps failing, ends the sandbox's creation with its error, nothing left behind."""
    from pid.sandbox import launch
    from tests.conftest import failing_starts
    real_start, calls = client.api.start, []
    monkeypatch.setattr(launch, "START_PAUSE_S", 0.01)
    monkeypatch.setattr(client.api, "start", failing_starts(real_start, calls, 1, 500))
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-restart", ttl_s=300), client) as box:
        assert box.exec("echo up", timeout=10).tail == b"up\n" and len(calls) == 2
    for times, status, tried in ((9, 500, launch.START_ATTEMPTS), (1, 400, 1)):
        calls.clear()
        monkeypatch.setattr(client.api, "start", failing_starts(real_start, calls, times, status))
        with pytest.raises(SandboxError, match="cannot start sandbox container .*context deadline exceeded"):
            DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-restart", ttl_s=300), client)
        assert len(calls) == tried
        assert not client.containers.list(all=True, filters={"label": f"pid.job={JOB}-restart"})


def test_posix_sh_fallback_without_bash(client, image_without_bash):
    with DockerSandbox.create(SandboxConfig(image=image_without_bash, job_id=JOB + "-sh", ttl_s=300), client) as box:
        result = box.exec("X=\"a 'b'\"; echo $0 \"$X\" $(id -u); exit 5", timeout=10)
        assert (result.exit_code, result.tail) == (5, b"sh a 'b' 1000\n")
        data = bytes(range(256)) * 40
        box.write_file("d/x.bin", data)
        assert box.read_file("d/x.bin") == data and box.read_file("d/x.bin", max_bytes=3) == data[:3]
        big_data = os.urandom(100000)
        box.write_file("d/big.bin", big_data)
        assert box.read_file("d/big.bin") == big_data
        started = time.monotonic()
        assert box.exec("sleep 1000 & sleep 1001", timeout=1).timed_out
        assert time.monotonic() - started < 5
        assert b"sleep 100" not in box.exec("ps -eo args", timeout=10).tail
        big = box.exec("seq 1 100000", timeout=30, output=OutputPolicy(tail_bytes=10))
        assert (big.total_lines, big.tail) == (100000, b"99\n100000\n")


def test_the_engines_errors_reach_callers_as_sandbox_errors(client, monkeypatch, tmp_path):
    # The runner knows pid.sandbox_api's errors only: an engine whose connection drops mid-call is a SandboxError, never
    # the Docker SDK's or its transport's own exception (export_files used to let requests' errors through). (A box of
    # its own: export_files first asks the container, which must be up.)
    import requests.exceptions

    def dropped(*args, **kwargs):
        raise requests.exceptions.ConnectionError("connection aborted")
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-engine-errors", ttl_s=300), client) as sb:
        monkeypatch.setattr(sb.container.client.api, "get_archive", dropped)
        with pytest.raises(SandboxError, match="connection aborted"):
            sb.export_files(["x.txt"], str(tmp_path), FilesBudget(max_bytes=1 << 20, max_entries=100))


def test_a_container_gone_before_collection_leaves_its_patch_and_files(client, tmp_path):
    """The kernel's memory kill can take the whole container down (pages in /dev/shm), and so can someone's `docker
    rm -f`: the patch and the files were lost with it, though the agent's work is on the job's disk. A fresh
    container on those disks, with nothing of the agent's running, now collects them; it goes with the sandbox."""
    repo = make_repo(tmp_path)
    job = JOB + "-revived"
    box = DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=job, ttl_s=300), client)
    try:
        box.import_workspace(str(repo))
        box.write_file("edit.txt", b"changed before the loss\n")
        assert box.exec("mkdir -p out && echo report > out/r.txt && echo ok", timeout=30).tail == b"ok\n"
        first = box.container.id
        client.api.remove_container(first, force=True)
        copy = box.export_patch(str(tmp_path / "out.patch"), 1 << 20)
        files, skipped = box.export_files(["out/r.txt"], str(tmp_path / "files"), FilesBudget(1 << 20, 100))
        assert box.container.id != first and box.is_alive()
        # nothing of the agent's was started there: pid's control server and its own scripts only
        users = box.run_as_pid("ps -eo user= | sort -u", "listing").decode().split()
        assert users == ["root"], users
    finally:
        box.close()
    assert b"+changed before the loss" in (tmp_path / "out.patch").read_bytes() and copy.size > 0
    assert skipped == [] and [open(path).read() for path in files] == ["report\n"]
    assert not client.containers.list(all=True, filters={"label": f"pid.job={job}"})
    assert box.container.disk is not None and box.container.disk.closed   # (the disks went with the sandbox)


def test_a_container_removed_by_pid_is_not_revived(client, tmp_path, monkeypatch):
    """The watchdog's kill (a wall clock run out, a collection past its deadline) is meant: nothing comes back, also
    when it comes while a revival is under way (the review's). Nor for a root agent, which could have replaced what
    pid's servers run there."""
    import pid.sandbox.docker_sandbox as docker_sandbox
    repo = make_repo(tmp_path)
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-killed", ttl_s=300), client) as box:
        box.import_workspace(str(repo))
        box.kill()
        with pytest.raises(SandboxError):
            box.export_patch(str(tmp_path / "out.patch"), 1 << 20)
        assert not box.is_alive() and box.removed_by_pid
    made = []

    def launched_then_killed(gone):
        made.append(launch(gone))
        midway.kill()   # (the collection's deadline, as the new container is being made)
        return made[-1]
    launch = docker_sandbox.launch_on_disks_of
    monkeypatch.setattr(docker_sandbox, "launch_on_disks_of", launched_then_killed)
    for job, user in ((JOB + "-killed-midway", None), (JOB + "-root", "root")):
        with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=job, ttl_s=300, **({"user": user} if user else
                                                {})), client) as midway:
            midway.import_workspace(str(repo))
            client.api.remove_container(midway.container.id, force=True)
            with pytest.raises(SandboxError):
                midway.export_patch(str(tmp_path / f"{job}.patch"), 1 << 20)
            assert not client.containers.list(all=True, filters={"label": f"pid.job={job}"})
    assert len(made) == 1   # (the root agent's sandbox was never revived)


def test_a_container_that_ran_out_of_memory_and_lost_pids_server_is_revived(client, tmp_path, monkeypatch):
    """Pages in /dev/shm cannot be freed: the kernel's memory kill may take pid's own server while the container
    runs on, and with /dev/shm full no new one could make the patch there (an attack's finding). A container whose
    memory ran out is then replaced too, by a fresh one on its disks, whose /dev/shm is empty."""
    repo = make_repo(tmp_path)
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-shm", ttl_s=300, memory="64m"), client) as box:
        box.import_workspace(str(repo))
        box.write_file("edit.txt", b"changed before the memory ran out\n")
        try:   # (the kernel may take that call's own server: then the call fails, saying so)
            box.exec("head -c 40M /dev/zero > /dev/shm/fill; python3 -c 'a = bytearray(40 << 20)'", timeout=60)
        except SandboxError as exc:
            assert "ran out of memory" in str(exc)
        assert box.commands.memory.ever_ran_out() and box.is_alive()
        first = box.container.id
        make = box._export_patch
        failures = iter([SandboxError("exec channel closed (container stopped?)")])

        def lost_once(*args):   # (the kernel's choice, made here: pid's server in it is gone, none can start)
            for failure in failures:
                raise failure
            return make(*args)
        monkeypatch.setattr(box, "_export_patch", lost_once)
        copy = box.export_patch(str(tmp_path / "out.patch"), 1 << 20)
        assert box.container.id != first and copy.size > 0
        assert box.run_as_pid("ls /dev/shm | wc -l", "looking").strip() == b"0"
    assert b"+changed before the memory ran out" in (tmp_path / "out.patch").read_bytes()


def test_new_files_over_the_patchs_limit_are_left_out_before_git_reads_them(client, tmp_path):
    """A 480 MB checkpoint filled pid's disk with its objects and its diff before the host could leave it out, and
    the whole patch failed (an attack's finding). pid's git now leaves out, unread, each new file whose diff alone
    would be over --max-patch: text over it, or binary that stays over it compressed. One that compresses well stays
    in (its diff is small), and so do changes to files the workspace had."""
    repo = make_repo(tmp_path)
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-bignew", ttl_s=300), client) as box:
        box.import_workspace(str(repo))
        box.write_file("edit.txt", b"changed\n")
        made = box.exec("head -c 3000000 /dev/urandom > 'model*.bin' && yes 'a line of a log' | head -c 1500000 > "
                        "big.log && head -c 3000000 /dev/zero > sparse.bin && printf 'x\\000' > small.bin && echo ok",
                        timeout=60)
        assert made.tail == b"ok\n", made
        copy = box.export_patch(str(tmp_path / "out.patch"), 1 << 20)
        stored = int(box.run_as_pid("du -sk /.pid/patch/objects | cut -f1", "measuring").strip())
    patch = (tmp_path / "out.patch").read_bytes()
    assert b"+changed" in patch and b"b/sparse.bin" in patch and b"b/small.bin" in patch
    assert b"model" not in patch and b"big.log" not in patch
    reason = "a new file whose diff alone is over the 1 MB limit (--max-patch): left out, the rest of the patch kept"
    assert sorted((s.path, s.reason) for s in copy.dropped) == [("big.log", reason), ("model*.bin", reason)]
    assert stored < 1000, stored   # (kB: neither left-out file was stored on pid's disk)


def _servers_heap_kib(client, container_id: str) -> int:
    """The agent servers' heap (RssAnon) together, read from the host (runc: their processes are the host's).
    Only the servers themselves: a child a server has just forked (a slot shell before its exec) has the same
    arguments and, until it execs, a copy of the server's heap (a CI run under load once counted one)."""
    rows = [(int(row[0]), int(row[1]), row[2])
            for row in client.api.top(container_id, ps_args="-o pid,ppid,args")["Processes"]]
    servers = {pid for pid, _, args in rows if "channel.sh " in args}
    total = 0
    for pid, parent, args in rows:
        if "channel.sh agent" in args and parent not in servers:
            status = Path(f"/proc/{pid}/status").read_text()
            total += int(status.split("RssAnon:")[1].split()[0])
    return total


def test_a_closed_sandbox_leaves_no_connection_to_the_engine():
    """A sandbox made without a client makes its own, and closes it with the container: a worker soak found ~6
    connections to the engine left per job until a garbage collection, hundreds at once (the engine's too)."""
    gc.collect()
    gc.disable()   # (what a collection would free is what this looks for)
    try:
        before = len(open_descriptors("socket:"))
        for n in range(3):
            box = DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=f"{JOB}-conn{n}", ttl_s=120))
            try:
                box.exec("true", timeout=10)
                box.read_file("/etc/hostname")
            finally:
                box.close()
            assert not box.is_alive() and not box.container.client.api.get_adapter("http+docker://").pools
        remove_job_containers(f"{JOB}-conn0")   # (the reaper's and the image check's own clients too)
        ensure_image(IMAGE)
        left = len(open_descriptors("socket:")) - before
    finally:
        gc.enable()
    assert left <= 3, f"{left} sockets left by 3 closed sandboxes"   # (~6 each before; 3: another test's thread)


@pytest.mark.parametrize("drop", ["pid's", "setpriv"])
def test_a_long_session_does_not_grow_its_server(client, monkeypatch, drop):
    """bash 5.2 kept every command's dead job in its table for good once the server looked at its process group
    (`kill -0 -<pgid>`): ~330 bytes of the server's heap per command, and a longer scan of that table at every fork
    and wait (the container's CPU per paced `true` grew from 1.9 to 2.7 ms over 6,000 calls). Where pid's drop
    forks the shells they are never the server's jobs; through setpriv they are."""
    if drop == "setpriv":
        without_pids_drop(monkeypatch)
    box = DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-long", ttl_s=300), client)
    try:
        for _ in range(200):
            box.exec("true", timeout=10)
        before = _servers_heap_kib(client, box.container.id)
        for _ in range(1500):
            box.exec("true", timeout=10)
        grown = _servers_heap_kib(client, box.container.id) - before
        assert grown < 150, f"the servers' heap grew {grown} KiB over 1,500 commands"   # (it was ~490)
    finally:
        box.close()


def test_an_output_scan_the_agent_stops_is_not_kept_by_the_server(client):
    """When a command leaves background processes, the server looks (as the agent) for one that holds its output
    open. The agent can SIGSTOP that scan: the server's wait then returns, and the stopped scan used to stay, one
    more stopped child of the root server per command."""
    stopper = ("python3 - <<'PY' >/dev/null 2>&1\n"
               "import os, signal, sys\n"
               "if os.fork(): sys.exit(0)\n"
               "os.setsid()\n"
               "if os.fork(): os._exit(0)\n"
               "while True:\n"
               "    for d in os.listdir('/proc'):\n"
               "        try:\n"
               "            if d.isdigit() and b'pid-scan' in open(f'/proc/{d}/cmdline', 'rb').read():\n"
               "                os.kill(int(d), signal.SIGSTOP)\n"
               "        except OSError:\n"
               "            pass\n"
               "PY\n"
               "echo started")
    box = DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-scan", ttl_s=300), client)
    try:
        assert box.exec(stopper, timeout=30).tail == b"started\n"
        for _ in range(8):
            done = box.exec("(sleep 0.2) & echo x", timeout=30)
            assert (done.exit_code, done.tail) == (0, b"x\n"), done
        rows = client.api.top(box.container.id, ps_args="-o pid,args")["Processes"]
        servers = {int(pid) for pid, args in rows if "channel.sh agent" in args}
        stopped = [pid for pid, _ in rows
                   if (fields := _stat_fields(int(pid))) and fields[0] == "T" and int(fields[1]) in servers]
        assert stopped == [], f"{len(stopped)} stopped children of the servers"
        assert box.exec("echo fine", timeout=30).tail == b"fine\n"
    finally:
        box.close()


def _stat_fields(pid: int) -> list[str] | None:
    """State, parent pid, ... of a host process (None when it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
