"""A worker's policy: the most a job may ask of it (`pid worker --policy FILE`, or PID_POLICY).

A job's spec is written by whoever can submit: a tasks file, a CI script, anyone with the store's URL. Without a
policy it may ask a worker for root in the sandbox, the network, no disk limit, 100g of memory, any image or any
model endpoint. The worker's operator decides instead: a job outside the policy is refused before any container
starts (it ends `failed`, exit reason `policy_refused`, with one line naming the rule). Workers publish their policy
with their heartbeat, so `pid submit` refuses at once when no live worker of the job's queue would admit the job.

The file is TOML, its keys read as the options do:

    max_memory = "4g"
    max_cpus = 2
    max_pids = 512
    max_disk = "20g"            # a job's --disk 0 (no limit) is over it
    max_workspace = "1g"        # what a git URL's clone may take on the worker
    max_timeout = 3600          # seconds: --timeout, and --check-timeout for a job with a check
    max_cost = 5.0              # USD: a job without --max-cost is over it
    allow_root = false
    allow_network = ["none"]
    images = ["pid-sandbox:*", "swebench/*"]
    base_urls = ["https://api.openai.com/v1"]
    runtimes = ["runsc"]        # "default": the engine's own
    repos = ["https://*"]       # what the worker fetches itself: git URLs (file:// is a path on the worker!)

A key left out allows everything, so an empty policy is pid's behaviour without one.
"""
from __future__ import annotations

import fnmatch
import tomllib
from urllib.parse import unquote, urlsplit
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from pid.config import endpoint
from pid.sandbox.config import MIN_DISK, MIN_MEMORY, parse_user
from pid.sandbox.disk import format_size, parse_size
from pid.jobs.spec import NETWORKS, JobSpec, spec_field

if TYPE_CHECKING:
    from pid.jobs.store import WorkerBeat


class PolicyError(ValueError):
    """A policy file that cannot be read or says something pid does not understand: the worker does not start."""


@dataclass(frozen=True)
class Policy:
    max_memory: int | None = None
    max_cpus: float | None = None
    max_pids: int | None = None
    max_disk: int | None = None
    max_workspace: int | None = None
    max_timeout: float | None = None
    max_cost: float | None = None
    allow_root: bool = True
    allow_network: tuple[str, ...] | None = None
    images: tuple[str, ...] | None = None
    base_urls: tuple[str, ...] | None = None
    runtimes: tuple[str, ...] | None = None
    repos: tuple[str, ...] | None = None

    def refusal(self, spec: JobSpec) -> str | None:
        """Why this policy does not admit the job (the first rule it breaks, in one line), or None. Comparisons are
        written so that a value that is no number (NaN) is over every limit; a spec that cannot be judged at all is
        refused."""
        try:
            for problem in self._problems(spec):
                return problem
        except (TypeError, ValueError, AttributeError) as exc:
            return f"the job's spec cannot be judged ({exc})"
        return None

    def _problems(self, spec: JobSpec) -> Any:
        if self.max_memory is not None and not parse_size(spec.memory) <= self.max_memory:
            yield f"--memory {spec.memory} is over max_memory = {format_size(self.max_memory)}"
        if self.max_cpus is not None and not spec.cpus <= self.max_cpus:
            yield f"--cpus {spec.cpus:g} is over max_cpus = {self.max_cpus:g}"
        if self.max_pids is not None and not spec.pids_limit <= self.max_pids:
            yield f"--pids {spec.pids_limit} is over max_pids = {self.max_pids}"
        if self.max_disk is not None and (spec.disk == 0 or not spec.disk <= self.max_disk):
            asked = "0 (no limit)" if spec.disk == 0 else format_size(spec.disk)
            yield f"--disk {asked} is over max_disk = {format_size(self.max_disk)}"
        if self.max_workspace is not None and (spec.max_workspace == 0 or not spec.max_workspace <=
                                                self.max_workspace):
            yield f"--max-workspace {format_size(spec.max_workspace)} is over max_workspace = " \
                  f"{format_size(self.max_workspace)}"
        if self.max_timeout is not None:
            if not spec.timeout_s <= self.max_timeout:
                yield f"--timeout {spec.timeout_s:g} is over max_timeout = {self.max_timeout:g}"
            if spec.check and not spec.check_timeout_s <= self.max_timeout:
                yield f"--check-timeout {spec.check_timeout_s:g} is over max_timeout = {self.max_timeout:g}"
        if self.max_cost is not None and (spec.max_cost is None or not spec.max_cost <= self.max_cost):
            asked = "none (no limit)" if spec.max_cost is None else f"{spec.max_cost:g}"
            yield f"--max-cost {asked} is over max_cost = {self.max_cost:g}"
        if not self.allow_root and parse_user(spec.user)[0] == 0:
            yield f"--user {spec.user} runs as root, and allow_root = false"
        if self.allow_network is not None and spec.network not in self.allow_network:
            yield f"--network {spec.network} is not in allow_network = {_listed(self.allow_network)}"
        if self.images is not None and not _matches(image_name(spec.image), self.images):
            yield f"--image {spec.image} is not in images = {_listed(self.images)}"
        if self.base_urls is not None:
            url = endpoint(spec.api, spec.base_url)
            if not _url_matches(url, self.base_urls):
                yield f"the model endpoint {url} is not in base_urls = {_listed(self.base_urls)}"
        if self.runtimes is not None and (spec.runtime or "default") not in self.runtimes:
            yield f"--runtime {spec.runtime or 'default'} is not in runtimes = {_listed(self.runtimes)}"
        # A workspace packed at submit travels with the job; anything else the worker reads itself, on its machine.
        if self.repos is not None and spec.repo and not spec.workspace:
            source = spec.repo.partition("#")[0]
            if not _url_matches(source if "://" in source else "file://" + source, self.repos):
                yield f"--repo {source} is not in repos = {_listed(self.repos)}"

    def to_dict(self) -> dict[str, Any]:
        """The rules that are set, as the heartbeat publishes them."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()
                if v is not None and not (k == "allow_root" and v is True)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], strict: bool = False) -> "Policy":
        """A policy from a file's table (strict: an unknown key or a wrong type is an error) or from a heartbeat
        (a newer worker's unknown rule is skipped: that worker still enforces it)."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown and strict:
            raise PolicyError(f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} (known: "
                              f"{', '.join(known)})")
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key in known:
                values[key] = _value(key, value, strict)
        return cls(**values)


def _value(key: str, value: Any, strict: bool = True) -> Any:
    """One rule's value, checked: sizes as the options take them, numbers finite and 0 or more, lists of names;
    strict (a file), also none that no job could meet (a heartbeat's is that worker's to enforce, as it is)."""
    def wrong(wanted: str) -> PolicyError:
        return PolicyError(f"{key} = {repr(value)[:60]}: expected {wanted}")

    if key in ("max_memory", "max_disk", "max_workspace"):
        if isinstance(value, bool) or not isinstance(value, (int, str)) or isinstance(value, int) and value >= 2 ** 63:
            raise wrong('a size such as "4g", or a number of bytes')
        try:
            size = value if isinstance(value, int) else parse_size(value)
        except ValueError as exc:
            raise PolicyError(f"{key}: {exc}") from None
        if size <= 0:
            raise wrong("a size above 0")
        least = _LEAST_SIZE.get(key)
        if strict and least is not None and size < least:   # ("4" for "4g": 4 bytes, which no job can ask)
            raise wrong(f"at least {format_size(least)}, the least a job can ask (below it no job is admitted)")
        return size
    if key in ("max_cpus", "max_timeout", "max_cost", "max_pids"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 2 ** 53:
            raise wrong("a number from 0 to 2**53")
        least = _LEAST.get(key)
        if strict and least is not None and value < least:   # under what any job may ask: it would refuse every job
            raise wrong(f"at least {least:g}, the least a job can ask (below it no job is admitted)")
        if key == "max_pids":
            if not float(value).is_integer():
                raise wrong("a whole number")
            return int(value)
        return float(value)
    if key == "allow_root":
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise wrong('a list of names, e.g. ["a", "b"]')
    if strict and key == "allow_network" and not set(value) <= set(NETWORKS):   # a typo would admit no job
        raise wrong(f"a list of the networks {_listed(NETWORKS)}")
    if strict and key in ("base_urls", "repos") and not all("://" in v for v in value):   # matched from the scheme
        raise wrong('a list of URLs with their scheme, e.g. ["https://api.example.com/*"]')
    return tuple(value)


# The least a job may ask for each limited value (jobs/spec.py's bounds): a policy maximum under it admits no job.
_LEAST = {rule: spec_field(name).metadata["min"]
          for rule, name in (("max_cpus", "cpus"), ("max_pids", "pids_limit"), ("max_timeout", "timeout_s"))}
_LEAST_SIZE = {"max_memory": MIN_MEMORY, "max_disk": MIN_DISK}


def load(path: str) -> Policy:
    """The policy in a TOML file, every key checked (PolicyError: one line saying what is wrong)."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise PolicyError(f"policy {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"policy {path}: not TOML: {exc}") from None
    try:
        return Policy.from_dict(data, strict=True)
    except PolicyError as exc:
        raise PolicyError(f"policy {path}: {exc}") from None


def refusal_by_workers(workers: "list[WorkerBeat]", spec: JobSpec) -> str | None:
    """Why no live worker of the job's queue would admit it (as the first of them says), or None: one admits it,
    or no worker of the queue is live (the job waits for one; that one decides)."""
    refusals = []
    for beat in workers:
        if spec.queue not in beat.queues:
            continue
        try:
            rules = Policy.from_dict(beat.policy)
        except (PolicyError, TypeError, ValueError):   # a policy this client cannot read: that worker decides
            return None
        refusal = rules.refusal(spec)
        if refusal is None:
            return None
        refusals.append(refusal)
    if not refusals:
        return None
    others = f" (and {len(refusals) - 1} other worker(s) refuse it too)" if len(refusals) > 1 else ""
    return f"no live worker of queue {spec.queue} admits the job: {refusals[0]}{others}"


_active: list[Policy] = [Policy()]


def active() -> Policy:
    """This worker's policy (set once, as it starts)."""
    return _active[0]


def activate(policy: Policy) -> None:
    _active[0] = policy


def image_name(image: str) -> str:
    """An image reference as the engine reads it: without a tag or digest it means `:latest`."""
    if "@" in image or image.startswith("sha256:"):
        return image
    last = image.rsplit("/", 1)[-1]
    return image if ":" in last else image + ":latest"


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


DEFAULT_PORTS = {"http": 80, "https": 443, "ssh": 22, "git": 9418}


def _url_parts(url: str) -> tuple[str, str, str] | None:
    """(scheme, host[:port], path) as a URL is reached: scheme and host lowercased, a default port dropped, the path
    decoded, without a trailing slash (user info is no part of it: `http://localhost:1@evil/` is evil's). None for a
    URL that could be read two ways (a query, a fragment, a `.` or `..` segment the server resolves): no pattern
    admits it."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    path = unquote(parts.path)
    if parts.query or parts.fragment or any(segment in (".", "..") for segment in path.split("/")):
        return None
    host = (parts.hostname or "").lower()
    host = f"[{host}]" if ":" in host else host
    netloc = host if port is None or port == DEFAULT_PORTS.get(parts.scheme.lower()) else f"{host}:{port}"
    return parts.scheme.lower(), netloc, path.rstrip("/")


def _url_matches(url: str, patterns: tuple[str, ...]) -> bool:
    """Whether a URL is one of the patterns, part by part: a `*` in a pattern's host never reaches into the path,
    and a `*` in its path never into another host."""
    found = _url_parts(url)
    if found is None:
        return False
    for pattern in patterns:
        scheme, _, rest = pattern.partition("://")
        netloc, _, path = rest.partition("/")
        if fnmatch.fnmatchcase(found[0], scheme.lower()) and fnmatch.fnmatchcase(found[1], netloc.lower()) and \
                fnmatch.fnmatchcase(found[2], ("/" + path).rstrip("/")):
            return True
    return False


def _listed(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"
