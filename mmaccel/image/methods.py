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
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from mmaccel.core.jacobi import JacobiProposer
from mmaccel.core.methods import REGISTRY as CORE_REGISTRY
from mmaccel.core.methods import Method, Resources, _float, _int, _need, build_method
from mmaccel.core.proposers import DraftModelProposer
from mmaccel.errors import check
from mmaccel.image.sjd2 import sjd2_decode
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


def _lantern(p: dict) -> Method:
    k = _int(p, "k", 4)
    neighbours = _int(p, "neighbours", 50, high=1 << 20)
    delta = _float(p, "delta", 0.1, 0.0, 1.0)

    def rule_params(r: Resources) -> dict[str, Any]:
        return {"neighbours": latent_neighbours(_need(r, "latents", "lantern"), neighbours), "delta": delta}

    return Method("lantern", f"LANTERN: draft model k={k}, pool over {neighbours} latent neighbours, TV budget {delta}",
                  "draft", delta == 0, lambda r: DraftModelProposer(_need(r, "draft", "lantern")), "pooled", k=k,
                  make_rule_params=rule_params)


def _group_params(p: dict) -> dict[str, Any]:
    """GSD's cluster thresholds (defaults of the GSD paper's code) from method params."""
    return {"p_threshold": _float(p, "p_threshold", 0.15, 0.0, 1.0), "d_threshold": _float(p, "d_threshold", 0.5, 0.0, 1e9),
            "half_window": _int(p, "half_window", 7, low=0, high=1 << 20)}


def _gsd(p: dict) -> Method:
    window = _int(p, "window", 8)
    group = _group_params(p)
    coupled = bool(p.pop("coupled", False))

    def rule_params(r: Resources) -> dict[str, Any]:
        return {"distances": latent_sq_distances(_need(r, "latents", "gsd")), **group}

    return Method("gsd", f"GSD: {'coupled ' if coupled else ''}SJD window {window}, grouped acceptance "
                  f"(ranks ±{group['half_window']}, |Δp| < {group['p_threshold']}, d² < {group['d_threshold']})", "",
                  group["p_threshold"] == 0 or group["d_threshold"] == 0 or group["half_window"] == 0,
                  lambda r: JacobiProposer(window, "coupled" if coupled else "sample", "repeat"),
                  "grouped-coupled" if coupled else "grouped", k=window, coupled=coupled,
                  make_rule_params=rule_params)


def _zipar(p: dict) -> Method:
    s = _int(p, "s", 4, high=1 << 20)
    window = _int(p, "window", 0, low=0)
    coupled = bool(p.pop("coupled", False))
    grouped = bool(p.pop("grouped", False))
    stand_in = p.pop("stand_in", "vertical")
    check(stand_in in STAND_INS, f"unknown ZipAR stand_in {stand_in!r}; choose from {', '.join(STAND_INS)}")
    check(window > 0 or not grouped, "ZipAR grouped acceptance verifies Jacobi drafts: give window >= 1")
    group = _group_params(p) if grouped else {}
    rule = {(False, False): "speculative", (False, True): "coupled", (True, False): "grouped",
            (True, True): "grouped-coupled"}[grouped, coupled]

    def run(resources: Resources, inputs: Any, *, max_new_tokens: int, sampling, seed: int, eos_token_id=None):
        grid = math.isqrt(max_new_tokens)
        check(grid * grid == max_new_tokens, f"ZipAR decodes square token grids; {max_new_tokens} tokens is not one")
        params = {"distances": latent_sq_distances(_need(resources, "latents", "zipar")), **group} if grouped else None
        return zipar_decode(resources.model, inputs, grid=grid, s=s, jacobi=window, rule=rule, rule_params=params,
                            sampling=sampling, seed=seed, coupled=coupled, stand_in=stand_in)

    extra = f", {stand_in} stand-in" + (f" x {'coupled ' if coupled else ''}SJD window {window} per row" if window else "")
    extra += f", GSD grouped acceptance (ranks ±{group['half_window']}, |Δp| < {group['p_threshold']}, " \
             f"d² < {group['d_threshold']})" if grouped else ""
    return Method("zipar", f"ZipAR next-set decoding, row window s={s}{extra}", "", False, lambda r: None,
                  runner=run)


def _sjd2(p: dict) -> Method:
    window = _int(p, "window", 32)       # defaults picked on development seeds (mmaccel.bench.image_tune --sweep sjd2)
    steps = _int(p, "steps", 2)
    coupled = bool(p.pop("coupled", False))
    check(steps <= window, f"SJD2 denoising steps ({steps}) cannot exceed the window ({window})")

    def run(resources: Resources, inputs: Any, *, max_new_tokens: int, sampling, seed: int, eos_token_id=None):
        return sjd2_decode(resources.model, inputs, embeddings=_need(resources, "embeddings", "sjd2"),
                           sigma=_need(resources, "embedding_scale", "sjd2"), max_new_tokens=max_new_tokens,
                           window=window, steps=steps, sampling=sampling, seed=seed, coupled=coupled)

    rule = "coupled verification (SCD)" if coupled else "exact speculative sampling"
    return Method("sjd2", f"SJD2: Jacobi window of {window} denoised from embedding noise in {steps} levels, "
                  f"{rule} on the clean drafts", "", True, lambda r: None, runner=run, coupled=coupled)


IMAGE_REGISTRY: dict[str, Callable[[dict], Method]] = {
    "ar": CORE_REGISTRY["ar"],
    "speculative": CORE_REGISTRY["speculative"],
    "tree": CORE_REGISTRY["tree"],
    "sjd": CORE_REGISTRY["sjd"],
    "sjd-coupled": CORE_REGISTRY["sjd-coupled"],
    "early-exit": CORE_REGISTRY["early-exit"],
    "lantern": _lantern,
    "gsd": _gsd,
    "zipar": _zipar,
    "sjd2": _sjd2,
}


def build_image_method(name: str | Method, **params: Any) -> Method:
    """The image method called `name` (see IMAGE_REGISTRY) configured by `params`, or a Method as it is."""
    return build_method(name, IMAGE_REGISTRY, **params)
