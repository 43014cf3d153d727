"""Kneser-Ney estimation: every context's distribution sums to 1, numbers match hand arithmetic and an
independent textbook bigram formula, higher orders fit structured text better, and bad input is
named. Optionally (when KenLM's lmplz is on PATH) identical to lmplz."""

import math
import random
import shutil
import subprocess
from collections import Counter, defaultdict

import pytest

from mmaccel.errors import InputError
from mmaccel.speech.ctc.arpa import read_arpa, write_arpa
from mmaccel.speech.ctc.kneser_ney import char_tokens, estimate_kneser_ney, main


def zipf_corpus(seed: int, sentences: int = 150, vocab: int = 100) -> list[list[str]]:
    """Random sentences over a Zipfian vocabulary: enough rare words for modified discounts at orders 1-3."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    weights = [1 / (i + 1) for i in range(vocab)]
    return [rng.choices(words, weights, k=rng.randint(0, 8)) for _ in range(sentences)]


SUBJECT = [["the", "cat"], ["the", "dog"], ["a", "bird"], ["my", "friend"], ["the", "old", "man"]]
VERB = [["sees"], ["likes"], ["chases"], ["ate"]]
OBJECT = [["the", "ball"], ["a", "mouse"], ["the", "tree"], ["some", "bread"]]
TAIL = [[], ["today"], ["again"], ["in", "the", "park"]]


def structured_corpus(seed: int, sentences: int) -> list[list[str]]:
    """Sentences from a small grammar: word order is predictable from the previous two words."""
    rng = random.Random(seed)
    return [rng.choice(SUBJECT) + rng.choice(VERB) + rng.choice(OBJECT) + rng.choice(TAIL) for _ in range(sentences)]


def predictable(model) -> list[str]:
    return [w for w in model.vocabulary if w != "<s>"]


@pytest.mark.parametrize("discounts", ["modified", "fallback", "fixed"])
@pytest.mark.parametrize("order", [1, 2, 3])
def test_every_context_distribution_sums_to_one(order, discounts):
    corpus = zipf_corpus(0)
    model = estimate_kneser_ney(corpus, order, discounts=discounts)
    vocab = predictable(model)
    assert {"</s>", "<unk>"} <= set(vocab) and model.ngrams[0][("<s>",)][0] == -99.0
    seen = [g for n in range(order - 1) for g in model.ngrams[n] if g[-1] != "</s>"]
    contexts = [(), ("<s>",), ("nope",), ("<s>", "nope"), ("nope", "w0"), ("w0", "nope")] + seen[::7]
    for context in contexts:
        total = sum(10 ** model.log10_prob(context, w) for w in vocab)
        assert total == pytest.approx(1.0, abs=1e-4), context


def test_hand_computed_trigram_with_fixed_discount():
    """<s> a b </s>, <s> a </s>, D = 0.75. Unigram continuation counts: a 1, b 1, </s> 2 (sum 4), |V| = 4
    (a, b, </s>, <unk>), unigram gamma = 3 * 0.75 / 4 = 0.5625."""
    model = estimate_kneser_ney([["a", "b"], ["a"]], 3, discounts="fixed")
    p_a = 0.25 / 4 + 0.5625 / 4                       # = P(b)
    p_eos = 1.25 / 4 + 0.5625 / 4
    p_unk = 0.5625 / 4
    # bigram level: "<s> a" starts with <s> so keeps its raw count 2 (its continuation count would be 1)
    p_a_bos = (2 - 0.75) / 2 + (0.75 / 2) * p_a
    p_b_a = (1 - 0.75) / 2 + (1.5 / 2) * p_a            # context a: "a b", "a </s>" (continuation counts 1, 1)
    p_b_bos_a = (1 - 0.75) / 2 + (1.5 / 2) * p_b_a      # trigram level, raw counts
    expected = {
        ((), "a"): p_a, ((), "</s>"): p_eos, ((), "<unk>"): p_unk, ((), "zzz"): p_unk,
        (("<s>",), "a"): p_a_bos, (("a",), "b"): p_b_a, (("<s>", "a"), "b"): p_b_bos_a,
        (("<s>", "a"), "a"): 0.75 * 0.75 * p_a,        # bo(<s> a) * bo(a) * P(a)
        (("b",), "a"): 0.75 * p_a,                       # context b has one extension (b </s>)
    }
    for (context, word), p in expected.items():
        assert model.log10_prob(context, word) == pytest.approx(math.log10(p), abs=1e-9), (context, word)
    assert [len(t) for t in model.ngrams] == [5, 4, 3]
    assert model.ngrams[1][("b", "</s>")][1] == 0.0 and model.ngrams[2][("<s>", "a", "b")][1] == 0.0


def reference_bigram_kn(corpus, discounts):
    """Interpolated Kneser-Ney bigram straight from Chen & Goodman (1998), eq. 17 with one level of
    recursion: P(w | v) = max(c(v w) - D, 0) / c(v) + gamma(v) P_cont(w), with P_cont built from
    continuation counts N1+(. w) and interpolated with 1/|V|."""
    bigrams = Counter()
    for sentence in corpus:
        tokens = ["<s>", *sentence, "</s>"]
        bigrams.update(zip(tokens, tokens[1:]))
    left = defaultdict(set)
    for v, w in bigrams:
        left[w].add(v)
    cont = {w: len(vs) for w, vs in left.items()}
    vocab = set(cont) | {"<unk>"}

    def discount_fn(counts):
        if discounts == "fixed":
            return lambda c: 0.75
        t = Counter(counts)
        y = t[1] / (t[1] + 2 * t[2])
        d = {k: k - (k + 1) * y * t[k + 1] / t[k] for k in (1, 2, 3)}
        return lambda c: d[min(c, 3)]

    d_uni, d_bi = discount_fn(cont.values()), discount_fn(bigrams.values())
    cont_total = sum(cont.values())
    uni_gamma = sum(d_uni(c) for c in cont.values()) / cont_total

    def p_cont(w):
        mine = (cont[w] - d_uni(cont[w])) / cont_total if w in cont else 0.0
        return mine + uni_gamma / len(vocab)

    c_v = Counter()
    mass = Counter()
    for (v, _), c in bigrams.items():
        c_v[v] += c
        mass[v] += d_bi(c)

    def p(v, w):
        if c_v[v] == 0:
            return p_cont(w)
        c = bigrams.get((v, w), 0)
        return max(c - d_bi(c), 0) / c_v[v] + mass[v] / c_v[v] * p_cont(w) if c else mass[v] / c_v[v] * p_cont(w)

    return vocab, p


@pytest.mark.parametrize("discounts", ["fixed", "modified"])
def test_bigram_matches_the_textbook_formula(discounts):
    corpus = zipf_corpus(3, sentences=100)
    vocab, reference = reference_bigram_kn(corpus, discounts)
    model = estimate_kneser_ney(corpus, 2, discounts=discounts)
    assert set(predictable(model)) == vocab
    for v in sorted(vocab | {"<s>", "never-seen"}):
        for w in sorted(vocab):
            assert model.log10_prob((v,), w) == pytest.approx(math.log10(reference(v, w)), abs=1e-9), (v, w)


def test_higher_orders_predict_held_out_structured_text_better():
    train, held_out = structured_corpus(0, 300), structured_corpus(1, 100)
    tokens = sum(len(s) + 1 for s in held_out)
    perplexity = {}
    for order in (1, 2, 3):
        model = estimate_kneser_ney(train, order, discounts="fallback")
        perplexity[order] = 10 ** (-sum(model.score_sentence(s) for s in held_out) / tokens)
    assert perplexity[2] < 0.3 * perplexity[1] and perplexity[3] < 0.9 * perplexity[2], perplexity


def test_estimated_model_round_trips_through_arpa(tmp_path):
    model = estimate_kneser_ney(zipf_corpus(1), 3)
    back = read_arpa(write_arpa(model, tmp_path / "lm.arpa.gz"))
    assert [list(t) for t in back.ngrams] == [list(t) for t in model.ngrams]
    sentence = zipf_corpus(2)[0]
    assert back.score_sentence(sentence) == pytest.approx(model.score_sentence(sentence), abs=1e-5)


def test_modified_discounts_fail_clearly_and_fallback_matches_lmplz_values():
    # a closed vocabulary: unigram continuation counts t1..t4 = 12, 1, 2, 3 give D2 = 2 - 3 (12/14) 2/1 < 0
    with pytest.raises(InputError, match=r"cannot estimate the 1-gram discounts: D2=-3.1429 is outside \(0, 2\] "
                                         r"\(count-of-counts t1=12, t2=1, t3=2, t4=3\).*discounts='fallback'.*"
                                         "discounts='fixed'"):
        estimate_kneser_ney(structured_corpus(0, 50), 2)
    with pytest.raises(InputError, match="cannot estimate the 1-gram discounts: no 1-gram has adjusted count 3"):
        estimate_kneser_ney([["a", "b"], ["a"]], 1)                 # raw counts a 2, b 1, </s> 2
    # fallback: lmplz's D = (0.5, 1.0, 1.5) where estimation fails; raw unigram counts a 3, </s> 2, |V| = 3
    model = estimate_kneser_ney([["a", "a"], ["a"]], 1, discounts="fallback")
    gamma = (1.5 + 1.0) / 5
    assert model.log10_prob((), "a") == pytest.approx(math.log10((3 - 1.5) / 5 + gamma / 3))
    assert model.log10_prob((), "</s>") == pytest.approx(math.log10((2 - 1.0) / 5 + gamma / 3))
    assert model.log10_prob((), "<unk>") == pytest.approx(math.log10(gamma / 3))


@pytest.mark.parametrize("kwargs,match", [
    (dict(sentences=[["a"]], order=0), "order must be an integer >= 1"),
    (dict(sentences=[["a"]], order=2.0), "order must be an integer >= 1"),
    (dict(sentences=[["a"]], order=True), "order must be an integer >= 1"),
    (dict(sentences=[["a"]], order=2, discounts="good-turing"), "discounts must be 'modified', 'fallback' or"),
    (dict(sentences=[], order=2), "no sentences"),
    (dict(sentences=iter(()), order=2), "no sentences"),
    (dict(sentences="the cat sat", order=2), "got one string"),
    (dict(sentences=[["a"], "the cat"], order=2), r"sentence 2 must be a list of words, got str 'the cat' \(split"),
    (dict(sentences=[["a"], ["b", "c d"]], order=2), "sentence 2, word 2: .*without whitespace, got 'c d'"),
    (dict(sentences=[["a", ""]], order=2), "sentence 1, word 2: words must be non-empty"),
    (dict(sentences=[["a", 3]], order=2), "sentence 1, word 2: .*got 3"),
    (dict(sentences=[["<s>", "a"]], order=2), "sentence 1, word 1 is '<s>': the estimator adds <s> and </s>"),
    (dict(sentences=[["a", "</s>"]], order=2), r"sentence 1, word 2 is '</s>'"),
])
def test_bad_input_is_named(kwargs, match):
    with pytest.raises(InputError, match=match):
        estimate_kneser_ney(kwargs.pop("sentences"), kwargs.pop("order"), **kwargs)


def test_char_tokens():
    assert char_tokens("  Hi   there\n") == ["H", "i", "|", "t", "h", "e", "r", "e"]
    assert char_tokens("a b", space="<sp>") == ["a", "<sp>", "b"]
    assert char_tokens(" \t\n") == []
    with pytest.raises(InputError, match="space token"):
        char_tokens("a b", space=" ")


def test_cli_builds_a_character_lm(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("the cat sat\n\nthe dog sat\na cat ran\n", encoding="utf-8")
    out = tmp_path / "chars.arpa"
    assert main(["--text", str(text), "--order", "3", "--out", str(out), "--chars", "--discounts", "fixed"]) == 0
    printed = capsys.readouterr().out
    model = read_arpa(out)
    assert model.order == 3 and "|" in model.vocabulary and "t" in model.vocabulary
    assert f"1-grams: {len(model.ngrams[0])}\n" in printed and f"3-grams: {len(model.ngrams[2])}\n" in printed
    assert model.log10_prob(("<s>", "t"), "h") > model.log10_prob(("<s>", "t"), "a")
    assert main(["--text", str(tmp_path / "none.txt"), "--order", "3", "--out", str(out)]) == 2
    assert "text file not found" in capsys.readouterr().err
    assert main(["--text", str(text), "--order", "3", "--out", str(out)]) == 2     # words: too few for modified
    assert "discounts='fixed'" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("lmplz") is None, reason="KenLM's lmplz is not installed")
def test_matches_kenlm_lmplz(tmp_path):
    corpus = [s for s in zipf_corpus(0, sentences=300) if s]
    text = tmp_path / "corpus.txt"
    text.write_text("".join(" ".join(s) + "\n" for s in corpus))
    arpa = tmp_path / "kenlm.arpa"
    subprocess.run(["lmplz", "-o", "3", "-S", "100M", "-T", str(tmp_path), "--discount_fallback",
                    "--text", str(text), "--arpa", str(arpa)], check=True, capture_output=True)
    theirs, ours = read_arpa(arpa), estimate_kneser_ney(corpus, 3, discounts="fallback")
    for n, (a, b) in enumerate(zip(theirs.ngrams, ours.ngrams), 1):
        assert set(a) == set(b), n
        for gram in a:
            assert b[gram] == pytest.approx(a[gram], abs=2e-4), gram
