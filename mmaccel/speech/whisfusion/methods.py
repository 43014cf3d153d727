"""The Whisfusion decoding method: what `WhisfusionPipeline.transcribe(audio, method, **params)` runs on the
encoder states of a batch of windows.

Whisfusion is its own decoder, not a faster way to Whisper's transcript: a masked-diffusion model fine-tuned
from Whisper's decoder fills every position of the canvas in parallel over `steps` passes, K candidates side by
side, and keeps the most confident one or a ROVER vote over them (`mmaccel.speech.whisfusion.decode`). No
setting gives the transcript of the Whisper whose encoder it reads, and no parameter bounds how far it is from
it (fewer steps and more candidates trade accuracy for passes, measured by `mmaccel bench asr-nar`): it is
declared "another-model".

A Whisfusion method is a `Method` whose `runner(resources, windows, seed=)` returns a `WhisfusionResult`;
`resources.model` is the `WhisfusionDecoder` and `windows` an `EncodedWindows`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from mmaccel.core.methods import Method, Resources, build_method
from mmaccel.core.plugin import MethodPlugin, param, registry
from mmaccel.speech.whisfusion.decode import SELECTIONS, WhisfusionResult, whisfusion_decode


@dataclass(frozen=True)
class EncodedWindows:
    """A batch of windows as the decoder reads it: encoder states [B, S, d], the seconds of audio in each
    window, the decoder prompt, the end-of-text id and the tokenizer's decode (ids -> text, specials skipped)."""

    states: Tensor
    seconds: list[float]
    prompt: list[int]
    end_of_text: int
    decode_text: Callable[[list[int]], str]


@dataclass(frozen=True)
class WhisfusionParams:
    candidates: int = param(8, "candidate transcripts decoded side by side per window (K)", low=1, high=64)
    steps: int = param(4, "refinement steps: decoder passes, each over all candidates of a batch (S)", low=1, high=64)
    temperature: float = param(1.0, "sampling temperature of candidates 1..K-1 (candidate 0 takes the arg-max)",
                               low=0.001, high=100.0)
    select: str = param("rover", "the transcript kept: a ROVER vote over the candidates (normalised text) or the "
                                 "most confident one", choices=SELECTIONS, what="selection")


def _whisfusion(p: WhisfusionParams) -> Method:
    def run(resources: Resources, windows: EncodedWindows, *, seed: int = 0) -> WhisfusionResult:
        return whisfusion_decode(resources.model, windows.states, windows.seconds, windows.prompt,
                                 windows.end_of_text, windows.decode_text, candidates=p.candidates, steps=p.steps,
                                 temperature=p.temperature, select=p.select, seed=seed)

    return Method("whisfusion", f"Whisfusion: {p.candidates} candidates, {p.steps} steps, {p.select} selection",
                  runner=run)


WHISFUSION_REGISTRY: dict[str, MethodPlugin] = registry(
    MethodPlugin("whisfusion", WhisfusionParams, _whisfusion, "another-model",
                 summary="Whisfusion: a masked-diffusion decoder, every position in parallel over a few steps, "
                         "K candidates voted on (its own transcript, not Whisper's greedy one)",
                 paper="Whisfusion, arXiv 2508.07048"),
)


def build_whisfusion_method(name: str | Method, **params: Any) -> Method:
    """A Whisfusion method by name (see WHISFUSION_REGISTRY) configured by `params`, or a Method as it is."""
    return build_method(name, WHISFUSION_REGISTRY, **params)
