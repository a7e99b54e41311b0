"""The job spec (what `submit` sends through the queue) and the job result (result.json). Plain JSON data.

JobSpec is the one place a job's defaults are written: each field carries its default and, in its metadata, the
help text and bounds that `pid run` and `pid submit` turn into their options (cli/options.py). The sandbox's
limits default to the sandbox's own (sandbox/config.py), the endpoint to the agent core's (pid/config.py).
"""
from __future__ import annotations

import json
import math
import os
import posixpath
import re
import secrets
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

from pid.config import API_NAMES, DEFAULT_API, THINKING_LEVELS
from pid.sandbox.config import SandboxConfig, parse_user

NETWORKS = ("none", "bridge")     # never host: it would hand the agent the host's own network stack
DEFAULT_QUEUE = "pid"             # the queue a job waits in unless `submit --queue` names another
MAX_TIMEOUT_S = 7 * 24 * 3600.0   # a week: longer is a typo (or inf), and the container's time to live must fit
PRICES = ("input_price", "output_price", "cache_read_price", "cache_write_price")   # a job's prices (USD/M tokens)


ID_TIME = "%Y%m%d-%H%M%S"   # how a job's (and a batch's) id begins: when it was made, UTC


def new_job_id() -> str:
    """Sortable by submission time, unique without coordination."""
    return datetime.now(timezone.utc).strftime(ID_TIME) + "-" + secrets.token_hex(3)


def job_id_time(job_id: str) -> float | None:
    """When a job id says it was made (new_job_id's), or None for an id of no such form."""
    try:
        return datetime.strptime(job_id[:15], ID_TIME).replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def setting(default: Any, help: str, *, min: float | None = None, max: float | None = None,
            factory: Any = None) -> Any:
    """A field with its default, the help text its option shows, and the bounds the option enforces."""
    metadata = {"help": help, "min": min, "max": max}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def required(help: str) -> Any:
    return field(metadata={"help": help, "min": None, "max": None})


@dataclass
class JobSpec:
    task: str = required("What the agent is asked to do.")
    model: str = required("Model name.")
    repo: str | None = setting(None, "Directory to work on (copied, never modified), or a git URL (https://, ssh://, "
                                     "git://, file://; #REF for a branch, tag or commit) the worker clones. "
                                     "Without it, the agent works in the image's own --workdir.")  # absolute
    workdir: str | None = setting(None, "The directory the agent works in (default /workspace). Without --repo it "
                                        "is the image's own directory as the image has it (a task image's "
                                        "/testbed), and the patch is the change to it; with --repo the repository "
                                        "is imported there. Either way the image's filesystem is the job's to "
                                        "change, copy-on-write on its disk.")
    out_dir: str = setting("pid-runs", "Artifacts go to OUT/<job id>/.")  # absolute in the spec
    base_url: str | None = setting(None, "Model endpoint (OpenAI-compatible, or Anthropic with --api); default: "
                                         "the API's own (OpenAI's or Anthropic's).")
    api: str = setting(DEFAULT_API, "Wire format of the endpoint.")
    image: str = setting(SandboxConfig.image, "Sandbox image (must be present locally: pid never pulls).")
    timeout_s: float = setting(3600.0, "Wall-clock limit for the whole job, in seconds.", min=1, max=MAX_TIMEOUT_S)
    max_turns: int = setting(100, "Model calls at most.", min=1)
    max_cost: float | None = setting(None, "Stop when the cost in USD exceeds this (needs the prices).", min=0)
    input_price: float = setting(0.0, "USD per million input tokens (for usage.cost and --max-cost); 0: the "
                                      "model table's price.", min=0)
    output_price: float = setting(0.0, "USD per million output tokens; 0: the model table's price.", min=0)
    context_window: int | None = setting(None, "The model's context window in tokens (default: the model table's; "
                                               "unknown models 128000). The context is compacted to fit.", min=4096)
    cache_read_price: float = setting(0.0, "USD per million input tokens read from the provider's prompt cache; "
                                           "0: the model table's price.", min=0)
    cache_write_price: float = setting(0.0, "USD per million input tokens written to the provider's prompt "
                                            "cache; 0: the model table's price.", min=0)
    max_tokens: int | None = setting(None, "Most tokens one answer may have (the endpoint's max_tokens); default: "
                                           "the model table's maxTokens, at most 32000, for a model it knows.",
                                     min=1, max=1_000_000)
    thinking: str = setting("off", "Thinking level: off, low, medium or high (OpenAI reasoning_effort; Anthropic "
                                   "extended thinking with a token budget per level).")
    max_retry_wait: float = setting(60.0, "Longest single wait, in seconds, before a rate-limited or failed model "
                                          "call is retried (the server's Retry-After is honoured up to this).",
                                    min=1, max=3600)
    retry_budget: float = setting(900.0, "Time one model call may spend retrying (its waits and the attempts "
                                         "after its first failure), in seconds; 0: no retries.",
                                  min=0, max=MAX_TIMEOUT_S)
    images: bool = setting(True, "The model accepts images (else read's images reach it as a note).")
    tools: list[str] | None = setting(None, "Active tools, comma-separated (default: all).")
    files: list[str] = setting(None, "In-container path to collect as an artifact (repeatable).", factory=list)
    memory: str = setting(SandboxConfig.memory, "Container memory limit (swap = memory: no swap).")
    cpus: float = setting(SandboxConfig.cpus, "CPUs the container may use.", min=0.01)
    pids_limit: int = setting(SandboxConfig.pids_limit, "Processes and threads in the container at most.", min=16)
    network: str = setting(SandboxConfig.network, "Container network: none (no network) or bridge (outbound "
                                                   "access; the sandbox is then reachable from the network).")
    user: str = setting(SandboxConfig.user, "The agent's UID[:GID] in the container; 'root' is an explicit "
                                            "opt-in (weaker isolation).")
    disk: int = setting(SandboxConfig.disk, "Bytes the job may write in all (workspace, /tmp, home; pid's own "
                                            "files take a disk of their own, 1 GiB); 0: no limit.")
    runtime: str | None = setting(None, "Engine runtime for the container, e.g. runsc (gVisor); left out: the "
                                        "engine's default.")
    max_workspace: int = setting(SandboxConfig.max_workspace, "Bytes a git URL's clone may take on the worker "
                                                               "(its .git and checkout; a directory is bounded "
                                                               "when it is packed at submit).")
    max_patch: int = setting(100 << 20, "Largest patch.diff accepted (larger: the job fails, artifact_error).")
    max_files_bytes: int = setting(100 << 20, "--file collection: bytes in all.")
    max_files: int = setting(10000, "--file collection: entries in all (what is over is skipped and listed).", min=1)
    check: str | None = setting(None, "After the agent ends, run CMD on its patch: in a fresh container of the same "
                                      "image, on the original workspace with patch.diff applied, in the workdir, "
                                      "as the agent's user; its exit status decides the job's exit code (4: the "
                                      "agent completed but the check failed). See result.json's `check`.")
    check_original: list[str] = setting(None, "A path of the workdir (relative to it) that --check sees as it was "
                                              "originally, whatever the patch does to it: the tests that judge the "
                                              "agent (repeatable).", factory=list)
    check_timeout_s: float = setting(600.0, "--check's own time limit, in seconds (beyond --timeout); past it the "
                                            "check is killed and fails.", min=1, max=MAX_TIMEOUT_S)
    id: str = setting(None, "The job's id.", factory=new_job_id)
    queue: str = setting(DEFAULT_QUEUE, "The queue the job waits in: only workers that consume it take it "
                                        "(pid worker --queue).")
    batch: str | None = setting(None, "The batch the job belongs to (pid batch): its budget and running limit, in "
                                      "the job store.")
    # The workspace as `submit` packed it: a blob digest ("sha256:<hex>", jobs/blobs.py). None: the worker reads
    # `repo` (a git URL to clone, or a directory when the job starts, as `pid run` does). `repo` is kept for display.
    workspace: str | None = setting(None, "The packed workspace's blob digest.")
    # The text of `--system-prompt FILE`, read by the client: it replaces the system prompt's base (pid/prompt.py).
    system_prompt: str | None = setting(None, "A file whose text replaces the system prompt (read now; it wins over "
                                              "the workspace's .pi/SYSTEM.md).")
    parent: str | None = setting(None, "The job this one continues (`pid continue`): its transcript is loaded and its "
                                       "patch applied to the same snapshot.")
    retry_of: str | None = setting(None, "The job this one runs again (`pid retry`).")
    # A retry's or continuation's image, by id: the one its earlier job ran (result.json's image_id), whatever `image`
    # names now (a tag may have moved). `image` stays what the policy judges and what is shown.
    image_id: str | None = setting(None, "The image to run, by id (\"sha256:<hex>\").")

    @property
    def workspace_dir(self) -> str:
        """Where the agent works in its container."""
        return self.workdir or SandboxConfig.workdir

    @property
    def job_dir(self) -> str:
        return os.path.join(self.out_dir, self.id)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JobSpec":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def spec_field(name: str) -> Field:
    """One JobSpec field, for the options derived from it."""
    return next(f for f in fields(JobSpec) if f.name == name)


def default_of(name: str) -> Any:
    """A JobSpec field's default (None for required fields)."""
    f = spec_field(name)
    if f.default is not MISSING:
        return f.default
    return None if f.default_factory is MISSING else f.default_factory()


JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")   # (a name, never a path)
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,254}")
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


def spec_problem(spec: JobSpec) -> str | None:
    """What is wrong with a spec as a worker reads it from the store, or None. The CLI checks every value as it
    parses it; anyone who can write to the store can skip the CLI, so the worker checks again what decides its
    limits and where it writes: a NaN cost, a pids limit of -1 (none at all) or an id of `../x` never reach it."""
    for f in fields(JobSpec):
        value, low, high = getattr(spec, f.name), f.metadata.get("min"), f.metadata.get("max")
        if f.type in ("int", "float", "int | None", "float | None") and value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or (f.type.startswith("int") and not isinstance(value, int)):
                return f"{f.name} = {value!r} is not a number"
            if (low is not None and not value >= low) or (high is not None and not value <= high):
                return f"{f.name} = {value!r} is out of range"
        elif f.type == "str" and not isinstance(value, str):
            return f"{f.name} = {value!r} is not text"
    if (problem := message_problem("the task", spec.task)) is not None:
        return problem
    if spec.cpus <= 0 or spec.disk < 0 or spec.max_workspace < 0:
        return "cpus, disk and max_workspace cannot be negative (cpus above 0)"
    if not JOB_ID_RE.fullmatch(spec.id):
        return f"id {spec.id!r} is not a job id"
    if not os.path.isabs(spec.out_dir) or os.path.normpath(spec.out_dir) != (spec.out_dir.rstrip("/") or "/") or \
            "\0" in spec.out_dir:
        return f"out_dir {spec.out_dir!r} is not an absolute, normalised path"
    try:
        from pid.sandbox.disk import parse_size
        parse_size(spec.memory)
        parse_user(spec.user)
    except (TypeError, ValueError) as exc:
        return str(exc)
    if spec.network not in NETWORKS or spec.api not in API_NAMES.values() or spec.thinking not in THINKING_LEVELS:
        return f"network {spec.network!r}, api {spec.api!r} or thinking {spec.thinking!r} is not one pid knows"
    for name in ("image", "runtime"):
        value = getattr(spec, name)
        if value is not None and not (isinstance(value, str) and _NAME_RE.fullmatch(value)):
            return f"{name} {value!r} is not a name"
    for name in ("base_url", "repo"):
        value = getattr(spec, name)
        if value is not None and not (isinstance(value, str) and value.isprintable() and value.strip() == value):
            return f"{name} {repr(value)[:80]} is not a URL or path pid takes"
    if spec.workspace is not None and not (isinstance(spec.workspace, str) and DIGEST_RE.fullmatch(spec.workspace)):
        return f"workspace {spec.workspace!r} is not a blob digest"
    if spec.image_id is not None and not (isinstance(spec.image_id, str) and DIGEST_RE.fullmatch(spec.image_id)):
        return f"image_id {spec.image_id!r} is not an image id"
    for name in ("files", "check_original", "tools"):
        value = getattr(spec, name)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            return f"{name} is not a list of text"
    return None


# A lone surrogate that is no stray byte kept by surrogateescape (those are U+DC80-U+DCFF): a model's "\ud800"
_LONE_SURROGATE = re.compile("[\ud800-\udc7f\udd00-\udfff]")


def storable(text: str) -> str:
    """Text as it can be stored (UTF-8): a file name that is not UTF-8 (read as Python does, its stray bytes as
    surrogates) gets them escaped, `bad\\xffname`; any other lone surrogate (a model or a server may send "\\ud800"
    in JSON) becomes U+FFFD; any other text is itself. (Showing it is pid/terminal.py's.)"""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        text = _LONE_SURROGATE.sub("\ufffd", text)
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def json_text(data: Any) -> Any:
    """`data` with every string storable: JSON and the job store take it whatever names it holds."""
    if isinstance(data, str):
        return storable(data)
    if isinstance(data, dict):
        return {storable(str(k)): json_text(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_text(v) for v in data]
    return data


def beside(path: str, what: str) -> str:
    """A fresh name next to `path` for a file about to replace it (`what`: tmp, old): unique to this write, not only
    to this process (threads share a pid)."""
    return f"{path}.{what}{os.getpid()}-{secrets.token_hex(4)}"


def write_json_atomic(path: str, data: dict[str, Any]) -> None:
    tmp = beside(path, "tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(json_text(data), f, indent=2, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# A task, steer or follow-up goes whole into every model request after it: one longer than this is a mistake (a file
# pasted in), and would make a result.json too large to fetch (a stdin task is read up to it, no further).
MAX_MESSAGE_BYTES = 1 << 20
MAX_MESSAGE_WORDS = "1 MiB"   # (as messages say it)


def message_problem(what: str, text: str) -> str | None:
    """Why a task or message (`what`: "the task") cannot be sent, or None."""
    if not text.strip():
        return f"{what} is empty"
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_MESSAGE_BYTES:
        return (f"{what} is larger than {MAX_MESSAGE_WORDS} ({size:,} bytes); it goes whole into every model "
                "request: put what it quotes in the repository instead")
    return None


# --check: refused at submit, before the job is queued (worker/check.py runs it)
MAX_COMMAND_CHARS = 100_000   # a command longer than this is a mistake (a file pasted in)


def command_problem(command: str | None) -> str | None:
    """Why a --check command cannot be run, or None (checked before the job is queued)."""
    if command is None:
        return None
    if not command.strip():
        return "the check command is empty"
    if "\0" in command:
        return "the check command contains a NUL byte"
    if len(command) > MAX_COMMAND_CHARS:
        return f"the check command is longer than {MAX_COMMAND_CHARS} characters"
    return None


def original_paths(paths: list[str] | tuple[str, ...], workdir: str) -> list[str]:
    """--check-original as workspace-relative paths (an absolute one must lie in the workdir); ValueError for one
    that leaves it or names it whole."""
    kept: list[str] = []
    for path in paths:
        if not path or "\0" in path or "\n" in path:
            raise ValueError(f"--check-original takes a path of the workdir, not {path!r}")
        if any(c in path for c in "*?["):   # (taken as written, a pattern would protect nothing, and say nothing)
            raise ValueError(f"--check-original {path}: a path, not a pattern (name each file, or their directory)")
        rel = posixpath.normpath(posixpath.relpath(path, workdir) if path.startswith("/") else path)
        if rel in (".", "..") or rel.startswith("../") or rel.startswith("/"):
            raise ValueError(f"--check-original {path}: not a path inside the workdir {workdir}")
        kept.append(rel)
    return kept
