"""How `pid batch` shows its progress: a live table on a terminal (rich), else one line per item as it ends
(`--json`: the item's batch.jsonl object), and the summary at the end. Item ids, errors and what the jobs do come from
the tasks file, models and agents: every one passes through pid.terminal (rich's table is no pid.cli.output.echo)."""
from __future__ import annotations

import sys
from typing import Any

from pid.cli.output import echo, format_duration, missing_originals_warning
from pid.jobs.batch import check_verdict
from pid.cli.table import Column, cut
from pid.cli.table import render as table_lines
from pid.costs import format_cost
from pid.endings import ending_words
from pid.terminal import dumps, one_line, shown
from pid.jobs.batch_run import Display, Progress

RUNNING_SHOWN = 12   # running items listed in the live table at most


def item_line(row: dict[str, Any], done: int, total: int) -> str:
    checked = f" check={said.replace(' ', '-')}" if (said := check_verdict(row)) else ""
    error = f": {one_line(str(row['error']))}" if row.get("error") and row.get("status") != "completed" else ""
    ending = ending_words(row['status'], row['exit_reason'])
    return (f"[{done}/{total}] {one_line(str(row['id']))} {ending} turns={row['turns']} "
            f"{format_cost(row['cost'])} {format_duration(row.get('duration_s'))}{checked}{error}")


def item_warning(row: dict[str, Any]) -> str | None:
    """What an ended item's user should hear of beside its line: --check-original paths its original lacks."""
    warning = missing_originals_warning(row)   # (a row's check is its result.json's)
    return None if warning is None else f"warning: {one_line(str(row['id']))}: {warning}"


class Lines:
    """Without a terminal: a line per item as it ends, on stdout (--json: its batch.jsonl object)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def item_ended(self, row: dict[str, Any], progress: Progress) -> None:
        done = sum(progress.counts.get(s, 0) for s in ("completed", "failed", "limit", "cancelled"))
        echo(dumps(row) if self.as_json else item_line(row, done, progress.total))
        if (warning := item_warning(row)) is not None:
            self.note(warning)

    def update(self, progress: Progress) -> None:
        pass

    def note(self, text: str) -> None:
        echo(text, err=True)

    def stop(self) -> None:
        pass


class Live:
    """On a terminal: counts by status, the running items (turn, what they do), cost, rate and ETA, redrawn in
    place (rich.live); each ended item also prints a line above the table."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live as RichLive
        self.console = Console(stderr=False)
        self.live = RichLive(console=self.console, refresh_per_second=4, transient=True)
        self.live.start()

    def item_ended(self, row: dict[str, Any], progress: Progress) -> None:
        done = sum(progress.counts.get(s, 0) for s in ("completed", "failed", "limit", "cancelled"))
        self.console.print(shown(item_line(row, done, progress.total)), markup=False, highlight=False)
        if (warning := item_warning(row)) is not None:
            self.note(warning)

    def update(self, progress: Progress) -> None:
        self.live.update(render(progress, self.console.width))

    def note(self, text: str) -> None:
        self.console.print(shown(text), markup=False, highlight=False)

    def stop(self) -> None:
        self.live.stop()


LIVE_COLUMNS = [Column("item", shrink="end", min=8), Column("turn", right=True), Column("cost", right=True),
                Column("now", shrink="start", min=12), Column("last tool", shrink="start", min=20)]
CELL_SHOWN = 60   # of an activity or a last tool, before the terminal's width is considered
ITEM_SHOWN = 24   # of an item's id (its end: ids are typed by their end)


def spend_words(cost: float, spent: float, budget: float | None) -> str:
    """What the batch's jobs cost, and of its budget: `$2.03 of $5.00`; when earlier jobs (a rerun's, earlier
    attempts) spent more of it, that too, as the budget counts it: `$2.03 ($7.36 with earlier jobs) of $7.00`."""
    if budget is None:
        return format_cost(cost)
    earlier = with_earlier(cost, spent)
    return f"{format_cost(cost)}{f' ({earlier})' if earlier else ''} of {format_cost(budget)}"


def with_earlier(cost: float, spent: float) -> str:
    """`$7.36 with earlier jobs` when the batch's jobs spent more than its latest ones cost (a rerun's, earlier
    attempts), else ""."""
    return f"{format_cost(spent)} with earlier jobs" if spent > cost + 1e-6 else ""


def render(progress: Progress, width: int | None = None) -> Any:
    """The live table (a rich renderable), within `width` columns: laid out by cli/table.py as `pid list` is, so
    that the turn and cost columns stay readable however long an item's id or activity is."""
    from rich.console import Group
    from rich.text import Text
    counts = "  ".join(f"{status} {n}" for status, n in sorted(progress.counts.items()) if n)
    rate, eta = progress.rate(), progress.eta_s()
    head = Text(f"{progress.total} items  {counts or 'starting'}  ·  "
                f"{spend_words(progress.cost, progress.spent, progress.budget)}  ·  "
                f"{f'{rate:.1f}/min' if rate else '-/min'}  ·  ETA {format_duration(eta)}", no_wrap=True,
                overflow="ellipsis")
    rows = []
    for item_id, record in progress.running[:RUNNING_SHOWN]:
        now = (record.activity or record.status).split(": ", 1)[-1]
        item, last_tool = cut(one_line(item_id), ITEM_SHOWN, "end"), one_line(record.last_tool or "-")
        rows.append([item, str(record.turns), format_cost(record.total_usage['cost']),
                     cut(one_line(now), CELL_SHOWN, "start"), cut(last_tool, CELL_SHOWN, "start")])
    lines = table_lines(LIVE_COLUMNS, rows, width)
    parts: list[Any] = [head, Text(lines[0], style="bold", no_wrap=True)]
    parts += [Text(line, no_wrap=True) for line in lines[1:]]
    more = len(progress.running) - RUNNING_SHOWN
    if more > 0:
        parts.append(Text(f"… and {more} more running"))
    return Group(*parts)


def make_display(as_json: bool) -> Display:
    if not as_json and sys.stdout.isatty():
        try:
            return Live()
        except Exception:   # no usable terminal after all: lines
            pass
    return Lines(as_json)


def summary_text(summary: dict[str, Any], where: str) -> str:
    """The summary for people (summary.json has the same numbers)."""
    s = summary
    counts = ", ".join(f"{n} {status}" for status, n in sorted(s["by_status"].items()))
    lines = [f"{s['items']} items: {counts or 'none ended'}" + (f", {s['not_ended']} not ended" if s["not_ended"]
                                                               else "")]
    check = s["check"]
    asked = check.get("asked", check["checked"])
    if asked:
        unjudged = asked - check["checked"]
        lines.append(f"check: {check['passed']}/{asked} passed ({check['pass_rate'] * 100:.0f}%)" +
                     (f", {unjudged} of them never checked (their jobs did not complete)" if unjudged else ""))
    missing = check.get("original_missing") or []
    if missing:
        shown_ids = ", ".join(one_line(str(i)) for i in missing[:5]) + (f" and {len(missing) - 5} more"
                                                                       if len(missing) > 5 else "")
        lines.append(f"warning: {len(missing)} item(s) named --check-original paths their original workspace does "
                     f"not have, which protects nothing there (a misspelt path?): {shown_ids} (batch.jsonl's "
                     "check.original_missing)")
    cost, tokens, dur = s["cost"], s["tokens"], s["duration_s"]
    earlier = with_earlier(cost["total"], cost.get("all_jobs", 0))
    lines.append(f"cost: {format_cost(cost['total'])} (per item p50 {format_cost(cost['p50'] or 0)}, "
                 f"p95 {format_cost(cost['p95'] or 0)}{f', {earlier}' if earlier else ''})"
                 f"  tokens: {int(tokens['total'])} (p50 {int(tokens['p50'] or 0)}, p95 {int(tokens['p95'] or 0)})")
    lines.append(f"duration: p50 {format_duration(dur['p50'])}, p95 {format_duration(dur['p95'])}")
    if s["slowest"]:
        lines.append("slowest: " + ", ".join(f"{x['id']} {format_duration(x['duration_s'])}" for x in s["slowest"][:3]))
    if s["most_expensive"] and s["most_expensive"][0]["cost"]:
        lines.append("most expensive: " +
                     ", ".join(f"{x['id']} {format_cost(x['cost'])}" for x in s["most_expensive"][:3]))
    lines.append(f"results: {where}")
    return "\n".join(lines)
