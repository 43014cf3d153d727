"""The image decoding methods: the core ones plus LANTERN, GSD and ZipAR, all chosen by name.

| name        | drafts from                  | acceptance                                   | lossless |
|-------------|------------------------------|----------------------------------------------|----------|
| ar          | -                            | -                                            | yes      |
| speculative | trained small GPT drafter    | exact speculative sampling                   | yes      |
| sjd         | Jacobi window                | exact speculative sampling (SJD)             | yes      |
| sjd-coupled | Jacobi window, fixed noise   | coupled (SCD)                                | yes      |
| lantern     | trained small GPT drafter    | latent-neighbour pooling within TV budget δ  | no (δ)   |
| gsd         | Jacobi window (SJD drafts)   | grouped over dynamic clusters                | no       |
| gsd coupled | Jacobi window, fixed noise   | exact sample lies in the draft's cluster     | no       |
| zipar       | wavefront over image rows    | - (SJD per row with `window`; GSD `grouped`) | no       |
| sjd2        | Jacobi window denoised from embedding noise | exact (or `coupled`) on the clean drafts | yes |

Relaxed methods report what they spent in `DecodeStats.deviation` (the mass moved, or for
`gsd` with `coupled=True` the tokens swapped); their budget 0 (δ = 0, p_threshold = 0) is the
exact rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mmaccel.core import methods as core
from mmaccel.core.jacobi import JacobiProposer
from mmaccel.core.methods import Method, Resources, _need, build_method
from mmaccel.core.plugin import MethodPlugin, param, registry
from mmaccel.core.proposers import DraftModelProposer
from mmaccel.errors import check
from mmaccel.image.sjd2 import sjd2_decode
from mmaccel.image.sjd_entropy import SJD_ENTROPY
from mmaccel.image.zipar import STAND_INS, zipar_decode


def latent_neighbours(latents: Tensor, k: int) -> Tensor:
    """The k nearest other tokens of every token by L2 distance of their latent vectors: [V, k], nearest first."""
    codes = latents.detach().float()
    check(isinstance(k, int) and 1 <= k < codes.shape[0], f"neighbours must be an int in [1, {codes.shape[0] - 1}], got {k}")
    d = torch.cdist(codes, codes)
    d.fill_diagonal_(math.inf)
    return d.topk(k, dim=1, largest=False).indices


def latent_sq_distances(latents: Tensor) -> Tensor:
    """Squared L2 distances [V, V] between token latents (GSD's visual-similarity test)."""
    codes = latents.detach().float()
    return torch.cdist(codes, codes).pow(2)


@dataclass(frozen=True)
class LanternParams:
    k: int = param(4, "draft tokens per verification", low=1, high=64)
    neighbours: int = param(50, "latent neighbours a token's probability is pooled over", low=1, high=1 << 20)
    delta: float = param(0.1, "total-variation budget of the pooling per token (0: exact)", low=0.0, high=1.0)


def _lantern(p: LanternParams) -> Method:
    def rule_params(r: Resources) -> dict[str, Any]:
        return {"neighbours": latent_neighbours(_need(r, "latents", "lantern"), p.neighbours), "delta": p.delta}

    return Method("lantern", f"LANTERN: draft model k={p.k}, pool over {p.neighbours} latent neighbours, TV budget "
                  f"{p.delta}", lambda r: DraftModelProposer(_need(r, "draft", "lantern")),
                  "pooled", k=p.k, make_rule_params=rule_params)


@dataclass(frozen=True)
class GroupParams:
    """GSD's cluster thresholds (defaults of the GSD paper's code)."""

    p_threshold: float = param(0.15, "a token joins the draft's cluster within this probability gap (0: exact)",
                               low=0.0, high=1.0)
    d_threshold: float = param(0.5, "... and within this squared latent distance", low=0.0, high=1e9)
    half_window: int = param(7, "... and within this many probability ranks either side", low=0, high=1 << 20)

    def rule_params(self) -> dict[str, Any]:
        return {"p_threshold": self.p_threshold, "d_threshold": self.d_threshold, "half_window": self.half_window}

    def label(self) -> str:
        return f"ranks ±{self.half_window}, |Δp| < {self.p_threshold}, d² < {self.d_threshold}"


@dataclass(frozen=True)
class GSDParams(GroupParams):
    window: int = param(8, "Jacobi window: tokens guessed and verified per pass", low=1, high=64)
    coupled: bool = param(False, "coupled: the exact sample must lie in the draft's cluster (swaps reported)")


def _gsd(p: GSDParams) -> Method:
    def rule_params(r: Resources) -> dict[str, Any]:
        return {"distances": latent_sq_distances(_need(r, "latents", "gsd")), **p.rule_params()}

    return Method("gsd", f"GSD: {'coupled ' if p.coupled else ''}SJD window {p.window}, grouped acceptance "
                  f"({p.label()})",
                  lambda r: JacobiProposer(p.window, "coupled" if p.coupled else "sample", "repeat"),
                  "grouped-coupled" if p.coupled else "grouped", k=p.window, coupled=p.coupled,
                  make_rule_params=rule_params)


@dataclass(frozen=True)
class ZipARParams(GroupParams):
    s: int = param(4, "row window: a row starts once the row above is s tokens ahead", low=1, high=1 << 20)
    window: int = param(0, "Jacobi window per row (0: one token a row per pass)", low=0, high=64)
    coupled: bool = param(False, "coupled verification of the per-row Jacobi drafts")
    grouped: bool = param(False, "GSD grouped acceptance of the per-row Jacobi drafts")
    stand_in: str = param("vertical", "what stands in for a row's not-yet-decoded start", choices=STAND_INS,
                          what="ZipAR stand_in")

    def __post_init__(self):
        check(self.window > 0 or not self.grouped, "ZipAR grouped acceptance verifies Jacobi drafts: give window >= 1")


def _zipar(p: ZipARParams) -> Method:
    rule = {(False, False): "speculative", (False, True): "coupled", (True, False): "grouped",
            (True, True): "grouped-coupled"}[p.grouped, p.coupled]

    def run(resources: Resources, inputs: Any, *, max_new_tokens: int, sampling, seed: int, eos_token_id=None):
        grid = math.isqrt(max_new_tokens)
        check(grid * grid == max_new_tokens, f"ZipAR decodes square token grids; {max_new_tokens} tokens is not one")
        params = ({"distances": latent_sq_distances(_need(resources, "latents", "zipar")), **p.rule_params()}
                  if p.grouped else None)
        return zipar_decode(resources.model, inputs, grid=grid, s=p.s, jacobi=p.window, rule=rule, rule_params=params,
                            sampling=sampling, seed=seed, coupled=p.coupled, stand_in=p.stand_in)

    extra = f", {p.stand_in} stand-in"
    if p.window:
        extra += f" x {'coupled ' if p.coupled else ''}SJD window {p.window} per row"
    if p.grouped:
        extra += f", GSD grouped acceptance ({p.label()})"
    return Method("zipar", f"ZipAR next-set decoding, row window s={p.s}{extra}", lambda r: None,
                  runner=run)


@dataclass(frozen=True)
class SJD2Params:
    # defaults picked on development seeds (mmaccel.bench.image_tune --sweep sjd2)
    window: int = param(32, "Jacobi window of drafts denoised from embedding noise", low=1, high=64)
    steps: int = param(2, "denoising levels a draft passes through before it is verified", low=1, high=64)
    coupled: bool = param(False, "coupled verification (SCD) on the clean drafts")

    def __post_init__(self):
        check(self.steps <= self.window, f"SJD2 denoising steps ({self.steps}) cannot exceed the window ({self.window})")


def _sjd2(p: SJD2Params) -> Method:
    def run(resources: Resources, inputs: Any, *, max_new_tokens: int, sampling, seed: int, eos_token_id=None):
        return sjd2_decode(resources.model, inputs, embeddings=_need(resources, "embeddings", "sjd2"),
                           sigma=_need(resources, "embedding_scale", "sjd2"), max_new_tokens=max_new_tokens,
                           window=p.window, steps=p.steps, sampling=sampling, seed=seed, coupled=p.coupled)

    rule = "coupled verification (SCD)" if p.coupled else "exact speculative sampling"
    return Method("sjd2", f"SJD2: Jacobi window of {p.window} denoised from embedding noise in {p.steps} levels, "
                  f"{rule} on the clean drafts", runner=run, coupled=p.coupled)


IMAGE_REGISTRY: dict[str, MethodPlugin] = registry(
    core.AR, core.SPECULATIVE, core.TREE, core.SJD, core.SJD_COUPLED, core.EARLY_EXIT,
    MethodPlugin("lantern", LanternParams, _lantern, "relaxed", ("draft", "latents"), budget="delta",
                 exact_when=lambda p: p.delta == 0,
                 summary="LANTERN: draft tokens accepted over latent neighbourhoods within a TV budget",
                 paper="LANTERN (ICLR 2025), arXiv 2410.03355"),
    MethodPlugin("gsd", GSDParams, _gsd, "relaxed", ("latents",), budget="p_threshold",
                 exact_when=lambda p: p.p_threshold == 0 or p.d_threshold == 0 or p.half_window == 0,
                 summary="GSD: SJD drafts accepted by dynamic clusters", paper="GSD (ICCV 2025), arXiv 2508.07747"),
    MethodPlugin("zipar", ZipARParams, _zipar, "relaxed", budget="s",
                 summary="ZipAR: rows decoded in parallel once the row above is s tokens ahead",
                 host_reads=None, host_reads_why="the wavefront's plan (which rows run, their inputs and drafts) is "
                                                 "Python state: every pass reads its tokens back (zipar.py)",
                 paper="ZipAR (ICML 2025), arXiv 2412.04062"),
    MethodPlugin("sjd2", SJD2Params, _sjd2, "law-exact", ("embeddings", "embedding_scale"),
                 summary="SJD2: Jacobi drafts denoised from embedding noise, verified exactly",
                 paper="SJD2 (NeurIPS 2025), arXiv 2510.08994"),
    SJD_ENTROPY,
)


def build_image_method(name: str | Method, **params: Any) -> Method:
    """The image method called `name` (see IMAGE_REGISTRY) configured by `params`, or a Method as it is."""
    return build_method(name, IMAGE_REGISTRY, **params)
