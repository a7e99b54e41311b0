"""pid's seccomp profile as data (its effect on a real container: tests/test_trust_boundary.py)."""
from __future__ import annotations

import json

from pid.sandbox.seccomp import ALLOWED, SECURITY_OPT, SOCKET_FAMILIES, profile


def test_sockets_are_allowed_only_by_exact_family_and_nothing_opens_a_way_around():
    rules = profile()["syscalls"]
    allowed = [rule for rule in rules if rule["action"] == "SCMP_ACT_ALLOW"]
    by_name = {name: [rule for rule in allowed if name in rule["names"]] for name in ("socket", "socketpair")}
    assert {rule["args"][0]["value"] for rule in by_name["socket"]} == set(SOCKET_FAMILIES)
    assert [rule["args"][0]["value"] for rule in by_name["socketpair"]] == [1]
    for rule in by_name["socket"] + by_name["socketpair"]:   # (a comparison by range could let high bits through)
        assert [(arg["index"], arg["op"]) for arg in rule["args"]] == [(0, "SCMP_CMP_EQ")]
    unconditional = {name for rule in allowed if not rule["args"] for name in rule["names"]}
    assert not unconditional & {"socket", "socketpair", "socketcall", "open_by_handle_at", "clone3", "unshare",
                                "setns", "mount", "bpf", "keyctl", "io_uring_setup"}
    arches = {arch for entry in profile()["archMap"] for arch in [entry["architecture"], *entry["subArchitectures"]]}
    assert "SCMP_ARCH_X86" not in arches and "SCMP_ARCH_X86_64" in arches   # (socketcall: see sandbox/seccomp.py)


def test_the_engine_gets_the_profile_with_no_new_privileges():
    assert SECURITY_OPT[0] == "no-new-privileges" and SECURITY_OPT[1].startswith("seccomp=")
    sent = json.loads(SECURITY_OPT[1].removeprefix("seccomp="))
    assert sent == profile() and sent["defaultAction"] == "SCMP_ACT_ERRNO" and len(set(ALLOWED)) == len(ALLOWED)
