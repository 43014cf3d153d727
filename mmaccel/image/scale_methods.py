"""The next-scale (VAR) decoding methods, chosen by name: what `ScalePipeline.generate(labels, method, **params)`
runs.

| name     | what runs                                                       | exactness                       |
|----------|-----------------------------------------------------------------|---------------------------------|
| ar       | the large VAR on every scale (VAR's KV-cached loop)             | law-exact (it is the target)    |
| ar-small | the small VAR (the refiner) on every scale                      | another-model (the refiner's)   |
| code     | CoDe: large VAR on scales 0..N-1, small VAR (one prefill) after | relaxed, budget `draft_steps`   |

CoDe (Chen et al., CVPR 2025) is a hand-off, not speculative decoding: nothing is verified, so its budget is the
hand-off scale N (more scales from the large model = closer to it; N = K would be `ar`), and its deviation is
measured by FID in `mmaccel bench image-scale`, not reported per token.

A next-scale method is a `Method` whose `runner(resources, inputs)` draws the whole pyramid of a `ScaleInputs`
and returns (the `ScalePrefix`, the KV-cache bytes it allocated); `resources.model` is the large VAR and
`resources.extras` holds the tokenizer ("vq"), the small VAR ("refiner", None when not loaded) and the refiners
specialised for a hand-off scale ("specialised", {N: VAR}).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from mmaccel.core.methods import Method, Resources, build_method
from mmaccel.core.plugin import MethodPlugin, NoParams, param, registry
from mmaccel.core.stats import DecodeStats
from mmaccel.errors import check
from mmaccel.image.models.var import VAR
from mmaccel.image.next_scale import ScalePrefix, ScaleSampling, check_code_pair, collaborative_decode, decode_scales

SAME = -1.0          # refiner_cfg / refiner_temperature: the value the large VAR samples with
DEFAULT_DRAFT_STEPS = 6


@dataclass(frozen=True)
class ScaleInputs:
    """What a next-scale method decodes: class labels [B] on the VARs' device, the sampling recipe, the seeded
    generator every draw reads and the stats the call fills."""

    labels: Tensor
    sampling: ScaleSampling
    generator: torch.Generator
    stats: DecodeStats


def specialised_refiner(specialised: dict[int, VAR], draft_steps: int) -> VAR:
    """The refiner for hand-off scale N that was distilled on every scale it will draw: the one specialised for N,
    else for the largest N0 < N (trained on scales N0..K-1, a superset of N..K-1)."""
    trained = [n for n in specialised if n <= draft_steps]
    check(trained, f"no refiner specialised for draft_steps={draft_steps} or an earlier hand-off "
          f"(have: {sorted(specialised) or 'none'}); pass training_free=True or load one with specialised={{N: PATH}}")
    return specialised[max(trained)]


def _ar(p: NoParams) -> Method:
    def run(resources: Resources, inputs: ScaleInputs) -> tuple[ScalePrefix, int]:
        return decode_scales(resources.model, resources.extras["vq"], inputs.labels, inputs.sampling,
                             inputs.generator, stats=inputs.stats)

    return Method("ar", "the large VAR on every scale (VAR's KV-cached loop)", runner=run)


def _ar_small(p: NoParams) -> Method:
    def run(resources: Resources, inputs: ScaleInputs) -> tuple[ScalePrefix, int]:
        return decode_scales(resources.extras["refiner"], resources.extras["vq"], inputs.labels, inputs.sampling,
                             inputs.generator, stats=inputs.stats)

    return Method("ar-small", "the small VAR (the refiner) on every scale", runner=run)


@dataclass(frozen=True)
class CodeParams:
    draft_steps: int = param(DEFAULT_DRAFT_STEPS, "N: scales the large VAR draws before the small one takes over "
                                                  "(at most the schedule's scales - 1)", low=1, high=63)
    training_free: bool = param(True, "hand off to the stock small VAR (false: to the refiner specialised for N, "
                                      "or for the latest earlier N)")
    refiner_cfg: float = param(SAME, "the small VAR's guidance on its scales, VAR's ramp (-1: cfg_scale)",
                               low=SAME, high=1000.0)
    refiner_temperature: float = param(SAME, "the small VAR's temperature on its scales (-1: temperature)",
                                       low=SAME, high=100.0)

    def __post_init__(self):
        check(self.refiner_cfg == SAME or self.refiner_cfg >= 0,
              f"refiner_cfg must be >= 0 (or -1: cfg_scale), got {self.refiner_cfg}")
        check(self.refiner_temperature == SAME or self.refiner_temperature > 0,
              f"refiner_temperature must be > 0 (or -1: temperature), got {self.refiner_temperature}")

    def refiner_sampling(self, sampling: ScaleSampling) -> ScaleSampling:
        """The small VAR's recipe: the large one's with this method's own guidance and temperature where set."""
        return replace(sampling, **({} if self.refiner_cfg == SAME else {"cfg": self.refiner_cfg}),
                       **({} if self.refiner_temperature == SAME else {"temperature": self.refiner_temperature}))


def _code(p: CodeParams) -> Method:
    def run(resources: Resources, inputs: ScaleInputs) -> tuple[ScalePrefix, int]:
        vq, small = resources.extras["vq"], resources.extras["refiner"]
        check_code_pair(resources.model, small, vq, p.draft_steps)
        refiner = small if p.training_free else specialised_refiner(resources.extras["specialised"], p.draft_steps)
        return collaborative_decode(resources.model, refiner, vq, inputs.labels, inputs.sampling, inputs.generator,
                                    p.draft_steps, stats=inputs.stats, refiner_sampling=p.refiner_sampling(inputs.sampling))

    refiner = "stock" if p.training_free else "specialised"
    return Method("code", f"CoDe: the large VAR draws scales 0..{p.draft_steps - 1}, the {refiner} small VAR the rest",
                  runner=run)


SCALE_REGISTRY: dict[str, MethodPlugin] = registry(
    MethodPlugin("ar", NoParams, _ar, "law-exact", summary="the large VAR on every scale (the baseline)",
                 paper="VAR (Tian et al. 2024), arXiv 2404.02905"),
    MethodPlugin("ar-small", NoParams, _ar_small, "another-model", ("refiner",),
                 summary="the small VAR alone (the quality floor)", paper="VAR (Tian et al. 2024), arXiv 2404.02905"),
    MethodPlugin("code", CodeParams, _code, "relaxed", ("refiner",), budget="draft_steps",
                 summary="CoDe: the large VAR draws the first N scales, the small one the rest",
                 paper="CoDe (CVPR 2025), arXiv 2411.17787"),
)


def build_scale_method(name: str | Method, **params: Any) -> Method:
    """The next-scale method called `name` (see SCALE_REGISTRY) configured by `params` (one given as None takes
    its default), or a Method as it is."""
    check(not isinstance(name, str) or name in SCALE_REGISTRY,
          f"unknown next-scale method {name!r}; choose from {', '.join(SCALE_REGISTRY)}")
    return build_method(name, SCALE_REGISTRY, **{k: v for k, v in params.items() if v is not None})
