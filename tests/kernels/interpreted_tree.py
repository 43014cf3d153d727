"""Checks of the Triton token-tree kernels, run by test_tree.py in a fresh process with TRITON_INTERPRET=1:
the ancestor mask, greedy and sampled tree verification equal their references (`TokenTree.mask`,
`verify_tree_greedy`, `verify_tree_sampled`), neither accepts a filler node, and sampled verification keeps the
target law."""

import os

import torch

from mmaccel.core.tree import TokenTree, verify_tree_greedy, verify_tree_sampled
from tests.core.test_speculative import chi2_rejects
from tests.kernels.cases import laws, random_tree, with_reference

SHAPES = [(3, 7, 50), (2, 1, 7), (4, 13, 1500), (5, 9, 3), (2, 16, 33)]      # (B, N nodes, V)


def equals_the_reference():
    g = torch.Generator().manual_seed(0)
    for B, N, V in SHAPES:
        for dyadic, ragged in ((True, False), (False, False), (True, True)):
            p = laws(g, (B, N, V), dyadic)
            tree = random_tree(g, p, ragged=ragged)
            u, e = torch.rand(B, N, generator=g), torch.empty(B, N, V).exponential_(generator=g)
            os.environ["MMACCEL_KERNELS"] = "torch"
            mask = TokenTree(tree.tokens, tree.parents).mask()
            os.environ["MMACCEL_KERNELS"] = "triton"
            assert torch.equal(mask, TokenTree(tree.tokens, tree.parents).mask()), (B, N, V)
            where = (B, N, V, dyadic, ragged)
            ref, fused = with_reference(verify_tree_sampled, tree, p, u, e)
            assert all(torch.equal(a, b) for a, b in zip(ref, fused)), (where, ref, fused)
            # greedy on logits with ties (coarse) and on the coupled scores p / E
            logits = (torch.randn(B, N, V, generator=g) * 4).round() if dyadic else p / e
            ref, fused = with_reference(verify_tree_greedy, tree, logits)
            assert all(torch.equal(a, b) for a, b in zip(ref, fused)), (where, ref, fused)


def greedy_prefers_the_deeper_duplicate():
    """Two siblings carry the target's token; only the second has a matching child: its path wins."""
    tree = TokenTree(torch.tensor([[9, 5, 5, 7, 4]]), torch.tensor([[-1, 0, 0, 1, 2]]))
    logits = torch.nn.functional.one_hot(torch.tensor([[5, 6, 4, 1, 2]]), 10).float()
    ref, fused = with_reference(verify_tree_greedy, tree, logits)
    assert ref[0].tolist() == [[0, 2, 4]] and ref[1].tolist() == [2] and ref[2].tolist() == [2]
    assert all(torch.equal(a, b) for a, b in zip(ref, fused))


def never_accepts_filler():
    """A filler child (token -1) is skipped by both: the kernel once read the last column for it, so a
    filler was accepted where the target put its mass on the last id, and a rejected one zeroed that
    column before the final draw (the reference had the same flaw through r[-1])."""
    tree = TokenTree(torch.tensor([[1, -1, 0], [1, -1, 0]]), torch.tensor([[-1, 0, 0], [-1, 0, 0]]))
    p = torch.tensor([[[0.0, 0.0, 1.0]] * 3, [[0.1, 0.4, 0.5]] * 3])
    u = torch.tensor([[0.5] * 3, [1.0] * 3])
    ref, fused = with_reference(verify_tree_sampled, tree, p, u, torch.ones(2, 3, 3))
    for path, n, nxt in (ref, fused):
        assert n.tolist() == [0, 0] and nxt.tolist() == [2, 2] and path[:, 0].tolist() == [0, 0], (ref, fused)
    ref, fused = with_reference(verify_tree_greedy, tree, p.log())
    for _path, n, nxt in (ref, fused):
        assert n.tolist() == [0, 0] and nxt.tolist() == [2, 2], (ref, fused)


def rejects_a_child_without_target_mass_at_u_zero():
    tree = TokenTree(torch.tensor([[1, 0]]), torch.tensor([[-1, 0]]))
    p = torch.tensor([[[0.0, 0.0, 1.0]] * 2])
    ref, fused = with_reference(verify_tree_sampled, tree, p, torch.zeros(1, 2), torch.ones(1, 2, 3))
    for _path, n, nxt in (ref, fused):
        assert n.tolist() == [0] and nxt.tolist() == [2], (ref, fused)


def keeps_the_target_law():
    """Root children tokens 0 and 1 (nodes 1, 2), each with a child of its own. The first emitted token
    follows p_root, and the second, after node 1 or node 2 was accepted, follows that node's law
    (chi-square at level 0.001; 300 rows, about 120 after each node). Negative controls: the law of the
    classic bug of accepting the second sibling with p(c) instead of p(c) / (1 - p(first sibling))
    (chi-square about 0.33 per row), and the other node's law (about 0.7 per row)."""
    g = torch.Generator().manual_seed(1)
    B, V = 300, 5
    p_root = torch.tensor([0.5, 0.4, 0.05, 0.03, 0.02])
    p_1 = torch.tensor([0.1, 0.2, 0.3, 0.25, 0.15])
    p_2 = torch.tensor([0.3, 0.1, 0.1, 0.2, 0.3])
    tokens = torch.tensor([0, 0, 1, 2, 0]).expand(B, -1)
    parents = torch.tensor([-1, 0, 0, 1, 2]).expand(B, -1)
    p = torch.stack([p_root, p_1, p_2, p_root, p_root]).expand(B, -1, -1).contiguous()
    u = torch.rand(B, 5, generator=g)
    e = torch.empty(B, 5, V).exponential_(generator=g)
    os.environ["MMACCEL_KERNELS"] = "triton"
    path, n, nxt = verify_tree_sampled(TokenTree(tokens, parents), p, u, e)
    emitted = torch.cat([tokens.gather(1, path), nxt[:, None]], 1)      # accepted path tokens (root first), next
    first = torch.where(n >= 1, emitted[:, 1], nxt)
    second = torch.where(n >= 2, emitted[:, 2], nxt)
    unnormalised = torch.tensor([0.5, 0.5 * 0.4, 0, 0, 0])
    unnormalised[2:] = (1 - unnormalised.sum()) * p_root[2:] / p_root[2:].sum()
    assert not chi2_rejects(first, p_root), "the first tokens do not follow the target law"
    assert chi2_rejects(first, unnormalised), "negative control: the test cannot tell the unnormalised rule"
    for node, law, other in ((1, p_1, p_2), (2, p_2, p_1)):
        after = second[(n >= 1) & (path[:, 1] == node)]
        assert not chi2_rejects(after, law), f"the tokens after node {node} do not follow its law"
        assert chi2_rejects(after, other), f"negative control: the test cannot tell node {node}'s law from another"


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1"
    greedy_prefers_the_deeper_duplicate()
    never_accepts_filler()
    rejects_a_child_without_target_mass_at_u_zero()
    equals_the_reference()
    keeps_the_target_law()
    print("kernel checks passed")
