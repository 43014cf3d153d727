"""Token trees: attention masks and verification of a whole tree in one target pass.

Node 0 is the root (the last emitted token, not yet in the target's cache); every other node has a
parent with a smaller index, so one pass in index order closes the ancestor relation (the EAGLE-2 /
Medusa mask construction, reference video_core.md B.12).

Like the decode loop, the helpers here have a host backend and a device one: on the host they read values
back where that is free (the exact depth of a tree, a per-row walk over child lists); on a GPU they never
do, so a pass does not wait for the host: shapes come from what the host knows (N nodes bound the depth,
so paths are [B, N] there), the sampled walk is N - 1 vectorised steps over the rows, checks are device
asserts (`expect`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from mmaccel.core.model import expect, on_host
from mmaccel.core.sampling import race
from mmaccel.errors import check
from mmaccel.kernels.dispatch import use_triton


@dataclass
class TokenTree:
    tokens: Tensor    # [B, N] node tokens, node 0 = root
    parents: Tensor   # [B, N] parent index per node, -1 for the root; parents[:, i] < i
    _mask: Tensor | None = field(default=None, init=False, repr=False, compare=False)
    _depth: Tensor | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        check(self.tokens.shape == self.parents.shape and self.tokens.dim() == 2,
              f"tree tokens and parents must both be [B, N], got {tuple(self.tokens.shape)} and {tuple(self.parents.shape)}")
        idx = torch.arange(self.parents.shape[1], device=self.parents.device)
        expect(self.parents[:, 0] == -1, "node 0 must be the root (parent -1)")
        expect((self.parents[:, 1:] >= 0) & (self.parents[:, 1:] < idx[1:]),
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
            rows = torch.arange(B, device=self.parents.device)
            for i in range(1, N):
                m[:, i] |= m[rows, self.parents[:, i]]
            self._mask = m
        return self._mask

    def depth(self) -> Tensor:
        """Each node's depth [B, N], the root's 0 (computed once)."""
        if self._depth is None:
            self._depth = self.mask().sum(-1) - 1
        return self._depth

    def max_depth(self) -> int:
        """The width of verification paths less one: on the host the deepest node's depth (a free read),
        on a GPU the bound N - 1 the host knows without waiting (paths are padded with their last node)."""
        return int(self.depth().max()) if on_host(self.parents.device) else self.size - 1


def chain_tree(root: Tensor, drafts: Tensor, lengths: Tensor, alternatives: Tensor) -> tuple[TokenTree, Tensor]:
    """A draft chain plus runner-up siblings of each row's last own draft, as one token tree.

    root [B] (the pending token), drafts [B, K] (a chain; row b's own drafts are its first
    lengths[b], the rest filler), alternatives [B, M] (runner-up tokens for row b's draft at position
    lengths[b] - 1; -1: none). Row b's nodes: 0 the root, 1..L_b its own drafts, then its
    alternatives as siblings of node L_b (children of node L_b - 1), then filler. Filler nodes carry
    token -1, so verification never accepts them (feed them as any valid id). Returns the tree and
    the number of nodes worth computing per row [B] (1 + L_b + its alternatives), on the drafts' device.
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
    return tree, (1 + lengths + n_alt)[:, 0]


def _path_to(mask: Tensor, node: Tensor, max_depth: int) -> tuple[Tensor, Tensor]:
    """Root-to-node paths [B, max_depth + 1] (padded with the node itself) and their lengths [B]."""
    B, N, _ = mask.shape
    on_path = mask[torch.arange(B, device=mask.device), node]          # [B, N] ancestors of node
    length = on_path.sum(-1)
    # ancestors come in increasing index order, so sorting indices by (not on path, index) lists them
    order = torch.where(on_path, torch.arange(N, device=mask.device), N + torch.arange(N, device=mask.device))
    path = order.sort(-1).values[:, : max_depth + 1]
    path = torch.where(path >= N, node[:, None], path)
    return path, length


def verify_tree_greedy(tree: TokenTree, target_logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Greedy tree verification: the deepest node whose whole path matches the target argmax.

    target_logits [B, N, V] are the target's outputs after each node. Returns the accepted path
    [B, D+1] (node indices, root first, padded with its last node; D = `tree.max_depth()`), the number
    of accepted drafts [B] (path length - 1) and the next token [B] (the argmax after the path's last node).
    """
    if use_triton(target_logits):            # the fused kernel (mmaccel.kernels.tree_verify): same outputs
        from mmaccel.kernels.tree_verify import verify_tree_argmax

        return verify_tree_argmax(tree.tokens, tree.parents, target_logits, tree.max_depth())
    B, N = tree.tokens.shape
    pred = target_logits.argmax(-1)                                    # [B, N]
    rows = torch.arange(B, device=pred.device)
    # node i is on an accepted path iff every node on its root path is what the target predicts after its parent
    match = tree.tokens == pred.gather(1, tree.parents.clamp(min=0))
    match[:, 0] = True
    mask = tree.mask()
    ok = ~(mask & ~match[:, None, :]).any(-1)
    depth = tree.depth()
    score = torch.where(ok, depth * N - torch.arange(N, device=pred.device), -1)  # deepest, then first
    best = score.argmax(-1)
    path, length = _path_to(mask, best, tree.max_depth())
    return path, length - 1, pred[rows, best]


def verify_tree_sampled(tree: TokenTree, target_probs: Tensor, uniforms: Tensor,
                        exponentials: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Lossless verification of a tree of point-mass drafts (SpecInfer / EAGLE-2 rule B.1-3).

    At a node, try its children in index order: accept child c with probability r(c) where r is the
    target distribution with earlier-rejected siblings removed and renormalised; if every child is
    rejected, draw the next token from r. This is sequential sampling from p, hence exact. Filler
    children (token -1) are skipped: never accepted, r unchanged.
    uniforms [B, N] (one per node), exponentials [B, N, V] (one per node for the final draw). Returns
    what `verify_tree_greedy` does. The host walks each row over its child lists; a GPU takes the same
    walk for all rows at once (`_walk_nodes`), with the same outputs.
    """
    if use_triton(target_probs):             # the fused kernel (mmaccel.kernels.tree_verify): same outputs
        from mmaccel.kernels.tree_verify import verify_tree

        return verify_tree(tree.tokens, tree.parents, target_probs, uniforms, exponentials, tree.max_depth())
    walk = _walk_rows if on_host(tree.parents.device) and on_host(target_probs.device) else _walk_nodes
    last, nxt = walk(tree, target_probs, uniforms, exponentials)
    path, length = _path_to(tree.mask(), last, tree.max_depth())
    return path, length - 1, nxt


def _walk_rows(tree: TokenTree, target_probs: Tensor, uniforms: Tensor, exponentials: Tensor) -> tuple[Tensor, Tensor]:
    """The rule row by row over child lists read on the host (the reference): the last accepted node and
    the next token, both [B]."""
    B, N = tree.tokens.shape
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
                if total > 0 and uniforms[b, c] * total < r[tok]:
                    node, moved = c, True
                    break
                r[tok] = 0
            if not moved:
                if r.sum() <= 0:
                    r = target_probs[b, node]
                nxt[b] = race(r, exponentials[b, node])
                last[b] = node
                break
    return last.to(tree.tokens.device), nxt.to(tree.tokens.device)


def _walk_nodes(tree: TokenTree, target_probs: Tensor, uniforms: Tensor, exponentials: Tensor) -> tuple[Tensor, Tensor]:
    """The same walk for all rows at once, without reading anything on the host: one step per node in
    index order (a parent comes before its children, so each node's children are met after it, in
    their order; the Triton kernel scans the same way). r [B, V] is the current node's law with its
    rejected children zeroed; a row whose current node is not node c's parent leaves r as it is."""
    B, N = tree.tokens.shape
    dev = target_probs.device
    tokens, parents = tree.tokens.to(dev), tree.parents.to(dev)
    uniforms = uniforms.to(dev)
    rows = torch.arange(B, device=dev)
    node = torch.zeros(B, dtype=torch.long, device=dev)
    r = target_probs[:, 0].clone()
    for c in range(1, N):
        tok = tokens[:, c]
        tried = (parents[:, c] == node) & (tok >= 0)              # filler: never accepted, r unchanged
        tok = tok.clamp(min=0)[:, None]
        r_tok = r.gather(1, tok)[:, 0]
        total = r.sum(-1)
        accept = tried & (total > 0) & (uniforms[:, c] * total < r_tok)
        r.scatter_(1, tok, torch.where(tried & ~accept, 0, r_tok)[:, None])     # a rejected child leaves r
        node = torch.where(accept, c, node)
        r = torch.where(accept[:, None], target_probs[:, c], r)
    r = torch.where(r.sum(-1, keepdim=True) > 0, r, target_probs[rows, node])
    nxt = race(r, exponentials.to(dev)[rows, node])
    return node.to(tree.tokens.device), nxt.to(tree.tokens.device)
