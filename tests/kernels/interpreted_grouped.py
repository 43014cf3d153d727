"""Checks of the Triton GSD grouped-acceptance kernels, run by test_grouped.py in a fresh process with
TRITON_INTERPRET=1: they equal `accept_grouped` and `accept_grouped_coupled`, deviation included,
through ties in the target's order (coarse laws), windows past either end of it and empty groups."""

import os

import torch

from mmaccel.core.acceptance import accept_grouped, accept_grouped_coupled
from tests.kernels.cases import chain_case, with_reference

SHAPES = [(3, 4, 50), (2, 1, 7), (4, 3, 1500), (5, 2, 3), (2, 3, 33)]
# (p_threshold, d_threshold quantile, half_window): groups of every size, and the empty group; the coarse
# laws meet the first and the fourth, where |Δp| and the distances hit the thresholds exactly (the < edge)
SETTINGS = [(0.15, 0.5, 7), (1.0, 1.0, 3), (2e-3, 0.3, 2), (3 * 2.0 ** -8, 0.6, 5), (0.0, 0.5, 4), (0.5, 0.0, 4),
            (1.0, 0.5, 0)]


def coarse(p, step):
    """p rounded down to multiples of `step`: many tokens tie, so the stable order by index matters."""
    return (p / step).floor() * step


def latent_distances(g, V):
    latents = torch.randn(V, 4, generator=g)
    return torch.cdist(latents, latents).pow(2)


def near_drafts(g, p, e, reach=3):
    """Drafts near the coupled target sample: that sample itself, or a token a few ranks away from it."""
    B, K1, V = p.shape
    order = torch.sort(p[:, :-1], dim=-1, descending=True, stable=True).indices
    rank = torch.argsort(order, dim=-1)
    y = (p[:, :-1] / e[:, :-1]).argmax(-1, keepdim=True)
    slot = (rank.gather(-1, y) + torch.randint(-reach, reach + 1, y.shape, generator=g)).clamp(0, V - 1)
    return order.gather(-1, slot).squeeze(-1)


def check(ref, fused, dyadic, where):
    assert torch.equal(ref.num_accepted, fused.num_accepted), where
    assert torch.equal(ref.next_token, fused.next_token), where
    if dyadic:
        assert torch.equal(ref.deviation, fused.deviation), where
    else:                               # float32 sums in another order: equal up to rounding
        torch.testing.assert_close(fused.deviation, ref.deviation, rtol=1e-6, atol=0)


def equals_the_reference():
    g = torch.Generator().manual_seed(0)
    grouped_somewhere = swapped_somewhere = False
    for B, K, V in SHAPES:
        distances = latent_distances(g, V)
        # each law kind meets a third of the settings, so every shape meets every setting once
        for i, (dyadic, step) in enumerate(((True, 2.0 ** -8), (True, None), (False, None))):
            drafts, q, p, u, e = chain_case(g, B, K, V, dyadic)
            p = p if step is None else coarse(p, step)
            near = near_drafts(g, p, e)
            for j, (p_threshold, quantile, half_window) in enumerate(SETTINGS[i::3]):
                d_threshold = float(distances.quantile(quantile, interpolation="lower"))     # one of the distances
                rule = dict(distances=distances, p_threshold=p_threshold, d_threshold=d_threshold,
                            half_window=half_window)
                point_mass = j == 1
                where = (B, K, V, dyadic, step, p_threshold, quantile, half_window, point_mass)
                ref, fused = with_reference(accept_grouped, drafts, None if point_mass else q, p, u, e, **rule)
                check(ref, fused, dyadic, where)
                grouped_somewhere |= bool(ref.deviation.sum() > 0)
                ref, fused = with_reference(accept_grouped_coupled, near, None, p, None, e, **rule)
                check(ref, fused, True, where + ("coupled",))
                swapped_somewhere |= bool(ref.deviation.sum() > 0)
    assert grouped_somewhere and swapped_somewhere, "the cases never formed a group: the comparison is vacuous"


def thresholds_are_strict():
    """Hand-made rows at the edges: a neighbour with |Δp| = p_threshold, or at distance d_threshold, stays out
    of the group (the draft is rejected); a hair more of either threshold takes it in (the draft is kept).
    Row 0's edge neighbour comes after the draft in the order, row 1's before it."""
    p = torch.tensor([[[0.5, 0.25, 0.125, 0.0625, 0.0625], [0.2] * 5],
                      [[0.375, 0.25, 0.0625, 0.0625, 0.0625], [0.2] * 5]])       # [B = 2, K + 1 = 2, V = 5]
    e = torch.ones(2, 2, 5)
    drafts, u = torch.tensor([[1], [1]]), torch.tensor([[0.3], [0.3]])   # p(x) = 0.25 < u; the edge one lifts it
    distances = torch.full((5, 5), 0.5)
    for p_threshold, d_threshold, kept in ((0.125, 1.0, 0), (0.126, 1.0, 1), (0.2, 0.5, 0), (0.2, 0.51, 1)):
        rule = dict(distances=distances, p_threshold=p_threshold, d_threshold=d_threshold, half_window=1)
        ref, fused = with_reference(accept_grouped, drafts, None, p, u, e, **rule)
        assert ref.num_accepted.tolist() == [kept, kept], (p_threshold, d_threshold)
        check(ref, fused, True, (p_threshold, d_threshold))
        # coupled, row 0: the target's own samples are token 0 at both positions (ties of p / E go to the
        # first index); the draft 1 is its neighbour with |Δp| = 0.25
        coupled = dict(rule, p_threshold=p_threshold + 0.125)
        ref, fused = with_reference(accept_grouped_coupled, drafts[:1], None, p[:1], None, e[:1], **coupled)
        assert ref.num_accepted.tolist() == [kept] and ref.next_token.tolist() == [0]
        check(ref, fused, True, (p_threshold, d_threshold, "coupled"))


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1"
    thresholds_are_strict()
    equals_the_reference()
    print("kernel checks passed")
