"""Errors of the Docker sandbox; all are `pid.sandbox.SandboxError`, so callers need only the core type."""
from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar, cast

from pid.sandbox import SandboxError

__all__ = ["SandboxError", "ImageNotFound", "DockerUnavailable", "EngineError", "engine_errors"]

F = TypeVar("F", bound=Callable[..., Any])


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


class EngineError(SandboxError):
    """The Docker engine failed a request (its own exception is the cause): callers see only SandboxError."""


def engine_errors(method: F) -> F:
    """A boundary method of the sandbox, whose Docker SDK exceptions leave it as EngineError with the same words."""
    @functools.wraps(method)
    def translating(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            import docker.errors   # (loaded already: only the Docker sandbox's methods are wrapped)
            if not isinstance(exc, docker.errors.DockerException):
                raise
            raise EngineError(str(exc) if str(exc).strip() else type(exc).__name__) from exc
    return cast(F, translating)
