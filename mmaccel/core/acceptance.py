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


@dataclass
class Verdict:
    num_accepted: Tensor            # [B] drafts kept (a prefix)
    next_token: Tensor              # [B] correction or bonus token
    deviation: Tensor | None = None  # [B] total-variation budget spent on the kept drafts (relaxed rules)


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
    return Verdict(n, _at(pred, n))


def accept_speculative(draft_tokens: Tensor, draft_probs: Tensor | None, target_probs: Tensor,
                       uniforms: Tensor, exponentials: Tensor) -> Verdict:
    """Exact speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023).

    Accept x_j with probability min(1, p_j(x_j) / q_j(x_j)); at the first rejection draw from
    norm(max(p_j - q_j, 0)); if all K are accepted draw the bonus from p_K. With `draft_probs=None`
    the drafts are point masses (n-gram, lookup, top-k trees): accept with p_j(x_j) and draw the
    residual from p_j with x_j removed. Every emitted token is distributed exactly as the target.
    """
    B, K = draft_tokens.shape
    idx = draft_tokens[..., None]
    p_x = target_probs[:, :K].gather(2, idx).squeeze(2)
    q = _draft_law(draft_tokens, draft_probs, target_probs)
    q_x = q.gather(2, idx).squeeze(2)
    n = _first_rejection(uniforms * q_x <= p_x)                     # u <= p/q without dividing by 0
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
                  uniforms: Tensor, exponentials: Tensor, *, candidates: Tensor, delta: float,
                  pool_draft: bool = False) -> Verdict:
    """Relaxed acceptance over a candidate set per drafted token — the mechanism LANTERN and GSD share.

    `candidates` [B, K, M] lists, nearest first, the tokens that may stand in for the draft x_j
    (-1 = padding). The largest prefix of them whose target mass stays within `delta` is pooled:
    p~(x) = p(x) + sum p(n_i) (LANTERN, eq. 5; moving that mass onto x changes p by at most delta in
    total variation). Accept with min(1, p~(x)/q~(x)) where q~ = q(x), or with `pool_draft` the
    draft mass pooled over the same set (GSD's grouped ratio). On rejection sample from
    norm(max(p - q, 0)) as in exact speculative sampling. `delta = 0` is exact speculative sampling.
    """
    check(0 <= delta <= 1, f"delta (total-variation budget) must be in [0, 1], got {delta}")
    K = draft_tokens.shape[1]
    check(candidates.dim() == 3 and candidates.shape[:2] == draft_tokens.shape,
          f"candidates must have shape [B, {K}, M], got {tuple(candidates.shape)}")
    p = target_probs[:, :K]
    q = _draft_law(draft_tokens, draft_probs, target_probs)
    valid = (candidates >= 0) & (candidates != draft_tokens[..., None])
    safe = candidates.clamp_min(0)
    p_c = p.gather(2, safe) * valid
    within = (p_c.cumsum(-1) <= delta) & valid                     # budgeted prefix of neighbours
    within = within.to(torch.long).cumprod(-1).bool()
    moved = (p_c * within).sum(-1)                                 # [B, K] mass pooled onto x
    p_x = p.gather(2, draft_tokens[..., None]).squeeze(2) + moved
    q_x = q.gather(2, draft_tokens[..., None]).squeeze(2)
    if pool_draft:
        q_x = q_x + (q.gather(2, safe) * within).sum(-1)
    n = _first_rejection(uniforms * q_x <= p_x)
    kept = torch.arange(K, device=n.device)[None, :] < n[:, None]
    return Verdict(n, _correction(target_probs, q, n, exponentials), deviation=(moved * kept).sum(-1))


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
    "coupled": accept_coupled,
}
LOSSLESS_RULES = {"greedy", "speculative", "coupled"}
