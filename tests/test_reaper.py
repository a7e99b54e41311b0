"""The reaper and the suite's leak check on an engine shared with others: only what is theirs to remove, and
containers that vanish while they look (auto-removed, another reaper) are no error.

The first tests use a stand-in for the engine's API (a vanishing container cannot be timed on a real engine); the
`docker` ones check the same against a real engine.
"""
from __future__ import annotations

import os
import time
import uuid
from datetime import datetime, timedelta, timezone

import docker
import docker.errors
import pytest

from pid.sandbox.reaper import (LABEL_TEST_RUN, TEST_RUN_ENV, list_containers, reap_expired, remove_job_containers,
                                run_labels)
from tests.conftest import IMAGE, RUN_ID
from tests.leaks import find_leaks, remove_leaks, run_containers

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def entry(cid: str, state: str = "running", **labels: str) -> dict:
    return {"Id": cid, "State": state, "Labels": {"pid.job": "j", **labels}}


class FakeAPI:
    """The two engine calls the reaper makes. `vanish` ids are listed but gone by the time they are removed."""

    def __init__(self, listed: list[dict], vanish: set[str] = frozenset(), list_fails: bool = False) -> None:
        self.listed, self.vanish, self.list_fails = listed, set(vanish), list_fails
        self.removed: list[str] = []
        self.lists = 0

    def containers(self, **kwargs) -> list[dict]:   # (all=True, filters={"label": [...]}), as the reaper asks
        self.lists += 1
        if self.list_fails:
            raise docker.errors.NotFound("no such container")   # the engine lost one while building the list
        wanted = [f.partition("=") for f in kwargs["filters"]["label"]]
        return [dict(c) for c in self.listed
                if all(c["Labels"].get(k) == v if sep else k in c["Labels"] for k, sep, v in wanted)]

    def remove_container(self, cid: str, force: bool, v: bool = False) -> None:
        assert force and v   # (an anonymous volume goes with it)
        if cid in self.vanish or cid not in {c["Id"] for c in self.listed}:
            raise docker.errors.NotFound(f"No such container: {cid}")
        self.listed = [c for c in self.listed if c["Id"] != cid]
        self.removed.append(cid)


class FakeClient:
    def __init__(self, api: FakeAPI) -> None:
        self.api = api

    def ping(self) -> bool:
        return True


def test_reap_expired_skips_what_vanished_and_what_is_not_its_own():
    expired = stamp(NOW - timedelta(minutes=1))
    api = FakeAPI([entry("mine-expired", **{"pid.owner": "me", "pid.expires": expired}),
                   entry("mine-vanished", **{"pid.owner": "me", "pid.expires": expired}),
                   entry("mine-alive", **{"pid.owner": "me", "pid.expires": stamp(NOW + timedelta(hours=1))}),
                   entry("mine-no-expiry", **{"pid.owner": "me", "pid.expires": "garbage"}),
                   entry("theirs", **{"pid.owner": "them", "pid.expires": expired})],
                  vanish={"mine-vanished"})
    assert reap_expired("me", FakeClient(api), now=NOW) == ["mine-expired"]
    assert api.removed == ["mine-expired"]
    assert sorted(reap_expired(None, FakeClient(api), now=NOW)) == ["theirs"]   # every installation's, when asked


def test_a_listing_the_engine_fails_with_not_found_is_an_empty_one():
    api = FakeAPI([entry("x", **{"pid.expires": stamp(NOW)})], list_fails=True)
    assert reap_expired(None, FakeClient(api), now=NOW) == [] and api.removed == []
    assert list_containers(FakeClient(api), ["pid.job"]) == []


def test_remove_job_containers_tolerates_one_that_vanished():
    api = FakeAPI([entry("a", **{"pid.job": "job-1"}), entry("b", **{"pid.job": "job-1"}),
                   entry("c", **{"pid.job": "job-2"})], vanish={"a"})
    assert remove_job_containers("job-1", FakeClient(api)) == ["b"]
    assert api.removed == ["b"]


def test_run_labels_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(TEST_RUN_ENV, "run-42")
    assert run_labels() == {LABEL_TEST_RUN: "run-42"}
    monkeypatch.setenv(TEST_RUN_ENV, " ")
    assert run_labels() == {}
    monkeypatch.delenv(TEST_RUN_ENV)
    assert run_labels() == {}
    assert os.environ.get(TEST_RUN_ENV) is None


def test_the_leak_check_counts_and_removes_only_this_runs_containers():
    api = FakeAPI([entry("ours", **{LABEL_TEST_RUN: "run-1"}),
                   entry("ours-going", state="removing", **{LABEL_TEST_RUN: "run-1"}),
                   entry("ours-vanishing", **{LABEL_TEST_RUN: "run-1"}),
                   entry("other-run", **{LABEL_TEST_RUN: "run-2"}),
                   entry("a-real-worker")], vanish={"ours-vanishing"})
    client = FakeClient(api)
    assert [c["Id"] for c in run_containers(client, "run-1")] == ["ours", "ours-vanishing"]
    leaked = find_leaks(client, "run-1", wait_s=0)
    remove_leaks(client, leaked)   # one of them is gone already: no error
    assert api.removed == ["ours"]
    assert {c["Id"] for c in api.listed} == {"ours-going", "ours-vanishing", "other-run", "a-real-worker"}


def test_the_leak_check_waits_for_containers_on_their_way_out():
    api = FakeAPI([entry("ours", **{LABEL_TEST_RUN: "run-1"})])
    client = FakeClient(api)
    listing = api.containers

    def shrinking(**kwargs) -> list[dict]:   # auto-removed after its second look
        if api.lists >= 2:
            api.listed = []
        return listing(**kwargs)

    api.containers = shrinking
    assert find_leaks(client, "run-1", wait_s=5, poll_s=0.01) == [] and api.removed == []


# -- against a real engine ---------------------------------------------------------------------------------------------
@pytest.fixture
def client():
    client = docker.from_env()
    yield client
    client.close()


def sleeper(client, **labels: str):
    return client.containers.run(IMAGE, ["sleep", "120"], detach=True, labels={"pid.job": "test-reaper", **labels})


@pytest.mark.docker
def test_leak_check_on_a_shared_engine_leaves_other_runs_alone(client):
    ours = sleeper(client, **run_labels())
    other_run = sleeper(client, **{LABEL_TEST_RUN: f"another-run-{uuid.uuid4().hex[:6]}"})
    try:
        assert run_labels() == {LABEL_TEST_RUN: RUN_ID}   # conftest marked this run
        leaked = find_leaks(client, RUN_ID, wait_s=0)
        assert ours.id in {c["Id"] for c in leaked} and other_run.id not in {c["Id"] for c in leaked}
        remove_leaks(client, [c for c in leaked if c["Id"] == ours.id] + [{"Id": "f" * 64}])   # one never was
        other_run.reload()
        assert other_run.status == "running"
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(ours.id)
    finally:
        for container in (ours, other_run):
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass


@pytest.mark.docker
def test_reaper_on_a_real_engine_ignores_a_container_that_vanished_after_the_listing(client):
    owner = f"test-owner-{uuid.uuid4().hex[:8]}"
    labels = {"pid.owner": owner, "pid.expires": stamp(datetime.now(timezone.utc) + timedelta(minutes=30)),
              **run_labels()}
    expired = sleeper(client, **labels)
    real_listing = client.api.containers

    def with_a_ghost(**kwargs):   # the engine listed one more, removed before the reaper gets to it
        return real_listing(**kwargs) + [{"Id": "0" * 64, "State": "running", "Labels": labels}]

    client.api.containers = with_a_ghost
    try:
        removed = reap_expired(owner, client, now=datetime.now(timezone.utc) + timedelta(hours=1))
        assert removed == [expired.id]
    finally:
        client.api.containers = real_listing
        try:
            expired.remove(force=True)
        except docker.errors.NotFound:
            pass


@pytest.mark.docker
def test_sandbox_containers_carry_the_runs_label():
    from pid.sandbox import DockerSandbox, SandboxConfig
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id="test-run-label", ttl_s=120, disk=0)) as box:
        labels = box.container.client.api.inspect_container(box.container.id)["Config"]["Labels"]
        assert labels[LABEL_TEST_RUN] == RUN_ID and labels["pid.job"] == "test-run-label"
    deadline = time.monotonic() + 10
    client, container_id = box.container.client, box.container.id
    while time.monotonic() < deadline and any(c["Id"] == container_id for c in run_containers(client, RUN_ID)):
        time.sleep(0.1)
    assert all(c["Id"] != container_id for c in run_containers(client, RUN_ID))


def pooled(cid: str, name: str, pool: str = "h:1:x") -> dict:
    return {"Id": cid, "State": "running", "Names": [name], "Labels": {"pid.job": "pool-1", "pid.pool": pool}}


def test_a_taken_pool_container_is_found_by_its_jobs_exact_name_and_attempt():
    listed = [pooled("abc-1", "/pid-job-abc-a1"), pooled("abc-2", "/pid-job-abc-a2"),
              pooled("abcd-1", "/pid-job-abcd-a1"), pooled("ready", "/eager_turing"),
              pooled("trick", "/pid-job-abc-a1x")]
    api = FakeAPI(listed)
    assert remove_job_containers("abc", FakeClient(api), attempt=1) == ["abc-1"]
    assert remove_job_containers("abc", FakeClient(api)) == ["abc-2"]   # any attempt's, never another job's
    assert sorted(c["Id"] for c in api.listed) == ["abcd-1", "ready", "trick"]


def test_a_pool_whose_process_is_gone_on_this_host_is_reaped_and_no_other():
    import socket

    from pid.jobs.identity import process_identity, process_mark
    from pid.sandbox.reaper import reap_orphan_pools
    me, host = os.getpid(), socket.gethostname()
    mine = process_identity(me)
    assert mine is not None
    boot, namespace, _ = mine.split("-", 2)
    listed = [pooled("alive", "/a", process_mark()),   # (as a pool labels its sandboxes)
              pooled("gone", "/b", f"{host}:{me}:{boot}-{namespace}-1"),   # this pid, another start: gone
              pooled("elsewhere", "/c", f"another-host:{me}:{mine}"),      # not knowable here: its expiry decides
              pooled("garbled", "/d", "nonsense")]
    api = FakeAPI(listed)
    assert reap_orphan_pools(None, FakeClient(api)) == ["gone"]
