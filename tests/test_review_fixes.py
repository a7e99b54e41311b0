"""Fixes from the review of the long-tasks / batches merge: each test fails without its fix."""
from __future__ import annotations

from dataclasses import replace

import pytest


@pytest.fixture(autouse=True)
def no_user_files(tmp_path, monkeypatch):
    """No models.json but the ones a test writes (never the machine's ~/.pi)."""
    monkeypatch.delenv("PID_MODELS", raising=False)
    monkeypatch.setenv("PID_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path / "pi-agent"))


def test_continue_and_retry_accept_max_cost_with_the_model_tables_prices():
    """`submit --max-cost` takes the model table's prices; `pid retry` / `pid continue` of that job must too (they
    used to refuse every such job: its spec has max_cost and no explicit price)."""
    from pid.errors import PidError
    from pid.jobs.requeue import check_prices
    from pid.jobs.spec import JobSpec
    check_prices(JobSpec(task="t", repo="/r", model="gpt-4o", max_cost=1.0))            # the table prices it
    check_prices(JobSpec(task="t", repo="/r", model="house-model", max_cost=1.0, input_price=2.0))
    check_prices(JobSpec(task="t", repo="/r", model="house-model"))                     # no --max-cost
    with pytest.raises(PidError, match="--max-cost needs the model's prices"):
        check_prices(JobSpec(task="t", repo="/r", model="house-model", max_cost=1.0))
    carried = JobSpec(task="t", repo="/r", model="gpt-4o", max_cost=1.0)
    check_prices(carried)   # (the job carries the table's prices: see the test below)
    assert carried.input_price > 0 and carried.output_price > 0


def test_a_job_whose_max_cost_the_clients_model_table_priced_carries_those_prices(tmp_path, monkeypatch):
    """A new user's test: PID_MODELS priced the model where `pid submit` ran, not where the worker ran; the client
    accepted --max-cost, and the worker failed the job (exit 1, nothing ran). The job now carries the prices its cap
    was accepted on. A PID_MODELS that names no file is refused at submit, as `pid run` refuses it."""
    import json
    from pid.api import _parse
    from pid.errors import PidError
    from pid.jobs.submission import build_spec
    from pid.models import model_info
    models = tmp_path / "models.json"
    models.write_text(json.dumps({"providers": {"house": {"models": [
        {"id": "pricey", "cost": {"input": 3, "output": 15, "cacheRead": 0.3}}]}}}))
    monkeypatch.setenv("PID_MODELS", str(models))
    repo = tmp_path / "repo"
    repo.mkdir()

    def spec(**options):
        params = _parse("submit", "t", str(repo), {"model": "pricey", **options})
        for name in ("api_key", "no_images", "max_workspace", "queue"):   # (as pid.submit takes them out)
            params.pop(name)
        return build_spec(params, False, lambda _: None)
    capped = spec(max_cost=0.5)
    table = model_info("pricey")
    assert (capped.input_price, capped.output_price, capped.cache_read_price, capped.cache_write_price) == \
        (table.input_price, table.output_price, table.cache_read_price, table.cache_write_price) and \
        (capped.input_price, capped.output_price) == (3, 15)
    assert spec(max_cost=0.5, input_price=1.0).output_price == 0.0   # prices given: the table's stay out
    assert spec().input_price == 0.0                                 # no cap: the worker's table prices it
    monkeypatch.setenv("PID_MODELS", str(tmp_path / "nonexistent.json"))
    with pytest.raises(PidError, match="nonexistent.json"):
        spec()


def test_openai_s_own_endpoint_gets_max_completion_tokens():
    """The compaction's summary call is the one that sets max_tokens; OpenAI's API refuses `max_tokens` for its
    reasoning models (every summary of a gpt-5 / o3 / o4-mini job failed), and accepts max_completion_tokens for all
    models. Other OpenAI-compatible servers keep `max_tokens`."""
    from pid.providers import make_provider
    from pid.providers.base import ProviderConfig
    for base_url, field in ((None, "max_completion_tokens"), ("https://api.openai.com/v1", "max_completion_tokens"),
                            ("http://127.0.0.1:8000/v1", "max_tokens")):
        provider = make_provider(ProviderConfig(model="gpt-5", base_url=base_url, api_key="k", max_tokens=1234))
        try:
            body = provider.request_body("sys", [], [])
        finally:
            provider.close()
        assert body.get(field) == 1234 and len({"max_tokens", "max_completion_tokens"} & set(body)) == 1, base_url


def test_a_retry_after_of_nan_is_no_wait_asked_and_the_budget_still_ends_the_retries():
    """float("nan") parses: the wait was NaN, every comparison with the budget False, so a server answering
    `Retry-After: nan` was retried at once and forever."""
    import math

    from pid.providers.retry import RATE_LIMITED, RetryPolicy, server_delay
    asked = server_delay(429, {"Retry-After": "nan"})
    policy = RetryPolicy(max_wait_s=5, budget_s=10)
    wait = policy.wait_before_retry(1, RATE_LIMITED, asked, 0.0)
    assert wait is not None and math.isfinite(wait) and 0 <= wait <= 1
    assert policy.wait_before_retry(3, RATE_LIMITED, asked, 10.0) is None


def test_session_entry_ids_never_repeat_and_a_cycle_never_hangs_a_reader(tmp_path, monkeypatch):
    """Entry ids are 8 hex digits: in a long (or continued) session two can meet. A repeated id turned the chain into
    a cycle, and the readers `pid continue` uses (session_context_entries, session_chain) looped forever."""
    import json
    import threading

    import pid.session
    from pid.messages import UserMessage
    from pid.session import SessionWriter, read_session, session_context_entries
    from pid.jobs.continuation import session_chain

    drawn = iter(["aaaaaaaa", "aaaaaaaa", "bbbbbbbb", "aaaaaaaa", "bbbbbbbb", "cccccccc"])
    monkeypatch.setattr(pid.session, "_entry_id", lambda: next(drawn))
    path = tmp_path / "s.jsonl"
    with SessionWriter(str(path)) as writer:
        ids = [writer.message(UserMessage.text(t)) for t in ("one", "two", "three")]
    assert ids == ["aaaaaaaa", "bbbbbbbb", "cccccccc"]

    header = {"type": "session", "version": 3, "id": "s", "timestamp": "t", "cwd": "/workspace"}
    looped = [header] + [{"type": "message", "id": i, "parentId": p, "timestamp": "t",
                          "message": UserMessage.text(i).to_dict()} for i, p in (("a", None), ("b", "a"), ("c", "b"),
                                                                                  ("a", "c"))]
    (tmp_path / "loop.jsonl").write_text("\n".join(json.dumps(x) for x in looped) + "\n")
    done: list[object] = []
    reader = threading.Thread(target=lambda: done.extend([read_session(str(tmp_path / "loop.jsonl")),
                                                          session_context_entries(str(tmp_path / "loop.jsonl")),
                                                          session_chain((tmp_path / "loop.jsonl").read_text())]),
                              daemon=True)
    reader.start()
    reader.join(2)
    assert len(done) == 3, "a reader loops on a cycle of parentIds"


def test_a_page_shows_a_dash_for_numbers_json_can_say_but_no_format_can(tmp_path):
    """json.load takes NaN, Infinity and 1e999: fmt_int / fmt_duration raised on them (a traceback from pid view)."""
    import json

    from pid.cli.pages.batch import render_batch
    from pid.cli.pages.job import render_job
    job = tmp_path / "job"
    job.mkdir()
    (job / "result.json").write_text('{"id": "x", "status": "completed", "turns": 1e999, "duration_s": Infinity, '
                                     '"usage": {"total_tokens": NaN, "cost": "inf"}}')
    assert "pid job" in render_job(str(job))
    (tmp_path / "batch.jsonl").write_text(json.dumps({"id": "job", "tokens": "nan", "duration_s": "1e999"}) + "\n")
    render_batch(str(tmp_path), str(tmp_path / "view"))


def test_a_rate_limited_summary_call_waits_with_an_event_as_any_model_call(tmp_path):
    """The summary call retried silently: `pid logs` showed 'compacting the context' through every wait. Each wait
    is a model_retry event, between compaction_start and compaction_end."""
    from typing import Any

    from pid import events as ev
    from pid.compaction import SUMMARIZATION_SYSTEM_PROMPT
    from tests.scripted_llm import ScriptedLLM
    from tests.test_compaction import LongJob, run_job, system_text

    model = LongJob(turns=20)
    limited = {"n": 0}

    def responder(body: dict[str, Any]) -> dict[str, Any]:
        if system_text(body).startswith(SUMMARIZATION_SYSTEM_PROMPT[:40]) and limited["n"] == 0:
            limited["n"] += 1
            return {"error": {"status": 429, "headers": {"Retry-After": "0.2"}}}
        return model(body)

    events: list = []
    with ScriptedLLM(responder=responder) as llm:
        outcome, _agent, _session = run_job(llm, tmp_path, events=events)
    assert outcome.status == "completed", outcome.error
    kinds = [type(e) for e in events if isinstance(e, (ev.CompactionStart, ev.CompactionEnd, ev.ModelRetry))]
    assert kinds[:3] == [ev.CompactionStart, ev.ModelRetry, ev.CompactionEnd]
    first_end = next(e for e in events if isinstance(e, ev.CompactionEnd))
    assert first_end.error is None
    retry = next(e for e in events if isinstance(e, ev.ModelRetry))
    assert retry.status == 429 and retry.describe() == "rate limited, retrying in 0.2 s"
    # (a backoff's wait near nothing read "retrying in 0.0 s")
    assert replace(retry, wait_s=0.01, reason="unreachable").describe() == "unreachable, retrying at once"


def test_a_worker_without_the_models_prices_refuses_a_job_with_max_cost(sample_repo, tmp_path):
    """The client accepts --max-cost on its own model table's prices; the worker reads its own table. One that has no
    prices for the model ran the job with a cap that could never stop it (cost 0); it refuses the job instead."""
    from tests.memory_sandbox import MemoryProvider
    from tests.scripted_llm import ScriptedLLM
    from pid.jobs.spec import JobSpec
    from pid.worker.runner import run_job

    def spec(llm: ScriptedLLM, **extra) -> JobSpec:
        return JobSpec(task="go", repo=str(sample_repo), out_dir=str(tmp_path / "out"), base_url=llm.base_url,
                       max_cost=1.0, **extra)

    with ScriptedLLM([{"text": "done"}, {"text": "done"}]) as llm:
        refused = run_job(spec(llm, model="house-model"), sandboxes=MemoryProvider({}))
        priced = run_job(spec(llm, model="house-model", input_price=1.0), sandboxes=MemoryProvider({}))
        tabled = run_job(spec(llm, model="gpt-4o-mini"), sandboxes=MemoryProvider({}))
        served = len(llm.requests)
    assert refused["status"] == "failed" and "--max-cost needs the model's prices" in refused["error"]
    assert priced["status"] == tabled["status"] == "completed"
    assert served == 2   # the refused job never called the model


def test_a_continued_conversation_updates_its_parents_summary_and_keeps_its_file_lists(tmp_path):
    """A continued job opens with its parent's compaction summary. Its first compaction summarised that summary as
    if the user had written it (a fresh summary, the parent's file lists lost); as pi does, it is the previous
    summary to update, and its read/modified files carry on."""
    from typing import Any

    from pid.agent import Agent, Limits
    from pid.compaction import Compactor
    from pid.messages import AssistantMessage, TextContent, UserMessage
    from pid.providers import make_provider
    from pid.providers.base import ProviderConfig
    from pid.session import SessionWriter, session_context, session_context_entries
    from pid.tools.base import ToolContext
    from pid.tools.registry import default_registry
    from tests.scripted_llm import ScriptedLLM
    from tests.test_compaction import WINDOW, LongJob, entries, make_box
    from pid.jobs.continuation import Parent, session_chain, start_session

    parent_path = tmp_path / "parent.jsonl"
    with SessionWriter(str(parent_path)) as parent:
        parent.message(UserMessage.text("the first task"))
        kept = parent.message(AssistantMessage([TextContent("earlier work")]))
        parent.compaction("## Goal\nPARENT-SUMMARY", kept, 30000,
                          {"readFiles": ["PARENT-READ.py"], "modifiedFiles": ["PARENT-MOD.py"]})
        parent.message(UserMessage.text("go on"))
        parent.message(AssistantMessage([TextContent("done")]))
    chain = session_chain(parent_path.read_text())
    loaded = Parent("p", str(parent_path), chain, b"")

    model = LongJob(turns=30)
    child_path = tmp_path / "child.jsonl"
    with ScriptedLLM(responder=model) as llm:
        provider = make_provider(ProviderConfig(model="scripted", base_url=llm.base_url))
        session = SessionWriter(str(child_path), parent_session=str(parent_path))
        start_session(session, loaded)
        with make_box() as box:
            agent = Agent(provider, default_registry(), ToolContext(sandbox=box), "sys", session=session,
                          limits=Limits(max_turns=100), compactor=Compactor(provider, WINDOW))
            agent.load_history(session_context_entries(str(parent_path)), loaded.latest_compaction)
            before = [m.to_dict() for m in agent._context_messages()]
            outcome = agent.run("more")
        session.close()
        provider.close()
    assert outcome.status == "completed", outcome.error
    # loading changed nothing of what the model sees: the parent's summary, then its kept messages
    assert [m["content"] for m in before] == [m.to_dict()["content"]
                                              for m in session_context(str(parent_path))]
    first: Any = model.summaries[0]["messages"][-1]["content"]
    assert "<previous-summary>" in first and "PARENT-SUMMARY" in first.split("<conversation>")[0] + \
        first.split("</conversation>")[1]
    compactions = [e for e in entries(child_path) if e["type"] == "compaction"][1:]   # the child's own
    assert compactions and "PARENT-READ.py" in compactions[0]["details"]["readFiles"]
    assert "PARENT-MOD.py" in compactions[0]["details"]["modifiedFiles"]


def test_anthropic_s_input_plus_max_tokens_refusal_is_a_refusal_for_length():
    """With thinking, an Anthropic request asks for max_tokens = output + thinking budget (24,576 at `high`), more
    than compaction's reserve (16,384): a context just under the threshold is refused in these words, which must
    compact (the job ended provider_error)."""
    from pid.messages import AssistantMessage
    from pid.providers.overflow import is_context_overflow
    text = ("HTTP 400 from https://api.anthropic.com/v1/messages: input length and `max_tokens` exceed context "
            "limit: 183000 + 24576 > 200000, decrease input length or `max_tokens` and try again")
    message = AssistantMessage([], "anthropic-messages", "anthropic", "claude-sonnet-4-5", stop_reason="error",
                               error_message=text)
    assert is_context_overflow(message)


def test_pid_status_stops_saying_compacting_once_the_compaction_ended():
    """A compaction is followed by the model call: `pid status` said 'compacting the context' all through it."""
    from pid import events as ev
    from pid.jobs.progress import Progress
    progress = Progress()
    progress.on_event(ev.TurnStart(7))
    progress.on_event(ev.CompactionStart("threshold", 30000))
    assert progress.snapshot()["activity"] == "turn 7: compacting the context"
    progress.on_event(ev.CompactionEnd("threshold", 30000, 9000, 12, "summary"))
    assert progress.snapshot()["activity"] == "turn 7: waiting for the model"


def test_pid_status_says_a_held_job_is_paused():
    """A new user's test: a job held by `pid pause` said "turn 1: waiting for the model" for as long as it was held."""
    from pid import events as ev
    from pid.jobs.progress import Progress
    progress = Progress()
    progress.on_event(ev.TurnStart(2))
    progress.on_event(ev.Control("pause", "sent"))       # (sent: the agent holds only at its next model call)
    assert progress.snapshot()["activity"] == "turn 2: waiting for the model"
    progress.on_event(ev.Control("pause", "received"))
    assert progress.snapshot()["activity"] == "turn 2: paused (pid resume lets it go on)"
    progress.on_event(ev.Control("resume", "received"))
    assert progress.snapshot()["activity"] == "turn 2: resumed"
    progress.on_event(ev.Control("steer", "received", "hi"))   # (other controls leave it as it is)
    assert progress.snapshot()["activity"] == "turn 2: resumed"
