"""Docker implementation of `pid.sandbox.Sandbox`: containers, the exec channel, workspace in and patch out."""
from .config import SandboxConfig
from .docker_client import ensure_image
from .docker_sandbox import DockerSandbox
from .errors import DockerUnavailable, ImageNotFound, SandboxError
from .reaper import reap_expired, reap_installation, remove_job_containers

__all__ = ["DockerSandbox", "SandboxConfig", "ImageNotFound", "DockerUnavailable", "SandboxError",
           "reap_expired", "reap_installation", "remove_job_containers", "ensure_image"]
