"""Checks of the Triton pooled-acceptance kernel (LANTERN), run by test_pooled.py in a fresh process with
TRITON_INTERPRET=1: it equals `accept_pooled` and keeps the target law at delta = 0."""

import os

import torch

from mmaccel.core.acceptance import accept_pooled
from tests.core.test_speculative import chi2_rejects
from tests.kernels.cases import GRID, chain_case, with_reference


def neighbour_table(g, V, M):
    """[V, M] random neighbours, some rows listing the token itself or ending in -1 padding."""
    table = torch.stack([torch.randperm(V, generator=g)[:M] for _ in range(V)])
    table[torch.rand(V, M, generator=g) < 0.05] = -1
    own = torch.rand(V, generator=g) < 0.1
    table[own, torch.randint(0, M, (V,), generator=g)[own]] = torch.arange(V)[own]
    return table


def equals_the_reference():
    g = torch.Generator().manual_seed(0)
    for B, K, V, M in [(3, 4, 50, 6), (2, 1, 7, 3), (4, 3, 1500, 40), (5, 2, 3, 2), (2, 3, 33, 1)]:
        for dyadic in (True, False):
            for point_mass in (False, True):
                drafts, q, p, u, e = chain_case(g, B, K, V, dyadic)
                q = None if point_mass else q
                table = neighbour_table(g, V, M)
                pooled = p[:, :K].gather(2, table[drafts].clamp_min(0)).cumsum(-1)
                # budgets that the prefix sums hit exactly (the <= edge), none, everything, and random ones
                for delta in (0.0, float(pooled[0, 0, min(1, M - 1)]), 3 * GRID, 0.3):
                    ref, fused = with_reference(accept_pooled, drafts, q, p, u, e, neighbours=table, delta=delta)
                    where = (B, K, V, M, dyadic, point_mass, delta)
                    assert torch.equal(ref.num_accepted, fused.num_accepted), where
                    assert torch.equal(ref.next_token, fused.next_token), where
                    if dyadic:
                        assert torch.equal(ref.deviation, fused.deviation), where
                    else:                       # float32 sums in another order: equal up to rounding
                        torch.testing.assert_close(fused.deviation, ref.deviation, rtol=1e-6, atol=0)
    # pooling makes a difference in these cases: the comparison is not between two no-ops
    drafts, q, p, u, e = chain_case(g, 4, 3, 50, True)
    table = neighbour_table(g, 50, 6)
    os.environ["MMACCEL_KERNELS"] = "triton"
    pooled = accept_pooled(drafts, q, p, u, e, neighbours=table, delta=0.3)
    exact = accept_pooled(drafts, q, p, u, e, neighbours=table, delta=0.0)
    assert pooled.deviation.sum() > 0 and pooled.num_accepted.sum() > exact.num_accepted.sum()


def keeps_the_target_law():
    """At delta = 0 the first emitted token follows p_0 (chi-square at level 0.001, 400 rows); the negative
    control, the same kernel pooling a budget of 0.3 over every other token (chi-square about 1.06 per
    row), must be told apart from p_0 on 150 rows."""
    g = torch.Generator().manual_seed(1)
    B, K, V = 400, 1, 6
    p_row = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05])
    q_row = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.25, 0.25])
    p = p_row.expand(B, K + 1, V).contiguous()
    q = q_row.expand(B, K, V).contiguous()
    drafts = torch.multinomial(q_row, B * K, replacement=True, generator=g).reshape(B, K)
    u = torch.rand(B, K, generator=g)
    e = torch.empty(B, K + 1, V).exponential_(generator=g)
    table = torch.stack([torch.roll(torch.arange(V), -v)[1:] for v in range(V)])     # every other token
    os.environ["MMACCEL_KERNELS"] = "triton"
    for delta, rows, law_kept in ((0.0, B, True), (0.3, 150, False)):
        verdict = accept_pooled(drafts[:rows], q[:rows], p[:rows], u[:rows], e[:rows], neighbours=table, delta=delta)
        first = torch.where(verdict.num_accepted > 0, drafts[:rows, 0], verdict.next_token)
        assert chi2_rejects(first, p_row) != law_kept, f"delta={delta}: the first tokens' law vs the target's"


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1"
    equals_the_reference()
    keeps_the_target_law()
    print("kernel checks passed")
