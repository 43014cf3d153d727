"""Attention in one kernel shape, so that a query's result does not depend on the pass it is in.

A greedy-verified method is lossless when each token it keeps comes out of the same arithmetic as in plain greedy
decoding. The products of `Int8Linear` are exact per row, layer norm and GELU are row-wise; attention is the part
that rounds by the shape of its call. Measured on this project's CPUs (torch 2.11), PyTorch's attention kernel gives
a query a result different by ~1e-7 by how many queries share its call, by how many keys there are (a causal mask
against a shorter key range) and by how many rows share it; int8 activations amplify that into a different
quantisation step, so an int8 verify pass disagreed with the one-token passes by up to 0.12 in a logit.

`fixed_shape_attention` runs every call in one shape: queries in blocks of `QUERY_BLOCK` (the last block padded with
zero queries), keys always the caller's whole buffer (a decoder's cache at its full capacity, a fixed window of
encoder states) with what a query may not see masked. A kernel called twice on the same shapes and the same
visible values computes the same bits; a hidden key adds an exact zero. So a query's output is bitwise the same in
a one-token pass, in a verify pass of any width, in a tree pass and in a ragged batch of any rows
(`tests/engine/test_attention.py` checks it on the CPU it runs on). The price is the padded queries' products: a
one-token pass computes `QUERY_BLOCK` queries' worth of attention (docs/concepts/engine.md has the measured cost).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

QUERY_BLOCK = 8     # queries per call: a verify pass of up to 7 drafts is one call, as a one-token pass is


def fixed_shape_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """Scaled dot-product attention of queries q [B, H, T, D] over keys / values [B, H, S, D] -> [B, H, T, D], each
    query computed in a call of `QUERY_BLOCK` queries over all S keys. `mask`: bool [B, 1, T or 1, S], True = may
    attend (every query must see at least one key). A query's result depends only on its own inputs and S."""
    B, H, T, D = q.shape
    outs = []
    for first in range(0, T, QUERY_BLOCK):
        block = q[:, :, first : first + QUERY_BLOCK]
        n = block.shape[2]
        visible = None
        if mask is not None:
            visible = mask if mask.shape[2] == 1 else mask[:, :, first : first + n]
        if n < QUERY_BLOCK:
            block = F.pad(block, (0, 0, 0, QUERY_BLOCK - n))
            if visible is not None and visible.shape[2] > 1:      # the padding queries see every key
                visible = torch.cat([visible, visible.new_ones(*visible.shape[:2], QUERY_BLOCK - n, visible.shape[3])], 2)
        outs.append(F.scaled_dot_product_attention(block, k, v, attn_mask=visible)[:, :, :n])
    return outs[0] if len(outs) == 1 else torch.cat(outs, 2)
