"""The image's environment, kept from pid's root machinery and handed to the agent's commands alone.

The engine starts every process of a container, pid's root servers included, with the image's ENV. Some variables
make a program load or run files: the dynamic loader's (LD_PRELOAD, LD_LIBRARY_PATH, …), the shells' (BASH_ENV, ENV,
exported functions, xtrace's PS4) and a few of glibc's. Named in a task image (a CUDA image's LD_LIBRARY_PATH, a conda
image's BASH_ENV), they would point pid's root processes at /opt or /usr/local, which the agent may now change. The
engine cannot unset an image's variable, but an empty one is inert: pid sets each of these to "" for the container
and its execs, and passes their values in PID_IMAGE_ENV (as `export NAME='value'` lines) for the agent's shells to
take back once they run as the agent (sandbox/channel.sh).
"""
from __future__ import annotations

import re
import shlex
from typing import Any

HAZARDS = {"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "CDPATH", "GLOBIGNORE", "BASH_XTRACEFD",
           "PROMPT_COMMAND", "GCONV_PATH", "LOCPATH", "NLSPATH", "GLIBC_TUNABLES", "HOSTALIASES", "MALLOC_CONF",
           # bash's own behaviour (emptied, each means its default): TMOUT ends an idle server's read, the others
           # change what its functions and builtins do
           "TMOUT", "FUNCNEST", "BASH_COMPAT", "EXECIGNORE"}
HAZARD_PREFIXES = ("LD_", "BASH_FUNC_")
NOT_CARRIED = {"SHELLOPTS", "BASHOPTS"}   # read-only in bash once it runs: emptied, never given back
CARRIER = "PID_IMAGE_ENV"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")   # what any shell's `export` takes (dash ends on anything else)


def hazardous(name: str) -> bool:
    return name in HAZARDS or name.startswith(HAZARD_PREFIXES)


def image_env(inspected: dict[str, Any]) -> dict[str, str]:
    """The image's ENV (an image inspect's Config.Env) as a dict."""
    env: dict[str, str] = {}
    for item in (inspected.get("Config") or {}).get("Env") or []:
        name, _, value = str(item).partition("=")
        env[name] = value
    return env


def neutralised(env: dict[str, str]) -> dict[str, str]:
    """What the container's environment adds to the image's: each hazardous variable emptied, and the carrier with
    their values (not exported functions, whose names no shell can export back, nor bash's read-only options)."""
    found = {name: value for name, value in env.items() if hazardous(name)}
    if not found:
        return {}
    carried = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in sorted(found.items())
                      if _NAME.fullmatch(name) and name not in NOT_CARRIED)
    return {**{name: "" for name in found}, CARRIER: carried}
