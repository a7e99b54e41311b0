"""Token counting that works offline.

tiktoken fetches its BPE tables over the network the first time an encoding is used; on an air-gapped worker that
fails or hangs. pid therefore never lets tiktoken download on its own. It looks for the table locally, in order:
`PID_TIKTOKEN_FILE`, `$PID_HOME/tiktoken/<encoding>.tiktoken`, then tiktoken's own cache. The table is checked against
tiktoken's published hash. Without one, counting falls back to a conservative estimate and says so (`exact=False`);
`PID_TIKTOKEN_DOWNLOAD=1` allows tiktoken to fetch the table where the network permits.
"""
from __future__ import annotations

import base64
import hashlib
import logging
import math
import os
import tempfile
import threading
from dataclasses import dataclass
from typing import Callable

from pid.config import pid_home
from pid import settings

log = logging.getLogger(__name__)
DEFAULT_ENCODING = "o200k_base"
# Code and English average a little under 4 bytes a token; divide by 3 to over-count rather than under-count.
BYTES_PER_TOKEN_ESTIMATE = 3.0
_lock = threading.Lock()
_cache: dict[str, "TokenCounter"] = {}


@dataclass
class TokenCounter:
    encoding: str
    exact: bool
    _encode: Callable[[str], int]

    def count(self, text: str) -> int:
        return self._encode(text)


def _tiktoken_cache_path(url: str) -> str:
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR") or \
        os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest())


def _local_table(encoding: str, url: str) -> str | None:
    for path in (settings.TIKTOKEN_FILE.raw(),
                 os.path.join(pid_home(), "tiktoken", f"{encoding}.tiktoken"),
                 _tiktoken_cache_path(url)):
        if path and os.path.isfile(path):
            return path
    return None


def _estimate(text: str) -> int:
    return math.ceil(len(text.encode("utf-8", errors="replace")) / BYTES_PER_TOKEN_ESTIMATE)


def _load_exact(encoding: str) -> TokenCounter | None:
    import tiktoken
    import tiktoken.load
    import tiktoken_ext.openai_public as public

    constructor = getattr(public, encoding, None)
    if constructor is None:
        raise ValueError(f"unknown tiktoken encoding {encoding!r}")
    if settings.TIKTOKEN_DOWNLOAD.get():
        enc = tiktoken.get_encoding(encoding)
        return TokenCounter(encoding, True, lambda t: len(enc.encode(t, disallowed_special=())))

    def load_local(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        path = _local_table(encoding, url)
        if path is None:
            raise FileNotFoundError(url)
        with open(path, "rb") as f:
            data = f.read()
        # A file the user named explicitly is trusted; one found by convention must be the published table.
        if path != settings.TIKTOKEN_FILE.raw() and expected_hash \
                and hashlib.sha256(data).hexdigest() != expected_hash:
            log.warning("ignoring %s: not the published %s table (hash mismatch)", path, encoding)
            raise FileNotFoundError(path)
        return {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in data.splitlines() if line)}

    # The constructors in tiktoken_ext name the table by URL; swap the loader for one that never leaves the disk.
    original = public.load_tiktoken_bpe
    public.load_tiktoken_bpe = load_local
    try:
        params = constructor()
    except FileNotFoundError:
        return None
    finally:
        public.load_tiktoken_bpe = original
    enc = tiktoken.Encoding(**params)
    return TokenCounter(encoding, True, lambda t: len(enc.encode(t, disallowed_special=())))


def get_counter(encoding: str = DEFAULT_ENCODING) -> TokenCounter:
    """A counter for `encoding`, exact when its table is available offline, else a labelled estimate."""
    with _lock:
        counter = _cache.get(encoding)
        if counter is None:
            try:
                counter = _load_exact(encoding)
            except ImportError:
                counter = None
            counter = counter or TokenCounter(encoding, False, _estimate)
            _cache[encoding] = counter
        return counter


def reset_cache() -> None:
    with _lock:
        _cache.clear()
