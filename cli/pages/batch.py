"""A batch directory as HTML: an index page (a sortable table of the items) and one page per item beside it.

Why separate pages rather than one file with anchors: each job's page is bounded (cli/pages/job.py), but fifty of
them in one file would not be, and a browser opens a small index at once; every file stays self-contained (no
asset, no network) and the links between them are relative, so the view/ folder can be copied or archived whole.

The batch directory (written by `pid batch --out DIR`): DIR/batch.jsonl, one JSON object per item (id, job_id,
status, exit_reason, exit_code, cost, tokens, turns, duration_s, check, check_asked), DIR/summary.json, and DIR/<id>/
holding each item's artifacts. Any field may be missing; lines that are not JSON objects are counted and skipped; an id
seen twice (a resumed batch) keeps its last line, in its first place.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from pid.jobs.batch import check_verdict
from pid.cli.pages.blocks import (LIMITS, Limits, badge, check_badge, esc, fmt_cost, fmt_duration, fmt_int, number,
                                  page, status_class, write_page)
from pid.cli.pages.job import read_result, render_job

BATCH = "batch.jsonl"
SUMMARY = "summary.json"
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")   # what `pid batch` allows as an id, but a leading -

SORT_SCRIPT = """(function(){
var t=document.getElementById('items');if(!t||!t.tHead)return;var b=t.tBodies[0],hs=t.tHead.rows[0].cells;
function val(r,i,num){var v=r.cells[i].getAttribute('data-v');if(v===null||v==='')return null;return num?+v:v;}
function sort(i,desc){var num=hs[i].classList.contains('num'),rows=Array.prototype.slice.call(b.rows);
rows.sort(function(x,y){var a=val(x,i,num),c=val(y,i,num);if(a===null||c===null)return (a===null)-(c===null);
var r=num?a-c:String(a).localeCompare(String(c),undefined,{numeric:true});return desc?-r:r;});
rows.forEach(function(r){b.appendChild(r);});
for(var k=0;k<hs.length;k++)hs[k].removeAttribute('aria-sort');
hs[i].setAttribute('aria-sort',desc?'descending':'ascending');}
Array.prototype.forEach.call(hs,function(h,i){function go(){sort(i,h.getAttribute('aria-sort')==='ascending');}
h.addEventListener('click',go);h.addEventListener('keydown',function(e){if(e.key==='Enter'||e.key===' '){
e.preventDefault();go();}});});
var m=/^#sort=([a-z_]+)(-desc)?$/.exec(location.hash);
if(m)Array.prototype.forEach.call(hs,function(h,i){if(h.getAttribute('data-key')===m[1])sort(i,!!m[2]);});
})();"""


@dataclass
class Item:
    line: dict[str, Any]
    page: str | None = None       # its job page's file name, when its artifacts are here
    task: str = ""

    @property
    def id(self) -> str:
        return str(self.line.get("id", ""))


def read_items(batch_dir: str) -> tuple[list[Item], int]:
    """The items of batch.jsonl (the last line of each id) and how many lines were unreadable."""
    items: dict[str, Item] = {}
    bad = 0
    try:
        f = open(os.path.join(batch_dir, BATCH), encoding="utf-8", errors="replace")
    except OSError:
        return [], 0
    with f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError:
                bad += 1
                continue
            if not isinstance(obj, dict):
                bad += 1
                continue
            obj.setdefault("id", str(n))
            items[str(obj["id"])] = Item(obj)   # a later line of the same id replaces it, in its first place
    return list(items.values()), bad


def page_name(item_id: str, taken: set[str]) -> str:
    """A file name for an item's page: the id itself when it is a plain name, else a hash of it."""
    base = item_id if _SAFE_NAME.fullmatch(item_id) else \
        "item-" + hashlib.sha256(item_id.encode("utf-8", "replace")).hexdigest()[:12]
    name, n = f"{base}.html", 1
    while name.lower() in taken:
        n += 1
        name = f"{base}-{n}.html"
    taken.add(name.lower())
    return name


def item_dir(batch_dir: str, item: Item) -> str | None:
    """The item's artifact folder, DIR/<id> (or DIR/<job_id>): one plain component inside DIR, never outside."""
    root = os.path.realpath(batch_dir)
    for name in (item.id, str(item.line.get("job_id") or "")):
        if not name or "/" in name or "\\" in name or name in (".", "..") or "\0" in name:
            continue
        path = os.path.join(root, name)
        if os.path.isdir(path) and os.path.dirname(os.path.realpath(path)) == root and (
                os.path.exists(os.path.join(path, "result.json")) or
                os.path.exists(os.path.join(path, "session.jsonl"))):
            return path
    return None


def _flatten(obj: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """summary.json's fields, nested objects one level deep as `a.b`."""
    out: list[tuple[str, Any]] = []
    for key, value in obj.items():
        if isinstance(value, dict) and not prefix:
            out.extend(_flatten(value, f"{key}."))
        else:
            out.append((f"{prefix}{key}", value))
    return out


def summary_html(batch_dir: str, items: list[Item]) -> str:
    counts: dict[str, int] = {}
    for item in items:
        status = str(item.line.get("status") or "unknown")
        counts[status] = counts.get(status, 0) + 1
    checks = [i.line.get("check") for i in items
              if isinstance(i.line.get("check"), (dict, bool)) or i.line.get("check_asked") is True]
    passed = sum(1 for c in checks if (c.get("passed") if isinstance(c, dict) else c))   # (None: never checked)
    cost = sum(number(i.line.get("cost")) or 0.0 for i in items)
    tokens = sum(number(i.line.get("tokens")) or 0.0 for i in items)
    parts = [f"{len(items):,} items", *(f"{badge(f'{n} {s}', status_class(s))}" for s, n in sorted(counts.items())),
             f"checks passed {passed}/{len(checks)}" if checks else "", f"cost {fmt_cost(cost)}",
             f"{fmt_int(tokens)} tokens"]
    out = f'<p>{" · ".join(p for p in parts if p)}</p>'
    try:
        with open(os.path.join(batch_dir, SUMMARY), encoding="utf-8", errors="replace") as f:
            summary = json.load(f)
    except (OSError, ValueError):
        summary = None
    if isinstance(summary, dict):
        rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(json.dumps(v, ensure_ascii=False)[:300])}</dd>"
                       for k, v in _flatten(summary)[:60])
        out += f'<details><summary>summary.json</summary><dl class="meta">{rows}</dl></details>'
    return out


COLUMNS = [("id", "id", False), ("status", "status", False), ("check", "check", False), ("cost", "cost", True),
           ("tokens", "tokens", True), ("turns", "turns", True), ("duration", "duration_s", True),
           ("task", "task", False)]


def row_html(item: Item) -> str:
    line = item.line
    status = str(line.get("status") or "unknown")
    check = line.get("check")
    if isinstance(check, bool):   # (an older batch.jsonl's)
        check_v = "passed" if check else "failed"
    else:
        check_v = check_verdict(line) or ""
    name = f'<a href="{esc(item.page)}">{esc(item.id)}</a>' if item.page else esc(item.id)
    reason = f' <span class="dim">{esc(line["exit_reason"])}</span>' if line.get("exit_reason") else ""

    def num(key: str) -> str:
        n = number(line.get(key))
        return "" if n is None else repr(n)
    cells = [
        (esc(item.id), name, ""),
        (esc(status), badge(status, status_class(status)) + reason, ""),
        (check_v, check_badge(check) if check_v != "not run" else badge("not run", "bad"), ""),
        (num("cost"), fmt_cost(line.get("cost")), "num"),
        (num("tokens"), fmt_int(line.get("tokens")), "num"),
        (num("turns"), fmt_int(line.get("turns")), "num"),
        (num("duration_s"), fmt_duration(line.get("duration_s")), "num"),
        (esc(item.task[:200]), esc(item.task[:80] + ("…" if len(item.task) > 80 else "")), "task"),
    ]
    tds = "".join(f'<td class="{cls}" data-v="{v}">{shown}</td>' for v, shown, cls in cells)
    return f'<tr data-id="{esc(item.id)}">{tds}</tr>'


def render_batch(batch_dir: str, out_dir: str, index_name: str = "index.html",
                 limits: Limits = LIMITS, items_dir: str = "") -> tuple[str, list[str]]:
    """Writes the index into out_dir and the items' pages beside it, or into its subfolder `items_dir` (a page named
    with -o shares its folder with files of the user's, which an item's page must not replace); returns the index's
    path and the pages written."""
    items, bad = read_items(batch_dir)
    os.makedirs(os.path.join(out_dir, items_dir), exist_ok=True)
    taken = {index_name.lower()}
    pages: list[str] = []
    for item in items:
        folder = item_dir(batch_dir, item)
        if folder is None:
            continue
        name = page_name(item.id, taken)
        item.page = (quote(items_dir) + "/" if items_dir else "") + name   # (a link: -o's name may hold "#" or "?")
        result = read_result(folder, limits) or {}
        item.task = " ".join(str(result.get("task") or "").split())
        fallback: dict[str, Any] = {k: item.line[k] for k in ("status", "exit_reason", "turns", "duration_s", "check")
                    if k in item.line}
        fallback["id"] = item.line.get("job_id") or item.id
        path = os.path.join(out_dir, items_dir, name)
        back = "../" + quote(index_name) if items_dir else index_name
        write_page(path, render_job(folder, fallback=fallback, back_link=back, limits=limits))
        pages.append(path)
    head = "".join(f'<th class="{"num" if numeric else ""}" data-key="{key}" tabindex="0">{title}</th>'
                   for title, key, numeric in COLUMNS)
    rows = "".join(row_html(item) for item in items)
    note = f'<p class="note">{bad:,} line(s) of {BATCH} are not JSON objects and are not shown.</p>' if bad else ""
    empty = f'<p class="dim">{BATCH} lists no items yet.</p>' if not items else ""
    title = f"pid batch {os.path.basename(os.path.abspath(batch_dir))}"
    body = (f"<h1>{esc(title)}</h1>{summary_html(batch_dir, items)}{note}{empty}"
            f'<table id="items"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'
            '<p class="dim">Click a column header to sort by it.</p>')
    index = os.path.join(out_dir, index_name)
    write_page(index, page(title, body, SORT_SCRIPT))
    return index, pages
