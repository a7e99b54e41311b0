"""The options `pid run` and `pid submit` share, derived from JobSpec: its defaults, help texts and bounds.

Each value is checked as it is parsed, so a bad one is refused (exit 2, one line) before anything starts.
"""
from __future__ import annotations

import math
import os
import re
import select
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable

import click
from click.core import ParameterSource

from pid.config import API_KEY_ENV, API_NAMES, THINKING_LEVELS, EnvKey
from pid.sandbox.config import DEFAULT_MAX_WORKSPACE, MIN_DISK, MIN_MEMORY
from pid.sandbox.disk import format_size
from pid.jobs.spec import DEFAULT_QUEUE, default_of, spec_field
from pid import settings

class Number(click.ParamType):
    """A finite int or float within the field's bounds (click's ranges let nan through)."""

    def __init__(self, kind: type, low: float | None, high: float | None) -> None:
        self.kind, self.low, self.high = kind, low, high
        self.name = "integer" if kind is int else "number"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = value
            if self.kind is int and isinstance(value, float) and math.isfinite(value) and not value.is_integer():
                self.fail(f"{value!r} is not a whole number", param, ctx)   # a tasks line's 3.5: never truncated
        else:
            try:
                number = self.kind(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not {'a whole number' if self.kind is int else 'a number'}", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if (self.low is not None and number < self.low) or (self.high is not None and number > self.high):
            self.fail(f"{value} is out of range ({self.range_text()})", param, ctx)
        return self.kind(number)

    def range_text(self) -> str:
        low, high = (None if b is None else f"{int(b):,}" if float(b).is_integer() else f"{b:g}"
                     for b in (self.low, self.high))   # (1,000,000, not 1e+06)
        if low is not None and high is not None:
            return f"{low} to {high}"
        return f"at least {low}" if low is not None else f"at most {high}"


class Size(click.ParamType):
    """'10g', '300m', '1.5G', bytes -> bytes; with `zero_ok`, '0' or 'none' means no limit. `low` and `high` bound
    any other size, each with the reason for it."""
    name = "size"

    def __init__(self, zero_ok: bool = False, low: tuple[int, str] | None = None,
                 high: tuple[int, str] | None = None) -> None:
        self.zero_ok, self.low, self.high = zero_ok, low, high

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if self.zero_ok and str(value).strip().lower() in ("0", "none"):
            return 0
        if isinstance(value, int):
            size = value
        else:
            from pid.sandbox.disk import parse_size
            try:
                size = parse_size(str(value))
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        if self.low is not None and size < self.low[0]:
            self.fail(f"{value!r} is below {format_size(self.low[0])}, {self.low[1]}", param, ctx)
        if self.high is not None and size > self.high[0]:
            self.fail(f"{value!r} is above {format_size(self.high[0])}, {self.high[1]}", param, ctx)
        return size


class Memory(click.ParamType):
    """A Docker memory limit, written back in the short form the engine takes ('2g', '1536m')."""
    name = "size"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        size = Size().convert(value, param, ctx)
        if size < MIN_MEMORY:
            self.fail(f"{value!r} is below the engine's minimum of {format_size(MIN_MEMORY)}", param, ctx)
        return format_size(size)


class Url(click.ParamType):
    name = "url"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        text = str(value).strip()
        scheme: str | None = None
        host: str | None = None
        try:   # (ValueError: a bad port, or an unclosed IPv6 bracket)
            parts = urllib.parse.urlsplit(text)
            scheme, host, _ = parts.scheme, parts.hostname, parts.port
        except ValueError:
            pass
        # (nothing unprintable either: a tasks file's URL is shown in messages, and no server's needs one)
        if scheme not in ("http", "https") or not host or re.search(r"\s", text) or not text.isprintable():
            self.fail(f"{value!r} is not an http(s) URL (e.g. http://localhost:8000/v1)", param, ctx)
        return text


# Docker's reference grammar (distribution/reference): [host[:port]/]path[:tag][@digest].
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_IMAGE_RE = re.compile(rf"(?:{_HOST}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?"
                       rf"(?:@{_DIGEST})?")
_IMAGE_ID_RE = re.compile(r"sha256:[0-9a-f]{64}")


class ImageRef(click.ParamType):
    name = "image"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        text = str(value).strip()
        if len(text) > 255 or not (_IMAGE_RE.fullmatch(text) or _IMAGE_ID_RE.fullmatch(text)):
            self.fail(f"{value!r} is not a valid image reference (e.g. pid-sandbox:latest, "
                      f"registry:5000/team/image:tag)", param, ctx)
        return text


class Workdir(click.ParamType):
    """An absolute directory of the container that pid can give the agent (pid.sandbox.image_fs.check_workdir)."""
    name = "path"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        from pid.sandbox.image_fs import check_workdir
        try:
            return check_workdir(str(value))
        except ValueError as exc:
            self.fail(str(exc).replace("--workdir ", ""), param, ctx)


NETWORKS = ("none", "bridge")


class Words(click.ParamType):
    """A choice among lower-case words, shown as they are typed (click upper-cases a type's name) and taken in
    any case."""

    def get_metavar(self, param: Any, ctx: Any = None) -> str:
        return self.name


class Network(Words):
    """none (no network) or bridge (the engine's NAT network). Never host: it would hand the agent the host's own
    network stack, every service on the host's localhost included."""
    name = "|".join(NETWORKS)

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        text = str(value).strip().lower()
        if text == "host":
            self.fail("'host' would give the agent the host's own network (every service listening on its "
                      "localhost); use none or bridge", param, ctx)
        if text not in NETWORKS:
            self.fail(f"{value!r} is not allowed; choose none or bridge", param, ctx)
        return text


class User(click.ParamType):
    name = "uid[:gid]"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        from pid.sandbox.config import parse_user
        try:
            parse_user(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return str(value).strip()


class Api(Words):
    """A short name (openai, anthropic) or its wire format -> the wire format."""
    name = "|".join(API_NAMES)

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        text = str(value).strip().lower()
        if text in API_NAMES.values():
            return text
        if text not in API_NAMES:
            self.fail(f"{value!r} is not one of {', '.join(API_NAMES)}", param, ctx)
        return API_NAMES[text]


class Thinking(Words):
    name = "|".join(THINKING_LEVELS)

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        text = str(value).strip().lower()
        if text not in THINKING_LEVELS:
            self.fail(f"{value!r} is not one of {', '.join(THINKING_LEVELS)}", param, ctx)
        return text


class Tools(click.ParamType):
    """Comma-separated tool names, checked against the tool registry (the one place tools are named)."""
    name = "names"

    def convert(self, value: Any, param: Any, ctx: Any) -> list[str] | None:
        if value is None or isinstance(value, list):
            return value
        from pid.tools.registry import default_registry
        known = default_registry().names
        active = [t.strip() for t in str(value).split(",") if t.strip()]
        unknown = [t for t in active if t not in known]
        if unknown or not active:
            self.fail(f"unknown tool(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(known)}",
                      param, ctx)
        return list(dict.fromkeys(active))


class QueueName(click.ParamType):
    """A queue name (letters, digits, `.`, `_`, `-`; at most 64), or with many=True a comma-separated list of them
    (kept as the comma-separated text Celery's --queues takes)."""
    name = "name"

    def __init__(self, many: bool = False) -> None:
        self.many = many
        if many:
            self.name = "names"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        names = [n.strip() for n in str(value).split(",")] if self.many else [str(value).strip()]
        bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", n)]
        if bad or not names:
            self.fail(f"{bad[0] if bad else value!r} is not a queue name (letters, digits, '.', '_', '-'; at most "
                      "64)", param, ctx)
        return ",".join(dict.fromkeys(names))


class PoolSpec(click.ParamType):
    """A worker's warm pool: `N`, and `IMAGE=N` for an image of its own, comma-separated (settings.parse_pool); kept
    as its canonical text, which the worker reads back from PID_POOL."""
    name = "spec"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        from pid.settings import parse_pool
        try:
            return str(parse_pool(str(value)))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


PROMPT_READ_S = 10.0   # a prompt file that is a pipe (`<(…)`) may be silent this long at a time


def read_within(path: str, limit: int, quiet_s: float) -> bytes:
    """At most `limit` bytes of `path`. A FIFO (a tasks file may name one) is opened without waiting for a writer
    and read as long as it sends something every `quiet_s`: it never hangs the command. TimeoutError when it is
    silent longer; OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        ready = select.poll()
        ready.register(fd, select.POLLIN)
        chunks: list[bytes] = []
        size = 0
        while size < limit:
            if not ready.poll(quiet_s * 1000):
                raise TimeoutError(path)
            try:
                chunk = os.read(fd, min(limit - size, 1 << 16))
            except BlockingIOError:
                continue
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class PromptFile(click.ParamType):
    """A file on this machine whose text goes into the job's spec (the worker may be on another machine): read now,
    UTF-8, at most pid.prompt.MAX_SYSTEM_PROMPT_BYTES, not empty."""
    name = "file"

    def convert(self, value: Any, param: Any, ctx: Any) -> str | None:
        if value is None:
            return None
        from pid.prompt import MAX_SYSTEM_PROMPT_BYTES
        path = str(value)
        try:
            data = read_within(path, MAX_SYSTEM_PROMPT_BYTES + 1, PROMPT_READ_S)
        except TimeoutError:
            self.fail(f"cannot read {path}: it sent nothing for {PROMPT_READ_S:g} s (a FIFO no one writes?)", param,
                      ctx)
        except OSError as exc:
            self.fail(f"cannot read {path}: {exc.strerror or exc}", param, ctx)
        if len(data) > MAX_SYSTEM_PROMPT_BYTES:
            self.fail(f"{path} is larger than {format_size(MAX_SYSTEM_PROMPT_BYTES)}", param, ctx)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{path} is not UTF-8 text", param, ctx)
        if not text.strip():
            self.fail(f"{path} is empty", param, ctx)
        return text


class EnvOption(click.Option):
    """Names the environment variable in an error only when the bad value came from it."""

    def get_error_hint(self, ctx: Any) -> str:
        hint = click.Parameter.get_error_hint(self, ctx)
        if ctx is not None and self.name and ctx.get_parameter_source(self.name) == ParameterSource.ENVIRONMENT:
            hint += f" (from ${self.envvar})"
        return hint


class OnceOption(EnvOption):
    """An option given at most once: a second one is refused, not the last taken without a word (a CI gate written
    as `--check 'ruff check .' --check pytest` never ran ruff). Repeatable underneath, so that a repeat is seen."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "multiple": True})

    def process_value(self, ctx: click.Context, value: Any) -> Any:
        values = super().process_value(ctx, value)
        if len(values) > 1:
            hint = " (join the commands into one: --check 'ruff check . && pytest')" if self.name == "check" else ""
            raise click.BadParameter(f"given {len(values)} times; a job takes one{hint}", ctx=ctx, param=self)
        return values[0] if values else None


def api_key_option(help: str) -> Callable[[Any], Any]:
    """--api-key, else the environment's key, which is marked as such: it goes only to the environment's endpoint
    (pid.config.key_endpoint), never to a --base-url given beside it."""
    def mark(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        from_env = value and param.name and ctx.get_parameter_source(param.name) == ParameterSource.ENVIRONMENT
        return EnvKey(value) if from_env else value
    return click.option("--api-key", envvar=list(API_KEY_ENV), show_envvar=True, callback=mark, help=help)


@dataclass
class JobOption:
    """One option of `run`/`submit` for one JobSpec field: default, help and bounds come from the field."""
    flag: str
    name: str                          # the JobSpec field
    type: Callable[[float | None, float | None], click.ParamType] | None = None
    envvar: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    once: bool = False                 # given twice is an error, not the last one taken without a word

    def decorator(self) -> Callable[[Any], Any]:
        meta = spec_field(self.name).metadata
        default = default_of(self.name)
        kind = self.type(meta["min"], meta["max"]) if self.type else None
        shown = _as_typed(default, kind)   # the option's type turns it back into the field's value
        return click.option(self.flag, self.name, type=kind, default=default if shown is None else shown,
                            show_default=shown is not None, help=meta["help"], envvar=self.envvar,
                            show_envvar=bool(self.envvar), cls=OnceOption if self.once else EnvOption, **self.extra)


def _as_typed(default: Any, kind: click.ParamType | None) -> str | None:
    """A field's default as a user would type it ('10g', 'openai', '3600'); None when there is none."""
    if default is None or default == []:
        return None
    if isinstance(kind, Size):
        return format_size(default) if default else "0"
    if isinstance(kind, Api):
        return next(short for short, wire in API_NAMES.items() if wire == default)
    return f"{default:g}" if isinstance(default, float) else str(default)


def _const(kind: click.ParamType) -> Callable[[Any, Any], click.ParamType]:
    return lambda low, high: kind


JOB_OPTIONS = [
    JobOption("--model", "model", envvar=settings.MODEL.name),
    JobOption("--base-url", "base_url", _const(Url()), envvar=settings.BASE_URL.name),
    JobOption("--api", "api", _const(Api()), envvar=settings.API.name),
    JobOption("--image", "image", _const(ImageRef()), envvar=settings.IMAGE.name),
    JobOption("--workdir", "workdir", _const(Workdir())),
    JobOption("--out", "out_dir", extra={"metavar": "DIR"}),
    JobOption("--timeout", "timeout_s", lambda low, high: Number(float, low, high)),
    JobOption("--max-turns", "max_turns", lambda low, high: Number(int, low, high)),
    JobOption("--max-cost", "max_cost", lambda low, high: Number(float, low, high)),
    JobOption("--input-price", "input_price", lambda low, high: Number(float, low, high)),
    JobOption("--output-price", "output_price", lambda low, high: Number(float, low, high)),
    JobOption("--context-window", "context_window", lambda low, high: Number(int, low, high)),
    JobOption("--cache-read-price", "cache_read_price", lambda low, high: Number(float, low, high)),
    JobOption("--cache-write-price", "cache_write_price", lambda low, high: Number(float, low, high)),
    JobOption("--max-tokens", "max_tokens", lambda low, high: Number(int, low, high)),
    JobOption("--thinking", "thinking", _const(Thinking()), envvar=settings.THINKING.name),
    JobOption("--max-retry-wait", "max_retry_wait", lambda low, high: Number(float, low, high)),
    JobOption("--retry-budget", "retry_budget", lambda low, high: Number(float, low, high)),
    JobOption("--tools", "tools", _const(Tools())),
    JobOption("--file", "files", extra={"multiple": True}),
    JobOption("--memory", "memory", _const(Memory())),
    JobOption("--cpus", "cpus", lambda low, high: Number(float, low, high)),
    JobOption("--pids", "pids_limit", lambda low, high: Number(int, low, high)),
    JobOption("--network", "network", _const(Network())),
    JobOption("--user", "user", _const(User())),
    JobOption("--disk", "disk", _const(Size(zero_ok=True, low=(MIN_DISK, "the least a job's disk can work with"),
                                            high=(16 << 40, "the largest disk file an ext4 host can hold")))),
    JobOption("--runtime", "runtime"),
    JobOption("--max-patch", "max_patch", _const(Size())),
    JobOption("--max-files-size", "max_files_bytes", _const(Size())),
    JobOption("--max-files", "max_files", lambda low, high: Number(int, low, high)),
    JobOption("--system-prompt", "system_prompt", _const(PromptFile())),
    JobOption("--check", "check", extra={"metavar": "CMD"}, once=True),
    JobOption("--check-timeout", "check_timeout_s", lambda low, high: Number(float, low, high)),
    JobOption("--check-original", "check_original", extra={"multiple": True, "metavar": "PATH"}),
]


def job_options(func: Callable[..., Any] | None = None, *,
                json_help: str = "Print result.json instead of the summary.") -> Any:
    """The options `run` and `submit` share: they describe the same job."""
    if func is None:
        return lambda f: job_options(f, json_help=json_help)
    func = spec_options(func, json_help=json_help)
    for decorator in reversed([click.argument("task"),
                               click.option("--repo", "repo", metavar="DIR|URL",
                                            help=spec_field("repo").metadata["help"])]):
        func = decorator(func)
    return func


def spec_options(func: Callable[..., Any] | None = None, *,
                 json_help: str = "Print result.json instead of the summary.") -> Any:
    """The job's options without its task and repo: `pid batch` takes them as every item's defaults (and says
    what its --json prints: `@spec_options(json_help=...)`)."""
    if func is None:
        return lambda f: spec_options(f, json_help=json_help)
    decorators = [
        *(option.decorator() for option in JOB_OPTIONS),
        api_key_option("API key; never enters the container."),
        click.option("--no-images", is_flag=True, help="The model takes no images: read's images reach it as a note."),
        click.option("--json", "as_json", is_flag=True, help=json_help),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


MAX_WORKSPACE_OPTION = click.option(
    "--max-workspace", type=Size(), default=format_size(DEFAULT_MAX_WORKSPACE), show_default=True,
    envvar=settings.MAX_WORKSPACE.name, show_envvar=True, cls=EnvOption,
    help="Largest packed size of a directory --repo (checked before anything is written; `submit` packs it then and "
         "it travels with the job), and the most a git URL's clone may take on the worker.")

QUEUE_OPTION = click.option(
    "--queue", type=QueueName(), default=DEFAULT_QUEUE, show_default=True, envvar=settings.QUEUE.name,
    show_envvar=True, cls=EnvOption, help=spec_field("queue").metadata["help"])
