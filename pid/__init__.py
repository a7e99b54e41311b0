"""pid runs LLM coding agents in Docker sandboxes. Its Python API (pid/api.py, docs/api.md): submit, run, batch,
job, Job, and PidError for a bad value. Importing pid loads none of Celery, Docker's SDK or the worker."""
from pid.api import Job, batch, job, run, submit
from pid.errors import PidError

__all__ = ["Job", "PidError", "batch", "job", "run", "submit"]
