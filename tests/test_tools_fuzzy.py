"""Normalisation for fuzzy edits and the mapping of a normalised match back to the original text."""
from pid.tools.fuzzy import LineEndings, NormalizedText, find_unique, normalize_fuzzy


def test_normalize_fuzzy():
    assert normalize_fuzzy("a = 1   \nb\t\n") == "a = 1\nb\n"
    assert normalize_fuzzy("“x” ‘y’") == "\"x\" 'y'"
    assert normalize_fuzzy("a – b — c ‐ d − e") == "a - b - c - d - e"
    assert normalize_fuzzy("x\u00a0y\u202fz\u3000w") == "x y z w"
    assert normalize_fuzzy("ＡＢＣ（１）") == "ABC(1)"
    assert normalize_fuzzy("e\u0301") == "é"  # combining sequence composed by NFKC


def test_spans_map_back_to_source():
    src = "keep  \nＡ\u00a0= “q”   \ntail"
    norm = NormalizedText.build(src)
    assert norm.text == "keep\nA = \"q\"\ntail"
    at = norm.text.index("A = \"q\"")
    start, end = norm.source_span(at, at + len("A = \"q\""))
    assert src[start:end] == "Ａ\u00a0= “q”"  # trailing spaces after it are not part of the match


def test_find_unique_exact_then_fuzzy():
    text = "x = “a”\ny = 'b'\n"
    exact, _ = find_unique(text, "y = 'b'")
    assert not exact.fuzzy and exact.span == (8, 15)
    fuzzy, _ = find_unique(text, 'x = "a"')
    assert fuzzy.fuzzy and fuzzy.count == 1 and text[slice(*fuzzy.span)] == "x = “a”"


def test_find_unique_counts_after_normalisation():
    match, _ = find_unique("a\u00a0b\na\u2009b\n", "a b")
    assert match.count == 2 and match.span is None


def test_line_endings_map_lf_spans_to_crlf_text():
    original = "one\r\ntwo\nthree\r\n"
    le = LineEndings(original)
    assert le.lf == "one\ntwo\nthree\n" and le.newline == "\r\n"
    at = le.lf.index("two\nthree\n")
    a, b = le.to_original((at, at + len("two\nthree\n")))
    assert original[a:b] == "two\nthree\r\n"
    assert original[slice(*le.to_original((0, 4)))] == "one\r\n"
    assert le.restore("x\ny") == "x\r\ny"
    assert LineEndings("no newline").newline == "\n"
