"""Which broker pid's jobs go through (PID_BROKER_URL), known without loading Celery: a client that only publishes
(`pid submit`, jobs/publish.py) never imports it."""
from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

from pid import settings

EMBEDDED = ("pidfs://", "filesystem://")   # kombu's own filesystem transport can read half-written messages
REDIS_SCHEMES = ("redis", "rediss")


def embedded_broker() -> bool:
    """True when jobs run on this machine's filesystem queue (no PID_BROKER_URL)."""
    return (settings.BROKER_URL.raw() or "pidfs://").startswith(EMBEDDED)


def redis_broker() -> str | None:
    """PID_BROKER_URL when it names a Redis, else None."""
    url = settings.BROKER_URL.raw() or ""
    return url if url.split("://", 1)[0].lower() in REDIS_SCHEMES else None


def broker_problem() -> str | None:
    """Why PID_BROKER_URL names no broker pid can use (one line), or None. Kombu's table of transports is read only
    for a URL that is neither the embedded queue nor a Redis (it is loaded to publish there anyway)."""
    url = settings.BROKER_URL.raw() or ""
    if not url or url.startswith(EMBEDDED) or redis_broker():
        return None
    scheme = url.split("://", 1)[0].split("+", 1)[0] if "://" in url else ""
    from kombu.transport import TRANSPORT_ALIASES
    if scheme and scheme in TRANSPORT_ALIASES:
        return None
    return (f"PID_BROKER_URL={shown_url(url)}: not a broker pid knows (redis://HOST:PORT/DB, amqp://HOST//, or "
            "unset for the embedded queue)")


def broker_settings(home: str) -> tuple[str, dict[str, object]]:
    """The broker's URL and kombu transport options, for the worker's Celery app and a client's publish alike;
    the embedded queue's folders are made here and `pidfs://` registered."""
    url = settings.BROKER_URL.raw() or "pidfs://"
    if not embedded_broker():
        # Only a message taken but not yet started is unacknowledged (a worker takes one only when it has a free
        # process): if its worker dies, Redis hands it out again after this long.
        return url, {"visibility_timeout": 300}
    queue_dir = embedded_queue(home)
    processed = os.path.join(home, "broker", "processed")
    control = os.path.join(home, "broker", "control")
    for folder in (processed, control):
        os.makedirs(folder, mode=0o700, exist_ok=True)
    from pid.jobs.transport import register
    register()
    return "pidfs://", {"data_folder_in": queue_dir, "data_folder_out": queue_dir,
                        "processed_folder": processed, "store_processed": False, "control_folder": control,
                        # an idle worker looks for a message ten times a second (one listdir): a job waits ~50 ms
                        # for it on average, not the 0.5 s of Celery's 1 s default
                        "polling_interval": 0.1}


def embedded_queue(home: str) -> str:
    """The embedded queue's folder (made if missing), where a client puts its messages itself (jobs/queue_files.py)."""
    queue_dir = os.path.join(home, "broker", "queue")
    for folder in (home, queue_dir):
        os.makedirs(folder, mode=0o700, exist_ok=True)
    return queue_dir


def shown_url(url: str) -> str:
    """A store's or broker's URL as messages show it: without its password."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    except ValueError:   # a port that is not a number: show nothing after the scheme
        return url.split("://", 1)[0] + "://…"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
