"""The deployment files (docker/compose.yaml, docker/Dockerfile.worker, docker/build-worker.sh), checked by the real
compose tool: the file validates, and what makes a cluster work is in it once resolved — Redis persists (AOF), every
worker reaches the host engine's socket and sees PID_HOME at the host's own path (the engine resolves the job disks'
bind mounts on the host), and Flower and the client speak to the same Redis. Skipped, with the reason, where no
compose tool (`docker compose` or `docker-compose`) is installed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.services import missing

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker" / "compose.yaml"
BROKER = "redis://redis:6379/0"


def _compose_tool() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def _config(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    tool = _compose_tool()
    if tool is None:
        missing("no compose tool: neither `docker compose` nor `docker-compose` (apt-get install docker-compose)")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PID_", "OPENAI_", "COMPOSE_"))}
    return subprocess.run([*tool, "-f", str(path), "--profile", "client", "config"], capture_output=True, text=True,
                          env={**clean, **env}, timeout=60)


def _resolved(env: dict[str, str]) -> dict[str, Any]:
    try:
        import yaml
    except ImportError:
        missing("PyYAML is not installed: it reads the resolved configuration (pip install pyyaml)")
    done = _config(COMPOSE, env)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def _mount(service: dict[str, Any], target: str) -> dict[str, Any]:
    """A volume of the service by its target, in long form whatever form the tool prints it in."""
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            parts = volume.split(":")
            volume = {"type": "bind" if parts[0].startswith("/") else "volume", "source": parts[0],
                      "target": parts[1]}
        if volume["target"] == target:
            return volume
    raise AssertionError(f"no volume at {target} in {service.get('volumes')}")


def test_the_compose_file_validates_and_keeps_what_a_cluster_needs():
    config = _resolved({"PID_SHARED_HOME": "/srv/pid-home", "PID_WORKERS": "3", "PID_CONCURRENCY": "16",
                        "PID_MODEL": "m1"})
    services = config["services"]
    assert set(services) == {"redis", "worker", "flower", "client"}

    redis = services["redis"]
    command = redis["command"] if isinstance(redis["command"], list) else redis["command"].split()
    assert command[0] == "redis-server" and command[command.index("--appendonly") + 1] == "yes"
    data = _mount(redis, "/data")
    assert data["type"] == "volume" and data["source"] == "redis-data" and "redis-data" in config["volumes"]

    worker = services["worker"]
    assert worker["image"] == "pid-worker:latest"
    assert worker["deploy"]["replicas"] == 3
    assert worker["command"] == ["--concurrency", "16", "--events"]
    env = worker["environment"]
    assert env["PID_BROKER_URL"] == BROKER and env["PID_HOME"] == "/srv/pid-home" and env["PID_MODEL"] == "m1"
    assert env.get("PID_API_KEY") in (None, "")       # passed on only when set, never a baked-in value
    socket = _mount(worker, "/var/run/docker.sock")
    assert socket["source"] == "/var/run/docker.sock"
    home = _mount(worker, "/srv/pid-home")            # the same path on the host and inside
    assert home["type"] == "bind" and home["source"] == "/srv/pid-home"
    assert home["bind"]["propagation"] == "rshared"   # the worker's loop mounts must reach the host's engine
    assert _mount(worker, "/dev")["source"] == "/dev"
    assert "SYS_ADMIN" in worker["cap_add"] and "b 7:* rmw" in worker["device_cgroup_rules"]
    assert worker["init"] is True and worker["depends_on"]["redis"]["condition"] == "service_healthy"

    flower = services["flower"]
    assert flower["entrypoint"] == ["celery", f"--broker={BROKER}", "flower"]
    assert any(str(p.get("target") if isinstance(p, dict) else p).split(":")[-1].split("/")[0] == "5555"
               for p in flower["ports"])

    client = services["client"]
    assert client["entrypoint"] == ["pid"] and client["environment"]["PID_BROKER_URL"] == BROKER
    assert client["environment"]["PID_HOME"] == "/srv/pid-home" and _mount(client, "/srv/pid-home")


def test_the_defaults_put_pid_home_at_var_lib_pid_on_both_sides():
    worker = _resolved({})["services"]["worker"]
    assert worker["environment"]["PID_HOME"] == "/var/lib/pid"
    assert _mount(worker, "/var/lib/pid")["source"] == "/var/lib/pid"
    assert worker["deploy"]["replicas"] == 2 and worker["command"][:2] == ["--concurrency", "8"]


def test_the_validation_rejects_a_broken_file(tmp_path):
    """The check above can fail: a service naming a volume that is not declared is refused by the tool."""
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE.read_text().replace("      - redis-data:/data", "      - redis-dat:/data"))
    done = _config(broken, {})
    assert done.returncode != 0 and "redis-dat" in (done.stderr + done.stdout)


def test_the_worker_image_runs_pid_worker_from_this_checkout():
    text = (ROOT / "docker" / "Dockerfile.worker").read_text()
    assert 'ENTRYPOINT ["pid", "worker"]' in text
    with open(ROOT / "pyproject.toml", "rb") as f:   # pid, and the folders the wheel maps under it (cli/: pid.cli)
        folders = tomllib.load(f)["tool"]["setuptools"]["package-dir"].values()
    for package in ("pid", *folders):
        assert f"COPY {package} /src/{package}" in text
    assert "/src flower" in text and "--find-links /wheels pid flower" in text and "/var/run/docker.sock" in text


def test_the_images_are_variables_whose_defaults_are_the_registrys():
    """Unchanged, the file runs redis:7 (and the worker image built from python:3.11); without a registry the same
    file runs the images docker/build-redis.sh and docker/build-worker.sh make, named by variables."""
    services = _resolved({})["services"]
    assert services["redis"]["image"] == "redis:7" and services["worker"]["image"] == "pid-worker:latest"
    assert "ARG BASE=python:3.11-slim-bookworm" in (ROOT / "docker" / "Dockerfile.worker").read_text()
    offline = _resolved({"PID_REDIS_IMAGE": "pid-redis:7", "PID_REDIS_PORT": "16379", "PID_FLOWER_PORT": "15555",
                         "FLOWER_UNAUTHENTICATED_API": "true"})["services"]
    assert offline["redis"]["image"] == "pid-redis:7"
    assert offline["flower"]["environment"]["FLOWER_UNAUTHENTICATED_API"] == "true"
    published = json.dumps([offline["redis"]["ports"], offline["flower"]["ports"]])
    assert "16379" in published and "15555" in published


def test_build_worker_refuses_a_base_whose_python_cannot_unpack_workspaces():
    """pid-sandbox:latest is Debian's Python 3.11.2, without tarfile's extraction filters that pid's unpack uses."""
    base = "pid-sandbox:latest"
    probe = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", base, "-c",
                            "import tarfile; tarfile.data_filter"], capture_output=True, timeout=60)
    if probe.returncode == 0:
        pytest.skip(f"{base}'s Python has tarfile.data_filter: nothing to refuse")
    done = subprocess.run(["bash", str(ROOT / "docker" / "build-worker.sh"), "pid-worker:never-built"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PID_WORKER_BASE": base, "PID_WORKER_ANY_PYTHON": ""})
    assert done.returncode == 2 and "tarfile.data_filter" in done.stderr, done.stderr
    assert subprocess.run(["docker", "image", "inspect", "pid-worker:never-built"], capture_output=True).returncode
