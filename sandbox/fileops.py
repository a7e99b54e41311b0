"""The read and write tools' file access, as small shell snippets run as the agent (never as pid's root server).

Why snippets: a file the agent names is opened with the agent's own permissions, in its own process, so a symlink
or FIFO it planted can only ever reach what the agent could reach itself. The snippet's exit status says what went
wrong, in errno terms the tools already speak.
"""
from __future__ import annotations

from pid.sandbox_api import RUN_ANYWHERE

import errno
import os

# exit status of a snippet -> the exception the builtins would raise
_ERRORS: dict[int, tuple[type[OSError], int]] = {
    90: (FileNotFoundError, errno.ENOENT),
    91: (IsADirectoryError, errno.EISDIR),
    92: (PermissionError, errno.EACCES),
    93: (NotADirectoryError, errno.ENOTDIR),
    94: (OSError, errno.EINVAL),          # not a regular file (FIFO, device): refused rather than blocking
    95: (OSError, errno.ENOSPC),          # the write itself failed: the job's disk is full (or quota)
    125: (OSError, errno.ENOSPC),         # the snippet reached its shell cut short (its file on a full disk)
    126: (OSError, errno.ENOSPC),         # the snippet could not start: its output file could not be made (no inode)
}

# bash: copies the first $2 bytes of $1 to stdout with builtins only (no fork); NUL bytes, which a shell variable
# cannot hold, end each `read` and are written back one by one; a file with many of them is finished by head.
_BASH_EMIT = r"""e() {
  local LC_ALL=C l=$2 w c n=0
  while [ "$l" -gt 0 ]; do
    w=$l
    IFS= read -r -d '' -n "$w" c || { printf '%s' "$c"; return 0; }
    printf '%s' "$c"; l=$((l - ${#c}))
    [ "${#c}" -lt "$w" ] || continue
    printf '\0'; l=$((l - 1)); n=$((n + 1))
    if [ "$n" -gt 64 ] && [ "$l" -gt 0 ]; then tail -c +$(($2 - l + 1)) -- "$1" | head -c "$l"; return 0; fi
  done <"$1"
}
"""

_CHECK_READ = """[ -d "$f" ] && exit 91
[ -e "$f" ] || exit 90
[ -r "$f" ] || exit 92
[ -f "$f" ] || exit 94
"""

_CHECK_WRITE = """case $f in */*) d=${f%/*} ;; *) d=. ;; esac
[ -z "$d" ] || [ -d "$d" ] || mkdir -p -- "$d" 2>/dev/null || exit 93
[ -d "$f" ] && exit 91
[ -e "$f" ] && [ ! -f "$f" ] && exit 94
"""
_TRUNCATE = """{ : >"$f"; } 2>/dev/null || { [ -e "$f" ] && { [ -w "$f" ] && exit 95; exit 92; }; [ -w "${d:-/}" ] && exit 95; exit 92; }
"""
# A write truncates the file first: one that then fails for room would leave it empty. Where the host saw the job's
# disk nearly full (ROOM_MARGIN), the snippet first checks that the new content fits in what is free plus what the
# old content frees, and refuses (ENOSPC) with the file untouched. (Two stats, forks: only on a nearly full disk;
# gVisor's stat of a file on a full disk fails with EINVAL, where wc still counts it.)
_CHECK_ROOM = """h=0; [ -f "$f" ] && h=$(stat -c %%s -- "$f" 2>/dev/null || wc -c <"$f" 2>/dev/null || echo 0)
r=$(stat -f -c '%%a %%S' -- "${d:-/}/" 2>/dev/null) && set -- "${1-}" $r && \
  [ $((%d + 65536)) -gt $(($2 * $3 + h)) ] && exit 95
"""   # (64 KiB of slack: blocks the new content's extents may take besides its own)
ROOM_MARGIN = 1 << 20   # free bytes past a write's size under which the host asks for _CHECK_ROOM


def _checked_write(path: str, size: int, careful: bool) -> bytes:
    """The start of a write snippet: the path's checks, the room check when `careful`, the truncation."""
    room = (_CHECK_ROOM % size) if careful else ""
    return ANYWHERE + b"f=" + quote(path) + b"\n" + (_CHECK_WRITE + room + _TRUNCATE).encode() + b"exec 2>/dev/null\n"


_BUILTIN_COPY_MAX = 32768   # bash copies this much with builtins faster than `cat` starts
# bash: a write whose data, escaped, fits a command this long carries it in the command (inline_write_snippet):
# the server and the shell read it with builtins, where an upload is copied to its file by a process (head -c).
# A server without slot shells starts the command as one argument of an exec (`bash -c`, after a line of the
# image's variables), which Linux caps at 128 KiB (MAX_ARG_STRLEN): half of that leaves a wide margin.
INLINE_MAX = 1 << 16

# Snippets name absolute paths, so they run even when the working directory is gone (channel.sh refuses other
# commands then, as pi's bash does).
ANYWHERE = RUN_ANYWHERE.encode()


def quote(value: str | bytes) -> bytes:
    """Single-quote for the shell, byte for byte."""
    raw = os.fsencode(value) if isinstance(value, str) else value
    return b"'" + raw.replace(b"'", b"'\\''") + b"'"


def read_snippet(shell: str, path: str, max_bytes: int) -> bytes:
    """Print the first max_bytes bytes of `path`."""
    head = ANYWHERE + b"f=" + quote(path) + b"\n" + _CHECK_READ.encode()
    if shell == "bash":
        return head + _BASH_EMIT.encode() + b'e "$f" %d 2>/dev/null\n' % max_bytes
    return head + b'exec head -c %d -- "$f" 2>/dev/null\n' % max_bytes


def readable_snippet(paths: list[str]) -> bytes:
    """Print the index of each of `paths` that is a regular file the agent can read, one a line (numbers, not the
    names: the host takes nothing else from what the agent could have placed there)."""
    names = b" ".join(quote(p) for p in paths)
    return (ANYWHERE + b"i=0\nfor f in " + names + b'; do [ -f "$f" ] && [ -r "$f" ] && echo "$i"; i=$((i + 1)); '
            b"done\nexit 0\n")


def readable_indexes(output: bytes, count: int) -> set[int]:
    """readable_snippet's answer: its indexes below `count` (anything else in it is ignored)."""
    return {int(line) for line in output.split() if line.isdigit() and int(line) < count}


def write_snippet(shell: str, path: str, size: int, careful: bool = False) -> bytes:
    """Create or overwrite `path` (parents made, mode kept) with the `size` bytes of the uploaded file "$1"."""
    body = _checked_write(path, size, careful)
    if shell == "bash" and size <= _BUILTIN_COPY_MAX:
        return body + _BASH_EMIT.encode() + b'e "$1" %d >"$f" || exit 95\n' % size
    return body + b'cat -- "$1" >"$f" || exit 95\n'


def inline_write_snippet(path: str, data: bytes, limit: int, careful: bool = False) -> bytes | None:
    """write_snippet for bash with the data in the command itself (printf %b: a backslash doubled, NUL as \\0000),
    so that no upload is stored first; None when that command would be longer than `limit`."""
    if len(data) > limit:   # (escaping only lengthens it)
        return None
    escaped = data.replace(b"\\", b"\\\\").replace(b"\0", b"\\0000")
    snippet = _checked_write(path, len(data), careful) + b"printf %b " + quote(escaped) + b' >"$f" || exit 95\n'
    return snippet if len(snippet) <= limit else None


def raise_for_status(status: int, path: str) -> None:
    """Turn a snippet's exit status into the builtin exception, or return for success."""
    if status == 0:
        return
    kind, code = _ERRORS.get(status, (OSError, errno.EIO))
    raise kind(code, os.strerror(code), path)
