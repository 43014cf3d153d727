"""VQ image tokenizer with the LlamaGen VQ-16 architecture and state-dict layout.

The module tree (`encoder.conv_blocks.{i}.res.{j}.norm1`, `quantize.embedding`, `quant_conv`, ...)
mirrors FoundationVision/LlamaGen `tokenizer/tokenizer_image/vq_model.py`, so an official
`vq_ds16_c2i.pt` (`{"model": state_dict}`) loads with strict key matching. The same code, with a
small `VQConfig`, is the tokenizer of the tiny models this project trains itself.

Images are `[B, 3, H, W]` in [-1, 1]; token grids are `[B, H/16, W/16]` for the VQ-16 config
(`VQConfig.downsample` in general). The codebook is l2-normalised (`codebook_l2_norm=True`): the
quantiser compares normalised latents with normalised codes, i.e. picks the code of largest
cosine similarity (LlamaGen §2.1, following ViT-VQGAN).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.checkpoints import check_layout, read_configured, write_state_dict
from mmaccel.errors import InputError, check

# LlamaGen's quantiser registers a usage ring buffer of this fixed length (`codebook_show_usage=True`);
# it is part of the official state dict, so we keep it for strict loading.
_USAGE_BUFFER_LEN = 65536


@dataclass(frozen=True)
class VQConfig:
    """Tokenizer size. Defaults are the official LlamaGen VQ-16 (`VQ_16`, 16384 x 8 codes, ds 16)."""

    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    codebook_usage_buffer: bool = True  # official `codebook_show_usage`: adds `quantize.codebook_used`
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    z_channels: int = 256
    dropout: float = 0.0
    norm_groups: int = 32  # GroupNorm groups; official uses 32, tiny models need a divisor of `ch`
    in_channels: int = 3

    def __post_init__(self) -> None:
        object.__setattr__(self, "ch_mult", tuple(int(m) for m in self.ch_mult))
        check(self.codebook_size >= 2 and self.codebook_embed_dim >= 1,
              f"codebook must have >= 2 codes of dim >= 1, got {self.codebook_size} x {self.codebook_embed_dim}")
        check(len(self.ch_mult) >= 1 and all(m >= 1 for m in self.ch_mult),
              f"ch_mult must be a non-empty tuple of positive ints, got {self.ch_mult}")
        check(self.ch >= 1 and self.z_channels >= 1 and self.num_res_blocks >= 1,
              f"ch, z_channels and num_res_blocks must be positive, got {self.ch}, {self.z_channels}, {self.num_res_blocks}")
        bad = [self.ch * m for m in self.ch_mult if (self.ch * m) % self.norm_groups]
        check(not bad, f"norm_groups={self.norm_groups} must divide every block width (ch * ch_mult); "
                       f"it does not divide {bad[:3]}; pick a divisor of ch={self.ch}")

    @property
    def downsample(self) -> int:
        """Pixels per token side: each level but the last halves the resolution."""
        return 2 ** (len(self.ch_mult) - 1)


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(groups, channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    """norm-swish-conv twice plus a skip (1x1 `nin_shortcut` when the width changes)."""

    def __init__(self, in_ch: int, out_ch: int, groups: int, dropout: float):
        super().__init__()
        self.norm1 = _norm(in_ch, groups)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.norm2 = _norm(out_ch, groups)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        skip = x if self.nin_shortcut is None else self.nin_shortcut(x)
        return skip + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all pixels, 1x1 convs for q/k/v/proj_out."""

    def __init__(self, ch: int, groups: int):
        super().__init__()
        self.norm = _norm(ch, groups)
        self.q = nn.Conv2d(ch, ch, 1)
        self.k = nn.Conv2d(ch, ch, 1)
        self.v = nn.Conv2d(ch, ch, 1)
        self.proj_out = nn.Conv2d(ch, ch, 1)

    def forward(self, x: Tensor) -> Tensor:
        b, c, hh, ww = x.shape
        h = self.norm(x)
        # [B, C, H, W] -> [B, 1, HW, C]; the default sdpa scale is C^-1/2 as in the original
        q, k, v = (proj(h).flatten(2).transpose(1, 2).unsqueeze(1) for proj in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v).squeeze(1).transpose(1, 2).reshape(b, c, hh, ww)
        return x + self.proj_out(out)


class Downsample(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, stride=2, padding=0)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))  # asymmetric pad, as taming-transformers


class Upsample(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class _Level(nn.Module):
    """One resolution level: `res` blocks, `attn` blocks (lowest resolution only), then a resampler."""

    def __init__(self, res: list[nn.Module], attn: list[nn.Module]):
        super().__init__()
        self.res = nn.ModuleList(res)
        self.attn = nn.ModuleList(attn)

    def forward(self, h: Tensor) -> Tensor:
        for i, block in enumerate(self.res):
            h = block(h)
            if len(self.attn):
                h = self.attn[i](h)
        for name in ("downsample", "upsample"):
            if hasattr(self, name):
                h = getattr(self, name)(h)
        return h


def _mid(ch: int, groups: int, dropout: float) -> nn.ModuleList:
    return nn.ModuleList([ResnetBlock(ch, ch, groups, dropout), AttnBlock(ch, groups), ResnetBlock(ch, ch, groups, dropout)])


class Encoder(nn.Module):
    def __init__(self, cfg: VQConfig):
        super().__init__()
        g, n = cfg.norm_groups, len(cfg.ch_mult)
        self.conv_in = nn.Conv2d(cfg.in_channels, cfg.ch, 3, padding=1)
        self.conv_blocks = nn.ModuleList()
        width = cfg.ch
        for level, mult in enumerate(cfg.ch_mult):
            out = cfg.ch * mult
            res, attn = [], []
            for _ in range(cfg.num_res_blocks):
                res.append(ResnetBlock(width, out, g, cfg.dropout))
                width = out
                if level == n - 1:
                    attn.append(AttnBlock(width, g))
            block = _Level(res, attn)
            if level != n - 1:
                block.downsample = Downsample(width)
            self.conv_blocks.append(block)
        self.mid = _mid(width, g, cfg.dropout)
        self.norm_out = _norm(width, g)
        self.conv_out = nn.Conv2d(width, cfg.z_channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv_in(x)
        for block in self.conv_blocks:
            h = block(h)
        for block in self.mid:
            h = block(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, cfg: VQConfig):
        super().__init__()
        g, n = cfg.norm_groups, len(cfg.ch_mult)
        width = cfg.ch * cfg.ch_mult[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, width, 3, padding=1)
        self.mid = _mid(width, g, cfg.dropout)
        self.conv_blocks = nn.ModuleList()
        for level in reversed(range(n)):  # conv_blocks[0] is the lowest resolution
            out = cfg.ch * cfg.ch_mult[level]
            res, attn = [], []
            for _ in range(cfg.num_res_blocks + 1):
                res.append(ResnetBlock(width, out, g, cfg.dropout))
                width = out
                if level == n - 1:
                    attn.append(AttnBlock(width, g))
            block = _Level(res, attn)
            if level != 0:
                block.upsample = Upsample(width)
            self.conv_blocks.append(block)
        self.norm_out = _norm(width, g)
        self.conv_out = nn.Conv2d(width, cfg.in_channels, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        for block in self.conv_blocks:
            h = block(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    """Nearest-code lookup; holds `embedding` (and the official `codebook_used` buffer)."""

    def __init__(self, cfg: VQConfig):
        super().__init__()
        self.l2_norm = cfg.codebook_l2_norm
        self.embedding = nn.Embedding(cfg.codebook_size, cfg.codebook_embed_dim)
        with torch.no_grad():
            self.embedding.weight.uniform_(-1.0 / cfg.codebook_size, 1.0 / cfg.codebook_size)
            if self.l2_norm:
                self.embedding.weight.copy_(F.normalize(self.embedding.weight, dim=-1))
        if cfg.codebook_usage_buffer:
            self.register_buffer("codebook_used", torch.zeros(_USAGE_BUFFER_LEN))

    @property
    def codebook(self) -> Tensor:
        w = self.embedding.weight
        return F.normalize(w, dim=-1) if self.l2_norm else w

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor]:
        # z: [B, D, h, w] -> zq: [B, D, h, w], indices: [B, h, w]
        d = self.embedding.embedding_dim
        check(isinstance(z, Tensor) and z.dim() == 4 and z.shape[1] == d and z.is_floating_point(),
              f"quantize expects a float latent shaped [B, {d}, h, w], got "
              f"{tuple(z.shape) if isinstance(z, Tensor) else type(z).__name__}")
        b, _, hh, ww = z.shape
        flat = z.permute(0, 2, 3, 1).reshape(-1, d)
        codes = self.codebook
        if self.l2_norm:
            flat = F.normalize(flat, dim=-1)
        # |z - e|^2 = |z|^2 + |e|^2 - 2 z.e ; argmin keeps the first of ties, like the original
        dist = flat.pow(2).sum(1, keepdim=True) + codes.pow(2).sum(1) - 2 * flat @ codes.t()
        indices = dist.argmin(dim=1)
        zq = codes[indices].reshape(b, hh, ww, d).permute(0, 3, 1, 2).contiguous()
        return zq, indices.reshape(b, hh, ww)


class VQModel(nn.Module):
    """LlamaGen-layout VQ tokenizer: `encode` images to code indices, `decode` indices to images."""

    def __init__(self, config: VQConfig | None = None):
        super().__init__()
        self.config = config = config or VQConfig()
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.quantize = VectorQuantizer(config)
        self.quant_conv = nn.Conv2d(config.z_channels, config.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.codebook_embed_dim, config.z_channels, 1)

    @property
    def codebook(self) -> Tensor:
        """The code vectors the quantiser compares against (l2-normalised if configured): [K, D]."""
        return self.quantize.codebook

    @property
    def codebook_size(self) -> int:
        return self.config.codebook_size

    @property
    def downsample(self) -> int:
        return self.config.downsample

    def encode(self, images: Tensor) -> Tensor:
        """images: [B, 3, H, W] float in [-1, 1], H and W multiples of `downsample` -> indices [B, H/ds, W/ds] int64."""
        c, ds = self.config.in_channels, self.downsample
        check(isinstance(images, Tensor), f"encode expects a torch.Tensor of images, got {type(images).__name__}")
        check(images.dim() == 4 and images.shape[1] == c,
              f"encode expects images shaped [B, {c}, H, W], got {tuple(images.shape)}")
        check(images.is_floating_point(),
              f"encode expects float images in [-1, 1], got dtype {images.dtype} (convert uint8 with x / 127.5 - 1)")
        check(images.shape[2] % ds == 0 and images.shape[3] % ds == 0 and images.shape[2] > 0 and images.shape[3] > 0,
              f"image height and width must be positive multiples of {ds}, got {tuple(images.shape[2:])}")
        with torch.no_grad():  # indices are discrete; nothing to differentiate
            z = self.quant_conv(self.encoder(images.to(self.quant_conv.weight.dtype)))
            return self.quantize(z)[1]

    def decode_code_vectors(self, zq: Tensor) -> Tensor:
        """zq: [B, D, h, w] code vectors (a quantised latent) -> images [B, 3, h*ds, w*ds]."""
        d = self.config.codebook_embed_dim
        check(isinstance(zq, Tensor) and zq.dim() == 4 and zq.shape[1] == d and zq.is_floating_point(),
              f"decode_code_vectors expects float code vectors shaped [B, {d}, h, w], got "
              f"{tuple(zq.shape) if isinstance(zq, Tensor) else type(zq).__name__}")
        # contiguous so the result does not depend on the caller's memory layout (conv kernels differ)
        return self.decoder(self.post_quant_conv(zq.contiguous()))

    def lookup(self, indices: Tensor) -> Tensor:
        """indices: [B, h, w] -> code vectors [B, D, h, w], after checking dtype, shape and range."""
        k = self.config.codebook_size
        check(isinstance(indices, Tensor), f"decode expects a torch.Tensor of code indices, got {type(indices).__name__}")
        check(indices.dim() == 3, f"decode expects code indices shaped [B, h, w], got {tuple(indices.shape)} "
                                  "(reshape a flat sequence with .view(B, h, w))")
        check(not indices.is_floating_point() and not indices.is_complex() and indices.dtype != torch.bool,
              f"decode expects integer code indices, got dtype {indices.dtype}")
        if indices.numel():
            lo, hi = int(indices.min()), int(indices.max())
            check(lo >= 0 and hi < k, f"code indices must be in [0, {k - 1}] (codebook size {k}), got range [{lo}, {hi}]")
        return self.codebook[indices.long()].permute(0, 3, 1, 2).contiguous()

    def decode(self, indices: Tensor) -> Tensor:
        """indices: [B, h, w] integer codes -> images [B, 3, h*ds, w*ds] (roughly in [-1, 1])."""
        return self.decode_code_vectors(self.lookup(indices))

    def code_neighbours(self, k: int, chunk: int = 1024) -> Tensor:
        """The `k` nearest other codes of every code by L2 on `codebook` (self excluded): [K, k] int64.

        Nearest first; the latent-proximity sets of LANTERN (Jang et al. 2025, §3.2)."""
        codes = self.codebook.detach().float()
        n = codes.shape[0]
        check(isinstance(k, int) and 1 <= k < n, f"k must be an int in [1, {n - 1}], got {k}")
        out = []
        for start in range(0, n, chunk):  # [chunk, K] distances at a time: 16384^2 floats would be 1 GiB
            d = torch.cdist(codes[start:start + chunk], codes)
            rows = torch.arange(d.shape[0], device=d.device)
            d[rows, rows + start] = math.inf
            out.append(d.topk(k, dim=1, largest=False).indices)
        return torch.cat(out)


# --- loading -------------------------------------------------------------------------------------

def infer_vq_config(state: Mapping[str, Tensor]) -> VQConfig:
    """Read a `VQConfig` off LlamaGen-layout tensor shapes (norm groups: 32 when possible, l2 codebook assumed)."""
    try:
        conv_in = state["encoder.conv_in.weight"]
        ch = conv_in.shape[0]
        levels = sorted({int(m.group(1)) for k in state if (m := re.match(r"encoder\.conv_blocks\.(\d+)\.", k))})
        ch_mult = tuple(state[f"encoder.conv_blocks.{i}.res.0.conv1.weight"].shape[0] // ch for i in levels)
        n_res = len({m.group(1) for k in state if (m := re.match(r"encoder\.conv_blocks\.0\.res\.(\d+)\.", k))})
        k, d = state["quantize.embedding.weight"].shape
        z = state["encoder.conv_out.weight"].shape[0]
    except (KeyError, IndexError, ValueError) as err:
        raise InputError(f"cannot infer the VQ config: tensor {err} is missing or malformed; pass config=VQConfig(...)") from None
    groups = math.gcd(32, *(ch * m for m in ch_mult))
    return VQConfig(codebook_size=k, codebook_embed_dim=d, codebook_usage_buffer="quantize.codebook_used" in state,
                    ch=ch, ch_mult=ch_mult, num_res_blocks=n_res, z_channels=z, norm_groups=groups,
                    in_channels=conv_in.shape[1])


def _config_from_dict(raw: Mapping) -> VQConfig:
    known = {f.name for f in fields(VQConfig)}
    return VQConfig(**{k: v for k, v in raw.items() if k in known})


def load_vq(path_or_state: str | Path | Mapping, config: VQConfig | None = None) -> VQModel:
    """A `VQModel` in eval mode from an official LlamaGen checkpoint, our own save, or a state dict.

    Accepts `.pt`/`.pth` (state dict under "model", "module", "state_dict" or at the top level) and
    `.safetensors`. Keys must match exactly (strict); without `config` the size is read from the
    file's stored config or inferred from tensor shapes."""
    state, stored, source = read_configured(path_or_state, "mmaccel_vq_config", "VQ tokenizer checkpoint (a LlamaGen "
                                            "vq_ds16_c2i.pt or an mmaccel .safetensors tokenizer)")
    if config is None:
        config = _config_from_dict(stored) if stored is not None else infer_vq_config(state)
    model = VQModel(config)
    check_layout(model.state_dict(), state, source, f"LlamaGen VQ ({config})")
    model.load_state_dict(state, strict=True)
    return model.eval()


def save_vq(model: VQModel, path: str | Path) -> Path:
    """Write `model` so `load_vq(path)` restores it: `.safetensors` (config in metadata) or `.pt`
    (`{"model": state_dict, "config": {...}}`, the official layout plus our config)."""
    return write_state_dict(model, path, "mmaccel_vq_config", asdict(model.config))
