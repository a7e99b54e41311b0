"""Token counting offline: an exact count from a local BPE table through real tiktoken, else a labelled estimate."""
import base64

import pytest

from pid import tokens


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("PID_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tkcache"))
    monkeypatch.delenv("PID_TIKTOKEN_FILE", raising=False)
    monkeypatch.delenv("PID_TIKTOKEN_DOWNLOAD", raising=False)
    tokens.reset_cache()
    yield
    tokens.reset_cache()


def write_table(path, extra_merges=(b"ab", b"abc")):
    """A tiny but real BPE table: all 256 single bytes, then a few merges."""
    ranks = [bytes([i]) for i in range(256)] + list(extra_merges)
    path.write_bytes(b"".join(base64.b64encode(tok) + b" %d\n" % i for i, tok in enumerate(ranks)))
    return path


def test_offline_without_table_falls_back_to_estimate_quickly():
    counter = tokens.get_counter()
    assert counter.exact is False
    assert counter.count("x" * 300) == 100  # 3 bytes a token: over-counts rather than under-counts
    assert counter.count("") == 0


def test_explicit_table_gives_exact_counts_through_tiktoken(tmp_path, monkeypatch):
    monkeypatch.setenv("PID_TIKTOKEN_FILE", str(write_table(tmp_path / "t.tiktoken")))
    counter = tokens.get_counter()
    assert counter.exact is True
    assert counter.count("abc") == 1      # merged through "ab" then "abc"
    assert counter.count("abd") == 2      # "ab" + "d"
    assert counter.count("zzz") == 3


def test_table_found_by_convention_is_read_but_must_match_published_hash(tmp_path, caplog):
    home_table = tmp_path / "home" / "tiktoken" / "o200k_base.tiktoken"
    home_table.parent.mkdir(parents=True)
    write_table(home_table)
    with caplog.at_level("WARNING", logger="pid.tokens"):
        counter = tokens.get_counter()  # wrong hash: ignored, not trusted
    assert counter.exact is False
    assert f"ignoring {home_table}: not the published o200k_base table" in caplog.text  # it was found and checked


def test_unknown_encoding_is_an_error():
    with pytest.raises(ValueError):
        tokens.get_counter("no_such_encoding")
