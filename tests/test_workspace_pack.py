"""The workspace tar packed at submit (deterministic, bounded, links kept) and its unpacking on the worker, where it
is untrusted: hostile archives are refused and nothing lands outside the destination. Blobs: content-addressed,
checked, atomic. No Docker needed."""
from __future__ import annotations

import gc
import io
import os
import shutil
import stat
import tarfile
from pathlib import Path

import pytest

from pid.output_dirs import make_marked
from pid.sandbox.workspace import (MemberCheck, UnsafeTar, WorkspaceTooLarge, check_git_source, pack_tar, sanitize_tar,
                                   tree_size, unpack_tar)
from pid.jobs.blobs import BlobCorrupt, BlobMissing, StoreBlobs
from pid.jobs.sqlite_store import JobStore
from pid.jobs.snapshot import git_source, pack_and_store
from tests import deep_tree


def tree(root: Path) -> Path:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "m.py").write_text("x = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o4755)                          # setuid: dropped on unpack
    os.symlink("/etc/passwd", root / "abs-link")             # kept as a link, never followed
    os.symlink("src/pkg", root / "dir-link")
    os.link(root / "src" / "pkg" / "m.py", root / "hard")
    os.mkfifo(root / "fifo")                                 # not part of a workspace
    return root


def pack(root: Path, max_bytes: int = 0) -> tuple[bytes, str]:
    out = io.BytesIO()
    packed = pack_tar(str(root), out, 0, 0, max_bytes)
    assert packed.size == len(out.getvalue())
    return out.getvalue(), packed.digest


def test_the_same_tree_packs_to_the_same_bytes_and_a_change_changes_them(tmp_path):
    root = tree(tmp_path / "r")
    first, digest = pack(root)
    assert pack(root) == (first, digest)
    assert digest.startswith("sha256:") and len(digest) == 71
    names = [m.name for m in tarfile.open(fileobj=io.BytesIO(first))]
    # sorted (directories, links to them among them, then files), no fifo
    assert names == ["dir-link", "src", "abs-link", "hard", "run.sh", "src/pkg", "src/pkg/m.py"]
    (root / "src" / "pkg" / "m.py").write_text("x = 2\n")
    os.utime(root / "src" / "pkg" / "m.py", (1, 1))
    assert pack(root)[1] != digest


def test_links_are_packed_as_links_and_owners_are_fixed(tmp_path):
    data, _ = pack(tree(tmp_path / "r"))
    members = {m.name: m for m in tarfile.open(fileobj=io.BytesIO(data))}
    assert members["abs-link"].issym() and members["abs-link"].linkname == "/etc/passwd"
    assert members["dir-link"].issym() and members["dir-link"].linkname == "src/pkg"
    assert members["src/pkg/m.py"].islnk() and members["src/pkg/m.py"].linkname == "hard"
    assert {(m.uid, m.gid, m.uname, m.gname) for m in members.values()} == {(0, 0, "", "")}


@pytest.mark.parametrize("swapped", ["a", "a/b"])
def test_a_directory_swapped_for_a_link_after_its_parent_was_read_is_not_followed(tmp_path, monkeypatch, swapped):
    """A writer racing the walk: once a directory's parent was listed, the directory (or one on its way, "a" for
    "a/b") becomes a link to a tree outside the repository. Nothing of that tree is packed."""
    from pid.sandbox import workspace
    root, outside = tmp_path / "repo", tmp_path / "outside"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "mine.txt").write_text("mine\n")
    (outside / "b").mkdir(parents=True)
    (outside / "b" / "secret.txt").write_text("secret\n")
    parent = "" if swapped == "a" else "a/"
    real = workspace._pack_dir

    def racing(path, arc, *rest):
        listed = real(path, arc, *rest)
        if arc == parent:   # (the swap lands between the listing and the walk below it)
            os.rename(root / "a", tmp_path / "a.moved")
            os.symlink(outside, root / "a")
        return listed

    monkeypatch.setattr(workspace, "_pack_dir", racing)
    out = io.BytesIO()
    pack_tar(str(root), out)
    names = tarfile.open(fileobj=io.BytesIO(out.getvalue())).getnames()
    assert not [n for n in names if "secret" in n], names


def test_pids_own_output_below_the_root_is_left_out_of_the_pack_and_of_its_size(tmp_path):
    root = tree(tmp_path / "r")
    plain, digest = pack(root)
    runs = root / "pid-runs" / "20261205-1"
    runs.mkdir(parents=True)
    (runs / "session.jsonl").write_text("the earlier job's transcript\n" * 1000)
    make_marked(str(runs))                        # a job's directory (the worker's, a download's)
    batch = root / "nested" / "batch"
    batch.mkdir(parents=True)
    (batch / "batch.jsonl").write_text("{}\n" * 1000)
    make_marked(str(batch))                       # a batch's directory
    make_marked(str(batch))                       # (again: nothing changes)
    data, _ = pack(root)
    names = [m.name for m in tarfile.open(fileobj=io.BytesIO(data))]
    assert "pid-runs" in names and "nested" in names   # the directories around it are the user's
    assert not [n for n in names if n.startswith(("pid-runs/", "nested/"))], names
    assert tree_size(str(root), 1 << 30) < 100 * 1024   # (its 30 KB of transcript not counted)
    shutil.rmtree(root / "pid-runs")
    shutil.rmtree(root / "nested")
    assert pack(root)[1] == digest and plain == pack(root)[0]   # nothing else of the tree changed
    # The root itself is packed as asked, marked or not: a job's files may be the next job's workspace
    make_marked(str(root))
    assert "src/pkg/m.py" in [m.name for m in tarfile.open(fileobj=io.BytesIO(pack(root)[0]))]


def test_a_tree_over_the_limit_stops_packing(tmp_path):
    root = tmp_path / "big"
    root.mkdir()
    (root / "blob").write_bytes(os.urandom(300_000))
    with pytest.raises(WorkspaceTooLarge):
        pack(root, max_bytes=100_000)
    assert pack(root, max_bytes=400_000)[0]


@pytest.fixture(params=["filter", "member by member"])
def python(request, monkeypatch):
    """Unpacking with extraction filters (Python >= 3.11.4) and without (Debian bookworm's 3.11.2)."""
    if request.param == "member by member":
        monkeypatch.delattr(tarfile, "data_filter")
    return request.param


def test_unpack_keeps_links_and_hard_links_and_masks_modes(tmp_path, python):
    data, _ = pack(tree(tmp_path / "r"))
    dest = tmp_path / "dest"
    dest.mkdir()
    unpack_tar(io.BytesIO(data), str(dest), 1000, 1000)
    assert os.readlink(dest / "abs-link") == "/etc/passwd" and os.readlink(dest / "dir-link") == "src/pkg"
    assert (dest / "hard").read_text() == "x = 1\n" and os.stat(dest / "hard").st_nlink == 2
    assert stat.S_IMODE(os.stat(dest / "run.sh").st_mode) == 0o755
    assert {os.lstat(p).st_uid for p in dest.rglob("*")} == {1000}


def hostile(*members: tuple[str, bytes, dict]) -> bytes:
    """A tar of (name, data, TarInfo attributes) members, written as given."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, attrs in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            for key, value in attrs.items():
                setattr(info, key, value)
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out.getvalue()


SYM = {"type": tarfile.SYMTYPE}
HOSTILE = {
    "absolute path": hostile(("/tmp/pid-evil-abs", b"x", {})),
    "dot-dot": hostile(("a/../../evil", b"x", {})),
    "write through a symlink": hostile(("out", b"", {**SYM, "linkname": "{outside}"}), ("out/evil", b"x", {})),
    "write through a symlinked parent": hostile(("d", b"", {**SYM, "linkname": "{outside}"}),
                                                ("d/sub/evil", b"x", {})),
    "hard link outside": hostile(("h", b"", {"type": tarfile.LNKTYPE, "linkname": "{outside}/victim"})),
    "hard link to a symlink": hostile(("s", b"", {**SYM, "linkname": "{outside}/victim"}),
                                      ("h", b"", {"type": tarfile.LNKTYPE, "linkname": "s"})),
    "hard link with dot-dot": hostile(("h", b"", {"type": tarfile.LNKTYPE, "linkname": "../victim"})),
    "device": hostile(("dev", b"", {"type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3})),
    "fifo": hostile(("fifo", b"", {"type": tarfile.FIFOTYPE})),
    "twice": hostile(("f", b"one", {}), ("f", b"two", {})),
    "file then below it": hostile(("f", b"one", {}), ("f/g", b"two", {})),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("how", ["unpack", "sanitize"])
def test_hostile_tars_are_refused_and_nothing_lands_outside(tmp_path, case, how, python):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("victim\n")
    data = _rebuild(HOSTILE[case], str(outside))
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(UnsafeTar):
        if how == "unpack":
            unpack_tar(io.BytesIO(data), str(dest), 1000, 1000)
        else:
            sanitize_tar(io.BytesIO(data), io.BytesIO(), 1000, 1000)
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert (outside / "victim").read_text() == "victim\n" and os.stat(outside / "victim").st_nlink == 1
    assert not os.path.exists("/tmp/pid-evil-abs") and not (tmp_path / "evil").exists()


def _rebuild(data: bytes, outside: str) -> bytes:
    """The case's tar with {outside} in link targets made the test's own directory."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data)) as src, tarfile.open(fileobj=out, mode="w",
                                                                     format=tarfile.PAX_FORMAT) as dst:
        for m in src:
            m.linkname = m.linkname.replace("{outside}", outside)
            dst.addfile(m, src.extractfile(m) if m.isreg() else None)
    return out.getvalue()


def test_member_check_drops_the_root_entry_and_normalises_names():
    check = MemberCheck(5, 6)
    assert check(tarfile.TarInfo("./")) is None
    info = tarfile.TarInfo("./a//b")
    info.mode = 0o6777
    checked = check(info)
    assert (checked.name, checked.uid, checked.gid, checked.mode) == ("a/b", 5, 6, 0o777)


def test_blobs_are_content_addressed_checked_and_stored_once(tmp_path):
    blobs = StoreBlobs(JobStore(str(tmp_path / "jobs.db")))
    root = tree(tmp_path / "r")
    first = pack_and_store(str(root), blobs, 0, tmp_dir=str(tmp_path))
    second = pack_and_store(str(root), blobs, 0, tmp_dir=str(tmp_path))
    assert first == second and blobs.has(first.digest)
    stored = [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]
    assert len(stored) == 1 and stored[0].stat().st_size == first.size
    assert not list(tmp_path.glob(".pid-pack-*"))          # the packing's temporary file is gone
    with blobs.open(first.digest) as f:
        assert f.read() == pack(root)[0]
    other = tmp_path / "other"
    other.write_bytes(b"not that")
    with pytest.raises(BlobCorrupt):
        blobs.put_file(str(other), "sha256:" + "0" * 64)
    assert not blobs.has("sha256:" + "0" * 64)   # (the bytes may be kept under their own digest: still true)
    with pytest.raises(BlobMissing):
        blobs.open("sha256:" + "1" * 64)
    with pytest.raises(ValueError):
        blobs.has("sha256:../../etc/passwd")


@pytest.mark.parametrize("repo, expected", [
    ("/some/dir", None), ("relative/dir", None),
    ("https://example.com/r.git", ("https://example.com/r.git", None)),
    ("file:///srv/r.git#v1.2", ("file:///srv/r.git", "v1.2")),
    ("ssh://git@host/r.git#feature/x", ("ssh://git@host/r.git", "feature/x")),
    ("git://host/r#" + "a" * 40, ("git://host/r", "a" * 40)),
])
def test_git_urls_and_paths(repo, expected):
    got = git_source(repo)
    assert (got and (got.url, got.ref)) == expected


@pytest.mark.parametrize("url, ref", [
    ("ext::sh -c evil", None), ("ftp://host/r", None), ("file://otherhost/r", None), ("https://-oProxy/r", None),
    ("https://host/r", "-upload-pack=evil"), ("https://host/r", "a..b"), ("https://host/r", "x y"),
    ("https://host/a b", None),
    # a file:// path is mounted as written: what a check that decoded it would judge is another path
    ("file:///srv/ok/z%2F..%2F..%2Fother/..", None), ("file:///srv/ok/../other", None), ("file:///srv/./ok", None),
])
def test_bad_git_sources_are_refused(url, ref):
    with pytest.raises(ValueError):
        check_git_source(url, ref)


def test_unpack_wants_an_empty_destination(tmp_path):
    data, _ = pack(tree(tmp_path / "r"))
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(str(tmp_path), dest / "src")        # someone else's link where the tar writes: never written through
    with pytest.raises(UnsafeTar, match="is not empty"):
        unpack_tar(io.BytesIO(data), str(dest), 1000, 1000)
    assert os.listdir(dest) == ["src"] and sorted(os.listdir(tmp_path)) == ["dest", "r"]


def test_unpacking_many_directories_keeps_few_descriptors_open_and_leaks_none(tmp_path, monkeypatch):
    from pid.sandbox import workspace
    monkeypatch.setattr(workspace._Unpacker, "MAX_DIR_FDS", 3)
    root = tmp_path / "r"
    for i in range(12):
        (root / f"d{i}" / "e" / "f").mkdir(parents=True)
        (root / f"d{i}" / "e" / "f" / "x.txt").write_text(str(i))
        (root / f"d{i}" / "e").chmod(0o750)
    data, _ = pack(root)
    dest = tmp_path / "dest"
    dest.mkdir()
    gc.collect()   # an earlier test's garbage closing its files meanwhile had looked like a change (CI: 26 -> 25)
    before = set(os.listdir("/proc/self/fd"))
    unpack_tar(io.BytesIO(data), str(dest), 1000, 1000)
    after = set(os.listdir("/proc/self/fd"))
    assert not after - before and len(after) <= len(before), (before, after)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("x.txt")) == [f"d{i}/e/f/x.txt" for i in
                                                                              sorted(range(12), key=str)]
    assert (dest / "d11" / "e" / "f" / "x.txt").read_text() == "11"
    assert stat.S_IMODE(os.stat(dest / "d7" / "e").st_mode) == 0o750   # set once its content was in


@pytest.mark.parametrize("raw, expected", [
    ("a/b.txt", "a/b.txt"), ("./a//b/./c/", "a/b/c"), ("a..b/c...d", "a..b/c...d"), ("./", None), (".", None),
])
def test_member_names_are_normalised(raw, expected):
    info = tarfile.TarInfo(raw)
    checked = MemberCheck(1, 1)(info)
    assert (checked.name if checked else None) == expected


@pytest.mark.parametrize("raw", ["a/../../b", "..", "a/..", "/etc/x"])
def test_escaping_names_are_refused(raw):
    with pytest.raises(UnsafeTar):
        MemberCheck(1, 1)(tarfile.TarInfo(raw))


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT])
def test_tars_of_every_common_format_unpack(tmp_path, fmt):
    """tar's own (GNU long names), ustar's prefix field, pax records: as tarfile and tar write them."""
    long_dir = "d" * 90 + "/" + "e" * 60
    members = [(f"{long_dir}/f.txt", b"deep\n"), ("ünï.txt" if fmt != tarfile.USTAR_FORMAT else "u.txt", b"u\n"),
               ("big", os.urandom(70_000))]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1_700_000_000, 0o640
            tar.addfile(info, io.BytesIO(data))
        if fmt != tarfile.USTAR_FORMAT:
            link = tarfile.TarInfo("link")
            link.type, link.linkname = tarfile.SYMTYPE, "x" * 150
            tar.addfile(link)
    dest = tmp_path / "dest"
    dest.mkdir()
    unpack_tar(io.BytesIO(out.getvalue()), str(dest), 1000, 1000)
    for name, data in members:
        assert (dest / name).read_bytes() == data and os.stat(dest / name).st_mtime == 1_700_000_000
        assert stat.S_IMODE(os.stat(dest / name).st_mode) == 0o640
    if fmt != tarfile.USTAR_FORMAT:
        assert os.readlink(dest / "link") == "x" * 150


def _open_under(root: Path) -> list[str]:
    """This process's descriptors open on `root` or anything under it."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:   # closed meanwhile
            continue
        if target == str(root) or target.startswith(f"{root}/"):
            found.append(target)
    return found


def test_a_tree_deeper_than_pythons_recursion_limit_packs_and_unpacks(deep_tmp, monkeypatch):
    """A 1,100-level-deep repository failed with RecursionError: the packer, and the unpacker reopening a directory
    whose ancestors' descriptors it had closed, walked it one call per level. Both loop now, and the unpacker still
    keeps few descriptors open."""
    from pid.sandbox import workspace
    leaf = deep_tree.make(deep_tmp / "r")
    data, _ = pack(deep_tmp / "r")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert [m.name for m in tar][-2:] == [leaf.rpartition("/")[0], leaf]
    for max_fds in (workspace._Unpacker.MAX_DIR_FDS, 8):
        monkeypatch.setattr(workspace._Unpacker, "MAX_DIR_FDS", max_fds)
        dest = deep_tmp / f"dest{max_fds}"
        dest.mkdir()
        unpack_tar(io.BytesIO(data), str(dest), 1000, 1000)
        assert _open_under(dest) == []   # (not a count of all: other tests' threads in this process open and close)
        assert (dest / leaf).read_bytes() == b"bottom\n" and (dest / leaf).stat().st_uid == 1000


def test_a_path_longer_than_path_max_is_refused_whichever_side_meets_it(deep_tmp):
    """No path of a workspace is longer than Linux's PATH_MAX allows (4,095 bytes): it could not be opened from the
    workspace's root, and the bound is what keeps a directory's depth, and the unpacker's walk down to it, bounded."""
    deep_tree.make(deep_tmp / "r", depth=17, name="n" * 250)          # 17 x 251 bytes: 4,275
    with pytest.raises(OSError, match="longer than 4095 bytes"):
        pack(deep_tmp / "r")
    for name in ("/".join(["n" * 250] * 16) + "/" + "f" * 80, "a/" * 2048 + "f"):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.addfile(tarfile.TarInfo(name))
        dest = deep_tmp / "dest"
        dest.mkdir()
        with pytest.raises(UnsafeTar, match="at most 4095"):
            unpack_tar(io.BytesIO(out.getvalue()), str(dest), 1000, 1000)
        assert not os.listdir(dest)
        dest.rmdir()


def test_a_tree_whose_paths_pass_path_max_from_slash_is_refused_in_one_short_line(deep_tmp):
    """Its own paths are shorter than 4,095 bytes, but not from /: the walk says so, and pid run's snapshot refuses
    it as the input's fault (bad_workspace, exit 2) in a line of bounded length, not Python's 4 KB errno."""
    from pid.jobs.snapshot import DirSnapshot
    from pid.sandbox.workspace import MAX_NAME, pack_error
    from pid.sandbox_api import BadWorkspace
    depth = (MAX_NAME - len(str(deep_tmp / "r")) + 2) // 2 + 1      # "d/" per level: past 4,095 from / alone
    assert 2 * depth + 8 < MAX_NAME
    deep_tree.make(deep_tmp / "r", depth=depth)
    with pytest.raises(OSError, match="longer than Linux allows") as raised:
        pack(deep_tmp / "r")
    assert len(pack_error(raised.value)) < 300
    with pytest.raises(BadWorkspace, match="cannot pack --repo .*longer than Linux allows") as refused:
        DirSnapshot(str(deep_tmp / "r"), 0)
    assert len(str(refused.value)) < 400


def test_fifos_and_sockets_no_gitignore_ignores_are_listed_as_left_out():
    """git passes over a new FIFO or socket without a word: patch_script lists them after SPECIAL_MARK (git
    check-ignore's NUL-separated records, a counted length); those no .gitignore ignores are reported, once."""
    from pid.sandbox.workspace import SPECIAL_MARK, UNRECORDED_MARK, unrecorded
    records = (b"\0\0\0/w/new fifo\0" b".gitignore\0" b"1\0*.sock\0/w/s.sock\0" b".gitignore\0" b"2\0!keep.sock\0"
               b"/w/keep.sock\0" b"\0\0\0/w/f\0" b"\0\0\0/w/line\nbreak\0" b"\0\0\0/w/cut sho")
    special = SPECIAL_MARK.encode() + b" %d\n" % len(records) + records
    git = UNRECORDED_MARK.encode() + b"\nerror: f: can only add regular files, symbolic links or git-directories\n"
    assert unrecorded(special, "/w", 1 << 20) == [(p, "not a regular file, a link or a directory")
                                         for p in ("new fifo", "keep.sock", "f", "line\nbreak")]
    assert [path for path, _ in unrecorded(git + special, "/w", 1 << 20)] == ["f", "new fifo", "keep.sock",
                                                                             "line\nbreak"]
    cut = SPECIAL_MARK.encode() + b" 999\n" + records
    assert unrecorded(cut, "/w", 1 << 20) == []   # (not all there: none is taken)


def test_only_what_git_says_it_cannot_record_is_left_out_of_a_patch():
    """patch_script passes on git's words when `git add` left paths out; those it names (a repository with no commit,
    a FIFO) are the patch report's, and any other line fails the patch, as git's errors did before: a file name
    cannot make an error look like one of them (a name with a control character fails the patch in the container)."""
    from pid.sandbox.errors import SandboxError
    from pid.sandbox.workspace import UNRECORDED_MARK, unrecorded
    mark = UNRECORDED_MARK.encode() + b"\n"
    assert unrecorded(b"", "/w", 1 << 20) == []
    said = (b"error: f: can only add regular files, symbolic links or git-directories\n"
            b"warning: adding embedded git repository: kept\nhint: You've added another git repository\n"
            b"error: 'new crate/' does not have a commit checked out\n")
    assert [path for path, _ in unrecorded(mark + said, "/w", 1 << 20)] == ["f", "new crate"]
    for other in (b"error: unable to index file 'x'\n", b"fatal: adding files failed\n",
                  b"error: 'x' does not have a commit checked out\n", b"x" * 16001):
        with pytest.raises(SandboxError, match="making the patch failed"):
            unrecorded(mark + said + other, "/w", 1 << 20)
