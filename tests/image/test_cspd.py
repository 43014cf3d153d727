"""CSpD (image.cspd): what it preserves exactly, and what its inner temperature relaxes."""

import copy

import pytest
import torch
from torch import nn

from mmaccel.core.stats import DecodeStats
from mmaccel.errors import InputError
from mmaccel.image.cspd import CSpDSettings, cspd_decode
from mmaccel.image.masked import MaskedSampling, NoiseBank, reveal_step, write
from mmaccel.image.models.mar import MAR, MARConfig
from tests.ks import ks_pvalue, normal_cdf

ROWS = 3000
CONFIG = MARConfig(seq_len=4, token_dim=2, num_classes=2, width=32, depth=1, heads=2, buffer=1, head_width=32,
                   head_depth=1)


class X0Head(nn.Module):
    """A head whose denoiser is exact for data x0 = m(z) + shift: v = (sqrt(a_t) x_t - x0) / sqrt(1 - a_t).
    (With a random MLP head every token would land near 0 whatever its condition.)"""

    def __init__(self, model: MAR, scale: float, shift: float = 0.0):
        super().__init__()
        self.m = nn.Linear(model.config.width, model.config.token_dim)
        nn.init.normal_(self.m.weight, std=scale)
        nn.init.zeros_(self.m.bias)
        self.shift = shift
        self.register_buffer("abar", model.diffusion.alphas_cumprod.float())

    def forward(self, x, t, z):
        a = self.abar[t][:, None]
        return (a.sqrt() * x - (self.m(z) + self.shift)) / (1 - a).sqrt()

    def plan(self, times, z):
        return times, z

    def step(self, x, plan, i):
        times, z = plan
        return self(x, times[i].expand(len(x)), z)


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    target = MAR(CONFIG).eval()
    torch.manual_seed(1)
    target.head = X0Head(target, scale=0.003)
    draft = copy.deepcopy(target)
    draft.head.shift = 0.003          # a draft close enough for about 40 % of the drafts to be kept
    return target, draft


def shared_bank(sampling: MaskedSampling, seed: int) -> NoiseBank:
    """ROWS copies of one generation's noise, except the last denoising step's, which is fresh per row:
    the randomness that speculative sampling integrates over."""
    one = NoiseBank(1, CONFIG.seq_len, CONFIG.token_dim, sampling.diffusion_steps, torch.Generator().manual_seed(0),
                    torch.device("cpu"))
    bank = NoiseBank(ROWS, CONFIG.seq_len, CONFIG.token_dim, sampling.diffusion_steps,
                     torch.Generator().manual_seed(seed), torch.device("cpu"))
    last = bank.steps[:, :, -1].clone()
    bank.order, bank.init = one.order.expand(ROWS, -1).clone(), one.init.expand(ROWS, -1, -1).clone()
    bank.steps = one.steps.expand(ROWS, -1, -1, -1).clone()
    bank.steps[:, :, -1] = last
    return bank


def block_z_scores(pair, sampling, temperature, seed=1):
    """Run CSpD (1 target step, then one block of 3 drafts) and standardise the block's tokens by the
    target's own law for them: one MAR step revealing the whole block from the state before it."""
    target, draft = pair
    labels = torch.zeros(ROWS, dtype=torch.long)
    bank = shared_bank(sampling, seed)
    stats = DecodeStats()
    out = cspd_decode(target, draft, labels, sampling, CSpDSettings(num_draft=3, prefill_ratio=0.0,
                                                                    inner_temperature=temperature),
                      torch.Generator().manual_seed(seed + 100), stats, bank)
    tokens = torch.zeros(ROWS, CONFIG.seq_len, CONFIG.token_dim)
    known = torch.zeros(ROWS, CONFIG.seq_len, dtype=torch.bool)
    first = bank.order[:, :1]
    block = bank.order[:, 1:]
    with torch.inference_mode():   # as the decoders run (the transformer's inference fast path)
        x, _, _ = reveal_step(target, tokens, known, labels, first, bank, sampling.guidance(1, CONFIG.seq_len),
                              sampling)
        write(tokens, known, first, x)
        assert torch.equal(out.gather(1, first[..., None].expand(-1, -1, 2)).flatten(0, 1), x)  # target pre-fill
        _, mean, std = reveal_step(target, tokens, known, labels, block, bank, sampling.guidance(2, CONFIG.seq_len),
                                   sampling)
    got = out.gather(1, block[..., None].expand(-1, -1, 2)).flatten(0, 1)
    return ((got - mean) / std).flatten(), stats.mean_accepted / 3


@pytest.mark.parametrize("cfg", [1.0, 2.0])
def test_at_temperature_one_a_block_has_the_targets_one_step_law(pair, cfg):
    sampling = MaskedSampling(num_iter=4, cfg=cfg, cfg_schedule="constant", diffusion_steps=4)
    z, kept = block_z_scores(pair, sampling, temperature=1.0)
    assert 0.15 < kept < 0.85                                # drafts are both kept and replaced
    assert ks_pvalue(z, normal_cdf()) > 1e-3


def test_negative_control_the_reference_inner_temperature_is_not_exact(pair):
    sampling = MaskedSampling(num_iter=4, cfg=1.0, diffusion_steps=4)
    z, kept = block_z_scores(pair, sampling, temperature=42.0)
    assert kept > 0.95
    assert ks_pvalue(z, normal_cdf()) < 1e-6


def test_counts_and_determinism(pair):
    target, draft = pair
    sampling = MaskedSampling(num_iter=4, cfg=2.0, diffusion_steps=3)
    labels = torch.tensor([0, 1])
    runs = []
    for _ in range(2):
        stats = DecodeStats()
        runs.append(cspd_decode(target, draft, labels, sampling, CSpDSettings(num_draft=2, prefill_ratio=0.25),
                                torch.Generator().manual_seed(7), stats))
    assert torch.equal(*runs)
    # steps 0 and 1 by the target (floor(0.25 * 4) = 1), then one block of 2 drafts and its verification
    assert (stats.nfe, stats.draft_passes, sum(stats.accepted_hist.values())) == (3, 2, 2)


def test_a_residual_draw_that_runs_out_of_tries_is_counted(pair):
    target, draft = pair
    sampling = MaskedSampling(num_iter=4, cfg=1.0, diffusion_steps=3)
    labels = torch.zeros(200, dtype=torch.long)
    counts = {}
    for tries in (1, 100):
        stats = DecodeStats()
        cspd_decode(target, draft, labels, sampling, CSpDSettings(num_draft=3, prefill_ratio=0.0, inner_temperature=1.0,
                                                                  max_tries=tries), torch.Generator().manual_seed(3), stats)
        rejected = 3 * len(labels) - sum(k * v for k, v in stats.accepted_hist.items())
        assert 0 <= stats.fallbacks <= rejected
        counts[tries] = stats.fallbacks
    assert counts[1] > 0 and counts[100] < counts[1]
    assert DecodeStats.from_dict(stats.to_dict()).fallbacks == stats.fallbacks
    counted = DecodeStats()
    counted.fallbacks = counts[1]       # JSON as before: last, and only where a fallback happened
    assert list(counted.to_dict())[-1] == "fallbacks" and "fallbacks" not in DecodeStats().to_dict()


def test_bad_settings_and_mismatched_models_are_clear_errors(pair):
    target, _ = pair
    sampling = MaskedSampling(num_iter=4, diffusion_steps=3)
    labels = torch.tensor([0])
    g = torch.Generator().manual_seed(0)
    for bad, match in [(CSpDSettings(num_draft=0), "num_draft"), (CSpDSettings(prefill_ratio=1.5), "prefill_ratio"),
                       (CSpDSettings(inner_temperature=0), "inner_temperature"), (CSpDSettings(max_tries=0), "max_tries")]:
        with pytest.raises(InputError, match=match):
            cspd_decode(target, target, labels, sampling, bad, g)
    other = MAR(MARConfig(seq_len=9, token_dim=2, num_classes=2, width=32, depth=1, heads=2, buffer=1, head_width=32,
                          head_depth=1))
    with pytest.raises(InputError, match="seq_len"):
        cspd_decode(target, other, labels, sampling, CSpDSettings(), g)
