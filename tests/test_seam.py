"""The sandbox seam holds: pid/ needs no Docker, the Docker sandbox and the in-memory one fit the same Protocols, and
a whole job runs through the runner on the in-memory provider (no DockerSandbox anywhere in the runner's path)."""
from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pid import events as ev
from pid.sandbox_api import Sandbox, SandboxLost
from pid.sandbox_lifecycle import JobSandbox, SandboxProvider
from pid.sandbox import DockerProvider, DockerSandbox
from tests.memory_sandbox import MemoryProvider, MemorySandbox, Run
from tests.scripted_llm import ScriptedLLM
from pid.jobs.spec import JobSpec
from pid.worker.runner import run_job

ROOT = Path(__file__).resolve().parent.parent


def protocol_methods(protocol: type) -> list[str]:
    return sorted(name for name, value in vars(protocol).items() if inspect.isfunction(value)
                  and not name.startswith("_"))


@pytest.mark.parametrize("implementation", [DockerSandbox, MemorySandbox])
def test_sandboxes_take_what_the_protocols_give(implementation):
    """Same parameter names, kinds and defaults as the Protocols, so a caller written against them works on both."""
    methods = {name: getattr(proto, name) for proto in (Sandbox, JobSandbox) for name in protocol_methods(proto)}
    assert set(methods) >= {"exec", "read_file", "write_file", "import_workspace", "export_patch", "export_files",
                            "is_alive", "kill", "close"}
    for name, declared in methods.items():
        expected = [(p.name, p.kind, p.default) for p in inspect.signature(declared).parameters.values()]
        params = inspect.signature(getattr(implementation, name)).parameters.values()
        actual = [(p.name, p.kind, p.default) for p in params]
        assert actual == expected, name


@pytest.mark.parametrize("implementation", [DockerProvider, MemoryProvider])
def test_providers_take_what_the_protocol_gives(implementation):
    for name in protocol_methods(SandboxProvider):
        expected = [p.name for p in inspect.signature(getattr(SandboxProvider, name)).parameters.values()]
        assert [p.name for p in inspect.signature(getattr(implementation, name)).parameters.values()] == expected


def test_the_agent_core_imports_no_docker():
    code = ("import sys, pid.agent, pid.tools, pid.prompt, pid.sandbox_lifecycle; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'docker' or m.split('.')[:2] in "
            "(['pid', 'sandbox'], ['pid', 'worker'])))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_runner_does_not_know_dockersandbox():
    import pid.worker.runner
    assert "DockerSandbox" not in vars(pid.worker.runner)


def docker_imports(source: str) -> list[str]:
    """Every import of docker in the module, wherever it stands (top level, in a function, under an `if`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module or ''}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [name for name in names if "docker" in name.split(".")]
    return found


def test_the_runner_and_its_phases_import_no_docker():
    """The job's phases see only SandboxError: the Docker sandbox translates its engine's exceptions itself."""
    for path in [ROOT / "worker" / "runner.py", *(ROOT / "worker").glob("job_*.py")]:
        assert docker_imports(path.read_text()) == [], path


def test_an_import_of_docker_inside_a_function_is_found():
    source = "import json\ndef f():\n    if True:\n        import docker.errors\n    from docker import errors\n"
    assert docker_imports(source) == ["docker.errors", "docker.errors"]
    assert docker_imports("from .sandbox import docker_sandbox\nfrom pid.sandbox import docker_client\n") == []


class RefusingEngine:
    """A Docker client whose engine answers the ping and refuses everything else (as a busy or broken one does)."""

    def ping(self) -> bool:
        return True

    @property
    def api(self) -> "RefusingEngine":
        return self

    def containers(self, **_: object) -> list:
        import docker.errors
        raise docker.errors.APIError("500 Server Error: the engine is busy")


def test_the_docker_provider_raises_sandbox_errors_only():
    """An engine's refusal reaches the runner as a SandboxError (so a sandbox_error ending), in the engine's words."""
    from pid.sandbox_api import SandboxError
    with pytest.raises(SandboxError, match="the engine is busy") as raised:
        DockerProvider(RefusingEngine()).clear_job("job-1")   # type: ignore[arg-type]
    assert type(raised.value.__cause__).__module__ == "docker.errors"


def spec_for(repo: Path, out: Path, llm: ScriptedLLM, **extra) -> JobSpec:
    return JobSpec(task="greet", repo=str(repo), model="m", out_dir=str(out), base_url=llm.base_url, **extra)


def test_a_job_runs_through_the_runner_on_the_memory_provider(sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "write", "arguments": {"path": "hello.py", "content": 'print("hi, pid")\n'}},
                              {"name": "bash", "arguments": {"command": "python3 hello.py"}}]},
              {"text": "done"}]
    provider = MemoryProvider({"python3 hello.py": Run("hi, pid\n")})
    with ScriptedLLM(script) as llm:
        spec = spec_for(sample_repo, tmp_path / "out", llm, files=["hello.py", "missing.txt"])
        result = run_job(spec, sandboxes=provider)
        system = llm.requests[0]["messages"][0]["content"]
        tool_results = [m["content"] for m in llm.requests[1]["messages"] if m["role"] == "tool"]
    assert (result["status"], result["exit_reason"], result["final_message"]) == ("completed", "stop", "done"), result
    assert "MARKER-AGENTS-7f3a" in str(system)   # the prompt read AGENTS.md inside the sandbox
    assert tool_results[1].strip() == "hi, pid"
    job_dir = Path(spec.job_dir)
    patch = (job_dir / "patch.diff").read_text()
    assert '+print("hi, pid")' in patch and "uncommitted" not in patch   # the base includes uncommitted work
    assert json.loads((job_dir / "result.json").read_text())["status"] == "completed"
    assert (job_dir / "files" / "workspace" / "hello.py").read_text() == 'print("hi, pid")\n'
    assert result["artifacts"]["refused"] == [{"path": "missing.txt", "reason": "not found", "artifact": "files"}]
    [box] = provider.created
    assert provider.cleared == [] and box.closed and not box.removed_by_pid   # a first attempt has nothing to clear


def test_a_later_attempt_clears_what_an_earlier_one_left(sample_repo, tmp_path):
    provider = MemoryProvider({})
    with ScriptedLLM([{"text": "done"}]) as llm:
        spec = spec_for(sample_repo, tmp_path / "out", llm)
        result = run_job(spec, sandboxes=provider, attempt=2)
    assert result["exit_reason"] == "stop" and provider.cleared == [spec.id]


def test_a_jobs_later_attempt_has_what_its_earlier_ones_left_of_its_max_cost(sample_repo, tmp_path):
    """The worker passes the store record's earlier attempts: what they spent counts against the job's max_cost."""
    provider = MemoryProvider({"true": Run("")})
    usage = {"prompt_tokens": 1_000_000, "completion_tokens": 0}
    with ScriptedLLM([{"tool_calls": [{"name": "bash", "arguments": {"command": "true"}}], "usage": usage}] * 5) as llm:
        spec = spec_for(sample_repo, tmp_path / "out", llm, max_cost=1.5, input_price=1.0, output_price=1.0)
        result = run_job(spec, sandboxes=provider, attempt=2,
                         earlier=[{"attempt": 1, "turns": 2, "tool_calls": 2, "usage": {"cost": 1.0}}])
        assert len(llm.requests) == 1
    assert (result["exit_reason"], result["error"]) == (
        "max_cost", "cost $2.0000 exceeded --max-cost $1.5000 over its attempts"), result


def test_a_sandbox_lost_mid_job_fails_it_as_a_sandbox_error(sample_repo, tmp_path):
    def lose(command: str, box: MemorySandbox) -> Run:
        box.kill()   # as the watchdog would, or the engine
        raise SandboxLost("the sandbox container is gone")

    provider = MemoryProvider({"make": lose})
    events: list[str] = []
    with ScriptedLLM([{"tool_calls": [{"name": "bash", "arguments": {"command": "make"}}]}, {"text": "never"}]) as llm:
        result = run_job(spec_for(sample_repo, tmp_path / "out", llm), sandboxes=provider,
                         sink=lambda e: events.append(e.type))
        assert len(llm.requests) == 1
    assert (result["status"], result["exit_reason"]) == ("failed", "sandbox_error")
    assert "gone" in result["error"] and "patch" not in result["artifacts"]   # nothing to collect from a removed box
    assert events[-1] == "agent_end" and provider.created[0].closed


def test_the_loop_streams_tool_output_as_updates(sample_repo, tmp_path):
    provider = MemoryProvider({"build": Run("step 1\n", 0.05, "step 2\n")})
    updates: list[str] = []

    def sink(event) -> None:
        if isinstance(event, ev.ToolUpdate):
            updates.append(event.partial)

    with ScriptedLLM([{"tool_calls": [{"name": "bash", "arguments": {"command": "build"}}]}, {"text": "ok"}]) as llm:
        result = run_job(spec_for(sample_repo, tmp_path / "out", llm), sandboxes=provider, sink=sink)
    assert result["status"] == "completed"
    assert "".join(updates) == "step 1\nstep 2\n"


def test_a_job_whose_directory_cannot_be_made_fails_with_its_reason(sample_repo, tmp_path):
    blocker = tmp_path / "out"
    blocker.write_text("a file where the artifacts' directory should be")
    provider = MemoryProvider({})
    with ScriptedLLM([{"text": "never asked"}]) as llm:
        result = run_job(spec_for(sample_repo, blocker, llm), sandboxes=provider)
        assert llm.requests == []
    assert (result["status"], result["exit_reason"]) == ("failed", "error")
    assert result["error"].startswith(f"cannot create the job's directory {blocker}/")
    assert provider.created == []


def test_an_interrupted_job_is_collected_and_recorded_before_the_interrupt_goes_on(sample_repo, tmp_path):
    """Ctrl-C during the agent's run: the job still gets its patch, its result.json (interrupted) and its sandbox's
    removal; then the KeyboardInterrupt reaches the caller."""
    def interrupt(agent) -> None:
        raise KeyboardInterrupt

    provider = MemoryProvider({})
    with ScriptedLLM([{"text": "never"}]) as llm:
        spec = spec_for(sample_repo, tmp_path / "out", llm)
        with pytest.raises(KeyboardInterrupt):
            run_job(spec, sandboxes=provider, on_agent=interrupt)
    result = json.loads((Path(spec.job_dir) / "result.json").read_text())
    assert (result["exit_reason"], result["error"]) == ("interrupted", "interrupted"), result
    assert result["artifacts"]["patch"] == "patch.diff" and result["artifacts"]["session"] == "session.jsonl"
    [box] = provider.created
    assert box.closed
