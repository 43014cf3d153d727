"""The exponential race over one vocabulary row, shared by the verification kernels (Triton).

`mmaccel.core.sampling.race` draws from p as argmax(p / E) with pre-drawn Exp(1) noise E; the
acceptance rules draw their correction token the same way from the residual norm(max(p - q, 0)).
These helpers sweep a row in blocks and keep the running arg-max with torch.argmax's tie rule (the
first index among equal maxima: a later block's maximum is taken only when strictly larger), so a
kernel that calls them returns the reference's token, not just one with the same law. (The fold is
written out in each loop rather than called: Triton's interpreter, which the CPU tests run, pays
about 0.2 ms for every call of a jit function.)
"""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK_V = 1024
NEG_INF = tl.constexpr(float("-inf"))
POS_INF = tl.constexpr(float("inf"))


def block_size(V: int) -> int:
    """Vocabulary columns per sweep step: the whole row when it is short."""
    return min(BLOCK_V, triton.next_power_of_2(V))


@triton.jit
def row_argmax(x_row, e_row, DIVIDE: tl.constexpr, V: tl.constexpr, BLOCK: tl.constexpr):
    """argmax over the row of x / e (DIVIDE) or of x itself (e.g. logits), first index among equals."""
    best = tl.full([], NEG_INF, tl.float32)
    arg = 0
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < V
        x = tl.load(x_row + cols, mask=inside, other=0.0).to(tl.float32)
        if DIVIDE:
            x = x / tl.load(e_row + cols, mask=inside, other=1.0)
        score = tl.where(inside, x, NEG_INF)
        block_best = tl.max(score, axis=0)
        arg = tl.where(block_best > best, tl.min(tl.where(score == block_best, cols, V), axis=0), arg)
        best = tl.maximum(block_best, best)
    return arg


@triton.jit
def residual_race(p_row, q_row, e_row, x, has_draft, V: tl.constexpr, POINT_MASS: tl.constexpr,
                  BLOCK: tl.constexpr, LANES: tl.constexpr = False):
    """The correction token of speculative sampling: argmax(max(p - q, 0) / E) over the row, or
    argmax(p / E) where the residual is empty (p == q). `q` is the draft row, the point mass on token
    `x` (POINT_MASS), or nothing (`has_draft` false: the bonus position, where the residual is p).
    LANES: `x` is a vector of tokens (-1 marks an empty lane) and the residual is p with them zeroed
    (a tree node's law after its rejected children)."""
    best_r = tl.full([], NEG_INF, tl.float32)
    arg_r = 0
    best_p = tl.full([], NEG_INF, tl.float32)
    arg_p = 0
    mass = 0.0
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < V
        p = tl.load(p_row + cols, mask=inside, other=0.0)
        e = tl.load(e_row + cols, mask=inside, other=1.0)
        if LANES:
            residual = tl.where(tl.max((cols[:, None] == x[None, :]).to(tl.int32), axis=1) > 0, 0.0, p)
        else:
            if POINT_MASS:
                q = tl.where(cols == x, 1.0, 0.0)
            else:
                q = tl.load(q_row + cols, mask=inside, other=0.0)
            residual = tl.maximum(p - tl.where(has_draft, q, 0.0), 0.0)
        mass += tl.sum(residual, axis=0)
        score_r = tl.where(inside, residual / e, NEG_INF)
        score_p = tl.where(inside, p / e, NEG_INF)
        block_r = tl.max(score_r, axis=0)
        block_p = tl.max(score_p, axis=0)
        arg_r = tl.where(block_r > best_r, tl.min(tl.where(score_r == block_r, cols, V), axis=0), arg_r)
        arg_p = tl.where(block_p > best_p, tl.min(tl.where(score_p == block_p, cols, V), axis=0), arg_p)
        best_r = tl.maximum(block_r, best_r)
        best_p = tl.maximum(block_p, best_p)
    return tl.where(mass > 0.0, arg_r, arg_p)
