"""The Docker sandbox imports a workspace from a tar stream (as packed at submit; untrusted) and from a git URL
(cloned in a container of its own, at a branch, a tag or a commit). Real engine."""
from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from pid.sandbox import DockerSandbox, SandboxConfig, SandboxError
from pid.sandbox.errors import BadWorkspace
from pid.sandbox.workspace import pack_tar
from tests.conftest import IMAGE, pid_containers

pytestmark = pytest.mark.docker  # the whole module needs an engine

JOB = "test-import"


def packed(root: Path) -> io.BytesIO:
    out = io.BytesIO()
    pack_tar(str(root), out)
    out.seek(0)
    return out


def evil_tar(outside: Path) -> io.BytesIO:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        link = tarfile.TarInfo("escape")
        link.type, link.linkname = tarfile.SYMTYPE, str(outside)
        tar.addfile(link)
        evil = tarfile.TarInfo("escape/evil.txt")
        evil.size = 4
        tar.addfile(evil, io.BytesIO(b"evil"))
    out.seek(0)
    return out


def test_a_packed_tree_streams_in_with_links_kept(tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f.txt").write_text("f\n")
    os.symlink("/etc/hostname", src / "abs")
    os.symlink("d/f.txt", src / "rel")
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-tar", ttl_s=300)) as box:
        box.import_tar(packed(src))
        out = box.exec("readlink abs rel; stat -c '%n %u' d/f.txt abs; cat rel", timeout=20).tail
        assert out == b"/etc/hostname\nd/f.txt\nd/f.txt 1000\nabs 1000\nf\n"
        box.write_file("d/f.txt", b"g\n")
        dest = tmp_path / "p.diff"
        box.export_patch(str(dest), 1 << 20)
        assert b"-f\n+g\n" in dest.read_bytes() and b"abs" not in dest.read_bytes()   # the base is the tar


@pytest.mark.parametrize("after_agent", [False, True], ids=["job-disk", "engine"])
def test_a_hostile_tar_is_refused_whichever_way_it_goes_in(tmp_path, after_agent):
    outside = tmp_path / "outside"
    outside.mkdir()
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-evil", ttl_s=300)) as box:
        if after_agent:
            box.exec("true", timeout=20)   # from now on the engine unpacks (put_archive), after pid's checks
        with pytest.raises(SandboxError, match="the workspace archive was refused: escape/evil.txt: below a link"):
            box.import_tar(evil_tar(outside))
        # the import fails (and so the job): at most the members before the refused one are there, never below it
        assert box.exec("ls -A; ls -A /tmp", timeout=20).tail == (b"" if after_agent else b"escape\n")
    assert list(outside.iterdir()) == []


@pytest.fixture(scope="module")
def bare_repo(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A bare repository with main (a.txt 'two'), tag v1 (a.txt 'one') and branch feature (a.txt 'three')."""
    root = tmp_path_factory.mktemp("git")
    src = root / "src"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(src)]
    subprocess.run(["git", "init", "-q", "-b", "main", str(src)], check=True)
    commits = {}
    for name, text in (("v1", "one"), ("main", "two")):
        (src / "a.txt").write_text(text + "\n")
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", text], check=True)
        commits[name] = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                                       text=True).stdout.strip()
        if name == "v1":
            subprocess.run([*git, "tag", "v1"], check=True)
    subprocess.run([*git, "checkout", "-qb", "feature"], check=True)
    (src / "a.txt").write_text("three\n")
    subprocess.run([*git, "commit", "-qam", "three"], check=True)
    commits["feature"] = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                                        text=True).stdout.strip()
    subprocess.run([*git, "checkout", "-q", "main"], check=True)   # the default branch of the bare clone
    bare = root / "bare.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(bare)], check=True)
    return bare, commits


@pytest.mark.parametrize("ref, text", [(None, "two"), ("v1", "one"), ("feature", "three"), ("sha:v1", "one")])
def test_a_git_url_is_cloned_at_its_ref(tmp_path, bare_repo, ref, text):
    bare, commits = bare_repo
    expected = commits[ref[4:] if ref and ref.startswith("sha:") else ref or "main"]
    if ref and ref.startswith("sha:"):
        ref = expected
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-git", ttl_s=300)) as box:
        assert box.import_git(f"file://{bare}", ref) == expected
        out = box.exec("cat a.txt; git rev-parse HEAD; git status --porcelain; ls -A /; id -u", timeout=20).tail
        lines = out.decode().splitlines()
        assert lines[:2] == [text, expected]
        assert "pid-src" not in lines                 # the repository was mounted for the clone only
        box.write_file("a.txt", b"changed\n")
        dest = tmp_path / "p.diff"
        box.export_patch(str(dest), 1 << 20)
        assert f"-{text}\n+changed\n".encode() in dest.read_bytes()
    deadline = time.monotonic() + 10   # (a removal the engine reported as in progress may take a moment)
    while [c for c in pid_containers() if c.labels.get("pid.job") == JOB + "-git"]:   # the clone's is gone too
        assert time.monotonic() < deadline, "the clone's container is still there"
        time.sleep(0.2)


def test_a_clone_s_start_the_engine_fails_is_tried_again_and_a_refused_one_is_not(bare_repo, monkeypatch):
    """As a sandbox's own start (launch.START_ATTEMPTS): containerd timing out on a loaded host is a 5xx, and the
    clone's container, still only created, starts on the next try. The engine ends what was attached to it when its
    start fails (as the fake start here does): the clone attaches anew. A 4xx ends the import with the engine's words,
    the clone's container removed."""
    import re
    from pid.sandbox import launch
    from tests.conftest import failing_starts
    bare, commits = bare_repo
    monkeypatch.setattr(launch, "START_PAUSE_S", 0.01)
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-restart", ttl_s=300)) as box:
        api = box.container.client.api
        real_start, real_attach, calls, attached = api.start, api.attach, [], []
        monkeypatch.setattr(api, "attach", lambda *a, **kw: attached.append(real_attach(*a, **kw)) or attached[-1])

        def failing(times: int, status: int):   # (the engine's cleanup of a failed start ends the attached stream)
            return failing_starts(real_start, calls, times, status, on_failure=lambda: attached[-1].close())

        monkeypatch.setattr(api, "start", failing(1, 500))
        assert box.import_git(f"file://{bare}", "v1") == commits["v1"] and (len(calls), len(attached)) == (2, 2)
        assert box.exec("cat a.txt", timeout=20).tail == b"one\n"
        calls.clear()
        monkeypatch.setattr(api, "start", failing(1, 400))
        with pytest.raises(SandboxError, match=f"cannot start the clone of {re.escape(f'file://{bare}')}: "
                                               ".*context deadline"):
            box.import_git(f"file://{bare}", "v1")
        assert len(calls) == 1
        clones = [c for c in pid_containers() if c.labels.get("pid.job") == JOB + "-restart"]
        assert [c.id for c in clones] == [box.container.id], "the clone's container stayed"


def test_a_git_ref_that_does_not_exist_is_a_clear_error(bare_repo):
    bare, _ = bare_repo
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-noref", ttl_s=300)) as box:
        with pytest.raises(BadWorkspace, match=f"cannot clone file://{bare} at nope: no branch, tag or commit "
                                               f"named nope"):
            box.import_git(f"file://{bare}", "nope")


def test_a_commit_id_is_that_commit_never_a_branch_named_so(tmp_path):
    """A repository that no longer has the commit a job pins (a retry's, a continuation's) but has a branch named by
    its id: git reads a full id as the commit, and so does pid (its fallback clone took the branch, and the job ran
    on another tree: an attack review's)."""
    src = tmp_path / "src"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(src)]
    subprocess.run(["git", "init", "-q", "-b", "main", str(src)], check=True)
    (src / "f").write_text("good\n")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "good"], check=True)
    pinned = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run([*git, "checkout", "-q", "--orphan", "evil"], check=True)
    (src / "f").write_text("EVIL\n")
    subprocess.run([*git, "commit", "-qam", "evil"], check=True)
    subprocess.run([*git, "branch", "-m", "evil", pinned], check=True)
    subprocess.run([*git, "checkout", "-q", "--orphan", "main2"], check=True)
    subprocess.run([*git, "commit", "-qm", "rewritten"], check=True)
    subprocess.run([*git, "branch", "-D", "main"], check=True, capture_output=True)
    subprocess.run([*git, "reflog", "expire", "--expire=now", "--all"], check=True)
    subprocess.run([*git, "gc", "-q", "--prune=now"], check=True)
    assert subprocess.run([*git, "cat-file", "-e", pinned]).returncode != 0   # (the commit is gone)
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-sha", ttl_s=300)) as box:
        with pytest.raises(BadWorkspace, match=f"no branch, tag or commit named {pinned}"):
            box.import_git(f"file://{src}", pinned)


def tricky_tree(root: Path, nested_repo: bool) -> Path:
    """What `git add -A` treats with care: ignore rules (nested, negated, directories), modes, links, odd names, the
    workspace's own .git, long names; with `nested_repo`, a repository inside it (git adds that its own way)."""
    (root / "build" / "deep").mkdir(parents=True)
    (root / "sub" / "d").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".gitignore").write_text("*.log\nbuild/\n!keep.log\n")
    (root / "sub" / ".gitignore").write_text("secret*\n")
    for name, text in {"a.log": "ignored", "keep.log": "kept", "build/deep/out.o": "ignored",
                       "sub/secret.txt": "ignored", "sub/ok.txt": "ok", "sub/d/x": "", "we*ird[1].txt": "glob",
                       "ünï cödé.txt": "utf-8", "l" * 120: "long name", "same1": "dup", "same2": "dup"}.items():
        (root / name).write_text(text)
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    os.symlink("sub/ok.txt", root / "link")
    os.symlink("/etc/hostname", root / "abs")
    os.link(root / "sub" / "ok.txt", root / "hard")
    if nested_repo:
        subprocess.run(["git", "init", "-q", str(root / "vendored")], check=True)
        (root / "vendored" / "v.txt").write_text("v\n")
        subprocess.run(["git", "-C", str(root / "vendored"), "-c", "user.name=t", "-c", "user.email=t@t", "add", "."],
                       check=True)
        subprocess.run(["git", "-C", str(root / "vendored"), "-c", "user.name=t", "-c", "user.email=t@t", "commit",
                        "-qm", "v"], check=True)
    return root


PID_GIT = "export GIT_DIR=/.pid/git GIT_WORK_TREE=/workspace HOME=/.pid GIT_CONFIG_GLOBAL=/.pid/gitconfig\n"


@pytest.mark.parametrize("nested_repo", [False, True], ids=["seeded", "git-fallback"])
def test_the_base_written_while_unpacking_is_the_one_git_makes(tmp_path, nested_repo):
    src = tricky_tree(tmp_path / "src", nested_repo)
    trees = {}
    # no job disk: the engine unpacks and git adds everything, as before the seed; a root agent's base is written
    # whole before it starts (it could reach pid's repository); another's blobs follow in the background
    for disk, user in ((0, "1000"), (1 << 30, "root"), (1 << 30, "1000")):
        config = SandboxConfig(image=IMAGE, job_id=JOB + "-seed", ttl_s=300, disk=disk, user=user)
        with DockerSandbox.create(config) as box:
            box.import_tar(packed(src))
            assert (box.workspace._packing is not None) == (disk > 0 and user != "root" and not nested_repo)
            box.workspace.wait_for_base()
            in_pack = box.run_as_pid(PID_GIT + "git count-objects -v | grep in-pack", "count").decode().split()[1]
            assert (in_pack != "0") == (disk > 0 and not nested_repo)   # seeded: the blobs came in one pack
            trees[disk, user] = box.run_as_pid(PID_GIT + "git rev-parse HEAD^{tree}; git ls-files -s | sort; "
                                               "git status --porcelain --ignored=no; git fsck --no-progress "
                                               "--no-dangling 2>&1", "inspect").decode()
            if disk and user != "root":
                box.write_file("sub/ok.txt", b"changed\n")
                box.exec("rm we*; echo new > keep.log; echo x > more.log", timeout=20)
                dest = tmp_path / "p.diff"
                box.export_patch(str(dest), 1 << 20)
                files = sorted(line.split(" b/")[-1] for line in dest.read_text().splitlines()
                               if line.startswith("diff --git"))
                assert files == ["hard", "keep.log", "sub/ok.txt", "we*ird[1].txt"]   # (hard: the same inode)
    assert trees[0, "1000"] == trees[1 << 30, "root"] == trees[1 << 30, "1000"]
    listed = trees[0, "1000"]
    assert "keep.log" in listed and "sub/secret.txt" not in listed and "a.log" not in listed
    assert "build/" not in listed and ".git/HEAD" not in listed and "100755" in listed and "120000" in listed


@pytest.mark.parametrize("disk", [0, 1 << 30], ids=["git-add", "seeded"])
def test_a_file_the_repository_tracks_though_its_gitignore_matches_it_is_in_the_patch(tmp_path, disk):
    """A CI user's: a committed dist/ that .gitignore also lists (git add -f) was left out of the base, and the
    agent's change to it out of the patch, without a word. It is the project's file, as git itself says; bytecode
    stays out even when tracked. What pid leaves out as generated (node_modules/) is left out when new only: a file
    the workspace had is diffed, as docs/endings.md said (it was not)."""
    src = tmp_path / "src"
    (src / "dist").mkdir(parents=True)
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / ".gitignore").write_text("dist/\n*.pyc\n")
    (src / "dist" / "index.js").write_text("old build\n")
    (src / "dist" / "gone.js").write_text("deleted before the job\n")
    (src / "dist" / "was-a-file.js").write_text("a file when committed\n")
    (src / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\x00old")
    (src / "main.py").write_text("print(1)\n")
    (src / "node_modules").mkdir()
    (src / "node_modules" / "had.js").write_text("vendored\n")   # (not ignored, nor committed: the workspace's)
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(src)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "add", "-f", "dist", "pkg"], check=True)
    subprocess.run([*git, "commit", "-qm", "with a committed build"], check=True)
    (src / "dist" / "gone.js").unlink()   # (tracked, missing from the tree: nothing to keep)
    (src / "dist" / "was-a-file.js").unlink()   # (tracked, a directory now: update-index refuses it, not the rest)
    (src / "dist" / "was-a-file.js").mkdir()
    (src / "dist" / "was-a-file.js" / "inner.js").write_text("x\n")
    (src / "dist" / "untracked.js").write_text("never committed\n")
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-tracked", ttl_s=300, disk=disk)) as box:
        box.import_tar(packed(src))
        box.workspace.wait_for_base()
        box.exec("echo new build > dist/index.js; echo 2 > main.py; echo forged > pkg/__pycache__/m.cpython-311.pyc;"
                 " echo changed > dist/untracked.js; echo patched > node_modules/had.js; echo x > node_modules/new.js",
                 timeout=20)
        dest = tmp_path / "p.diff"
        box.export_patch(str(dest), 1 << 20)
    patch = dest.read_text()
    files = sorted(line.split(" b/")[-1] for line in patch.splitlines() if line.startswith("diff --git"))
    assert files == ["dist/index.js", "main.py", "node_modules/had.js"], patch   # (a generated file: when new)
    assert "-old build\n+new build" in patch   # (the base had the workspace's file, not another's)


@pytest.mark.parametrize("disk", [0, 1 << 30], ids=["git-add", "seeded"])
def test_ignored_files_whose_paths_are_also_the_containers_own_do_not_fail_the_base(tmp_path, disk):
    """An attacker's find: an ignored etc/hostname failed the base ("staged content different from both the file and
    the HEAD"): `git rm --cached` compared it with /etc/hostname, looked up from the current directory."""
    src = tmp_path / "src"
    (src / "etc").mkdir(parents=True)
    (src / ".gitignore").write_text("etc/\n")
    (src / "etc" / "hostname").write_text("not the container's\n")
    (src / "etc" / "passwd").write_text("nor this\n")
    (src / "a.txt").write_text("a\n")
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-etc", ttl_s=300, disk=disk)) as box:
        box.import_tar(packed(src))
        box.workspace.wait_for_base()
        box.exec("echo b > a.txt", timeout=20)
        dest = tmp_path / "p.diff"
        box.export_patch(str(dest), 1 << 20)
    assert [line for line in dest.read_text().splitlines() if line.startswith("diff --git")] == \
        ["diff --git a/a.txt b/a.txt"]


@pytest.mark.parametrize("ref", [None, "main"])
def test_a_clone_larger_than_the_workspace_limit_fails_clearly_and_leaves_no_container(tmp_path, ref):
    src = tmp_path / "big"
    subprocess.run(["git", "init", "-q", "-b", "main", str(src)], check=True)
    (src / "noise.bin").write_bytes(os.urandom(3 << 20))   # incompressible: 3 MiB in .git and 3 MiB checked out
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "big"], check=True)
    config = SandboxConfig(image=IMAGE, job_id=JOB + "-big", ttl_s=300, max_workspace=2 << 20)
    with DockerSandbox.create(config) as box:
        with pytest.raises(SandboxError, match=r"cannot clone file://\S+( at main)?: the clone is larger than the "
                                               r"workspace limit of 2 MiB \(raise --max-workspace"):
            box.import_git(f"file://{src}", ref)
        assert [c.labels.get("pid.job") for c in pid_containers()].count(JOB + "-big") == 1   # the job's own only
    assert not [c for c in pid_containers() if c.labels.get("pid.job") == JOB + "-big"]
    with DockerSandbox.create(dataclasses.replace(config, max_workspace=16 << 20)) as box:   # under the limit: fine
        created = []
        real = box.container.client.api.create_container
        box.container.client.api.create_container = lambda *a, **kw: created.append(kw["host_config"]) or real(*a, **kw)
        box.import_git(f"file://{src}", ref)
        assert box.exec("stat -c %s noise.bin", timeout=20).tail == b"3145728\n"
    assert created[0]["ReadonlyRootfs"] is True and created[0]["Tmpfs"] == {
        "/tmp": f"rw,nosuid,nodev,noexec,size={16 << 20},mode=1777"}


def test_a_tar_given_at_create_is_unpacked_while_the_container_starts(tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f.txt").write_text("f\n")
    stream = packed(src)
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-early", ttl_s=300), workspace=stream) as box:
        assert box.exec("cat d/f.txt", timeout=20).tail == b"f\n"   # there before import_tar
        box.import_tar(stream)                                      # only the base is left to record
        box.write_file("d/f.txt", b"g\n")
        dest = tmp_path / "p.diff"
        box.export_patch(str(dest), 1 << 20)
        assert b"-f\n+g\n" in dest.read_bytes()
    outside = tmp_path / "outside"
    outside.mkdir()
    with pytest.raises(SandboxError, match="the workspace archive was refused: escape/evil.txt: below a link"):
        DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-early", ttl_s=300),
                             workspace=evil_tar(outside))
    assert list(outside.iterdir()) == []
    assert not [c for c in pid_containers() if c.labels.get("pid.job") == JOB + "-early"]


def test_if_the_base_blobs_cannot_be_written_the_patch_fails_clearly(tmp_path, monkeypatch):
    from pid.sandbox.gitseed import GitSeed

    def broken(self, stream):
        raise OSError("disk full")
    monkeypatch.setattr(GitSeed, "fill", broken)
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.txt").write_text("f\n")
    with DockerSandbox.create(SandboxConfig(image=IMAGE, job_id=JOB + "-nofill", ttl_s=300)) as box:
        box.import_tar(packed(src))
        box.write_file("f.txt", b"g\n")
        with pytest.raises(SandboxError, match="cannot write the base commit's objects: disk full"):
            box.export_patch(str(tmp_path / "p.diff"), 1 << 20)
