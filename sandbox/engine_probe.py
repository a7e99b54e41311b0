"""Is an image present, how many CPUs has the engine? Asked of its Unix socket directly, without loading the Docker
SDK.

Why: `pid submit` checks the sandbox image on the embedded broker; importing the SDK for that one question costs
~0.25 s of the submit. Only a yes is trusted here: anything else (another DOCKER_HOST, no socket, a 404, an odd
answer) returns None and the caller asks through the SDK, which gives the proper error.
"""
from __future__ import annotations

import json
import os
import socket
import time
from urllib.parse import quote

DEFAULT_SOCKET = "/var/run/docker.sock"
TIMEOUT_S = 5.0
MAX_ANSWER = 1 << 20   # bytes of an answer read at most (an image's inspect is a few KiB)


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


def engine_runtimes() -> dict[str, list[str]] | None:
    """The OCI runtimes the engine offers (its /info's Runtimes: runc, runsc...), each with the arguments the engine
    gives it (runtimeArgs: gVisor's `--network=none`, say); None when it did not say."""
    info = _get("/info")
    runtimes = info.get("Runtimes") if info is not None else None
    if not isinstance(runtimes, dict):
        return None
    found: dict[str, list[str]] = {}
    for name, spec in runtimes.items():
        args = spec.get("runtimeArgs") if isinstance(spec, dict) else None
        found[str(name)] = [str(arg) for arg in args] if isinstance(args, list) else []
    return found


def _get(what: str) -> dict | None:
    """The engine's JSON answer to GET `what` over its Unix socket; None for anything but a 200 and an object. A
    plain HTTP/1.0 exchange (the engine answers and closes): http.client alone would cost the submit ~10 ms to
    import."""
    path = socket_path()
    if path is None or os.environ.get("DOCKER_TLS_VERIFY"):
        return None
    try:
        head, body = _exchange(path, f"GET {what} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
        status = head.split(b"\r\n", 1)[0].split()
        if len(status) < 2 or status[1] != b"200":
            return None
        found = json.loads(body)
    except (OSError, ValueError, RecursionError):   # (cut short, not JSON, nested past Python's limit)
        return None
    return found if isinstance(found, dict) else None


def _exchange(path: str, request: bytes) -> tuple[bytes, bytes]:
    """Send `request`; the answer's head and body, read until the engine closes or the body has its Content-Length:
    MAX_ANSWER bytes and TIMEOUT_S in all at most (OSError past either)."""
    deadline = time.monotonic() + TIMEOUT_S
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT_S)
        sock.connect(path)
        sock.sendall(request)
        answer = bytearray()
        length: int | None = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OSError("the engine did not answer in time")
            sock.settimeout(left)
            part = sock.recv(65536)
            answer += part
            if len(answer) > MAX_ANSWER:
                raise OSError("the engine's answer is too large")
            head, sep, body = bytes(answer).partition(b"\r\n\r\n")
            if sep and length is None:
                length = _content_length(head)
            if not part or (length is not None and len(body) >= length):
                if not sep:
                    raise OSError("the engine's answer has no end of head")
                return head, body if length is None else body[:length]


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return int(value.strip())
    return None
