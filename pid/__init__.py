"""pid runs LLM coding agents in Docker sandboxes. Its Python API (pid/api.py, docs/api.md): submit, run, job, Job,
and PidError for a bad value. Importing pid loads none of Celery, Docker's SDK or the worker."""
from pid.api import Job, job, run, submit
from pid.errors import PidError

__all__ = ["Job", "PidError", "job", "run", "submit"]
