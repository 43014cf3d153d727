"""ARPA n-gram LMs: the back-off rule by hand arithmetic, every format error with its line number,
and write/read round trips (plain and gzip)."""

import gzip
import io

import pytest

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.speech.ctc.arpa import NGramModel, read_arpa, write_arpa

# Line numbers matter: the error tests below edit single lines of this text.
LINES = [
    "\\data\\",               # 1
    "ngram 1=5",              # 2
    "ngram 2=4",              # 3
    "ngram 3=2",              # 4
    "",                       # 5
    "\\1-grams:",             # 6
    "-1.0\t<unk>",            # 7
    "-99\t<s>\t-0.5",         # 8
    "-0.7\t</s>",             # 9
    "-0.6\ta\t-0.3",          # 10
    "-0.8\tb\t-0.2",          # 11
    "",                       # 12
    "\\2-grams:",             # 13
    "-0.3\t<s> a\t-0.1",      # 14
    "-0.4\ta b\t-0.15",       # 15
    "-0.5\tb </s>",           # 16
    "-0.6\ta a",              # 17
    "",                       # 18
    "\\3-grams:",             # 19
    "-0.2\t<s> a b",          # 20
    "-0.25\ta b </s>",        # 21
    "",                       # 22
    "\\end\\",                # 23
]
TEXT = "\n".join(LINES) + "\n"


def edited(**changes: str | None) -> str:
    """TEXT with line `_N` replaced (or dropped, for None)."""
    lines = [changes.get(f"_{i}", line) for i, line in enumerate(LINES, 1)]
    return "\n".join(line for line in lines if line is not None) + "\n"


def test_probabilities_follow_the_backoff_rule():
    lm = read_arpa(TEXT)
    assert lm.order == 3 and lm.vocabulary == ["<unk>", "<s>", "</s>", "a", "b"]
    assert lm.ngrams[0][("<s>",)] == (-99.0, -0.5) and lm.ngrams[0][("</s>",)] == (-0.7, 0.0)
    cases = {
        (("<s>", "a"), "b"): -0.2,                  # stored trigram
        (("a", "b"), "</s>"): -0.25,
        (("<s>", "a"), "a"): -0.1 - 0.6,            # bo(<s> a) + P(a | a)
        (("<s>", "a"), "</s>"): -0.1 - 0.3 - 0.7,   # bo(<s> a) + bo(a) + P(</s>)
        (("b", "a"), "b"): -0.4,                    # context "b a" is not stored: weight 0, then P(b | a)
        (("b", "b"), "a"): -0.2 - 0.6,              # "b b" not stored; "b a" missing: bo(b) + P(a)
        (("a", "b"), "zzz"): -0.15 - 0.2 - 1.0,     # an unknown word scores as <unk>, after both backoffs
        (("x", "y", "<s>", "a"), "b"): -0.2,        # only the last order - 1 words count
        ((), "a"): -0.6,
        (("<s>",), "b"): -0.5 - 0.8,
    }
    for (context, word), expected in cases.items():
        assert lm.log10_prob(context, word) == pytest.approx(expected, abs=1e-12), (context, word)
    assert lm.score_sentence(["a", "b"]) == pytest.approx(-0.3 - 0.2 - 0.25)
    assert lm.score_sentence(["a", "b"], bos=False, eos=False) == pytest.approx(-0.6 - 0.4)


def test_unknown_word_without_unk_is_an_error():
    lm = read_arpa(edited(_2="ngram 1=4", _7=None))
    with pytest.raises(InputError, match="'zzz' is not in the n-gram model's vocabulary"):
        lm.log10_prob(("a",), "zzz")


def test_layout_variants_parse_the_same():
    """Junk before \\data\\, spaces instead of tabs, CRLF endings, extra blank lines, a file object."""
    loose = "written by some toolkit\n\n" + TEXT.replace("\t", "   ").replace("\n", "\r\n\r\n")
    assert read_arpa(loose) == read_arpa(TEXT)
    assert read_arpa(io.StringIO(TEXT)) == read_arpa(TEXT)
    assert read_arpa(io.BytesIO(TEXT.encode())) == read_arpa(TEXT)
    tiny = read_arpa(edited(_9="1e-7\t</s>"))         # float noise above 0 is tolerated
    assert tiny.ngrams[0][("</s>",)][0] == pytest.approx(1e-7)


@pytest.mark.parametrize("text,match", [
    ("", "is empty"),
    ("\n \n", "is empty"),
    (edited(_1=None), r"line 22: .*without a '\\data\\' header"),
    (edited(_3="ngram 2=four"), r"line 3: expected 'ngram N=count'.*'ngram 2=four'"),
    (edited(_3="ngram 3=4"), r"line 3: expected 'ngram 2=count' next"),
    (edited(_19="\\4-grams:"), r"line 19: section \\4-grams: is beyond the orders .* \(1..3\)"),
    (edited(_19="\\2-grams:"), r"line 19: section \\2-grams: comes after \\2-grams:"),
    (edited(_19="\\trigrams:"), r"line 19: expected a '\\N-grams:' section header"),
    (edited(_15="x\ta b\t-0.15"), r"line 15: expected 'log10prob w1 w2 \[backoff\]' for a 2-gram, got 'x\ta b\t-0.15'"
                                  ".*'x' is not a number"),
    (edited(_10="-0.6\ta\tzz"), r"line 10: .*for a 1-gram.*backoff 'zz' is not a number"),
    (edited(_15="nan\ta b"), r"line 15: .*'nan' is not a number"),
    (edited(_20="-0.2\t<s> a"), r"line 20: expected 'log10prob w1 w2 w3' for a 3-gram, got '-0.2\t<s> a'"),
    (edited(_16="-0.5\tb </s> x y"), r"line 16: expected 'log10prob w1 w2 \[backoff\]' for a 2-gram"),
    (edited(_3="ngram 2=5"), r"line 19: the \\data\\ header declares 5 2-grams \(ngram 2=5\) but the \\2-grams: "
                             "section has 4"),
    (edited(_4="ngram 3=1"), r"line 23: .*declares 1 3-grams .* has 2"),
    (edited(_19=None, _20=None, _21=None), r"line 20: .*declares 2 3-grams .* the file has no \\3-grams: section"),
    (edited(_23=None), r"line 22: the file ends without '\\end\\'"),
    (edited(_21="-0.25\ta b </s>\t-0.1"), r"line 21: .*has a backoff weight, but 3-grams are the highest order"),
    (edited(_9="0.5\t</s>"), r"line 9: log10 probability 0.5 is above 0"),
    (edited(_17="-0.6\ta b"), r"line 17: duplicate 2-gram 'a b'"),
    ("\\data\\\n\\1-grams:\n-1 a\n\\end\\\n", r"line 2: the \\data\\ header lists no 'ngram N=count' lines"),
])
def test_format_errors_name_the_line(text, match):
    with pytest.raises(InputError, match=match):
        read_arpa(io.StringIO(text))


def test_errors_name_the_file_and_clip_long_lines(tmp_path):
    path = tmp_path / "lm.arpa"
    path.write_text(edited(_15="-0.4\t" + " ".join(["w"] * 150)))
    with pytest.raises(InputError, match=r"lm.arpa line 15: expected .*for a 2-gram, got '-0.4\tw w w") as err:
        read_arpa(path)
    assert "w " * 100 not in str(err.value) and "...'" in str(err.value)
    with pytest.raises(ModelNotFoundError, match="missing.arpa not found"):
        read_arpa(tmp_path / "missing.arpa")
    with pytest.raises(ModelNotFoundError, match="is a directory"):
        read_arpa(str(tmp_path))
    (tmp_path / "bad.arpa").write_bytes(b"\\data\\\nngram 1=1\n\\1-grams:\n-1 \xff\xfe\n\\end\\\n")
    with pytest.raises(InputError, match="bad.arpa is not UTF-8"):
        read_arpa(tmp_path / "bad.arpa")


@pytest.mark.parametrize("name", ["lm.arpa", "lm.arpa.gz"])
def test_write_then_read_round_trips(tmp_path, name):
    lm = read_arpa(TEXT)
    lm.ngrams[1][("b", "a")] = (-1.2345678, 0.0)
    path = write_arpa(lm, tmp_path / "sub" / name)
    assert path == tmp_path / "sub" / name
    if name.endswith(".gz"):
        with gzip.open(path, "rt") as f:
            assert f.readline() == "\\data\\\n"
    back = read_arpa(path)
    assert back.order == lm.order and [list(t) for t in back.ngrams] == [list(t) for t in lm.ngrams]
    for table, original in zip(back.ngrams, lm.ngrams):
        for gram, (prob, backoff) in original.items():
            assert table[gram] == pytest.approx((prob, backoff), abs=1e-6)
    text = path.read_bytes() if not name.endswith(".gz") else gzip.decompress(path.read_bytes())
    assert b"-99.000000\t<s>\t-0.500000\n" in text and b"-0.700000\t</s>\n" in text    # no zero backoffs written
    assert b"\r" not in text and text.endswith(b"\\end\\\n")


def test_write_refuses_what_arpa_cannot_hold(tmp_path):
    bad_backoff = NGramModel(1, [{("a",): (-0.5, -0.1)}])
    with pytest.raises(InputError, match="highest order"):
        write_arpa(bad_backoff, tmp_path / "x.arpa")
    with pytest.raises(InputError, match="needs 2 non-empty words without whitespace"):
        write_arpa(NGramModel(2, [{("a",): (-0.5, 0.0)}, {("a b", "c"): (-0.5, 0.0)}]), tmp_path / "x.arpa")
    assert not (tmp_path / "x.arpa").exists()
    with pytest.raises(InputError, match="needs 2 n-gram tables"):
        NGramModel(2, [{}])
