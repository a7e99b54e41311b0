"""Docker implementation of `pid.sandbox.Sandbox` and `pid.sandbox_lifecycle`: containers, the exec channel,
workspace in and patch out. The runner needs only DockerProvider."""
from .config import SandboxConfig
from .docker_client import ensure_image
from .docker_sandbox import DockerProvider, DockerSandbox
from .errors import DockerUnavailable, ImageNotFound, SandboxError
from .reaper import reap_expired, reap_installation, remove_job_containers

__all__ = ["DockerProvider", "DockerSandbox", "SandboxConfig", "ImageNotFound", "DockerUnavailable", "SandboxError",
           "reap_expired", "reap_installation", "remove_job_containers", "ensure_image"]
