"""Nothing of a hostile image's configuration runs or escapes: its ENTRYPOINT and HEALTHCHECK never run (both would
run as root, a health check beside the agent with the agent's files), and its VOLUMEs are directories of the job's
disk, bounded by --disk and gone with it (the engine's own volumes were neither)."""
from __future__ import annotations

import subprocess
import time

import docker
import pytest

from pid.sandbox import DockerSandbox, SandboxConfig
from pid.sandbox_api import SandboxError
from tests.conftest import IMAGE, RUN_ID, RUNTIME

pytestmark = pytest.mark.docker

HOSTILE = (f"FROM {IMAGE}\n"
           "RUN mkdir /data && echo image-content > /data/x\n"
           "VOLUME /data /workspace/cache /workspace /tmp/\n"
           "HEALTHCHECK --interval=1s CMD touch /tmp/health-ran /workspace/health-ran\n"
           'ENTRYPOINT ["/bin/sh", "-c", "touch /tmp/entry-ran; exec \\"$@\\"", "entry"]\n')


def build(tmp_path, name: str, dockerfile: str) -> str:
    tag = f"pid-test-{name}:{RUN_ID.lower()}"
    (tmp_path / "Dockerfile").write_text(dockerfile)
    subprocess.run(["docker", "build", "-q", "--network", "none", "-t", tag, str(tmp_path)], check=True,
                   capture_output=True, timeout=300)
    return tag


@pytest.fixture
def hostile_image(tmp_path):
    tag = build(tmp_path, "hostile-config", HOSTILE)
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)


def test_an_image_s_entrypoint_health_check_and_volumes_are_not_the_job_s(hostile_image):
    box = DockerSandbox.create(SandboxConfig(image=hostile_image, job_id="test-image-config", disk=64 << 20,
                                             runtime=RUNTIME))
    try:
        container_id = box.container.id
        time.sleep(2.5)   # (a health check every second would have run by now)
        done = box.exec("ls /tmp /workspace; cat /data/x; touch /data/mine && echo wrote; "
                        "head -c 100000000 /dev/zero > /data/big; echo rc=$?", timeout=60)
        out = done.tail.decode()
        assert "health-ran" not in out and "entry-ran" not in out, out
        assert "image-content" not in out and "wrote" in out, out   # a fresh directory, the agent's
        assert "rc=1" in out and "No space left on device" in out, out   # bounded by --disk
        mounts = docker.from_env().api.inspect_container(container_id)["Mounts"]
        assert [m for m in mounts if m["Type"] == "volume"] == [], mounts
    finally:
        box.close()


def test_an_image_with_a_volume_in_a_system_directory_is_refused(tmp_path):
    tag = build(tmp_path, "system-volume", f"FROM {IMAGE}\nVOLUME /usr/lib\n")
    try:
        with pytest.raises(SandboxError, match="declares VOLUME /usr/lib"):
            DockerSandbox.create(SandboxConfig(image=tag, job_id="test-image-config", runtime=RUNTIME))
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)
