"""The in-memory sandbox keeps the Docker sandbox's contract (pid/sandbox_api.py, pid/sandbox_lifecycle.py), so tests
against it say something about the real one: the errors, the output policy, timeouts, cancel, removal."""
from __future__ import annotations

import errno
import subprocess
import threading
import time
from pathlib import Path

import pytest

from pid.sandbox_api import OutputPolicy, Sandbox, SandboxError, SandboxLost
from pid.sandbox_lifecycle import FilesBudget, JobSandbox
from tests.memory_sandbox import Commands, MemoryProvider, MemorySandbox, Run


def test_it_is_both_protocols():
    box = MemorySandbox()
    assert isinstance(box, Sandbox) and isinstance(box, JobSandbox)


# -- files -------------------------------------------------------------------------------------------------------------
def test_files_round_trip_relative_paths_resolve_and_parents_are_implied():
    box = MemorySandbox()
    box.write_file("a/b/c.txt", b"data")
    assert box.read_file("/workspace/a/./b/c.txt") == b"data"
    assert box.read_file("a/b/c.txt", max_bytes=2) == b"da" and box.read_file("a/b/c.txt", max_bytes=0) == b""
    assert box.listdir("a") == ["b"] and box.listdir("/workspace/a/b") == ["c.txt"]
    box.write_file("/workspace/a/b/c.txt", b"")
    assert box.files["/workspace/a/b/c.txt"] == b""


def test_file_errors_are_the_builtins():
    box = MemorySandbox(files={"plain": "x", "locked": "secret"})
    box.special.add("/workspace/fifo")
    box.denied.add("/workspace/locked")

    def raised(fn, *args) -> tuple[type, int]:
        with pytest.raises(OSError) as info:
            fn(*args)
        return type(info.value), info.value.errno

    assert raised(box.read_file, "missing") == (FileNotFoundError, errno.ENOENT)
    assert raised(box.read_file, "plain/child") == (FileNotFoundError, errno.ENOENT)   # as Docker's snippet says
    assert raised(box.read_file, "/workspace") == (IsADirectoryError, errno.EISDIR)
    assert raised(box.read_file, "/") == (IsADirectoryError, errno.EISDIR)
    assert raised(box.read_file, "fifo") == (OSError, errno.EINVAL)
    assert raised(box.read_file, "locked") == (PermissionError, errno.EACCES)
    assert raised(box.write_file, "plain/child", b"y") == (NotADirectoryError, errno.ENOTDIR)
    assert raised(box.write_file, "/workspace", b"y") == (IsADirectoryError, errno.EISDIR)
    assert raised(box.write_file, "fifo", b"y") == (OSError, errno.EINVAL)
    assert raised(box.write_file, "locked", b"y") == (PermissionError, errno.EACCES)
    assert box.read_file("plain") == b"x"


def test_a_full_disk_refuses_the_write():
    box = MemorySandbox()
    box.disk_bytes = 10
    box.write_file("a", b"12345678")
    box.write_file("a", b"1234567890")   # replacing a file frees what it held
    with pytest.raises(OSError) as info:
        box.write_file("b", b"x")
    assert info.value.errno == errno.ENOSPC


def test_file_calls_honour_timeout_and_cancel():
    box = MemorySandbox(files={"f": "x"})
    box.file_delay_s = 5.0
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        box.read_file("f", timeout=0.1)
    assert time.monotonic() - began < 1
    cancel = threading.Event()
    threading.Timer(0.1, cancel.set).start()
    with pytest.raises(InterruptedError):
        box.write_file("f", b"y", cancel=cancel)
    assert box.files["/workspace/f"] == b"x"   # an interrupted write wrote nothing
    box.file_delay_s = 0.0
    cancel.set()
    with pytest.raises(InterruptedError):
        box.read_file("f", cancel=cancel)


# -- exec --------------------------------------------------------------------------------------------------------------
def test_exec_totals_tail_and_when_the_whole_output_is_kept():
    box = MemorySandbox({"seq": Run("1\n2\n3\nno newline"), "ten": Run("x" * 10)})
    result = box.exec("seq", timeout=5)
    assert (result.exit_code, result.tail, result.total_bytes, result.total_lines) == (0, b"1\n2\n3\nno newline", 16, 4)
    assert result.output_path is None
    tail = box.exec("seq", timeout=5, output=OutputPolicy(tail_bytes=4))
    assert tail.tail == b"line" and tail.output_path and box.read_file(tail.output_path) == b"1\n2\n3\nno newline"
    assert box.exec("seq", timeout=5, output=OutputPolicy(tail_bytes=0)).tail == b""
    assert box.exec("seq", timeout=5, output=OutputPolicy(keep_lines=4)).output_path is None
    assert box.exec("seq", timeout=5, output=OutputPolicy(keep_lines=3)).output_path   # its last line counts
    assert box.exec("ten", timeout=5, output=OutputPolicy(keep_bytes=10)).output_path is None
    assert box.exec("ten", timeout=5, output=OutputPolicy(keep_bytes=9)).output_path
    paths = [c.result.output_path for c in box.calls if c.result.output_path]
    assert len(set(paths)) == len(paths)   # every kept output has its own file


def test_output_policy_rule():
    policy = OutputPolicy(tail_bytes=100, keep_lines=3, keep_bytes=50)
    assert not policy.keeps(50, 3) and not OutputPolicy().keeps(65536, 10 ** 6)
    assert policy.keeps(51, 0) and policy.keeps(0, 4) and OutputPolicy(tail_bytes=10).keeps(11, 0)


def test_unscripted_commands_fail_like_bash():
    result = MemorySandbox().exec("frobnicate --all", timeout=5)
    assert (result.exit_code, result.tail) == (127, b"bash: frobnicate: command not found\n")


def test_exec_timeout_and_cancel_keep_the_output_so_far():
    box = MemorySandbox(Commands({"slow": Run("a\n", 10.0, "never\n", exit_code=0)}))
    began = time.monotonic()
    result = box.exec("slow", timeout=0.2)
    assert 0.15 < time.monotonic() - began < 1.5
    assert result.timed_out and not result.cancelled and result.exit_code is None and result.tail == b"a\n"
    cancel = threading.Event()
    threading.Timer(0.1, cancel.set).start()
    began = time.monotonic()
    result = box.exec("slow", timeout=60, cancel=cancel)
    assert time.monotonic() - began < 1.5
    assert result.cancelled and not result.timed_out and result.exit_code is None
    assert box.exec("slow", timeout=60, cancel=cancel).cancelled   # cancelled before it started: ends at once


def test_on_output_gets_each_piece_as_it_is_printed():
    seen: list[tuple[float, bytes]] = []
    box = MemorySandbox({"talk": Run("one\n", 0.2, b"two\n", exit_code=4)})
    began = time.monotonic()
    result = box.exec("talk", timeout=5, on_output=lambda chunk: seen.append((time.monotonic() - began, chunk)))
    assert [chunk for _, chunk in seen] == [b"one\n", b"two\n"] and seen[0][0] < 0.1 <= seen[1][0]
    assert result.exit_code == 4


def test_handlers_see_the_sandbox():
    def cat(command: str, box: MemorySandbox) -> Run:
        return Run(box.read_file(command.split()[1]))
    box = MemorySandbox(Commands({"cat notes": cat}), files={"notes": "hello"})
    assert box.exec("cat notes", timeout=5).tail == b"hello"


# -- life --------------------------------------------------------------------------------------------------------------
def test_kill_ends_a_running_command_and_every_later_call():
    box = MemorySandbox({"long": Run(30.0)})
    threading.Timer(0.1, box.kill).start()
    began = time.monotonic()
    with pytest.raises(SandboxLost):
        box.exec("long", timeout=60)
    assert time.monotonic() - began < 1.5
    assert box.removed_by_pid and not box.is_alive()
    for call in (lambda: box.exec("long", timeout=1), lambda: box.read_file("x"), lambda: box.write_file("x", b"")):
        with pytest.raises(SandboxLost):
            call()


def test_close_is_idempotent_and_is_not_a_kill():
    with MemorySandbox() as box:
        pass
    box.close()
    assert box.closed and not box.removed_by_pid and not box.is_alive()


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo), *args], check=True,
                   capture_output=True)


def test_workspace_in_patch_and_files_out(tmp_path):
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "a.py").write_text("one\ntwo\n")
    (repo / "gone.txt").write_text("bye\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    box = MemorySandbox()
    with pytest.raises(SandboxError):
        box.export_patch(str(tmp_path / "early.diff"), 1 << 20)
    box.import_workspace(str(repo))
    assert sorted(box.files) == ["/workspace/gone.txt", "/workspace/src/a.py"]   # .git stays out
    box.write_file("src/a.py", b"one\nTWO\n")
    box.write_file("new/file.txt", b"fresh\n")
    del box.files["/workspace/gone.txt"]
    patch = tmp_path / "patch.diff"
    copied = box.export_patch(str(patch), 1 << 20)
    assert copied.size == patch.stat().st_size and copied.dropped == []
    git(repo, "apply", "--check", str(patch))   # a patch git takes as it is
    git(repo, "apply", str(patch))
    assert (repo / "src" / "a.py").read_text() == "one\nTWO\n" and (repo / "new" / "file.txt").read_text() == "fresh\n"
    assert not (repo / "gone.txt").exists()
    with pytest.raises(SandboxError):
        box.export_patch(str(tmp_path / "small.diff"), 10)

    budget = FilesBudget(max_bytes=1 << 20, max_entries=1)
    written, skipped = box.export_files(["src", "new/file.txt", "nothing"], str(tmp_path / "files"), budget)
    assert written == [str(tmp_path / "files" / "workspace" / "src" / "a.py")]
    assert [(s.path, s.reason) for s in skipped] == [("/workspace/new/file.txt", "over the 1-entry limit"),
                                                     ("nothing", "not found")]


def test_the_provider_makes_sandboxes_from_a_config_and_clears_jobs():
    class Config:
        workdir = "/src"
    provider = MemoryProvider({"pwd": Run("/src\n")})
    box = provider.create(Config())
    provider.clear_job("job-1")
    assert isinstance(box, JobSandbox) and box.workdir == "/src" and provider.created == [box]
    assert provider.cleared == ["job-1"] and box.exec("pwd", timeout=1).tail == b"/src\n"
