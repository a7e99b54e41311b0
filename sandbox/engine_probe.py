"""Is an image present, how many CPUs has the engine? Asked of its Unix socket directly, without loading the Docker
SDK.

Why: `pid submit` checks the sandbox image on the embedded broker; importing the SDK for that one question costs
~0.25 s of the submit. Only a yes is trusted here: anything else (another DOCKER_HOST, no socket, a 404, an odd
answer) returns None and the caller asks through the SDK, which gives the proper error.
"""
from __future__ import annotations

import http.client
import json
import os
import socket
from urllib.parse import quote

DEFAULT_SOCKET = "/var/run/docker.sock"
TIMEOUT_S = 5.0


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=TIMEOUT_S)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(TIMEOUT_S)
        sock.connect(self.path)
        self.sock = sock


def socket_path() -> str | None:
    """The engine's Unix socket per DOCKER_HOST (the default one when unset); None for any other transport."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host:
        return DEFAULT_SOCKET
    return host[len("unix://"):] if host.startswith("unix://") else None


def image_present(image: str) -> bool | None:
    """True when the engine says `image` is there; None when it did not say so (ask the SDK)."""
    found = _get(f"/images/{quote(image, safe='')}/json")
    return True if found is not None and found.get("Id") else None


def engine_cpus() -> int | None:
    """The CPUs the engine has (its /info's NCPU: what it checks --cpus against); None when it did not say."""
    info = _get("/info")
    cpus = info.get("NCPU") if info is not None else None
    return cpus if isinstance(cpus, int) and not isinstance(cpus, bool) and cpus > 0 else None


def _get(what: str) -> dict | None:
    """The engine's JSON answer to GET `what` over its Unix socket; None for anything but a 200 and an object."""
    path = socket_path()
    if path is None or os.environ.get("DOCKER_TLS_VERIFY"):
        return None
    connection = _UnixConnection(path)
    try:
        connection.request("GET", what)
        response = connection.getresponse()
        if response.status != 200:
            return None
        found = json.loads(response.read(1 << 20))
        return found if isinstance(found, dict) else None
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        connection.close()
