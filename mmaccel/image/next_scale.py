"""Next-scale decoding: VAR's KV-cached scale loop and CoDe's hand-off between two VARs.

`decode_scales` runs scales `first..last-1` of one model. From scale 0 it is VAR's
`autoregressive_infer_cfg`: one forward pass per scale, all pn^2 tokens of a scale sampled in
parallel, the sampled codes added into f_hat (`MultiScaleQuantizer.next_input`), whose downsampled
map is the next scale's input. Given a `ScalePrefix` of scales another model drew, it first prefills
that model's cache with every block up to `first` in **one** block-causal pass, whose last block gives
scale `first` (CoDe, Chen et al. 2025, §3.2: "refiner" prefill on the "drafter" prefix).

CFG (VAR): the batch is doubled (condition | null class) and the guidance ramps linearly with the
scale, t = cfg * k / (K - 1), logits = (1 + t) cond - t uncond. Sampling: top-k, then top-p, then
the per-scale temperature (CoDe's order; VAR's FID recipe uses temperature 1), one categorical draw
per token (inverse CDF over the kept codes) from a seeded generator, so the drafter's scales of a
CoDe call equal the same model's scales of a plain call with the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from mmaccel.core.driver import target_pass
from mmaccel.core.sampling import Sampling
from mmaccel.core.stats import DecodeStats
from mmaccel.errors import check
from mmaccel.image.models.var import VAR
from mmaccel.image.tokenizers.msvq import MSVQModel


@dataclass(frozen=True)
class ScaleSampling:
    """How a scale's logits become codes: CFG scale (ramped over scales), top-k, top-p, temperature
    (one float, or one per scale)."""

    cfg: float = 1.5
    top_k: int = 0
    top_p: float = 1.0
    temperature: float | tuple[float, ...] = 1.0

    def __post_init__(self) -> None:
        check(isinstance(self.cfg, (int, float)) and self.cfg >= 0, f"cfg_scale must be >= 0, got {self.cfg!r}")
        Sampling(temperature=1.0, top_k=self.top_k, top_p=self.top_p)  # validates top_k / top_p
        temps = self.temperature if isinstance(self.temperature, (tuple, list)) else (self.temperature,)
        check(all(isinstance(t, (int, float)) and t > 0 for t in temps),
              f"temperature must be > 0 (a float or one per scale), got {self.temperature!r}")
        if isinstance(self.temperature, list):
            object.__setattr__(self, "temperature", tuple(self.temperature))

    def temperature_at(self, si: int, n_scales: int) -> float:
        if isinstance(self.temperature, tuple):
            check(len(self.temperature) == n_scales,
                  f"temperature has {len(self.temperature)} values but there are {n_scales} scales")
            return float(self.temperature[si])
        return float(self.temperature)

    def sample(self, logits: Tensor, si: int, n_scales: int, generator: torch.Generator) -> Tensor:
        """Codes [B, n] from guided logits [B, n, V]: top-k keeps the k largest logits, top-p the head of
        those whose mass reaches p, and one inverse-CDF draw per token picks among what is left at the
        scale's temperature. One uniform per token instead of `torch.multinomial`'s V exponentials, and a
        softmax over k logits instead of V: the categorical `Sampling.warp` defines, at a quarter of the
        cost (sampling was a third of the small VAR's time)."""
        B, n, V = logits.shape
        flat = logits.reshape(B * n, V).float()
        index = None
        if 0 < self.top_k < V:
            flat, index = flat.topk(self.top_k, dim=-1, sorted=False)
        flat = Sampling(temperature=1.0, top_p=self.top_p).warp(flat)   # top-p over the kept codes
        probs = (flat / self.temperature_at(si, n_scales)).softmax(-1)
        cdf = probs.cumsum(-1)
        u = torch.rand(B * n, 1, generator=generator, device=cdf.device) * cdf[:, -1:]
        pick = torch.searchsorted(cdf, u, right=True).clamp_max_(cdf.shape[-1] - 1)
        # float rounding at the top of the CDF may land on a token without mass: take the mode instead
        pick = torch.where(probs.gather(-1, pick) > 0, pick, probs.argmax(-1, keepdim=True))
        codes = pick if index is None else index.gather(-1, pick)
        return codes.view(B, n)


@dataclass
class ScalePrefix:
    """What the scales drawn so far leave behind: f_hat [B, Cvae, h, w], the codes of each scale
    ([B, pn^2]) and the next-scale inputs of blocks 1..len(indices) ([B, pn_k^2, Cvae])."""

    f_hat: Tensor
    indices: list[Tensor] = field(default_factory=list)
    inputs: list[Tensor] = field(default_factory=list)

    @property
    def scales(self) -> int:
        return len(self.indices)


def check_pair(model: VAR, vq: MSVQModel) -> None:
    """A VAR and a tokenizer trained together: same code count, code width and scale schedule."""
    c = model.config
    check(c.vocab_size == vq.vocab_size and c.z_channels == vq.config.z_channels,
          f"the VAR reads {c.vocab_size} codes of width {c.z_channels} but the tokenizer has {vq.vocab_size} of width "
          f"{vq.config.z_channels}: they were not trained together")
    check(tuple(c.patch_nums) == tuple(vq.patch_nums),
          f"the VAR's scale schedule {c.patch_nums} differs from the tokenizer's {vq.patch_nums}")


@torch.no_grad()
def decode_scales(model: VAR, vq: MSVQModel, labels: Tensor, sampling: ScaleSampling, generator: torch.Generator,
                  *, last: int | None = None, prefix: ScalePrefix | None = None,
                  stats: DecodeStats | None = None) -> tuple[ScalePrefix, int]:
    """Draw scales `prefix.scales`..`last`-1 with `model`; returns (the extended prefix, the KV-cache
    bytes this call allocated). `labels` [B]; passes are added to `stats.nfe`."""
    check_pair(model, vq)
    K = len(model.patch_nums)
    last = K if last is None else last
    first = 0 if prefix is None else prefix.scales
    check(0 <= first < last <= K, f"scales {first}..{last - 1} are not a range within the {K} scales")
    stats = DecodeStats() if stats is None else stats
    B = labels.shape[0]
    null = torch.full_like(labels, model.num_classes)
    guided = sampling.cfg != 0
    rows = torch.cat((labels, null)) if guided else labels
    cond = model.class_emb(rows)
    cache = model.new_cache(rows.shape[0], last)
    if prefix is None:
        side = vq.patch_nums[-1]
        codebook = vq.quantize.embedding.weight
        prefix = ScalePrefix(f_hat=codebook.new_zeros(B, vq.config.z_channels, side, side))
        x = model.embed_blocks(cond, None, 0, 1)
    else:
        prefix = ScalePrefix(prefix.f_hat, list(prefix.indices), list(prefix.inputs))
        given = torch.cat(prefix.inputs[:first], 1)
        x = model.embed_blocks(cond, given.repeat(2, 1, 1) if guided else given, 0, first + 1)
    with target_pass(stats, None):
        logits = model.forward_blocks(x, cond, cache, 0, first + 1)
    for si in range(first, last):
        if guided:
            t = sampling.cfg * si / (K - 1)
            logits = (1 + t) * logits[:B] - t * logits[B:]
        codes = sampling.sample(logits, si, K, generator)
        pn = model.patch_nums[si]
        vectors = vq.quantize.embedding(codes).transpose(1, 2).reshape(B, -1, pn, pn)
        prefix.f_hat, nxt = vq.quantize.next_input(si, prefix.f_hat, vectors)
        prefix.indices.append(codes)
        if nxt is not None:
            prefix.inputs.append(nxt)
        if si + 1 < last:
            x = model.embed_blocks(cond, nxt.repeat(2, 1, 1) if guided else nxt, si + 1, si + 2)
            with target_pass(stats, None):
                logits = model.forward_blocks(x, cond, cache, si + 1, si + 2)
    stats.new_tokens += B * (model.offsets[last] - model.offsets[first])
    return prefix, cache.nbytes


def check_code_pair(drafter: VAR, refiner: VAR, vq: MSVQModel, draft_steps: int) -> None:
    """CoDe needs two VARs of one tokenizer and a hand-off scale within the schedule."""
    check_pair(drafter, vq)
    check_pair(refiner, vq)
    check(drafter.num_classes == refiner.num_classes,
          f"the drafter has {drafter.num_classes} classes but the refiner {refiner.num_classes}")
    K = len(vq.patch_nums)
    check(isinstance(draft_steps, int) and 1 <= draft_steps <= K - 1,
          f"draft_steps must be an int in [1, {K - 1}] (the scales the large model draws), got {draft_steps!r}")


@torch.no_grad()
def collaborative_decode(drafter: VAR, refiner: VAR, vq: MSVQModel, labels: Tensor, sampling: ScaleSampling,
                         generator: torch.Generator, draft_steps: int, stats: DecodeStats | None = None,
                         refiner_sampling: ScaleSampling | None = None) -> tuple[ScalePrefix, int]:
    """CoDe: `drafter` (the large VAR) draws scales 0..N-1 with a cache of only those blocks; `refiner`
    (the small VAR) prefills on them in one pass and draws scales N..K-1, with `refiner_sampling` where
    given (a small model may want another guidance scale than the large one). Returns (the full prefix,
    the larger of the two caches' bytes: the drafter's is freed before the refiner's is allocated).
    Passes: the drafter's count in `stats.nfe`, the refiner's in `stats.draft_passes`."""
    check_code_pair(drafter, refiner, vq, draft_steps)
    drafted, draft_bytes = decode_scales(drafter, vq, labels, sampling, generator, last=draft_steps, stats=stats)
    refined_stats = DecodeStats()
    out, refine_bytes = decode_scales(refiner, vq, labels, refiner_sampling or sampling, generator, prefix=drafted,
                                      stats=refined_stats)
    if stats is not None:
        stats.draft_passes += refined_stats.nfe
        stats.new_tokens += refined_stats.new_tokens
    return out, max(draft_bytes, refine_bytes)

