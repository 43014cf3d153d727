"""Estimate an n-gram LM with interpolated modified Kneser-Ney smoothing, the way KenLM `lmplz` does.

Chen & Goodman, "An Empirical Study of Smoothing Techniques for Language Modeling" (1998), section
3.5 / eq. (17), (26); Heafield et al., "Scalable Modified Kneser-Ney Language Model Estimation"
(ACL 2013) for the details lmplz settles. Exactly what happens:

1. Counting. Each sentence becomes `<s> w1 ... wk </s>` (one `<s>`, one `</s>`). For every
   predicted position (w1 ... wk and `</s>`) the longest n-gram ending there is counted: an
   N-gram, or a shorter one starting at `<s>` near the start of the sentence. So n-grams never
   extend past `</s>` or before `<s>`, and `<s>` appears only as the first word of a context.
2. Adjusted counts a(g). Highest-order n-grams, and lower-order n-grams that start with `<s>`
   (nothing can precede them), keep their raw counts. Every other lower-order n-gram g gets its
   continuation count N1+(. g): the number of distinct words v such that `v g` is an (n+1)-gram
   with an adjusted count. The `<s>` unigram has no count (it is never predicted).
3. Discounts per order n from the count-of-counts t_k (the number of n-grams with a(g) = k):
   Y = t1 / (t1 + 2 t2), D_k = k - (k + 1) Y t_{k+1} / t_k for k = 1, 2, 3 (D_3 serves 3+).
   t1, t2, t3 must be non-zero and each D_k must fall in (0, k] (lmplz allows 0; we do not, since
   D = 0 everywhere in a context would give unseen words probability 0); otherwise InputError
   suggests the alternatives: `discounts="fallback"` substitutes lmplz's `--discount_fallback`
   values D = (0.5, 1.0, 1.5) for just that order (small vocabularies, e.g. characters, rarely
   have unigrams with continuation counts 1, 2 and 3), and `discounts="fixed"` uses D = 0.75 for
   every count and order.
4. Interpolation, from unigrams up. For a context h with extensions hx:
       gamma(h) = (D_1 N_1(h.) + D_2 N_2(h.) + D_3 N_3+(h.)) / sum_x a(hx)
       P(w | h) = (a(hw) - D(a(hw))) / sum_x a(hx) + gamma(h) P(w | h[1:])
   where N_k(h.) counts the extensions with adjusted count k (3: three or more). The unigram
   level interpolates with the uniform distribution 1/|V| over V = the words seen, `</s>` and
   `<unk>` (not `<s>`), so `<unk>` (count 0) receives exactly the interpolation mass gamma(())/|V|,
   like lmplz's default `--interpolate_unigrams`.
5. ARPA output (log10). Each stored n-gram gets log10 P(w | h) from step 4; each n-gram that is
   itself a context gets backoff log10 gamma(g), so the ARPA back-off rule reproduces the
   interpolated model exactly for unseen n-grams. The `<s>` unigram gets log10 prob -99 and, as a
   context, its gamma. Every context's distribution over V sums to 1.

A literal `<unk>` in the input is counted like any word; `<s>` and `</s>` in the input are errors
(the estimator adds them). Everything is double-precision arithmetic on in-memory dicts: fine for
the text of a CTC model's LM (millions of tokens), not a replacement for lmplz on web-scale corpora.

CLI: `python -m mmaccel.speech.ctc.kneser_ney --text FILE --order N --out LM.arpa [--chars]`.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from mmaccel.errors import InputError, MMAccelError
from mmaccel.progress import say
from mmaccel.speech.ctc.arpa import BOS, EOS, UNK, NGramModel, NGramTable, write_arpa

FIXED_DISCOUNT = 0.75     # Ney, Essen & Kneser (1994)'s usual single discount, for `discounts="fixed"`
FALLBACK_DISCOUNTS = (0.0, 0.5, 1.0, 1.5)   # lmplz --discount_fallback's defaults (0, D1, D2, D3+)
BOS_LOG10 = -99.0         # ARPA convention: <s> is never predicted
_WORD = re.compile(r"\S+")

Gram = tuple[str, ...]


def char_tokens(line: str, space: str = "|") -> list[str]:
    """Split a line into characters for a character-level LM: `"Hi  there "` -> `H i | t h e r e`.

    Leading/trailing whitespace is dropped and every run of whitespace becomes one `space` token
    (the word delimiter of character CTC vocabularies, `|` in wav2vec 2.0's). Case is kept. A `space`
    character inside the text itself is not escaped: pick a `space` the text does not use.
    """
    if not isinstance(space, str) or not _WORD.fullmatch(space):
        raise InputError(f"the space token must be a non-empty string without whitespace, got {space!r}")
    tokens: list[str] = []
    for i, word in enumerate(line.split()):
        if i:
            tokens.append(space)
        tokens.extend(word)
    return tokens


def estimate_kneser_ney(sentences: Iterable[Sequence[str]], order: int, *, discounts: str = "modified") -> NGramModel:
    """Estimate an order-`order` interpolated Kneser-Ney LM from tokenised sentences.

    `sentences`: an iterable (read once) of lists of words (whitespace-free, non-empty strings,
    without `<s>`/`</s>`); an empty list is an empty sentence. `discounts`: "modified" (D1, D2, D3+
    per order from count-of-counts, Chen & Goodman eq. 26; InputError where the counts cannot give
    them), "fallback" (the same, but lmplz's fallback D = 0.5, 1.0, 1.5 for an order where they
    cannot be estimated) or "fixed" (D = 0.75 for every count and order). Returns an
    `NGramModel` whose `ngrams[n - 1]` holds every n-gram seen (with `<unk>`, `<s>` and `</s>`
    among the unigrams), ready for `write_arpa`. See the module docstring for the exact construction.
    """
    if isinstance(order, bool) or not isinstance(order, int) or order < 1:
        raise InputError(f"order must be an integer >= 1 (1: unigram, 3: trigram), got {order!r}")
    if discounts not in ("modified", "fallback", "fixed"):
        raise InputError(f"discounts must be 'modified', 'fallback' or 'fixed', got {discounts!r}")
    adjusted = _adjusted_counts(_count(sentences, order))
    discount = [_discounts(table, n, discounts) for n, table in enumerate(adjusted, 1)]

    # Unigrams: interpolate with the uniform distribution over V (step 4).
    unigrams = adjusted[0]
    vocab = set(unigrams) | {(EOS,), (UNK,)}
    denominator, gamma = _contexts(unigrams, discount[0])[()]
    probs: list[dict[Gram, float]] = [{g: _discounted(unigrams.get(g, 0), discount[0], denominator)
                                      + gamma / len(vocab) for g in vocab}]
    gammas: list[dict[Gram, float]] = []      # gammas[n - 1][h]: gamma of the n-word context h
    for n in range(2, order + 1):
        contexts = _contexts(adjusted[n - 1], discount[n - 1])
        gammas.append({h: g for h, (_, g) in contexts.items()})
        level: dict[Gram, float] = {}
        for gram, a in adjusted[n - 1].items():
            # gram[1:] always has its own probability: it is an (n-1)-gram with an adjusted count
            denominator, gamma = contexts[gram[:-1]]
            level[gram] = _discounted(a, discount[n - 1], denominator) + gamma * probs[-1][gram[1:]]
        probs.append(level)

    ngrams: list[NGramTable] = []
    for n in range(1, order + 1):
        backoffs = gammas[n - 1] if n < order else {}
        table: NGramTable = {}
        if n == 1:      # specials first, as lmplz writes them; <s> is a context only
            table[(UNK,)] = (_log10(probs[0][(UNK,)]), _log10_backoff(backoffs, (UNK,)))
            table[(BOS,)] = (BOS_LOG10, _log10_backoff(backoffs, (BOS,)))
        for gram in sorted(probs[n - 1]):
            if gram not in table:
                table[gram] = (_log10(probs[n - 1][gram]), _log10_backoff(backoffs, gram))
        ngrams.append(table)
    return NGramModel(order, ngrams)


def _count(sentences: Iterable[Sequence[str]], order: int) -> list[Counter[Gram]]:
    """Raw counts (step 1): `raw[N - 1]` counts the N-grams, `raw[n - 1]` for n < N the n-grams that
    start at `<s>` (the only lower-order n-grams whose raw counts Kneser-Ney uses)."""
    if isinstance(sentences, (str, bytes)):
        raise InputError("sentences must be an iterable of word lists, got one string; "
                         "pass e.g. [line.split() for line in text.splitlines()]")
    raw: list[Counter[Gram]] = [Counter() for _ in range(order)]
    count = 0
    for count, sentence in enumerate(sentences, 1):
        if not isinstance(sentence, (list, tuple)):
            hint = " (split it into words first, e.g. line.split())" if isinstance(sentence, str) else ""
            raise InputError(f"sentence {count} must be a list of words, got {type(sentence).__name__} "
                             f"{_clip(sentence)}{hint}")
        for i, word in enumerate(sentence, 1):
            if not isinstance(word, str) or not _WORD.fullmatch(word):
                raise InputError(f"sentence {count}, word {i}: words must be non-empty strings without whitespace, "
                                 f"got {word!r}")
            if word in (BOS, EOS):
                raise InputError(f"sentence {count}, word {i} is {word!r}: the estimator adds <s> and </s> to "
                                 "every sentence itself; remove them from the input")
        tokens = (BOS, *sentence, EOS)
        for end in range(1, len(tokens)):
            gram = tokens[max(0, end - order + 1):end + 1]
            raw[len(gram) - 1][gram] += 1
    if count == 0:
        raise InputError("no sentences to estimate an n-gram LM from; pass at least one (a list of words)")
    return raw


def _adjusted_counts(raw: list[Counter[Gram]]) -> list[dict[Gram, int]]:
    """Step 2: raw counts at the top order and for `<s>`-initial n-grams, continuation counts below."""
    adjusted: list[dict[Gram, int]] = [dict(raw[-1])]
    for n in range(len(raw) - 1, 0, -1):                  # fill order n from order n + 1
        table: dict[Gram, int] = dict(raw[n - 1])         # the <s>-initial n-grams
        for longer in adjusted[0]:
            # longer[1:] never starts with <s>, so it never collides with a raw-count entry
            table[longer[1:]] = table.get(longer[1:], 0) + 1
        adjusted.insert(0, table)
    return adjusted


def _discounts(table: dict[Gram, int], n: int, mode: str) -> tuple[float, float, float, float]:
    """Step 3: (0, D1, D2, D3+) for order n; index by min(count, 3)."""
    if mode == "fixed":
        return (0.0, FIXED_DISCOUNT, FIXED_DISCOUNT, FIXED_DISCOUNT)
    t = Counter(min(a, 5) for a in table.values())    # t[k]: count-of-counts (only 1..4 are used)
    shown = ", ".join(f"t{k}={t[k]}" for k in range(1, 5))
    advice = ("the corpus is too small or too artificial for modified Kneser-Ney (character vocabularies often "
              "are, at low orders); add text, or pass discounts='fallback' (lmplz's --discount_fallback: "
              f"D={FALLBACK_DISCOUNTS[1:]} where estimation fails) or discounts='fixed' (D=0.75 everywhere)")
    problem = next((f"no {n}-gram has adjusted count {k}" for k in (1, 2, 3) if t[k] == 0), None)
    if problem is None:
        y = t[1] / (t[1] + 2 * t[2])
        d1, d2, d3 = (k - (k + 1) * y * t[k + 1] / t[k] for k in (1, 2, 3))
        d = (0.0, d1, d2, d3)
        problem = next((f"D{k}{'+' if k == 3 else ''}={d[k]:.4f} is outside (0, {k}]"
                        for k in (1, 2, 3) if not 0.0 < d[k] <= k), None)
        if problem is None:
            return d
    if mode == "fallback":
        return FALLBACK_DISCOUNTS
    raise InputError(f"cannot estimate the {n}-gram discounts: {problem} (count-of-counts {shown}); {advice}")


def _contexts(table: dict[Gram, int], discount: Sequence[float]) -> dict[Gram, tuple[float, float]]:
    """Per context h of `table`'s n-grams: (sum_x a(hx), gamma(h)) (step 4)."""
    total: dict[Gram, int] = {}
    mass: dict[Gram, float] = {}
    for gram, a in table.items():
        h = gram[:-1]
        total[h] = total.get(h, 0) + a
        mass[h] = mass.get(h, 0.0) + discount[min(a, 3)]
    return {h: (total[h], mass[h] / total[h]) for h in total}


def _discounted(a: int, discount: Sequence[float], denominator: float) -> float:
    return (a - discount[min(a, 3)]) / denominator if a else 0.0


def _log10(p: float) -> float:
    return min(0.0, math.log10(p))         # p <= 1 exactly; rounding may land a hair above


def _log10_backoff(gammas: dict[Gram, float], gram: Gram) -> float:
    return math.log10(gammas[gram]) if gram in gammas else 0.0


def _clip(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mmaccel.speech.ctc.kneser_ney",
                                     description="Estimate an interpolated modified Kneser-Ney n-gram LM from text "
                                                 "(one sentence per line) and write it as ARPA.")
    parser.add_argument("--text", required=True, help="UTF-8 text, one sentence per line; blank lines are skipped")
    parser.add_argument("--order", required=True, type=int, help="n-gram order (e.g. 3 for words, 6 for characters)")
    parser.add_argument("--out", required=True, help="the ARPA file to write (.gz: compressed)")
    parser.add_argument("--chars", action="store_true",
                        help="character-level: each line becomes its characters, whitespace runs mapped to --space")
    parser.add_argument("--space", default="|", help="the word-delimiter token for --chars (default: |)")
    parser.add_argument("--discounts", choices=("modified", "fallback", "fixed"), default="modified",
                        help="modified: D1, D2, D3+ from count-of-counts; fallback: the same, but D=0.5, 1, 1.5 "
                             "for an order where they cannot be estimated (like lmplz --discount_fallback); "
                             "fixed: D=0.75 everywhere")
    args = parser.parse_args(argv)
    try:
        text = Path(args.text).expanduser()
        if not text.is_file():
            raise InputError(f"text file not found: {text}")
        with text.open(encoding="utf-8") as lines:
            split = (lambda line: char_tokens(line, args.space)) if args.chars else str.split
            model = estimate_kneser_ney((split(line) for line in lines if line.strip()), args.order,
                                        discounts=args.discounts)
        out = write_arpa(model, args.out)
    except UnicodeDecodeError as err:
        say(f"kneser_ney: error: {args.text} is not UTF-8 text ({err})")
        return 2
    except MMAccelError as err:
        say(f"kneser_ney: error: {err}")
        return 2
    for n, table in enumerate(model.ngrams, 1):
        print(f"{n}-grams: {len(table)}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
