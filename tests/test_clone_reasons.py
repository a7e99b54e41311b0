"""Why a clone failed, as the job's error says it (sandbox/clone.py `_last`): the script's reason and git's line."""
from __future__ import annotations

from pid.sandbox.clone import _last


def test_a_failed_clone_says_gits_reason_once_not_cannot_clone_twice():
    """A new user's: "cannot clone https://…/x.git: cannot clone; fatal: …" said it twice."""
    lines = ["pid-clone-error cannot clone", "fatal: unable to access 'https://nonexistent.invalid/x.git/': "
             "Could not resolve host: nonexistent.invalid"]
    assert _last(lines) == lines[1]
    assert _last(["pid-clone-error cannot check out v1", "error: pathspec 'v1' did not match"]) == \
        "cannot check out v1; error: pathspec 'v1' did not match"
    assert _last(["pid-clone-error cannot clone"]) == ""   # (the caller then names the exit status)
