"""Docker implementation of `pid.sandbox_api.Sandbox` and `pid.sandbox_lifecycle` (the runner needs only
DockerProvider): containers, the exec channel, workspace in and patch out.

Only the settings load eagerly: the job spec takes its sandbox defaults from `pid.sandbox.config`, and every `pid`
command must not pay for importing docker. The rest loads on first use.
"""
from __future__ import annotations

import importlib
from typing import Any

from .config import SandboxConfig

_LAZY = {"ensure_image": "docker_client", "DockerSandbox": "docker_sandbox",
         "DockerProvider": "docker_sandbox", "DockerUnavailable": "errors",
         "ImageNotFound": "errors", "SandboxError": "errors", "reap_expired": "reaper",
         "reap_installation": "reaper", "remove_job_containers": "reaper"}

__all__ = ["DockerProvider", "DockerSandbox", "SandboxConfig", "ImageNotFound", "DockerUnavailable", "SandboxError",
           "reap_expired", "reap_installation", "remove_job_containers", "ensure_image"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
