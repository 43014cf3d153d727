"""MAR sampling: reveal tokens in a random order, a cosine-scheduled number per step, each drawn by its diffusion head.

`masked_decode(model, labels, num_iter=L)` is one token per step, MAR's autoregressive limit (the
baseline of CSpD); `num_iter < L` is MAR's own multi-token mode (its default is 64 steps for 256
tokens, 4 per step on average). All randomness is fixed up front by `NoiseBank` (the order, every
diffusion chain's initial and per-step noise), so two models or two methods run on the same seed see
the same noise: the "denoising-trajectory alignment" of CSpD.

Guidance (MAR): the head's prediction is v_u + w (v_c - v_u) (affine in the noise prediction, so the same
as MAR's guidance on the noise), with the conditional and the
null-class transformer outputs from one doubled pass; the "linear" schedule raises w from 1 to `cfg`
with the fraction of tokens revealed after the step. `temperature` multiplies every step's noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from mmaccel.core.driver import target_pass
from mmaccel.core.stats import DecodeStats
from mmaccel.errors import check
from mmaccel.image.models.mar import MAR

CFG_SCHEDULES = ("linear", "constant")


def reveal_counts(seq_len: int, num_iter: int) -> list[int]:
    """Tokens revealed at each of `num_iter` steps: MAR's cosine mask schedule (the masked count after step s
    is floor(L cos(pi/2 (s+1)/num_iter)), kept between 1 and the count before minus 1). `num_iter = L` gives
    one token per step."""
    check(isinstance(num_iter, int) and 1 <= num_iter <= seq_len,
          f"num_iter must be an int in [1, {seq_len}] (tokens per image), got {num_iter!r}")
    counts, masked = [], seq_len
    for step in range(num_iter):
        after = 0 if step == num_iter - 1 else max(1, min(masked - 1,
                                                          math.floor(seq_len * math.cos(math.pi / 2 * (step + 1) / num_iter))))
        counts.append(masked - after)
        masked = after
    return counts


@dataclass
class MaskedSampling:
    """MAR's sampling recipe."""

    num_iter: int = 64
    cfg: float = 3.0
    cfg_schedule: str = "linear"
    temperature: float = 1.0
    diffusion_steps: int = 25

    def check(self, seq_len: int, timesteps: int) -> None:
        reveal_counts(seq_len, self.num_iter)
        check(isinstance(self.cfg, (int, float)) and self.cfg >= 1.0, f"cfg must be >= 1 (1 = no guidance), got {self.cfg!r}")
        check(self.cfg_schedule in CFG_SCHEDULES, f"unknown cfg_schedule {self.cfg_schedule!r}; choose from "
                                                  f"{', '.join(CFG_SCHEDULES)}")
        check(isinstance(self.temperature, (int, float)) and self.temperature > 0,
              f"temperature must be positive, got {self.temperature!r}")
        check(isinstance(self.diffusion_steps, int) and 1 <= self.diffusion_steps < timesteps,
              f"diffusion_steps must be an int in [1, {timesteps - 1}], got {self.diffusion_steps!r}")

    def guidance(self, revealed_after: int, seq_len: int) -> float:
        """w for a step after which `revealed_after` tokens are known."""
        if self.cfg_schedule == "constant":
            return float(self.cfg)
        return 1.0 + (self.cfg - 1.0) * revealed_after / seq_len


class NoiseBank:
    """Every random draw of one generation, made up front: the reveal order [B, L], each chain's initial
    noise [B, L, C] and its per-step noise [B, L, S, C]."""

    def __init__(self, batch: int, seq_len: int, token_dim: int, steps: int, generator: torch.Generator,
                 device: torch.device):
        self.order = torch.rand(batch, seq_len, generator=generator, device=device).argsort(1)
        self.init = torch.randn(batch, seq_len, token_dim, generator=generator, device=device)
        self.steps = torch.randn(batch, seq_len, steps, token_dim, generator=generator, device=device)


def gather_rows(x: Tensor, pos: Tensor) -> Tensor:
    """x [B, L, ...] at positions pos [B, n] -> [B * n, ...]."""
    index = pos.reshape(*pos.shape, *([1] * (x.dim() - 2))).expand(*pos.shape, *x.shape[2:])
    return torch.gather(x, 1, index).flatten(0, 1)


def conditions(model: MAR, tokens: Tensor, known: Tensor, labels: Tensor, guided: bool) -> tuple[Tensor, Tensor | None]:
    """(z, z_null) [B, L, W]: the transformer's outputs for `labels` and, when `guided`, for the null class,
    from one doubled pass."""
    if not guided:
        return model.condition(tokens, known, labels), None
    null = torch.full_like(labels, model.null_class)
    z = model.condition(tokens.repeat(2, 1, 1), known.repeat(2, 1), torch.cat([labels, null]))
    return z.chunk(2)


def sample_head(model: MAR, z: Tensor, z_null: Tensor | None, guidance: Tensor, init: Tensor, noise: Tensor,
                sampling: MaskedSampling) -> tuple[Tensor, Tensor, float]:
    """Run the head's DDPM chain for N tokens: z, z_null [N, W], guidance [N] (w per token), init [N, C],
    noise [N, S, C] -> (x_0 [N, C], mean of the last step [N, C], std of the last step)."""
    times = model.diffusion.sampling_timesteps(sampling.diffusion_steps)
    head, x, cond = model.head, init, z if z_null is None else torch.cat([z, z_null])
    w = guidance[:, None]
    plan = head.plan(torch.tensor(times[:-1], device=x.device), cond)
    for i, (t, t_prev) in enumerate(zip(times, times[1:])):
        if z_null is None:
            v = head.step(x, plan, i)
        else:
            v_c, v_u = head.step(torch.cat([x, x]), plan, i).chunk(2)
            v = v_u + w * (v_c - v_u)
        mean, std = model.diffusion.posterior(x, v.to(x.dtype), t, t_prev)
        std *= sampling.temperature
        x = mean + std * noise[:, i]
    return x, mean, std


def reveal_step(model: MAR, tokens: Tensor, known: Tensor, labels: Tensor, pos: Tensor, bank: NoiseBank,
                guidance: float, sampling: MaskedSampling) -> tuple[Tensor, Tensor, float]:
    """One MAR step: draw the tokens at `pos` [B, n] given `known`; returns (x, last-step mean) [B*n, C]
    and the last-step std. Does not write them."""
    z, z_null = conditions(model, tokens, known, labels, sampling.cfg > 1.0)
    rows = len(pos) * pos.shape[1]
    w = torch.full((rows,), guidance, device=tokens.device, dtype=tokens.dtype)
    return sample_head(model, gather_rows(z, pos), None if z_null is None else gather_rows(z_null, pos), w,
                       gather_rows(bank.init, pos), gather_rows(bank.steps, pos), sampling)


def write(tokens: Tensor, known: Tensor, pos: Tensor, x: Tensor) -> None:
    """tokens[b, pos[b]] = x (rows of [B*n, C]) and mark them known."""
    tokens.scatter_(1, pos[..., None].expand(-1, -1, tokens.shape[-1]), x.view(*pos.shape, -1).to(tokens.dtype))
    known.scatter_(1, pos, True)


@torch.inference_mode()
def masked_decode(model: MAR, labels: Tensor, sampling: MaskedSampling, generator: torch.Generator,
                  stats: DecodeStats | None = None, bank: NoiseBank | None = None) -> Tensor:
    """Tokens [B, L, C] for class `labels` [B] by MAR's sampler (`sampling.num_iter` steps); the noise is
    `bank`, or drawn from `generator`."""
    c = model.config
    sampling.check(c.seq_len, model.diffusion.timesteps)
    stats = DecodeStats() if stats is None else stats
    B, device = len(labels), labels.device
    bank = bank or NoiseBank(B, c.seq_len, c.token_dim, sampling.diffusion_steps, generator, device)
    tokens = torch.zeros(B, c.seq_len, c.token_dim, device=device, dtype=model.token_proj.weight.dtype)
    known = torch.zeros(B, c.seq_len, dtype=torch.bool, device=device)
    done = 0
    for n in reveal_counts(c.seq_len, sampling.num_iter):
        pos = bank.order[:, done:done + n]
        with target_pass(stats, None):
            x, _, _ = reveal_step(model, tokens, known, labels, pos, bank, sampling.guidance(done + n, c.seq_len), sampling)
        write(tokens, known, pos, x)
        done += n
    stats.new_tokens += B * c.seq_len
    return tokens
