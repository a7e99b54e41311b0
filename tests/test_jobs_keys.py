"""Which key a worker sends with a job: the job's own, else its environment's, for the endpoint it is bound to."""
from __future__ import annotations

import pytest

from pid.config import EnvDefaults, endpoint
from pid.jobs.spec import JobSpec
from pid.jobs.sqlite_store import JobStore
from pid.worker.tasks import _api_key


@pytest.fixture
def store(tmp_path):
    return JobStore(str(tmp_path / "jobs.db"))


def job(store: JobStore, **fields) -> JobSpec:
    spec = JobSpec(task="t", repo="/r", model="m", out_dir="/o", **fields)
    store.create(spec)
    return spec


def test_the_worker_s_key_goes_to_its_own_endpoint_only(store, monkeypatch):
    monkeypatch.setenv("PID_API_KEY", "sk-worker")
    monkeypatch.setenv("PID_BASE_URL", "http://models.internal:8000/v1")
    assert _api_key(store, job(store, base_url="http://models.internal:8000/v1/"), None) == "sk-worker"
    assert _api_key(store, job(store, base_url="http://attacker.example/v1"), None) is None
    assert _api_key(store, job(store), None) is None   # (OpenAI's own endpoint: not the one the key is for)
    mine = job(store, base_url="http://attacker.example/v1")
    store.set_secret(mine.id, "sk-submitted")
    assert _api_key(store, mine, None) == "sk-submitted"   # a key submitted with the job is the job's to send


def test_without_pid_base_url_the_worker_s_key_is_for_its_api_s_own_endpoint(store, monkeypatch):
    monkeypatch.setenv("PID_API_KEY", "sk-worker")
    monkeypatch.delenv("PID_BASE_URL", raising=False)
    monkeypatch.setenv("PID_API", "anthropic")
    assert _api_key(store, job(store, api="anthropic-messages"), None) == "sk-worker"
    assert _api_key(store, job(store), None) is None   # an Anthropic key never goes to OpenAI
    assert _api_key(store, job(store, api="anthropic-messages", base_url="http://x.example/v1"), None) is None


def test_an_endpoint_is_compared_as_the_job_would_reach_it():
    assert endpoint("openai-completions", None) == "https://api.openai.com/v1"
    assert endpoint("openai-completions", "https://api.openai.com/v1/") == "https://api.openai.com/v1"
    assert EnvDefaults("k", None, "openai-completions").key_for("openai-completions", "https://api.openai.com/v1")
