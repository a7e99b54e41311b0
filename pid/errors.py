"""PidError: the one exception pid's Python API raises for a bad value or a request it cannot honour (pid/api.py).

Its message is the one line the `pid` command prints after `pid: error:` for the same mistake: the checks live once
(pid/jobs/submission.py) and both the API and the CLI raise through them. A ValueError, since that is what it is.
"""
from __future__ import annotations


class PidError(ValueError):
    """A bad option value, a missing model or workspace, a job that does not exist or takes no more messages…"""
