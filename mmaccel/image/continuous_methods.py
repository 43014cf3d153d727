"""The continuous-token (MAR-style) decoding methods, chosen by name: what
`ContinuousPipeline.generate(labels, method, **params)` runs.

| name     | what runs                                                            | exactness                             |
|----------|----------------------------------------------------------------------|---------------------------------------|
| ar       | the target, one token a step (MAR's autoregressive limit, CSpD's baseline) | law-exact (it is the target)    |
| mar      | the target, MAR's multi-token mode: L / `tokens_per_step` steps     | relaxed, budget `tokens_per_step` (1: ar) |
| ar-draft | the draft model alone, one token a step                              | another-model (the quality floor)     |
| cspd     | CSpD: the draft runs `num_draft` steps, one target pass verifies them | relaxed, budget `inner_temperature`  |

Exactness is relative to the target's sampler at the same sampling options. `num_iter`, a sampling option of
every method, is the schedule when the caller gives it (then "ar" and "mar" are the same multi-token sampler);
when not, each method takes its own: one token a step, or L / `tokens_per_step` steps for "mar". CSpD at
`inner_temperature=1` gives each block the law of the target revealing it in one step (`mmaccel.image.cspd`), so
with `num_draft=1` (a block is one step) it has the target's law, up to the residual draws that run out of
tries (counted in `DecodeStats.fallbacks`); the reference's temperature 42 leans towards the draft's law, a
deviation measured by FID (`mmaccel bench image-continuous`), not bounded. All methods share `NoiseBank` draws
for a seed, so their outputs differ only where the method does.

A continuous-token method is a `Method` whose `runner(resources, inputs)` returns the tokens [B, L, C] of a
`ContinuousInputs`; `resources.model` is the target and `resources.draft` the draft model (None when not loaded).
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
from mmaccel.image.cspd import CSpDSettings, cspd_decode
from mmaccel.image.masked import MaskedSampling, masked_decode
from mmaccel.image.models.mar import MAR

MAR_TOKENS_PER_STEP = 4      # MAR's default multi-token mode (64 steps for 256 tokens)


@dataclass(frozen=True)
class ContinuousInputs:
    """What a continuous-token method decodes: class labels [B] on the models' device, the sampling recipe (its
    `num_iter` None: the method's own schedule), the seeded generator of the shared noise and the stats the call
    fills."""

    labels: Tensor
    sampling: MaskedSampling
    generator: torch.Generator
    stats: DecodeStats

    def schedule(self, model: MAR, tokens_per_step: int = 1) -> MaskedSampling:
        """The recipe with its steps: the caller's `num_iter`, else L // `tokens_per_step` (at least one)."""
        if self.sampling.num_iter is not None:
            return self.sampling
        return replace(self.sampling, num_iter=max(1, model.config.seq_len // tokens_per_step))


def _ar(p: NoParams) -> Method:
    def run(resources: Resources, inputs: ContinuousInputs) -> Tensor:
        return masked_decode(resources.model, inputs.labels, inputs.schedule(resources.model), inputs.generator,
                             inputs.stats)

    return Method("ar", "the target, one token a step", runner=run)


@dataclass(frozen=True)
class MARParams:
    tokens_per_step: int = param(MAR_TOKENS_PER_STEP, "tokens revealed per target step: L // tokens_per_step steps, "
                                                      "unless num_iter is given (1: ar)", low=1, high=1 << 16)


def _mar(p: MARParams) -> Method:
    def run(resources: Resources, inputs: ContinuousInputs) -> Tensor:
        return masked_decode(resources.model, inputs.labels, inputs.schedule(resources.model, p.tokens_per_step),
                             inputs.generator, inputs.stats)

    return Method("mar", f"the target, MAR's multi-token mode, {p.tokens_per_step} tokens a step", runner=run)


def _ar_draft(p: NoParams) -> Method:
    def run(resources: Resources, inputs: ContinuousInputs) -> Tensor:
        stats = inputs.stats
        tokens = masked_decode(resources.draft, inputs.labels, inputs.schedule(resources.model), inputs.generator,
                               stats)
        stats.draft_passes, stats.nfe = stats.nfe, 0          # the draft's passes, none of the target
        return tokens

    return Method("ar-draft", "the draft model alone, one token a step", runner=run)


@dataclass(frozen=True)
class CSpDParams:
    num_draft: int = param(CSpDSettings.num_draft, "draft steps per target verification", low=1, high=1024)
    prefill_ratio: float = param(CSpDSettings.prefill_ratio, "share of the steps the target runs itself before "
                                                             "drafting starts", low=0.0, high=1.0)
    inner_temperature: float = param(CSpDSettings.inner_temperature, "both densities of the acceptance ratio are "
                                     "widened by this factor (1: the exact ratio; 42: the reference's)",
                                     low=0.0, high=1000.0)

    def __post_init__(self):
        self.settings().check()

    def settings(self) -> CSpDSettings:
        return CSpDSettings(num_draft=self.num_draft, prefill_ratio=self.prefill_ratio,
                            inner_temperature=self.inner_temperature)


def _cspd(p: CSpDParams) -> Method:
    def run(resources: Resources, inputs: ContinuousInputs) -> Tensor:
        return cspd_decode(resources.model, resources.draft, inputs.labels, inputs.schedule(resources.model),
                           p.settings(), inputs.generator, inputs.stats)

    return Method("cspd", f"CSpD: {p.num_draft} draft steps a verification, target prefill {p.prefill_ratio}, "
                  f"inner temperature {p.inner_temperature}", runner=run)


CONTINUOUS_REGISTRY: dict[str, MethodPlugin] = registry(
    MethodPlugin("ar", NoParams, _ar, "law-exact", summary="the target, one token a step (the baseline)",
                 paper="MAR (Li et al. 2024), arXiv 2406.11838"),
    MethodPlugin("mar", MARParams, _mar, "relaxed", budget="tokens_per_step",
                 exact_when=lambda p: p.tokens_per_step == 1,
                 summary="MAR's multi-token mode: several tokens per target step",
                 paper="MAR (Li et al. 2024), arXiv 2406.11838"),
    MethodPlugin("ar-draft", NoParams, _ar_draft, "another-model", ("draft",),
                 summary="the draft model alone, one token a step (the quality floor)",
                 paper="MAR (Li et al. 2024), arXiv 2406.11838"),
    MethodPlugin("cspd", CSpDParams, _cspd, "relaxed", ("draft",), budget="inner_temperature",
                 exact_when=lambda p: p.inner_temperature == 1 and p.num_draft == 1,
                 summary="CSpD: the draft proposes, the target keeps a draft by the diffusion heads' density ratio",
                 paper="CSpD, arXiv 2411.11925"),
)


def build_continuous_method(name: str | Method, **params: Any) -> Method:
    """The continuous-token method called `name` (see CONTINUOUS_REGISTRY) configured by `params` (one given as
    None takes its default), or a Method as it is."""
    check(not isinstance(name, str) or name in CONTINUOUS_REGISTRY,
          f"unknown continuous-token method {name!r}; choose from {', '.join(CONTINUOUS_REGISTRY)}")
    return build_method(name, CONTINUOUS_REGISTRY, **{k: v for k, v in params.items() if v is not None})
