"""Errors of the Docker sandbox; all are `pid.sandbox_api.SandboxError`, so callers need only the core type."""
from __future__ import annotations

from pid.sandbox_api import BadWorkspace, SandboxError

__all__ = ["SandboxError", "BadWorkspace", "ImageNotFound", "DockerUnavailable"]


class ImageNotFound(SandboxError):
    """The sandbox image is not present locally (nothing is ever pulled)."""

    def __init__(self, image: str) -> None:
        super().__init__(
            f"sandbox image {image!r} not found in the local Docker engine; build it with "
            f"`docker/build-offline.sh {image}` (pid never pulls images)")
        self.image = image


class DockerUnavailable(SandboxError):
    """The Docker engine cannot be reached."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"cannot reach the Docker engine ({detail}); is dockerd running and is DOCKER_HOST / "
            f"/var/run/docker.sock accessible to this user?")
