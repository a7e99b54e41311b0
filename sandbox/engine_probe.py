"""Is an image present? Asked of the engine's Unix socket directly, without loading the Docker SDK.

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
    path = socket_path()
    if path is None or os.environ.get("DOCKER_TLS_VERIFY"):
        return None
    connection = _UnixConnection(path)
    try:
        connection.request("GET", f"/images/{quote(image, safe='')}/json")
        response = connection.getresponse()
        if response.status != 200:
            return None
        return bool(json.loads(response.read(1 << 20)).get("Id"))
    except (OSError, http.client.HTTPException, ValueError, AttributeError):
        return None
    finally:
        connection.close()
