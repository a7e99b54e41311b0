"""docker/pid-worker.service, the unit of a worker on a plain VM, and its environment file: checked by systemd's own
`systemd-analyze verify` (where the machine has it; docker/setup.sh --test installs systemd), and held to the
worker's stop: SIGTERM to the worker alone, which hands its jobs back within HANDBACK_S + POOL_STOP_S, and a stop
timeout longer than that. No test starts the unit: this machine's PID 1 is not systemd."""
from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.services import missing

from pid.worker.main_process import HANDBACK_S, POOL_STOP_S, WARM_POOL_CLOSE_S

pytestmark = pytest.mark.cli   # runs systemd's verifier (no Docker engine)

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "docker" / "pid-worker.service"
ENV = ROOT / "docker" / "pid-worker.env"


def _service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str   # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser["Service"]


def test_systemd_analyze_verifies_the_unit(tmp_path):
    verify = shutil.which("systemd-analyze")
    if verify is None:
        missing("systemd-analyze is not installed here (apt-get install systemd; docker/setup.sh --test does)")
    pid = Path(sys.executable).with_name("pid")
    if not pid.exists():
        missing(f"no pid command beside {sys.executable} (pip install -e .)")
    # The verifier checks that ExecStart's program and the EnvironmentFile exist: here they are this checkout's
    # (the unit names /opt/pid and /etc/pid, where an installation puts them); nothing else is changed.
    text = UNIT.read_text().replace("/opt/pid/bin/pid", str(pid)).replace("/etc/pid/worker.env", str(ENV))
    unit = tmp_path / "pid-worker.service"
    unit.write_text(text)
    done = subprocess.run([verify, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr


def test_a_stop_hands_the_jobs_back_and_a_crash_restarts():
    service = _service()
    assert service["KillSignal"] == "SIGTERM" and service["KillMode"] == "mixed"
    assert int(service["TimeoutStopSec"]) > HANDBACK_S + POOL_STOP_S + WARM_POOL_CLOSE_S
    assert service["Restart"] == "on-failure" and service["RestartPreventExitStatus"] == "2"
    assert service["EnvironmentFile"] == "/etc/pid/worker.env" and "${PID_CONCURRENCY}" in service["ExecStart"]
    settings = dict(line.split("=", 1) for line in ENV.read_text().splitlines() if line and not line.startswith("#"))
    assert {"PID_BROKER_URL", "PID_HOME", "PID_CONCURRENCY"} <= set(settings)
