"""The summary a finished job ends with in a terminal (cli/output.py print_result): what the last lines say."""
from __future__ import annotations

from pid.cli.output import CHECK_SAID, print_result

RESULT = {"id": "j1", "status": "completed", "exit_reason": "stop", "duration_s": 0.5, "turns": 2, "tool_calls": 1,
          "usage": {"total_tokens": 2085, "cost": 0}, "final_message": "done"}


def test_a_failed_check_is_in_the_summary_line_even_when_its_verdict_was_said(capsys, tmp_path):
    check = {"command": "exit 3", "exit_code": 3, "passed": False, "duration_s": 0.0, "output_tail": ""}
    print_result({**RESULT, "check": check}, str(tmp_path), as_json=False, said={CHECK_SAID})
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "completed (stop), check FAILED (exit 3) in 0.5s · 2 turns · 1 tool call · 2,085 tokens · $0"
    print_result({**RESULT, "check": {**check, "exit_code": 0, "passed": True}}, str(tmp_path), as_json=False,
                 said={CHECK_SAID})
    assert capsys.readouterr().err.splitlines()[0].startswith("completed (stop) in 0.5s · ")


def test_what_the_artifacts_left_out_is_a_warning_naming_the_first_few(capsys, tmp_path):
    refused = [{"path": "/nope", "reason": "not found", "artifact": "files"},
               {"path": "big.bin", "reason": "over 100 MB", "artifact": "patch"},
               *({"path": f"/gone{n}", "reason": "not found", "artifact": "files"} for n in range(3))]
    print_result({**RESULT, "artifacts": {"refused": refused}}, str(tmp_path), as_json=False)
    warning = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:"))
    assert warning == ("warning: left out of the artifacts: --file /nope (not found), patch big.bin (over 100 MB), "
                       "--file /gone0 (not found) and 2 more (result.json's artifacts.refused)")
    print_result({**RESULT, "artifacts": {"refused": refused[:1]}}, str(tmp_path), as_json=True)
    assert "warning: left out of the artifacts: --file /nope (not found) (result.json" in capsys.readouterr().err
    print_result(RESULT, str(tmp_path), as_json=False)
    assert "warning" not in capsys.readouterr().err


def test_a_result_with_no_duration_is_summed_up_not_a_crash(capsys, tmp_path):
    """A job that never started has no duration (null in the store's record): the summary still prints."""
    print_result({**RESULT, "status": "cancelled", "exit_reason": "cancelled", "duration_s": None}, str(tmp_path),
                 as_json=False)
    assert capsys.readouterr().err.splitlines()[0].startswith("cancelled in 0.0s · 2 turns")
