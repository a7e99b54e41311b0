"""Where pid keeps its state, the model endpoint's defaults, and the API key from the environment.

The job's other defaults live in jobs/spec.py (JobSpec); this module holds what the agent core itself needs.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pid import settings
from pid.errors import PidError
from pid.output_dirs import make_marked

# `--api` / PID_API name -> the wire format the providers speak (pid/providers keys its implementations by these).
API_NAMES = {"openai": "openai-completions", "anthropic": "anthropic-messages"}
DEFAULT_API = API_NAMES["openai"]
# Each wire format's own endpoint, used when no base URL is given. Their hosts need a key: without one they can
# only refuse, so a keyless call to them fails at once.
DEFAULT_BASE_URLS = {API_NAMES["openai"]: "https://api.openai.com/v1",
                     API_NAMES["anthropic"]: "https://api.anthropic.com/v1"}
KEYED_HOSTS = frozenset(url.split("/")[2] for url in DEFAULT_BASE_URLS.values())
API_KEY_ENV = (settings.API_KEY.name, "OPENAI_API_KEY")   # the first one set wins
THINKING_LEVELS = ("off", "low", "medium", "high")   # --thinking (pid/providers map them to each API)


def base_url_for(api: str, base_url: str | None) -> str:
    """The endpoint a job talks to: the one given, else its wire format's own."""
    return base_url or DEFAULT_BASE_URLS[api]


def endpoint(api: str, base_url: str | None) -> str:
    """A job's endpoint, as keys are bound to it: a key goes only to the endpoint it was given with (the base URL
    beside it, else its wire format's own). A job naming another (a tasks-file line, a stored job) brings its own
    key or goes without one; else anyone who can name an endpoint would receive the key."""
    return base_url_for(api, base_url).rstrip("/")


class HomeUnusable(Exception):
    """PID_HOME cannot be created or written: every command needs it, so nothing can run."""


def pid_home() -> str:
    """PID_HOME, else the per-user data dir (XDG_DATA_HOME/pid, ~/.local/share/pid)."""
    home = settings.HOME.raw()
    if home:
        return os.path.abspath(home)
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data, "pid")


def ensure_pid_home() -> str:
    """Create PID_HOME if needed and prove it writable (a file is made and removed), or raise HomeUnusable.

    Why a real write: permission bits say nothing for root, nor for a read-only filesystem."""
    home = pid_home()
    try:
        make_marked(home, mode=0o700)   # (its blobs hold workspaces and artifacts: see output_dirs)
        fd, probe = tempfile.mkstemp(prefix=".pid-write-check-", dir=home)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise HomeUnusable(f"PID_HOME {home} is not a writable directory ({exc.strerror or exc}); "
                           f"set PID_HOME to one") from None
    return home


def check_ready() -> None:
    """What every command, and every call of the Python API, checks before it does anything: PID_* settings that are
    what they cannot be (BadSetting), an unusable PID_HOME (where every command keeps its state). A PidError, one
    line."""
    settings.check()
    try:
        ensure_pid_home()
    except HomeUnusable as exc:
        raise PidError(str(exc)) from None


@dataclass
class EnvDefaults:
    """What the worker takes from its own environment when a job brings none (the CLI reads these through its
    options' environment variables): the key, and the endpoint it is bound to (see endpoint)."""
    api_key: str | None
    base_url: str | None = None   # PID_BASE_URL
    api: str = DEFAULT_API        # PID_API, as a wire format

    @classmethod
    def read(cls) -> "EnvDefaults":
        api = settings.API.raw() or ""
        return cls(api_key=next((os.environ[k] for k in API_KEY_ENV if os.environ.get(k)), None),
                   base_url=settings.BASE_URL.raw(),
                   api=API_NAMES.get(api, api if api in API_NAMES.values() else DEFAULT_API))

    def key_for(self, api: str, base_url: str | None) -> str | None:
        """The key, for a job whose endpoint is the one it is bound to (see endpoint); None for any other."""
        bound = self.api_key is not None and endpoint(api, base_url) == endpoint(self.api, self.base_url)
        return self.api_key if bound else None


class EnvKey(str):
    """An API key a command took from the environment (API_KEY_ENV), not from its --api-key: like the worker's, it
    is bound to the environment's endpoint (PID_BASE_URL, else PID_API's own), not to a --base-url beside it."""


def key_endpoint(key: str | None, api: str, base_url: str | None) -> str:
    """The endpoint `key` may go to, for a command whose own endpoint is (api, base_url)."""
    if isinstance(key, EnvKey):
        env = EnvDefaults.read()
        return endpoint(env.api, env.base_url)
    return endpoint(api, base_url)


def bound_key(key: str | None, api: str, base_url: str | None) -> str | None:
    """`key` for a job of this endpoint when it is the key's (see key_endpoint), else None."""
    return key if key and endpoint(api, base_url) == key_endpoint(key, api, base_url) else None
