"""Getting a Docker client, with errors that tell the user what to do."""
from __future__ import annotations

from typing import Any

import docker
import docker.errors

from .errors import DockerUnavailable, ImageNotFound


def connect(client: docker.DockerClient | None = None) -> docker.DockerClient:
    """The given client, or one from the environment; DockerUnavailable when the engine does not answer."""
    try:
        client = client or docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise DockerUnavailable(str(exc)) from exc
    except Exception as exc:   # requests/urllib3 connection errors
        raise DockerUnavailable(str(exc)) from exc
    return client


def ensure_image(image: str, client: docker.DockerClient | None = None) -> dict[str, Any]:
    """The image's inspect (its id, ENV, layers); ImageNotFound unless it is present locally (pid never pulls)."""
    client = connect(client)
    try:
        return dict(client.images.get(image).attrs)
    except docker.errors.ImageNotFound as exc:
        raise ImageNotFound(image) from exc
    except docker.errors.APIError as exc:
        if exc.status_code == 404:
            raise ImageNotFound(image) from exc
        raise DockerUnavailable(str(exc)) from exc
