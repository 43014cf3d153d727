"""Exact speculative verification of a draft chain in one pass per row (Triton).

The reference is `mmaccel.core.acceptance.accept_speculative` (Leviathan et al. 2023, Alg. 1):
keep draft x_j while u_j * q_j(x_j) <= p_j(x_j); after n kept drafts emit a draw from
norm(max(p_n - q_n, 0)) (p_K for the bonus; p_n itself where the residual is empty), drawn as
argmax(residual / E) with the pre-drawn Exp(1) noise E. One program handles one batch row: the
acceptance test over the K drafts, then one sweep over the vocabulary in blocks for the residual draw,
keeping the running arg-max (first index among equals, as torch.argmax) of residual / E and of p / E.
The same float32 operations as the reference, so the outputs are identical, not just equal in law.
K and V are compile-time constants: one compilation per draft length and vocabulary, which a decode
call keeps fixed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK_V = 1024


@triton.jit
def _verify_chain(drafts_ptr, q_ptr, p_ptr, u_ptr, e_ptr, n_ptr, next_ptr, K: tl.constexpr, V: tl.constexpr,
                  POINT_MASS: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    # acceptance: n = length of the accepted prefix
    n = 0
    alive = 1
    for j in range(0, K):
        x = tl.load(drafts_ptr + b * K + j)
        p_x = tl.load(p_ptr + (b * (K + 1) + j) * V + x)
        if POINT_MASS:
            q_x = 1.0
        else:
            q_x = tl.load(q_ptr + (b * K + j) * V + x)
        u = tl.load(u_ptr + b * K + j)
        ok = (u * q_x <= p_x).to(tl.int32)
        alive = alive * ok
        n += alive
    # the correction / bonus token at row n: one sweep over the vocabulary
    row_p = p_ptr + (b * (K + 1) + n) * V
    row_e = e_ptr + (b * (K + 1) + n) * V
    x_n = tl.load(drafts_ptr + b * K + tl.minimum(n, K - 1))
    best_r = -1.0
    arg_r = 0
    best_p = -1.0
    arg_p = 0
    mass = 0.0
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < V
        p = tl.load(row_p + cols, mask=inside, other=0.0)
        e = tl.load(row_e + cols, mask=inside, other=1.0)
        if POINT_MASS:
            q = tl.where(cols == x_n, 1.0, 0.0)
        else:
            q = tl.load(q_ptr + (b * K + tl.minimum(n, K - 1)) * V + cols, mask=inside, other=0.0)
        q = tl.where(n < K, q, 0.0)                       # the bonus row: the residual is p itself
        residual = tl.maximum(p - q, 0.0)
        mass += tl.sum(residual, axis=0)
        score_r = tl.where(inside, residual / e, -1.0)
        score_p = tl.where(inside, p / e, -1.0)
        block_r = tl.max(score_r, axis=0)
        block_p = tl.max(score_p, axis=0)
        # first index of the block maximum, kept only when strictly above the running one (torch's tie rule)
        idx_r = tl.min(tl.where(score_r == block_r, cols, V), axis=0)
        idx_p = tl.min(tl.where(score_p == block_p, cols, V), axis=0)
        take_r = block_r > best_r
        take_p = block_p > best_p
        arg_r = tl.where(take_r, idx_r, arg_r)
        best_r = tl.where(take_r, block_r, best_r)
        arg_p = tl.where(take_p, idx_p, arg_p)
        best_p = tl.where(take_p, block_p, best_p)
    tl.store(n_ptr + b, n)
    tl.store(next_ptr + b, tl.where(mass > 0.0, arg_r, arg_p))


def verify_chain(draft_tokens: Tensor, draft_probs: Tensor | None, target_probs: Tensor, uniforms: Tensor,
                 exponentials: Tensor) -> tuple[Tensor, Tensor]:
    """(num_accepted [B], next_token [B]) of exact speculative sampling; shapes as the reference:
    draft_tokens [B, K], draft_probs [B, K, V] or None (point masses), target_probs and
    exponentials [B, K + 1, V], uniforms [B, K]."""
    B, K = draft_tokens.shape
    V = target_probs.shape[-1]
    p = target_probs.float().contiguous()
    e = exponentials.float().contiguous()
    q = p if draft_probs is None else draft_probs.float().contiguous()       # unused when point masses
    n = torch.empty(B, dtype=torch.int64, device=p.device)
    nxt = torch.empty(B, dtype=torch.int64, device=p.device)
    if K == 0:                                                                # nothing to verify: a draw from p_0
        return n.zero_(), (p[:, 0] / e[:, 0]).argmax(-1)
    _verify_chain[(B,)](draft_tokens.contiguous(), q, p, uniforms.float().contiguous(), e, n, nxt, K, V,
                        POINT_MASS=draft_probs is None, BLOCK=min(BLOCK_V, triton.next_power_of_2(V)))
    return n, nxt
