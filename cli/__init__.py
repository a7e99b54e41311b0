"""pid's command line (cli/main.py).

A Ctrl-C while pid's code loads, before any command has started anything, is one line and exit 130, never a
traceback from the middle of an import: this handler is set first of all, when this process is the `pid` command
(`pid …` or `python -m pid.cli.main …`; not a program that imports pid), and pid.cli.main puts Python's own back once
loaded.
"""
from __future__ import annotations

import os
import signal
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
if _is_the_command() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    try:
        signal.signal(signal.SIGINT, _interrupted_while_loading)
        LOADING = True
    except ValueError:   # not the main thread
        pass
