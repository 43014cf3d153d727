"""The speech decoding methods, by name, over the shared core.

`greedy` is the baseline (core AR decoding); `beam` is length-normalised beam search on the same
decoder and cache. Drafts come from heads on the target (`medusa`, `medusa-block`, `early-exit`,
`eagle`), a separate draft decoder (`speculative`, `tree`), another tokenizer's model
(`speculative-cross`) or the transcript itself (`ngram`). The multi-token methods verify drafts
against the full model greedily, so their transcripts are bit-identical to `greedy`;
`medusa-typical` and `calm` (confident early exit below threshold 1) are the explicit lossy options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mmaccel.core import methods as core
from mmaccel.core.beam import beam_search
from mmaccel.core.methods import Method, Resources, _need
from mmaccel.core.plugin import MethodPlugin, NoParams, param, registry
from mmaccel.errors import check
from mmaccel.speech.calm import calm_decode
from mmaccel.speech.cross_draft import CrossTokenizerProposer
from mmaccel.speech.eagle import EagleProposer
from mmaccel.speech.medusa_block import BlockHeadsProposer


def _greedy(p: NoParams) -> Method:
    return Method("greedy", "greedy decoding (the baseline)")


@dataclass(frozen=True)
class BeamParams:
    num_beams: int = param(5, "beams kept per step", low=1, high=32)
    length_penalty: float = param(1.0, "hypotheses ranked by log-probability / length ** length_penalty",
                                  low=0.0, high=10.0)


def _beam(p: BeamParams) -> Method:
    def run(resources: Resources, inputs: Any, *, max_new_tokens: int, sampling, seed: int, eos_token_id=None):
        check(sampling.greedy, "beam search is deterministic; it takes no temperature")
        return beam_search(resources.model, inputs, num_beams=p.num_beams, max_new_tokens=max_new_tokens,
                           eos_token_id=eos_token_id, length_penalty=p.length_penalty)

    return Method("beam", f"beam search, {p.num_beams} beams, length penalty {p.length_penalty}",
                  lambda r: None, runner=run, exact_logits=True)


@dataclass(frozen=True)
class CALMParams:
    threshold: float = param(0.9, "leave after the first exit head at least this confident (1: never, exact)",
                             low=0.0, high=1.0)


def _calm(p: CALMParams) -> Method:
    def run(resources: Resources, inputs: Any, *, max_new_tokens: int, sampling, seed: int, eos_token_id=None):
        check(sampling.greedy, "calm decodes greedily; it takes no temperature")
        exits = _need(resources, "exit_heads", "calm")
        return calm_decode(resources.model, exits, inputs, threshold=p.threshold, max_new_tokens=max_new_tokens,
                           eos_token_id=eos_token_id)

    return Method("calm", f"confidence-based early exit (CALM), threshold {p.threshold}", runner=run)


def _medusa_block(p: core.MedusaParams) -> Method:
    return Method("medusa-block", f"Medusa-Block heads, tree depth {p.depth} x width {p.width}",
                  lambda r: BlockHeadsProposer(_need(r, "medusa_block", "medusa-block"), r.model),
                  tree=(p.depth, p.width))


@dataclass(frozen=True)
class EagleParams:
    k: int = param(8, "draft tokens per verification (the most, with stop_below)", low=1, high=64)
    stop_below: float = param(0.5, "a draft chain stops below this draft probability (0: never)", low=0.0, high=0.999)
    siblings: int = param(0, "runner-up siblings of the unsure draft verified beside it", low=0, high=15)

    def __post_init__(self):
        core.check_siblings(self.stop_below, self.siblings)


def _eagle(p: EagleParams) -> Method:
    return Method("eagle", f"EAGLE head on the target's features, {core.chain_label(p.k, p.stop_below, p.siblings)}",
                  lambda r: EagleProposer(_need(r, "eagle", "eagle"), p.stop_below, p.siblings), k=p.k)


@dataclass(frozen=True)
class CrossParams:
    k: int = param(4, "draft tokens per verification", low=1, high=64)


def _speculative_cross(p: CrossParams) -> Method:
    return Method("speculative-cross", f"chain speculative decoding, assistant of another tokenizer, k={p.k}",
                  lambda r: CrossTokenizerProposer(_need(r, "assistant", "speculative-cross")),
                  k=p.k)


ASR_REGISTRY: dict[str, MethodPlugin] = registry(
    MethodPlugin("greedy", NoParams, _greedy, "greedy-exact", summary="greedy decoding (the baseline)"),
    MethodPlugin("beam", BeamParams, _beam, "relaxed", budget="num_beams",
                 summary="length-normalised beam search (another output than greedy by design)",
                 host_reads=None, host_reads_why="hypotheses are re-ranked on the host: every step reads the beams' "
                                                 "log-probabilities back (core/beam.py)",
                 paper="Whisper (Radford et al. 2022), arXiv 2212.04356"),
    core.SPECULATIVE,
    MethodPlugin("speculative-cross", CrossParams, _speculative_cross, "greedy-exact", ("assistant",),
                 summary="chain speculative decoding with an assistant of another tokenizer",
                 host_reads=None, host_reads_why="drafts cross tokenizers as text: every pass reads the assistant's "
                                                 "tokens back to re-tokenise them (cross_draft.py)",
                 paper="universal assisted generation (Hugging Face, 2024)"),
    core.TREE, core.MEDUSA, core.MEDUSA_TYPICAL,
    MethodPlugin("medusa-block", core.MedusaParams, _medusa_block, "greedy-exact", ("medusa_block",),
                 summary="Medusa-Block heads (one block over the target's last state), tree verify",
                 paper="Whisper-Medusa (ICASSP 2025), arXiv 2409.15869"),
    MethodPlugin("eagle", EagleParams, _eagle, "greedy-exact", ("eagle",),
                 summary="EAGLE: a head drafting from the target's features",
                 paper="EAGLE, arXiv 2401.15077; EAGLE-3, arXiv 2503.01840"),
    core.EARLY_EXIT,
    MethodPlugin("calm", CALMParams, _calm, "relaxed", ("exit_heads",), budget="threshold",
                 exact_when=lambda p: p.threshold >= 1.0,
                 summary="confident adaptive language modelling: leave at the first confident exit head",
                 host_reads=None, host_reads_why="the rows that run on after each exit head are picked on the host: "
                                                 "every step reads confidences and exit layers back (calm.py)",
                 paper="CALM (Schuster et al. 2022), arXiv 2207.07061"),
    core.NGRAM,
)


def build_asr_method(name: str | Method, **params: Any) -> Method:
    """An ASR method by name (see ASR_REGISTRY) configured by `params`, or a Method as it is."""
    return core.build_method(name, ASR_REGISTRY, **params)
