"""VAR's multi-scale residual quantizer (`VectorQuantizer2` of FoundationVision/VAR `models/quant.py`).

Tokenising (VAR §3.2, Algorithm 1): the latent f [B, Cvae, h, w] is quantised scale by scale,
coarse to fine. At scale k the residual is area-downsampled to pn_k x pn_k, each vector takes its
nearest code (L2), the code map is bicubic-upsampled back to h x w, passed through a shared 3x3
convolution phi (`quant_resi`, partially shared over the scales) and subtracted from the residual.
The sum of those terms, `f_hat`, is what the decoder sees. A next-scale model's input for scale k+1
is `f_hat` after k+1 scales, area-downsampled to pn_{k+1} (`scale_inputs`, `next_input`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.errors import check

if TYPE_CHECKING:
    from mmaccel.image.tokenizers.msvq import MSVQConfig


class Phi(nn.Conv2d):
    """phi(h) = (1 - r) h + r conv3x3(h): the residual refiner applied to each upsampled code map."""

    def __init__(self, dim: int, ratio: float):
        super().__init__(dim, dim, 3, padding=1)
        self.ratio = abs(ratio)

    def forward(self, h: Tensor) -> Tensor:
        return h * (1 - self.ratio) + super().forward(h) * self.ratio


def _phi_ticks(k: int) -> np.ndarray:
    return np.linspace(1 / 3 / k, 1 - 1 / 3 / k, k) if k == 4 else np.linspace(1 / 2 / k, 1 - 1 / 2 / k, k)


class _PhiShared(nn.Module):
    def __init__(self, phi: nn.Module):
        super().__init__()
        self.qresi = phi

    def pick(self, at: float) -> nn.Module:
        return self.qresi


class _PhiPartiallyShared(nn.Module):
    def __init__(self, phis: list[nn.Module]):
        super().__init__()
        self.qresi_ls = nn.ModuleList(phis)
        self.ticks = _phi_ticks(len(phis))

    def pick(self, at: float) -> nn.Module:
        return self.qresi_ls[int(np.argmin(np.abs(self.ticks - at)))]


class _PhiNonShared(nn.ModuleList):
    def __init__(self, phis: list[nn.Module]):
        super().__init__(phis)
        self.ticks = _phi_ticks(len(phis))

    def pick(self, at: float) -> nn.Module:
        return self[int(np.argmin(np.abs(self.ticks - at)))]


class MultiScaleQuantizer(nn.Module):
    """VAR's `VectorQuantizer2`: the codebook, the phi convolutions and the per-scale usage buffer."""

    def __init__(self, cfg: MSVQConfig):
        super().__init__()
        self.patch_nums = cfg.patch_nums
        self.vocab_size, self.dim = cfg.vocab_size, cfg.z_channels

        def phi() -> nn.Module:
            return Phi(cfg.z_channels, cfg.quant_resi) if abs(cfg.quant_resi) > 1e-6 else nn.Identity()

        if cfg.share_quant_resi == 0:
            self.quant_resi = _PhiNonShared([phi() for _ in cfg.patch_nums])
        elif cfg.share_quant_resi == 1:
            self.quant_resi = _PhiShared(phi())
        else:
            self.quant_resi = _PhiPartiallyShared([phi() for _ in range(cfg.share_quant_resi)])
        self.register_buffer("ema_vocab_hit_SV", torch.zeros(len(cfg.patch_nums), cfg.vocab_size))
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.z_channels)

    def phi(self, si: int, n_scales: int) -> nn.Module:
        return self.quant_resi.pick(si / (n_scales - 1))

    def nearest(self, z: Tensor) -> Tensor:
        """Code index of each row of z [N, C] (L2 nearest)."""
        w = self.embedding.weight
        d = z.pow(2).sum(1, keepdim=True) + w.pow(2).sum(1) - 2 * z @ w.T
        return d.argmin(1)

    def upsampled(self, si: int, codes: Tensor, side: int) -> Tensor:
        """phi_k(upsample(code map)) [B, C, side, side] for scale `si`'s code vectors [B, C, pn, pn]."""
        if codes.shape[-1] != side:
            codes = F.interpolate(codes, size=(side, side), mode="bicubic")
        return self.phi(si, len(self.patch_nums))(codes)

    def quantize(self, f: Tensor) -> tuple[list[Tensor], Tensor]:
        """Residual multi-scale quantisation of f [B, C, h, w] -> (indices per scale [B, pn*pn], f_hat)."""
        B, C, H, W = f.shape
        check(self.patch_nums[-1] == H == W, f"the last scale {self.patch_nums[-1]} must equal the latent grid "
                                             f"{H}x{W} (image side / downsample)")
        rest, f_hat, out = f.detach().clone(), torch.zeros_like(f), []
        for si, pn in enumerate(self.patch_nums):
            z = F.interpolate(rest, size=(pn, pn), mode="area") if pn != H else rest
            idx = self.nearest(z.permute(0, 2, 3, 1).reshape(-1, C))
            h = self.upsampled(si, self.embedding(idx).view(B, pn, pn, C).permute(0, 3, 1, 2), H)
            f_hat = f_hat + h
            rest = rest - h.detach()
            out.append(idx.view(B, pn * pn))
        return out, f_hat

    def f_hat(self, indices: Sequence[Tensor]) -> Tensor:
        """f_hat [B, C, h, w] of a full list of per-scale indices."""
        B, side = indices[0].shape[0], self.patch_nums[-1]
        f_hat = self.embedding.weight.new_zeros(B, self.dim, side, side)
        for si, (pn, idx) in enumerate(zip(self.patch_nums, indices)):
            f_hat = f_hat + self.upsampled(si, self.embedding(idx).transpose(1, 2).reshape(B, self.dim, pn, pn), side)
        return f_hat

    def scale_inputs(self, indices: Sequence[Tensor]) -> Tensor:
        """Teacher-forcing inputs of a next-scale model [B, L - pn_0^2, C]: for each scale k >= 1, f_hat
        after scales 0..k-1 area-downsampled to pn_k (VAR's `idxBl_to_var_input`)."""
        B, side = indices[0].shape[0], self.patch_nums[-1]
        f_hat = self.embedding.weight.new_zeros(B, self.dim, side, side)
        out = []
        for si in range(len(self.patch_nums) - 1):
            pn = self.patch_nums[si]
            f_hat = f_hat + self.upsampled(si, self.embedding(indices[si]).transpose(1, 2).reshape(B, self.dim, pn, pn), side)
            nxt = self.patch_nums[si + 1]
            out.append(F.interpolate(f_hat, size=(nxt, nxt), mode="area").flatten(2).transpose(1, 2))
        return torch.cat(out, dim=1)

    def next_input(self, si: int, f_hat: Tensor, codes: Tensor) -> tuple[Tensor, Tensor | None]:
        """Add scale `si`'s code vectors [B, C, pn, pn] to f_hat; returns (f_hat, next scale's input
        [B, pn_{si+1}^2, C], None after the last scale). `f_hat` is not modified in place."""
        f_hat = f_hat + self.upsampled(si, codes, f_hat.shape[-1])
        if si == len(self.patch_nums) - 1:
            return f_hat, None
        nxt = self.patch_nums[si + 1]
        return f_hat, F.interpolate(f_hat, size=(nxt, nxt), mode="area").flatten(2).transpose(1, 2)
