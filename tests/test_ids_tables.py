"""Ids people can type (cli/ids.py) and the tables that show them (cli/table.py), against a real SQLite store; the
real CLI's tables and ids are tests/test_cli_ids_tables.py."""
from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from pid.cli.ids import NoSuchJob, resolve
from pid.cli.table import Column, cut, render
from pid.costs import format_cost
from pid.jobs.batch import BatchDir
from pid.jobs.spec import JobSpec
from pid.jobs.sqlite_store import JobStore

IDS = ["20261201-000000-70a672", "20261201-000001-80a672", "20261201-000002-abcdef"]


def spec(tmp_path: Path, job_id: str, batch: str | None = None) -> JobSpec:
    return JobSpec(id=job_id, task="t", repo=str(tmp_path), model="m", out_dir=str(tmp_path / "out"),
                   base_url="http://x", batch=batch)


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    store = JobStore(str(tmp_path / "jobs.db"))
    for job_id in IDS:
        store.create(spec(tmp_path, job_id))
    return store


def test_a_unique_end_of_an_id_names_its_job_and_an_ambiguous_one_lists_candidates(store):
    assert resolve(store, "70a672") == IDS[0]
    assert resolve(store, "cdef") == IDS[2]
    with pytest.raises(NoSuchJob, match=r"^no such job: f \(an id's end names a job from 4 characters on"):
        resolve(store, "f")   # (unique, but a slip of `pid cancel 1` must not pick whichever job ends so)
    assert resolve(store, IDS[1]) == IDS[1]
    with pytest.raises(NoSuchJob) as ambiguous:
        resolve(store, "0a672")
    assert ambiguous.value.exit_code == 2
    assert ambiguous.value.message == f"ambiguous job id 0a672: it ends {IDS[0]}, {IDS[1]} (type more of it)"
    with pytest.raises(NoSuchJob, match="no such job: 99"):
        resolve(store, "99")


def test_last_is_the_newest_job(store, tmp_path):
    assert resolve(store, "last") == IDS[-1]
    with pytest.raises(NoSuchJob, match="no job yet"):
        resolve(JobStore(str(tmp_path / "empty.db")), "last")


def test_batchdir_slash_item_is_the_item_s_current_job(store, tmp_path):
    bdir = BatchDir.create(str(tmp_path / "b"), {})
    bdir.set_order(["fix-1", "fix-2"], {})
    bdir.record_jobs([("fix-1", IDS[0]), ("fix-1", IDS[1])])   # fix-1 ran twice: its newest job
    assert resolve(store, str(tmp_path / "b" / "fix-1")) == IDS[1]
    with pytest.raises(NoSuchJob, match="item fix-2 has no job yet"):
        resolve(store, str(tmp_path / "b" / "fix-2"))
    with pytest.raises(NoSuchJob, match="no item nope"):
        resolve(store, str(tmp_path / "b" / "nope"))
    with pytest.raises(NoSuchJob, match="not a batch's output directory"):
        resolve(store, str(tmp_path / "elsewhere" / "fix-1"))


def test_a_store_made_before_the_reversed_ids_finds_its_old_jobs_by_suffix(tmp_path):
    path = str(tmp_path / "old.db")
    JobStore(path).create(spec(tmp_path, IDS[0]))
    with sqlite3.connect(path) as db:
        db.execute("UPDATE jobs SET rid = NULL")   # as an older pid left it
    assert resolve(JobStore(path), "70a672") == IDS[0]


def test_a_table_keeps_its_columns_aligned_and_within_its_width():
    columns = [Column("ID", shrink="end"), Column("COST", right=True), Column("TASK", shrink="start", min=6)]
    rows = [["20261201-000000-70a672aa11", "$0.0004", "fix the bug in the parser, then the tests"],
            ["x", "$12.50", "short"]]
    lines = render(columns, rows, 40)
    assert all(len(line) <= 40 for line in lines)
    assert lines[0].startswith("ID") and lines[0].index("COST") + 4 == lines[1].index("$0.0004") + 7
    assert lines[2].index("$12.50") + 6 == lines[1].index("$0.0004") + 7            # numbers right-aligned
    assert render(columns, rows, None)[1].endswith("then the tests")                # no width: nothing cut


def test_ids_cut_keep_their_ends_and_stay_distinct():
    ids = ["20261201-000000-70a672aa11", "20261201-000000-70a672aa12", "20261201-000000-99a672aa11"]
    lines = render([Column("ID", shrink="end"), Column("S")], [[i, "queued"] for i in ids], 12)
    shown = [line.split()[0] for line in lines[1:]]
    assert shown == ["…0a672aa11", "…0a672aa12", "…9a672aa11"]   # as short as keeps them apart (wider than 12)
    assert cut("漢字テキスト", 5, "start") == "漢字…" and cut("abcdef", 4, "end") == "…def"


def test_small_costs_are_shown_not_rounded_away():
    assert [format_cost(c) for c in (0, 0.0004, 0.000123, 0.0095, 0.01, 0.5, 12.345, None)] == \
        ["$0", "$0.00040", "$0.00012", "$0.0095", "$0.01", "$0.50", "$12.35", "-"]


def test_a_batch_job_s_spec_carries_its_batch(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    store.create_many([replace(spec(tmp_path, "20261201-000000-aaaaaa0001"), batch="b-1")])
    assert resolve(store, "0001") == "20261201-000000-aaaaaa0001"


def test_a_batch_directory_without_an_item_says_to_name_one(store, tmp_path):
    """`pid status out/` (a shell completes the directory with its slash) names the batch, not "." (issue 22)."""
    bdir = BatchDir.create(str(tmp_path / "b"), {})
    bdir.set_order(["fix-1"], {})
    for ref in (str(tmp_path / "b") + "/", str(tmp_path / "b")):
        with pytest.raises(NoSuchJob, match=r"is a batch's output directory: name one of its items \(.*/ITEM"):
            resolve(store, ref)
