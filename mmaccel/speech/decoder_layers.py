"""The products of one Whisper decoder layer (`LayerOps`: fp32 on the Hugging Face weights, or int8
copies for drafts) and what the layers of one decoder pass share (`LayerStep`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.core.kv_cache import CacheWrite
from mmaccel.engine.int8 import Int8Linear
from mmaccel.errors import check
from mmaccel.speech.decoder_audio import EncodedAudio


@dataclass
class LayerStep:
    """What the layers of one decoder pass share: the cache writer, the attention mask [B, 1, T, S]
    and the audio (for the cross-attention keys/values). With `keep` (flat indices b * T + t of the
    positions that need outputs) the products run on those positions only: hidden states are [N, d]
    between layers and each attention scatters them into [B, H, T, Dh] (zeros elsewhere)."""

    write: CacheWrite
    mask: Tensor | None     # None: every used slot is visible
    inputs: EncodedAudio
    num_heads: int
    keep: Tensor | None = None
    shape: tuple[int, int] = (0, 0)     # (B, T) of the pass, when `keep` is set
    probe: dict | None = None           # when set: layer -> its cross-attention queries [B, H, T, Dh]
    attend: Callable = F.scaled_dot_product_attention     # (q, k, v, mask) -> attention ([B, H, T, Dh])

    def unpack(self, t: Tensor) -> Tensor:
        """Kept positions [N, e] -> [B, T, e], zeros elsewhere."""
        B, T = self.shape
        return t.new_zeros(B * T, t.shape[-1]).index_copy_(0, self.keep, t).view(B, T, -1)

    def heads(self, t: Tensor) -> Tensor:
        """[B, T, d] (or [N, d] with `keep`) -> [B, H, T, Dh]."""
        if self.keep is not None:
            t = self.unpack(t)
        return t.view(t.shape[0], t.shape[1], self.num_heads, -1).transpose(1, 2)

    def merge(self, x: Tensor) -> Tensor:
        """[B, H, T, Dh] -> [B, T, d] (or [N, d] with `keep`)."""
        x = x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)
        return x if self.keep is None else x.reshape(-1, x.shape[-1]).index_select(0, self.keep)


def _fp32(linear: nn.Linear):
    return lambda x: F.linear(x, linear.weight, linear.bias)


def _quantized(*linears: nn.Linear):
    """One int8 product for `linears` side by side (their outputs concatenated)."""
    weight = torch.cat([m.weight.detach() for m in linears])
    bias = None
    if any(m.bias is not None for m in linears):
        bias = torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features) for m in linears])
    return Int8Linear.of(weight, bias).forward


class LayerOps:
    """The products of one decoder layer, ready to call on x [B, T, d]: `qkv` -> (q, k, v),
    `out`, `cross_q`, `cross_out`, `mlp`, and `cross_kv` on encoder states [B, S, d] -> (keys, values).

    By default F.linear on the Hugging Face modules' own weights, looked up at every call (training
    and `.to()` are seen; logits equal HF's). `quantized=True` (drafts) holds int8 copies (a quarter
    of the bytes, `mmaccel.engine.int8`) with the query/key/value products fused into one. Either way
    these are plain function calls: a draft step is a few dozen small products, where a module
    call's overhead is a noticeable share of the time.
    """

    def __init__(self, layer: nn.Module, quantized: bool = False):
        a, c = layer.self_attn, layer.encoder_attn
        act = getattr(layer.activation_fn, "act", layer.activation_fn)     # HF's GELUActivation wraps F.gelu
        if quantized:
            fused = _quantized(a.q_proj, a.k_proj, a.v_proj)
            self.qkv = lambda x: fused(x).chunk(3, -1)
            self.out, self.cross_q, self.cross_out = _quantized(a.out_proj), _quantized(c.q_proj), _quantized(c.out_proj)
            fc1, fc2 = _quantized(layer.fc1), _quantized(layer.fc2)
            cross = _quantized(c.k_proj, c.v_proj)
            self.cross_kv = lambda x: cross(x).chunk(2, -1)
        else:
            q, k, v = _fp32(a.q_proj), _fp32(a.k_proj), _fp32(a.v_proj)
            self.qkv = lambda x: (q(x), k(x), v(x))
            self.out, self.cross_q, self.cross_out = _fp32(a.out_proj), _fp32(c.q_proj), _fp32(c.out_proj)
            fc1, fc2 = _fp32(layer.fc1), _fp32(layer.fc2)
            cross_k, cross_v = _fp32(c.k_proj), _fp32(c.v_proj)
            self.cross_kv = lambda x: (cross_k(x), cross_v(x))
        self.mlp = lambda x: fc2(act(fc1(x)))


def _norm(ln: nn.LayerNorm, x: Tensor) -> Tensor:
    return F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)


def kept_positions(shape: torch.Size, valid: Tensor | None, device: torch.device) -> Tensor | None:
    """Flat indices b * T + t [N] (on `device`) of the positions of a pass of `shape` (B, T) that `valid`
    [B] asks for (row b's first valid[b]); None when that is all of them."""
    if valid is None:
        return None
    B, T = shape
    check(isinstance(valid, Tensor) and valid.shape == (B,), f"valid must be a tensor [{B}], got "
          f"{tuple(valid.shape) if isinstance(valid, Tensor) else type(valid).__name__}")
    valid = valid.cpu()
    check(bool(((valid >= 0) & (valid <= T)).all()), f"valid counts must lie in [0, {T}], got {valid.tolist()}")
    if int(valid.sum()) == B * T:
        return None
    return (torch.arange(T)[None, :] < valid[:, None]).flatten().nonzero()[:, 0].to(device)
