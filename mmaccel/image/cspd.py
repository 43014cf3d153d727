"""CSpD: Continuous Speculative Decoding for MAR-style models (Wang et al., arXiv 2411.11925).

The loop (as the reference implementation runs it, `SpecDecodeRunner.run`):
1. *Token pre-filling*: the first `prefill_ratio * num_iter` steps are plain target steps (early tokens
   are accepted rarely).
2. *Drafting*: the small model runs `num_draft` ordinary MAR steps, recording for each drafted token
   the Gaussian of its diffusion chain's last step (mean mu_q, std s_q).
3. *Denoising-trajectory alignment*: draft and target share every noise draw (`NoiseBank`): the same
   initial noise and per-step noise for each position's chain.
4. *Verification*: one target pass at the mask state from before the block (the drafted tokens are
   still masked for it) gives the target's condition at every drafted position; its head runs the same
   chain and yields the last-step Gaussian p = N(mu_p, s_p^2).
5. Each drafted token x is kept with probability min(1, p(x)/q(x)) (`core.gaussian.accept_gaussian`,
   densities evaluated with their std times `inner_temperature`); a rejected one is replaced by a draw
   from norm(max(0, p - q)) by acceptance-rejection (`core.gaussian.sample_gaussian_residual`). Kept and
   replaced tokens both stay: there is no prefix cut. A replacement still unaccepted after `max_tries`
   proposals keeps its last one (a draw from p) and is counted in `DecodeStats.fallbacks`.

What this is, exactly. Given the shared noise, the target's chain for a drafted position is fixed up to
its last step, whose law is p; with `inner_temperature=1` each verified token is distributed exactly as
p and the tokens of a block are independent given the noise. So **CSpD at temperature 1 has the law of
the target revealing the whole block in one step** (MAR's multi-token step from the block's start state),
not of one-token-per-step AR: the drafts change which sample is drawn, never its law (tested in
`tests/image/test_cspd.py`). Because the head's last step is nearly deterministic (std
sqrt(beta~_{t_1}), about 0.01 here), exact acceptance is rare unless the two heads agree to that
precision. The reference therefore flattens both densities with an inner temperature of 42, which keeps
most drafts: then the output leans towards the *draft's* sequential law, a relaxation whose deviation
is measured by FID (`mmaccel bench image-continuous`), not bounded. The reference also multiplies the
ratio by the product of the two heads' earlier-step std ratios; our heads share one fixed-variance
schedule, so that factor is exactly 1 and is omitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from mmaccel.core.driver import target_pass
from mmaccel.core.gaussian import accept_gaussian, sample_gaussian_residual
from mmaccel.core.stats import DecodeStats, declare_counter
from mmaccel.errors import check
from mmaccel.image.masked import (
    MaskedSampling,
    NoiseBank,
    conditions,
    gather_rows,
    reveal_counts,
    reveal_step,
    sample_head,
    write,
)
from mmaccel.image.models.mar import MAR

declare_counter("fallbacks", merge="sum", label="residual fallbacks",
                help="rejected drafts whose residual draw gave up after max_tries proposals and kept a draw from p")


@dataclass
class CSpDSettings:
    num_draft: int = 8              # draft steps per verification (reference default 8)
    prefill_ratio: float = 0.15     # share of the steps the target runs itself first (reference 0.15)
    inner_temperature: float = 42.0  # 1 = the exact density ratio (reference 42)
    max_tries: int = 100            # acceptance-rejection proposals for a rejected token (reference 100)

    def check(self) -> None:
        check(isinstance(self.num_draft, int) and self.num_draft >= 1, f"num_draft must be a positive int, "
                                                                        f"got {self.num_draft!r}")
        check(isinstance(self.prefill_ratio, (int, float)) and 0.0 <= self.prefill_ratio <= 1.0,
              f"prefill_ratio must be in [0, 1], got {self.prefill_ratio!r}")
        check(isinstance(self.inner_temperature, (int, float)) and self.inner_temperature > 0,
              f"inner_temperature must be positive, got {self.inner_temperature!r}")
        check(isinstance(self.max_tries, int) and self.max_tries >= 1, f"max_tries must be a positive int, "
                                                                        f"got {self.max_tries!r}")


def check_cspd_pair(target: MAR, draft: MAR) -> None:
    """The two models must share the token space, classes and diffusion schedule."""
    a, b = target.config, draft.config
    for name in ("seq_len", "token_dim", "num_classes", "train_timesteps", "beta_schedule"):
        check(getattr(a, name) == getattr(b, name), f"target and draft differ in {name} "
                                                    f"({getattr(a, name)} vs {getattr(b, name)}): CSpD needs one "
                                                    "tokenizer and one diffusion schedule")


@torch.inference_mode()
def cspd_decode(target: MAR, draft: MAR, labels: Tensor, sampling: MaskedSampling, settings: CSpDSettings,
                generator: torch.Generator, stats: DecodeStats | None = None, bank: NoiseBank | None = None) -> Tensor:
    """Tokens [B, L, C] for class `labels` [B] by CSpD; `stats.nfe` counts target passes, `draft_passes` draft
    passes, `accepted_hist` the drafts kept per verified block and row. The shared noise is `bank`, or
    drawn from `generator` (which then also drives acceptance and resampling)."""
    check_cspd_pair(target, draft)
    settings.check()
    c = target.config
    sampling.check(c.seq_len, target.diffusion.timesteps)
    stats = DecodeStats() if stats is None else stats
    B, device = len(labels), labels.device
    bank = bank or NoiseBank(B, c.seq_len, c.token_dim, sampling.diffusion_steps, generator, device)
    tokens = torch.zeros(B, c.seq_len, c.token_dim, device=device, dtype=target.token_proj.weight.dtype)
    known = torch.zeros(B, c.seq_len, dtype=torch.bool, device=device)
    counts = reveal_counts(c.seq_len, sampling.num_iter)
    prefill = math.floor(settings.prefill_ratio * sampling.num_iter)
    step, done = 0, 0
    while step < len(counts):
        if step <= prefill:                     # token pre-filling by the target
            pos = bank.order[:, done:done + counts[step]]
            with target_pass(stats, None):
                x, _, _ = reveal_step(target, tokens, known, labels, pos, bank,
                                      sampling.guidance(done + counts[step], c.seq_len), sampling)
            write(tokens, known, pos, x)
            done, step = done + counts[step], step + 1
            continue
        start = known.clone()
        block, q_means, weights = [], [], []
        for _ in range(settings.num_draft):
            if step == len(counts):
                break
            pos = bank.order[:, done:done + counts[step]]
            w = sampling.guidance(done + counts[step], c.seq_len)
            x, mean, q_std = reveal_step(draft, tokens, known, labels, pos, bank, w, sampling)
            write(tokens, known, pos, x)
            block.append(pos)
            q_means.append(mean.view(B, pos.shape[1], -1))
            weights.append(torch.full(pos.shape, w, device=device, dtype=tokens.dtype))
            done, step = done + counts[step], step + 1
            stats.draft_passes += 1
        pos, q_mean, w = torch.cat(block, 1), torch.cat(q_means, 1).flatten(0, 1), torch.cat(weights, 1).flatten()
        with target_pass(stats, None):
            z, z_null = conditions(target, tokens, start, labels, sampling.cfg > 1.0)   # drafts still masked
            _, p_mean, p_std = sample_head(target, gather_rows(z, pos), None if z_null is None else gather_rows(z_null, pos),
                                           w, gather_rows(bank.init, pos), gather_rows(bank.steps, pos), sampling)
        x = gather_rows(tokens, pos)
        uniforms = torch.rand(len(x), generator=generator, device=device)
        keep = accept_gaussian(x, q_mean, q_std, p_mean, p_std, uniforms, settings.inner_temperature)
        if not keep.all():
            redo = (~keep).nonzero().flatten()
            fresh, exhausted = sample_gaussian_residual(p_mean[redo], p_std, q_mean[redo], q_std, generator,
                                                        settings.max_tries)
            stats.fallbacks += int(exhausted.sum())
            x[redo] = fresh
            write(tokens, known, pos, x)
        stats.record_accepted(keep.view(B, -1).sum(1).tolist())
    stats.new_tokens += B * c.seq_len
    return tokens
