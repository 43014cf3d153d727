"""LANTERN's pooled acceptance in one pass per row (Triton).

The reference is `mmaccel.core.acceptance.accept_pooled` (Jang et al., ICLR 2025, §3.2): for draft
x_j the longest prefix of its latent neighbours (table row x_j, padding -1 and x_j itself break it)
whose target mass sums to at most delta is pooled onto x_j; keep x_j while
u_j * q_j(x_j) < p_j(x_j) + pooled; then the residual draw of exact speculative sampling
(`race.residual_race`). One program per batch row; the neighbour row is one vector of M lanes.
The prefix sums accumulate in float64 and round to float32, as torch's CPU cumsum does, and the
comparisons are float32 as in the reference; only the order of float32 sums (pooled mass, deviation)
may differ from torch's by rounding. K, V and M are compile-time constants.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from mmaccel.kernels.race import block_size, residual_race


@triton.jit
def _accept_pooled(drafts_ptr, q_ptr, p_ptr, u_ptr, e_ptr, neighbours_ptr, delta, n_ptr, next_ptr, deviation_ptr,
                   K: tl.constexpr, V: tl.constexpr, M: tl.constexpr, M_BLOCK: tl.constexpr,
                   POINT_MASS: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    lanes = tl.arange(0, M_BLOCK)
    in_table = lanes < M
    n = 0
    alive = 1
    deviation = 0.0
    for j in range(0, K):
        if alive == 1:
            x = tl.load(drafts_ptr + b * K + j)
            row_p = p_ptr + (b * (K + 1) + j) * V
            cand = tl.load(neighbours_ptr + x * M + lanes, mask=in_table, other=-1)
            valid = (cand >= 0) & (cand != x)
            p_c = tl.where(valid, tl.load(row_p + tl.maximum(cand, 0), mask=in_table, other=0.0), 0.0)
            within = (tl.cumsum(p_c.to(tl.float64), axis=0).to(tl.float32) <= delta) & valid
            within = within & (tl.cumsum(tl.where(within, 0, 1), axis=0) == 0)          # the budgeted prefix
            moved = tl.sum(tl.where(within, p_c, 0.0), axis=0)
            p_x = tl.load(row_p + x) + moved
            if POINT_MASS:
                q_x = 1.0
            else:
                q_x = tl.load(q_ptr + (b * K + j) * V + x)
            u = tl.load(u_ptr + b * K + j)
            alive = (u * q_x < p_x).to(tl.int32)
            n += alive
            deviation += tl.where(alive == 1, moved, 0.0)
    x_n = tl.load(drafts_ptr + b * K + tl.minimum(n, K - 1))
    token = residual_race(p_ptr + (b * (K + 1) + n) * V, q_ptr + (b * K + tl.minimum(n, K - 1)) * V,
                          e_ptr + (b * (K + 1) + n) * V, x_n, n < K, V, POINT_MASS, BLOCK)
    tl.store(n_ptr + b, n)
    tl.store(next_ptr + b, token)
    tl.store(deviation_ptr + b, deviation)


def verify_pooled(draft_tokens: Tensor, draft_probs: Tensor | None, target_probs: Tensor, uniforms: Tensor,
                  exponentials: Tensor, neighbours: Tensor, delta: float) -> tuple[Tensor, Tensor, Tensor]:
    """(num_accepted [B], next_token [B], deviation [B]) of pooled acceptance; shapes as the reference:
    draft_tokens [B, K], draft_probs [B, K, V] or None (point masses), target_probs and exponentials
    [B, K + 1, V], uniforms [B, K], neighbours [V, M] (nearest first, -1 = padding)."""
    B, K = draft_tokens.shape
    V = target_probs.shape[-1]
    M = neighbours.shape[1]
    p = target_probs.float().contiguous()
    q = p if draft_probs is None else draft_probs.float().contiguous()       # unused when point masses
    n = torch.empty(B, dtype=torch.int64, device=p.device)
    nxt = torch.empty(B, dtype=torch.int64, device=p.device)
    deviation = torch.empty(B, dtype=torch.float32, device=p.device)
    if K == 0:                                                                # nothing to verify: a draw from p_0
        return n.zero_(), (p[:, 0] / exponentials[:, 0].float()).argmax(-1), deviation.zero_()
    _accept_pooled[(B,)](draft_tokens.contiguous(), q, p, uniforms.float().contiguous(),
                         exponentials.float().contiguous(), neighbours.to(p.device).contiguous(), float(delta),
                         n, nxt, deviation, K, V, M, triton.next_power_of_2(max(M, 1)),
                         POINT_MASS=draft_probs is None, BLOCK=block_size(V))
    return n, nxt, deviation
