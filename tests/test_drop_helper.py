"""pid's privilege drop (sandbox/drop.c, built by sandbox/drop_helper.py), run here on the host as root would run it
in a container: what it leaves the program, what it refuses, and how it is built and kept. (In a container, under
runc and gVisor: tests/test_task_images.py, tests/test_trust_boundary.py.)"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from pid.sandbox import drop_helper

pytestmark = pytest.mark.cli


def cache_clear() -> None:
    drop_helper.program.cache_clear()
    drop_helper.library.cache_clear()


@pytest.fixture
def built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The program, built afresh into a cache of this test's own, and its zygote's half beside it (drop.so)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cache_clear()
    try:
        data, library = drop_helper.program(), drop_helper.library()
    finally:
        cache_clear()
    assert data is not None and data.startswith(b"\x7fELF") and len(data) < 16384
    assert library is not None and library.startswith(b"\x7fELF") and len(library) < 32768
    path = tmp_path / "drop"
    path.write_bytes(data)
    path.chmod(0o555)
    (tmp_path / "drop.so").write_bytes(library)
    return path


@pytest.mark.skipif(os.geteuid() != 0, reason="the drop changes ids: only root may")
def test_the_program_runs_with_the_ids_and_no_capability_or_group_left(built: Path):
    out = subprocess.run([str(built), "1000", "1001", "/bin/sh", "-c",
                          "id -u; id -g; id -G; grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs)' /proc/self/status"],
                         capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and lines[:3] == ["1000", "1001", "1001"], out
    assert {line.split()[0]: line.split()[1] for line in lines[3:] if line.startswith("Cap")} == {
        "CapInh:": "0" * 16, "CapPrm:": "0" * 16, "CapEff:": "0" * 16, "CapBnd:": "0" * 16, "CapAmb:": "0" * 16}


@pytest.mark.parametrize("args", [[], ["1000", "1000"], ["x", "1000", "/bin/true"], ["1000", "-1", "/bin/true"],
                                  ["1000", "1000", "true"], ["99999999999", "1", "/bin/true"],
                                  ["1000", "1000", "-s"], ["1000", "1000", "-s", "sh"],
                                  ["1000", "1000", "-x", "/bin/sh"]])
def test_bad_arguments_run_nothing(built: Path, args: list[str]):
    out = subprocess.run([str(built), *args], capture_output=True, timeout=30)
    assert out.returncode == 127 and out.stdout == b"" and out.stderr == b""


@pytest.mark.skipif(os.geteuid() != 0, reason="the drop changes ids: only root may")
def test_serving_it_forks_each_shell_dropped_in_a_group_of_its_own_and_reports_its_end_as_wait_does(built: Path,
                                                                                                     tmp_path: Path):
    """channel.sh's slot shells (its spawner): each request forks one, as root until its files are open, then
    dropped; the end of each is told as bash's `wait` tells it, and only for a child of its own."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    holder = os.open(fifo, os.O_RDWR)   # (the server holds its FIFOs so: a shell's open never blocks)
    script = ('read -r -u 3 x; echo $x $(id -u) $(id -G) $(ps -o pgid= $$) $MARK; ls /proc/$$/fd; '
              'grep -E "^Cap(Inh|Prm|Eff|Bnd|Amb):" /proc/$$/status | cut -f2; exit 7')
    old_umask = os.umask(0o022)
    try:
        server = subprocess.Popen([str(built), "1000", "1001", "-s", "/bin/bash", "-c", script, "bash"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={"PATH": "/usr/bin:/bin",
                                                                                      "MARK": "env-kept"},
                                  # (SIGCHLD ignored, as a parent may leave it: every child was then reaped unasked)
                                  preexec_fn=lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN))
    finally:
        os.umask(old_umask)

    def ask(line: str) -> int:
        assert server.stdin and server.stdout
        server.stdin.write(line.encode() + b"\n")
        server.stdin.flush()
        reply = server.stdout.read(16)
        assert len(reply) == 16 and reply.endswith(b"\n"), reply
        return int(reply.split()[0])   # (a new shell's: then its parent, this drop)

    try:
        out = tmp_path / "out"
        shell = ask(f"s {fifo} {out}")
        os.write(holder, b"hello\n")
        assert ask(f"w {shell}") == 7
        assert out.read_text().split() == ["hello", "1000", "1001", str(shell), "env-kept",   # its own group
                                           "0", "1", "2", "3",   # fd 3: the FIFO, read-only; nothing of the server's
                                           *["0" * 16] * 5]   # no capability (the bounding set: emptied as it began)
        assert (out.stat().st_uid, out.stat().st_mode & 0o777) == (0, 0o644)         # made by root, the umask kept
        for sig, status in ((signal.SIGSTOP, 128 + signal.SIGSTOP), (signal.SIGKILL, 128 + signal.SIGKILL)):
            shell = ask(f"s {fifo} {tmp_path / 'out2'}")
            os.kill(shell, sig)
            assert ask(f"w {shell}") == status
            if sig == signal.SIGSTOP:   # stopped, told, not gone: killed, then its end
                os.kill(shell, signal.SIGKILL)
                assert ask(f"w {shell}") == 128 + signal.SIGKILL
        assert ask("w 1") == 127                                          # no child of its own
        assert ask(f"w {ask(f's {fifo} {tmp_path}/no/such/dir/out')}") == 1   # no output file: nothing ran
        assert server.stdin
        server.stdin.write(b"x 1\n")   # a request it does not know ends it
        server.stdin.flush()
        assert server.wait(timeout=10) == 127
    finally:
        server.kill()
        server.wait()
        os.close(holder)


def test_a_missing_program_runs_nothing_and_a_refused_step_ends_it_before(built: Path):
    out = subprocess.run([str(built), "1000", "1000", "/no/such/program"], capture_output=True, timeout=30)
    # as root every step is done and the exec fails (127); as anyone else the first step is refused (126)
    assert out.returncode == (127 if os.geteuid() == 0 else 126) and out.stdout == out.stderr == b""


def test_it_is_built_once_and_kept_by_its_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    drop_helper.program.cache_clear()
    try:
        first = drop_helper.program()
        kept = list((tmp_path / "pid").iterdir())
        assert first is not None and len(kept) == 1 and kept[0].read_bytes() == first
        drop_helper.program.cache_clear()
        monkeypatch.setenv("CC", "/nonexistent/cc")   # (a second build could not happen: the kept one is read)
        assert drop_helper.program() == first
        drop_helper.program.cache_clear()
        kept[0].write_bytes(b"not a program")          # a damaged cache is built again; without a compiler, none
        assert drop_helper.program() is None
        drop_helper.program.cache_clear()
        kept[0].write_bytes(first)
        kept[0].chmod(0o666)                           # a copy others could have written is not used
        assert drop_helper.program() is None
        drop_helper.program.cache_clear()
        monkeypatch.delenv("CC")
        kept[0].chmod(0o600)
        (tmp_path / "pid").chmod(0o777)                # nor one in a directory others write: built, not kept
        assert drop_helper.program() == first and kept[0].stat().st_mode & 0o777 == 0o600
    finally:
        drop_helper.program.cache_clear()


ZYGOTE_SCRIPT = ('[ -z "${1-}" ] || { sleep "${SLOW:-0}"; enable -f "$2" zserve && zserve && SECONDS=0; } || exit 99; '
                 'read -r -u 3 x; '
                 'echo $x $$ $BASHPID $PPID $(id -u) $(ps -o pgid= $$) $(ps -o ppid= $$) $SECONDS; ls /proc/$$/fd; '
                 'stat -c %u /proc/$$/status; grep -c "^Gid:\\s*1001\\s*1001\\s*1001\\s*1001$" /proc/$$/status; '
                 'exit 7')


@pytest.fixture
def readable() -> Iterator[Path]:
    """A directory the agent's uid can read (a test's own tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="pid-zygote-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@contextlib.contextmanager
def serving(drop: Path, library: Path, readable: Path,
            slow: float = 0) -> Iterator[tuple[subprocess.Popen, Callable[[str], list[int]], Path, int]]:
    """The drop serving with a zygote of `library` (a copy in `readable`), how to ask it (the numbers of its
    answer), a FIFO for its shells and the descriptor that holds it open (as the server holds its own); all ended
    after."""
    if library.exists():
        shutil.copy(library, readable / library.name)
    fifo = readable / "fifo"
    os.mkfifo(fifo)
    holder = os.open(fifo, os.O_RDWR)   # (a shell's open of it never blocks)
    old_umask = os.umask(0o022)
    try:
        server = subprocess.Popen([str(drop), "1000", "1001", "-s", "-z", str(readable / library.name), "/bin/bash",
                                   "-c", ZYGOTE_SCRIPT, "bash"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  env={"PATH": "/usr/bin:/bin", "SLOW": str(slow)})
    finally:
        os.umask(old_umask)

    def ask(line: str) -> list[int]:
        assert server.stdin and server.stdout
        server.stdin.write(line.encode() + b"\n")
        server.stdin.flush()
        reply = server.stdout.read(16)
        assert len(reply) == 16 and reply.endswith(b"\n"), reply
        return [int(word) for word in reply.split()]
    try:
        yield server, ask, fifo, holder
    finally:
        server.kill()
        server.wait()
        os.close(holder)


def _uid_and_owner(pid: int) -> tuple[int, int]:
    """A process's real uid, and who owns its /proc entries (root for one that is not dumpable)."""
    status = Path(f"/proc/{pid}/status")
    uid = next(int(line.split()[1]) for line in status.read_text().splitlines() if line.startswith("Uid:"))
    return uid, status.stat().st_uid


@pytest.mark.skipif(os.geteuid() != 0, reason="the drop changes ids: only root may")
def test_its_zygote_forks_each_shell_from_a_bash_that_ran_nothing_and_one_that_goes_is_replaced(built: Path,
                                                                                                 tmp_path: Path,
                                                                                                 readable: Path):
    """With -z, the shells are forked by a bash of the agent's (the zygote) that loaded drop.c's builtin: each is its
    own process ($$, its group, SECONDS from 0), the zygote is out of the agent's reach but for signals (not
    dumpable: /proc shows it as root's), and a zygote killed or stopped is ended, its shells with it (128 + SIGKILL),
    and the next shell comes from a new zygote."""
    with serving(built, tmp_path / "drop.so", readable) as (server, ask, fifo, holder):
        shell, zygote = ask(f"s {fifo} {tmp_path / 'out'}")
        assert zygote not in (server.pid, shell) and _uid_and_owner(zygote) == (1000, 0)
        os.write(holder, b"hello\n")
        assert ask(f"w {shell}") == [7]
        words = (tmp_path / "out").read_text().split()
        # $PPID: the zygote's own parent, as for a shell the drop forks; SECONDS from 0 (bash counts the clock's
        # whole seconds); the shell dumpable, as after an exec
        assert words[7] in ("0", "1"), words
        assert words[:7] + words[8:] == ["hello", str(shell), str(shell), str(server.pid), "1000", str(shell),
                                         str(zygote), "0", "1", "2", "3", "1000", "1"], words   # (its gids)
        waiting, same = ask(f"s {fifo} {tmp_path / 'out2'}")
        assert same == zygote
        os.kill(waiting, signal.SIGSTOP)   # stopped, told, still the zygote's: then killed, and its end
        assert ask(f"w {waiting}") == [128 + signal.SIGSTOP]
        os.kill(waiting, signal.SIGKILL)
        assert ask(f"w {waiting}") == [128 + signal.SIGKILL]
        assert ask(f"w {waiting}") == [127]   # (reaped: no child any more)
        waiting, _ = ask(f"s {fifo} {tmp_path / 'out2'}")
        for sig in (signal.SIGKILL, signal.SIGSTOP):
            os.kill(zygote, sig)
            assert ask(f"w {waiting}") == [128 + signal.SIGKILL]   # gone with its zygote
            waiting, parent = ask(f"s {fifo} {tmp_path / 'out3'}")
            assert parent not in (server.pid, zygote) and _uid_and_owner(parent) == (1000, 0), (parent, zygote)
            zygote = parent   # a new one
        os.kill(waiting, signal.SIGKILL)
        assert ask(f"w {waiting}") == [128 + signal.SIGKILL]


@pytest.mark.skipif(os.geteuid() != 0, reason="the drop changes ids: only root may")
def test_a_zygote_that_cannot_load_its_builtin_leaves_the_drop_forking_each_shell(built: Path, tmp_path: Path,
                                                                                   readable: Path):
    with serving(built, tmp_path / "no-such.so", readable) as (server, ask, fifo, holder):
        for _ in range(3):
            shell, parent = ask(f"s {fifo} {tmp_path / 'out'}")
            assert parent == server.pid   # forked by the drop itself
            os.write(holder, b"x\n")
            assert ask(f"w {shell}") == [7]
            assert (tmp_path / "out").read_text().split()[:2] == ["x", str(shell)]


@pytest.mark.skipif(os.geteuid() != 0, reason="the drop changes ids: only root may")
def test_the_zygote_is_never_the_agents_to_trace_and_one_whose_fork_fails_is_replaced(built: Path, tmp_path: Path,
                                                                                        readable: Path):
    """The zygote is not dumpable from its exec on, before its builtin is even loaded: there is no moment in which
    the agent could open its memory or trace it. A zygote whose fork fails (the agent may lower its limits: same
    uid) is ended, and the drop forks that shell itself: no false "process table full"."""
    with serving(built, tmp_path / "drop.so", readable, slow=1) as (server, ask, fifo, holder):   # (a slow start)
        time.sleep(0.5)
        starting = [int(p) for p in Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()]
        assert len(starting) == 1 and _uid_and_owner(starting[0]) == (1000, 0)   # still before `enable -f`
        shell, zygote = ask(f"s {fifo} {tmp_path / 'out'}")
        assert zygote == starting[0]
        as_agent = subprocess.run(["/usr/bin/python3", "-c", "import resource, sys; resource.prlimit(int(sys.argv[1]), "
                                   "resource.RLIMIT_NPROC, (0, 0))", str(zygote)], capture_output=True, timeout=30,
                                  user=1000, group=1001, extra_groups=[])   # (the same uid's limits: allowed)
        assert as_agent.returncode == 0, as_agent.stderr
        forked, parent = ask(f"s {fifo} {tmp_path / 'out2'}")
        assert parent == server.pid and forked > 0   # its fork refused: the drop's own
        for pid in (shell, forked):
            os.kill(pid, signal.SIGKILL)
            assert ask(f"w {pid}") == [128 + signal.SIGKILL]
        again, parent = ask(f"s {fifo} {tmp_path / 'out3'}")
        assert parent not in (server.pid, zygote)   # a new zygote, as slow to start as the first
        os.kill(again, signal.SIGKILL)
        assert ask(f"w {again}") == [128 + signal.SIGKILL]


def _helper(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pid.sandbox.drop_helper", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env}, cwd=Path(__file__).resolve().parent.parent)


def test_a_program_built_on_one_machine_is_kept_on_one_with_no_compiler(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    """As the worker image gets it (docker/build-worker.sh, Dockerfile.worker): built where a compiler is, shipped as
    a file, kept where none is, and then what the sandboxes get."""
    shipped = tmp_path / "shipped"
    built = _helper(["build", str(shipped)], {"XDG_CACHE_HOME": str(tmp_path / "builder")})
    assert built.returncode == 0 and shipped.read_bytes().startswith(b"\x7fELF"), built.stderr
    image = {"XDG_CACHE_HOME": str(tmp_path / "image"), "CC": "/nonexistent/cc"}
    none = _helper(["build", str(tmp_path / "none")], image)
    assert none.returncode == 1 and "cannot be built here" in none.stderr and not (tmp_path / "none").exists()
    other_machine = bytearray(shipped.read_bytes())
    other_machine[18:20] = (183 if other_machine[18] == 62 else 62).to_bytes(2, "little")   # x86_64 <-> aarch64
    (tmp_path / "other-machine").write_bytes(other_machine)
    (tmp_path / "junk").write_bytes(b"\x7fELF, but not a program")
    for wrong in ("/bin/true", tmp_path / "other-machine", tmp_path / "junk"):   # (/bin/true: dynamically linked)
        refused = _helper(["keep", str(wrong)], image)   # run as root in every sandbox, /bin/true would make every
        assert refused.returncode == 1 and "is not pid's privilege drop" in refused.stderr, wrong   # command a no-op
    library = Path(f"{shipped}.so").read_bytes()   # the zygote's half, beside it
    Path(f"{shipped}.so").write_bytes(shipped.read_bytes())   # (a program is no library)
    refused = _helper(["keep", str(shipped)], image)
    assert refused.returncode == 1 and "is not pid's zygote library" in refused.stderr
    Path(f"{shipped}.so").write_bytes(library)
    assert _helper(["keep", str(shipped)], image).returncode == 0
    monkeypatch.setenv("XDG_CACHE_HOME", image["XDG_CACHE_HOME"])
    monkeypatch.setenv("CC", "/nonexistent/cc")
    cache_clear()
    try:
        assert drop_helper.program() == shipped.read_bytes() and drop_helper.library() == library
    finally:
        cache_clear()
    assert _helper(["run", str(shipped)], image).returncode == 2
