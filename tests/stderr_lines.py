"""A background process's stderr, collected line by line as it comes: a test waits for a line (a notice the process
prints after some time), then acts, instead of sleeping for longer than that time."""
from __future__ import annotations

import subprocess
import threading
import time


class StderrLines:
    def __init__(self, proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        self.proc = proc
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:   # type: ignore[union-attr]
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in list(self.lines)):
            assert self.proc.poll() is None, f"the process ended before saying {text!r}:\n{self.text()}"
            assert time.monotonic() < deadline, f"timed out waiting for {text!r}:\n{''.join(self.lines)}"
            time.sleep(0.1)

    def text(self, timeout: float = 30) -> str:
        """Everything it wrote, once it has ended (the caller ends it)."""
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=timeout)
        return "".join(self.lines)
