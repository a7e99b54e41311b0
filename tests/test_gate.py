"""The test gate (tests/gate.py) itself: a gate no test opens ends the command, failing, instead of running it."""
from __future__ import annotations

import os
import subprocess

from tests.gate import GATE, NEVER_OPENED, gated


def test_a_gate_never_opened_ends_the_command_with_97_and_says_so():
    assert not os.path.exists(GATE)   # (the gate lives in job containers; on this host it is shut)
    done = subprocess.run(["bash", "-c", gated("echo ran", limit_s=0)], capture_output=True, text=True, timeout=30)
    assert done.returncode == NEVER_OPENED
    assert done.stdout == "" and "never opened the gate" in done.stderr
