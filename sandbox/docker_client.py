"""Getting a Docker client, with errors that tell the user what to do; the engine's errors translated."""
from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator, ParamSpec, TypeVar

import docker
import docker.errors
import requests.exceptions

from .errors import DockerUnavailable, ImageNotFound, SandboxError


_api_versions: dict[str, str] = {}   # the engine's API version by DOCKER_HOST, negotiated once per process


def connect(client: docker.DockerClient | None = None) -> docker.DockerClient:
    """The given client, or one from the environment; DockerUnavailable when the engine does not answer. The API
    version is negotiated with the first client of each engine, not with every client (one per sandbox): to answer
    /version the engine runs `runc --version` and `docker-init --version` (~14 ms of its time, while a burst of jobs
    waits on it), where a ping costs it ~1 ms."""
    try:
        if client is None:
            host = os.environ.get("DOCKER_HOST", "")
            known = _api_versions.get(host)
            client = docker.from_env(version=known or "auto")
            if known is None:   # (negotiated: the engine answered)
                _api_versions[host] = str(client.api.api_version)
                return client
        client.ping()
    except docker.errors.DockerException as exc:
        raise DockerUnavailable(str(exc)) from exc
    except Exception as exc:   # requests/urllib3 connection errors
        raise DockerUnavailable(str(exc)) from exc
    return client


@contextmanager
def connected(client: docker.DockerClient | None = None) -> Iterator[docker.DockerClient]:
    """connect(client) for the block; a client made here is closed after it. Its connections to the engine go then,
    not at some later garbage collection: a worker that made one per job held hundreds open, the engine with it."""
    made = connect(client)
    try:
        yield made
    finally:
        if client is None:
            made.close()


def ensure_image(image: str, client: docker.DockerClient | None = None) -> dict[str, Any]:
    """The image's inspect (its id, ENV, layers); ImageNotFound unless it is present locally (pid never pulls)."""
    if client is None:
        with connected() as made:
            return ensure_image(image, made)
    try:   # (a client given was connected moments ago: the request below says if it is not)
        return dict(client.images.get(image).attrs)
    except docker.errors.ImageNotFound as exc:
        raise ImageNotFound(image) from exc
    except docker.errors.APIError as exc:
        if exc.status_code == 404:
            raise ImageNotFound(image) from exc
        raise DockerUnavailable(str(exc)) from exc
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise DockerUnavailable(str(exc)) from exc


P = ParamSpec("P")
R = TypeVar("R")


def engine_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """The Docker SDK's errors (and its transport's) become SandboxError at the sandbox's boundary: its callers
    know only pid.sandbox_api's errors."""
    @functools.wraps(fn)
    def translated(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise SandboxError(f"the Docker engine failed: {exc}") from exc
    return translated
