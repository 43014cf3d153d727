"""Checks of the Triton speculative-verification kernel, run by test_speculative.py in a fresh process
with TRITON_INTERPRET=1 (the interpreter must be chosen before Triton is imported): on a CPU the kernel
runs through Triton's interpreter, on the same code path a GPU compiles."""

import os

import torch

from mmaccel.core.acceptance import accept_speculative
from mmaccel.kernels.speculative import verify_chain
from tests.core.test_speculative import chi2_rejects


def random_case(g, B, K, V):
    p = torch.rand(B, K + 1, V, generator=g).pow(3)
    p /= p.sum(-1, keepdim=True)
    q = torch.rand(B, K, V, generator=g).pow(3)
    q /= q.sum(-1, keepdim=True)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, K)
    return drafts, q, p, torch.rand(B, K, generator=g), torch.empty(B, K + 1, V).exponential_(generator=g)


def equals_the_reference():
    g = torch.Generator().manual_seed(0)
    for B, K, V in [(3, 4, 50), (2, 1, 7), (4, 3, 1500), (2, 5, 33), (5, 2, 3)]:
        for point_mass in (False, True):
            for _ in range(3):
                drafts, q, p, u, e = random_case(g, B, K, V)
                q = None if point_mass else q
                os.environ["MMACCEL_KERNELS"] = "torch"
                ref = accept_speculative(drafts, q, p, u, e)
                n, nxt = verify_chain(drafts, q, p, u, e)
                assert torch.equal(ref.num_accepted, n) and torch.equal(ref.next_token, nxt), (B, K, V, point_mass)
                os.environ["MMACCEL_KERNELS"] = "triton"                 # the dispatcher takes the kernel
                via_rule = accept_speculative(drafts, q, p, u, e)
                assert torch.equal(via_rule.next_token, nxt) and torch.equal(via_rule.num_accepted, n)


def rejects_a_draft_without_target_mass_at_u_zero():
    drafts = torch.tensor([[0, 1]])
    q = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]]])
    p = torch.tensor([[[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]])
    n, nxt = verify_chain(drafts, q, p, torch.zeros(1, 2), torch.ones(1, 3, 3))
    assert n.tolist() == [0] and nxt.tolist() == [2], (n, nxt)


def keeps_the_target_law():
    """The first emitted token of many rows (a kept draft, or the correction at position 0) follows p_0,
    not the draft's q_0: chi-square at level 0.001 on 600 rows, and the negative control against q_0
    (chi-square about 1.8 per row) must fail."""
    g = torch.Generator().manual_seed(1)
    B, K, V = 600, 2, 6
    p_row = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05])
    q_row = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.25, 0.25])
    p = p_row.expand(B, K + 1, V).contiguous()
    q = q_row.expand(B, K, V).contiguous()
    drafts = torch.multinomial(q_row, B * K, replacement=True, generator=g).reshape(B, K)
    u = torch.rand(B, K, generator=g)
    e = torch.empty(B, K + 1, V).exponential_(generator=g)
    n, nxt = verify_chain(drafts, q, p, u, e)
    first = torch.where(n > 0, drafts[:, 0], nxt)
    assert not chi2_rejects(first, p_row), "the kernel's tokens do not follow the target law"
    assert chi2_rejects(first, q_row), "negative control: the test cannot tell the draft law from the target's"


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1"
    equals_the_reference()
    rejects_a_draft_without_target_mass_at_u_zero()
    keeps_the_target_law()
    print("kernel checks passed")
