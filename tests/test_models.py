"""The model table (pid/models.py), the refusal-for-length classifier, and how a job uses both: prices and window
from the table, a notice for an unknown model, compaction events in the job's log lines."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pid import events as ev
from pid.event_records import EventRecords
from pid.messages import AssistantMessage
from pid.models import DEFAULT_CONTEXT_WINDOW, ModelsFileError, model_info, unknown_model_warning
from pid.providers.overflow import is_context_overflow


@pytest.fixture(autouse=True)
def no_user_files(tmp_path, monkeypatch):
    """No models.json but the ones a test writes (never the machine's ~/.pi)."""
    monkeypatch.delenv("PID_MODELS", raising=False)
    monkeypatch.setenv("PID_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path / "pi-agent"))


def test_built_in_models_by_id_snapshot_vendor_prefix_and_tag():
    gpt = model_info("gpt-4o")
    assert (gpt.context_window, gpt.max_tokens, gpt.input_price, gpt.output_price) == (128000, 16384, 2.5, 10)
    assert gpt.known and gpt.source == "built-in"
    assert model_info("gpt-4o-mini-2024-07-18").input_price == 0.15          # the longest id it starts with
    sonnet = model_info("claude-sonnet-4-5-20250929")
    assert (sonnet.context_window, sonnet.cache_read_price, sonnet.cache_write_price, sonnet.reasoning) == \
        (200000, 0.3, 3.75, True)
    assert model_info("openai/gpt-oss-20b").context_window == 131072
    assert model_info("Qwen/Qwen3-Coder-30B-A3B-Instruct").context_window == 262144
    assert model_info("qwen3-coder:30b").known


def test_an_unknown_model_gets_pis_default_window_and_a_warning():
    info = model_info("my-finetune-v3")
    assert not info.known and info.context_window == DEFAULT_CONTEXT_WINDOW == 128000
    assert info.input_price == info.output_price == 0
    assert "--context-window" in unknown_model_warning(info) and "my-finetune-v3" in unknown_model_warning(info)
    assert not model_info("gpt-4oo").known     # a prefix must end at a separator
    # what its options gave is not said to be assumed (a new user's test: "no prices" with --input-price given)
    priced = model_info("my-finetune-v3", {"input_price": 1.0})
    assert "assuming a 128,000-token context window (set --context-window, or" in unknown_model_warning(priced)
    assert unknown_model_warning(priced, window_given=True) is None


def test_overrides_win_and_none_means_not_given():
    info = model_info("gpt-4o", {"context_window": 50000, "input_price": None, "output_price": 1.0})
    assert (info.context_window, info.input_price, info.output_price) == (50000, 2.5, 1.0)


def write_pi_models(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"providers": {
        "local-vllm": {"baseUrl": "http://gpu:8000/v1", "api": "openai-completions", "apiKey": "none",
                       "models": [{"id": "my-coder", "contextWindow": 65536, "maxTokens": 8192, "reasoning": True,
                                   "cost": {"input": 0.5, "output": 1.5, "cacheRead": 0.05, "cacheWrite": 0.6}},
                                  {"id": "bare"}]},
        "openai": {"models": [{"id": "gpt-4o", "contextWindow": 100000, "cost": {"input": 9, "output": 9}}]}}}))


def test_a_pi_models_json_works_as_it_is(tmp_path, monkeypatch):
    path = tmp_path / "pi-agent" / "models.json"     # pi's own file, where pi reads it
    write_pi_models(path)
    mine = model_info("my-coder")
    assert (mine.context_window, mine.max_tokens, mine.input_price, mine.output_price, mine.cache_read_price,
            mine.cache_write_price, mine.reasoning, mine.source) == (65536, 8192, 0.5, 1.5, 0.05, 0.6, True, str(path))
    assert model_info("local-vllm/my-coder").context_window == 65536
    assert (model_info("bare").context_window, model_info("bare").max_tokens) == (128000, 16384)   # pi's defaults
    assert model_info("gpt-4o").context_window == 100000    # the user's file overrides the built-in entry
    assert model_info("gpt-4o-mini").context_window == 128000   # and the rest of the table still applies


def test_pid_home_file_comes_before_pi_s_and_pid_models_before_both(tmp_path, monkeypatch):
    write_pi_models(tmp_path / "pi-agent" / "models.json")
    home = tmp_path / "home" / "models.json"
    home.parent.mkdir(parents=True)
    home.write_text(json.dumps({"providers": {"x": {"models": [{"id": "my-coder", "contextWindow": 40000}]}}}))
    assert model_info("my-coder").context_window == 40000
    explicit = tmp_path / "explicit.json"
    explicit.write_text(json.dumps({"providers": {"x": {"models": [{"id": "my-coder", "contextWindow": 50000}]}}}))
    monkeypatch.setenv("PID_MODELS", str(explicit))
    assert model_info("my-coder").context_window == 50000


@pytest.mark.parametrize("content, message", [
    (None, "no such file"), ("{not json", "cannot read"), ('{"models": []}', "providers"),
    ('{"providers": {"p": {"models": [{"name": "x"}]}}}', "id"),
    ('{"providers": {"p": {"models": [{"id": "x", "contextWindow": "big"}]}}}', "'x'")])
def test_a_broken_models_file_is_an_error_not_a_guess(tmp_path, monkeypatch, content, message):
    path = tmp_path / "models.json"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv("PID_MODELS", str(path))
    with pytest.raises(ModelsFileError, match=message):
        model_info("x")


def _error(text: str) -> AssistantMessage:
    return AssistantMessage([], stop_reason="error", error_message=text)


@pytest.mark.parametrize("text", [
    "HTTP 400 from u: This model's maximum context length is 32768 tokens. However, your messages resulted in 40000 "
    "tokens. Please reduce the length of the messages.",                                         # OpenAI, vLLM
    "HTTP 400 from u: prompt is too long: 213462 tokens > 200000 maximum",                       # Anthropic
    "HTTP 400 from u: Your input exceeds the context window of this model.",                     # OpenAI responses
    "HTTP 400 from u: the request exceeds the available context size, try increasing it",        # llama.cpp
    "HTTP 400 from u: The input (40000 tokens) is longer than the model's context length (32768 tokens).",  # SGLang
    "HTTP 422 from u: Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096",   # TGI
    "HTTP 400 from u: context_length_exceeded", "HTTP 400 from u: too many tokens in the request",
])
def test_refusals_for_length_are_recognised(text):
    assert is_context_overflow(_error(text))


@pytest.mark.parametrize("text", [
    "HTTP 429 from u: Too many tokens, please wait before trying again.",
    "HTTP 400 from u: Rate limit reached: too many tokens per minute",
    "HTTP 500 from u: internal error", "cannot reach http://x: connection refused",
])
def test_other_failures_are_not_refusals_for_length(text):
    assert not is_context_overflow(_error(text))
    assert not is_context_overflow(AssistantMessage([], stop_reason="stop", error_message="prompt is too long"))


def test_compaction_and_notices_become_bounded_log_records(capsys):
    from pid.cli.output import RecordPrinter
    records = EventRecords()
    start = records(ev.CompactionStart("threshold", 20000))
    end = records(ev.CompactionEnd("threshold", 20000, 9000, 42, "## Goal\nlong summary " * 500))
    failed = records(ev.CompactionEnd("overflow", 30000, error="summarization failed: HTTP 500"))
    notice = records(ev.Notice("model 'x' is not in the model table"))
    assert start is not None and start["type"] == "compaction_start" and start["tokens"] == 20000
    assert end is not None and "summary" not in end and end["tokens_after"] == 9000
    assert failed is not None and failed["error"].startswith("summarization failed")
    printer = RecordPrinter()
    for record in (start, end, failed, notice):
        printer(record)   # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert "context compacted (context full): 20,000 -> 9,000 tokens, 42 messages summarised" in err
    assert "compaction failed (refused for length, 30,000 tokens): summarization failed: HTTP 500" in err
    assert "warning: model 'x' is not in the model table" in err


def test_a_job_takes_prices_and_window_from_the_table_and_warns_of_an_unknown_model(sample_repo, tmp_path):
    from tests.memory_sandbox import MemoryProvider
    from tests.scripted_llm import ScriptedLLM
    from pid.jobs.spec import JobSpec
    from pid.worker.runner import run_job

    def spec(model: str, llm: ScriptedLLM, **extra) -> JobSpec:
        return JobSpec(task="go", repo=str(sample_repo), model=model, out_dir=str(tmp_path / "out"),
                       base_url=llm.base_url, **extra)

    events: list = []
    with ScriptedLLM([{"text": "done", "usage": {"prompt_tokens": 1_000_000, "completion_tokens": 100_000}}]) as llm:
        known = run_job(spec("gpt-4o-mini", llm), sandboxes=MemoryProvider({}), sink=events.append)
    assert known["status"] == "completed" and known["usage"]["cost"] == pytest.approx(0.15 + 0.06)
    assert not [e for e in events if isinstance(e, ev.Notice)]
    with ScriptedLLM([{"text": "done"}]) as llm:
        unknown = run_job(spec("house-model", llm), sandboxes=MemoryProvider({}), sink=events.append)
        told = run_job(spec("house-model", llm, context_window=65536), sandboxes=MemoryProvider({}),
                       sink=events.append)
    assert unknown["status"] == told["status"] == "completed"
    notices = [e.text for e in events if isinstance(e, ev.Notice)]
    assert len(notices) == 2 and "'house-model' is not in the model table" in notices[0], notices
    assert "window" not in notices[1] and "assuming no prices (set --input-price/--output-price," in notices[1]


def test_a_model_server_that_looks_like_ollama_gets_a_warning_about_its_window(sample_repo, tmp_path, monkeypatch):
    from pid.models import silent_truncation_warning
    from tests.memory_sandbox import MemoryProvider
    from tests.scripted_llm import ScriptedLLM
    from pid.jobs.spec import JobSpec
    from pid.worker.runner import run_job
    info = model_info("qwen3-coder:30b")
    assert info.known   # the tag finds the model's native window, which Ollama does not give it by default
    for url in ("http://127.0.0.1:11434/v1", "http://ollama:8080/v1", "https://my-ollama.internal/v1"):
        warning = silent_truncation_warning(info, url)
        assert warning and "--context-window" in warning and f"{info.context_window:,}" in warning
    for url in ("https://api.openai.com/v1", "http://127.0.0.1:8000/v1", "http://[::1]:99999/v1", None):
        assert silent_truncation_warning(info, url) is None
    events: list = []
    with ScriptedLLM([{"text": "done"}, {"text": "done"}]) as llm:
        monkeypatch.setattr("pid.models.OLLAMA_PORT", llm.port)
        for window in (None, 8192):
            run_job(JobSpec(task="go", repo=str(sample_repo), model="qwen3-coder:30b", out_dir=str(tmp_path / "out"),
                            base_url=llm.base_url, context_window=window), sandboxes=MemoryProvider({}),
                    sink=events.append)
    notices = [e.text for e in events if isinstance(e, ev.Notice)]
    assert len(notices) == 1 and "looks like Ollama" in notices[0]   # not once the window is given


def test_cache_prices_nobody_gave_are_the_input_price():
    """OpenAI reports cached input apart from the rest: priced at 0, --max-cost would under-count it."""
    info = model_info("some-unknown-model", {"input_price": 2.0, "output_price": 8.0})
    assert (info.cache_read_price, info.cache_write_price) == (2.0, 2.0)
    info = model_info("some-unknown-model", {"input_price": 2.0, "cache_read_price": 0.5})
    assert (info.cache_read_price, info.cache_write_price) == (0.5, 2.0)
    assert model_info("some-unknown-model").cache_read_price == 0.0
