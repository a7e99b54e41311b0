"""A worker's policy (jobs/policy.py): the most a job may ask of a worker. The rules themselves here, without a
worker; then for real: a `pid worker --policy` that refuses a job before any container starts, a `pid submit` and a
`pid batch` that refuse at once what no live worker admits, and a tasks file's paths kept in its own directory."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import pid_containers, start_worker, stop_worker
from tests.scripted_llm import ScriptedLLM
from pid.jobs.spec import JobSpec, spec_problem
from pid.jobs.policy import Policy, PolicyError, image_name, load, refusal_by_workers
from pid.jobs.sqlite_store import JobStore
from pid.jobs.store import WorkerBeat
from pid.worker.tasks import _refused_by_policy

STRICT = """
max_memory = "1g"
max_cpus = 1.5
max_pids = 256
max_disk = "2g"
max_timeout = 600
max_cost = 2.5
allow_root = false
allow_network = ["none"]
images = ["pid-sandbox:*", "ghcr.io/tasks/*"]
base_urls = ["http://models.internal:8000/v1/"]
runtimes = ["runsc"]
repos = ["https://github.com/*"]
"""


def admitted(**fields) -> JobSpec:
    """A job the strict policy admits; each test changes one field."""
    base = dict(task="t", model="m", memory="1g", cpus=1.0, pids_limit=128, disk=1 << 30, timeout_s=600,
                max_cost=1.0, user="1000:1000", network="none", image="pid-sandbox:latest",
                base_url="http://models.internal:8000/v1", runtime="runsc", repo="/r", workspace="sha256:" + "ab" * 32,
                out_dir="/o")
    return JobSpec(**{**base, **fields})


@pytest.fixture
def strict(tmp_path) -> Policy:
    path = tmp_path / "policy.toml"
    path.write_text(STRICT)
    return load(str(path))


def test_each_rule_refuses_what_is_over_it_and_names_itself(strict):
    assert strict.refusal(admitted()) is None
    over = {
        "max_memory": dict(memory="2g"), "max_cpus": dict(cpus=2.0), "max_pids": dict(pids_limit=512),
        "max_disk": dict(disk=3 << 30), "max_timeout": dict(timeout_s=601), "max_cost": dict(max_cost=3.0),
        "allow_root": dict(user="root"), "allow_network": dict(network="bridge"), "images": dict(image="ubuntu"),
        "base_urls": dict(base_url="http://attacker.example/v1"), "runtimes": dict(runtime=None),
        "repos": dict(repo="file:///root/secrets", workspace=None),
    }
    for rule, fields in over.items():
        refusal = strict.refusal(admitted(**fields))
        assert refusal is not None and rule in refusal, (rule, refusal)
    # what "no limit" asks is over any limit; root by number is root; a check's own time counts
    assert "max_disk" in strict.refusal(admitted(disk=0))
    assert "max_cost" in strict.refusal(admitted(max_cost=None))
    assert "allow_root" in strict.refusal(admitted(user="0:0"))
    assert "max_timeout" in strict.refusal(admitted(check="true", check_timeout_s=900))
    assert strict.refusal(admitted(image="pid-sandbox")) is None            # :latest, as the engine reads it
    assert strict.refusal(admitted(repo="https://github.com/a/b#main", workspace=None)) is None
    assert strict.refusal(admitted(repo="/home/me/project", workspace=None)) is not None   # a path on the worker


def test_a_url_is_matched_as_it_is_reached_not_as_it_is_spelled():
    rules = Policy(base_urls=("http://localhost:*/v1", "https://*.openai.azure.com/openai"))
    for url in ("http://localhost:8000/v1", "HTTP://LOCALHOST:8000/v1/", "https://a.openai.azure.com:443/openai"):
        assert rules.refusal(admitted(base_url=url)) is None, url
    for url in ("http://localhost:1@evil.example/v1", "https://evil.example/x.openai.azure.com/openai",
                "https://a.openai.azure.com/openai?x=1", "http://localhost:80/v1/../../evil"):
        assert "base_urls" in (rules.refusal(admitted(base_url=url)) or ""), url
    mirrors = Policy(repos=("https://github.com/my-org/*", "file:///srv/mirrors/*"))
    for repo in ("https://github.com/my-org/../evil/repo", "https://github.com/my-org/%2e%2e/evil",
                 "file:///srv/mirrors/../../etc", "/srv/mirrors/../../etc", "https://github.com.evil/my-org/x"):
        assert "repos" in (mirrors.refusal(admitted(repo=repo, workspace=None)) or ""), repo
    assert mirrors.refusal(admitted(repo="https://github.com/my-org/x#main", workspace=None)) is None
    assert mirrors.refusal(admitted(repo="/srv/mirrors/x", workspace=None)) is None


def test_a_worker_judges_a_spec_written_past_the_cli_as_malformed():
    """Anyone who can write to the store skips the CLI's checks: NaN is over no limit, a pids limit of -1 is none
    at all, an id of `../x` is a path. The worker refuses such a spec before its policy is even asked."""
    assert spec_problem(admitted()) is None
    for fields in (dict(max_cost=float("nan")), dict(pids_limit=-1), dict(cpus=0.0), dict(id="../planted/x"),
                   dict(out_dir="/tmp/a/../b"), dict(memory=5), dict(user="ROOT"), dict(api="bogus"),
                   dict(workspace=""), dict(runtime="a\nb"), dict(timeout_s=True), dict(max_turns=2.5),
                   dict(base_url="http://x/v1\nforged log line"), dict(task="x" * ((1 << 20) + 1))):
        assert spec_problem(admitted(**fields)) is not None, fields
    assert "max_cost" in Policy(max_cost=1).refusal(admitted(max_cost=float("nan")))   # and NaN is over any limit


def test_a_malformed_spec_in_the_store_ends_refused_and_nothing_is_written_where_it_points(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    victim = tmp_path / "victim"
    spec = admitted(id="../planted/x", out_dir=str(victim), pids_limit=-1)
    store.create(spec)
    assert store.claim(spec.id, "w1", 60)
    assert _refused_by_policy(store, store.get(spec.id), "w1")
    record = store.get(spec.id)
    assert (record.status, record.exit_reason) == ("failed", "policy_refused")
    assert "malformed" in record.error and "pids_limit" in record.error
    assert not victim.exists() and not (tmp_path / "planted").exists()


def test_the_default_policy_admits_everything_pid_can_run():
    anything = admitted(memory="100g", cpus=64.0, disk=0, max_cost=None, user="root", network="bridge",
                        image="whatever:1", base_url="http://x/v1", runtime=None, repo="file:///x", workspace=None)
    assert Policy().refusal(anything) is None and Policy().to_dict() == {}
    assert Policy.from_dict({}) == Policy()


def test_a_policy_file_is_checked_key_by_key(tmp_path, strict):
    assert Policy.from_dict(strict.to_dict()) == strict           # what a heartbeat carries is the policy
    assert image_name("reg:5000/a/b") == "reg:5000/a/b:latest" and image_name("a@sha256:" + "0" * 64).endswith("0")
    bad = {"max_memory = \"4x\"": "max_memory", "max_cpus = \"2\"": "max_cpus", "colour = 1": "unknown key colour",
           "images = \"a\"": "images", "allow_root = 1": "allow_root", "max_pids = 2.5": "max_pids",
           "max_cost = nan": "max_cost", "max_timeout = -1": "max_timeout", "[x": "not TOML",
           # values no job can meet: the worker would refuse every job, each after the user waited for it
           "max_cpus = 0": "max_cpus = 0: expected at least 0.01", "max_pids = 8": "max_pids = 8: expected at least 16",
           "max_timeout = 0": "max_timeout", "max_memory = 4": "max_memory = 4: expected at least 6m",
           'max_disk = "1m"': "max_disk = '1m': expected at least 16m",
           'allow_network = ["nonee"]': 'networks \\["none", "bridge"\\]',
           'base_urls = ["api.openai.com/v1"]': "URLs with their scheme", 'repos = ["github.com/*"]': "repos"}
    for text, named in bad.items():
        path = tmp_path / "bad.toml"
        path.write_text(text + "\n")
        with pytest.raises(PolicyError, match=named):
            load(str(path))
    with pytest.raises(PolicyError, match="No such file"):
        load(str(tmp_path / "missing.toml"))


def test_submit_refuses_only_when_no_live_worker_of_the_queue_admits(strict):
    def beat(node: str, policy: dict, queues: list[str] | None = None) -> WorkerBeat:
        return WorkerBeat(node, "h", 1, None, 1, 0, None, 0.0, 0.0, queues or ["pid"], policy)
    big = admitted(memory="8g")
    assert refusal_by_workers([], big) is None                                   # nobody to ask: it waits
    assert refusal_by_workers([beat("a", strict.to_dict(), ["other"])], big) is None   # not that queue's
    refused = refusal_by_workers([beat("a", strict.to_dict()), beat("b", {"max_memory": 2 << 30})], big)
    assert refused is not None and "queue pid" in refused and "max_memory = 1g" in refused and "1 other" in refused
    assert refusal_by_workers([beat("a", strict.to_dict()), beat("b", {})], big) is None   # b admits it


# -- for real: a worker, the CLI -----------------------------------------------------------------------------------

def wait_for_policy(run_pid, timeout: float = 30) -> list[dict]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        listed = run_pid("workers", "--json")
        beats = json.loads(listed.stdout) if listed.code == 0 else []
        if any(b.get("policy") for b in beats):
            return beats
        time.sleep(0.3)
    raise AssertionError("no worker published its policy")


@pytest.mark.cli
def test_a_worker_refuses_what_its_policy_does_not_admit_before_any_container(run_pid, pid_env, sample_repo,
                                                                              tmp_path):
    policy = tmp_path / "policy.toml"
    with ScriptedLLM([{"text": "done"}]) as llm:
        policy.write_text(f'max_memory = "1g"\nallow_root = false\nbase_urls = ["{llm.base_url}"]\n')
        job = ["submit", "fix it", "--repo", str(sample_repo), "--model", "m", "--base-url", llm.base_url,
               "--memory", "512m"]
        # queued while no worker is live (nobody to ask), then refused by the worker that takes it
        waiting = subprocess.Popen([sys.executable, "-m", "pid.cli.main", *job, "--memory", "2g", "--wait", "--json"],
                                   cwd=tmp_path, env=pid_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        deadline = time.time() + 60
        while not json.loads(run_pid("list", "--json").stdout) and time.time() < deadline:
            time.sleep(0.2)
        worker = start_worker({**pid_env, "PID_POLICY": str(policy)}, tmp_path, tmp_path / "worker.log")
        try:
            out, err = waiting.communicate(timeout=120)
            assert waiting.returncode == 2, err
            result = json.loads(out)
            assert (result["status"], result["exit_reason"]) == ("failed", "policy_refused")
            assert "--memory 2g is over max_memory = 1g" in result["error"]
            assert not [c for c in pid_containers() if c.labels.get("pid.job") == result["id"]]
            status = run_pid("status", result["id"])
            assert "max_memory" in status.stdout + status.stderr

            # now that the worker's heartbeat carries its policy, submit refuses at once
            beats = wait_for_policy(run_pid)
            assert beats[0]["policy"] == {"max_memory": 1 << 30, "allow_root": False, "base_urls": [llm.base_url]}
            refused = run_pid(*job, "--user", "root", "--wait")
            assert refused.code == 2 and refused.stderr.count("\n") == 1, refused.stderr
            assert "no live worker of queue pid admits the job: --user root runs as root" in refused.stderr
            other = run_pid(*job, "--base-url", "http://attacker.example/v1", "--api-key", "k")
            assert other.code == 2 and "base_urls" in other.stderr

            # a job inside the policy runs
            done = run_pid(*job, "--wait")
            assert done.code == 0, done.stderr
            assert len(llm.requests) == 1
        finally:
            stop_worker(worker)
    assert len(json.loads(run_pid("list", "--json").stdout)) == 2   # the refused-at-submit ones were never queued


@pytest.mark.cli
def test_a_bad_policy_file_stops_the_worker_in_one_line(run_pid, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('max_memory = "lots"\n')
    r = run_pid("worker", "--policy", str(policy), timeout=60)
    assert r.code == 2 and "max_memory" in r.stderr and "Traceback" not in r.stderr
    r = run_pid("worker", "--policy", str(tmp_path / "none.toml"), timeout=60)
    assert r.code == 2 and "none.toml" in r.stderr


@pytest.mark.cli
def test_a_malformed_endpoint_for_the_workers_own_key_stops_it_in_one_line(run_pid, pid_env):
    r = run_pid("worker", env={**pid_env, "PID_BASE_URL": "http://[::1/v1"}, timeout=60)
    assert r.code == 2 and r.stderr.strip().endswith("$PID_BASE_URL: 'http://[::1/v1' is not an http(s) URL "
                                                     "(e.g. http://localhost:8000/v1)"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.cli
def test_a_batch_says_per_line_what_no_worker_admits(run_pid, pid_env, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('max_cpus = 1\nallow_network = ["none"]\n')
    repo = tmp_path / "tasks" / "repo"
    repo.mkdir(parents=True)
    (repo / "a.txt").write_text("a\n")
    tasks = tmp_path / "tasks" / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(line) + "\n" for line in [
        {"task": "fine", "repo": "repo"},
        {"task": "more cpus", "repo": "repo", "cpus": 2},
        {"task": "the network", "repo": "repo", "network": "bridge"},
    ]))
    worker = start_worker({**pid_env, "PID_POLICY": str(policy)}, tmp_path, tmp_path / "worker.log")
    try:
        wait_for_policy(run_pid)
        r = run_pid("batch", str(tasks), "--out", str(tmp_path / "out"), "--model", "m", "--base-url", "http://x/v1")
    finally:
        stop_worker(worker)
    assert r.code == 2, r.stderr
    assert "line 2: no live worker of queue pid admits the job: --cpus 2 is over max_cpus = 1" in r.stderr
    assert "line 3:" in r.stderr and "allow_network" in r.stderr and "line 1:" not in r.stderr
    assert "2 bad line(s)" in r.stderr
    assert json.loads(run_pid("list", "--json").stdout) == []


@pytest.mark.cli
def test_a_tasks_file_s_paths_are_its_own_directory_s_unless_allowed_outside(run_pid, pid_env, tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.txt").write_text("hunter2\n")
    here = tmp_path / "tasks"
    (here / "repo").mkdir(parents=True)
    (here / "repo" / "a.txt").write_text("a\n")
    (here / "link").symlink_to(secret)
    (here / "prompt.md").write_text("Be brief.\n")
    tasks = here / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(line) + "\n" for line in [
        {"task": "relative", "repo": "repo", "system_prompt": "prompt.md"},
        {"task": "absolute", "repo": str(secret)},
        {"task": "dot-dot", "repo": "../secret"},
        {"task": "a link out", "repo": "link"},
        {"task": "a prompt out", "repo": "repo", "system_prompt": str(secret / "key.txt")},
        {"task": "a file URL out", "repo": f"file://{secret}"},
        # decoded, inside the tasks file's directory; as the worker mounts it, the secret (an attack review's)
        {"task": "an escaped file URL out", "repo": f"file://{secret}/z%2F..%2F..%2Ftasks%2Fw/.."},
    ]))
    args = ["batch", str(tasks), "--model", "m", "--base-url", "http://x/v1", "--detach"]
    r = run_pid(*args, "--out", str(tmp_path / "out"))
    assert r.code == 2, r.stderr
    told = {int(n) for said in re.findall(r": lines? ([0-9, ]+): ", r.stderr) for n in said.split(", ")}
    assert told == {2, 3, 4, 5, 6, 7} and "outside the tasks file's directory" in r.stderr, r.stderr
    assert "hunter2" not in r.stderr   # (line 1 is fine: a shared reason names "lines 2, 6")
    # tasks from stdin have no directory: their paths need --allow-outside
    piped = subprocess.run([sys.executable, "-m", "pid.cli.main", *args[:1], "-", *args[2:], "--out",
                            str(tmp_path / "o")],
                           input=json.dumps({"task": "t", "repo": "."}) + "\n", cwd=here, env=pid_env,
                           capture_output=True, text=True, timeout=120)
    assert piped.returncode == 2 and "stdin" in piped.stderr and "--allow-outside" in piped.stderr, piped.stderr
    # (a link as the repository itself is refused however it is named: its tree is packed without following links)
    # (and an escaped file:// path is no path at all: the worker would mount it as written, not as decoded)
    r = run_pid(*args, "--out", str(tmp_path / "out2"), "--allow-outside")
    assert r.code == 2 and "line 7: --repo: a file:// URL's path is taken as written" in r.stderr, r.stderr
    tasks.write_text("".join(line + "\n" for line in tasks.read_text().splitlines()
                             if '"link"' not in line and "%2F" not in line))
    r = run_pid(*args, "--out", str(tmp_path / "out2"), "--allow-outside")
    assert r.code == 0, r.stderr
    specs = {r.spec.task: r.spec for r in JobStore(str(Path(pid_env["PID_HOME"]) / "jobs.db")).list()}
    assert specs["relative"].repo == str(here / "repo") and specs["relative"].system_prompt == "Be brief.\n"
    assert specs["a prompt out"].system_prompt == "hunter2\n"


@pytest.mark.docker
def test_a_pinned_image_runs_only_by_a_name_the_policy_admits(monkeypatch, tmp_path):
    """A retry pins the image its earlier job ran by id (image_id). Anyone who can write the store's specs could pin
    any image the engine holds: the policy's images judge the names the pinned image has now (a code review's)."""
    import docker

    from pid.jobs import policy as policies
    from pid.worker.tasks import _pinned_image_refusal
    from tests.conftest import IMAGE, RUN_ID
    client = docker.from_env()
    ours = client.images.get(IMAGE).id
    (tmp_path / "Dockerfile").write_text(f"FROM {IMAGE}\nLABEL pid.test=other\n")
    tag = f"pid-test-other:{RUN_ID.lower()}"
    subprocess.run(["docker", "build", "-q", "-t", tag, str(tmp_path)], check=True, capture_output=True, timeout=300)
    other = client.images.get(tag)
    monkeypatch.setattr(policies, "_active", [Policy(images=(IMAGE.split(":")[0] + ":*",))])
    spec = JobSpec(task="t", model="m", image=IMAGE, image_id=ours)
    assert _pinned_image_refusal(spec) is None
    forged = JobSpec(task="t", model="m", image=IMAGE, image_id=other.id)
    assert "has no name now that the policy's images admit" in str(_pinned_image_refusal(forged))
    monkeypatch.setattr(policies, "_active", [Policy()])   # (no images rule: nothing to judge)
    assert _pinned_image_refusal(forged) is None
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)
