"""The CLI's promises to its user, through the real `pid` command: options come from the job spec's defaults, bad
values are one line and exit 2 before anything starts, messages say what happened, Ctrl-C is exit 130."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import pytest

from tests.conftest import CliResult, pid_containers
from tests.scripted_llm import ScriptedLLM
from tests.stderr_lines import StderrLines
from pid.jobs.spec import JobSpec, default_of
from pid.jobs.sqlite_store import JobStore

pytestmark = pytest.mark.cli

LOCAL = "http://127.0.0.1:9/v1"   # an endpoint of one's own: no key needed, nothing answers


def job_args(repo: Path, out: Path, *extra: str) -> list[str]:
    return ["t", "--repo", str(repo), "--model", "m", "--base-url", LOCAL, "--out", str(out), *extra]


def assert_one_error(res: CliResult, *needles: str) -> str:
    assert res.code == 2, (res.code, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pid: error: "), res.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def stored_spec(env: dict[str, str], job_id: str) -> JobSpec:
    record = JobStore(os.path.join(env["PID_HOME"], "jobs.db")).get(job_id)
    assert record is not None
    return record.spec


# `--wait`'s notice that no worker took the job comes after this long here (10 s by default), longer than a worker's
# heartbeat (2 s): the notice counts the jobs a busy worker runs from its heartbeats
NOTICE_S = "4"


def start_pid(env: dict[str, str], cwd: Path, *args: str) -> subprocess.Popen:
    """`pid` in the background, with Ctrl-C's default meaning even if this test runs with SIGINT ignored."""
    return subprocess.Popen([sys.executable, "-m", "pid.cli.main", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_until(predicate, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# -- A. one source for every default ---------------------------------------------------------------------------

@pytest.mark.docker   # runs a job, or submits one (the embedded queue checks the image)
def test_a_job_with_no_options_gets_exactly_the_job_specs_defaults(run_pid, pid_env, sample_repo, tmp_path):
    env = {k: v for k, v in pid_env.items() if k != "PID_IMAGE"}
    res = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", LOCAL, env=env)
    assert res.code == 0, res.stderr
    spec = stored_spec(env, res.stdout.strip())
    given = {"task", "repo", "model", "base_url", "out_dir", "id", "workspace"}
    for f in fields(JobSpec):
        if f.name not in given:
            assert getattr(spec, f.name) == default_of(f.name), f.name
    assert spec.out_dir == str(tmp_path / default_of("out_dir"))
    assert spec.workspace.startswith("sha256:")   # the repository, packed at submit


@pytest.mark.parametrize("command", ["run", "submit"])
def test_help_shows_the_job_specs_defaults_and_help(run_pid, command):
    text = " ".join(run_pid(command, "--help").stdout.split())
    assert f"[default: {default_of('timeout_s'):g}]" in text
    assert f"[default: {default_of('memory')}]" in text and "[default: 10g]" in text   # disk, in bytes in the spec
    assert f"[default: {default_of('pids_limit')}]" in text and "[default: none]" in text
    assert " ".join(JobSpec.__dataclass_fields__["timeout_s"].metadata["help"].split()) in text
    assert "env var: PID_API_KEY, OPENAI_API_KEY" in text


@pytest.mark.docker   # runs a job, or submits one (the embedded queue checks the image)
def test_the_api_option_takes_short_and_wire_names(run_pid, pid_env, sample_repo, tmp_path):
    short = run_pid("submit", *job_args(sample_repo, tmp_path / "out", "--api", "anthropic"))
    wire = run_pid("submit", *job_args(sample_repo, tmp_path / "out"), env={**pid_env, "PID_API": "anthropic-messages"})
    assert short.code == 0 and wire.code == 0, short.stderr + wire.stderr
    assert stored_spec(pid_env, short.stdout.strip()).api == stored_spec(pid_env, wire.stdout.strip()).api \
        == "anthropic-messages"


# -- B. bad values: one line, exit 2, before anything starts ---------------------------------------------------

BAD_VALUES = [
    ("--timeout", "inf", "not a finite number"),
    ("--timeout", "nan", "not a finite number"),
    ("--timeout", "1e12", "out of range (1 to 604,800)"),
    ("--timeout", "0.5", "out of range"),
    ("--memory", "lots", "invalid size 'lots'"),
    ("--memory", "1k", "minimum"),
    ("--network", "host", "host's own network"),
    ("--network", "nowhere", "choose none or bridge"),
    ("--base-url", "ftp://example.com/v1", "not an http(s) URL"),
    ("--base-url", "localhost:8000", "not an http(s) URL"),
    ("--base-url", "http://x.example/v1\x1b[2J", "not an http(s) URL"),   # (its escape would reach a terminal)
    ("--base-url", "http://[::1/v1", "not an http(s) URL"),                 # (an unclosed IPv6 bracket)
    ("--image", "Not/A Valid:image!", "not a valid image reference"),
    ("--api", "nope", "not one of openai, anthropic"),
    ("--tools", "read,nope", "unknown tool(s) nope; choose from read, bash, edit, write"),
    ("--cpus", "nan", "not a finite number"),
    ("--input-price", "-1", "out of range"),
    ("--max-turns", "2.5", "not a whole number"),
    ("--user", "alice", "UID:GID"),
    ("--disk", "lots", "invalid size"),
    ("--thinking", "max", "not one of off, low, medium, high"),
    ("--max-retry-wait", "0", "out of range (1 to 3,600)"),
    ("--retry-budget", "-5", "out of range"),
    ("--cache-read-price", "-1", "out of range"),
]


@pytest.mark.parametrize("command", ["run", "submit"])
@pytest.mark.parametrize("option, value, needle", BAD_VALUES, ids=[f"{o}={v}" for o, v, _ in BAD_VALUES])
def test_bad_values_are_one_line_and_exit_2(run_pid, pid_env, sample_repo, tmp_path, command, option, value, needle):
    res = run_pid(command, *job_args(sample_repo, tmp_path / "out", option, value))
    assert_one_error(res, option, needle)
    assert not (tmp_path / "out").exists()
    assert not (Path(pid_env["PID_HOME"]) / "jobs.db").exists() or not JobStore(
        os.path.join(pid_env["PID_HOME"], "jobs.db")).list()


def test_a_bad_value_from_the_environment_names_the_variable(run_pid, pid_env, sample_repo, tmp_path):
    res = run_pid("run", *job_args(sample_repo, tmp_path / "out"), env={**pid_env, "PID_IMAGE": "No Such!"})
    assert_one_error(res, "--image", "$PID_IMAGE", "not a valid image reference")
    assert "cannot reach the Docker engine" not in res.stderr


@pytest.mark.parametrize("variable, value, command", [
    ("PID_NO_WORKER_NOTICE_S", "abc", ["list"]), ("PID_LEASE_S", "abc", ["worker"]),
    ("PID_SWEEP_S", "soon", ["worker"]), ("PID_MAX_ATTEMPTS", "0", ["worker"]), ("PID_LEASE_S", "-1", ["list"])])
def test_a_pid_variable_it_cannot_be_is_one_line_before_any_command_starts(run_pid, pid_env, variable, value,
                                                                            command):
    """A traceback from `pid list` (read as its module loaded), a worker that took jobs without its heartbeat or
    sweeps (a new user's test): now one line, exit 2, and no worker started."""
    res = run_pid(*command, env={**pid_env, variable: value}, timeout=60)
    assert_one_error(res, f"${variable}: {value!r} is not a ")
    assert "ready" not in res.stdout + res.stderr
    helped = run_pid(*command, "--help", env={**pid_env, variable: value}, timeout=60)   # (checked after parsing)
    assert helped.code == 0 and "Usage: pid" in helped.stdout, helped.stderr


def test_a_pool_given_wins_over_a_bad_pid_pool_which_no_other_command_reads(run_pid, pid_env):
    env = {**pid_env, "PID_POOL": "many"}
    assert run_pid("list", env=env).code == 0
    res = run_pid("worker", "--pool", "70", env=env, timeout=60)   # (refused for its own value: --pool was read)
    assert_one_error(res, "--pool", "'70'")


@pytest.mark.docker
def test_a_warm_pool_of_an_image_the_engine_lacks_is_refused(run_pid):
    """It was announced ("a warm pool of 2 for foo:latest") and never filled (a new user's test)."""
    res = run_pid("worker", "--pool", "1,pid-no-such-image-here=2", timeout=60)
    assert_one_error(res, "--pool pid-no-such-image-here:latest=2: sandbox image 'pid-no-such-image-here:latest' not "
                          "found")


def test_usage_errors_are_one_line(run_pid, sample_repo):
    assert_one_error(run_pid("run"), "Missing argument")
    assert_one_error(run_pid("run", "t"), "no workspace: pass --repo DIR|URL, or --workdir PATH")


@pytest.mark.docker   # runs a job, or submits one (the embedded queue checks the image)
def test_a_network_other_than_none_is_allowed_with_a_warning(run_pid, pid_env, sample_repo, tmp_path):
    res = run_pid("submit", *job_args(sample_repo, tmp_path / "out", "--network", "bridge"))
    assert res.code == 0, res.stderr
    assert "pid: warning: --network bridge: the sandbox can reach the network and is reachable from it" in res.stderr
    assert stored_spec(pid_env, res.stdout.strip()).network == "bridge"
    quiet = run_pid("submit", *job_args(sample_repo, tmp_path / "out"))
    assert quiet.code == 0 and "warning" not in quiet.stderr


@pytest.mark.parametrize("command", ["steer", "follow-up"])
def test_empty_messages_are_refused(run_pid, sample_repo, tmp_path, command):
    job_id = run_pid("submit", *job_args(sample_repo, tmp_path / "out")).stdout.strip()
    for empty in ("", "  \n"):
        assert_one_error(run_pid(command, job_id, empty), "message is empty")
    sent = run_pid(command, job_id, "look at the README")
    assert sent.code == 0 and sent.stdout.strip() == f"{job_id}: {command} queued"


# -- C. no traceback: unusable --out and PID_HOME ---------------------------------------------------------------

@pytest.mark.parametrize("command", ["run", "submit"])
def test_an_unusable_out_is_one_line_before_anything_runs(run_pid, pid_env, sample_repo, tmp_path, command):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = [(tmp_path / "missing" / "out", "its parent directory"), (a_file, "not a directory"),
             (a_file / "out", "does not exist"),
             (Path("/proc/pid-test-out"), "cannot write in /proc (it takes no new files)")]
    for out, needle in cases:
        assert_one_error(run_pid(command, *job_args(sample_repo, out)), f"--out {out}", needle)
    assert not (Path(pid_env["PID_HOME"]) / "jobs.db").exists() or not JobStore(
        os.path.join(pid_env["PID_HOME"], "jobs.db")).list()


def test_an_unusable_pid_home_is_one_line_for_every_command(run_pid, pid_env, sample_repo, tmp_path):
    (tmp_path / "a-file").write_text("x")
    for home in (tmp_path / "a-file" / "home", Path("/proc/pid-test-home")):
        env = {**pid_env, "PID_HOME": str(home)}
        for args in (["list"], ["status", "x"], ["result", "x"], ["cancel", "x"], ["steer", "x", "m"], ["reap"],
                     ["run", *job_args(sample_repo, tmp_path / "out")],
                     ["submit", *job_args(sample_repo, tmp_path / "out")]):
            assert_one_error(run_pid(*args, env=env), f"PID_HOME {home} is not a writable directory")
        assert run_pid("run", "--help", env=env).code == 0   # help needs no state


# -- D. messages say what happened -----------------------------------------------------------------------------

@pytest.mark.docker   # runs a job, or submits one (the embedded queue checks the image)
def test_the_timeout_message_names_the_jobs_timeout(run_pid, sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60"}}]}]
    with ScriptedLLM(script) as llm:
        res = run_pid("run", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url,
                      "--out", str(tmp_path / "out"), "--timeout", "5", "--json")
    assert res.code == 3, res.stderr
    assert res.json()["error"] == "wall-clock limit of 5s (--timeout) reached"


@pytest.mark.docker   # runs a job, or submits one (the embedded queue checks the image)
def test_result_of_an_unfinished_job_is_exit_5_and_cancel_of_a_finished_one_exit_2(run_pid, sample_repo, tmp_path):
    job_id = run_pid("submit", *job_args(sample_repo, tmp_path / "out")).stdout.strip()
    early = run_pid("result", job_id)
    assert early.code == 5
    assert early.stderr.strip() == f"pid: job {job_id} is queued: no result yet (--wait waits for it)"
    as_json = run_pid("result", job_id, "--json")   # (JSON on stdout, for a reader such as jq)
    assert as_json.code == 5 and as_json.json() == {"id": job_id, "status": "queued", "ended": False}
    assert run_pid("cancel", job_id).stdout.strip() == f"{job_id}: cancelled"
    assert run_pid("result", job_id).code == 1
    assert_one_error(run_pid("cancel", job_id), f"job {job_id} has ended (cancelled): nothing to cancel")
    assert_one_error(run_pid("pause", job_id), f"job {job_id} is cancelled: nothing to pause")
    assert_one_error(run_pid("steer", job_id, "hi"), "takes no more messages")


@pytest.mark.docker   # runs a job, or submits one (the embedded queue checks the image)
def test_waiting_with_no_worker_says_so_and_ctrl_c_is_130(pid_env, run_pid, sample_repo, tmp_path):
    pid_env = {**pid_env, "PID_NO_WORKER_NOTICE_S": NOTICE_S}
    waiting = start_pid(pid_env, tmp_path, "submit", "--wait", *job_args(sample_repo, tmp_path / "out"))
    result_wait = following = None
    try:
        wait_until(lambda: (tmp_path / "out").exists() or JobStore(
            os.path.join(pid_env["PID_HOME"], "jobs.db")).list(), what="the job to be queued")
        job_id = JobStore(os.path.join(pid_env["PID_HOME"], "jobs.db")).list()[0].id
        result_wait = start_pid(pid_env, tmp_path, "result", job_id, "--wait", "--json")
        following = start_pid(pid_env, tmp_path, "logs", "-f", job_id)
        notice = f"job {job_id} is still queued after {NOTICE_S}s: no worker is consuming queue 'pid'"
        errs = [StderrLines(proc) for proc in (waiting, result_wait, following)]
        for err in errs:
            err.wait_for(notice)
        # SIGTERM (a CI step's timeout) is Ctrl-C too: it ended `submit --wait` without a word (a new user's)
        for proc, stop in ((waiting, signal.SIGTERM), (result_wait, signal.SIGINT), (following, signal.SIGINT)):
            proc.send_signal(stop)
        for proc in (waiting, result_wait, following):
            proc.wait(timeout=30)
        outs = [err.text() for err in errs]
    finally:
        for proc in (waiting, result_wait, following):
            if proc and proc.poll() is None:
                proc.kill()
    for proc, err, code in zip((waiting, result_wait, following), outs, (143, 130, 130)):
        assert notice in err, err
        assert proc.returncode == code, err
        assert "Traceback" not in err
    assert f"stopped waiting; job {job_id} goes on" in outs[0], outs[0]
    # a JSON reader (a CI step whose timeout stopped the wait) still learns which job goes on, and where
    assert json.loads(result_wait.stdout.read()) == {"id": job_id, "status": "queued", "ended": False}
    assert run_pid("status", job_id).code == 0 and "queued" in run_pid("status", job_id).stdout


@pytest.mark.docker   # the embedded queue checks the image
def test_a_batch_on_a_queue_no_worker_consumes_says_so(pid_env, run_pid, sample_repo, tmp_path):
    """A misnamed --queue or no worker started had `pid batch` wait in silence, its log empty (a new user's test): a
    while in, the queue no live worker takes is named with the command that would start one."""
    pid_env = {**pid_env, "PID_NO_WORKER_NOTICE_S": NOTICE_S}
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": name, "task": "t", "repo": str(sample_repo)}) + "\n"
                             for name in ("a", "b")))
    batch = start_pid(pid_env, tmp_path, "batch", str(tasks), "--out", str(tmp_path / "out"), "--queue", "nobodyq",
                      "--model", "m", "--base-url", LOCAL)
    err = StderrLines(batch)
    notice = "item(s) still queued after"
    try:
        err.wait_for(notice)
        batch.send_signal(signal.SIGTERM)   # (a CI step's timeout: it ended without a word, not even how to resume)
        batch.wait(timeout=60)
    finally:
        if batch.poll() is None:
            batch.kill()
    assert batch.returncode == 143, err.text()
    assert "stopped by SIGTERM: the batch's jobs go on; resume with: pid batch " in err.text(), err.text()
    assert run_pid("batch", "--cancel", str(tmp_path / "out")).code == 0   # (nothing of it stays queued)
    said = [line for line in err.text().splitlines() if notice in line]
    assert len(said) == 1 and said[0].startswith("pid: 2 item(s) still queued after "), err.text()
    assert said[0].endswith("no worker is consuming queue 'nobodyq' (start one with `pid worker --queue nobodyq`)")
    assert "Traceback" not in err.text()


@pytest.mark.docker   # runs a job, or submits one (the embedded queue checks the image)
@pytest.mark.parametrize("stop, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_ctrl_c_during_a_run_is_130_with_the_result(pid_env, sample_repo, tmp_path, stop, code):
    """SIGTERM too (CI runners and `timeout` stop a step so): it killed `pid run` at once, its patch and result lost
    (a new user's test). Now each is Ctrl-C: the job cancelled, its patch collected, its result printed."""
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo changed > new.txt; sleep 60"}}]}]
    with ScriptedLLM(script) as llm:
        proc = start_pid(pid_env, tmp_path, "run", "t", "--repo", str(sample_repo), "--model", "m",
                         "--base-url", llm.base_url, "--out", str(tmp_path / "out"), "--json")
        try:
            wait_until(lambda: len(llm.requests) >= 1, what="the first model call")
            time.sleep(1)   # the sleep is running now
            proc.send_signal(stop)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == code, err
    result = json.loads(out)
    assert (result["status"], result["exit_reason"]) == ("cancelled", "cancelled")
    assert "Traceback" not in err
    assert "+changed" in (tmp_path / "out" / result["id"] / "patch.diff").read_text()


@pytest.mark.docker   # runs a job, or submits one (the embedded queue checks the image)
@pytest.mark.parametrize("delay_s", [0, 0.3, 0.8])
def test_ctrl_c_during_set_up_is_130_and_leaves_no_container(pid_env, sample_repo, tmp_path, delay_s):
    """--json prints result.json on stdout however early the stop (a CI wrapper got nothing when it came while the
    sandbox started: a new user's test)."""
    with ScriptedLLM([{"delay_s": 5, "text": "done"}]) as llm:
        proc = start_pid(pid_env, tmp_path, "run", "t", "--repo", str(sample_repo), "--model", "m",
                         "--base-url", llm.base_url, "--out", str(tmp_path / "out"), "--json")
        try:
            line = proc.stderr.readline()   # set-up starts right after this line
            assert line.startswith("job "), line
            time.sleep(delay_s)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, err
    result = json.loads(out)
    assert result["status"] == "cancelled" and result["id"] == line.split()[1].rstrip(":"), (out, err)
    # set-up may already be over at the later delays on a fast machine: then the running job is cancelled instead
    assert "Traceback" not in err and ("interrupted" in err or "cancelling" in err), err
    job_id = line.split()[1].rstrip(":")
    wait_until(lambda: not [c for c in pid_containers() if c.labels.get("pid.job") == job_id and
                            c.status != "removing"], timeout=15, what="the job's container to go")


@pytest.mark.docker   # runs a job, or submits one (the embedded queue checks the image)
def test_cancel_says_cancelling_and_a_busy_worker_is_named(run_pid, worker, pid_env, sample_repo, tmp_path):
    script = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 100"}}]}, {"text": "done"}]
    with ScriptedLLM(script) as llm:
        args = ["t", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url, "--out",
                str(tmp_path / "out")]
        running = run_pid("submit", *args).stdout.strip()
        wait_until(lambda: len(llm.requests) >= 1, what="the first job's model call")
        second = start_pid({**pid_env, "PID_NO_WORKER_NOTICE_S": NOTICE_S}, tmp_path, "submit", "--wait",
                           *args)   # the only worker is busy
        notice = f"is still queued after {NOTICE_S}s: 1 worker(s) are running 1 job(s); it waits for a free one"
        try:
            second_err = StderrLines(second)
            second_err.wait_for(notice)
            cancel = run_pid("cancel", running)
            second.send_signal(signal.SIGINT)
            err = second_err.text()
        finally:
            if second.poll() is None:
                second.kill()
        assert cancel.code == 0 and cancel.stdout.strip() == \
            f"{running}: cancelling (its worker stops it and keeps the artifacts so far)"
        assert notice in err, err
        assert second.returncode == 130
        assert run_pid("result", running, "--wait").code == 1
        newest = JobStore(os.path.join(pid_env["PID_HOME"], "jobs.db")).list()[0]
        run_pid("cancel", newest.id)     # it may have run already: either way it ends before the worker stops
        run_pid("result", newest.id, "--wait")


# -- E. a remote default endpoint needs a key ------------------------------------------------------------------

@pytest.mark.parametrize("api, host", [("openai", "api.openai.com"), ("anthropic", "api.anthropic.com")])
def test_no_api_key_for_the_default_endpoint_is_exit_2(run_pid, sample_repo, tmp_path, api, host):
    res = run_pid("run", "t", "--repo", str(sample_repo), "--model", "m", "--api", api, "--out", str(tmp_path / "o"))
    assert_one_error(res, f"no API key: {host} needs one", "--api-key", "PID_API_KEY or OPENAI_API_KEY")
    assert not (tmp_path / "o").exists()


@pytest.mark.docker   # submits a job (the embedded queue checks the image)
def test_submit_json_without_wait_prints_an_object(run_pid, pid_env, sample_repo):
    res = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
                  "--json")
    assert res.code == 0, res.stderr
    said = json.loads(res.stdout)
    assert said == {"id": said["id"], "status": "queued", "queue": "pid"}   # (the default queue)
    assert stored_spec(pid_env, said["id"]).task == "t"
    plain = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", "http://127.0.0.1:9/v1")
    assert plain.code == 0 and stored_spec(pid_env, plain.stdout.strip()).task == "t"


@pytest.mark.docker   # asks the engine
@pytest.mark.parametrize("command", ["run", "submit"])
def test_a_network_the_runtimes_own_arguments_take_away_is_refused(run_pid, sample_repo, tmp_path, command):
    """A new user's test: with the engine's runsc set up with --network=none (as docs/gvisor.md suggests), a job's
    --network bridge ran with no network at all, while pid warned that the sandbox could reach out."""
    from pid.sandbox.engine_probe import engine_runtimes
    if "--network=none" not in (engine_runtimes() or {}).get("runsc", []):
        pytest.skip("the engine has no runsc runtime run with --network=none")
    res = run_pid(command, "t", "--repo", str(sample_repo), "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
                  "--out", str(tmp_path / "o"), "--runtime", "runsc", "--network", "bridge")
    assert res.code == 2 and "pid: error: --network bridge with --runtime runsc: the Docker engine runs runsc with " \
        "--network=none" in res.stderr, res.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.docker   # asks the engine
@pytest.mark.parametrize("command", ["run", "submit"])
def test_a_runtime_the_engine_does_not_offer_is_refused_before_anything_starts(run_pid, sample_repo, tmp_path, command):
    res = run_pid(command, "t", "--repo", str(sample_repo), "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
                  "--out", str(tmp_path / "o"), "--runtime", "nosuch")
    assert_one_error(res, "--runtime nosuch: the Docker engine has no such runtime (it has ", "runc")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("content", [None, "{bad"])
def test_a_models_file_that_is_missing_or_bad_refuses_the_run_before_it_starts(run_pid, pid_env, sample_repo,
                                                                               tmp_path, content):
    models = tmp_path / "models.json"
    if content is not None:
        models.write_text(content)
    res = run_pid("run", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
                  "--out", str(tmp_path / "o"), env=dict(pid_env, PID_MODELS=str(models)))
    assert res.code == 2 and res.stderr.count("\n") == 1 and str(models) in res.stderr, res.stderr
    assert res.stderr.startswith("pid: error: PID_MODELS=" if content is None else "pid: error: cannot read")
    assert not (tmp_path / "o").exists()


def test_a_vendor_endpoint_named_explicitly_still_needs_a_key(run_pid, sample_repo, tmp_path):
    res = run_pid("run", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", "https://api.openai.com/v1/",
                  "--out", str(tmp_path / "o"))
    assert_one_error(res, "no API key: api.openai.com needs one")


@pytest.mark.docker   # submits a job (the embedded queue checks the image)
def test_an_anthropic_job_records_anthropics_endpoint_and_an_explicit_one_is_kept(run_pid, pid_env, sample_repo,
                                                                                  tmp_path):
    own = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--api", "anthropic")
    assert own.code == 0, own.stderr
    assert stored_spec(pid_env, own.stdout.strip()).base_url == "https://api.anthropic.com/v1"
    given = run_pid("submit", "t", "--repo", str(sample_repo), "--model", "m", "--api", "anthropic",
                    "--base-url", "https://api.openai.com/v1")
    assert given.code == 0, given.stderr
    assert stored_spec(pid_env, given.stdout.strip()).base_url == "https://api.openai.com/v1"


@pytest.mark.docker   # runs a job, or submits one (the embedded queue checks the image)
def test_an_endpoint_of_ones_own_runs_without_a_key(run_pid, sample_repo, tmp_path):
    with ScriptedLLM([{"text": "done"}]) as llm:
        res = run_pid("run", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url,
                      "--out", str(tmp_path / "out"), "--json")
    assert res.code == 0, res.stderr
    assert "authorization" not in llm.request_headers[0]


@pytest.mark.docker   # runs jobs
def test_a_key_from_the_environment_goes_only_to_the_environments_endpoint(run_pid, pid_env, sample_repo, tmp_path):
    """A key in the environment is for PID_BASE_URL, else its API's own endpoint (docs/options.md, "API keys"): a
    --base-url naming another on the command line gets it only with --api-key, and the command says it was not sent."""
    cases = [({"OPENAI_API_KEY": "sk-openai"}, [], None),
             ({"PID_API_KEY": "sk-env", "PID_BASE_URL": "http://10.9.9.9/v1"}, [], None),
             ({"PID_API_KEY": "sk-env", "PID_BASE_URL": "URL"}, [], "Bearer sk-env"),
             ({"OPENAI_API_KEY": "sk-openai"}, ["--api-key", "sk-given"], "Bearer sk-given")]
    for n, (variables, args, sent) in enumerate(cases):
        with ScriptedLLM([{"text": "done"}]) as llm:
            env = dict(pid_env, **{k: v.replace("URL", llm.base_url) for k, v in variables.items()})
            res = run_pid("run", "t", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url,
                          "--out", str(tmp_path / f"out{n}"), *args, env=env)
        assert res.code == 0, res.stderr
        assert llm.request_headers[0].get("authorization") == sent, variables
        assert ("not sent" in res.stderr) == (sent is None), res.stderr

