"""The blocks of the LlamaGen GPT (`mmaccel.image.models.gpt`): the 2-D rotary embedding over the image
grid, RMSNorm, the class-embedding table, attention with a fused `wqkv`, SwiGLU and the Llama-style block.

Module and parameter names are the official ones (FoundationVision/LlamaGen `autoregressive/models/gpt.py`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.image.models.gpt_presets import GPTConfig


@functools.lru_cache(maxsize=16)
def _rope_freqs(half: int, base: float, device: torch.device) -> Tensor:
    """f_j computed on the CPU (as the official code precomputes them) and moved once per device:
    a decode step uploads nothing."""
    return (1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))).to(device)


def rope_2d(positions: Tensor, config: GPTConfig) -> Tensor:
    """Rotary (cos, sin) [..., head_dim // 2, 2] for image-token indices `positions` [...] (raster order).

    Pair j < head_dim/4 rotates by row * f_j, the rest by col * f_j, f_j = base^(-2j / (head_dim/2)),
    the same float32 ops as the official `precompute_freqs_cis_2d`. Indices past the grid continue
    the raster (extra rows).
    """
    freqs = _rope_freqs(config.head_dim // 2, config.rope_base, positions.device)
    row = (positions // config.grid_size).float()[..., None] * freqs
    col = (positions % config.grid_size).float()[..., None] * freqs
    angles = torch.cat([row, col], dim=-1)
    return torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1)


def apply_rope(x: Tensor, rope: Tensor) -> Tensor:
    # x: [B, T, H, D], rope: [B, T, D/2, 2]; pairs are adjacent channels (2j, 2j+1)
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    cos, sin = rope[:, :, None, :, 0], rope[:, :, None, :, 1]
    out = torch.stack([pairs[..., 0] * cos - pairs[..., 1] * sin,
                       pairs[..., 1] * cos + pairs[..., 0] * sin], dim=-1)
    return out.flatten(3).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class LabelEmbedder(nn.Module):
    """Class embedding table; row `num_classes` is the null class that label dropout trains for CFG."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.num_classes, self.dropout_prob = config.num_classes, config.class_dropout_prob
        self.embedding_table = nn.Embedding(config.num_classes + int(config.has_null_class), config.dim)

    def forward(self, labels: Tensor) -> Tensor:
        # labels: [B] -> [B, 1, dim]
        if self.training and self.dropout_prob > 0:
            drop = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
            labels = torch.where(drop, torch.full_like(labels, self.num_classes), labels)
        return self.embedding_table(labels)[:, None]


class Attention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        self.wqkv = nn.Linear(config.dim, (config.n_head + 2 * config.kv_heads) * config.head_dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)
        self.attn_dropout_p = config.attn_dropout_p
        self.resid_dropout = nn.Dropout(config.resid_dropout_p)

    def forward(self, x: Tensor, rope: Tensor, mask: Tensor | None, cache: Any, layer_idx: int) -> Tensor:
        # x: [B, T, dim]; mask: [B, 1, T, S] bool or None (= causal over x alone)
        B, T, dim = x.shape
        kv = self.n_kv_head * self.head_dim
        q, k, v = self.wqkv(x).split([dim, kv, kv], dim=-1)
        q = apply_rope(q.view(B, T, self.n_head, self.head_dim), rope).transpose(1, 2)
        k = apply_rope(k.view(B, T, self.n_kv_head, self.head_dim), rope).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, layer_idx)
        if self.n_kv_head != self.n_head:
            k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
            v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                             dropout_p=self.attn_dropout_p if self.training else 0.0)
        return self.resid_dropout(self.wo(out.transpose(1, 2).reshape(B, T, dim)))


class FeedForward(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden = config.ffn_hidden_dim
        self.w1 = nn.Linear(config.dim, hidden, bias=False)
        self.w3 = nn.Linear(config.dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, config.dim, bias=False)
        self.ffn_dropout = nn.Dropout(config.ffn_dropout_p)

    def forward(self, x: Tensor) -> Tensor:
        return self.ffn_dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class TransformerBlock(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attention = Attention(config)
        self.feed_forward = FeedForward(config)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x: Tensor, rope: Tensor, mask: Tensor | None, cache: Any, layer_idx: int) -> Tensor:
        h = x + self.attention(self.attention_norm(x), rope, mask, cache, layer_idx)
        return h + self.feed_forward(self.ffn_norm(h))
