"""Speculative sampling for continuous tokens whose draft and target laws are diagonal Gaussians.

The continuous counterpart of `acceptance.accept_speculative` (used by CSpD, `mmaccel.image.cspd`):
a draft x ~ q = N(mu_q, s_q^2) is kept with probability min(1, p(x) / q(x)) for the target
p = N(mu_p, s_p^2); a rejected one is replaced by a draw from the residual norm(max(0, p - q)). Then
the result is distributed exactly as p. The residual has no closed-form sampler, so it is drawn by
acceptance-rejection with proposal p: y ~ p is kept with probability max(0, 1 - q(y) / p(y)), valid
because (p - q)^+ <= p (bound M = 1); the expected number of tries is 1 / TV(p, q).

Rows are independent; every density is over the last dimension (C channels). Randomness comes in
as `uniforms` or a `generator`, so the rule is reproducible and testable against closed forms.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mmaccel.errors import check


def gaussian_log_density(x: Tensor, mean: Tensor, std: Tensor | float, temperature: float = 1.0) -> Tensor:
    """log N(x; mean, (temperature * std)^2 I), summed over the last dimension -> [...]. `std`: a float, [C]
    or the shape of `x`."""
    std = std * temperature
    log_std = torch.log(std) if isinstance(std, Tensor) else math.log(std)
    return (-0.5 * ((x - mean) / std).square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def accept_gaussian(x: Tensor, draft_mean: Tensor, draft_std: Tensor | float, target_mean: Tensor,
                    target_std: Tensor | float, uniforms: Tensor, temperature: float = 1.0) -> Tensor:
    """[N] bool: keep draft x [N, C] when u < p(x) / q(x).

    `temperature` > 1 evaluates both densities with their standard deviations multiplied by it (CSpD's
    "inner temperature", 42 in its demo): a relaxation that keeps drafts far from the target's mean more
    often; only `temperature=1` is exact."""
    check(temperature > 0, f"temperature must be positive, got {temperature}")
    log_ratio = (gaussian_log_density(x, target_mean, target_std, temperature)
                 - gaussian_log_density(x, draft_mean, draft_std, temperature))
    return torch.log(uniforms) < log_ratio


def sample_gaussian_residual(target_mean: Tensor, target_std: Tensor | float, draft_mean: Tensor,
                             draft_std: Tensor | float, generator: torch.Generator | None = None,
                             max_tries: int = 100) -> tuple[Tensor, Tensor]:
    """(samples [N, C], exhausted [N] bool): draws from norm(max(0, p - q)) by acceptance-rejection with
    proposal p. A row still unaccepted after `max_tries` proposals keeps its last proposal (a draw from p)
    and is flagged in `exhausted`; that happens only when p and q nearly coincide (TV < ~1/max_tries),
    where the residual's mass is tiny."""
    check(isinstance(max_tries, int) and max_tries >= 1, f"max_tries must be a positive int, got {max_tries!r}")
    device = target_mean.device
    samples = torch.empty_like(target_mean)
    pending = torch.ones(len(target_mean), dtype=torch.bool, device=device)
    for _ in range(max_tries):
        idx = pending.nonzero().flatten()
        p_std, q_std = _rows(target_std, idx, target_mean), _rows(draft_std, idx, target_mean)
        noise = torch.randn(len(idx), target_mean.shape[-1], generator=generator, device=device, dtype=target_mean.dtype)
        y = target_mean[idx] + p_std * noise
        log_p = gaussian_log_density(y, target_mean[idx], p_std)
        log_q = gaussian_log_density(y, draft_mean[idx], q_std)
        keep_prob = (1 - torch.exp(log_q - log_p)).clamp_min(0)
        keep = torch.rand(len(idx), generator=generator, device=device, dtype=target_mean.dtype) < keep_prob
        samples[idx] = y                       # the last proposal stands for rows that never accept
        pending[idx[keep]] = False
        if not pending.any():
            break
    return samples, pending


def _rows(std: Tensor | float, idx: Tensor, like: Tensor) -> Tensor | float:
    """`std` for the rows `idx` of `like` [N, C]: per-row stds are indexed, a float or a [C] vector is shared."""
    return std[idx] if isinstance(std, Tensor) and std.shape == like.shape else std
