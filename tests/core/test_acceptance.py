"""Acceptance rules: deterministic cases, distribution tests with a negative control, theory."""

import pytest
import torch

from mmaccel.core.acceptance import (
    accept_coupled,
    accept_greedy,
    accept_grouped,
    accept_grouped_coupled,
    accept_pooled,
    accept_speculative,
    accept_typical,
)
from mmaccel.errors import InputError

V = 10


def degenerate(rows):
    """Probabilities from rows of {token: logit}, others -inf (HF's deterministic test pattern)."""
    out = torch.full((len(rows), V), float("-inf"))
    for i, row in enumerate(rows):
        for tok, logit in row.items():
            out[i, tok] = logit
    return out.softmax(-1)


def test_deterministic_accept_accept_reject_with_known_residual():
    drafts = torch.tensor([[1, 4, 5]])
    q = degenerate([{1: 10.0}, {4: 10.0}, {5: 10.0}])[None]
    p = degenerate([{1: 10.0}, {4: 10.0}, {8: 10.0}, {2: 10.0}])[None]   # third position: only 8 is possible
    u, e = torch.rand(1, 3), torch.empty(1, 4, V).exponential_()
    verdict = accept_speculative(drafts, q, p, u, e)
    assert verdict.num_accepted.tolist() == [2] and verdict.next_token.tolist() == [8]
    assert accept_speculative(drafts, None, p, u, e).next_token.tolist() == [8]
    # all accepted → bonus from the last column
    p2 = degenerate([{1: 10.0}, {4: 10.0}, {5: 10.0}, {2: 10.0}])[None]
    verdict = accept_speculative(drafts, q, p2, u, e)
    assert verdict.num_accepted.tolist() == [3] and verdict.next_token.tolist() == [2]


def test_a_draft_the_target_gives_no_mass_is_rejected_even_at_u_zero():
    """u is drawn from [0, 1): the test is u < p/q, so u = 0 exactly must not keep a token with p = 0
    (u * q <= p kept it)."""
    drafts = torch.tensor([[1, 4]])
    q = degenerate([{1: 1.0, 2: 1.0}, {4: 1.0}])[None]
    p = degenerate([{2: 10.0}, {4: 10.0}, {5: 10.0}])[None]        # the first draft has no target mass
    u, e = torch.zeros(1, 2), torch.ones(1, 3, V)
    distances = torch.ones(V, V) - torch.eye(V)
    rules = [accept_speculative,
             lambda *a: accept_pooled(*a, neighbours=torch.full((V, 1), -1), delta=0.0),
             lambda *a: accept_grouped(*a, distances=distances, p_threshold=0.0, d_threshold=0.0)]
    for rule in rules:
        verdict = rule(drafts, q, p, u, e)
        assert verdict.num_accepted.tolist() == [0] and verdict.next_token.tolist() == [2]


def test_greedy_rule_keeps_matching_prefix():
    logits = torch.zeros(2, 4, V)
    for b, seq in enumerate([[3, 4, 5, 6], [3, 9, 5, 6]]):
        logits[b, torch.arange(4), torch.tensor(seq)] = 1.0
    verdict = accept_greedy(torch.tensor([[3, 4, 5], [3, 4, 5]]), None, logits)
    assert verdict.num_accepted.tolist() == [3, 1]
    assert verdict.next_token.tolist() == [6, 9]


def simulate_first_tokens(rule, p, q, n, k, seed, draft_is_point_mass=False):
    """Emitted tokens at positions 0..k of n independent verifications of k drafts ~ q against p."""
    g = torch.Generator().manual_seed(seed)
    P = p.expand(n, k + 1, V)
    Q = q.expand(n, k, V)
    drafts = torch.multinomial(Q.reshape(-1, V), 1, generator=g).reshape(n, k)
    u = torch.rand(n, k, generator=g)
    e = torch.empty(n, k + 1, V).exponential_(generator=g)
    verdict = rule(drafts, None if draft_is_point_mass else Q, P, u, e)
    first = torch.where(verdict.num_accepted > 0, drafts[:, 0], verdict.next_token)
    return first, verdict


def tv(samples, p):
    hist = torch.bincount(samples, minlength=V).float() / samples.numel()
    return 0.5 * (hist - p).abs().sum().item()


P_TARGET = torch.tensor([0.30, 0.20, 0.15, 0.10, 0.08, 0.07, 0.05, 0.03, 0.01, 0.01])
Q_DRAFT = torch.tensor([0.05, 0.05, 0.10, 0.30, 0.20, 0.10, 0.05, 0.05, 0.05, 0.05])
N = 200_000
BOUND = 3 * (V / N) ** 0.5 / 2   # a few standard errors of the TV of an n-sample histogram


def always_accept(drafts, q, p, u, e):
    return accept_speculative(drafts, q, p, torch.zeros_like(u), e)


@pytest.mark.parametrize("k", [1, 3])
def test_speculative_sampling_reproduces_target_and_negative_control_fails(k):
    first, _ = simulate_first_tokens(accept_speculative, P_TARGET[None, None], Q_DRAFT[None, None], N, k, seed=k)
    assert tv(first, P_TARGET) < BOUND
    broken, _ = simulate_first_tokens(always_accept, P_TARGET[None, None], Q_DRAFT[None, None], N, k, seed=k)
    assert tv(broken, P_TARGET) > 2 * BOUND


def test_point_mass_drafts_reproduce_target():
    first, _ = simulate_first_tokens(accept_speculative, P_TARGET[None, None], Q_DRAFT[None, None], N, 2, seed=7,
                                     draft_is_point_mass=True)
    assert tv(first, P_TARGET) < BOUND


def test_later_positions_follow_target_too():
    """Second emitted token: either the accepted second draft or the residual/bonus draw."""
    k, n = 3, N
    g = torch.Generator().manual_seed(11)
    drafts = torch.multinomial(Q_DRAFT, n * k, replacement=True, generator=g).reshape(n, k)
    P = P_TARGET.expand(n, k + 1, V)
    verdict = accept_speculative(drafts, Q_DRAFT.expand(n, k, V), P, torch.rand(n, k, generator=g),
                                 torch.empty(n, k + 1, V).exponential_(generator=g))
    reached = verdict.num_accepted >= 1          # position 1 is emitted by this pass
    second = torch.where(verdict.num_accepted >= 2, drafts[:, 1], verdict.next_token)[reached]
    assert tv(second, P_TARGET) < 3 * (V / second.numel()) ** 0.5 / 2


@pytest.mark.parametrize("k", [1, 2, 4])
def test_mean_accepted_length_matches_theory(k):
    alpha = torch.minimum(P_TARGET, Q_DRAFT).sum().item()        # 1 - TV(p, q)
    expected = (1 - alpha ** (k + 1)) / (1 - alpha)              # tokens per pass, i.i.d. positions
    _, verdict = simulate_first_tokens(accept_speculative, P_TARGET[None, None], Q_DRAFT[None, None], N, k, seed=3)
    emitted = (verdict.num_accepted + 1).float().mean().item()
    assert abs(emitted - expected) < 0.01


def test_pooled_with_zero_budget_is_exact_speculative_sampling():
    g = torch.Generator().manual_seed(5)
    n, k = 1000, 3
    drafts = torch.randint(0, V, (n, k), generator=g)
    q = torch.rand(n, k, V, generator=g).softmax(-1)
    p = torch.rand(n, k + 1, V, generator=g).softmax(-1)
    u, e = torch.rand(n, k, generator=g), torch.empty(n, k + 1, V).exponential_(generator=g)
    table = torch.randint(0, V, (V, 4), generator=g)
    exact = accept_speculative(drafts, q, p, u, e)
    pooled = accept_pooled(drafts, q, p, u, e, neighbours=table, delta=0.0)
    assert torch.equal(exact.num_accepted, pooled.num_accepted) and torch.equal(exact.next_token, pooled.next_token)
    relaxed = accept_pooled(drafts, q, p, u, e, neighbours=table, delta=0.2)
    assert (relaxed.num_accepted >= exact.num_accepted).all() and relaxed.num_accepted.sum() > exact.num_accepted.sum()
    assert (relaxed.deviation <= 0.2 * k + 1e-6).all()   # at most delta per kept draft
    with pytest.raises(InputError, match="delta"):
        accept_pooled(drafts, q, p, u, e, neighbours=table, delta=1.5)


def _random_case(seed, n=1000, k=3):
    g = torch.Generator().manual_seed(seed)
    drafts = torch.randint(0, V, (n, k), generator=g)
    q = torch.rand(n, k, V, generator=g).softmax(-1)
    p = (3 * torch.rand(n, k + 1, V, generator=g)).softmax(-1)
    u, e = torch.rand(n, k, generator=g), torch.empty(n, k + 1, V).exponential_(generator=g)
    return drafts, q, p, u, e


@pytest.mark.parametrize("budget", [{"p_threshold": 0.0}, {"d_threshold": 0.0}, {"half_window": 0}])
def test_grouped_with_zero_budget_is_exact_speculative_sampling(budget):
    drafts, q, p, u, e = _random_case(6)
    dist = torch.rand(V, V, generator=torch.Generator().manual_seed(1))
    exact = accept_speculative(drafts, q, p, u, e)
    grouped = accept_grouped(drafts, q, p, u, e, distances=dist, **{"p_threshold": 0.5, "d_threshold": 2.0, **budget})
    assert torch.equal(exact.num_accepted, grouped.num_accepted) and torch.equal(exact.next_token, grouped.next_token)
    assert float(grouped.deviation.abs().sum()) == 0.0


def test_grouped_pools_the_cluster_around_the_draft():
    # p over 10 tokens; the draft x=3 (q = point mass) sits between 2 and 4 in rank order
    p = torch.tensor([0.02, 0.02, 0.16, 0.14, 0.12, 0.30, 0.05, 0.05, 0.07, 0.07])
    target = torch.stack([p, p])[None]                                     # [1, 2, V]
    dist = torch.full((V, V), 9.0)
    dist[3, [2, 4, 5]] = 0.1                                               # 2, 4, 5 look like 3; 8 does not
    drafts = torch.tensor([[3]])
    e = torch.ones(1, 2, V)
    # |p(y) - p(x)| < 0.05 keeps 2 and 4 (5 is too likely: |0.30 - 0.14| = 0.16), 8 is too far in latent space
    for u, kept in ((0.41, 1), (0.43, 0)):                                 # p(G) = 0.14 + 0.16 + 0.12 = 0.42
        v = accept_grouped(drafts, None, target, torch.tensor([[u]]), e, distances=dist, p_threshold=0.05,
                           d_threshold=0.5, half_window=7)
        assert int(v.num_accepted) == kept
    assert abs(float(v.deviation) - 0.0) < 1e-7                           # rejected: nothing kept
    v = accept_grouped(drafts, None, target, torch.tensor([[0.1]]), e, distances=dist, p_threshold=0.05, d_threshold=0.5)
    assert abs(float(v.deviation) - 0.28) < 1e-6
    drafts, _, p, u, e = _random_case(7)       # point-mass drafts (fresh Jacobi guesses): pooling only helps
    relaxed = accept_grouped(drafts, None, p, u, e, distances=torch.zeros(V, V), p_threshold=0.3)
    exact = accept_speculative(drafts, None, p, u, e)
    assert (relaxed.num_accepted >= exact.num_accepted).all() and relaxed.num_accepted.sum() > exact.num_accepted.sum()
    with pytest.raises(InputError, match="p_threshold"):
        accept_grouped(*_random_case(7), distances=dist, p_threshold=2.0)
    with pytest.raises(InputError, match="distances"):
        accept_grouped(*_random_case(7), distances=torch.zeros(3, 3))


@pytest.mark.parametrize("budget", [{"p_threshold": 0.0}, {"d_threshold": 0.0}, {"half_window": 0}])
def test_grouped_coupled_with_zero_budget_is_the_coupled_rule(budget):
    drafts, _, p, _, e = _random_case(8)
    exact = (p / e).argmax(-1)
    drafts = torch.where(torch.rand(drafts.shape, generator=torch.Generator().manual_seed(2)) < 0.5, exact[:, :-1], drafts)
    dist = torch.rand(V, V, generator=torch.Generator().manual_seed(1))
    coupled = accept_coupled(drafts, None, p, None, e)
    grouped = accept_grouped_coupled(drafts, None, p, None, e, distances=dist,
                                     **{"p_threshold": 0.5, "d_threshold": 2.0, **budget})
    assert torch.equal(coupled.num_accepted, grouped.num_accepted) and torch.equal(coupled.next_token, grouped.next_token)
    assert float(grouped.deviation.sum()) == 0.0
    relaxed = accept_grouped_coupled(drafts, None, p, None, e, distances=dist, p_threshold=0.5, d_threshold=2.0)
    assert (relaxed.num_accepted >= coupled.num_accepted).all() and relaxed.num_accepted.sum() > coupled.num_accepted.sum()
    # a swap is counted for every kept draft that differs from the exact sample, and only then
    kept = torch.arange(drafts.shape[1])[None] < relaxed.num_accepted[:, None]
    assert torch.equal(relaxed.deviation, ((drafts != exact[:, :-1]) & kept).sum(-1).float())


def test_grouped_coupled_keeps_a_draft_whose_exact_sample_is_in_its_cluster():
    p = torch.tensor([0.02, 0.02, 0.16, 0.14, 0.12, 0.30, 0.05, 0.05, 0.07, 0.07])
    target = torch.stack([p, p])[None]                                     # [1, 2, V]
    dist = torch.full((V, V), 9.0)
    dist[3, [2, 4, 5]] = 0.1
    drafts = torch.tensor([[3]])
    for exact, kept in ((2, 1), (4, 1), (3, 1), (5, 0), (8, 0)):          # 5: |Δp| too large; 8: too far in latent space
        e = torch.ones(1, 2, V)
        e[0, 0, exact] = 1e-3                                              # the coupled sample at position 0 is `exact`
        v = accept_grouped_coupled(drafts, None, target, None, e, distances=dist, p_threshold=0.05, d_threshold=0.5)
        assert int(v.num_accepted) == kept, exact
        assert float(v.deviation) == float(kept and exact != 3)
        if not kept:
            assert int(v.next_token) == exact                              # the miss emits the exact sample


def test_typical_acceptance_thresholds():
    # p(1) = 0.73, p(2) = 0.27: threshold min(0.3, 0.09 * exp(-H)) = 0.050 → both kept
    p = degenerate([{1: 5.0, 2: 4.0}, {3: 5.0}, {4: 1.0}])[None]
    verdict = accept_typical(torch.tensor([[2, 3]]), None, p, None, torch.ones(1, 3, V), epsilon=0.3, delta=0.09)
    assert verdict.num_accepted.tolist() == [2] and verdict.next_token.tolist() == [4]
    # p(2) = 0.0067 < min(0.3, 0.086) → rejected, next token drawn from p at that position
    p = degenerate([{1: 5.0, 2: 0.0}, {3: 5.0}, {4: 1.0}])[None]
    verdict = accept_typical(torch.tensor([[2, 3]]), None, p, None, torch.ones(1, 3, V), epsilon=0.3, delta=0.09)
    assert verdict.num_accepted.tolist() == [0] and verdict.next_token.tolist() == [1]


def test_coupled_rule_is_the_noisy_argmax():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(4, 3, V, generator=g).softmax(-1)
    e = torch.empty(4, 3, V).exponential_(generator=g)
    target = (p / e).argmax(-1)
    drafts = target[:, :2].clone()
    drafts[1, 0] = (drafts[1, 0] + 1) % V
    verdict = accept_coupled(drafts, None, p, None, e)
    assert verdict.num_accepted.tolist() == [2, 0, 2, 2]
    assert verdict.next_token.tolist() == [target[0, 2], target[1, 0], target[2, 2], target[3, 2]]
