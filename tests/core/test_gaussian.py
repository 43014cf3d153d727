"""Speculative sampling of Gaussian tokens (core.gaussian) against closed forms."""

import pytest
import torch

from mmaccel.core.gaussian import accept_gaussian, gaussian_log_density, sample_gaussian_residual
from mmaccel.errors import InputError
from tests.ks import ks_pvalue, normal_cdf

N = 20_000
P, Q = (0.3, 1.0), (-0.4, 0.7)        # target and draft (mean, std), 1-D


def speculative_step(resample_from_p: bool = False, temperature: float = 1.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mp, sp = torch.full((N, 1), P[0]), P[1]
    mq, sq = torch.full((N, 1), Q[0]), Q[1]
    x = mq + sq * torch.randn(N, 1, generator=g)
    keep = accept_gaussian(x, mq, sq, mp, sp, torch.rand(N, generator=g), temperature)
    if resample_from_p:                          # the negative control: skip the residual
        fresh = mp + sp * torch.randn(N, 1, generator=g)
    else:
        fresh, exhausted = sample_gaussian_residual(mp, sp, mq, sq, g)
        assert not exhausted.any()
    return torch.where(keep[:, None], x, fresh)[:, 0]


def test_draft_accept_and_residual_give_exactly_the_target_law():
    assert ks_pvalue(speculative_step(), normal_cdf(*P)) > 1e-3


def test_negative_control_resampling_from_the_target_is_rejected():
    assert ks_pvalue(speculative_step(resample_from_p=True), normal_cdf(*P)) < 1e-6


def test_inner_temperature_is_a_relaxation_that_keeps_more_drafts():
    assert ks_pvalue(speculative_step(temperature=42.0), normal_cdf(*P)) < 1e-6
    g = torch.Generator().manual_seed(1)            # equal stds (as two heads on one schedule): -> all kept
    x = Q[0] + Q[1] * torch.randn(N, 1, generator=g)
    u = torch.rand(N, generator=g)
    rates = [accept_gaussian(x, torch.full_like(x, Q[0]), Q[1], torch.full_like(x, P[0]), Q[1], u, t).float().mean()
             for t in (1.0, 4.0, 42.0)]
    assert rates[0] < rates[1] < rates[2] and rates[2] > 0.99


def test_residual_sampler_matches_the_normalised_positive_part():
    """norm(max(0, p - q)) on a fine grid -> its CDF; the sampler's draws must follow it."""
    grid = torch.linspace(-10, 10, 200_001, dtype=torch.float64)
    dens = lambda m, s: torch.exp(-0.5 * ((grid - m) / s) ** 2) / s          # noqa: E731 (shared 1/sqrt(2 pi))
    residual = (dens(*P) - dens(*Q)).clamp_min(0)
    cdf_grid = torch.cumsum(residual, 0) / residual.sum()
    cdf = lambda x: torch.from_numpy(__import__("numpy").interp(x.numpy(), grid.numpy(), cdf_grid.numpy()))  # noqa: E731
    g = torch.Generator().manual_seed(2)
    samples, exhausted = sample_gaussian_residual(torch.full((N, 1), P[0]), P[1], torch.full((N, 1), Q[0]), Q[1], g)
    assert not exhausted.any()
    assert ks_pvalue(samples[:, 0], cdf) > 1e-3
    wrong, _ = sample_gaussian_residual(torch.full((N, 1), P[0]), P[1], torch.full((N, 1), P[0] + 0.5), Q[1], g)
    assert ks_pvalue(wrong[:, 0], cdf) < 1e-6


def test_multichannel_tokens_use_the_joint_density():
    """C = 3 with per-channel stds: the output's projections follow the target's marginals."""
    g = torch.Generator().manual_seed(3)
    mp, sp = torch.tensor([[0.2, -0.1, 0.5]]).expand(N, 3), torch.tensor([0.9, 1.1, 0.6])
    mq, sq = torch.tensor([[0.0, 0.3, 0.2]]).expand(N, 3), torch.tensor([1.0, 0.8, 0.7])
    x = mq + sq * torch.randn(N, 3, generator=g)
    keep = accept_gaussian(x, mq, sq, mp, sp, torch.rand(N, generator=g))
    fresh, _ = sample_gaussian_residual(mp, sp, mq, sq, g)
    out = torch.where(keep[:, None], x, fresh)
    for c in range(3):
        assert ks_pvalue(out[:, c], normal_cdf(mp[0, c].item(), sp[c].item())) > 1e-3
    log_p = gaussian_log_density(x[:2], mp[:2], sp)
    manual = torch.distributions.Normal(mp[:2], sp).log_prob(x[:2]).sum(-1)
    assert torch.allclose(log_p, manual, atol=1e-5)


def test_identical_laws_exhaust_the_residual_and_say_so():
    g = torch.Generator().manual_seed(4)
    m = torch.zeros(8, 2)
    samples, exhausted = sample_gaussian_residual(m, 1.0, m, 1.0, g, max_tries=5)
    assert exhausted.all() and torch.isfinite(samples).all()


def test_bad_parameters_are_clear_errors():
    m = torch.zeros(2, 1)
    with pytest.raises(InputError, match="temperature"):
        accept_gaussian(m, m, 1.0, m, 1.0, torch.rand(2), temperature=0.0)
    with pytest.raises(InputError, match="max_tries"):
        sample_gaussian_residual(m, 1.0, m, 1.0, max_tries=0)
