"""Client libraries that a broker needs and pid does not install by default (extras).
No Celery here: the CLI catches MissingClient without loading the queue."""
from __future__ import annotations

import importlib

# URL schemes whose Celery transport needs a client library pid does not install by default.
CLIENTS = {"redis": ("redis", "redis"), "rediss": ("redis", "redis"), "sentinel": ("redis", "redis")}


class MissingClient(RuntimeError):
    """PID_BROKER_URL names a service whose client library is not installed."""


def check_clients(urls: dict[str, str]) -> None:
    """A clear error now instead of Celery's "'NoneType' object has no attribute 'Redis'" later."""
    for variable, url in urls.items():
        scheme = url.split("://", 1)[0].split("+", 1)[0].lower()
        if scheme not in CLIENTS:
            continue
        module, extra = CLIENTS[scheme]
        try:
            importlib.import_module(module)
        except ImportError:
            raise MissingClient(f"{variable}={scheme}://… needs the {module} client, which is not installed: "
                                f"pip install 'pid[{extra}]'") from None
