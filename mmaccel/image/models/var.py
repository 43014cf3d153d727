"""VAR: class-conditional next-scale prediction with the official state-dict layout.

The module tree (`class_emb`, `pos_start`, `pos_1LC`, `lvl_embed`, `blocks.{i}.attn.mat_qkv`,
`blocks.{i}.attn.scale_mul_1H11`, `blocks.{i}.ada_lin.1`, `head_nm.ada_lin.1`, `head`, buffers
`lvl_1L`, `attn_bias_for_masking`, `blocks.{i}.attn.zero_k_bias`) mirrors FoundationVision/VAR
`models/var.py` and `basic_var.py`, so `var_d{16,20,24,30}.pth` (raw state dicts) load with strict key
matching. Official sizes: width 64 * depth, heads = depth (`var_config(depth)`).

A sequence is the token pyramid of `patch_nums` scales, L = sum pn^2 tokens: block 0 is the class
("start") token, block k >= 1 is `word_embed` of the next-scale input (f_hat after scales 0..k-1,
area-downsampled to pn_k, `MultiScaleQuantizer.next_input`). Training attends block-causally
(`attn_bias_for_masking`); inference feeds one block per forward pass into a preallocated KV cache
(`VARCache`), so K scales cost K passes. `forward_blocks` also takes several blocks at once with the
block-causal mask: that is the one-pass prefill CoDe's refiner runs on the drafter's scales.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.checkpoints import check_layout, read_checkpoint, unwrap_state_dict, write_state_dict
from mmaccel.errors import InputError, check
from mmaccel.image.tokenizers.msvq import VAR_PATCH_NUMS, check_patch_nums


@dataclass(frozen=True)
class VARConfig:
    """Model size. Defaults are the official VAR-d16 (width 1024, 16 heads, ImageNet's 1000 classes)."""

    vocab_size: int = 4096
    z_channels: int = 32          # Cvae of the tokenizer whose code vectors are the inputs
    num_classes: int = 1000
    depth: int = 16
    embed_dim: int = 1024
    num_heads: int = 16
    mlp_ratio: float = 4.0
    norm_eps: float = 1e-6
    shared_aln: bool = False
    attn_l2_norm: bool = True
    patch_nums: tuple[int, ...] = VAR_PATCH_NUMS
    cond_drop_rate: float = 0.1   # label dropout in training (the null class for CFG)

    def __post_init__(self) -> None:
        object.__setattr__(self, "patch_nums", check_patch_nums(self.patch_nums, "VAR scale schedule"))
        check(self.depth >= 1 and self.num_heads >= 1 and self.embed_dim % self.num_heads == 0,
              f"embed_dim ({self.embed_dim}) must be a multiple of num_heads ({self.num_heads}), depth >= 1")
        check(self.vocab_size >= 2 and self.num_classes >= 1 and self.z_channels >= 1,
              f"vocab_size, num_classes and z_channels must be positive, got {self.vocab_size}, "
              f"{self.num_classes}, {self.z_channels}")

    @property
    def seq_len(self) -> int:
        return sum(p * p for p in self.patch_nums)

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads


def var_config(depth: int, **overrides: Any) -> VARConfig:
    """The official VAR size of `depth` (width 64 * depth, `depth` heads), with field overrides."""
    check(isinstance(depth, int) and depth >= 1, f"depth must be a positive int, got {depth!r}")
    return VARConfig(**{"depth": depth, "embed_dim": 64 * depth, "num_heads": depth, **overrides})


def block_offsets(patch_nums: Sequence[int]) -> list[int]:
    """Cumulative token counts [0, pn_0^2, pn_0^2 + pn_1^2, ..., L]: block k spans offsets[k]:offsets[k+1]."""
    out = [0]
    for p in patch_nums:
        out.append(out[-1] + p * p)
    return out


class VARCache:
    """Preallocated keys/values of every block, [rows, heads, capacity, head_dim], and a fill pointer."""

    def __init__(self, config: VARConfig, rows: int, capacity: int, device, dtype):
        shape = (config.depth, rows, config.num_heads, capacity, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class SelfAttention(nn.Module):
    def __init__(self, c: VARConfig):
        super().__init__()
        self.num_heads, self.head_dim, self.l2_norm = c.num_heads, c.head_dim, c.attn_l2_norm
        if self.l2_norm:
            self.scale = 1.0
            self.scale_mul_1H11 = nn.Parameter(torch.full((1, c.num_heads, 1, 1), 4.0).log())
            self.max_scale_mul = math.log(100)
        else:
            self.scale = 0.25 / math.sqrt(self.head_dim)
        self.mat_qkv = nn.Linear(c.embed_dim, 3 * c.embed_dim, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(c.embed_dim))
        self.v_bias = nn.Parameter(torch.zeros(c.embed_dim))
        self.register_buffer("zero_k_bias", torch.zeros(c.embed_dim))
        self.proj = nn.Linear(c.embed_dim, c.embed_dim)

    def forward(self, x: Tensor, attn_bias: Tensor | None, cache: tuple[Tensor, Tensor, int] | None) -> Tensor:
        B, n, C = x.shape
        bias = torch.cat((self.q_bias, self.zero_k_bias, self.v_bias))
        q, k, v = F.linear(x, self.mat_qkv.weight, bias).view(B, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.l2_norm:
            q = F.normalize(q, dim=-1) * self.scale_mul_1H11.clamp_max(self.max_scale_mul).exp()
            k = F.normalize(k, dim=-1)
        if cache is not None:
            k_buf, v_buf, start = cache
            k_buf[:, :, start:start + n] = k
            v_buf[:, :, start:start + n] = v
            k, v = k_buf[:, :, :start + n], v_buf[:, :, :start + n]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, scale=self.scale)
        return self.proj(out.transpose(1, 2).reshape(B, n, C))


class FFN(nn.Module):
    def __init__(self, c: VARConfig):
        super().__init__()
        hidden = round(c.embed_dim * c.mlp_ratio)
        self.fc1 = nn.Linear(c.embed_dim, hidden)
        self.fc2 = nn.Linear(hidden, c.embed_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class AdaLNSelfAttn(nn.Module):
    """Pre-norm block with adaptive LayerNorm: the class condition gives per-block scale, shift and gate."""

    def __init__(self, c: VARConfig):
        super().__init__()
        self.C, self.shared_aln, self.eps = c.embed_dim, c.shared_aln, c.norm_eps
        self.attn = SelfAttention(c)
        self.ffn = FFN(c)
        if c.shared_aln:
            self.ada_gss = nn.Parameter(torch.randn(1, 1, 6, c.embed_dim) / c.embed_dim ** 0.5)
        else:
            self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(c.embed_dim, 6 * c.embed_dim))

    def forward(self, x: Tensor, cond: Tensor, attn_bias: Tensor | None, cache=None) -> Tensor:
        ada = self.ada_gss + cond if self.shared_aln else self.ada_lin(cond).view(-1, 1, 6, self.C)
        gamma1, gamma2, scale1, scale2, shift1, shift2 = ada.unbind(2)
        ln = F.layer_norm(x, (self.C,), eps=self.eps)
        x = x + self.attn(ln * (scale1 + 1) + shift1, attn_bias, cache) * gamma1
        ln = F.layer_norm(x, (self.C,), eps=self.eps)
        return x + self.ffn(ln * (scale2 + 1) + shift2) * gamma2


class AdaLNBeforeHead(nn.Module):
    def __init__(self, c: VARConfig):
        super().__init__()
        self.C, self.eps = c.embed_dim, c.norm_eps
        self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(c.embed_dim, 2 * c.embed_dim))

    def forward(self, x: Tensor, cond: Tensor) -> Tensor:
        scale, shift = self.ada_lin(cond).view(-1, 1, 2, self.C).unbind(2)
        return F.layer_norm(x, (self.C,), eps=self.eps) * (scale + 1) + shift


class _SharedAdaLin(nn.Linear):
    def forward(self, cond: Tensor) -> Tensor:
        return super().forward(cond).view(-1, 1, 6, self.weight.shape[0] // 6)


class VAR(nn.Module):
    """The next-scale transformer. `forward(labels, inputs)` is the teacher-forced training pass;
    `forward_blocks` runs scale blocks against a `VARCache` for generation."""

    def __init__(self, config: VARConfig | None = None):
        super().__init__()
        self.config = c = config or VARConfig()
        self.patch_nums = c.patch_nums
        self.offsets = block_offsets(c.patch_nums)
        L, C, first = c.seq_len, c.embed_dim, c.patch_nums[0] ** 2
        std = math.sqrt(1 / C / 3)
        self.word_embed = nn.Linear(c.z_channels, C)
        self.class_emb = nn.Embedding(c.num_classes + 1, C)
        self.pos_start = nn.Parameter(torch.empty(1, first, C))
        self.pos_1LC = nn.Parameter(torch.empty(1, L, C))
        self.lvl_embed = nn.Embedding(len(c.patch_nums), C)
        for t in (self.class_emb.weight, self.pos_start, self.pos_1LC, self.lvl_embed.weight):
            nn.init.trunc_normal_(t.data, std=std)
        self.shared_ada_lin = nn.Sequential(nn.SiLU(), _SharedAdaLin(C, 6 * C)) if c.shared_aln else nn.Identity()
        self.blocks = nn.ModuleList(AdaLNSelfAttn(c) for _ in range(c.depth))
        level = torch.cat([torch.full((p * p,), i) for i, p in enumerate(c.patch_nums)]).view(1, L, 1)
        self.register_buffer("lvl_1L", level.transpose(1, 2)[:, 0].contiguous())
        self.register_buffer("attn_bias_for_masking",
                             torch.where(level >= level.transpose(1, 2), 0.0, -torch.inf).reshape(1, 1, L, L).contiguous())
        self.head_nm = AdaLNBeforeHead(c)
        self.head = nn.Linear(C, c.vocab_size)

    @property
    def num_classes(self) -> int:
        return self.config.num_classes

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def init_weights(self, init_adaln: float = 0.5, init_adaln_gamma: float = 1e-5, init_head: float = 0.02) -> None:
        """VAR's initialisation (`VAR.init_weights` with init_std automatic): truncated normal
        sqrt(1/3C) for linears and embeddings, small head and AdaLN gates, depth-scaled output projections."""
        std = math.sqrt(1 / self.config.embed_dim / 3)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.trunc_normal_(m.weight.data, std=std)
                if getattr(m, "bias", None) is not None:
                    m.bias.data.zero_()
        self.head.weight.data.mul_(init_head)
        self.head_nm.ada_lin[-1].weight.data.mul_(init_adaln)
        C, depth = self.config.embed_dim, self.config.depth
        for block in self.blocks:
            block.attn.proj.weight.data.div_(math.sqrt(2 * depth))
            block.ffn.fc2.weight.data.div_(math.sqrt(2 * depth))
            if not self.config.shared_aln:
                block.ada_lin[-1].weight.data[2 * C:].mul_(init_adaln)
                block.ada_lin[-1].weight.data[:2 * C].mul_(init_adaln_gamma)

    def _logits(self, h: Tensor, cond: Tensor) -> Tensor:
        return self.head(self.head_nm(h, cond)).float()

    def forward(self, labels: Tensor, inputs: Tensor) -> Tensor:
        """Teacher forcing: labels [B] (`num_classes` = the null class), inputs [B, L - pn_0^2, Cvae]
        (`MultiScaleQuantizer.scale_inputs`) -> logits [B, L, V] for every scale. Label dropout is the
        caller's (the trainer replaces labels with the null class)."""
        B = labels.shape[0]
        cond = self.class_emb(labels)
        first = self.patch_nums[0] ** 2
        sos = cond.unsqueeze(1).expand(B, first, -1) + self.pos_start.expand(B, first, -1)
        x = torch.cat((sos, self.word_embed(inputs.to(self.word_embed.weight.dtype))), dim=1)
        x = x + self.lvl_embed(self.lvl_1L.expand(B, -1)) + self.pos_1LC
        ada = self.shared_ada_lin(cond)
        bias = self.attn_bias_for_masking.to(x.dtype)
        for block in self.blocks:
            x = block(x, ada, bias)
        return self._logits(x, cond)

    # --- generation ------------------------------------------------------------------------------

    def new_cache(self, rows: int, scales: int) -> VARCache:
        """A cache for the first `scales` blocks of `rows` sequences (CFG doubles the rows)."""
        p = self.class_emb.weight
        return VARCache(self.config, rows, self.offsets[scales], p.device, p.dtype)

    def embed_blocks(self, cond: Tensor, inputs: Tensor | None, first: int, last: int) -> Tensor:
        """Input embeddings of blocks first..last-1: block 0 from the class embedding `cond` [R, C], the
        others from `inputs` [R, n, Cvae] (the next-scale inputs of those blocks, concatenated)."""
        R = cond.shape[0]
        start, stop = self.offsets[first], self.offsets[last]
        parts = []
        if first == 0:
            n0 = self.patch_nums[0] ** 2
            parts.append(cond.unsqueeze(1).expand(R, n0, -1) + self.pos_start.expand(R, n0, -1))
        if inputs is not None:
            parts.append(self.word_embed(inputs.to(self.word_embed.weight.dtype)))
        x = torch.cat(parts, dim=1)
        check(x.shape[1] == stop - start, f"blocks {first}..{last - 1} need {stop - start} input tokens, got {x.shape[1]}")
        return x + self.lvl_embed(self.lvl_1L[:, start:stop]) + self.pos_1LC[:, start:stop]

    def forward_blocks(self, x: Tensor, cond: Tensor, cache: VARCache, first: int, last: int) -> Tensor:
        """Run embedded blocks first..last-1 (x [R, n, C]) against `cache`, which must hold exactly the
        blocks before `first`; returns the logits [R, pn_{last-1}^2, V] of the last block. Several
        blocks at once attend block-causally (the refiner's prefill)."""
        start, stop = self.offsets[first], self.offsets[last]
        check(cache.length == start, f"the cache holds {cache.length} tokens but block {first} starts at {start}")
        check(stop <= cache.capacity, f"the cache holds at most {cache.capacity} tokens; blocks up to {last - 1} need {stop}")
        bias = None if last - first == 1 else self.attn_bias_for_masking[:, :, start:stop, :stop].to(x.dtype)
        ada = self.shared_ada_lin(cond)
        for i, block in enumerate(self.blocks):
            x = block(x, ada, bias, (cache.k[i], cache.v[i], start))
        cache.length = stop
        n_last = self.patch_nums[last - 1] ** 2
        return self._logits(x[:, -n_last:], cond)


# --- loading -------------------------------------------------------------------------------------

_DEPTH_IN_NAME = re.compile(r"var_d(\d+)")


def _depth_from_name(name: str | None) -> int | None:
    m = _DEPTH_IN_NAME.search(Path(name).name) if name else None
    return int(m.group(1)) if m else None


def infer_var_config(state: Mapping[str, Tensor], *, name: str | None = None, num_heads: int | None = None,
                     **overrides: Any) -> VARConfig:
    """A `VARConfig` from VAR-layout tensor shapes. Depth, width, classes, vocabulary, Cvae and the scale
    schedule (from the `lvl_1L` buffer) are read off the tensors; the head count from
    `scale_mul_1H11` (attn_l2_norm), else from `num_heads`, else from a `var_d{N}` file name (N heads)."""
    try:
        C = state["class_emb.weight"].shape[1]
        num_classes = state["class_emb.weight"].shape[0] - 1
        vocab = state["head.weight"].shape[0]
        cvae = state["word_embed.weight"].shape[1]
        levels = state["lvl_1L"].flatten().long()
        hidden = state["blocks.0.ffn.fc1.weight"].shape[0]
    except (KeyError, IndexError) as err:
        raise InputError(f"cannot infer the VAR config: tensor {err} is missing (expected VAR's layout: class_emb, "
                         "head, word_embed, lvl_1L, blocks.N.ffn.fc1)") from None
    depth = len({m.group(1) for k in state if (m := re.match(r"blocks\.(\d+)\.", k))})
    counts = torch.bincount(levels).tolist()
    sides = [math.isqrt(n) for n in counts]
    check(all(s * s == n for s, n in zip(sides, counts)), f"lvl_1L does not describe square scales: {counts}")
    l2 = "blocks.0.attn.scale_mul_1H11" in state
    heads = state["blocks.0.attn.scale_mul_1H11"].shape[1] if l2 else num_heads
    if heads is None:
        heads = _depth_from_name(name)
    if heads is None:
        raise InputError("cannot infer the VAR head count: the checkpoint has no attn_l2_norm scale and its file name "
                         "has no var_d{N}; pass num_heads=")
    check(num_heads is None or num_heads == heads, f"num_heads={num_heads} contradicts the checkpoint's {heads} heads")
    name_depth = _depth_from_name(name)
    check(name_depth is None or name_depth == depth,
          f"the file name says depth {name_depth} but the checkpoint has {depth} blocks")
    return VARConfig(**{"vocab_size": vocab, "z_channels": cvae, "num_classes": num_classes, "depth": depth,
                        "embed_dim": C, "num_heads": heads, "mlp_ratio": hidden / C, "attn_l2_norm": l2,
                        "shared_aln": "shared_ada_lin.1.weight" in state, "patch_nums": tuple(sides), **overrides})


def _config_from_dict(raw: Mapping) -> VARConfig:
    known = {f.name for f in fields(VARConfig)}
    return VARConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known})


def load_var(source: str | Path | Mapping, config: VARConfig | None = None, *, num_heads: int | None = None,
             dtype: torch.dtype | None = None) -> VAR:
    """A `VAR` in eval mode from an official `var_d{16,20,24,30}.pth` (raw state dict with buffers), our
    own save, or a state dict; strict keys and shapes (a wrong layout names the keys)."""
    if isinstance(source, Mapping):
        name, obj, meta = None, source, {}
    else:
        name = str(source)
        obj, meta = read_checkpoint(source, "VAR checkpoint (var_d16.pth ... or an mmaccel .safetensors VAR)")
    state = unwrap_state_dict(obj, name or "the given state dict")
    stored = json.loads(meta["mmaccel_var_config"]) if "mmaccel_var_config" in meta else None
    if config is None:
        config = _config_from_dict(stored) if stored else infer_var_config(state, name=name, num_heads=num_heads)
    model = VAR(config)
    check_layout(model.state_dict(), state, name or "the given state dict", f"VAR ({config})")
    model.load_state_dict(state, strict=True)
    if dtype is not None:
        model.to(dtype)
    return model.eval()


def save_var(model: VAR, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """`.safetensors` (config in metadata; `dtype` e.g. fp16 for shipping) or `.pth`, the official raw state
    dict, which carries no config: refused (`InputError`) unless `load_var(path)` infers the exact config
    (`norm_eps` and `cond_drop_rate` must be the defaults; without attn_l2_norm the head count comes from a
    var_d{N}.pth name)."""
    return write_state_dict(model, path, "mmaccel_var_config", asdict(model.config), dtype,
                            infer=lambda state: infer_var_config(state, name=str(path)))
