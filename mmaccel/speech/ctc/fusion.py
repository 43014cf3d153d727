"""Fusion models of CTC beam search as dense state machines over the CTC labels.

FlexCTC (arXiv 2508.07315; reference asr.md section 4) fuses an n-gram LM and a phrase-boosting tree
the same way: each is a machine whose state a hypothesis carries; when the hypothesis emits label v,
it adds `weight * score[state, v]` and moves to `next[state, v]`; at the end of the utterance it adds
`weight * final[state]`. Blank and repeated labels emit nothing and leave the state alone.

Here both are *dense*: `score` and `next` hold every label of every state, so a step of the search
is two gathers on the device with no host work and no per-hypothesis loops. That is the right layout
for character vocabularies (tens of labels) and modest machines; `MAX_ENTRIES` bounds the tables and
the error says what to shrink.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mmaccel.errors import check

MAX_ENTRIES = 64_000_000        # states x labels of one table (a 256 MB float table and its 512 MB index)


@dataclass
class FusionTable:
    """next [S, V] (long), score [S, V] (float32, natural log), final [S] (float32), start (state id).
    Column `blank` of both tables is unused (blank emits nothing)."""

    next: Tensor
    score: Tensor
    final: Tensor
    start: int
    name: str = "fusion"

    def __post_init__(self):
        S, V = self.score.shape
        check(self.next.shape == (S, V) and self.final.shape == (S,),
              f"{self.name}: next {tuple(self.next.shape)}, score {tuple(self.score.shape)} and final "
              f"{tuple(self.final.shape)} must be [S, V], [S, V] and [S]")
        check(0 <= self.start < S, f"{self.name}: start state {self.start} is not one of the {S} states")

    @property
    def num_states(self) -> int:
        return self.score.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.score.shape[1]

    def to(self, device: torch.device | str) -> FusionTable:
        return FusionTable(self.next.to(device), self.score.to(device), self.final.to(device), self.start, self.name)


def check_table_size(states: int, labels: int, what: str) -> None:
    check(states * labels <= MAX_ENTRIES, f"{what} would need a {states} x {labels} table ({states * labels:,} entries, "
          f"more than {MAX_ENTRIES:,}); {'use a lower order or prune the LM' if 'LM' in what else 'shorten the list'}")
