"""The job spec (what `submit` sends through the queue) and the job result (result.json). Plain JSON data."""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

from pid.config import DEFAULT_IMAGE
from pid.endings import exit_code_for  # noqa: F401  (the CLI's import; defined in pid.endings)

def new_job_id() -> str:
    """Sortable by submission time, unique without coordination."""
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


@dataclass
class JobSpec:
    task: str
    repo: str                       # absolute host path of the repository or directory to work on
    model: str
    out_dir: str                    # absolute; artifacts go to out_dir/<id>/
    base_url: str
    api: str = "openai-completions"
    image: str = DEFAULT_IMAGE
    timeout_s: float = 3600.0       # wall clock for the whole job
    max_turns: int = 100
    max_cost: float | None = None
    input_price: float = 0.0        # USD per million input tokens, for usage.cost and max_cost
    output_price: float = 0.0       # USD per million output tokens
    images: bool = True             # the model accepts images (else read's images reach it as a note)
    tools: list[str] | None = None  # active subset; None = all four
    files: list[str] = field(default_factory=list)  # in-container paths to collect as artifacts
    memory: str = "2g"
    cpus: float = 1.0
    pids_limit: int = 512
    network: str = "none"
    user: str = "1000:1000"         # the agent's uid:gid in the container; "root" is an explicit opt-in
    disk: int = 10 << 30            # bytes the job may write in all (workspace, /tmp, home, kept output); 0: no limit
    runtime: str | None = None      # engine runtime (e.g. runsc for gVisor); None: the engine's default
    max_patch: int = 100 << 20      # patch.diff larger than this is refused (the job fails: artifact_error)
    max_files_bytes: int = 100 << 20  # --file collection: bytes in all...
    max_files: int = 10000          # ...and entries in all; what is over is skipped and listed
    id: str = field(default_factory=new_job_id)

    @property
    def job_dir(self) -> str:
        return os.path.join(self.out_dir, self.id)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JobSpec":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def write_json_atomic(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
