"""The CTC decoding methods, by name, over a CTC model's per-frame label log-probabilities.

`greedy` (the best path: each frame's arg-max, repeats merged, blanks removed) is the baseline. `beam` is the
FlexCTC-style batched beam search of `mmaccel.speech.ctc.beam`, which scores hypotheses with what the pipeline
fuses (an n-gram LM, a boost list, an insertion bonus) and, with `recombine="sum"`, by transcript instead of by
alignment: another transcript than greedy by design. It is declared relaxed with the beam width as its budget,
as Whisper's beam search is: one hypothesis, no fusion and "max" recombination keep the best path, greedy's
(`tests/speech/ctc/test_beam.py`).

A CTC method is a `Method` whose `runner(resources, posteriors)` returns one `CTCHypothesis` per row of
`posteriors` (a `Posteriors`); `resources.model` is the CTC model (its `vocab`), `resources.extras["fusion"]` the
(FusionTable, weight) pairs the pipeline fuses and `resources.extras["insertion_bonus"]` the score added per
emitted label.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from mmaccel.core.methods import Method, Resources, build_method
from mmaccel.core.plugin import MethodPlugin, NoParams, param, registry
from mmaccel.errors import check
from mmaccel.speech.ctc.beam import RECOMBINE, ctc_beam_search, ctc_greedy
from mmaccel.speech.ctc.vocab import CTCHypothesis


@dataclass(frozen=True)
class Posteriors:
    """What a CTC method decodes: log_probs [B, T, V] (natural log, normalised per frame), lengths [B] (each
    row's frames) and the seconds one frame spans (for word times)."""

    log_probs: Tensor
    lengths: Tensor
    frame_seconds: float


def _greedy(p: NoParams) -> Method:
    def run(resources: Resources, posteriors: Posteriors) -> list[CTCHypothesis]:
        check(not resources.extras.get("fusion"), "greedy decoding reads no LM or boost list: use method='beam'")
        return ctc_greedy(posteriors.log_probs, resources.model.vocab, posteriors.lengths,
                          frame_seconds=posteriors.frame_seconds)

    return Method("greedy", "best path: each frame's arg-max (the baseline)", runner=run)


@dataclass(frozen=True)
class BeamParams:
    beam: int = param(16, "hypotheses kept per frame", low=1, high=1024)
    threshold: float = param(20.0, "hypotheses more than this (log-probability) below the frame's best are pruned",
                             low=0.01, high=1e9)
    blank_skip: float = param(0.999, "a frame whose blank probability is above this is blank for every hypothesis, "
                                     "with no search step (1: search every frame)", low=0.5, high=1.0)
    recombine: str = param("max", "equal transcripts merge: max keeps the best alignment's score (Viterbi), sum "
                                  "adds their probabilities (prefix beam search)", choices=RECOMBINE,
                           what="recombination")


def _beam(p: BeamParams) -> Method:
    def run(resources: Resources, posteriors: Posteriors) -> list[CTCHypothesis]:
        return ctc_beam_search(posteriors.log_probs, resources.model.vocab, posteriors.lengths, beam=p.beam,
                               fusion=resources.extras.get("fusion", ()),
                               insertion_bonus=resources.extras.get("insertion_bonus", 0.0), threshold=p.threshold,
                               blank_skip=None if p.blank_skip >= 1.0 else p.blank_skip, recombine=p.recombine,
                               frame_seconds=posteriors.frame_seconds)

    return Method("beam", f"batched beam search, beam {p.beam}, threshold {p.threshold}, {p.recombine} recombination",
                  runner=run)


CTC_REGISTRY: dict[str, MethodPlugin] = registry(
    MethodPlugin("greedy", NoParams, _greedy, "greedy-exact", summary="best path: each frame's arg-max (the baseline)",
                 paper="CTC (Graves et al. 2006)"),
    MethodPlugin("beam", BeamParams, _beam, "relaxed", budget="beam",
                 summary="batched beam search with the pipeline's LM, boost list and insertion bonus fused "
                         "(another output than greedy by design)",
                 paper="FlexCTC (Grigoryan et al. 2025), arXiv 2508.07315"),
)


def build_ctc_method(name: str | Method, **params: Any) -> Method:
    """A CTC method by name (see CTC_REGISTRY) configured by `params`, or a Method as it is."""
    return build_method(name, CTC_REGISTRY, **params)
