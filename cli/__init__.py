"""pid's command line (cli/main.py).

A Ctrl-C while pid's code loads, before any command has started anything, is one line and exit 130, never a
traceback from the middle of an import: this handler is set first of all, when this process is the `pid` command
(`pid …` or `python -m pid.cli.main …`; not a program that imports pid), and pid.cli.main's main(), once loaded,
sets one that raises Interrupted (a KeyboardInterrupt, which main() and the commands handle).
"""
from __future__ import annotations

import _signal   # (not `signal`, which builds its enums: ~1 ms more before this handler is set)
import os
import sys


def _interrupted_while_loading(signum: int, frame: object) -> None:
    os.write(2, b"interrupted\n")   # (pid's own constant words: nothing to sanitise, and no echo loaded yet)
    os._exit(130)


def _is_the_command() -> bool:
    """`pid …` (the console script), or `python -m pid.cli.main …` (runpy's argv[0] is "-m" while it finds the
    module)."""
    first = sys.argv[0] if sys.argv else ""
    return first == "-m" or os.path.basename(first) == "pid"


LOADING = False   # the handler above is set (a SIGINT ignored, or a program that imports pid, is left as it is)
if _is_the_command() and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    try:
        _signal.signal(_signal.SIGINT, _interrupted_while_loading)
        LOADING = True
    except ValueError:   # not the main thread
        pass


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or a stop signal pid turns into one) once pid's command has loaded. Not KeyboardInterrupt itself:
    CPython (3.10–3.13 at least, under `python -m`) marks one that passes out of code run by exec() or eval() of a
    string (every dataclass's __init__ is made so, as a module loads) as unhandled, and though pid caught it and asked
    for exit code 130, ends the process by SIGINT. It checks the exact type; every `except KeyboardInterrupt` catches
    this one. (Defined after the handler above is set: making a class is a call, where a Ctrl-C lands.)"""


def raise_interrupted(signum: int, frame: object) -> None:
    """The command's SIGINT handler (cli/main.py), in place of signal.default_int_handler."""
    raise Interrupted
