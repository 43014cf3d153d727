"""MAR-style continuous-token generator: a masked bidirectional transformer with a per-token diffusion head.

MAR (Li et al., "Autoregressive Image Generation without Vector Quantization", 2024) models an image as
a set of continuous tokens (KL-autoencoder latents, `mmaccel.image.tokenizers.kl`) generated in a random
order, a few tokens per step. Per step the transformer reads the tokens known so far plus a mask embedding
at every unknown position and returns one condition vector z per position; a small MLP (the *diffusion
head*) then samples each token to be revealed from its own DDPM conditioned on z. Training is the
diffusion loss: noise prediction on the masked tokens.

What differs from the official code, and why:
- one transformer over [class buffer, tokens or mask embeddings] instead of MAR's encoder (known
  tokens only) + decoder (all positions); the same function class, half the code, and at 64 tokens the
  saving of skipping masked positions is small;
- the head predicts the velocity v = sqrt(a_t) eps - sqrt(1 - a_t) x0 (diffusers' "v_prediction")
  instead of the noise, and not the variance: on the cosine schedule a_T is about 2e-9, so recovering x0
  from a predicted noise divides its error by sqrt(a_T) (a tiny model's first step then lands hundreds
  of units away; MAR's long training makes its noise predictions precise enough), while
  x0 = sqrt(a_t) x_t - sqrt(1 - a_t) v is stable at every t. A fixed posterior variance also gives two
  heads on one schedule equal per-step variances (what CSpD's density ratio compares);
- sampling ends at diffusion time 0 with a stochastic last step (x_0 given x_{t_1}, variance
  beta~_{t_1} > 0) instead of a deterministic step to the clean latent, so the last step is a proper
  Gaussian whose density the speculative rule can evaluate.

The schedule (`DDPMScheduler`, cosine) is diffusers'; `Diffusion.posterior` computes the DDPM posterior
mean and standard deviation from its `alphas_cumprod`, because diffusers' `step` draws its noise
internally and CSpD must share that noise between two heads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.checkpoints import check_layout, read_configured, write_state_dict
from mmaccel.errors import InputError, check

_CONFIG_KEY = "mmaccel_mar_config"


@dataclass(frozen=True)
class MARConfig:
    seq_len: int = 64            # tokens per image (a square grid)
    token_dim: int = 4           # channels of one continuous token
    num_classes: int = 10        # the class embedding has one more row: the null class of guidance
    width: int = 192
    depth: int = 6
    heads: int = 6
    buffer: int = 4              # class-token buffer in front of the image tokens (MAR: 64)
    head_width: int = 256
    head_depth: int = 3
    train_timesteps: int = 1000
    beta_schedule: str = "squaredcos_cap_v2"   # MAR's cosine schedule

    def __post_init__(self) -> None:
        grid = math.isqrt(self.seq_len)
        check(self.seq_len >= 1 and grid * grid == self.seq_len, f"seq_len must be a square, got {self.seq_len}")
        check(self.width % self.heads == 0, f"width {self.width} is not divisible by heads {self.heads}")
        for name in ("token_dim", "num_classes", "width", "depth", "heads", "buffer", "head_width", "head_depth"):
            check(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def grid(self) -> int:
        return math.isqrt(self.seq_len)


def _modulate(x: Tensor, shift: Tensor, gain: Tensor) -> Tensor:
    """adaLN: x * (1 + scale) + shift, with gain = 1 + scale (precomputed in `DiffusionHead.modulation`)."""
    return torch.addcmul(shift, x, gain)


class _TimeEmbedding(nn.Module):
    """Sinusoidal features of the diffusion timestep -> an MLP (DiT / MAR)."""

    def __init__(self, width: int, freqs: int = 256):
        super().__init__()
        self.freqs = freqs
        self.mlp = nn.Sequential(nn.Linear(freqs, width), nn.SiLU(), nn.Linear(width, width))

    def forward(self, t: Tensor) -> Tensor:
        half = self.freqs // 2
        f = torch.exp(-math.log(10000) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        args = t.float()[:, None] * f[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], -1).to(self.mlp[0].weight.dtype))


class _AdaLNBlock(nn.Module):
    """Residual MLP block modulated by the condition (MAR's `ResBlock`)."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, x: Tensor, shift: Tensor, gain: Tensor, gate: Tensor) -> Tensor:
        # Functional calls on the layers' weights: this runs once per denoising step on a few rows, where
        # nn.Module call overhead costs as much as the matrix products themselves.
        norm, first, second = self.norm, self.mlp[0], self.mlp[2]
        u = _modulate(F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps), shift, gain)
        u = F.linear(F.silu(F.linear(u, first.weight, first.bias)), second.weight, second.bias)
        return torch.addcmul(x, gate, u)


class DiffusionHead(nn.Module):
    """v_theta(x_t, t, z): the per-token denoiser (MAR's `SimpleMLPAdaLN`, velocity output only).

    `forward(x, t, z)` = `denoise(x, modulation(time(t) + cond(z)))`. Most of the head's weights sit on the
    condition side (`time`, `cond`, every `ada`), which does not read x_t: a sampler calls `plan` once for
    all its denoising steps (one batched call a layer) and `step` per step (`masked.sample_head`).
    """

    def __init__(self, token_dim: int, cond_dim: int, width: int, depth: int):
        super().__init__()
        self.time = _TimeEmbedding(width)
        self.cond = nn.Linear(cond_dim, width)
        self.inp = nn.Linear(token_dim, width)
        self.blocks = nn.ModuleList(_AdaLNBlock(width) for _ in range(depth))
        self.final_norm = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))
        self.out = nn.Linear(width, token_dim)
        for block in self.blocks:          # adaLN-zero: every block starts as the identity
            nn.init.zeros_(block.ada[-1].weight)
            nn.init.zeros_(block.ada[-1].bias)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def modulation(self, c: Tensor) -> list[tuple[Tensor, ...]]:
        """(shift, 1 + scale, gate) of every block, then the final (shift, 1 + scale), each shaped like c
        [..., width]."""
        layers = [block.ada(c).chunk(3, -1) for block in self.blocks] + [self.final_ada(c).chunk(2, -1)]
        return [(shift, 1 + scale, *gate) for shift, scale, *gate in layers]

    def denoise(self, x: Tensor, modulation: list[tuple[Tensor, ...]]) -> Tensor:
        """The x_t side of the head: x [N, C] with `modulation` rows [N, width] -> v [N, C]."""
        h = F.linear(x, self.inp.weight, self.inp.bias)
        for block, mod in zip(self.blocks, modulation):
            h = block.forward(h, *mod)
        shift, gain = modulation[-1]
        h = _modulate(F.layer_norm(h, self.final_norm.normalized_shape, eps=self.final_norm.eps), shift, gain)
        return F.linear(h, self.out.weight, self.out.bias)

    def forward(self, x: Tensor, t: Tensor, z: Tensor) -> Tensor:
        return self.denoise(x, self.modulation(self.time(t) + self.cond(z)))

    def plan(self, times: Tensor, z: Tensor) -> list[tuple[Tensor, ...]]:
        """The condition side of a whole chain: denoising times [S] and conditions z [N, W] -> modulations
        [S, N, width]."""
        return self.modulation(self.time(times)[:, None] + self.cond(z)[None])

    def step(self, x: Tensor, plan: list[tuple[Tensor, ...]], i: int) -> Tensor:
        """v at the chain's i-th time: equals forward(x, times[i], z) for the `plan(times, z)`."""
        return self.denoise(x, [tuple(m[i] for m in layer) for layer in plan])


class Diffusion:
    """The DDPM noise schedule of a head (diffusers' `DDPMScheduler`) and its posterior steps."""

    def __init__(self, timesteps: int, beta_schedule: str):
        from diffusers import DDPMScheduler

        self.scheduler = DDPMScheduler(num_train_timesteps=timesteps, beta_schedule=beta_schedule,
                                       clip_sample=False, prediction_type="v_prediction")
        self.alphas_cumprod = self.scheduler.alphas_cumprod.double()
        self._coefficients: dict[tuple[int, int], tuple[float, float, float]] = {}

    @property
    def timesteps(self) -> int:
        return self.scheduler.config.num_train_timesteps

    def add_noise(self, x0: Tensor, noise: Tensor, t: Tensor) -> Tensor:
        return self.scheduler.add_noise(x0, noise, t)

    def velocity(self, x0: Tensor, noise: Tensor, t: Tensor) -> Tensor:
        """The training target v = sqrt(a_t) noise - sqrt(1 - a_t) x0."""
        return self.scheduler.get_velocity(x0, noise, t)

    def sampling_timesteps(self, steps: int) -> list[int]:
        """`steps` + 1 times from T - 1 down to 0, evenly spaced (MAR's respacing): `steps` denoising steps."""
        check(isinstance(steps, int) and 1 <= steps < self.timesteps,
              f"diffusion_steps must be an int in [1, {self.timesteps - 1}], got {steps!r}")
        return torch.linspace(self.timesteps - 1, 0, steps + 1).round().long().tolist()

    def posterior(self, x_t: Tensor, v: Tensor, t: int, t_prev: int) -> tuple[Tensor, float]:
        """Mean and standard deviation of q(x_{t_prev} | x_t, x0_hat(v)) (DDPM, `fixed_small` variance)."""
        a, b, std = self.posterior_coefficients(t, t_prev)
        return torch.add(a * x_t, v, alpha=b), std

    def posterior_coefficients(self, t: int, t_prev: int) -> tuple[float, float, float]:
        """(a, b, std): the posterior mean is a x_t + b v, with x0_hat = sqrt(a_t) x_t - sqrt(1 - a_t) v
        (computed once per step pair of this schedule)."""
        if (t, t_prev) not in self._coefficients:
            self._coefficients[t, t_prev] = self._posterior_coefficients(t, t_prev)
        return self._coefficients[t, t_prev]

    def _posterior_coefficients(self, t: int, t_prev: int) -> tuple[float, float, float]:
        a_t, a_prev = self.alphas_cumprod[t].item(), self.alphas_cumprod[t_prev].item()
        alpha = a_t / a_prev
        on_x0 = math.sqrt(a_prev) * (1 - alpha) / (1 - a_t)
        on_xt = math.sqrt(alpha) * (1 - a_prev) / (1 - a_t)
        return on_x0 * math.sqrt(a_t) + on_xt, -on_x0 * math.sqrt(1 - a_t), math.sqrt((1 - alpha) * (1 - a_prev) / (1 - a_t))


class MAR(nn.Module):
    """Class-conditional masked generator over `seq_len` continuous tokens with a diffusion head."""

    def __init__(self, config: MARConfig | None = None):
        super().__init__()
        self.config = c = config or MARConfig()
        self.class_emb = nn.Embedding(c.num_classes + 1, c.width)
        self.token_proj = nn.Linear(c.token_dim, c.width)
        self.mask_token = nn.Parameter(torch.zeros(c.width))
        self.pos_emb = nn.Parameter(torch.randn(c.buffer + c.seq_len, c.width) * 0.02)
        layer = nn.TransformerEncoderLayer(c.width, c.heads, 4 * c.width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, c.depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(c.width)
        self.head = DiffusionHead(c.token_dim, c.width, c.head_width, c.head_depth)
        self.diffusion = Diffusion(c.train_timesteps, c.beta_schedule)
        nn.init.normal_(self.mask_token, std=0.02)

    @property
    def num_classes(self) -> int:
        return self.config.num_classes

    @property
    def null_class(self) -> int:
        return self.config.num_classes

    def condition(self, tokens: Tensor, known: Tensor, labels: Tensor) -> Tensor:
        """z [B, L, width]: one condition per position, from the known `tokens` [B, L, C] (`known` [B, L]
        bool; unknown positions read the mask embedding) and `labels` [B] (`null_class` = unconditional)."""
        c = self.config
        check(tokens.dim() == 3 and tuple(tokens.shape[1:]) == (c.seq_len, c.token_dim),
              f"tokens must be [B, {c.seq_len}, {c.token_dim}], got {tuple(tokens.shape)}")
        check(tuple(known.shape) == tuple(tokens.shape[:2]) and known.dtype == torch.bool,
              f"known must be a bool [B, {c.seq_len}] mask, got {known.dtype} {tuple(known.shape)}")
        x = torch.where(known[..., None], self.token_proj(tokens.to(self.token_proj.weight.dtype)), self.mask_token)
        buffer = self.class_emb(labels)[:, None].expand(-1, c.buffer, -1)
        h = self.blocks(torch.cat([buffer, x], 1) + self.pos_emb)
        return self.norm(h[:, c.buffer:])

    def loss(self, tokens: Tensor, known: Tensor, labels: Tensor, generator: torch.Generator | None = None,
             repeats: int = 4) -> Tensor:
        """MAR's diffusion loss on the unknown tokens, `repeats` noise draws each (velocity-prediction MSE)."""
        z = self.condition(tokens, known, labels)[~known]          # [N, width]
        x0 = tokens[~known]
        check(len(x0) > 0, "the loss needs at least one unknown token")
        z, x0 = z.repeat(repeats, 1), x0.repeat(repeats, 1)
        t = torch.randint(0, self.diffusion.timesteps, (len(x0),), generator=generator).to(x0.device)
        noise = torch.randn(x0.shape, generator=generator).to(x0.device)
        x_t = self.diffusion.add_noise(x0, noise, t)
        return F.mse_loss(self.head(x_t, t, z), self.diffusion.velocity(x0, noise, t))


def save_mar(model: MAR, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write `model` so `load_mar(path)` restores it (`.safetensors`, the config in the header)."""
    check(Path(path).suffix == ".safetensors", f"a MAR model is saved as .safetensors, got {path}")
    return write_state_dict(model, path, _CONFIG_KEY, asdict(model.config), dtype)


def load_mar(source: str | Path | Mapping, config: MARConfig | None = None, *, dtype: torch.dtype | None = None) -> MAR:
    """A `MAR` in eval mode from our `.safetensors` save (fp16 files are cast to `dtype`, default fp32), or a
    state dict with `config`."""
    state, stored, name = read_configured(source, _CONFIG_KEY, "MAR model (an mmaccel .safetensors continuous-token "
                                                               "generator)")
    if config is None:
        if stored is None:
            raise InputError(f"{name} carries no MAR config (header key {_CONFIG_KEY!r}); pass config=MARConfig(...)")
        config = MARConfig(**stored)
    model = MAR(config)
    check_layout(model.state_dict(), state, name, f"MAR ({config})")
    model.load_state_dict(state, strict=True)
    return model.to(dtype or torch.float32).eval()
