"""The control relay (worker/control.py) against a real SQLite job store behind a gate that can hang or fail its
controls read: the agent's check-in never waits on a failing store, only the relay's thread reads and applies the
controls, and a pause it applied is never undone by an older read. Orderings are made with Events; no durations
are asserted (the check-in's bound is set here to what each test needs)."""
from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from pid.jobs.spec import JobSpec
from pid.jobs.sqlite_store import JobStore
from pid.worker import control
from pid.worker.control import ControlRelay
from tests.memory_sandbox import Commands, MemorySandbox, Run
from tests.scripted_llm import ScriptedLLM
from tests.test_agent import bash, make_agent

OWNER = "host:1:test"


class GatedStore:
    """A JobStore whose controls() can fail (`down`) or, once, hang after its read until `release` (a stale answer,
    late); every call's thread is noted."""

    def __init__(self, inner: JobStore) -> None:
        self.inner = inner
        self.down = False
        self.hang_once = threading.Event()   # set: the next controls() hangs
        self.hung = threading.Event()        # it hangs now
        self.release = threading.Event()
        self.failed = threading.Event()      # a controls() raised
        self.controls_calls = 0
        self.called = threading.Condition()
        self.threads: set[str] = set()

    def controls(self, job_id: str, owner: str):
        self.threads.add(threading.current_thread().name)
        with self.called:
            self.controls_calls += 1
            self.called.notify_all()
        if self.down:
            self.failed.set()
            raise ConnectionError("the store is down")
        answer = self.inner.controls(job_id, owner)
        if self.hang_once.is_set():
            self.hang_once.clear()
            self.hung.set()
            self.release.wait()
        return answer

    def wait_for_calls(self, n: int) -> None:
        with self.called:
            assert self.called.wait_for(lambda: self.controls_calls >= n, timeout=60)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def noted(*args, **kwargs):
            self.threads.add(threading.current_thread().name)
            return attr(*args, **kwargs)
        return noted


class Controls:
    """A stand-in agent: the controls the relay applied, in order."""

    def __init__(self) -> None:
        self.applied: list[str] = []
        self.paused = False
        self.ended = False

    def pause(self) -> None:
        self.applied.append("pause")
        self.paused = True

    def resume(self) -> None:
        self.applied.append("resume")
        self.paused = False

    def steer(self, text: str) -> bool:
        self.applied.append(f"steer {text}")
        return True

    def follow_up(self, text: str) -> bool:
        self.applied.append(f"follow_up {text}")
        return True

    def cancel(self, why: str | None = None) -> None:
        self.applied.append("cancel")


@pytest.fixture
def store(tmp_path):
    inner = JobStore(str(tmp_path / "jobs.db"))
    job = inner.create(JobSpec(task="t", repo=str(tmp_path), model="m", out_dir=str(tmp_path / "out"),
                               base_url="http://x"))
    assert inner.claim(job.id, OWNER, lease_s=60)
    gated = GatedStore(inner)
    gated.job_id = job.id
    return gated


@pytest.fixture
def relay(store):
    relay = ControlRelay(store, store.job_id, OWNER)
    yield relay
    store.release.set()
    relay.stop()


@pytest.fixture
def sandbox():
    with MemorySandbox(Commands({"echo hi": Run("hi\n")})) as box:
        yield box


SCRIPT = [{"tool_calls": [bash("echo hi")]}, {"text": "done"}]   # three check-ins: two before calls, one at the end


@pytest.mark.timeout(60)
def test_a_check_in_does_not_wait_on_a_store_that_fails(store, relay, sandbox, monkeypatch):
    monkeypatch.setattr(control, "CHECK_IN_WAIT_S", 3600.0)   # a check-in that waited would hang the test
    store.down = True
    relay.start()
    assert store.failed.wait(60)   # the relay's poll found the store down
    with ScriptedLLM(SCRIPT) as llm:
        agent = make_agent(llm, sandbox, check_in=relay.check_in)
        relay.attach(agent)
        outcome = agent.run("go")
    assert outcome.final_message == "done" and outcome.turns == 2
    assert store.threads == {"pid-control"}   # the agent's thread never touched the store


@pytest.mark.timeout(60)
def test_a_check_in_on_a_hung_store_waits_its_bound_once_and_the_job_goes_on(store, relay, sandbox, monkeypatch):
    monkeypatch.setattr(control, "CHECK_IN_WAIT_S", 0.2)
    store.hang_once.set()
    relay.start()
    with ScriptedLLM(SCRIPT) as llm:
        agent = make_agent(llm, sandbox, check_in=relay.check_in)
        relay.attach(agent)
        outcome = agent.run("go")
        assert store.hung.is_set() and not store.release.is_set()   # the whole run went on beside the hung read
    assert outcome.final_message == "done" and outcome.turns == 2
    assert store.controls_calls == 1 and store.threads == {"pid-control"}
    store.release.set()   # the store answers again: the check-ins wait for the relay's passes again
    store.wait_for_calls(2)


@pytest.mark.timeout(60)
def test_a_check_in_waits_for_a_fresh_read_and_an_older_one_never_undoes_its_pause(store, relay, monkeypatch):
    """The race 59a6311 let through: a poll read `not paused`, was slow, and resumed the agent after the check-in had
    paused it, so the model call went ahead. Now a check-in is answered only by a read that began after it asked,
    and the reads are applied one at a time, in order."""
    monkeypatch.setattr(control, "CHECK_IN_WAIT_S", 3600.0)   # this test is about order, not the bound
    agent = Controls()
    relay.attach(agent)
    store.hang_once.set()
    relay.start()
    assert store.hung.wait(60)                    # a poll read "not paused" and is slow to come back
    assert store.set_paused(store.job_id, True)   # `pid pause`, while the agent's command ran
    checked_in = threading.Thread(target=relay.check_in)   # the command ended: the agent checks in
    checked_in.start()
    while not relay._wake.is_set():   # (the check-in has asked for a pass)
        checked_in.join(0.01)
    assert not agent.applied              # it waits: the slow read began before it asked
    store.release.set()
    checked_in.join(60)
    assert not checked_in.is_alive()
    assert agent.paused and agent.applied == ["resume", "pause"]   # the stale read first, then the fresh one
    calls = store.controls_calls
    store.wait_for_calls(calls + 1)   # another pass began: every earlier read was applied
    assert agent.paused and "resume" not in agent.applied[1:]


@pytest.mark.timeout(60)
def test_steers_and_follow_ups_reach_the_agent_in_the_order_posted(store, relay, monkeypatch):
    monkeypatch.setattr(control, "CHECK_IN_WAIT_S", 3600.0)
    agent = Controls()
    relay.attach(agent)
    store.post(store.job_id, "steer", "one")
    store.post(store.job_id, "follow_up", "two")
    store.post(store.job_id, "steer", "three")
    store.threads.clear()   # (the posts above were `pid steer` and `pid follow-up`)
    relay.start()
    relay.check_in()
    assert agent.applied[:3] == ["steer one", "follow_up two", "steer three"]
    assert store.threads == {"pid-control"}


def test_once_another_worker_holds_the_job_this_attempt_writes_nothing_more_to_its_log(store, relay, monkeypatch):
    """A worker frozen past its lease wakes to find the job another's: its cancel and its last records stayed out
    of the log, which is the new attempt's (they used to interleave with it: a new-user test)."""
    from pid import events as ev
    monkeypatch.setattr(control, "CHECK_IN_WAIT_S", 3600.0)
    agent = Controls()
    relay.attach(agent)
    relay.start()
    relay.on_event(ev.Notice("before"))
    relay.check_in()   # a pass, then its flush
    assert store.inner.requeue(store.job_id, OWNER, lapsed_only=False)   # (its lease lapsed while it was frozen)
    assert store.inner.claim(store.job_id, "elsewhere:2:next", lease_s=60)
    relay.on_event(ev.Notice("while it was frozen"))   # waits for the next flush
    relay.check_in()
    relay.on_event(ev.Notice("after"))
    relay.stop()
    texts = [record.get("text") for _, record in store.inner.events(store.job_id)]
    assert "before" in texts and "while it was frozen" not in texts and "after" not in texts, texts
    assert agent.applied[-1] == "cancel"


def test_a_foreground_run_the_store_ended_while_its_machine_was_away_goes_on(store, monkeypatch, caplog):
    """A `pid run` is its job's only process (nobody runs it again): when another machine's sweep ended it (this one
    slept past the grace), the relay says so once and stops polling; the run is not cancelled."""
    monkeypatch.setattr(control, "CHECK_IN_WAIT_S", 3600.0)
    relay = ControlRelay(store, store.job_id, OWNER, foreground=True)
    agent = Controls()
    relay.attach(agent)
    relay.start()
    relay.check_in()
    assert store.inner.finish(store.job_id, "client_lost", lapsed_only=False, error="gone")   # the other sweep
    calls = store.controls_calls
    with caplog.at_level("WARNING", logger="pid"):
        relay.check_in()
        relay._thread.join(timeout=30)   # it stops polling by itself
    assert not relay._thread.is_alive() and store.controls_calls == calls + 1
    assert "cancel" not in agent.applied and not relay.cancel.is_set()
    assert [r.message for r in caplog.records].count(
        f"job {store.job_id}: the job store no longer counts this run as running (another machine ended it while "
        "this one was away): list, steer, pause and cancel no longer reach it; the run goes on") == 1
    relay.check_in()   # a later check-in does not wait on a relay that stopped
    relay.stop()


@pytest.mark.timeout(60)
def test_a_steer_sent_after_the_agent_ended_is_not_taken_and_the_log_says_so(store, relay, sandbox, monkeypatch):
    """Sent while the job was collected or checked: no agent reads it. It is left in the inbox (not marked taken by a
    relay that hands it to an agent that has ended), and the job's log says, before its end, that it was not
    delivered."""
    monkeypatch.setattr(control, "CHECK_IN_WAIT_S", 3600.0)
    relay.start()
    with ScriptedLLM(SCRIPT) as llm:
        agent = make_agent(llm, sandbox, check_in=relay.check_in)
        relay.attach(agent)
        assert agent.run("go").final_message == "done" and agent.ended
    store.post(store.job_id, "steer", "also fix the tests")
    store.post(store.job_id, "follow_up", "x" * 300)
    calls = store.controls_calls
    store.wait_for_calls(calls + 2)   # two passes saw the mail
    relay.stop()
    control.log_undelivered(store.inner, store.job_id, {"exit_reason": "stop"})
    notes = [record.get("note") for _, record in store.inner.events(store.job_id)]
    assert "steer not delivered: the agent had ended (`pid continue` carries on with a message): also fix the tests" \
        in notes, notes
    assert any(n and n.startswith("follow-up not delivered") and n.endswith("x" * 200 + "…") for n in notes), notes
    assert store.inner.take_messages(store.job_id) == []   # said once


def test_a_foreground_run_that_comes_back_records_its_true_ending_over_client_lost(tmp_path, monkeypatch):
    """Ended client_lost by another host's sweep while its machine slept, the run went on; its end replaces that
    record and the result.json the sweep stored, once."""
    from pid.jobs.artifact_store import read_result, store_result
    from pid.worker.control import ForegroundJob
    monkeypatch.setattr(control, "CHECK_IN_WAIT_S", 3600.0)
    inner = JobStore(str(tmp_path / "jobs.db"))
    spec = JobSpec(task="t", repo=str(tmp_path), model="m", out_dir=str(tmp_path / "out"), base_url="http://x")
    inner.create(spec, kind="run")
    assert inner.claim(spec.id, OWNER, lease_s=60)
    relay = ControlRelay(inner, spec.id, OWNER, foreground=True)
    relay.attach(Controls())
    relay.start()
    assert inner.finish(spec.id, "client_lost", error="not heard from")   # the other host's sweep
    store_result(inner, spec.id, {"id": spec.id, "status": "failed", "exit_reason": "client_lost"})
    relay.check_in()
    relay._thread.join(timeout=30)
    assert relay.disowned
    ending = {"id": spec.id, "status": "completed", "exit_reason": "stop", "turns": 2, "tool_calls": 1}
    ForegroundJob(inner, relay).end(ending)
    record = inner.get(spec.id)
    assert (record.status, record.exit_reason, record.turns) == ("completed", "stop", 2)
    assert read_result(inner, spec.id)["exit_reason"] == "stop"


@pytest.mark.timeout(60)
def test_a_stopping_worker_lets_an_ended_agent_s_job_finish_for_its_grace_then_stops_it(store, relay, monkeypatch):
    """Its worker told to stop: a job whose agent is still running is stopped at once; one whose agent has ended
    (its collection, its check) is finishing, not cancelled, until FINISH_ON_STOP_S has gone by."""
    monkeypatch.setattr(control, "CHECK_IN_WAIT_S", 3600.0)
    monkeypatch.setattr(control, "FINISH_ON_STOP_S", 1.0)
    agent = Controls()
    agent.ended = True
    relay.attach(agent)
    relay.start()
    relay.request_stop("SIGTERM")
    relay.check_in()
    assert relay.finishing() and not relay.cancel.is_set() and "cancel" not in agent.applied
    deadline = time.monotonic() + 30
    while not relay.cancel.is_set():   # the grace goes by: the relay's next poll stops it
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not relay.finishing() and "cancel" in agent.applied

    running = Controls()   # an agent still at work is stopped at the first pass
    other = ControlRelay(store, store.job_id, OWNER)
    other.attach(running)
    other.request_stop("SIGTERM")
    other.start()
    other.check_in()
    assert other.cancel.is_set() and not other.finishing()
    other.stop()
