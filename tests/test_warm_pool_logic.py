"""The warm pool's bookkeeping (worker/warm_pool.py) on stand-in sandboxes: each ready one is given once, the refill
waits for a job's own creation, an idle class is drained, a stop removes what is ready and what was being made.
(The real containers: tests/test_warm_pool.py.)"""
from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import docker.errors
import pytest

from pid.sandbox import SandboxConfig
from pid.worker import warm_pool
from pid.settings import PoolSizes, parse_pool
from pid.worker.warm_pool import WarmPool, class_of


@dataclass
class FakeAPI:
    tag: str = "sha256:one"        # what the image's tag names now
    renamed: list[tuple[str, str]] = field(default_factory=list)
    refuse: bool = False           # every rename fails as the engine's 409 (the name is taken)

    def inspect_container(self, cid: str) -> dict[str, Any]:
        return {"State": {"Running": True}, "Image": "sha256:one"}

    def inspect_image(self, name: str) -> dict[str, Any]:
        return {"Id": self.tag}

    def rename(self, cid: str, name: str) -> None:
        if self.refuse:
            raise docker.errors.APIError(f"409 Conflict: the name {name} is already in use")
        self.renamed.append((cid, name))


@dataclass
class FakeClient:
    api: FakeAPI


@dataclass
class FakeContainer:
    client: FakeClient
    id: str
    config: SandboxConfig
    image_id: str = "sha256:one"

    def init_pid(self) -> None:
        return None


@dataclass
class FakeBox:
    container: FakeContainer
    closed: bool = False
    closed_by: str = ""           # the thread that removed it

    def close(self) -> None:
        self.closed, self.closed_by = True, threading.current_thread().name


class Factory:
    """Makes stand-in sandboxes; `gate`, when set, holds each creation until it is opened."""

    def __init__(self) -> None:
        self.api = FakeAPI()
        self.made: list[FakeBox] = []
        self.configs: list[SandboxConfig] = []   # each as it was made
        self.gate: threading.Event | None = None

    def __call__(self, config: SandboxConfig) -> Any:
        if self.gate is not None:
            self.gate.wait(10)
        self.configs.append(config)
        box = FakeBox(FakeContainer(FakeClient(self.api), f"c{len(self.made)}", config))
        self.made.append(box)
        return box


def until(check: Callable[[], Any], timeout: float = 10) -> Any:
    deadline = time.time() + timeout
    while not (found := check()):
        assert time.time() < deadline
        time.sleep(0.01)
    return found


@pytest.fixture(autouse=True)
def quick_ticks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warm_pool, "TICK_S", 0.02)


def job(job_id: str = "j1", **more: Any) -> SandboxConfig:
    return SandboxConfig(**{"job_id": job_id, "attempt": 1, "ttl_s": 600.0, **more})


def ready(pool: WarmPool) -> int:
    return sum(entry["ready"] for entry in pool.status())


@contextmanager
def running_pool(size: int | PoolSizes, **options: Any) -> Iterator[tuple[WarmPool, Factory]]:
    """A started pool on stand-in sandboxes (and their factory), closed whatever the test does."""
    factory = Factory()
    pool = WarmPool(size, create=factory, **options).start()
    try:
        yield pool, factory
    finally:
        pool.close()


def test_each_ready_sandbox_is_given_once_renamed_for_its_job():
    with running_pool(2) as (pool, factory):
        pool.served(job())
        given = []
        for n in range(5):
            until(lambda: ready(pool) >= 1)
            box = pool.take(job(f"j{n}"))
            assert box is not None
            given.append(box)
        assert len({id(box) for box in given}) == 5
        assert [name for _, name in factory.api.renamed] == [f"pid-job-j{n}-a1" for n in range(5)]
        assert [box.container.config.job_id for box in given] == [f"j{n}" for n in range(5)]
        assert all(c.pool.count(":") == 2 and c.job_id.startswith("pool-") and c.ttl_s > 600
                   for c in factory.configs)   # made labelled pid.pool, to outlive the class's jobs
    assert all(box.closed for box in factory.made if box not in given)


def test_the_refill_waits_while_a_job_creates_its_own():
    with running_pool(1) as (pool, factory):
        with pool.job_creating():
            pool.served(job())
            time.sleep(0.2)   # several of the refill thread's looks
            assert factory.made == []
        until(lambda: ready(pool) == 1)


def test_an_idle_class_is_drained_and_a_moved_tag_is_never_given():
    with running_pool(1, idle_s=0.3) as (pool, factory):
        pool.served(job())
        until(lambda: ready(pool) == 1)
        factory.api.tag = "sha256:two"
        assert pool.take(job()) is None   # not that image any more: never given...
        until(lambda: factory.made[0].closed)   # ...and removed
        factory.api.tag = "sha256:one"
        until(lambda: ready(pool) == 1)
        until(lambda: pool.status() == [])   # no job of the class for idle_s: drained
        assert all(box.closed for box in factory.made)


def test_a_stop_removes_the_ready_ones_and_the_one_being_made():
    factory = Factory()
    pool = WarmPool(2, create=factory).start()
    pool.served(job())
    until(lambda: ready(pool) == 2)
    factory.gate = threading.Event()
    assert pool.take(job()) is not None   # (given: the job removes it)
    until(lambda: any(w.creating for w in pool._classes.values()))
    stopping = threading.Thread(target=pool.close)
    stopping.start()
    factory.gate.set()
    stopping.join(10)
    assert not stopping.is_alive()
    assert len(factory.made) == 3 and [box.closed for box in factory.made] == [False, True, True]


def alive(factory: Factory) -> int:
    return sum(not box.closed for box in factory.made)


def ready_cpus(pool: WarmPool) -> list[float]:
    with pool._cond:
        return sorted(r.sandbox.container.config.cpus for w in pool._classes.values() for r in w.ready)


def test_the_pool_holds_its_size_in_all_shared_by_the_classes_used_last():
    with running_pool(2) as (pool, factory):
        for n in range(8):   # a tasks file whose every job asks a CPU share of its own: each a class
            pool.served(job(f"j{n}", cpus=1 + n / 100))
            latest = [1.0, 1.0] if n == 0 else [1 + (n - 1) / 100, 1 + n / 100]
            until(lambda: ready_cpus(pool) == latest)   # one each for the two used last
            until(lambda: alive(factory) == 2)           # the least recently used class's went
            assert len(pool._classes) == min(n + 1, 2)
    assert alive(factory) == 0


def ready_by_image(pool: WarmPool) -> dict[str, int]:
    return {entry["image"]: entry["ready"] for entry in pool.status() if entry["ready"]}


def test_an_image_with_a_size_of_its_own_has_its_own_budget():
    sizes = parse_pool("1,task-a=3")
    with running_pool(sizes) as (pool, factory):
        pool.served(job("a1", image="task-a"))   # (named as the engine does: task-a:latest is its budget)
        pool.served(job("b1", image="task-b:1"))
        until(lambda: ready_by_image(pool) == {"task-a": 3, "task-b:1": 1})
        pool.served(job("c1", image="task-c:1"))   # the shared one goes to the other image used last...
        until(lambda: ready_by_image(pool) == {"task-a": 3, "task-c:1": 1})
        for n in range(2):   # ...while task-a's classes share its own 3, never the shared one
            pool.served(job(f"a{n}", image="task-a", cpus=2.0 + n))
        until(lambda: ready_cpus(pool) == [1.0, 1.0, 2.0, 3.0] and alive(factory) == 4)   # one each
        assert ready_by_image(pool) == {"task-a": 3, "task-c:1": 1}
    assert alive(factory) == 0


def test_an_image_of_size_zero_gets_none_when_the_shared_budget_has_room():
    with running_pool(parse_pool("2,task-a=0")) as (pool, factory):
        pool.served(job("a1", image="task-a:latest"))
        pool.served(job("b1", image="task-b:1"))
        until(lambda: ready_by_image(pool) == {"task-b:1": 2})
        time.sleep(0.1)
        assert all(box.container.config.image == "task-b:1" for box in factory.made)


def test_the_clone_limit_is_no_class_the_job_gets_its_own_on_hand_over():
    with running_pool(1) as (pool, factory):
        pool.served(job("j0", max_workspace=1 << 20))
        until(lambda: ready(pool) == 1)
        box = pool.take(job("j1", max_workspace=5 << 20))
        assert box is not None and box.container.config.max_workspace == 5 << 20


def test_a_refused_hand_over_ends_the_take_and_is_removed_off_the_jobs_path():
    with running_pool(3) as (pool, factory):
        pool.served(job())
        until(lambda: ready(pool) == 3)
        factory.api.refuse = True
        assert pool.take(job()) is None   # the job makes its own at once...
        assert ready(pool) >= 2           # ...without trying (and removing) every other one first
        until(lambda: any(box.closed for box in factory.made))
        assert [box.closed_by for box in factory.made if box.closed] == ["pid-warm-pool"]


class FreshSandboxes:
    """DockerSandbox.create's stand-in for PooledProvider's sandboxes made new."""

    def __init__(self, factory: Factory) -> None:
        self.factory, self.made = factory, []

    def create(self, config: SandboxConfig, client: Any = None, workspace: Any = None) -> Any:
        box = self.factory(config)
        self.made.append(box)
        return box


def test_a_checked_jobs_check_sandbox_is_made_new_and_no_class_of_the_pool(monkeypatch):
    factory = Factory()
    fresh = FreshSandboxes(factory)
    monkeypatch.setattr("pid.sandbox.docker_sandbox.DockerSandbox", fresh)   # (DockerProvider's: a new one)
    pool = WarmPool(2, create=factory).start()
    try:
        pool.served(job("j0"))
        until(lambda: ready(pool) == 2)
        run = warm_pool.PooledProvider(pool)   # one job's run
        own = run.create(job("j1"))
        assert own not in fresh.made and own.container.config.job_id == "j1"
        check = run.create(job("j1", image="sha256:one"))   # its --check: the image the agent's ran, by id
        assert check in fresh.made
        assert factory.api.renamed == [(own.container.id, "pid-job-j1-a1")]   # the check took no ready one
        assert [w.template.image for w in pool._classes.values()] == ["pid-sandbox:latest"]
        until(lambda: ready(pool) == 2)   # and the pool keeps the job's class alone
    finally:
        pool.close()


def test_a_long_job_of_a_class_does_not_make_its_short_jobs_containers_live_long():
    factory = Factory()
    pool = WarmPool(2, create=factory).start()
    week, short = 7 * 86400.0, 600.0
    try:
        pool.served(job("long", ttl_s=week))
        pool.served(job("j0", ttl_s=short))
        until(lambda: ready(pool) == 2)
        for name, ttl in (("j1", short), ("j2", week)):
            box = pool.take(job(name, ttl_s=ttl))
            assert box is not None
            made = factory.configs[int(box.container.id[1:])]   # (as the pool made it: its container's life)
            assert ttl + warm_pool.SPARE_S <= made.ttl_s <= warm_pool.longest_life(ttl, warm_pool.IDLE_S)
    finally:
        pool.close()


def test_a_ready_sandbox_far_longer_lived_than_the_job_is_not_given():
    with running_pool(1) as (pool, factory):
        pool.served(job(ttl_s=1000.0))
        until(lambda: ready(pool) == 1)
        with pool._cond:   # (as if made for a job of the class that lived far longer)
            next(iter(pool._classes.values())).ready[0].expires += 10 * 86400
        assert pool.take(job(ttl_s=1000.0)) is None
        until(lambda: factory.made[0].closed)


class Stuck(Factory):
    """Its sandboxes' removal hangs (an engine that does not answer) until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def __call__(self, config: SandboxConfig) -> Any:
        box = super().__call__(config)
        box.close = lambda: self.release.wait(60)
        return box


def test_a_worker_that_must_exit_does_so_even_if_its_pool_cannot_be_removed(monkeypatch):
    from types import SimpleNamespace

    from pid.worker import main_process
    factory = Stuck()
    pool = WarmPool(1, create=factory).start()
    exits: list[int] = []
    monkeypatch.setattr(main_process, "HANDBACK_S", 0)
    monkeypatch.setattr(main_process, "POOL_STOP_S", 0)
    monkeypatch.setattr(main_process, "WARM_POOL_CLOSE_S", 0.2, raising=False)
    monkeypatch.setattr(main_process.logging, "shutdown", lambda: None)
    monkeypatch.setattr(main_process.os, "_exit", exits.append)
    monkeypatch.setattr(warm_pool, "_active", [pool])
    stopping = threading.Thread(target=main_process.WorkerSignals._bound_the_stop,
                                args=(SimpleNamespace(running=lambda: 0),), daemon=True)
    try:
        pool.served(job())
        until(lambda: ready(pool) == 1)
        stopping.start()
        stopping.join(20)
        assert exits == [0]   # it exited, its ready sandbox's removal still hanging (the next reap's)
    finally:
        factory.release.set()
        stopping.join(20)   # (ended while os._exit is still the stand-in)
        pool.close()


BLANKED = {"job_id", "attempt", "pool", "max_workspace"}   # the job's own (ttl_s: by band, below)


def other_value(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 3
    return (value or "") + "x"


def test_every_other_config_field_makes_a_class_of_its_own():
    base = job()
    hash(class_of(base))
    for each in dataclasses.fields(SandboxConfig):
        if each.name == "ttl_s":
            continue
        changed = class_of(dataclasses.replace(base, **{each.name: other_value(getattr(base, each.name))}))
        hash(changed)   # (a dict key)
        assert (changed == class_of(base)) == (each.name in BLANKED), each.name
    assert class_of(dataclasses.replace(base, ttl_s=900.0)) == class_of(base)   # one band: (512, 1024] s
    assert class_of(dataclasses.replace(base, ttl_s=1100.0)) != class_of(base)
