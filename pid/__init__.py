"""pid runs LLM coding agents in Docker sandboxes. Its Python API (pid/api.py, docs/api.md): submit, run, batch,
submit_batch, open_batch, Batch, job, Job, and PidError for a bad value. Importing pid loads none of Celery, Docker's
SDK or the worker."""
from pid.api import Batch, Job, batch, job, open_batch, run, submit, submit_batch
from pid.errors import PidError

__all__ = ["Batch", "Job", "PidError", "batch", "job", "open_batch", "run", "submit", "submit_batch"]
