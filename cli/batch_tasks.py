"""A batch's tasks file: one JSON object per line, `task` and `repo` and any job option as a field. Every line is
checked, and every bad one reported with its number, before anything is submitted.

A field is named as its option (`timeout`, `max-turns` or `max_turns`, `file`) or as its JobSpec field
(`timeout_s`, `files`): the names and the checks are cli/options.py's JOB_OPTIONS, so an option added there is a
field here too. `id` (unique in the file; default: the line's number) names the item's folder in the output
directory.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable
from urllib.parse import urlsplit

import click

from pid.cli.options import JOB_OPTIONS, JobOption, QueueName
from pid.jobs.spec import message_problem, spec_field

ID_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
# An item's folder sits beside these in the output directory (and hidden ones, which an id cannot start with).
# `view` is where `pid view DIR` writes the batch's pages.
RESERVED_IDS = {"batch.json", "batch.jsonl", "jobs.jsonl", "summary.json", "view"}
SECRET_FIELDS = {"api_key", "api-key"}   # a key is not taken from a tasks file: the batch keeps its lines
NOT_PER_ITEM = {"out_dir"}   # the batch's own: its output directory
IMAGES_FIELDS = ("no-images", "no_images", "images")
MAX_BAD_LINES = 1000   # a tasks file's bad lines told at most: a file of millions kept one error each (~100 B a byte)
PATH_FIELDS = {"system_prompt"}   # options whose value is a file on this machine (besides `repo`)


@dataclass
class Item:
    """One line of the tasks file: its id, and the JobSpec fields it sets (checked)."""
    id: str
    line: int
    task: str
    repo: str | None
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class Parsed:
    items: list[Item]
    errors: list[str]   # "line N: ..." each


def field_options() -> dict[str, JobOption]:
    """Every name a line may use for a job option -> that option."""
    names: dict[str, JobOption] = {}
    for option in JOB_OPTIONS:
        if option.name in NOT_PER_ITEM:
            continue
        flag = option.flag.lstrip("-")
        for name in (option.name, flag, flag.replace("-", "_")):
            names[name] = option
    return names


def convert(option: JobOption, value: Any) -> Any:
    """A line's value for an option, checked as the option checks it; click.BadParameter if bad."""
    meta = spec_field(option.name).metadata
    kind = option.type(meta["min"], meta["max"]) if option.type else None
    if option.extra.get("multiple"):
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise click.BadParameter("must be a string or a list of strings")
        return [kind.convert(v, None, None) if kind else v for v in values]
    if value is None:
        return None
    if kind is None:
        if not isinstance(value, str):
            raise click.BadParameter("must be a string")
        return value
    if isinstance(value, list) and option.name == "tools":
        value = ",".join(str(v) for v in value)
    if isinstance(value, (dict, list, bool)):
        raise click.BadParameter(f"{json.dumps(value)[:60]} is not a valid value")
    return kind.convert(value, None, None)


def local_path(value: str, base: str | None, allow_outside: bool) -> str:
    """A path a tasks file names: relative to the file's directory `base`; outside it (once links are followed), a
    BadParameter unless `allow_outside`. Tasks read from stdin (`base` None) have no directory: their paths need
    `allow_outside`, and are then relative to the current one."""
    if "\0" in value:
        raise click.BadParameter("a path cannot hold a NUL byte")
    if base is None:
        if not allow_outside:
            raise click.BadParameter(f"{value}: tasks read from stdin have no directory of their own; pass "
                                     "--allow-outside to let them name paths (relative to the current directory)")
        base = os.getcwd()
    path = os.path.join(base, os.path.expanduser(value))
    root = os.path.realpath(base)
    if not allow_outside and os.path.commonpath([os.path.realpath(path), root]) != root:
        raise click.BadParameter(f"{value} is outside the tasks file's directory {root} (pass --allow-outside to "
                                 "allow it)")
    return path


def parse(lines: Iterable[str], base: str | None, allow_outside: bool = False) -> Parsed:
    """Every line checked; blank lines are skipped (they keep their number). Paths are resolved against `base`
    (local_path)."""
    options = field_options()
    items: list[Item] = []
    errors: list[str] = []
    seen: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        if len(errors) >= MAX_BAD_LINES:   # (nothing will be submitted: the rest is not read, nor kept in memory)
            errors.append(f"line {number} on: not read ({MAX_BAD_LINES} bad lines already)")
            break
        if not text.strip():
            continue
        data = _json_object(text)
        if isinstance(data, str):
            errors.append(f"line {number}: {data}")
            continue
        problems: list[str] = []
        item_id = _item_id(data.pop("id", number), number, seen, problems)
        task = data.pop("task", None)
        if not isinstance(task, str) or not task.strip():
            problems.append("no task (a non-empty string)")
        elif (problem := message_problem("its task", task)) is not None:
            problems.append(problem)
        repo = _repo(data.pop("repo", None), base, allow_outside, problems)
        fields = _fields(data, options, base, allow_outside, problems)
        if problems:
            errors.extend(f"line {number}: {p}" for p in problems)
            continue
        items.append(Item(item_id, number, str(task), repo, fields))
    return Parsed(items, errors)


def _json_object(text: str) -> dict[str, Any] | str:
    """A line's JSON object, or what is wrong with the line."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        return f"not JSON ({exc})"
    except RecursionError:
        return "not JSON pid reads (nested too deeply)"
    return data if isinstance(data, dict) else "not a JSON object"


def _item_id(item_id: Any, number: int, seen: dict[str, int], problems: list[str]) -> str:
    """A line's id, checked (a bad one is a problem, and `line-N` stands in for it); `seen`: id -> its first line."""
    if isinstance(item_id, bool) or not isinstance(item_id, (str, int)) or not ID_RE.fullmatch(str(item_id)):
        problems.append(f"id {json.dumps(item_id)[:60]} is not a valid id (letters, digits, '.', '_', '-'; at "
                        "most 128; not starting with '.')")
        item_id = f"line-{number}"
    elif str(item_id) in RESERVED_IDS:
        problems.append(f"id {json.dumps(item_id)} is the name of one of the batch's own files or folders (ids "
                        f"may not be {', '.join(sorted(RESERVED_IDS))})")
        item_id = f"line-{number}"
    item_id = str(item_id)
    if item_id in seen:
        problems.append(f"id {item_id!r} is also line {seen[item_id]}'s")
    seen.setdefault(item_id, number)
    return item_id


def _repo(repo: Any, base: str | None, allow_outside: bool, problems: list[str]) -> Any:
    """A line's repo: a URL, or a local path resolved against `base` (local_path)."""
    if repo is not None and (not isinstance(repo, str) or not repo.strip()):
        problems.append("repo must be a non-empty string")
    elif isinstance(repo, str):
        try:
            if "://" not in repo:
                repo = local_path(repo, base, allow_outside)
            elif repo.lower().startswith("file:"):   # a path too: the worker clones it from its machine (as
                local_path(urlsplit(repo).path, base, allow_outside)   # written: check_git_source refuses escapes)
        except click.BadParameter as exc:
            problems.append(f"repo: {exc.message}")
    return repo


def _fields(data: dict[str, Any], options: dict[str, JobOption], base: str | None, allow_outside: bool,
            problems: list[str]) -> dict[str, Any]:
    """A line's other fields, each a job option checked as the option checks it -> JobSpec fields."""
    fields: dict[str, Any] = {}
    named: dict[str, str] = {}   # option -> the field that set it ("timeout" and "timeout_s" are one option)
    for key, value in data.items():
        if key in IMAGES_FIELDS:   # the flag --no-images (or the JobSpec field `images`): a JSON boolean
            if not isinstance(value, bool):
                problems.append(f"{key}: must be true or false")
            else:
                _put(fields, named, problems, "images", value if key == "images" else not value, key)
            continue
        if key == "queue":
            try:
                fields["queue"] = QueueName().convert(value, None, None) if isinstance(value, str) else \
                    _raise("must be a string")
            except click.BadParameter as exc:
                problems.append(f"queue: {exc.message}")
            continue
        option = options.get(key)
        if key in SECRET_FIELDS:
            problems.append(f"{key}: an API key is not taken from a tasks file (a file that is shared, and kept "
                            "beside the batch's results): set PID_API_KEY, or pass --api-key")
            continue
        if option is None:
            problems.append(f"unknown field {key!r}")
            continue
        try:
            if option.name in PATH_FIELDS:   # (a path as a number, 42, was read from the current directory)
                if not isinstance(value, str):
                    raise click.BadParameter("must be a path (a string)")
                value = local_path(value, base, allow_outside)
            _put(fields, named, problems, option.name, convert(option, value), key)
        except click.BadParameter as exc:
            problems.append(f"{key}: {exc.message}")
    return fields


def _put(fields: dict[str, Any], named: dict[str, str], problems: list[str], name: str, value: Any, key: str) -> None:
    """A line's value for option `name`, given as field `key`: one given again under another name with another value
    is a problem, not a silent choice of one of them."""
    if name in fields and fields[name] != value:
        problems.append(f"{key}: the same option as {named[name]}, with another value (give one of them)")
        return
    fields[name] = value
    named.setdefault(name, key)


def _raise(message: str) -> Any:
    raise click.BadParameter(message)
