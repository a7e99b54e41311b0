"""Shared fixtures: a private PID_HOME, a sample repository, the real `pid` CLI as a subprocess, a real worker.

Everything is real: the Docker engine, the Celery worker on the embedded broker, and an HTTP LLM server.

Tiers: tests marked `docker` need an engine (they are skipped, with one reason, when none answers; in CI they fail:
tests/services.py); `cli` tests run the `pid` command, or a worker, as a subprocess; the rest run anywhere, fast
(`pytest -m "not docker and not cli and not llama"`), with the in-memory sandbox (tests/memory_sandbox.py), and never
reach an engine: theirs is made unreachable (a test of that tier that needs one fails, rather than passing only here).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from pid.sandbox.reaper import TEST_RUN_ENV
from tests.services import missing

ROOT = Path(__file__).resolve().parent.parent
IMAGE = os.environ.get("PID_TEST_IMAGE", "pid-sandbox:latest")

# In-process sandboxes (tool and sandbox tests) keep their job disks, and take their owner label, from a home of
# this run's own: nothing is shared with a real installation on the machine.
os.environ["PID_HOME"] = HOME = tempfile.mkdtemp(prefix="pid-test-home-")
# Every container this run makes, here or in the pid processes it starts, carries this id: the leak check at the end
# counts and removes only those (the engine is shared with other runs and real workers).
RUN_ID = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
os.environ[TEST_RUN_ENV] = RUN_ID

# A terminal's size is for a test to give (COLUMNS in the environment it passes): none leaks in from the runner's.
# pytest-xdist's workers export COLUMNS=80 and LINES=24, which cut the tables of the `pid` processes a test starts
# where a serial run leaves them whole.
for _size in ("COLUMNS", "LINES"):
    os.environ.pop(_size, None)

_engine_problem: list[str | None] = []   # filled on first need: None when an engine answers, else why not


def docker_unavailable() -> str | None:
    """Why Docker tests cannot run here, or None; asked of the engine once per session."""
    if not _engine_problem:
        try:
            import docker
            client = docker.from_env(timeout=10)
            try:
                client.ping()
            finally:
                client.close()
            _engine_problem.append(None)
        except Exception as exc:  # noqa: BLE001 - DockerException, or the connection's own errors
            _engine_problem.append(f"no Docker engine reachable ({type(exc).__name__}: {str(exc)[:200]})")
    return _engine_problem[0]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A `docker` test is skipped (failed, in CI), before its fixtures start anything, when no engine answers."""
    if item.get_closest_marker("docker") is not None:
        reason = docker_unavailable()
        if reason:
            missing(reason)


def own_build(dockerfile: str) -> str:
    """`dockerfile` made a build of this run's own (a LABEL after its FROM): the same file built at once by another run
    on the engine (CI runs the task-image tests under runc and gVisor side by side) shares the engine's cached image,
    and that run's `docker rmi` removed it under this build's tag."""
    first, _, rest = dockerfile.partition("\n")
    return f"{first}\nLABEL pid-tests.build={RUN_ID.lower()}\n{rest}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `long` (20 s or more) run first. pytest-xdist hands out tests in this order: a long one left to
    the end of a parallel tier ran on alone while the other workers had nothing left (the 100-job batches, one
    after the other, are 90 s)."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)   # (stable: otherwise as collected)


NO_ENGINE = "unix:///nonexistent/pid-fast-tier-has-no-engine.sock"


@pytest.fixture(autouse=True)
def _fast_tier_has_no_engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test of the fast tier (none of the docker, cli, llama marks) sees no engine, whatever the machine has: the
    tier's promise to run without one is then checked on every run, not only where Docker is absent."""
    if not any(request.node.get_closest_marker(m) for m in ("docker", "cli", "llama")):
        monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)


# PID_TEST_RUNTIME=runsc runs the tool tests under gVisor (docker/setup.sh --test does, where runsc is registered);
# gVisor's own threads count against the pids limit, hence the larger one there.
RUNTIME = os.environ.get("PID_TEST_RUNTIME") or None


# What a slot shell waiting for its command has in its command line (sandbox/channel.sh's SLOT_SHELL); so do pid's
# drop, which starts them as root, and its zygote, which forks them (its arguments end in zygote.so, its parent is
# the drop: sandbox/drop.c).
WAITING_SHELL_MARK = "read -r -u 3 n f"


def signal_waiting_shells(signal_name: str) -> str:
    """A command (for the agent to run) that sends a signal to every slot shell waiting for a command (the ones in
    pid's exec channels: sandbox/channel.sh's SLOT_SHELL) but its own, then prints "signalled <how many>"."""
    return ("sleep 0.3; n=0; for p in /proc/[0-9]*; do [ \"${p#/proc/}\" = $$ ] && continue; "
            "c=$(tr '\\0' ' ' 2>/dev/null <$p/cmdline); q=$(cut -d' ' -f4 $p/stat 2>/dev/null); "
            f"case $c in /.pid/drop*) ;; *'{WAITING_SHELL_MARK}'*) case $c$(tr '\\0' ' ' 2>/dev/null <"
            f"/proc/$q/cmdline) in *zygote.so*/.pid/drop*) ;; *) kill -{signal_name} ${{p#/proc/}} && n=$((n + 1)) "
            ";; esac ;; esac; done; echo signalled $n")


def ctrl_c_default() -> None:
    """preexec_fn of a process a test sends Ctrl-C: SIGINT has its default meaning there even when this run ignores
    it (a run started in the background by a non-interactive shell: its children inherit SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signalled(tail: bytes) -> int:
    """How many shells signal_waiting_shells' command reached (it must reach some, or the test proves nothing)."""
    words = tail.split()
    assert len(words) == 2 and words[0] == b"signalled", tail
    return int(words[1])


def failing_starts(real_start, calls: list, times: int, status: int, on_failure=lambda: None):
    """An engine client's `api.start` that the engine fails `times` times first (`status`; containerd's shim timing
    out on a loaded host was a 5xx), then the real one; each call's container goes into `calls`, and `on_failure()`
    runs before each failure (what the engine would undo)."""
    import docker.errors
    import requests

    def start(container, *args, **kwargs):
        calls.append(container)
        if len(calls) <= times:
            on_failure()
            response = requests.Response()
            response.status_code = status
            raise docker.errors.APIError(f"{status} Server Error", response=response,
                                         explanation="failed to create shim task: context deadline exceeded")
        return real_start(container, *args, **kwargs)
    return start


from tests.tool_sandbox import docker_sandbox, sandbox  # noqa: E402,F401 - the tool tests' fixtures, for every module
from tests.brokers import rabbitmq_server, redis_server  # noqa: E402,F401 - private brokers (tests/test_brokers.py)


@pytest.fixture(scope="module")
def tools_container():
    """The real container behind tool_sandbox's `sandbox` and `docker_sandbox` fixtures (which mark their tests
    `docker`): one per test module."""
    from pid.sandbox import DockerSandbox, SandboxConfig
    box = DockerSandbox.create(SandboxConfig(job_id="test-tools", runtime=RUNTIME))
    try:
        yield box
    finally:
        box.close()


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    def json(self) -> dict:
        return json.loads(self.stdout)


@pytest.fixture
def deep_tmp(tmp_path: Path):
    """A directory in tmp_path for trees deeper than pytest's own clean-up can remove (tests/deep_tree.py): removed
    by pid's own loop after the test."""
    from pid.jobs.trees import remove_tree
    path = tmp_path / "deep"
    path.mkdir()
    yield path
    remove_tree(str(path))
    assert not path.exists(), "a deep tree was left behind"


@pytest.fixture
def pid_env(tmp_path: Path) -> dict[str, str]:
    """Environment for pid subprocesses: a fresh home, no key or model leaking in from the machine."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PID_", "OPENAI_", "ANTHROPIC_"))}
    env.update(PID_HOME=str(tmp_path / "home"), PID_IMAGE=IMAGE, PYTHONPATH=str(ROOT),
               PYTHONUNBUFFERED="1", **{TEST_RUN_ENV: RUN_ID})
    return env


@pytest.fixture
def run_pid(pid_env: dict[str, str], tmp_path: Path):
    """Run the real CLI: `run_pid("run", "task", "--repo", ...)`."""
    def run(*args: str, timeout: float = 240, env: dict[str, str] | None = None) -> CliResult:
        proc = subprocess.run([sys.executable, "-m", "pid.cli.main", *args], cwd=tmp_path, env=env or pid_env,
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        return CliResult(proc.returncode, proc.stdout, proc.stderr)
    return run


@pytest.fixture
def sample_repo(tmp_path: Path) -> Path:
    """A small git repository with an uncommitted change (the base must include it)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "hello.py").write_text('print("hello")\n')
    (repo / "README.md").write_text("# sample\n")
    (repo / "AGENTS.md").write_text("Always greet politely. MARKER-AGENTS-7f3a\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    (repo / "README.md").write_text("# sample\nuncommitted line\n")
    return repo


def start_worker(env: dict[str, str], cwd: Path, log_path: Path, concurrency: int = 1,
                 events: bool = False) -> subprocess.Popen:
    """A real `pid worker` process (in its own process group) on the embedded (filesystem) broker, or on the one
    env's PID_BROKER_URL names."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pid.cli.main", "worker", "--concurrency", str(concurrency),
                                 *(["--events"] if events else [])],
                                cwd=cwd,
                                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    return wait_ready(proc, log_path)


def wait_ready(proc: subprocess.Popen, log_path: Path, timeout: float = 60) -> subprocess.Popen:
    """A worker just started: wait for its ready line; if it dies or takes too long, its log is the error."""
    deadline = time.time() + timeout
    while "ready" not in log_path.read_text():
        if proc.poll() is not None or time.time() > deadline:
            stop_worker(proc)
            raise RuntimeError("worker did not start:\n" + log_path.read_text())
        time.sleep(0.2)
    return proc


def stop_worker(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


@pytest.fixture
def worker(pid_env: dict[str, str], tmp_path: Path):
    proc = start_worker(pid_env, tmp_path, tmp_path / "worker.log")
    yield proc
    stop_worker(proc)


def open_descriptors(prefix: str) -> list[str]:
    """What this process's open descriptors point to, those starting with `prefix` ("socket:", a path)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:   # (the listing's own descriptor, closed by now)
            continue
        if target.startswith(prefix):
            found.append(target)
    return found


def pid_containers() -> list:
    """pid's containers that this run made (its run id: not another xdist worker's, nor another run's on the same
    engine, which may run the same test, with the same job ids, at the same time); one that vanishes meanwhile is
    left out."""
    import docker

    from pid.sandbox.reaper import LABEL_TEST_RUN
    return docker.from_env().containers.list(all=True, filters={"label": ["pid.job", f"{LABEL_TEST_RUN}={RUN_ID}"]},
                                             ignore_removed=True)


_leaked_on_workers: list[str] = []   # pytest-xdist: what each worker's own leak check found (the controller's list)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist, in the controller: a worker is done; its leak check's finding (each worker is a run of its own,
    with its own RUN_ID) fails the whole run, as the worker's exit status alone would not reach it."""
    leaked = getattr(node, "workeroutput", {}).get("pid_leaked")
    if leaked:
        _leaked_on_workers.append(leaked)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After the suite no container of this run may remain; those that do are removed and fail the run. Containers
    of other runs (another pytest-xdist worker is one) and of real workers on the same engine are never counted nor
    touched."""
    leaked = _leak_check()
    workeroutput = getattr(session.config, "workeroutput", None)   # set in a pytest-xdist worker only
    if leaked and workeroutput is not None:
        workeroutput["pid_leaked"] = leaked
    if _leaked_on_workers:
        print(f"\nLEAKED CONTAINERS after the test suite (pytest-xdist workers): {'; '.join(_leaked_on_workers)}",
              file=sys.stderr)
    if leaked or _leaked_on_workers:
        session.exitstatus = 1
    _remove_home()


def _remove_home() -> None:
    """This run's PID_HOME goes once its containers have: a job disk a killed pid process left mounted there is
    reaped first (as a worker's sweep would), then the directory is removed."""
    from pid.sandbox.disk import reap_disks
    reap_disks(os.path.join(HOME, "disks"))
    shutil.rmtree(HOME, ignore_errors=True)


def _leak_check() -> str:
    """This run's containers left behind, removed, and described ("" when none, or when there is no engine)."""
    if _engine_problem and _engine_problem[0] is not None:
        return ""   # no engine: nothing can have been made
    try:
        import docker
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception:
        return ""
    from tests.leaks import describe, find_leaks, remove_leaks
    try:
        leaked = find_leaks(client, RUN_ID)
        if not leaked:
            return ""
        print(f"\nLEAKED CONTAINERS after the test suite: {describe(leaked)}", file=sys.stderr)
        remove_leaks(client, leaked)
        return describe(leaked)
    finally:
        client.close()
