"""Token trees: a draft chain with runner-up siblings, greedy verification through a sibling, filler never
accepted, and the device backend (vectorised walk, no host reads) equal to the host's."""

import pytest
import torch

from mmaccel.core import tree as tree_module
from mmaccel.core.proposers import HeadsProposer, MedusaHead
from mmaccel.core.sampling import Sampling
from mmaccel.core.speculative import LoopConfig, decode
from mmaccel.core.tree import TokenTree, chain_tree, verify_tree_greedy, verify_tree_sampled
from mmaccel.errors import InputError
from mmaccel.lm.hf import HFCausalLM
from tests.conftest import tiny_llama
from tests.emulated_cuda import emulated_cuda, on_host
from tests.kernels.cases import laws, random_tree


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


def test_sampled_verification_rejects_a_child_without_target_mass_at_u_zero():
    tree = TokenTree(torch.tensor([[1, 0]]), torch.tensor([[-1, 0]]))
    p = torch.tensor([[[0.0, 0.0, 1.0]] * 2])                       # the child's token 0 has no mass
    path, n, nxt = verify_tree_sampled(tree, p, torch.zeros(1, 2), torch.ones(1, 2, 3))
    assert n.tolist() == [0] and nxt.tolist() == [2]


# (B, N nodes, V): a lone root, a binary-ish tree, a large vocabulary, V smaller than N, a deep one
SHAPES = [(2, 1, 7), (3, 7, 50), (4, 13, 1500), (5, 9, 3), (3, 24, 33)]


def _cases():
    """Random trees (repeated sibling tokens, filler nodes, ragged rows) with laws, uniforms and exponentials:
    dyadic laws with exact ties, continuous ones, float64 ones, and target laws with empty rows."""
    g = torch.Generator().manual_seed(0)
    for B, N, V in SHAPES:
        for dyadic, ragged, dtype in ((True, False, torch.float32), (False, True, torch.float32),
                                      (True, True, torch.float32), (False, False, torch.float64)):
            for _ in range(4):
                p = laws(g, (B, N, V), dyadic)
                tree = random_tree(g, p, filler=0.2, ragged=ragged)
                if dyadic and ragged:       # a point mass at some nodes: its child is accepted or r empties
                    p = torch.where(torch.rand(B, N, 1, generator=g) < 0.3,
                                    torch.nn.functional.one_hot(tree.tokens.clamp(min=0), V).float(), p)
                u = torch.rand(B, N, generator=g, dtype=dtype)
                yield (B, N, V, dyadic, ragged), tree, p.to(dtype), u, torch.empty(B, N, V).exponential_(generator=g)


def test_the_device_walk_equals_the_host_walk():
    """The vectorised walk (one step per node over all rows, the GPU backend) gives the same last node and
    next token as the per-row walk over child lists (the host backend) for the same noise."""
    for where, tree, p, u, e in _cases():
        host = tree_module._walk_rows(tree, p, u, e)
        device = tree_module._walk_nodes(tree, p, u, e)
        assert all(torch.equal(a, b) for a, b in zip(host, device)), (where, host, device)


def test_tree_verification_reads_nothing_back_on_a_gpu():
    """On the emulated CUDA device, building a tree (checks included), its mask and depths, chain_tree and
    greedy, coupled and sampled verification read nothing back and upload nothing; the outputs equal the
    CPU's (paths there are [B, N]: the CPU's columns, then the last node repeated)."""
    for where, tree, p, u, e in _cases():
        B, N, V = where[:3]
        expected = (verify_tree_greedy(tree, p.log()), verify_tree_greedy(tree, p / e),
                    verify_tree_sampled(tree, p, u, e))
        with emulated_cuda() as report:
            on = [x.to("cuda") for x in (tree.tokens, tree.parents, p, u, e)]
            report.uploads = 0
            tree_d = TokenTree(on[0], on[1])
            depth = tree_d.depth()
            got = (verify_tree_greedy(tree_d, on[2].log()), verify_tree_greedy(tree_d, on[2] / on[4]),
                   verify_tree_sampled(tree_d, *on[2:]))
            assert not report.syncs and not report.uploads, (where, report.kinds(), report.uploads)
        assert torch.equal(on_host(depth), tree.depth())
        for (path, n, nxt), (path_d, n_d, nxt_d) in zip(expected, on_host(got)):
            assert path_d.shape == (B, N) and torch.equal(n_d, n) and torch.equal(nxt_d, nxt), where
            W = path.shape[1]
            assert torch.equal(path_d[:, :W], path) and (path_d[:, W:] == path[:, -1:]).all(), where


def test_chain_tree_reads_nothing_back_on_a_gpu():
    drafts, lengths, alternatives = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]]), torch.tensor([2, 4]), \
        torch.tensor([[30, 31], [-1, -1]])
    tree, nodes = chain_tree(torch.tensor([1, 2]), drafts, lengths, alternatives)
    with emulated_cuda() as report:
        on = [x.to("cuda") for x in (torch.tensor([1, 2]), drafts, lengths, alternatives)]
        report.uploads = 0
        tree_d, nodes_d = chain_tree(*on)
        mask = tree_d.mask()
        assert not report.syncs and not report.uploads, (report.kinds(), report.uploads)
    assert nodes_d.is_cuda and torch.equal(on_host(nodes_d), nodes)
    assert torch.equal(on_host(tree_d.tokens), tree.tokens) and torch.equal(on_host(mask), tree.mask())


def test_a_malformed_tree_fails_on_the_device_too():
    """The constructor's checks are device asserts there: they still fail (at the next synchronisation)."""
    with emulated_cuda(), pytest.raises(RuntimeError, match="parent with a smaller index"):
        TokenTree(torch.tensor([[1, 2, 3]], device="cuda"), torch.tensor([[-1, 2, 0]], device="cuda"))
    with pytest.raises(InputError, match="node 0 must be the root"):
        TokenTree(torch.tensor([[1, 2]]), torch.tensor([[0, 0]]))


@pytest.fixture(scope="module")
def medusa_models():
    """A tiny LM on the CPU and on the emulated device, with Medusa heads that read out through the LM's own
    vocabulary matrix (so their top-16 often holds the next token and trees get accepted)."""
    cpu = HFCausalLM(tiny_llama(0, layers=3))
    heads = torch.nn.ModuleList(MedusaHead(64, 97) for _ in range(2))
    with torch.no_grad():
        for head in heads:
            head.proj.weight.copy_(cpu.hf.lm_head.weight)
    with emulated_cuda():
        cuda = HFCausalLM(tiny_llama(0, layers=3).to("cuda"))
        heads_on = torch.nn.ModuleList(MedusaHead(64, 97) for _ in range(2))
        heads_on.load_state_dict(heads.state_dict())
        heads_on = heads_on.to("cuda")
    return (cpu, heads), (cuda, heads_on)


@pytest.mark.parametrize("rule, temperature", [("greedy", 0.0), ("speculative", 1.0), ("coupled", 1.0)])
def test_tree_decoding_never_waits_for_the_host(medusa_models, rule, temperature):
    """The decode loop's tree branch (propose a tree, verify it, keep the accepted path in the cache, emit)
    on the emulated device, with a proposer that keeps nothing on the host (Medusa heads): what it reads
    back and uploads does not grow from 8 to 24 tokens, and the tokens equal the CPU's."""
    prompts, seen = [[3, 4, 5, 6, 7], [8, 9, 10]], []

    def run(models, n):
        model, heads = models
        config = LoopConfig(HeadsProposer(heads), rule, 0, (2, 16), coupled=rule == "coupled")
        return decode(model, prompts, config, max_new_tokens=n, sampling=Sampling(temperature=temperature))

    for n in (8, 24):
        expected = run(medusa_models[0], n)
        with emulated_cuda() as report:
            out = run(medusa_models[1], n)
        assert out.tokens == expected.tokens
        seen.append((report.kinds(), report.uploads))
    assert out.stats.nfe < 24, "no tree was accepted: the test would not see the accepted paths' bookkeeping"
    assert seen[0] == seen[1], seen
