"""A job's end is said as "cancelled", not "cancelled (cancelled)", in every line that says it (issue 22)."""
from __future__ import annotations

from cli.batch_progress import item_line
from worker.tasks import end_line


def test_worker_end_line_does_not_repeat_the_status() -> None:
    assert end_line("j1", "cancelled", "cancelled", 2.0, None) == "job j1 cancelled in 2.0s"
    assert end_line("j1", "completed", "stop", 2.0, None) == "job j1 completed (stop) in 2.0s"


def test_batch_item_line_does_not_repeat_the_status() -> None:
    row = {"id": "a", "status": "cancelled", "exit_reason": "cancelled", "turns": 1, "cost": 0.0, "duration_s": 1.0}
    assert "cancelled (cancelled)" not in item_line(row, 1, 2)
    assert "completed (stop)" in item_line({**row, "status": "completed", "exit_reason": "stop"}, 1, 2)
