"""The speech decoding methods, by name, over the shared core.

`greedy` is the baseline (core AR decoding); `beam` is length-normalised beam search on the same
decoder and cache. Drafts come from heads on the target (`medusa`, `medusa-block`, `early-exit`,
`eagle`), a separate draft decoder (`speculative`, `tree`), another tokenizer's model
(`speculative-cross`) or the transcript itself (`ngram`). The multi-token methods verify drafts
against the full model greedily, so their transcripts are bit-identical to `greedy`;
`medusa-typical` and `calm` (confident early exit below threshold 1) are the explicit lossy options.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mmaccel.core import methods as core
from mmaccel.core.beam import beam_search
from mmaccel.core.methods import Method, Resources, _float, _int, _need, chain_options
from mmaccel.errors import check
from mmaccel.speech.calm import calm_decode
from mmaccel.speech.cross_draft import CrossTokenizerProposer
from mmaccel.speech.eagle import EagleProposer
from mmaccel.speech.medusa_block import BlockHeadsProposer


def _greedy(p: dict) -> Method:
    return Method("greedy", "greedy decoding (the baseline)", "", True, lambda r: None)


def _beam(p: dict) -> Method:
    beams = _int(p, "num_beams", 5, high=32)
    penalty = _float(p, "length_penalty", 1.0, 0.0, 10.0)

    def run(resources: Resources, inputs: Any, *, max_new_tokens: int, sampling, seed: int, eos_token_id=None):
        check(sampling.greedy, "beam search is deterministic; it takes no temperature")
        return beam_search(resources.model, inputs, num_beams=beams, max_new_tokens=max_new_tokens,
                           eos_token_id=eos_token_id, length_penalty=penalty)

    return Method("beam", f"beam search, {beams} beams, length penalty {penalty}", "", False, lambda r: None, runner=run,
                  exact_logits=True)


def _calm(p: dict) -> Method:
    threshold = _float(p, "threshold", 0.9, 0.0, 1.0)

    def run(resources: Resources, inputs: Any, *, max_new_tokens: int, sampling, seed: int, eos_token_id=None):
        check(sampling.greedy, "calm decodes greedily; it takes no temperature")
        exits = _need(resources, "exit_heads", "calm")
        return calm_decode(resources.model, exits, inputs, threshold=threshold, max_new_tokens=max_new_tokens,
                           eos_token_id=eos_token_id)

    return Method("calm", f"confidence-based early exit (CALM), threshold {threshold}", "exit_heads",
                  threshold >= 1.0, lambda r: None, runner=run)


def _medusa_block(p: dict) -> Method:
    depth, width = _int(p, "depth", 3), _int(p, "width", 2, high=16)
    return Method("medusa-block", f"Medusa-Block heads, tree depth {depth} x width {width}", "medusa_block", True,
                  lambda r: BlockHeadsProposer(_need(r, "medusa_block", "medusa-block"), r.model), tree=(depth, width))


def _eagle(p: dict) -> Method:
    k, stop, siblings, label = chain_options(p, k=8, stop_below=0.5)

    return Method("eagle", f"EAGLE head on the target's features, {label}", "eagle", True,
                  lambda r: EagleProposer(_need(r, "eagle", "eagle"), stop, siblings), k=k)


def _speculative_cross(p: dict) -> Method:
    k = _int(p, "k", 4)
    return Method("speculative-cross", f"chain speculative decoding, assistant of another tokenizer, k={k}",
                  "assistant", True, lambda r: CrossTokenizerProposer(_need(r, "assistant", "speculative-cross")), k=k)


ASR_REGISTRY: dict[str, Callable[[dict], Method]] = {
    "greedy": _greedy,
    "beam": _beam,
    "speculative": core.REGISTRY["speculative"],
    "speculative-cross": _speculative_cross,
    "tree": core.REGISTRY["tree"],
    "medusa": core.REGISTRY["medusa"],
    "medusa-typical": core.REGISTRY["medusa-typical"],
    "medusa-block": _medusa_block,
    "eagle": _eagle,
    "early-exit": core.REGISTRY["early-exit"],
    "calm": _calm,
    "ngram": core.REGISTRY["ngram"],
}


def build_asr_method(name: str | Method, **params: Any) -> Method:
    """An ASR method by name (see ASR_REGISTRY) configured by `params`, or a Method as it is."""
    return core.build_method(name, ASR_REGISTRY, **params)
