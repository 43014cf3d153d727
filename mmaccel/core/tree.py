"""Token trees: attention masks and verification of a whole tree in one target pass.

Node 0 is the root (the last emitted token, not yet in the target's cache); every other node has a
parent with a smaller index, so one pass in index order closes the ancestor relation (the EAGLE-2 /
Medusa mask construction, reference video_core.md B.12).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from mmaccel.core.sampling import race
from mmaccel.errors import check
from mmaccel.kernels.dispatch import use_triton


@dataclass
class TokenTree:
    tokens: Tensor    # [B, N] node tokens, node 0 = root
    parents: Tensor   # [B, N] parent index per node, -1 for the root; parents[:, i] < i
    _mask: Tensor | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        check(self.tokens.shape == self.parents.shape and self.tokens.dim() == 2,
              f"tree tokens and parents must both be [B, N], got {tuple(self.tokens.shape)} and {tuple(self.parents.shape)}")
        idx = torch.arange(self.parents.shape[1], device=self.parents.device)
        check(bool((self.parents[:, 0] == -1).all()), "node 0 must be the root (parent -1)")
        check(bool((self.parents[:, 1:] >= 0).all() and (self.parents[:, 1:] < idx[1:]).all()),
              "every non-root node needs a parent with a smaller index")

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    def mask(self) -> Tensor:
        """Ancestor-or-self mask [B, N, N]: node i may attend to node j (computed once)."""
        if self._mask is None and use_triton(self.parents):    # the fused kernel (mmaccel.kernels.tree_mask)
            from mmaccel.kernels.tree_mask import ancestor_mask

            self._mask = ancestor_mask(self.parents)
        if self._mask is None:
            B, N = self.parents.shape
            m = torch.eye(N, dtype=torch.bool, device=self.parents.device).expand(B, N, N).clone()
            for i in range(1, N):
                m[:, i] |= m[torch.arange(B), self.parents[:, i]]
            self._mask = m
        return self._mask

    def depth(self) -> Tensor:
        return self.mask().sum(-1) - 1


def chain_tree(root: Tensor, drafts: Tensor, lengths: Tensor, alternatives: Tensor) -> tuple[TokenTree, Tensor]:
    """A draft chain plus runner-up siblings of each row's last own draft, as one token tree.

    root [B] (the pending token), drafts [B, K] (a chain; row b's own drafts are its first
    lengths[b], the rest filler), alternatives [B, M] (runner-up tokens for row b's draft at position
    lengths[b] - 1; -1: none). Row b's nodes: 0 the root, 1..L_b its own drafts, then its
    alternatives as siblings of node L_b (children of node L_b - 1), then filler. Filler nodes carry
    token -1, so verification never accepts them (feed them as any valid id). Returns the tree and
    the number of nodes worth computing per row [B] (1 + L_b + its alternatives).
    """
    B, K = drafts.shape
    M = alternatives.shape[1]
    check(K >= 1 and M >= 1 and alternatives.shape[0] == B, f"chain_tree needs drafts [B, K >= 1] and alternatives "
          f"[B, M >= 1], got {tuple(drafts.shape)} and {tuple(alternatives.shape)}")
    lengths = lengths.to(drafts.device)[:, None]
    alternatives = alternatives.to(drafts.device)
    n_alt = (alternatives >= 0).sum(-1, keepdim=True)            # valid alternatives come first
    N = 1 + K + M
    node = torch.arange(1, N, device=drafts.device)[None, :]      # [1, N - 1]
    own = node <= lengths
    sibling = (node > lengths) & (node <= lengths + n_alt)
    chain_at = (node - 1).clamp(max=K - 1).expand(B, -1)
    alt_at = (node - 1 - lengths).clamp(0, M - 1)
    tokens = torch.where(own, drafts.gather(1, chain_at), torch.where(sibling, alternatives.gather(1, alt_at), -1))
    parents = torch.where(sibling, lengths - 1, node - 1)
    tree = TokenTree(torch.cat([root[:, None], tokens], 1), torch.cat([torch.full((B, 1), -1, device=drafts.device), parents], 1))
    return tree, (1 + lengths + n_alt)[:, 0].cpu()


def _path_to(mask: Tensor, node: Tensor, max_depth: int) -> tuple[Tensor, Tensor]:
    """Root-to-node paths [B, max_depth + 1] (padded with the node itself) and their lengths [B]."""
    B, N, _ = mask.shape
    on_path = mask[torch.arange(B), node]                              # [B, N] ancestors of node
    length = on_path.sum(-1)
    # ancestors come in increasing index order, so sorting indices by (not on path, index) lists them
    order = torch.where(on_path, torch.arange(N, device=mask.device), N + torch.arange(N, device=mask.device))
    path = order.sort(-1).values[:, : max_depth + 1]
    path = torch.where(path >= N, node[:, None], path)
    return path, length


def verify_tree_greedy(tree: TokenTree, target_logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Greedy tree verification: the deepest node whose whole path matches the target argmax.

    target_logits [B, N, V] are the target's outputs after each node. Returns the accepted path
    [B, D+1] (node indices, root first, padded), the number of accepted drafts [B] (path length - 1)
    and the next token [B] (the argmax after the path's last node).
    """
    if use_triton(target_logits):            # the fused kernel (mmaccel.kernels.tree_verify): same outputs
        from mmaccel.kernels.tree_verify import verify_tree_argmax

        return verify_tree_argmax(tree.tokens, tree.parents, target_logits, int(tree.depth().max()))
    B, N = tree.tokens.shape
    pred = target_logits.argmax(-1)                                    # [B, N]
    rows = torch.arange(B, device=pred.device)
    # node i is on an accepted path iff every node on its root path is what the target predicts after its parent
    match = tree.tokens == pred.gather(1, tree.parents.clamp(min=0))
    match[:, 0] = True
    mask = tree.mask()
    ok = ~(mask & ~match[:, None, :]).any(-1)
    depth = mask.sum(-1) - 1
    score = torch.where(ok, depth * N - torch.arange(N, device=pred.device), -1)  # deepest, then first
    best = score.argmax(-1)
    path, length = _path_to(mask, best, int(depth.max()))
    return path, length - 1, pred[rows, best]


def verify_tree_sampled(tree: TokenTree, target_probs: Tensor, uniforms: Tensor,
                        exponentials: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Lossless verification of a tree of point-mass drafts (SpecInfer / EAGLE-2 rule B.1-3).

    At a node, try its children in index order: accept child c with probability r(c) where r is the
    target distribution with earlier-rejected siblings removed and renormalised; if every child is
    rejected, draw the next token from r. This is sequential sampling from p, hence exact. Filler
    children (token -1) are skipped: never accepted, r unchanged.
    uniforms [B, N] (one per node), exponentials [B, N, V] (one per node for the final draw).
    """
    if use_triton(target_probs):             # the fused kernel (mmaccel.kernels.tree_verify): same outputs
        from mmaccel.kernels.tree_verify import verify_tree

        return verify_tree(tree.tokens, tree.parents, target_probs, uniforms, exponentials, int(tree.depth().max()))
    B, N = tree.tokens.shape
    mask = tree.mask()
    max_depth = int((mask.sum(-1) - 1).max())
    children = [[[] for _ in range(N)] for _ in range(B)]
    parents = tree.parents.tolist()
    for b in range(B):
        for i in range(1, N):
            children[b][parents[b][i]].append(i)
    last = torch.zeros(B, dtype=torch.long)
    nxt = torch.zeros(B, dtype=torch.long)
    tokens = tree.tokens.tolist()
    for b in range(B):
        node = 0
        while True:
            r = target_probs[b, node].clone()
            moved = False
            for c in children[b][node]:
                tok = tokens[b][c]
                if tok < 0:         # filler: never accepted, and r[-1] would be the last id's mass
                    continue
                total = r.sum()
                if total > 0 and uniforms[b, c] * total <= r[tok]:
                    node, moved = c, True
                    break
                r[tok] = 0
            if not moved:
                if r.sum() <= 0:
                    r = target_probs[b, node]
                nxt[b] = race(r, exponentials[b, node])
                last[b] = node
                break
    last = last.to(tree.tokens.device)
    path, length = _path_to(mask, last, max_depth)
    return path, length - 1, nxt.to(tree.tokens.device)
