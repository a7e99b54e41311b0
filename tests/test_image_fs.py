"""The pieces of a task image's writable filesystem that need no engine: which layer directories make up a tree (as
overlayfs merges them), which workdirs pid refuses, the idmapping, and the image variables kept from pid's
processes. (The mounts themselves, and what the agent can do through them: tests/test_task_images.py.)"""
from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from pid.sandbox.image_env import CARRIER, neutralised
from pid.sandbox.image_fs import ImageFSError, reached_by_pid, check_workdir, subtree_lowers
from pid.sandbox.mounts import swap_map


def _layers(tmp_path, *names: str) -> list[str]:
    paths = []
    for name in names:
        (tmp_path / name).mkdir()
        paths.append(str(tmp_path / name))
    return paths


def test_a_tree_is_every_layer_s_directory_top_first(tmp_path):
    top, middle, bottom = _layers(tmp_path, "top", "middle", "bottom")
    for layer in (top, bottom):
        os.makedirs(os.path.join(layer, "srv", "app"))
    assert subtree_lowers([top, middle, bottom], "/srv/app") == [f"{top}/srv/app", f"{bottom}/srv/app"]
    assert subtree_lowers([top, middle, bottom], "/nowhere") == []


@pytest.mark.skipif(os.geteuid() != 0, reason="whiteouts and trusted xattrs need root")
def test_a_whiteout_or_an_opaque_directory_hides_the_layers_below(tmp_path):
    top, middle, bottom = _layers(tmp_path, "top", "middle", "bottom")
    for layer in (top, middle, bottom):
        os.makedirs(os.path.join(layer, "srv", "app"))
    os.setxattr(os.path.join(middle, "srv"), "trusted.overlay.opaque", b"y")   # an ancestor made opaque
    assert subtree_lowers([top, middle, bottom], "/srv/app") == [f"{top}/srv/app", f"{middle}/srv/app"]
    os.rmdir(os.path.join(middle, "srv", "app"))
    os.mknod(os.path.join(middle, "srv", "app"), 0o600 | 0o020000, os.makedev(0, 0))   # a whiteout
    os.removexattr(os.path.join(middle, "srv"), "trusted.overlay.opaque")
    assert subtree_lowers([top, middle, bottom], "/srv/app") == [f"{top}/srv/app"]


def test_a_tree_reached_through_a_link_or_a_file_is_refused(tmp_path):
    top, bottom = _layers(tmp_path, "top", "bottom")
    os.makedirs(os.path.join(bottom, "usr", "bin"))
    os.symlink("/usr/bin", os.path.join(top, "srv"))
    with pytest.raises(ImageFSError, match="/srv/app is not a directory in the image"):
        subtree_lowers([top, bottom], "/srv/app")
    (tmp_path / "top" / "file").write_text("x")
    with pytest.raises(ImageFSError, match="is not a directory"):
        subtree_lowers([top, bottom], "/file")


@pytest.mark.parametrize("path, kept", [("/testbed", "/testbed"), ("/srv//app/../app2", "/srv/app2"),
                                        ("/usr/local/app", "/usr/local/app"), ("/var/www", "/var/www"),
                                        ("/usr/share/nginx/html", "/usr/share/nginx/html"),
                                        ("/opt/x", "/opt/x")])
def test_a_workdir_of_the_agent_s_is_kept_normalised(path, kept):
    assert check_workdir(path) == kept


@pytest.mark.parametrize("path", ["/", "/usr", "/usr/bin", "/usr/lib/x", "/usr/local", "/usr/local/lib", "/etc",
                                  "/lib64/x", "/bin", "/var",
                                  "/var/tmp/x", "/tmp", "/home", "/home/agent", "/.pid/x", "/proc/1", "/run/x",
                                  "relative", "/a\nb"])
def test_a_workdir_in_or_over_the_system_pid_s_or_the_kernel_s_is_refused(path):
    with pytest.raises(ValueError):
        check_workdir(path)


@pytest.mark.parametrize("owner", [0, 1, 999, 1234, 1001])
def test_the_idmapping_swaps_the_owner_and_the_agent_and_keeps_every_other_id(owner):
    lines = [tuple(map(int, line.split())) for line in swap_map(1000, owner).splitlines()]
    assert lines[:2] == [(owner, 1000, 1), (1000, owner, 1)]
    inside = sorted((start, start + count) for start, _, count in lines)
    assert inside[0][0] == 0 and inside[-1][1] == (1 << 32) - 1
    assert all(a_end == b_start for (_, a_end), (b_start, _) in zip(inside, inside[1:]))   # no gap, no overlap
    assert all(start == outside for start, outside, _ in lines[2:])
    assert swap_map(1000) == swap_map(1000, 0)
    assert swap_map(1000, 1000) == f"0 0 {(1 << 32) - 1}\n"   # (the agent's own: every id to itself)
    with pytest.raises(ValueError):
        swap_map(-1)


def test_the_image_s_loader_and_shell_variables_are_emptied_and_carried():
    env = {"PATH": "/opt/env/bin:/usr/bin", "LD_LIBRARY_PATH": "/opt/lib", "BASH_ENV": "/opt/env.sh",
           "BASH_FUNC_ls%%": "() { evil; }", "CONDA_PREFIX": "/opt/env", "LD_PRELOAD": "/opt/a b.so"}
    added = neutralised(env)
    assert {k: v for k, v in added.items() if k != CARRIER} == {
        "LD_LIBRARY_PATH": "", "BASH_ENV": "", "BASH_FUNC_ls%%": "", "LD_PRELOAD": ""}
    assert neutralised({"PATH": "/usr/bin", "CONDA_PREFIX": "/opt/env"}) == {}
    odd = neutralised({"SHELLOPTS": "xtrace", "LD_\u00e9": "x", "LD_AUDIT": "/opt/a.so"})   # read-only, unexportable
    assert odd["SHELLOPTS"] == odd["LD_\u00e9"] == "" and odd[CARRIER] == "export LD_AUDIT=/opt/a.so\n"
    # the carrier, evaluated by a shell, gives back exactly the image's values (an exported function never)
    shown = subprocess.run(["bash", "-c", 'eval "$C"; printf "%s|" "$LD_LIBRARY_PATH" "$BASH_ENV" "$LD_PRELOAD"; '
                            'declare -F ls || echo no-function'], env={"C": added[CARRIER]},
                           capture_output=True, text=True, timeout=10).stdout
    assert shown == "/opt/lib|/opt/env.sh|/opt/a b.so|no-function\n", shlex.quote(shown)


def test_a_tree_a_tool_of_pids_reaches_through_any_chain_of_links_is_pids(tmp_path):
    """What pid runs as root (here `wc`) is followed through every link: Debian's alternatives add a second one, which
    could lead into a tree the agent may write. A chain that does not end counts as reaching every tree."""
    top, bottom = _layers(tmp_path, "top", "bottom")
    trees = ["/usr/local/bin", "/opt"]
    for layer, directory in ((top, "usr/bin"), (bottom, "usr/bin"), (bottom, "etc/alternatives"),
                             (bottom, "usr/local/bin")):
        os.makedirs(os.path.join(layer, directory), exist_ok=True)
    os.symlink("usr/bin", os.path.join(bottom, "bin"))   # a merged /usr
    os.symlink("/etc/alternatives/awk", os.path.join(bottom, "usr", "bin", "awk"))
    os.symlink("/usr/bin/mawk", os.path.join(bottom, "etc", "alternatives", "awk"))
    assert reached_by_pid([top, bottom], trees) == set()
    os.symlink("/etc/alternatives/wc", os.path.join(top, "usr", "bin", "wc"))
    os.symlink("../../usr/local/bin/wc", os.path.join(bottom, "etc", "alternatives", "wc"))
    assert reached_by_pid([top, bottom], trees) == {"/usr/local/bin"}
    os.remove(os.path.join(top, "usr", "bin", "wc"))
    os.symlink("/opt", os.path.join(bottom, "usr", "tools"))
    os.symlink("/usr/tools/grep", os.path.join(top, "usr", "bin", "grep"))   # through a directory's link
    assert reached_by_pid([top, bottom], trees) == {"/opt"}
    os.remove(os.path.join(top, "usr", "bin", "grep"))
    os.symlink("/etc/../usr/local/bin/x/../../../bin/mawk", os.path.join(top, "usr", "bin", "sed"))   # through, out
    os.makedirs(os.path.join(bottom, "usr", "local", "bin", "x"))
    assert reached_by_pid([top, bottom], trees) == {"/usr/local/bin"}
    os.remove(os.path.join(top, "usr", "bin", "sed"))
    os.symlink("/etc/alternatives/tar", os.path.join(top, "usr", "bin", "tar"))
    os.symlink("/usr/bin/tar", os.path.join(bottom, "etc", "alternatives", "tar"))   # a loop
    assert reached_by_pid([top, bottom], trees) == set(trees)
