"""Token trees: a draft chain with runner-up siblings, and greedy verification through a sibling."""

import pytest
import torch

from mmaccel.core.tree import TokenTree, chain_tree, verify_tree_greedy, verify_tree_sampled
from mmaccel.errors import InputError


def test_chain_tree_puts_siblings_beside_each_rows_last_own_draft():
    drafts = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]])
    lengths = torch.tensor([2, 4])
    alternatives = torch.tensor([[30, 31], [-1, -1]])
    tree, nodes = chain_tree(torch.tensor([1, 2]), drafts, lengths, alternatives)
    # row 0: root, own drafts 10, 11, siblings of 11 (children of node 1), then filler
    assert tree.tokens[0].tolist() == [1, 10, 11, 30, 31, -1, -1]
    assert tree.parents[0].tolist() == [-1, 0, 1, 1, 1, 4, 5]
    # row 1: a chain that ended on a sure draft has no siblings: its four drafts, then filler
    assert tree.tokens[1].tolist() == [2, 20, 21, 22, 23, -1, -1]
    assert tree.parents[1].tolist() == [-1, 0, 1, 2, 3, 4, 5]
    assert nodes.tolist() == [5, 5]
    assert tree.depth()[0, :5].tolist() == [0, 1, 2, 2, 2]


def _logits(pred: list[list[int]], vocab: int = 64) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(pred), vocab).float()


def test_greedy_verification_accepts_a_sibling_and_never_filler():
    tree, _ = chain_tree(torch.tensor([1]), torch.tensor([[10, 11, 12]]), torch.tensor([2]), torch.tensor([[30, 31]]))
    # the target agrees with draft 10, then wants 31 (the second sibling), then 40 after it
    pred = [[10, 31, 0, 0, 40, 0, 0]]
    path, n, nxt = verify_tree_greedy(tree, _logits(pred))
    assert n.tolist() == [2] and nxt.tolist() == [40]
    assert tree.tokens[0, path[0, 1:3]].tolist() == [10, 31]
    # the filler node holds token -1: a target "wanting" anything there cannot make it accepted
    tree, _ = chain_tree(torch.tensor([1]), torch.tensor([[10, 11, 12]]), torch.tensor([1]), torch.tensor([[-1, -1]]))
    path, n, nxt = verify_tree_greedy(tree, _logits([[10, 11, 12, 0, 0, 0]]))
    assert n.tolist() == [1] and nxt.tolist() == [11]


def test_chain_tree_needs_drafts_and_alternatives():
    with pytest.raises(InputError, match="chain_tree needs"):
        chain_tree(torch.tensor([1]), torch.tensor([[10, 11]]), torch.tensor([2]), torch.zeros(1, 0, dtype=torch.long))


def test_sampled_verification_never_accepts_filler_nor_lets_it_change_the_draw():
    """A filler child (token -1) must be skipped: the bug read r[-1], the last vocabulary entry's
    probability, so a filler node was accepted where the target put its mass on the last id, and a
    rejected filler zeroed that entry of r before the final draw."""
    tree = TokenTree(torch.tensor([[1, -1, 0]]), torch.tensor([[-1, 0, 0]]))
    e = torch.ones(1, 3, 3)
    # all the target mass on the last id: the filler (node 1) is not accepted, the last id is drawn
    p = torch.tensor([[[0.0, 0.0, 1.0]] * 3])
    path, n, nxt = verify_tree_sampled(tree, p, torch.full((1, 3), 0.5), e)
    assert n.tolist() == [0] and nxt.tolist() == [2] and path.tolist() == [[0, 0]]      # padded with the last node
    # some mass on the last id, the filler "rejected" (u = 1), node 2 (token 0) rejected: the draw from
    # r = p without id 0 must still see id 2 (the bug drew id 1 from r with ids 0 and 2 removed)
    p = torch.tensor([[[0.1, 0.4, 0.5]] * 3])
    path, n, nxt = verify_tree_sampled(tree, p, torch.ones(1, 3), e)
    assert n.tolist() == [0] and nxt.tolist() == [2]
    # the greedy and coupled rules (argmax of the logits, of p / E) never accept it either
    path, n, nxt = verify_tree_greedy(tree, p.log())
    assert n.tolist() == [0] and nxt.tolist() == [2]
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        path, n, nxt = verify_tree_greedy(tree, p / torch.empty(1, 3, 3).exponential_(generator=g))
        assert (tree.tokens.gather(1, path)[0, : n + 1] >= 0).all()
