"""Real headless Chromium for the HTML tests: load a page, get its DOM after its scripts ran, its console messages,
or a screenshot. One browser process per load, each with a profile of its own (tests may run side by side).

Console messages come from Chromium's own log (`--enable-logging=stderr --v=0`): every console message, error or
not, and every Content-Security-Policy violation, is a `:CONSOLE` line there. pid's pages write nothing to the
console, so any such line is a failure.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.services import missing

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_CONSOLE = re.compile(r":CONSOLE[^\]]*\] (.*)")


def chromium() -> str | None:
    found = os.environ.get("PID_TEST_CHROMIUM")
    return found or next((path for name in NAMES if (path := shutil.which(name))), None)


def need_chromium() -> str:
    """The browser's path, or the test is skipped (failed, in CI) saying how to get one."""
    path = chromium()
    if path is None:
        missing("no headless Chromium here (apt-get install -y chromium, as docker/setup.sh --test does; or set "
                    "PID_TEST_CHROMIUM)")
    return path


@dataclass
class Load:
    dom: str
    console: list[str]   # every console message and CSP violation, in order
    log: str             # Chromium's whole stderr


def run(url: str, *action: str, timeout: float = 90, width: int = 1280, height: int = 1600) -> Load:
    """Chromium headless on `url` with one action (--dump-dom, --screenshot=FILE)."""
    browser = need_chromium()
    with tempfile.TemporaryDirectory(prefix="pid-chromium-") as profile:
        proc = subprocess.run(
            [browser, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--disable-extensions",
             "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
             f"--window-size={width},{height}", *action, url],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, errors="replace")
    assert proc.returncode == 0, f"chromium exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    console = [m.group(1) for line in proc.stderr.splitlines() if (m := _CONSOLE.search(line))]
    return Load(proc.stdout, console, proc.stderr)


def dump_dom(path: Path, fragment: str = "") -> Load:
    return run(path.resolve().as_uri() + fragment, "--dump-dom")


def screenshot(path: Path, out: Path, fragment: str = "") -> Load:
    load = run(path.resolve().as_uri() + fragment, f"--screenshot={out}")
    assert out.exists() and out.stat().st_size > 1000, load.log[-2000:]
    return load
