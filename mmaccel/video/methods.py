"""The answer methods of `VideoStreamPipeline.ask`: the core's decoding methods a stream can run.

An answer is decoded by the core loop over the stream's live cache (`video.stream._Continuation`), so the core's
plug-ins apply as they are, with their parameters and exactness: `ar` (the baseline), `speculative` and `tree`
(drafted by the pipeline's draft, which has watched the stream: the model itself on a share of the vision tokens,
SpecVLM, or its first layers), `ngram`, `sjd` and `sjd-coupled`. `early-exit` is the core's method with one
difference: a stream's early-exit view of the target is the pipeline's draft (`draft=model.early_exit(k)`), so
here it needs the draft. No streaming model has Medusa heads, so the Medusa methods are not offered.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mmaccel.core import methods as core
from mmaccel.core.methods import Method, build_method
from mmaccel.core.plugin import MethodPlugin, registry

EARLY_EXIT = replace(core.EARLY_EXIT, needs=("draft",),
                     summary="self-speculative: the pipeline's early-exit draft (the model's first layers, which "
                             "watched the stream) drafts")

VIDEO_REGISTRY: dict[str, MethodPlugin] = registry(core.AR, core.SPECULATIVE, core.TREE, core.NGRAM, core.SJD,
                                                   core.SJD_COUPLED, EARLY_EXIT)


def build_video_method(name: str | Method, **params: Any) -> Method:
    """An answer method by name (see VIDEO_REGISTRY) configured by `params`, or a Method as it is."""
    return build_method(name, VIDEO_REGISTRY, **params)
