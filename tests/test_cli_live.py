"""Live progress: on a terminal `pid run` and `pid logs -f` keep a status line at the bottom (what the agent does,
tokens and cost so far, elapsed time) and `pid run` streams the model's replies; off a terminal the same lines as
ever, with no status line and no control sequence. `--verbose` adds each tool call's output excerpt.

The terminal is a real one: tmux, read back with capture-pane while a scripted model holds its reply 3 s."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from pid.cli.status_line import SPINNER
from tests.scripted_llm import ScriptedLLM
from tests.services import missing

pytestmark = [pytest.mark.docker, pytest.mark.cli]

STATUS = re.compile(r"turn 2: waiting for the model · ([\d,]+) tokens · \$\d[\d.,]* · \d+s")
ANY_STATUS = re.compile(rf"[{SPINNER}] .* · [\d,]+ tokens · \$\d[\d.,]*")   # a status line, whatever it says
SCRIPT = [{"tool_calls": [{"name": "bash", "arguments": {"command": "printf 'first-out\\nsecond-out\\n'"}}]},
          {"delay_s": 3, "tool_calls": [{"name": "bash", "arguments": {"command": "echo again"}}]},
          {"text": "All done: REPLY-END"}]


class Tmux:
    """A private tmux server (its own socket), whose windows run commands in a real terminal."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env, self.cwd = {**env, "TERM": "xterm-256color"}, cwd
        self.socket = f"pid-test-{uuid.uuid4().hex[:8]}"

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], env=self.env, cwd=self.cwd, check=True,
                              capture_output=True, text=True, timeout=30).stdout

    def open(self, name: str, argv: list[str]) -> None:
        """A window running `argv`, then saying its exit code and staying open to be read."""
        command = f"{shlex.join(argv)}; echo PANE-EXIT=$?; sleep 600"
        if name == "run":
            self._tmux("new-session", "-d", "-s", "pid", "-n", name, "-x", "150", "-y", "50", command)
        else:
            self._tmux("new-window", "-d", "-t", "pid", "-n", name, command)

    def keys(self, name: str, *keys: str) -> None:
        self._tmux("send-keys", "-t", f"pid:{name}", *keys)

    def screen(self, name: str) -> str:
        """What the window shows now, its scrollback included."""
        return self._tmux("capture-pane", "-p", "-J", "-S", "-", "-t", f"pid:{name}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], env=self.env, capture_output=True, timeout=30)


def pid(*args: str) -> list[str]:
    return [sys.executable, "-m", "pid.cli.main", *args]


def wait_for(predicate, timeout: float = 120, what: str = "condition") -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def needs_tmux() -> None:
    if shutil.which("tmux") is None:
        missing("tmux is not installed (apt-get install tmux): the live status line needs a real terminal to be seen")


@pytest.mark.usefixtures("needs_tmux")
def test_a_terminal_shows_the_status_line_while_the_model_thinks_and_the_steer_after(run_pid, pid_env, sample_repo,
                                                                                     tmp_path):
    tmux = Tmux(pid_env, tmp_path)
    steered = threading.Event()   # the model's second reply waits for the steer too, not only 3 s a load outruns
    with ScriptedLLM([SCRIPT[0], {**SCRIPT[1], "hold": steered}, *SCRIPT[2:]]) as llm:
        try:
            tmux.open("run", pid("run", "t", "--repo", str(sample_repo), "--model", "scripted", "--base-url",
                                 llm.base_url, "--out", str(tmp_path / "out"), "--verbose"))
            seen: list[str] = []

            def status_shown() -> bool:
                screen = tmux.screen("run")
                if STATUS.search(screen):
                    seen.append(screen)
                    return True
                return False
            wait_for(status_shown, what="the status line during the model's 3-s delay")
            # (the line may come as turn 2's request is still on its way to the model, on a loaded machine)
            wait_for(lambda: len(llm.requests) >= 2, timeout=30, what="turn 2's request at the model")
            assert len(llm.requests) == 2, "seen only once the model answered"   # the reply is held until the steer
            assert int(STATUS.search(seen[0]).group(1).replace(",", "")) > 0, seen[0]   # turn 1's tokens
            job_id = re.search(r"job (\S+):", seen[0]).group(1)
            tmux.open("logs", pid("logs", "-f", job_id))
            assert run_pid("steer", job_id, "STEER-LIVE").code == 0
            steered.set()

            logs_status: list[str] = []

            def ended() -> bool:
                logs = tmux.screen("logs")
                if ANY_STATUS.search(logs):
                    logs_status.append(logs)
                return "PANE-EXIT=" in tmux.screen("run") and "PANE-EXIT=" in logs
            wait_for(ended, what="both windows to end")
            run_screen, logs_screen = tmux.screen("run"), tmux.screen("logs")
        finally:
            tmux.close()
    assert "PANE-EXIT=0" in run_screen, run_screen
    for screen in (run_screen, logs_screen):
        assert "→ steer sent: STEER-LIVE" in screen, screen
        assert "← steer received: STEER-LIVE" in screen, screen
        assert not ANY_STATUS.search(screen), screen   # erased at the end
    assert logs_status, "pid logs -f showed no status line"
    assert run_screen.count("All done: REPLY-END") == 1, run_screen   # streamed, and not printed a second time
    assert "│ first-out" in run_screen and "│ second-out" in run_screen, run_screen   # --verbose
    assert "│ first-out" not in logs_screen   # logs without --verbose: the one-line summaries only


@pytest.mark.usefixtures("needs_tmux")
def test_ctrl_c_on_a_terminal_says_so_on_a_line_of_its_own_and_leaves_no_status_line(pid_env, sample_repo, tmp_path):
    tmux = Tmux(pid_env, tmp_path)
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60"}}]}, {"text": "never"}]
    with ScriptedLLM(script) as llm:
        try:
            tmux.open("run", pid("run", "t", "--repo", str(sample_repo), "--model", "scripted", "--base-url",
                                 llm.base_url, "--out", str(tmp_path / "out")))
            wait_for(lambda: re.search(r"turn 1: running bash sleep 60 · [\d,]+ tokens", tmux.screen("run")),
                     what="the status line while the command runs")
            tmux.keys("run", "C-c")
            wait_for(lambda: "PANE-EXIT=" in tmux.screen("run"), what="pid run to end")
            screen = tmux.screen("run")
        finally:
            tmux.close()
    lines = [line.strip() for line in screen.splitlines()]
    assert "cancelling: collecting the patch and removing the container…" in lines, screen
    assert "PANE-EXIT=130" in lines and not ANY_STATUS.search(screen), screen


def test_off_a_terminal_the_lines_are_plain(run_pid, sample_repo, tmp_path):
    with ScriptedLLM(SCRIPT) as llm:
        res = run_pid("run", "t", "--repo", str(sample_repo), "--model", "scripted", "--base-url", llm.base_url,
                      "--out", str(tmp_path / "out"), "--verbose")
    assert res.code == 0, res.stderr
    for text in (res.stdout, res.stderr):
        assert "\x1b" not in text and "\r" not in text, repr(text)
        assert "waiting for the model" not in text and not ANY_STATUS.search(text), text
    assert res.stdout == "All done: REPLY-END\n"
    assert "  │ first-out\n  │ second-out\n" in res.stderr, res.stderr   # --verbose: the output, under its line
    job_id = res.stderr.split()[1].rstrip(":")
    logs = run_pid("logs", job_id)
    assert "│" not in logs.stdout and "✓ bash" in logs.stdout, logs.stdout
    verbose = run_pid("logs", job_id, "--verbose")
    assert "✓ bash printf" in verbose.stdout and "  │ first-out\n  │ second-out\n" in verbose.stdout, verbose.stdout
    started = verbose.stdout.index("· bash printf")   # (a new user's: a long call showed nothing until its end)
    assert verbose.stdout.index(" …\n", started) < verbose.stdout.index("✓ bash printf"), verbose.stdout
    assert "\x1b" not in verbose.stdout
