"""Errors of the Docker sandbox; all are `pid.sandbox_api.SandboxError`, so callers need only the core type."""
from __future__ import annotations

from pid.sandbox_api import BadWorkspace, SandboxError

from .config import DEFAULT_IMAGE

__all__ = ["SandboxError", "BadWorkspace", "ImageNotFound", "DockerUnavailable"]


class ImageNotFound(SandboxError):
    """The sandbox image is not present locally (nothing is ever pulled)."""

    def __init__(self, image: str) -> None:
        # pid's own image can be built here; another (a task's environment, which holds its repository) is to be
        # loaded or built as it was made: the script would make a plain Debian image under its name
        how = ("build it with `docker/build-offline.sh`" if image == DEFAULT_IMAGE else
               "load it (`docker load`) or build it on this machine")
        super().__init__(f"sandbox image {image!r} not found in the local Docker engine; {how} (pid never pulls "
                         "images)")
        self.image = image


class DockerUnavailable(SandboxError):
    """The Docker engine cannot be reached."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"cannot reach the Docker engine ({detail}); is dockerd running and is DOCKER_HOST / "
            f"/var/run/docker.sock accessible to this user?")
