"""An ARPA n-gram LM over the CTC labels, compiled into a dense `FusionTable` (NGPU-LM's layout,
arXiv 2505.22857, resolved ahead of time).

The LM's words are the CTC labels themselves (characters with `|` between words, or BPE pieces):
build one from text with `python -m mmaccel.speech.ctc.kneser_ney --chars`. A state is an LM context,
an n-gram of order < N (`()` being the empty context); `score[s, v]` is log P(v | s) with the backoff
rule already applied, `next[s, v]` the longest suffix of s + v that is itself a context, and
`final[s]` log P(</s> | s). Both follow from the ARPA file level by level: a context's row is its
backoff weight plus its longest proper suffix's row, overwritten where the file lists the n-gram.
A label the LM never saw scores as `<unk>` (or `UNSEEN_LOG10` without one).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from mmaccel.errors import check
from mmaccel.speech.ctc.arpa import BOS, EOS, UNK, NGramModel, read_arpa
from mmaccel.speech.ctc.fusion import FusionTable, check_table_size
from mmaccel.speech.ctc.vocab import CTCVocabulary

UNSEEN_LOG10 = -10.0            # log10 P of a label that is neither an LM word nor covered by <unk>
LN10 = math.log(10.0)


def ngram_table(lm: NGramModel | str | Path, vocab: CTCVocabulary, device: torch.device | str = "cpu") -> FusionTable:
    """Compile an n-gram LM (an `NGramModel` or an ARPA path) for `vocab`'s labels."""
    model = lm if isinstance(lm, NGramModel) else read_arpa(lm)
    unigrams = model.ngrams[0]
    labels = [v for v in range(len(vocab)) if v != vocab.blank]
    known = [v for v in labels if (vocab.tokens[v],) in unigrams]
    check(2 * len(known) >= len(labels), f"the LM's words do not match the CTC labels: {len(known)} of {len(labels)} "
          f"labels are LM words (LM: {sorted(w for (w,) in list(unigrams)[:8])}...; labels: {vocab.tokens[:8]}...); "
          "build a label-level LM (python -m mmaccel.speech.ctc.kneser_ney --chars)")
    N = model.order
    states = [()] + sorted((g for n in range(N - 1) for g in model.ngrams[n] if g[-1] != EOS), key=len)
    check_table_size(len(states), len(vocab), f"an order-{N} LM with {len(states)} contexts")
    index = {s: i for i, s in enumerate(states)}
    column = {vocab.tokens[v]: v for v in labels}
    unk = unigrams.get((UNK,), (UNSEEN_LOG10, 0.0))[0]

    S, V = len(states), len(vocab)
    score = torch.full((S, V), unk, dtype=torch.float64)
    final = torch.zeros(S, dtype=torch.float64)
    nxt = torch.zeros(S, V, dtype=torch.long)                       # row 0: the empty context
    score[:, vocab.blank] = 0.0
    final[0] = unigrams.get((EOS,), (UNSEEN_LOG10, 0.0))[0]
    for (word,), (logp, _) in unigrams.items():
        if word in column:
            score[0, column[word]] = logp
            if (word,) in index:
                nxt[0, column[word]] = index[(word,)]
    parent = [0] * S
    for i, s in enumerate(states[1:], 1):
        parent[i] = next(index[s[k:]] for k in range(1, len(s) + 1) if s[k:] in index)
    by_length: dict[int, list[int]] = {}
    for i, s in enumerate(states[1:], 1):
        by_length.setdefault(len(s), []).append(i)
    for k in sorted(by_length):                                     # shorter contexts are complete first
        rows = torch.tensor(by_length[k])
        up = torch.tensor([parent[i] for i in by_length[k]])
        backoff = torch.tensor([model.ngrams[k - 1][states[i]][1] for i in by_length[k]], dtype=torch.float64)
        score[rows] = backoff[:, None] + score[up]
        final[rows] = backoff + final[up]
        nxt[rows] = nxt[up]
        if k < N:                                                   # the n-grams that extend these contexts
            for gram, (logp, _) in model.ngrams[k].items():
                context, word = gram[:-1], gram[-1]
                if context not in index:
                    continue
                row = index[context]
                if word == EOS:
                    final[row] = logp
                elif word in column:
                    score[row, column[word]] = logp
                    if gram in index:
                        nxt[row, column[word]] = index[gram]
    score[:, vocab.blank] = 0.0
    start = index.get((BOS,), 0)
    return FusionTable(nxt.to(device), (score * LN10).float().to(device), (final * LN10).float().to(device), start,
                       name=f"{N}-gram LM")
