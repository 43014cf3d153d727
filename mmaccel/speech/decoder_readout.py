"""How the Whisper decoder's hidden states become vocabulary logits besides the plain tied projection:
through a token shortlist (`ShortlistProjection`), exact only at the arg-max at bf16 cost
(`ArgmaxProjection`), or after an early-exit head (`ExitHead`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.core.readout import project
from mmaccel.engine.int8 import Int8Linear


class ShortlistProjection:
    """Logits over the full vocabulary computed from the rows of `vocab` only (-inf elsewhere).

    On a CPU the 51 865-row projection is about a quarter of a Whisper base decoder step at batch 1 (laid out as
    `mmaccel.core.readout` does); a draft that only proposes tokens of a shortlist (those seen in training
    transcripts) reads a few thousand rows.
    Drafts outside the shortlist are impossible, which costs acceptance, never exactness. With
    `quantized` the rows are stored as int8 (`mmaccel.engine.int8`), a quarter of the bytes.
    """

    def __init__(self, weight: Tensor, vocab: Tensor, quantized: bool = False):
        # ascending: arg-max ties as over V (sorted where the ids are, on the host for a file's shortlist)
        self.vocab = vocab.to(torch.long).unique().to(weight.device)
        rows = weight.detach()[self.vocab]
        self.int8 = Int8Linear.of(rows) if quantized else None
        self.weight = rows.clone() if self.int8 is None else None
        self.vocab_size = weight.shape[0]

    def compact(self, hidden: Tensor) -> Tensor:
        """Logits of the shortlist tokens only: hidden [..., d] -> [..., len(vocab)]."""
        return project(hidden, self.weight) if self.int8 is None else self.int8(hidden)

    def __call__(self, hidden: Tensor) -> Tensor:
        out = hidden.new_full((*hidden.shape[:-1], self.vocab_size), float("-inf"))
        out[..., self.vocab] = self.compact(hidden)
        return out


class ArgmaxProjection:
    """Vocabulary logits whose every row has the arg-max of the fp32 projection, at the cost of a
    bf16 one: for greedy decoding and greedy verification, which read nothing but arg-maxes.

    Stage 1 projects bf16 copies of the hidden states and the embedding (half the bytes of fp32;
    with native bf16 matrix units a T-token verify pass costs about what one token does). Logit j
    of a row is off by at most U_j = 2^-7 ‖h‖ ‖w_j‖ (operand rounding) + 2^-8 |y_j| (output
    rounding). The fp32 arg-max is at least L = max_j (y_j - U_j), so it lies among the tokens with
    y_j + U_j >= L (a handful: per-token bounds, not the largest row norm). Those all lie within 2U
    of the row's top value, U being a bound of U_j valid for every such token, so the full-vocabulary
    work is one bf16 product (suppression bias included), a max and a threshold; the per-token
    bounds are applied to the short list that passes. Stage 2 recomputes the candidates
    exactly in fp32 and writes them in. Every other entry stays a bf16 value below the true
    maximum. The logits are therefore exact at the arg-max and approximate elsewhere: not for
    sampling, beam scores or typical acceptance, which use the plain projection.
    """

    SAFETY = 2.0

    def __init__(self, weight: Tensor, bias: Tensor):
        self.weight = weight.detach()
        self.weight_bf16 = self.weight.to(torch.bfloat16)
        self.bias, self.bias_bf16 = bias, bias.to(torch.bfloat16)                           # 0 or -inf
        self.norms = self.weight.float().norm(dim=-1)                                        # [V]
        self.max_norm = float(self.norms.max())

    def __call__(self, hidden: Tensor, bias: Tensor | None = None) -> Tensor:
        """hidden [..., d] -> logits [..., V] (suppression bias included). `bias` (0 or -inf entries,
        broadcastable to the logits) replaces the constructor's, e.g. one row per position."""
        shape = hidden.shape[:-1]
        h = hidden.reshape(-1, hidden.shape[-1]).float()
        if bias is None:
            y = F.linear(h.to(torch.bfloat16), self.weight_bf16, self.bias_bf16)             # [N, V]
            bias = self.bias.expand(h.shape[0], -1)
        else:
            bias = bias.expand(*shape, bias.shape[-1]).reshape(h.shape[0], -1)
            y = F.linear(h.to(torch.bfloat16), self.weight_bf16) + bias.to(torch.bfloat16)
        top = y.max(-1, keepdim=True).values.float()
        reach = h.norm(dim=-1, keepdim=True)
        # U bounds U_j for every token that can be a candidate (those have |y_j| <= |top| + 2U), so the
        # candidates lie among the tokens within 2U of the top: find those first, then apply U_j to them
        u = self.SAFETY * (2.0 ** -7 * reach * self.max_norm + 2.0 ** -8 * top.abs()) / (1 - self.SAFETY * 2.0 ** -7)
        rows, cols = (y >= top - 2 * u).nonzero(as_tuple=True)
        near = y[rows, cols].float()
        bound = self.SAFETY * (2.0 ** -7 * reach[rows, 0] * self.norms[cols] + 2.0 ** -8 * near.abs())
        lower = torch.full((h.shape[0],), float("-inf"), device=h.device).scatter_reduce(0, rows, near - bound, "amax")
        keep = near + bound >= lower[rows]
        rows, cols = rows[keep], cols[keep]
        logits = y.float()
        logits[rows, cols] = (h[rows] * self.weight[cols].float()).sum(-1) + bias[rows, cols]
        return logits.view(*shape, -1)


class ExitHead(nn.Module):
    """An early-exit head: a zero-initialised residual SiLU block and a LayerNorm (initialised from
    the decoder's final norm), read out through the model's tied vocabulary projection, or through
    `projection` (a `ShortlistProjection`) when one is set."""

    projection: ShortlistProjection | None = None

    def __init__(self, final_norm: nn.LayerNorm):
        super().__init__()
        d = final_norm.normalized_shape[0]
        self.block = nn.Linear(d, d)
        nn.init.zeros_(self.block.weight)
        nn.init.zeros_(self.block.bias)
        self.norm = nn.LayerNorm(d, eps=final_norm.eps)
        self.norm.load_state_dict(final_norm.state_dict())

    def forward(self, hidden: Tensor) -> Tensor:   # un-normalised layer output -> normalised hidden
        return self.norm(hidden + F.silu(self.block(hidden)))
