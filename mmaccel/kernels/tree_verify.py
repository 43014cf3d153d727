"""Verification of a whole token tree in one pass per row, sampled and greedy (Triton).

The references are `verify_tree_sampled` and `verify_tree_greedy` in `mmaccel.core.tree`. Nodes are
numbered so that every parent comes before its children, hence one forward scan over the node
indices meets each node's children in index order after the node itself: the walk needs no child
lists.

Sampled (SpecInfer / EAGLE-2 rule, reference video_core.md B.1-3): at the current node try its
children in order; accept child c with probability r(c) / sum(r), r being the node's target
distribution with the earlier-rejected siblings zeroed; after the last accepted node draw from r as
argmax(r / E) (from p where r is empty). The rejected siblings of the current node are kept as a
small vector of tokens (one lane per node), so the sum of r is one masked sweep over the row. A filler
child (token -1) is skipped as in the reference: never accepted, r unchanged.

Greedy: node c is on an accepted path when its parent is and its token is the target's argmax after
the parent; the answer is the deepest such node, the first among equals. The argmax of a row is
swept only for nodes on accepted paths, as their children need it.

Path outputs are [B, N] (root first, padded with the last node); the caller keeps the first
max_depth + 1 columns as the reference does. Sums of a row are float32 in another order than
torch's, so they may differ by rounding. N and V are compile-time constants.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from mmaccel.kernels.race import block_size, residual_race, row_argmax


@triton.jit
def _remaining_mass(row_p, rejected, V: tl.constexpr, BLOCK: tl.constexpr):
    """sum(r): the row with the rejected tokens [NB] zeroed (-1 marks an empty lane)."""
    mass = 0.0
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < V
        p = tl.load(row_p + cols, mask=inside, other=0.0)
        gone = tl.max((cols[:, None] == rejected[None, :]).to(tl.int32), axis=1) > 0
        mass += tl.sum(tl.where(gone, 0.0, p), axis=0)
    return mass


@triton.jit
def _verify_tree_sampled(tokens_ptr, parents_ptr, p_ptr, u_ptr, e_ptr, path_ptr, n_ptr, next_ptr,
                         N: tl.constexpr, V: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    slots = tl.arange(0, NB)
    node = 0
    depth = 0
    path = tl.zeros([NB], dtype=tl.int32)            # path[d]: the accepted node at depth d
    rejected = tl.full([NB], -1, tl.int32)           # lane c: the token of the rejected child c
    for c in range(1, N):
        if tl.load(parents_ptr + b * N + c).to(tl.int32) == node:
            tok = tl.load(tokens_ptr + b * N + c).to(tl.int32)
            real = tok >= 0                          # filler (-1): never accepted, r unchanged
            row_p = p_ptr + (b * N + node) * V
            total = _remaining_mass(row_p, rejected, V, BLOCK)
            r_tok = tl.where(tl.max((rejected == tok).to(tl.int32), axis=0) > 0, 0.0,
                             tl.load(row_p + tl.maximum(tok, 0)))
            accept = real & (total > 0.0) & (tl.load(u_ptr + b * N + c) * total < r_tok)
            node = tl.where(accept, c, node)
            depth += accept.to(tl.int32)
            # lane-wise selections by scalar positions (a scalar bool is not spread over lanes: the interpreter
            # spreads it as float): the accepted child goes to path[depth]; its siblings' lanes are cleared; a
            # rejected real child's token fills lane c (a filler's lane stays empty)
            path = tl.where(slots == tl.where(accept, depth, -1), c, path)
            rejected = tl.where(slots < tl.where(accept, 0, NB),
                                tl.where(slots == tl.where(real, c, -1), tok, rejected), -1)
    row = p_ptr + (b * N + node) * V                # the draw from r: p without the rejected tokens
    token = residual_race(row, row, e_ptr + (b * N + node) * V, rejected, True, V, False, BLOCK, LANES=True)
    tl.store(path_ptr + b * N + slots, tl.where(slots > depth, node, path), mask=slots < N)
    tl.store(n_ptr + b, depth)
    tl.store(next_ptr + b, token)


@triton.jit
def _verify_tree_greedy(tokens_ptr, parents_ptr, logits_ptr, path_ptr, n_ptr, next_ptr,
                        N: tl.constexpr, V: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    slots = tl.arange(0, NB)
    # per node, filled for nodes on accepted paths: the target's argmax after it, its depth, its parent
    pred = tl.where(slots == 0, row_argmax(logits_ptr + b * N * V, logits_ptr, False, V, BLOCK), 0)
    ok = slots == 0
    depth = tl.zeros([NB], dtype=tl.int32)
    parent_of = tl.full([NB], -1, tl.int32)
    best = 0
    best_depth = 0
    for c in range(1, N):
        parent = tl.load(parents_ptr + b * N + c).to(tl.int32)
        tok = tl.load(tokens_ptr + b * N + c).to(tl.int32)
        at_parent = slots == parent
        parent_ok = tl.max((at_parent & ok).to(tl.int32), axis=0) > 0
        if parent_ok & (tok == tl.sum(tl.where(at_parent, pred, 0), axis=0)):
            d = tl.sum(tl.where(at_parent, depth, 0), axis=0) + 1
            here = slots == c
            ok = ok | here
            depth = tl.where(here, d, depth)
            parent_of = tl.where(here, parent, parent_of)
            pred = tl.where(here, row_argmax(logits_ptr + (b * N + c) * V, logits_ptr, False, V, BLOCK), pred)
            deeper = d > best_depth
            best = tl.where(deeper, c, best)
            best_depth = tl.where(deeper, d, best_depth)
    path = tl.zeros([NB], dtype=tl.int32) + best
    node = best
    while node >= 0:                                 # up from the best node: each ancestor at its depth
        here = slots == node
        path = tl.where(slots == tl.sum(tl.where(here, depth, 0), axis=0), node, path)
        node = tl.sum(tl.where(here, parent_of, 0), axis=0)
    tl.store(path_ptr + b * N + slots, path, mask=slots < N)
    tl.store(n_ptr + b, best_depth)
    tl.store(next_ptr + b, tl.sum(tl.where(slots == best, pred, 0), axis=0))


def verify_tree(tokens: Tensor, parents: Tensor, target_probs: Tensor, uniforms: Tensor, exponentials: Tensor,
                max_depth: int) -> tuple[Tensor, Tensor, Tensor]:
    """Lossless tree verification: (accepted path [B, max_depth + 1], accepted drafts [B], next token [B]),
    on the reference's devices. tokens and parents [B, N] (a TokenTree's), target_probs and exponentials
    [B, N, V], uniforms [B, N]."""
    B, N = tokens.shape
    V = target_probs.shape[-1]
    p = target_probs.float().contiguous()
    path, n, nxt, nb = _outputs(B, N, p.device)
    _verify_tree_sampled[(B,)](tokens.to(p.device).contiguous(), parents.to(p.device).contiguous(), p,
                               uniforms.to(p.device, torch.float32).contiguous(),
                               exponentials.to(p.device, torch.float32).contiguous(), path, n, nxt, N, V, nb,
                               BLOCK=_lanes_block(V, nb))
    return path[:, : max_depth + 1].to(parents.device), n.to(parents.device), nxt.to(tokens.device)


def verify_tree_argmax(tokens: Tensor, parents: Tensor, target_logits: Tensor,
                       max_depth: int) -> tuple[Tensor, Tensor, Tensor]:
    """Greedy tree verification: (accepted path [B, max_depth + 1], accepted drafts [B], next token [B]).
    tokens and parents [B, N], target_logits [B, N, V] (or any monotone transform of them)."""
    B, N = tokens.shape
    V = target_logits.shape[-1]
    logits = target_logits.float().contiguous()
    path, n, nxt, nb = _outputs(B, N, logits.device)
    _verify_tree_greedy[(B,)](tokens.to(logits.device).contiguous(), parents.to(logits.device).contiguous(), logits,
                              path, n, nxt, N, V, nb, BLOCK=block_size(V))
    return path[:, : max_depth + 1].to(parents.device), n.to(parents.device), nxt


def _outputs(B: int, N: int, device) -> tuple[Tensor, Tensor, Tensor, int]:
    return (torch.empty(B, N, dtype=torch.int64, device=device), torch.empty(B, dtype=torch.int64, device=device),
            torch.empty(B, dtype=torch.int64, device=device), triton.next_power_of_2(N))


def _lanes_block(V: int, nb: int) -> int:
    """Columns per sweep step when each column is compared with nb rejected-token lanes: about 16k pairs."""
    return min(block_size(V), max(16, 16384 // nb))
