"""The tasks file's checks (cli/batch_tasks.py): each bad line is told by its number and why."""
from __future__ import annotations

from pid.cli.batch_tasks import parse


def test_an_id_that_names_one_of_the_batchs_own_files_is_told_so_not_called_invalid(tmp_path):
    """"summary.json" has only the letters and dots an id may have: what refuses it is the batch's own file."""
    parsed = parse(['{"id": "summary.json", "task": "t", "repo": "."}', '{"id": ".x", "task": "t", "repo": "."}',
                    '{"id": "ok-1", "task": "t", "repo": "."}', '{"id": "view", "task": "t", "repo": "."}'],
                   str(tmp_path))
    own = ("is the name of one of the batch's own files or folders (ids may not be batch.json, batch.jsonl, "
           "jobs.jsonl, summary.json, view)")
    assert parsed.errors == [
        f"line 1: id \"summary.json\" {own}",
        "line 2: id \".x\" is not a valid id (letters, digits, '.', '_', '-'; at most 128; not starting with '.')",
        f"line 4: id \"view\" {own}"]   # (`pid view DIR` writes there: its pages were taken for an earlier job's)


def test_an_api_key_in_a_tasks_file_is_refused_with_where_a_key_goes(tmp_path):
    parsed = parse(['{"task": "t", "repo": ".", "api_key": "sk-1"}'], str(tmp_path))
    assert parsed.errors == ["line 1: api_key: an API key is not taken from a tasks file (a file that is shared, and "
                             "kept beside the batch's results): set PID_API_KEY, or pass --api-key"]


def test_one_option_given_twice_on_a_line_under_two_names_is_refused(tmp_path):
    """"timeout" and "timeout_s" are one option: a line with two values for it lost one without a word (a new-user
    test's); now it is told. The same value under both names is one value."""
    parsed = parse(['{"task": "t", "repo": ".", "timeout": 30, "timeout_s": 40}',
                    '{"task": "t", "repo": ".", "no-images": true, "images": true}',
                    '{"task": "t", "repo": ".", "max-turns": 3, "timeout": 30, "timeout_s": 30.0}',
                    '{"task": "t", "repo": ".", "no-images": true, "images": false}'], str(tmp_path))
    assert parsed.errors == [
        "line 1: timeout_s: the same option as timeout, with another value (give one of them)",
        "line 2: images: the same option as no-images, with another value (give one of them)"]
    assert [item.fields for item in parsed.items] == [{"max_turns": 3, "timeout_s": 30.0}, {"images": False}]


def test_a_reason_many_lines_share_is_told_once_with_their_numbers():
    """A model without prices and --max-total-cost: a 1,000-line file printed the same reason 1,000 times."""
    from pid.jobs.batch_setup import BadTasks
    why = "--max-total-cost needs the model's prices"
    refused = BadTasks("tasks.jsonl", [f"line {n}: {why}" for n in range(1, 13)] + ["line 13: id is taken"])
    assert refused.grouped() == [f"lines 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 2 more: {why}", "line 13: id is taken"]
    assert len(refused.lines) == 13 and str(refused).count(why) == 1
