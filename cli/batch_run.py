"""`pid batch`'s following of a run (pid/jobs/batch_run.py): its display, its Ctrl-C, its summary and exit code.
The run reports; this prints."""
from __future__ import annotations

import shlex
import signal
import sys
from typing import Any, NoReturn

from pid.cli import Interrupted
from pid.cli.batch_progress import make_display, summary_text
from pid.cli.output import echo
from pid.terminal import dumps
from pid.jobs.batch_run import Progress, Run, count, item_state

__all__ = ["EXIT_INTERRUPTED", "Progress", "count", "follow", "item_state", "without_secrets"]

EXIT_INTERRUPTED = 130


def follow(run: Run, as_json: bool, tasks: str | None, existing: bool = False) -> NoReturn:
    """Follow the run to its end (the live table, or a line per item), print the summary and exit with its code.
    A first Ctrl-C cancels the batch's jobs and waits for them to end, a second stops waiting: 130. SIGTERM or
    SIGHUP (a CI step's timeout, a closed terminal) stops following at once: the jobs go on, the command that resumes
    is said (it ended without a word), and the exit code is 128 + the signal's number."""
    def on_stop(signum: int, frame: Any) -> None:
        if run.stopping:   # waiting for the downloads: that wait ends too
            raise SystemExit(128 + signum)
        run.let_go(signum)   # (following stops at its next pass: nothing is left half-recorded)

    def on_sigint(signum: int, frame: Any) -> None:
        if run.stopping:   # waiting for the downloads: Ctrl-C ends that wait (what is queued is fetched by a rerun)
            raise Interrupted
        if run.interrupt() == 1:
            echo("\ninterrupted: cancelling the batch's queued and running jobs (Ctrl-C again: stop waiting "
                 "for them)…", err=True)

    display = make_display(as_json)
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, on_sigint),
                **{sig: signal.signal(sig, on_stop) for sig in (signal.SIGTERM, signal.SIGHUP)}}
    try:
        summary = run.follow_existing(display) if existing else run.follow(display)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if run.let_go_by:   # (its local workers, if any, hand their jobs back as the run closes)
        again = this_command() if tasks else f"pid batch --wait {shlex.quote(run.bdir.path)}"
        echo(f"stopped by {signal.Signals(run.let_go_by).name}: the batch's jobs go on; resume with: {again}", err=True)
        sys.exit(128 + run.let_go_by)
    echo(dumps({"summary": summary}) if as_json else summary_text(summary, run.bdir.path))
    if run.interrupted:
        bdir = run.bdir
        ended = sum(1 for i in bdir.order if i in bdir.rows)
        left = len(run.tracked)
        echo(f"interrupted: {ended} of {len(bdir.order)} item(s) ended"
             + (f", {left} still ending (their jobs were cancelled)" if left else "")
             + f"; resume with: {resume_command(run, tasks)}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(summary["exit_code"])


def resume_command(run: Run, tasks: str | None) -> str:
    """What resumes the batch: this command (given its tasks file), else the one that made it."""
    if tasks:
        return this_command()
    # --wait DIR: it cannot submit the cancelled items again; the command that made the batch can
    made = str(run.bdir.meta.get("tasks") or "TASKS")
    return (f"pid batch {shlex.quote(made)} --out {shlex.quote(run.bdir.path)} and the options that submitted it "
            "(without --detach to follow it here)")


def this_command() -> str:
    """The `pid batch` command line this process runs, its secrets left out: what resumes the batch."""
    return "pid " + shlex.join(["batch", *without_secrets(sys.argv[2:])])


def without_secrets(args: list[str]) -> list[str]:
    """The command line to print, its --api-key value replaced (a terminal's scrollback or a CI log keeps it);
    PID_API_KEY or the option given again supplies it."""
    shown, hide = [], False
    for arg in args:
        if hide:
            shown.append("KEY")
            hide = False
        elif arg == "--api-key":
            shown.append(arg)
            hide = True
        elif arg.startswith("--api-key="):
            shown.append("--api-key=KEY")
        else:
            shown.append(arg)
    return shown
