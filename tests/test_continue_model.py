"""`pid continue --model/--base-url/--api`: the new job's spec (worker/continuation.switch_model), no engine."""
from __future__ import annotations

import pytest

from pid.config import DEFAULT_BASE_URLS
from pid.jobs.continuation import MODEL_FIELDS, Refused, continuation_spec, switch_model
from pid.jobs.spec import JobSpec
from pid.jobs.sqlite_store import JobStore

OPENAI, ANTHROPIC = DEFAULT_BASE_URLS["openai-completions"], DEFAULT_BASE_URLS["anthropic-messages"]


def earlier(**fields) -> JobSpec:
    spec = JobSpec(task="t", model="small", input_price=1.5, output_price=2.0, cache_read_price=0.1,
                   cache_write_price=0.2, context_window=8000, max_tokens=900, thinking="low", **fields)
    spec.base_url = spec.base_url or OPENAI
    return spec


def test_another_model_starts_from_the_model_tables_values_not_the_earlier_models():
    spec = earlier(base_url="http://mine:8000/v1")
    switch_model(spec, "big")
    assert spec.model == "big" and spec.base_url == "http://mine:8000/v1" and spec.thinking == "low"
    defaults = JobSpec(task="-", model="-")
    assert all(getattr(spec, name) == getattr(defaults, name) for name in MODEL_FIELDS)
    same = earlier()
    switch_model(same, "small")          # the same model keeps what the earlier job said of it
    assert (same.input_price, same.context_window) == (1.5, 8000)


def test_endpoint_and_wire_format():
    spec = earlier()
    switch_model(spec, base_url="http://other:9/v1")
    assert (spec.base_url, spec.api, spec.model) == ("http://other:9/v1", "openai-completions", "small")
    spec = earlier()
    switch_model(spec, api="anthropic-messages")        # a vendor's own endpoint becomes the new format's own
    assert (spec.api, spec.base_url) == ("anthropic-messages", ANTHROPIC)
    spec = earlier(base_url="http://mine:8000/v1")
    switch_model(spec, api="anthropic-messages")        # an endpoint of one's own stays
    assert (spec.api, spec.base_url) == ("anthropic-messages", "http://mine:8000/v1")
    spec = earlier()
    switch_model(spec)
    assert spec.base_url == OPENAI and spec.model == "small"


def test_a_killed_pid_run_is_refused_saying_why_and_what_runs_it_again(tmp_path):
    """A `pid run` whose process was killed (client_lost) kept no conversation: continue says so, and names retry,
    instead of blaming the retention period."""
    store = JobStore(str(tmp_path / "jobs.db"))
    record = store.create(JobSpec(task="t", model="m"), kind="run")
    assert store.claim(record.id, "me", 60)
    assert store.finish(record.id, "client_lost", owner="me", error="its pid run process is gone")
    with pytest.raises(Refused) as refused:
        continuation_spec(store, record.id, "go on")
    assert "client_lost" in str(refused.value) and f"pid retry {record.id}" in str(refused.value)
    assert "retention" not in str(refused.value)
