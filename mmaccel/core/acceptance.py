"""Acceptance rules for verifying K drafted tokens against one target pass.

Every rule is a pure tensor function with the same signature:

    rule(draft_tokens [B, K], draft_probs [B, K, V] | None, target_probs [B, K+1, V],
         uniforms [B, K], exponentials [B, K+1, V], **params) -> Verdict

`target_probs[:, j]` is the target's (processed) distribution for the token after draft j-1
(column K is the bonus position). Randomness comes in as tensors, so a fused kernel can be
compared with these references exactly. A `Verdict` says how many drafts each row keeps and the
one extra token it emits (the correction at the first rejection, or the bonus).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mmaccel.core.sampling import race
from mmaccel.errors import check
from mmaccel.kernels.dispatch import use_triton


@dataclass
class Verdict:
    num_accepted: Tensor            # [B] drafts kept (a prefix)
    next_token: Tensor              # [B] correction or bonus token
    deviation: Tensor | None = None  # [B] total-variation budget spent on the kept drafts (relaxed rules)
    choices: Tensor | None = None    # [B, K+1] the target's own pick at every column (greedy and coupled rules)


def _first_rejection(accepted: Tensor) -> Tensor:
    """Length of the all-True prefix of `accepted` [B, K]."""
    return accepted.to(torch.long).cumprod(dim=1).sum(dim=1)


def _at(x: Tensor, n: Tensor) -> Tensor:
    """x[b, n[b]] for x [B, K(+1), ...]."""
    return x[torch.arange(x.shape[0], device=x.device), n.to(x.device)]


def _draft_law(draft_tokens: Tensor, draft_probs: Tensor | None, target_probs: Tensor) -> Tensor:
    """q [B, K, V]: the given draft distributions, or point masses on the drafts."""
    if draft_probs is not None:
        return draft_probs.float()
    K = draft_tokens.shape[1]
    return torch.zeros_like(target_probs[:, :K]).scatter_(2, draft_tokens[..., None], 1.0)


def _correction(target_probs: Tensor, draft_probs: Tensor, n: Tensor, exponentials: Tensor) -> Tensor:
    """The token after n kept drafts: a draw from norm(max(p_n - q_n, 0)), or from p_K (bonus)."""
    q_pad = torch.cat([draft_probs, torch.zeros_like(target_probs[:, :1])], dim=1)  # bonus column: residual = p
    p_n, q_n = _at(target_probs, n), _at(q_pad, n)
    residual = (p_n - q_n).clamp_min(0)
    residual = torch.where(residual.sum(-1, keepdim=True) <= 0, p_n, residual)  # p == q there: fall back to p
    return race(residual, _at(exponentials, n))


def accept_greedy(draft_tokens: Tensor, draft_probs: Tensor | None, target_probs: Tensor,
                  uniforms: Tensor | None = None, exponentials: Tensor | None = None) -> Verdict:
    """Keep drafts while they equal the target argmax; emit the argmax after them.

    `target_probs` may be logits or any monotone transform: only the argmax is used. Output is the
    plain greedy continuation, token for token.
    """
    pred = target_probs.argmax(-1)                                   # [B, K+1]
    n = _first_rejection(draft_tokens == pred[:, :-1])
    return Verdict(n, _at(pred, n), choices=pred)


def accept_speculative(draft_tokens: Tensor, draft_probs: Tensor | None, target_probs: Tensor,
                       uniforms: Tensor, exponentials: Tensor) -> Verdict:
    """Exact speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023).

    Accept x_j with probability min(1, p_j(x_j) / q_j(x_j)); at the first rejection draw from
    norm(max(p_j - q_j, 0)); if all K are accepted draw the bonus from p_K. With `draft_probs=None`
    the drafts are point masses (n-gram, lookup, top-k trees): accept with p_j(x_j) and draw the
    residual from p_j with x_j removed. Every emitted token is distributed exactly as the target.
    """
    if use_triton(target_probs):             # the fused kernel (mmaccel.kernels.speculative): same outputs
        from mmaccel.kernels.speculative import verify_chain

        return Verdict(*verify_chain(draft_tokens, draft_probs, target_probs, uniforms, exponentials))
    B, K = draft_tokens.shape
    idx = draft_tokens[..., None]
    p_x = target_probs[:, :K].gather(2, idx).squeeze(2)
    q = _draft_law(draft_tokens, draft_probs, target_probs)
    q_x = q.gather(2, idx).squeeze(2)
    n = _first_rejection(uniforms * q_x < p_x)      # u < p/q for u in [0, 1): never keeps a token p gives no mass
    return Verdict(n, _correction(target_probs, q, n, exponentials))


def accept_typical(draft_tokens: Tensor, draft_probs: Tensor | None, target_probs: Tensor,
                   uniforms: Tensor | None, exponentials: Tensor, *, epsilon: float = 0.3,
                   delta: float = 0.09) -> Verdict:
    """Medusa typical acceptance (Cai et al. 2024, §2.3.1) — relaxed, not lossless.

    Keep x_j while p_j(x_j) > min(epsilon, delta * exp(-H(p_j))); then sample from p at the first
    position not kept. epsilon is Medusa's `posterior_threshold`, delta its `posterior_alpha`.
    """
    check(0 <= epsilon <= 1 and delta >= 0, f"typical acceptance needs 0 <= epsilon <= 1 and delta >= 0, got {epsilon}, {delta}")
    K = draft_tokens.shape[1]
    p = target_probs[:, :K]
    p_x = p.gather(2, draft_tokens[..., None]).squeeze(2)
    entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)
    threshold = torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))
    n = _first_rejection(p_x > threshold)
    return Verdict(n, race(_at(target_probs, n), _at(exponentials, n)))


def accept_pooled(draft_tokens: Tensor, draft_probs: Tensor | None, target_probs: Tensor,
                  uniforms: Tensor, exponentials: Tensor, *, neighbours: Tensor, delta: float) -> Verdict:
    """LANTERN's relaxed acceptance (Jang et al., ICLR 2025, §3.2): pool target mass over the draft's
    latent neighbours within a total-variation budget `delta`.

    `neighbours` [V, M] lists for every token the tokens nearest to it in latent space (nearest first,
    -1 = padding). For a draft x the largest prefix n_1..n_m of its neighbours with
    sum p(n_i) <= delta is pooled: p~(x) = p(x) + sum p(n_i) (moving that mass onto x changes p by at
    most delta in total variation). Accept with min(1, p~(x)/q(x)); on rejection sample from
    norm(max(p - q, 0)) as in exact speculative sampling. `delta = 0` is exact speculative sampling.
    `Verdict.deviation` is the pooled mass of the kept drafts (the budget actually spent).
    """
    check(0 <= delta <= 1, f"delta (total-variation budget) must be in [0, 1], got {delta}")
    check(neighbours.dim() == 2 and neighbours.shape[0] == target_probs.shape[-1],
          f"neighbours must be a [vocab={target_probs.shape[-1]}, M] table, got {tuple(neighbours.shape)}")
    if use_triton(target_probs):             # the fused kernel (mmaccel.kernels.pooled): same outputs
        from mmaccel.kernels.pooled import verify_pooled

        return Verdict(*verify_pooled(draft_tokens, draft_probs, target_probs, uniforms, exponentials, neighbours, delta))
    K = draft_tokens.shape[1]
    p = target_probs[:, :K]
    q = _draft_law(draft_tokens, draft_probs, target_probs)
    candidates = neighbours.to(draft_tokens.device)[draft_tokens]          # [B, K, M]
    valid = (candidates >= 0) & (candidates != draft_tokens[..., None])
    p_c = p.gather(2, candidates.clamp_min(0)) * valid
    within = (p_c.cumsum(-1) <= delta) & valid                            # budgeted prefix of neighbours
    within = within.to(torch.long).cumprod(-1).bool()
    moved = (p_c * within).sum(-1)                                        # [B, K] mass pooled onto x
    p_x = p.gather(2, draft_tokens[..., None]).squeeze(2) + moved
    q_x = q.gather(2, draft_tokens[..., None]).squeeze(2)
    n = _first_rejection(uniforms * q_x < p_x)
    kept = torch.arange(K, device=n.device)[None, :] < n[:, None]
    return Verdict(n, _correction(target_probs, q, n, exponentials), deviation=(moved * kept).sum(-1))


def _check_clusters(V: int, distances: Tensor, p_threshold: float, d_threshold: float, half_window: int) -> None:
    check(0 <= p_threshold <= 1, f"p_threshold must be in [0, 1], got {p_threshold}")
    check(d_threshold >= 0, f"d_threshold must be >= 0, got {d_threshold}")
    check(isinstance(half_window, int) and half_window >= 0, f"half_window must be an int >= 0, got {half_window}")
    check(distances.shape == (V, V), f"distances must be a [{V}, {V}] matrix, got {tuple(distances.shape)}")


def _clusters(p: Tensor, x: Tensor, distances: Tensor, p_threshold: float, d_threshold: float,
              half_window: int) -> tuple[Tensor, Tensor]:
    """GSD's dynamic clusters around drafts `x` [B, K, 1] under `p` [B, K, V]: the candidate tokens
    [B, K, 2w+1] within `half_window` ranks of x, and which of them join x's group (|Δp| and latent
    distance below the thresholds; x itself excluded). One sort for all positions, no vocabulary loop."""
    V = p.shape[-1]
    _check_clusters(V, distances, p_threshold, d_threshold, half_window)
    order = torch.sort(p, dim=-1, descending=True, stable=True).indices                 # [B, K, V] tokens by rank
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(V, device=p.device).expand_as(order))
    offsets = torch.arange(-half_window, half_window + 1, device=p.device)
    slots = rank.gather(-1, x) + offsets                                  # [B, K, 2w+1] ranks around x
    in_range = (slots >= 0) & (slots < V)
    cand = order.gather(-1, slots.clamp(0, V - 1))                        # candidate tokens
    p_x = p.gather(-1, x)
    p_c = p.gather(-1, cand)
    close = distances.to(p.device)[x.squeeze(-1)].gather(-1, cand) < d_threshold
    return cand, in_range & close & ((p_c - p_x).abs() < p_threshold) & (cand != x)


def accept_grouped(draft_tokens: Tensor, draft_probs: Tensor | None, target_probs: Tensor,
                   uniforms: Tensor, exponentials: Tensor, *, distances: Tensor, p_threshold: float = 0.15,
                   d_threshold: float = 0.5, half_window: int = 7) -> Verdict:
    """GSD's grouped acceptance (So et al., ICCV 2025): verify a dynamic cluster of visually valid
    tokens instead of the single draft.

    For a draft x the candidates are the tokens within `half_window` ranks of x in the target's
    probability order; the group G keeps those y with |p(y) - p(x)| < `p_threshold` and
    `distances`[x, y] < `d_threshold` (squared latent distance, [V, V]), plus x itself. Accept with
    min(1, p(G)/q(G)); on rejection sample from norm(max(p - q, 0)) (SJD's residual). All positions
    are handled at once with one sort per verify pass (no loop over tokens). `p_threshold = 0` or
    `d_threshold = 0` leaves G = {x}: exact speculative sampling. `Verdict.deviation` is the mass
    p(G) - p(x) of the kept drafts.
    """
    if use_triton(target_probs):             # the fused kernel (mmaccel.kernels.grouped): same outputs
        from mmaccel.kernels.grouped import verify_grouped

        _check_clusters(target_probs.shape[-1], distances, p_threshold, d_threshold, half_window)
        return Verdict(*verify_grouped(draft_tokens, draft_probs, target_probs, uniforms, exponentials, distances,
                                       p_threshold, d_threshold, half_window))
    K = draft_tokens.shape[1]
    p = target_probs[:, :K]
    q = _draft_law(draft_tokens, draft_probs, target_probs)
    x = draft_tokens[..., None]                                           # [B, K, 1]
    cand, group = _clusters(p, x, distances, p_threshold, d_threshold, half_window)
    moved = (p.gather(-1, cand) * group).sum(-1)
    p_g = p.gather(-1, x).squeeze(-1) + moved
    q_g = q.gather(-1, x).squeeze(-1) + (q.gather(-1, cand) * group).sum(-1)
    n = _first_rejection(uniforms * q_g < p_g)
    kept = torch.arange(K, device=n.device)[None, :] < n[:, None]
    return Verdict(n, _correction(target_probs, q, n, exponentials), deviation=(moved * kept).sum(-1))


def accept_grouped_coupled(draft_tokens: Tensor, draft_probs: Tensor | None, target_probs: Tensor,
                           uniforms: Tensor | None, exponentials: Tensor, *, distances: Tensor,
                           p_threshold: float = 0.15, d_threshold: float = 0.5, half_window: int = 7) -> Verdict:
    """GSD's clusters under coupled noise: keep a draft x while the target's own sample y = argmax(p/E)
    at that position is x or lies in x's cluster (see `accept_grouped`); emit y at the first miss.

    Every kept token is either the exact sample or stands in for it from the same visual cluster, so
    the output law differs from the target's at a position by at most the probability of a swap
    (coupling inequality). `Verdict.deviation` counts the swaps among the kept drafts: an unbiased
    estimate of that total-variation bound. A zero threshold makes it `accept_coupled` (lossless).
    """
    if use_triton(target_probs):             # the fused kernel (mmaccel.kernels.grouped): same outputs
        from mmaccel.kernels.grouped import verify_grouped_coupled

        _check_clusters(target_probs.shape[-1], distances, p_threshold, d_threshold, half_window)
        return Verdict(*verify_grouped_coupled(draft_tokens, target_probs, exponentials, distances, p_threshold,
                                               d_threshold, half_window))
    K = draft_tokens.shape[1]
    exact = (target_probs / exponentials).argmax(-1)                     # [B, K+1] the coupled target samples
    x = draft_tokens[..., None]
    cand, group = _clusters(target_probs[:, :K], x, distances, p_threshold, d_threshold, half_window)
    y = exact[:, :K]
    swap = ((cand == y[..., None]) & group).any(-1)
    n = _first_rejection((y == draft_tokens) | swap)
    kept = torch.arange(K, device=n.device)[None, :] < n[:, None]
    return Verdict(n, _at(exact, n), deviation=(swap & (y != draft_tokens) & kept).sum(-1).float())


def accept_coupled(draft_tokens: Tensor, draft_probs: Tensor | None, target_probs: Tensor,
                   uniforms: Tensor | None, exponentials: Tensor) -> Verdict:
    """Coupled verification: keep drafts while they equal the target's own sample under fixed noise.

    With `exponentials` fixed per generated position (TokenSampler(coupled=True)), the target's
    sample at each position is argmax(p / E); keeping drafts that equal it reproduces plain AR
    sampling with the same noise token for token, so it is lossless whatever proposed the drafts
    (Gumbel coupling, SCD / MC-SJD).
    """
    return accept_greedy(draft_tokens, None, target_probs / exponentials)


RULES = {
    "greedy": accept_greedy,
    "speculative": accept_speculative,
    "typical": accept_typical,
    "pooled": accept_pooled,
    "grouped": accept_grouped,
    "grouped-coupled": accept_grouped_coupled,
    "coupled": accept_coupled,
}
LOSSLESS_RULES = {"greedy", "speculative", "coupled"}
