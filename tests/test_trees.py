"""pid.jobs.trees.remove_tree: a host tree the agent shaped goes whatever its depth, and no link is followed."""
from __future__ import annotations

import os

from tests import deep_tree
from pid.jobs.trees import remove_tree


def test_a_tree_deeper_than_pythons_recursion_limit_is_removed(tmp_path):
    """shutil.rmtree recursed once per level: a 1,100-level-deep --file artifact raised RecursionError, which
    `ignore_errors` does not cover, out of the job's collection and of `pid batch`."""
    deep_tree.make(tmp_path / "t")
    remove_tree(str(tmp_path / "t"))
    assert not os.path.lexists(tmp_path / "t")


def test_links_are_removed_never_followed(tmp_path):
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "keep.txt").write_text("keep")
    tree = tmp_path / "t"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f").write_text("x")
    os.symlink(outside, tree / "a" / "to-dir")
    os.symlink(outside / "sub" / "keep.txt", tree / "a" / "b" / "to-file")
    remove_tree(str(tree))
    assert not os.path.lexists(tree) and (outside / "sub" / "keep.txt").read_text() == "keep"
    os.symlink(outside, tmp_path / "link")
    remove_tree(str(tmp_path / "link"))   # (a link given itself: left, as rmtree refuses one)
    assert (outside / "sub" / "keep.txt").exists()

