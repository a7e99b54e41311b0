"""A job's end is said as "cancelled", not "cancelled (cancelled)", in every line that says it (issue 22)."""
from __future__ import annotations

from pid.cli.batch_progress import item_line
from pid.jobs.results import end_line


def test_worker_end_line_does_not_repeat_the_status() -> None:
    assert end_line("j1", "cancelled", "cancelled", 2.0, None) == "job j1 cancelled in 2.0s"
    assert end_line("j1", "completed", "stop", 2.0, None) == "job j1 completed (stop) in 2.0s"


def test_batch_item_line_does_not_repeat_the_status() -> None:
    row = {"id": "a", "status": "cancelled", "exit_reason": "cancelled", "turns": 1, "cost": 0.0, "duration_s": 1.0}
    assert "cancelled (cancelled)" not in item_line(row, 1, 2)
    assert "completed (stop)" in item_line({**row, "status": "completed", "exit_reason": "stop"}, 1, 2)


def test_the_live_batch_table_keeps_turn_and_cost_readable_at_80_columns() -> None:
    """A long item id and long activities used to squeeze the turn column to "…" and the cost column away."""
    from types import SimpleNamespace

    from rich.console import Console

    from pid.cli.batch_progress import Progress, render
    record = SimpleNamespace(activity="turn 3: running bash sleep 2; echo tick and a long command line",
                             status="running", turns=3, total_usage={"cost": 0.00082},
                             last_tool="bash sleep 2; echo tick (ok, 2.0s) x")
    progress = Progress(total=2, running=[("very-long-item-name-for-the-parser-fix-number-one", record)])
    console = Console(width=80, record=True, color_system=None)
    console.print(render(progress, 80))
    text = console.export_text()
    header = next(line for line in text.splitlines() if line.startswith("item"))
    assert "turn" in header and "cost" in header, text
    assert "$0.00082" in text and " 3 " in text, text
    assert all(len(line) <= 80 for line in text.splitlines()), text


def test_a_set_up_failure_that_is_the_input_s_is_bad_workspace():
    """A retry's pinned image missing on the worker that took it is the input's fault, said as such (a bare
    "sha256:… not found, build it" ended sandbox_error, which a CI retries for nothing: a code review's)."""
    from pid.jobs.spec import JobSpec
    from pid.sandbox import ImageNotFound
    from pid.sandbox_api import BadWorkspace, SandboxError
    from pid.worker.runner import set_up_failure
    pinned = JobSpec(task="t", model="m", image="app:1", image_id="sha256:" + "0" * 64)
    out = set_up_failure(pinned, ImageNotFound(str(pinned.image_id)))
    assert out.exit_reason == "bad_workspace" and "not in this worker's Docker engine" in str(out.error)
    plain = JobSpec(task="t", model="m")
    missing = set_up_failure(plain, ImageNotFound("app:1"))   # (a new user's: --image a Redis worker lacked, exit 1)
    assert missing.exit_reason == "bad_workspace" and "on the worker that took the job" in str(missing.error)
    assert set_up_failure(plain, BadWorkspace("no such ref")).exit_reason == "bad_workspace"
    assert set_up_failure(plain, SandboxError("gone")).exit_reason == "sandbox_error"
    assert set_up_failure(plain, ValueError("bug")).exit_reason == "error"
