"""GSD's grouped acceptance in one pass per row, sampled and coupled (Triton).

The references are `accept_grouped` and `accept_grouped_coupled` in `mmaccel.core.acceptance` (So et
al., ICCV 2025). A draft x's candidates are the tokens within `half_window` ranks of x in the
target's order, which is p descending with ties by token index (torch's stable sort). No sort here:
the candidates one rank above and below the current ones are found by one sweep over the vocabulary
each, as the nearest keys (p, index) before and after them in that order, so w sweeps give all 2w.
The coupled rule needs only whether the target's own sample y = argmax(p / E) is one of them, that
is |rank(y) - rank(x)| <= w: one counting sweep, and only when y is close enough to x to join its
group. Comparisons are float32 as in the reference; only the order of the float32 sums of the group
mass (and of the deviation) may differ from torch's by rounding. K and V are compile-time constants.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from mmaccel.kernels.race import NEG_INF, POS_INF, block_size, residual_race, row_argmax


@triton.jit
def _next_in_order(row_p, up_p, up_i, down_p, down_i, V: tl.constexpr, BLOCK: tl.constexpr):
    """The key just before (up_p, up_i) and the key just after (down_p, down_i) in the order
    "p descending, then index ascending"; (+inf, -1) and (-inf, V) when there is none (and as inputs,
    keys with nothing beyond them)."""
    best_up_p = tl.full([], POS_INF, tl.float32)
    best_up_i = -1
    best_down_p = tl.full([], NEG_INF, tl.float32)
    best_down_i = V
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < V
        p = tl.load(row_p + cols, mask=inside, other=0.0)
        # before the up key, the latest: least p, then the largest index
        before = inside & ((p > up_p) | ((p == up_p) & (cols < up_i)))
        block_p = tl.min(tl.where(before, p, POS_INF), axis=0)
        block_i = tl.max(tl.where(before & (p == block_p), cols, -1), axis=0)
        take = (block_i >= 0) & ((block_p < best_up_p) | ((block_p == best_up_p) & (block_i > best_up_i)))
        best_up_p = tl.where(take, block_p, best_up_p)
        best_up_i = tl.where(take, block_i, best_up_i)
        # after the down key, the earliest: most p, then the least index
        after = inside & ((p < down_p) | ((p == down_p) & (cols > down_i)))
        block_p = tl.max(tl.where(after, p, NEG_INF), axis=0)
        block_i = tl.min(tl.where(after & (p == block_p), cols, V), axis=0)
        take = (block_i < V) & ((block_p > best_down_p) | ((block_p == best_down_p) & (block_i < best_down_i)))
        best_down_p = tl.where(take, block_p, best_down_p)
        best_down_i = tl.where(take, block_i, best_down_i)
    return best_up_p, best_up_i, best_down_p, best_down_i


@triton.jit
def _rank(row_p, p_t, t, V: tl.constexpr, BLOCK: tl.constexpr):
    """Position of token t (probability p_t) in the stable descending order of the row."""
    count = 0
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < V
        p = tl.load(row_p + cols, mask=inside, other=0.0)
        count += tl.sum((inside & ((p > p_t) | ((p == p_t) & (cols < t)))).to(tl.int32), axis=0)
    return count


@triton.jit
def _accept_grouped(drafts_ptr, q_ptr, p_ptr, u_ptr, e_ptr, dist_ptr, p_threshold, d_threshold, half_window,
                    n_ptr, next_ptr, deviation_ptr, K: tl.constexpr, V: tl.constexpr, POINT_MASS: tl.constexpr,
                    BLOCK: tl.constexpr):
    b = tl.program_id(0)
    n = 0
    alive = 1
    deviation = 0.0
    for j in range(0, K):
        if alive == 1:
            x = tl.load(drafts_ptr + b * K + j).to(tl.int32)
            row_p = p_ptr + (b * (K + 1) + j) * V
            row_q = q_ptr + (b * K + j) * V
            row_d = dist_ptr + x.to(tl.int64) * V
            p_x = tl.load(row_p + x)
            moved_p = 0.0
            moved_q = 0.0
            up_p = p_x
            up_i = x
            down_p = p_x
            down_i = x
            d = 0
            while d < half_window:                      # the candidates at ranks -d and +d, d = 1 .. w
                d += 1
                up_p, up_i, down_p, down_i = _next_in_order(row_p, up_p, up_i, down_p, down_i, V, BLOCK)
                up = (up_i >= 0) & (tl.load(row_d + tl.maximum(up_i, 0), mask=up_i >= 0, other=POS_INF) < d_threshold)
                up = up & (tl.abs(up_p - p_x) < p_threshold)
                down = (down_i < V) & (tl.load(row_d + tl.minimum(down_i, V - 1), mask=down_i < V, other=POS_INF)
                                       < d_threshold)
                down = down & (tl.abs(down_p - p_x) < p_threshold)
                moved_p += tl.where(up, up_p, 0.0)
                moved_p += tl.where(down, down_p, 0.0)
                if not POINT_MASS:              # a point mass on x has no mass on the other group members
                    moved_q += tl.load(row_q + tl.maximum(up_i, 0), mask=up, other=0.0)
                    moved_q += tl.load(row_q + tl.minimum(down_i, V - 1), mask=down, other=0.0)
            if POINT_MASS:
                q_x = 1.0
            else:
                q_x = tl.load(row_q + x)
            u = tl.load(u_ptr + b * K + j)
            alive = (u * (q_x + moved_q) < p_x + moved_p).to(tl.int32)
            n += alive
            deviation += tl.where(alive == 1, moved_p, 0.0)
    x_n = tl.load(drafts_ptr + b * K + tl.minimum(n, K - 1))
    token = residual_race(p_ptr + (b * (K + 1) + n) * V, q_ptr + (b * K + tl.minimum(n, K - 1)) * V,
                          e_ptr + (b * (K + 1) + n) * V, x_n, n < K, V, POINT_MASS, BLOCK)
    tl.store(n_ptr + b, n)
    tl.store(next_ptr + b, token)
    tl.store(deviation_ptr + b, deviation)


@triton.jit
def _accept_grouped_coupled(drafts_ptr, p_ptr, e_ptr, dist_ptr, p_threshold, d_threshold, half_window,
                            n_ptr, next_ptr, deviation_ptr, K: tl.constexpr, V: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    n = 0
    alive = 1
    swaps = 0
    token = 0
    for j in range(0, K):
        if alive == 1:
            row_p = p_ptr + (b * (K + 1) + j) * V
            y = row_argmax(row_p, e_ptr + (b * (K + 1) + j) * V, True, V, BLOCK)    # the coupled target sample
            x = tl.load(drafts_ptr + b * K + j).to(tl.int32)
            swap = 0
            if y != x:
                p_x = tl.load(row_p + x)
                p_y = tl.load(row_p + y)
                close = tl.load(dist_ptr + x.to(tl.int64) * V + y) < d_threshold
                if close & (tl.abs(p_y - p_x) < p_threshold):
                    swap = (tl.abs(_rank(row_p, p_y, y, V, BLOCK) - _rank(row_p, p_x, x, V, BLOCK))
                            <= half_window).to(tl.int32)
            alive = ((y == x) | (swap == 1)).to(tl.int32)
            n += alive
            swaps += swap * alive
            token = tl.where(alive == 1, token, y)
    if n == K:                                          # every draft kept: the target's sample after them
        token = row_argmax(p_ptr + (b * (K + 1) + K) * V, e_ptr + (b * (K + 1) + K) * V, True, V, BLOCK)
    tl.store(n_ptr + b, n)
    tl.store(next_ptr + b, token)
    tl.store(deviation_ptr + b, swaps.to(tl.float32))


def verify_grouped(draft_tokens: Tensor, draft_probs: Tensor | None, target_probs: Tensor, uniforms: Tensor,
                   exponentials: Tensor, distances: Tensor, p_threshold: float, d_threshold: float,
                   half_window: int) -> tuple[Tensor, Tensor, Tensor]:
    """(num_accepted [B], next_token [B], deviation [B]) of GSD's grouped acceptance; shapes as the
    reference: draft_tokens [B, K], draft_probs [B, K, V] or None (point masses), target_probs and
    exponentials [B, K + 1, V], uniforms [B, K], distances [V, V] (float32 squared latent distances)."""
    B, K = draft_tokens.shape
    V = target_probs.shape[-1]
    p = target_probs.float().contiguous()
    q = p if draft_probs is None else draft_probs.float().contiguous()       # unused when point masses
    n, nxt, deviation = _outputs(B, p.device)
    if K == 0:                                                                # nothing to verify: a draw from p_0
        return n.zero_(), (p[:, 0] / exponentials[:, 0].float()).argmax(-1), deviation.zero_()
    _accept_grouped[(B,)](draft_tokens.contiguous(), q, p, uniforms.float().contiguous(), exponentials.float().contiguous(),
                          distances.to(p.device, torch.float32).contiguous(), float(p_threshold), float(d_threshold),
                          int(half_window), n, nxt, deviation, K, V, POINT_MASS=draft_probs is None,
                          BLOCK=block_size(V))
    return n, nxt, deviation


def verify_grouped_coupled(draft_tokens: Tensor, target_probs: Tensor, exponentials: Tensor, distances: Tensor,
                           p_threshold: float, d_threshold: float, half_window: int) -> tuple[Tensor, Tensor, Tensor]:
    """(num_accepted [B], next_token [B], deviation [B]: swaps among the kept drafts) of GSD's clusters
    under coupled noise; draft_tokens [B, K], target_probs and exponentials [B, K + 1, V], distances [V, V]."""
    B, K = draft_tokens.shape
    V = target_probs.shape[-1]
    p = target_probs.float().contiguous()
    e = exponentials.float().contiguous()
    n, nxt, deviation = _outputs(B, p.device)
    if K == 0:
        return n.zero_(), (p[:, 0] / e[:, 0]).argmax(-1), deviation.zero_()
    _accept_grouped_coupled[(B,)](draft_tokens.contiguous(), p, e, distances.to(p.device, torch.float32).contiguous(),
                                  float(p_threshold), float(d_threshold), int(half_window), n, nxt, deviation, K, V,
                                  BLOCK=block_size(V))
    return n, nxt, deviation


def _outputs(B: int, device) -> tuple[Tensor, Tensor, Tensor]:
    return (torch.empty(B, dtype=torch.int64, device=device), torch.empty(B, dtype=torch.int64, device=device),
            torch.empty(B, dtype=torch.float32, device=device))
