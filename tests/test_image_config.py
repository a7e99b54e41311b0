"""Nothing of a hostile image's configuration runs or escapes: its ENTRYPOINT and HEALTHCHECK never run (both would
run as root, a health check beside the agent with the agent's files), and its VOLUMEs are directories of the job's
disk, bounded by --disk and gone with it (the engine's own volumes were neither)."""
from __future__ import annotations

import re
import subprocess
import time

import docker
import pytest

from pid.sandbox import DockerSandbox, SandboxConfig
from tests.conftest import IMAGE, RUN_ID, RUNTIME, own_build

pytestmark = pytest.mark.docker

HOSTILE = (f"FROM {IMAGE}\n"
           "RUN mkdir /data /opt/cache && echo image-content > /data/x && chown 1000:1000 /data\n"
           "VOLUME /data //data /opt/cache /workspace /tmp/\n"
           "HEALTHCHECK --interval=1s CMD touch /tmp/health-ran /workspace/health-ran\n"
           'ENTRYPOINT ["/bin/sh", "-c", "touch /tmp/entry-ran; exec \\"$@\\"", "entry"]\n')


def build(tmp_path, name: str, dockerfile: str) -> str:
    tag = f"pid-test-{name}:{RUN_ID.lower()}"
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "Dockerfile").write_text(own_build(dockerfile))
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
        assert "image-content" not in out and "wrote" in out, out   # a fresh directory, owned as the image's is
        assert "No space left on device" in out, out   # bounded by --disk
        owners = box.exec("stat -c '%u %a' /data /opt/cache; touch /opt/cache/x 2>&1", timeout=30).tail.decode()
        assert owners.startswith("1000 755\n0 755\n") and "Permission denied" in owners, owners
        assert "rc=1" in out, out
        mounts = docker.from_env().api.inspect_container(container_id)["Mounts"]
        assert [m for m in mounts if m["Type"] == "volume"] == [], mounts
    finally:
        box.close()


@pytest.mark.parametrize("lines, said", [
    ("VOLUME /usr/lib", "declares VOLUME /usr/lib: pid makes every volume a directory of the job's disk"),
    ("RUN ln -s /etc /link\nVOLUME /link", "declares VOLUME /link, and /link is not a directory in the image "
                                            "(/link is a symbolic link)"),
    ("VOLUME /workspace/cache", "declares VOLUME /workspace/cache, inside /workspace, which pid gives the job"),
    # (an attacker's: the agent's libz there ran in pid's root git)
    ("RUN mkdir /usr/local/lib/pidtest && cp -L \"$(ldconfig -p | awk '/libz.so.1 /{print $NF; exit}')\" "
     "/usr/local/lib/pidtest/ && echo /usr/local/lib/pidtest > /etc/ld.so.conf.d/pidtest.conf && ldconfig && "
     "chown 1000:1000 /usr/local/lib/pidtest\nVOLUME /usr/local/lib/pidtest",
     "declares VOLUME /usr/local/lib/pidtest, where pid's own tools could load or run something from"),
])
def test_an_image_volume_pid_cannot_make_is_refused_as_the_image_s_fault(tmp_path, lines, said):
    """A link on the way would have the runtime mount the agent's directory where it points (/etc); one inside the
    workspace would hide what was imported there."""
    from pid.sandbox.volumes import BadVolume
    tag = build(tmp_path, "bad-volume", f"FROM {IMAGE}\n{lines}\n")
    try:
        with pytest.raises(BadVolume, match=re.escape(said)):
            DockerSandbox.create(SandboxConfig(image=tag, job_id="test-image-config", runtime=RUNTIME))
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)


def test_a_clone_s_container_runs_nothing_of_the_image_s_either(tmp_path):
    """An attacker's: the container that clones a git URL for the job ran the image's ENTRYPOINT (here one that never
    lets the clone run) and HEALTHCHECK, and its VOLUMEs were the engine's, past every limit."""
    source = tmp_path / "src"
    subprocess.run(["git", "init", "-q", "-b", "main", str(source)], check=True)
    (source / "a.txt").write_text("cloned\n")
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(source), "add", "-A"], check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(source), "commit", "-qm", "c"],
                   check=True)
    tag = build(tmp_path / "image", "clone-config",
                f"FROM {IMAGE}\nRUN mkdir /data\nVOLUME /data\nHEALTHCHECK --interval=1s CMD true\n"
                'ENTRYPOINT ["/bin/sh", "-c", "echo the image took over; exit 3"]\n')
    try:
        with DockerSandbox.create(SandboxConfig(image=tag, job_id="test-image-config", runtime=RUNTIME)) as box:
            box.import_git(f"file://{source}", None)
            assert box.exec("cat a.txt", timeout=30).tail == b"cloned\n"
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)


def test_an_image_s_tmout_ends_no_server_of_pid_s(tmp_path):
    """An attacker's: an image's ENV TMOUT=2 made bash end pid's idle root servers' reads, and so the servers. The
    agent's own shells still get it."""
    tag = build(tmp_path, "tmout", f"FROM {IMAGE}\nENV TMOUT=1\n")
    try:
        with DockerSandbox.create(SandboxConfig(image=tag, job_id="test-image-config", runtime=RUNTIME)) as box:
            # (each server once, by its command line: a server's fork, as it starts a slot shell, has the same one;
            # a server still booting, whose channel the host has not opened yet, is not one yet)
            servers = "ps -eo args | grep '[c]hannel.sh' | grep -v pid-boot | sort -u"
            deadline = time.monotonic() + 20
            while len(before := box.exec(servers, timeout=30).tail.decode().splitlines()) < 3 and \
                    time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(2.5)
            said = box.exec(f'echo "TMOUT=$TMOUT"; {servers}', timeout=30).tail.decode().splitlines()
            assert said[0] == "TMOUT=1" and len(before) >= 3, (before, said)
            assert set(before) <= set(said[1:]), (before, said)   # (none ended; a new channel's may have begun)
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)


def test_an_image_s_pool_label_does_not_make_a_job_s_container_an_orphan_s(tmp_path, monkeypatch):
    """An attacker's: an image LABEL pid.pool naming a process that is gone was merged into the job's container's
    labels, and the reaper of orphaned pools removed the running job's sandbox."""
    from pid.jobs.identity import mark_gone, process_mark
    host, pid_, identity = process_mark().split(":", 2)
    gone = f"{host}:4999999:{identity}"
    assert mark_gone(gone)
    tag = build(tmp_path, "pool-label", f'FROM {IMAGE}\nLABEL pid.pool="{gone}"\n')
    try:
        with DockerSandbox.create(SandboxConfig(image=tag, job_id="test-image-config", runtime=RUNTIME)) as box:
            # (the reaper of orphaned pools, as it judges what the engine lists: other tests' containers are not
            # ours to reap, so it is given this one alone)
            from pid.sandbox import reaper
            listed = [c for c in reaper.list_containers(docker.from_env(), ["pid.pool"]) if c["Id"] == box.container.id]
            assert listed and listed[0]["Labels"]["pid.pool"] == gone
            monkeypatch.setattr(reaper, "list_containers", lambda *_: listed)
            assert reaper.reap_orphan_pools(None) == []
            assert box.exec("echo alive", timeout=30).tail == b"alive\n"
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)
