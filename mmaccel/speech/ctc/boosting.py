"""Phrase boosting (context biasing) as a dense `FusionTable`: a token trie with Aho-Corasick failure
links, scored the way GPU-PB (FlexCTC, arXiv 2508.07315) and icefall's ContextGraph score it.

Each trie node n has a potential `depth(n) * token_score`: a hypothesis gains `token_score` per label
that extends a partial match. When the next label breaks the match it falls to the longest suffix of
its history that is still a trie prefix and gives back the difference of potentials, so a partial
match that dies earns nothing. Reaching the end of a phrase adds the phrase's score (its potential)
on top, and that part is never given back; a hypothesis that ends inside a partial match gives its
potential back (`final`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mmaccel.errors import check
from mmaccel.speech.ctc.fusion import FusionTable, check_table_size
from mmaccel.speech.ctc.vocab import CTCVocabulary

MAX_PHRASES = 100_000


def phrase_table(phrases: Sequence[str | Sequence[int]], vocab: CTCVocabulary, *, token_score: float = 1.0,
                 device: torch.device | str = "cpu") -> FusionTable:
    """Compile `phrases` (text, spelled with `vocab.encode`, or label-id lists) into a boosting table."""
    check(not isinstance(phrases, str), "phrases must be a list of phrases, not one string")
    phrases = list(phrases)
    check(len(phrases) > 0, "the boost list is empty: give at least one phrase (or no boosting)")
    check(len(phrases) <= MAX_PHRASES, f"{len(phrases):,} boost phrases are more than {MAX_PHRASES:,}; boost the ones "
          "that matter (a huge list boosts everything and so nothing)")
    check(isinstance(token_score, (int, float)) and token_score > 0 and token_score == token_score,
          f"token_score must be a positive number, got {token_score!r}")
    sequences = []
    for phrase in phrases:
        ids = vocab.encode(phrase) if isinstance(phrase, str) else list(phrase)
        check(len(ids) > 0, f"boost phrase {phrase!r} is empty")
        check(all(isinstance(i, int) and 0 <= i < len(vocab) and i != vocab.blank for i in ids),
              f"boost phrase {phrase!r}: label ids must be non-blank labels in [0, {len(vocab)})")
        sequences.append(ids)

    children: list[dict[int, int]] = [{}]
    depth, end = [0], [False]
    for ids in sequences:
        node = 0
        for label in ids:
            if label not in children[node]:
                children[node][label] = len(children)
                children.append({})
                depth.append(depth[node] + 1)
                end.append(False)
            node = children[node][label]
        end[node] = True
    S, V = len(children), len(vocab)
    check_table_size(S, V, f"a boosting trie of {S} nodes")

    goto = torch.zeros(S, V, dtype=torch.long)               # Aho-Corasick transition of every node and label
    fail = [0] * S
    output = [0.0] * S                                         # score of the phrases ending here or at a suffix
    level = [c for c in children[0].values()]
    for label, c in children[0].items():
        goto[0, label] = c
    for c in level:
        output[c] = depth[c] * token_score if end[c] else 0.0
    while level:                                               # breadth first: a node's failure is shallower
        following = []
        for n in level:
            goto[n] = goto[fail[n]]
            for label, c in children[n].items():
                fail[c] = int(goto[fail[n], label])
                goto[n, label] = c
                following.append(c)
        for c in following:
            output[c] = (depth[c] * token_score if end[c] else 0.0) + output[fail[c]]
        level = following
    goto[:, vocab.blank] = torch.arange(S)                     # blank emits nothing (never read)
    potential = torch.tensor(depth, dtype=torch.float32) * token_score
    gain = potential[goto] - potential[:, None] + torch.tensor(output, dtype=torch.float32)[goto]
    gain[:, vocab.blank] = 0.0
    return FusionTable(goto.to(device), gain.to(device), (-potential).to(device), 0, name="phrase boosting")
