"""pid's output inside the repository it packs (`--repo .` with the default `--out ./pid-runs`) never reaches a later
job's workspace: the agent must not read the earlier jobs' transcripts and patches (pid/output_dirs.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pid.output_dirs import MARK
from tests.scripted_llm import ScriptedLLM

pytestmark = [pytest.mark.docker, pytest.mark.cli]

LIST = "find . -path ./.git -prune -o -print | sort"


def listing_seen(llm: ScriptedLLM) -> str:
    return "\n".join(m["content"] for m in llm.requests[1]["messages"] if m["role"] == "tool")


def test_a_jobs_artifacts_inside_the_repository_stay_out_of_the_next_jobs_workspace(run_pid, sample_repo):
    out = sample_repo / "pid-runs"   # as `cd repo && pid run … --repo .` has it
    ids = []
    for _ in range(2):
        script = [{"tool_calls": [{"name": "bash", "arguments": {"command": LIST}}]}, {"text": "done"}]
        with ScriptedLLM(script) as llm:
            res = run_pid("run", "list the tree", "--repo", str(sample_repo), "--model", "scripted",
                          "--base-url", llm.base_url, "--out", str(out), "--json")
            assert res.code == 0, res.stderr
            ids.append(json.loads(res.stdout)["id"])
            seen = listing_seen(llm)
        assert "./hello.py" in seen and "./README.md" in seen, seen
        assert "session.jsonl" not in seen and "result.json" not in seen and ids[-1] not in seen, seen
    first = out / ids[0]
    assert (first / "session.jsonl").exists() and (first / MARK).exists()
    assert ids[0] not in seen, seen   # the second job saw nothing of the first's
    patch = Path(out / ids[1] / "patch.diff").read_text()
    assert "pid-runs" not in patch, patch


def test_an_out_directory_that_is_a_link_is_refused(tmp_path):
    """A hostile-repository test's: a repository's own committed `pid-runs` link (the default --out of a `pid run`
    in it) sent the job's patch, transcript and --file copies to wherever it pointed."""
    from pid.errors import PidError
    from pid.jobs.submission import check_out_dir
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "pid-runs").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PidError, match=r"^--out .*pid-runs: a symbolic link \(to .*elsewhere\): pid writes no output"):
        check_out_dir(str(tmp_path / "pid-runs"))
    assert check_out_dir(str(tmp_path / "elsewhere")) == str(tmp_path / "elsewhere")
