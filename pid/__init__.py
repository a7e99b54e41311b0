"""pid runs LLM coding agents in Docker sandboxes. Its Python API (pid/api.py, docs/api.md): submit, run, batch,
submit_batch, open_batch, Batch, job, list_jobs, Job, and PidError for a bad value. They load when first used:
`import pid` (which every `pid.*` import runs) imports nothing at all, so that `pid`'s own start, and a Ctrl-C during
it, stay its command line's (pid/cli/__init__.py sets that handler first)."""
from __future__ import annotations

MYPY = False   # (mypy reads it as true: typing.TYPE_CHECKING without importing typing)
if MYPY:
    from typing import Any

    from pid.api import Batch, Job, batch, job, list_jobs, open_batch, run, submit, submit_batch
    from pid.errors import PidError

__all__ = ["Batch", "Job", "PidError", "batch", "job", "list_jobs", "open_batch", "run", "submit", "submit_batch"]


def __getattr__(name: str) -> Any:
    if name == "PidError":
        from pid.errors import PidError
        return PidError
    if name in __all__:
        from pid import api
        return getattr(api, name)
    raise AttributeError(f"module 'pid' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The API's names, though they load when first used (dir(pid), a REPL's completion), and the module's own
    dunders and subpackages already imported; not the helpers of this file (MYPY, annotations)."""
    return sorted({*__all__, *(name for name, value in globals().items()
                               if name.startswith("__") or type(value).__name__ == "module")})
