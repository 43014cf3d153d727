"""KL tokenizer for continuous-token models: a diffusers `AutoencoderKL` plus MAR's token view.

MAR (Li et al., 2024) works on the latents of a KL-regularised autoencoder, scaled to about unit
variance (their KL-16 uses 0.2325) and cut into a sequence of continuous tokens, one per latent
position. `KLTokenizer` does the same with a small `AutoencoderKL` trained on our data set
(`mmaccel.image.train.train_kl`): images [B, 3, S, S] in [-1, 1] <-> tokens [B, L, C] with
L = (S / 2^(levels-1))^2 and C the latent channels, positions in raster order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from mmaccel.checkpoints import check_layout, read_configured, write_state_dict
from mmaccel.errors import InputError, check

_CONFIG_KEY = "mmaccel_kl_config"


@dataclass(frozen=True)
class KLConfig:
    """Autoencoder size; `scale` multiplies the latents so the tokens have about unit variance."""

    channels: tuple[int, ...] = (16, 32, 64)   # one level per entry, each but the last halves the side
    latent_channels: int = 4
    layers_per_block: int = 1
    norm_groups: int = 8
    image_size: int = 32
    scale: float = 1.0

    def __post_init__(self) -> None:
        check(len(self.channels) >= 1 and all(int(c) > 0 and c % self.norm_groups == 0 for c in self.channels),
              f"every channel count must be a positive multiple of norm_groups={self.norm_groups}, got {self.channels}")
        check(self.image_size % self.downsample == 0, f"image_size {self.image_size} is not a multiple of the "
                                                      f"downsampling factor {self.downsample}")
        check(self.scale > 0, f"scale must be positive, got {self.scale}")

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.channels) - 1)

    @property
    def grid(self) -> int:
        """Latent side: tokens per row and per column."""
        return self.image_size // self.downsample


class KLTokenizer(nn.Module):
    """`AutoencoderKL` (module `vae`) with MAR's scaled-token interface."""

    def __init__(self, config: KLConfig | None = None):
        super().__init__()
        from diffusers import AutoencoderKL

        self.config = config = config or KLConfig()
        levels = len(config.channels)
        self.vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * levels,
                                 up_block_types=("UpDecoderBlock2D",) * levels,
                                 block_out_channels=tuple(config.channels), layers_per_block=config.layers_per_block,
                                 latent_channels=config.latent_channels, norm_num_groups=config.norm_groups,
                                 sample_size=config.image_size)

    @property
    def seq_len(self) -> int:
        return self.config.grid ** 2

    @property
    def token_dim(self) -> int:
        return self.config.latent_channels

    def _check_images(self, images: Tensor) -> None:
        size = self.config.image_size
        check(isinstance(images, Tensor) and images.dim() == 4 and tuple(images.shape[1:]) == (3, size, size),
              f"images must be [B, 3, {size}, {size}] in [-1, 1], got "
              f"{tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__}")

    def posterior(self, images: Tensor):
        """The encoder's diagonal Gaussian over unscaled latents (diffusers `DiagonalGaussianDistribution`)."""
        self._check_images(images)
        return self.vae.encode(images).latent_dist

    def to_tokens(self, latents: Tensor) -> Tensor:
        """Unscaled latents [B, C, h, w] -> scaled tokens [B, h*w, C] (raster order)."""
        return (latents * self.config.scale).flatten(2).transpose(1, 2)

    def encode(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Images [B, 3, S, S] in [-1, 1] -> tokens [B, L, C]: the posterior mean, or a sample of it when a
        `generator` is given (MAR trains on samples)."""
        dist = self.posterior(images)
        latents = dist.mean if generator is None else dist.sample(generator)
        return self.to_tokens(latents)

    def decode(self, tokens: Tensor) -> Tensor:
        """Tokens [B, L, C] -> images [B, 3, S, S] (not clamped)."""
        grid, dim = self.config.grid, self.token_dim
        check(isinstance(tokens, Tensor) and tokens.dim() == 3 and tuple(tokens.shape[1:]) == (grid * grid, dim),
              f"tokens must be [B, {grid * grid}, {dim}], got "
              f"{tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__}")
        latents = tokens.transpose(1, 2).reshape(len(tokens), dim, grid, grid) / self.config.scale
        return self.vae.decode(latents.to(self.vae.dtype)).sample


def save_kl(model: KLTokenizer, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write `model` so `load_kl(path)` restores it (`.safetensors`, the config in the header)."""
    check(Path(path).suffix == ".safetensors", f"a KL tokenizer is saved as .safetensors, got {path}")
    return write_state_dict(model, path, _CONFIG_KEY, asdict(model.config), dtype)


def load_kl(source: str | Path | Mapping, config: KLConfig | None = None) -> KLTokenizer:
    """A `KLTokenizer` in eval mode (fp32) from our `.safetensors` save, or a state dict with `config`."""
    state, stored, name = read_configured(source, _CONFIG_KEY, "KL tokenizer (an mmaccel .safetensors KL autoencoder)")
    if config is None:
        if stored is None:
            raise InputError(f"{name} carries no KL tokenizer config (header key {_CONFIG_KEY!r}); pass config=KLConfig(...)")
        config = KLConfig(**{**stored, "channels": tuple(stored["channels"])})
    model = KLTokenizer(config)
    check_layout(model.state_dict(), state, name, f"KL tokenizer ({config})")
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return model.eval()
