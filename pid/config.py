"""Where pid keeps its state, and the settings every entry point reads from the environment."""
from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_IMAGE = "pid-sandbox:latest"
DEFAULT_BASE_URL = "https://api.openai.com/v1"


def pid_home() -> str:
    """PID_HOME, else the per-user data dir (XDG_DATA_HOME/pid, ~/.local/share/pid)."""
    home = os.environ.get("PID_HOME")
    if home:
        return os.path.abspath(home)
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data, "pid")


@dataclass
class EnvDefaults:
    model: str | None
    base_url: str
    api_key: str | None
    image: str
    api: str

    @classmethod
    def read(cls) -> "EnvDefaults":
        return cls(model=os.environ.get("PID_MODEL") or None,
                   base_url=os.environ.get("PID_BASE_URL") or DEFAULT_BASE_URL,
                   api_key=os.environ.get("PID_API_KEY") or os.environ.get("OPENAI_API_KEY") or None,
                   image=os.environ.get("PID_IMAGE") or DEFAULT_IMAGE,
                   api=os.environ.get("PID_API") or "openai-completions")
