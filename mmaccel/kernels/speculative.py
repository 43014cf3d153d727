"""Exact speculative verification of a draft chain in one pass per row (Triton).

The reference is `mmaccel.core.acceptance.accept_speculative` (Leviathan et al. 2023, Alg. 1):
keep draft x_j while u_j * q_j(x_j) < p_j(x_j); after n kept drafts emit a draw from
norm(max(p_n - q_n, 0)) (p_K for the bonus; p_n itself where the residual is empty), drawn as
argmax(residual / E) with the pre-drawn Exp(1) noise E. One program handles one batch row: the
acceptance test over the K drafts, then one sweep over the vocabulary for the residual draw
(`race.residual_race`).
The same float32 operations as the reference, so the outputs are identical, not just equal in law.
K and V are compile-time constants: one compilation per draft length and vocabulary, which a decode
call keeps fixed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from mmaccel.kernels.race import block_size, residual_race


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
        ok = (u * q_x < p_x).to(tl.int32)
        alive = alive * ok
        n += alive
    # the correction / bonus token at row n: one sweep over the vocabulary
    x_n = tl.load(drafts_ptr + b * K + tl.minimum(n, K - 1))
    token = residual_race(p_ptr + (b * (K + 1) + n) * V, q_ptr + (b * K + tl.minimum(n, K - 1)) * V,
                          e_ptr + (b * (K + 1) + n) * V, x_n, n < K, V, POINT_MASS, BLOCK)
    tl.store(n_ptr + b, n)
    tl.store(next_ptr + b, token)


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
                        POINT_MASS=draft_probs is None, BLOCK=block_size(V))
    return n, nxt
