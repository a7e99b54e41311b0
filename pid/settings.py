"""Every PID_* environment variable pid reads, declared once: its name, default, parse, and what it is for.

Code reads a setting where and when it did before this module: a module constant read at import stays one (tests
patch housekeeping.EVERY_S), the rest are read at each call (tests set the variable). A set but empty variable is
unset. Click's options take their `envvar` from here (`MODEL.name`) and parse and default it themselves; those
settings say so. docs/options.md's table of variables is `table()` (tests/test_settings.py keeps it
current, and keeps PID_ names out of the code elsewhere)."""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from pid.errors import PidError

T = TypeVar("T")


class BadSetting(PidError):
    """A PID_* variable set to what it cannot be: `$NAME: why`, the one line a command prints before it starts."""


@dataclass(frozen=True)
class Setting(Generic[T]):
    name: str                    # the environment variable
    default: T                   # when it is unset or empty
    parse: Callable[[str], T]    # its text to a value (ValueError when it is none)
    why: str                     # one line for the docs
    shown_default: str = ""      # the docs' default, where `default` says nothing (a click option's, a computed one)

    def raw(self) -> str | None:
        """The variable's text, or None when it is unset or empty."""
        return os.environ.get(self.name) or None

    def get(self) -> T:
        """The value now: the variable parsed, else the default. BadSetting when it cannot be parsed."""
        return self.value_of(self.raw())

    def value_of(self, text: str | None) -> T:
        """`text` as this variable's value would be read (empty or None: the default); BadSetting when it is none."""
        if not text:
            return self.default
        try:
            return self.parse(text)
        except ValueError as exc:
            raise BadSetting(f"${self.name}: {exc}") from None


ALL: list[Setting[Any]] = []


def _setting(name: str, default: T, parse: Callable[[str], T], why: str, shown_default: str = "") -> Setting[T]:
    setting = Setting(name, default, parse, why, shown_default)
    ALL.append(setting)
    return setting


def _flag(text: str) -> bool:
    return text == "1"


MAX_SECONDS = 7 * 24 * 3600.0   # a week: longer is a typo (and past threading's longest wait, a thread's end)


def _seconds(zero_ok: bool = False) -> Callable[[str], float]:
    """A parse of a number of seconds: above 0 (or 0 too), at most MAX_SECONDS."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (0 <= value <= MAX_SECONDS) or (value == 0 and not zero_ok):
            raise ValueError(f"{text!r} is not a number of seconds {'from 0' if zero_ok else 'above 0'} to "
                             f"{MAX_SECONDS:.0f} (a week)")
        return value
    return parse


def _count(least: int) -> Callable[[str], int]:
    """A parse of a whole number, at least `least`."""
    def parse(text: str) -> int:
        value = int(text) if text.strip().isascii() and text.strip().isdigit() else -1
        if value < least:
            raise ValueError(f"{text!r} is not a whole number from {least}")
        return value
    return parse


def _option(name: str, option: str, why: str) -> Setting[str | None]:
    """A setting a click option reads (and parses, and defaults: its --help shows both)."""
    return _setting(name, None, str, why, f"as `{option}`")


# The job (click options of run, submit, batch, retry, continue; the worker reads the endpoint's two itself)
MODEL = _option("PID_MODEL", "--model", "the model a job asks for")
BASE_URL = _option("PID_BASE_URL", "--base-url",
                   "the model endpoint; a worker's own is the endpoint its key is for")
API = _option("PID_API", "--api", "the wire format: `openai`, `anthropic`, `openai-completions`, `anthropic-messages`")
API_KEY = _option("PID_API_KEY", "--api-key", "the model's API key, else OPENAI_API_KEY; never enters a container")
IMAGE = _option("PID_IMAGE", "--image", "the sandbox image")
THINKING = _option("PID_THINKING", "--thinking", "the model's thinking level")
MAX_WORKSPACE = _option("PID_MAX_WORKSPACE", "--max-workspace", "the largest packed size of a directory --repo")
QUEUE = _option("PID_QUEUE", "--queue", "the queue `submit` and `batch` send a job to")

# State and files
HOME = _setting("PID_HOME", None, str, "pid's state (job store, embedded broker); a command that cannot write "
                "there refuses to start, exit 2", "`$XDG_DATA_HOME/pid`, else `~/.local/share/pid`")
MODELS = _setting("PID_MODELS", None, str, "a models file (docs/jobs.md); one named here must exist",
                  "`$PID_HOME/models.json`, then pi's")
TIKTOKEN_FILE = _setting("PID_TIKTOKEN_FILE", None, str, "the tiktoken table, trusted as named (docs/security.md)",
                         "`$PID_HOME/tiktoken/`, then tiktoken's cache")
TIKTOKEN_DOWNLOAD = _setting("PID_TIKTOKEN_DOWNLOAD", False, _flag,
                             "`1`: tiktoken may fetch its table where the network permits")

# The queue and the job store (docs/queue.md)
BROKER_URL = _setting("PID_BROKER_URL", None, str, "the broker for several machines (`redis://host:6379/0`, "
                      "`amqp://host//`)", "the embedded queue under PID_HOME")
STORE_URL = _setting("PID_STORE_URL", None, str, "the job store", "the broker's Redis, else SQLite under PID_HOME")
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", re.IGNORECASE)
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _duration(text: str) -> float:
    """Seconds, or a number with a unit s/m/h/d/w (`7d`), above 0."""
    m = _DURATION.fullmatch(text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration: give seconds or e.g. 12h, 7d, 2w")
    return float(m.group(1)) * _DURATION_UNITS[m.group(2).lower()]


RETENTION = _setting("PID_RETENTION", 7 * 86400.0, _duration, "how long ended jobs and unused blobs are kept: "
                     "seconds, or e.g. `12h`, `7d`, `2w`", "`7d`")
RESULT_BACKEND = _setting("PID_RESULT_BACKEND", None, str,
                          "no longer used (the job store holds every result): a worker says so when it is set")
POLICY = _option("PID_POLICY", "worker --policy", "a worker's policy file (docs/policy.md)")
QUEUES = _option("PID_QUEUES", "worker --queue", "the queues a worker takes jobs from, comma-separated")
POOL_MAX = 64   # a worker's warm pool at most: each ready sandbox is a running container and two mounted disks


@dataclass(frozen=True)
class PoolSizes:
    """A worker's warm pool: `shared` ready sandboxes among the images without a size of their own, and `per_image`
    for each image that has one (its name as canonical_image writes it)."""
    shared: int = 0
    per_image: tuple[tuple[str, int], ...] = ()

    @property
    def total(self) -> int:
        return self.shared + sum(n for _, n in self.per_image)

    def budget(self, image: str) -> tuple[str, int]:
        """Which share an image's sandboxes come out of ("" for the shared one), and its size."""
        image = canonical_image(image)
        return next(((name, n) for name, n in self.per_image if name == image), ("", self.shared))

    def __str__(self) -> str:
        return ",".join([str(self.shared)] + [f"{name}={n}" for name, n in self.per_image])


def canonical_image(image: str) -> str:
    """An image as the engine names it: `:latest` where no tag or digest is given (`pid-sandbox` is
    `pid-sandbox:latest`)."""
    if "@" in image or ":" in image.rsplit("/", 1)[-1]:
        return image
    return image + ":latest"


def parse_pool(text: str) -> PoolSizes:
    """PID_POOL, `worker --pool`: `N` (the shared size), and `IMAGE=N` for an image of its own, comma-separated:
    `4`, `swe-task:latest=8,2`. Each N a whole number; all together at most POOL_MAX. Anything else is refused."""
    shared: int | None = None
    per_image: list[tuple[str, int]] = []
    for item in (part.strip() for part in text.split(",")):
        name, _, count = item.rpartition("=")
        count = count.strip()
        n = int(count) if count.isascii() and count.isdigit() else -1
        if not 0 <= n <= POOL_MAX or ("=" in item and not name.strip()) or "=" in name:
            raise ValueError(f"takes a whole number of ready sandboxes from 0 to {POOL_MAX}, or IMAGE=N, "
                             f"comma-separated, not {text!r}")
        if not name and shared is not None:
            raise ValueError(f"gives the shared size twice: {text!r}")
        if not name:
            shared = n
        elif any(canonical_image(name.strip()) == seen for seen, _ in per_image):
            raise ValueError(f"names the image {name.strip()!r} twice: {text!r}")
        else:
            per_image.append((canonical_image(name.strip()), n))
    sizes = PoolSizes(shared or 0, tuple(per_image))
    if sizes.total > POOL_MAX:
        raise ValueError(f"asks for {sizes.total} ready sandboxes in all: at most {POOL_MAX}: {text!r}")
    return sizes


POOL = _setting("PID_POOL", PoolSizes(), parse_pool,
                "ready sandboxes a worker keeps, for the job classes it served last: `N` in all, `IMAGE=N` for an "
                "image of its own, comma-separated", f"as `worker --pool` (in all 0 to {POOL_MAX})")

# A worker's housekeeping: read once, as the worker's modules load
SWEEP_S = _setting("PID_SWEEP_S", 5.0, _seconds(), "seconds between a worker's sweeps for lost jobs")
RECONCILE_S = _setting("PID_RECONCILE_S", 60.0, _seconds(),
                       "seconds a queued job waits beside a free live worker before its message is presumed lost")
REDISPATCH_AFTER_S = _setting("PID_REDISPATCH_AFTER_S", 1800.0, _seconds(),
                              "seconds a queued job waits before it is dispatched again, whatever the workers do")
DISPATCH_GIVE_UP_S = _setting("PID_DISPATCH_GIVE_UP_S", 600.0, _seconds(),
                              "seconds a job that could not be dispatched is retried before it fails")
LEASE_S = _setting("PID_LEASE_S", 30.0, _seconds(), "seconds a running job may be silent before it is presumed dead")
MAX_ATTEMPTS = _setting("PID_MAX_ATTEMPTS", 3, _count(1), "times a job's worker may be lost before the job fails")

# The client
NO_WORKER_NOTICE_S = _setting("PID_NO_WORKER_NOTICE_S", 10.0, _seconds(zero_ok=True),
                              "seconds `submit --wait` waits on a queued job before it says no worker took it")

# Tests
TEST_RUN = _setting("PID_TEST_RUN", "", str.strip,
                    "a test run's mark on the containers it makes, so it removes only its own")


def check() -> None:
    """Every setting that is set, parsed now (the first that cannot be is a BadSetting): a command checks them all
    before it starts, so a worker with a bad one never starts half-way (its housekeeping reads them as it loads).
    PID_POOL is `pid worker --pool`'s, which parses it (a --pool given wins over it)."""
    for setting in ALL:
        if setting is not POOL:
            setting.get()


def table() -> str:
    """docs/options.md's table of every setting."""
    rows = ["| Variable | Default | What it is for |", "|---|---|---|"]
    for s in ALL:
        shown = "" if s.default in (None, "", False) else f"`{str(s.default).removesuffix('.0')}`"
        default = s.shown_default or shown
        rows.append(f"| `{s.name}` | {default} | {s.why} |")
    return "\n".join(rows) + "\n"
