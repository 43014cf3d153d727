"""Multi-scale residual VQ-VAE with the VAR architecture and state-dict layout.

The module tree (`encoder.down.{i}.block.{j}.norm1`, `encoder.mid.attn_1.qkv`,
`quantize.quant_resi.qresi_ls.{k}`, `quantize.ema_vocab_hit_SV`, `quant_conv`, ...) mirrors
FoundationVision/VAR `models/vqvae.py`, `quant.py` and `basic_vae.py`, so the official
`vae_ch160v4096z32.pth` (a raw state dict with its buffer) loads with strict key matching. The same
code with a small `MSVQConfig` is the tokenizer of the tiny next-scale models this project trains.

The multi-scale residual quantizer itself (VAR §3.2, Algorithm 1; `quant.py`) is
`mmaccel.image.tokenizers.msvq_quant`, re-exported here.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.checkpoints import check_layout, read_configured, write_state_dict
from mmaccel.errors import InputError, check
from mmaccel.image.tokenizers.msvq_quant import MultiScaleQuantizer, Phi  # noqa: F401  (Phi: re-exported)
from mmaccel.image.tokenizers.vq import Downsample, ResnetBlock, Upsample, _norm

VAR_PATCH_NUMS = (1, 2, 3, 4, 5, 6, 8, 10, 13, 16)
_CONFIG_KEY = "mmaccel_msvq_config"


def check_patch_nums(patch_nums: Sequence[int], what: str = "scale schedule") -> tuple[int, ...]:
    """A scale schedule as a tuple: at least two sides, each a positive int, strictly increasing."""
    try:
        nums = tuple(int(p) for p in patch_nums)
    except (TypeError, ValueError):
        raise InputError(f"the {what} must be a sequence of ints, got {patch_nums!r}") from None
    check(len(nums) >= 2 and all(isinstance(p, (int, np.integer)) for p in patch_nums),
          f"the {what} needs at least two integer scales, got {tuple(patch_nums)}")
    check(nums[0] >= 1 and all(b > a for a, b in zip(nums, nums[1:])),
          f"the {what} must be positive and strictly increasing, got {nums}")
    return nums


@dataclass(frozen=True)
class MSVQConfig:
    """Tokenizer size. Defaults are the official VAR VQ-VAE (`vae_ch160v4096z32.pth`, downsample 16)."""

    vocab_size: int = 4096
    z_channels: int = 32          # Cvae: the code vector width
    ch: int = 160
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    using_sa: bool = True         # self-attention at the lowest resolution level
    using_mid_sa: bool = True
    quant_conv_ks: int = 3
    quant_resi: float = 0.5       # phi(h) = (1 - r) h + r conv(h)
    share_quant_resi: int = 4     # 0: one phi per scale, 1: one phi for all, K: K phis shared by nearest tick
    patch_nums: tuple[int, ...] = VAR_PATCH_NUMS
    norm_groups: int = 32         # GroupNorm groups; official uses 32, tiny models need a divisor of `ch`
    in_channels: int = 3

    def __post_init__(self) -> None:
        object.__setattr__(self, "ch_mult", tuple(int(m) for m in self.ch_mult))
        object.__setattr__(self, "patch_nums", check_patch_nums(self.patch_nums, "tokenizer's scale schedule"))
        check(self.vocab_size >= 2 and self.z_channels >= 1,
              f"the codebook needs >= 2 codes of width >= 1, got {self.vocab_size} x {self.z_channels}")
        check(len(self.ch_mult) >= 1 and all(m >= 1 for m in self.ch_mult) and self.ch >= 1 and self.num_res_blocks >= 1,
              f"ch, ch_mult and num_res_blocks must be positive, got {self.ch}, {self.ch_mult}, {self.num_res_blocks}")
        check(self.share_quant_resi >= 0, f"share_quant_resi must be >= 0, got {self.share_quant_resi}")
        bad = [self.ch * m for m in self.ch_mult if (self.ch * m) % self.norm_groups]
        check(not bad, f"norm_groups={self.norm_groups} must divide every block width (ch * ch_mult); "
                       f"it does not divide {bad[:3]}")

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)


class AttnBlock(nn.Module):
    """Single-head self-attention over all pixels with one fused 1x1 `qkv` conv (VAR's layout)."""

    def __init__(self, ch: int, groups: int):
        super().__init__()
        self.norm = _norm(ch, groups)
        self.qkv = nn.Conv2d(ch, 3 * ch, 1)
        self.proj_out = nn.Conv2d(ch, ch, 1)

    def forward(self, x: Tensor) -> Tensor:
        b, c, hh, ww = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, hh * ww).transpose(2, 3).unsqueeze(2).unbind(1)
        out = F.scaled_dot_product_attention(q, k, v).squeeze(1).transpose(1, 2).reshape(b, c, hh, ww)
        return x + self.proj_out(out)


def _attn(ch: int, groups: int, enabled: bool) -> nn.Module:
    return AttnBlock(ch, groups) if enabled else nn.Identity()


class _Mid(nn.Module):
    def __init__(self, ch: int, cfg: MSVQConfig):
        super().__init__()
        self.block_1 = ResnetBlock(ch, ch, cfg.norm_groups, 0.0)
        self.attn_1 = _attn(ch, cfg.norm_groups, cfg.using_mid_sa)
        self.block_2 = ResnetBlock(ch, ch, cfg.norm_groups, 0.0)

    def forward(self, h: Tensor) -> Tensor:
        return self.block_2(self.attn_1(self.block_1(h)))


class _Level(nn.Module):
    """One resolution level: `block` resnets, `attn` (lowest resolution only), then a resampler."""

    def __init__(self, block: list[nn.Module], attn: list[nn.Module], resample: nn.Module | None, name: str):
        super().__init__()
        self.block, self.attn = nn.ModuleList(block), nn.ModuleList(attn)
        if resample is not None:
            setattr(self, name, resample)
        self._resample = name

    def forward(self, h: Tensor) -> Tensor:
        for i, block in enumerate(self.block):
            h = block(h)
            if len(self.attn):
                h = self.attn[i](h)
        return getattr(self, self._resample)(h) if hasattr(self, self._resample) else h


class Encoder(nn.Module):
    def __init__(self, cfg: MSVQConfig):
        super().__init__()
        g, n = cfg.norm_groups, len(cfg.ch_mult)
        self.conv_in = nn.Conv2d(cfg.in_channels, cfg.ch, 3, padding=1)
        self.down = nn.ModuleList()
        block_in = cfg.ch
        for i, mult in enumerate(cfg.ch_mult):
            out = cfg.ch * mult
            blocks = [ResnetBlock(block_in if j == 0 else out, out, g, 0.0) for j in range(cfg.num_res_blocks)]
            attn = [AttnBlock(out, g) for _ in blocks] if i == n - 1 and cfg.using_sa else []
            self.down.append(_Level(blocks, attn, Downsample(out) if i != n - 1 else None, "downsample"))
            block_in = out
        self.mid = _Mid(block_in, cfg)
        self.norm_out = _norm(block_in, g)
        self.conv_out = nn.Conv2d(block_in, cfg.z_channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv_in(x)
        for level in self.down:
            h = level(h)
        return self.conv_out(F.silu(self.norm_out(self.mid(h))))


class Decoder(nn.Module):
    def __init__(self, cfg: MSVQConfig):
        super().__init__()
        g, n = cfg.norm_groups, len(cfg.ch_mult)
        block_in = cfg.ch * cfg.ch_mult[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, block_in, 3, padding=1)
        self.mid = _Mid(block_in, cfg)
        levels: list[_Level] = []
        for i in reversed(range(n)):
            out = cfg.ch * cfg.ch_mult[i]
            blocks = [ResnetBlock(block_in if j == 0 else out, out, g, 0.0) for j in range(cfg.num_res_blocks + 1)]
            attn = [AttnBlock(out, g) for _ in blocks] if i == n - 1 and cfg.using_sa else []
            levels.insert(0, _Level(blocks, attn, Upsample(out) if i != 0 else None, "upsample"))
            block_in = out
        self.up = nn.ModuleList(levels)
        self.norm_out = _norm(block_in, g)
        self.conv_out = nn.Conv2d(block_in, cfg.in_channels, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            h = level(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class MSVQModel(nn.Module):
    """VAR's VQ-VAE: `encoder` -> `quant_conv` -> multi-scale `quantize` -> `post_quant_conv` -> `decoder`."""

    def __init__(self, config: MSVQConfig | None = None):
        super().__init__()
        self.config = cfg = config or MSVQConfig()
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.quantize = MultiScaleQuantizer(cfg)
        pad = cfg.quant_conv_ks // 2
        self.quant_conv = nn.Conv2d(cfg.z_channels, cfg.z_channels, cfg.quant_conv_ks, padding=pad)
        self.post_quant_conv = nn.Conv2d(cfg.z_channels, cfg.z_channels, cfg.quant_conv_ks, padding=pad)

    @property
    def patch_nums(self) -> tuple[int, ...]:
        return self.config.patch_nums

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def _check_images(self, images: Tensor) -> None:
        check(isinstance(images, Tensor) and images.dim() == 4 and images.shape[1] == self.config.in_channels,
              f"images must be [B, {self.config.in_channels}, H, W], got "
              f"{tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__}")
        side = self.patch_nums[-1] * self.config.downsample
        check(images.shape[-2:] == (side, side), f"this tokenizer takes {side}x{side} images (last scale "
              f"{self.patch_nums[-1]} x downsample {self.config.downsample}), got {tuple(images.shape[-2:])}")

    @torch.no_grad()
    def encode(self, images: Tensor) -> list[Tensor]:
        """Images [B, 3, H, W] in [-1, 1] -> per-scale code indices, coarse to fine, each [B, pn*pn]."""
        self._check_images(images)
        return self.quantize.quantize(self.quant_conv(self.encoder(images)))[0]

    def decode_f_hat(self, f_hat: Tensor) -> Tensor:
        """f_hat [B, C, h, w] -> images [B, 3, H, W], clamped to [-1, 1]."""
        return self.decoder(self.post_quant_conv(f_hat)).clamp(-1, 1)

    @torch.no_grad()
    def decode(self, indices: Sequence[Tensor]) -> Tensor:
        """Per-scale indices (as `encode` returns) -> images [B, 3, H, W] in [-1, 1]."""
        check(len(indices) == len(self.patch_nums), f"expected {len(self.patch_nums)} scales of indices, got {len(indices)}")
        for pn, idx in zip(self.patch_nums, indices):
            check(idx.dim() == 2 and idx.shape[1] == pn * pn, f"scale {pn} needs indices [B, {pn * pn}], got {tuple(idx.shape)}")
            check(int(idx.min()) >= 0 and int(idx.max()) < self.vocab_size, f"code indices must be in [0, {self.vocab_size})")
        return self.decode_f_hat(self.quantize.f_hat(indices))

    def training_forward(self, images: Tensor, beta: float = 0.25) -> tuple[Tensor, Tensor, list[Tensor]]:
        """(reconstruction, VAR's VQ loss, indices): the loss sums, per scale, |sg[f_hat] - f|^2 * beta
        (commitment) + |f_hat - sg[f]|^2 (codebook and phi) and averages over scales; the decoder gets
        f through the straight-through estimator."""
        f = self.quant_conv(self.encoder(images))
        indices, _ = self.quantize.quantize(f.detach())
        B, C, side = f.shape[0], f.shape[1], f.shape[-1]
        f_hat = torch.zeros_like(f)
        loss = f.new_zeros(())
        for si, (pn, idx) in enumerate(zip(self.patch_nums, indices)):
            codes = self.quantize.embedding(idx).transpose(1, 2).reshape(B, C, pn, pn)
            f_hat = f_hat + self.quantize.upsampled(si, codes, side)
            loss = loss + beta * F.mse_loss(f_hat.detach(), f) + F.mse_loss(f_hat, f.detach())
        loss = loss / len(self.patch_nums)
        f_st = f + (f_hat - f).detach()
        return self.decoder(self.post_quant_conv(f_st)), loss, indices


# --- loading -------------------------------------------------------------------------------------

def infer_msvq_config(state: Mapping[str, Tensor], patch_nums: Sequence[int] | None = None) -> MSVQConfig:
    """Read an `MSVQConfig` off VAR-layout tensor shapes (GroupNorm groups: 32 where they divide)."""
    try:
        ch, in_channels = state["encoder.conv_in.weight"].shape[:2]
        levels = sorted({int(m.group(1)) for k in state if (m := re.match(r"encoder\.down\.(\d+)\.", k))})
        ch_mult = tuple(state[f"encoder.down.{i}.block.0.conv1.weight"].shape[0] // ch for i in levels)
        n_res = len({m.group(1) for k in state if (m := re.match(r"encoder\.down\.0\.block\.(\d+)\.", k))})
        vocab, cvae = state["quantize.embedding.weight"].shape
        n_scales = state["quantize.ema_vocab_hit_SV"].shape[0]
        ks = state["quant_conv.weight"].shape[-1]
    except (KeyError, IndexError, ValueError) as err:
        raise InputError(f"cannot infer the VAR VQ-VAE config: tensor {err} is missing or malformed "
                         "(expected VAR's vqvae layout: encoder.down.*, quantize.embedding, quantize.ema_vocab_hit_SV)") from None
    if any(k.startswith("quantize.quant_resi.qresi_ls.") for k in state):
        share = len({k.split(".")[3] for k in state if k.startswith("quantize.quant_resi.qresi_ls.")})
    elif any(k.startswith("quantize.quant_resi.qresi.") for k in state):
        share = 1
    else:
        share = 0
    nums = check_patch_nums(patch_nums if patch_nums is not None else VAR_PATCH_NUMS)
    check(len(nums) == n_scales, f"the checkpoint's usage buffer has {n_scales} scales but the schedule {nums} has "
                                 f"{len(nums)}; pass patch_nums= with {n_scales} scales")
    groups = math.gcd(32, *(ch * m for m in ch_mult))
    return MSVQConfig(vocab_size=vocab, z_channels=cvae, ch=ch, ch_mult=ch_mult, num_res_blocks=n_res,
                      using_sa=any(k.startswith(f"encoder.down.{levels[-1]}.attn.") for k in state),
                      using_mid_sa="encoder.mid.attn_1.qkv.weight" in state, quant_conv_ks=ks,
                      share_quant_resi=share, patch_nums=nums, norm_groups=groups, in_channels=in_channels)


def _config_from_dict(raw: Mapping) -> MSVQConfig:
    known = {f.name for f in fields(MSVQConfig)}
    return MSVQConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known})


def load_msvq(path_or_state: str | Path | Mapping, config: MSVQConfig | None = None, *,
              patch_nums: Sequence[int] | None = None) -> MSVQModel:
    """An `MSVQModel` in eval mode from an official `vae_ch160v4096z32.pth`, our own save, or a state dict.

    Keys must match exactly (strict, buffers included); without `config` the size comes from the
    file's stored config or is inferred from tensor shapes (`patch_nums`: the schedule, default VAR's)."""
    state, stored, source = read_configured(path_or_state, _CONFIG_KEY, "VAR VQ-VAE checkpoint (vae_ch160v4096z32.pth "
                                            "or an mmaccel .safetensors multi-scale tokenizer)")
    if config is None:
        if stored is not None:
            config = _config_from_dict({**stored, **({"patch_nums": patch_nums} if patch_nums is not None else {})})
        else:
            config = infer_msvq_config(state, patch_nums)
    model = MSVQModel(config)
    check_layout(model.state_dict(), state, source, f"VAR VQ-VAE ({config})")
    model.load_state_dict(state, strict=True)
    return model.eval()


def save_msvq(model: MSVQModel, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write `model` so `load_msvq(path)` restores it: `.safetensors` (config in metadata) or `.pth`, the
    official raw state dict, which carries no config: refused (`InputError`) unless `infer_msvq_config`
    reads the exact config off the tensors (not for GroupNorm groups other than gcd(32, widths), a
    schedule other than VAR's, or `quant_resi` other than 0.5)."""
    return write_state_dict(model, path, _CONFIG_KEY, asdict(model.config), dtype, infer=infer_msvq_config)
