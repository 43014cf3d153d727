"""Jacobi decoding: the model drafts for itself from its previous pass over a window of guesses.

One target pass over [pending, w_1..w_L] scores every window position at once. The rule keeps a
prefix of the window; the target's outputs for the positions after it become the next window
(the Jacobi update) and fresh guesses top it up. With the greedy rule this is Jacobi decoding
(Santilli et al. 2023), with exact speculative sampling it is SJD (Teng et al., ICLR 2025: drafts
carry the distribution q they were drawn from, fresh guesses are point masses) and with the
coupled rule and position-fixed noise it is the Gumbel-coupled SJD of SCD, which reproduces plain
AR sampling token for token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmaccel.core.proposers import Draft, DraftContext, Proposer
from mmaccel.errors import check

INITS = ("repeat", "random")


class JacobiProposer(Proposer):
    """The previous iteration's outputs as drafts. `mode` is how window tokens are refreshed:
    "greedy" (argmax), "sample" (a fresh draw, q kept for SJD) or "coupled" (draw with the
    position-fixed noise)."""

    def __init__(self, window: int = 8, mode: str = "greedy", init: str = "repeat"):
        check(window >= 1, f"Jacobi window must be >= 1, got {window}")
        check(mode in ("greedy", "sample", "coupled"), f"unknown Jacobi mode {mode!r}; use greedy, sample or coupled")
        check(init in INITS, f"unknown Jacobi init {init!r}; use one of {', '.join(INITS)}")
        self.window, self.mode, self.init = window, mode, init

    def _fresh(self, ctx: DraftContext, last: Tensor, n: int) -> Tensor:
        """n fresh guesses per row [B, n]: repeat the last token, or uniform random tokens."""
        if self.init == "repeat":
            return last[:, None].expand(-1, n).clone()
        u = ctx.sampler.uniform((last.shape[0], n))
        return (u * ctx.sampler.vocab_size).long().clamp(max=ctx.sampler.vocab_size - 1).to(last.device)

    def start(self, inputs, room, ctx):
        self.tokens = self._fresh(ctx, ctx.pending, self.window)           # [B, L]
        self.q: Tensor | None = None                                       # [B, L, V] for mode "sample"
        self.fresh = torch.ones_like(self.tokens, dtype=torch.bool)        # point-mass guesses

    def propose(self, ctx, k):
        check(k == self.window, f"the Jacobi window is {self.window}; the loop asked for {k} drafts")
        probs = None
        if self.mode == "sample" and not ctx.sampling.greedy:
            V = ctx.sampler.vocab_size
            one_hot = torch.nn.functional.one_hot(self.tokens, V).float()
            probs = one_hot if self.q is None else torch.where(self.fresh[..., None], one_hot, self.q)
        return Draft(self.tokens, probs)

    def observe(self, ctx, num_accepted, next_token, target_probs, accepted_tokens):
        B, L = self.tokens.shape
        # column j of target_probs predicts generated index g + j, g = index of the first draft
        cols = num_accepted[:, None] + 1 + torch.arange(L, device=num_accepted.device)[None, :]  # [B, L]
        usable = cols <= L
        cols = cols.clamp(max=L)
        index = ctx.num_generated[:, None] + cols
        p = target_probs.gather(1, cols[..., None].expand(-1, -1, target_probs.shape[-1]))
        if self.mode == "greedy" or ctx.sampling.greedy:
            guess = p.argmax(-1)
        else:
            guess = ctx.sampler.sample(p, index)  # fresh noise for "sample", fixed noise for "coupled"
        fill = self._fresh(ctx, next_token, L)
        keep = ctx.active[:, None] if ctx.active is not None else torch.ones_like(usable)
        new_tokens = torch.where(usable, guess, fill)
        self.tokens = torch.where(keep, new_tokens, self.tokens)
        new_fresh = ~usable
        self.fresh = torch.where(keep, new_fresh, self.fresh)
        if self.mode == "sample" and not ctx.sampling.greedy:
            self.q = p if self.q is None else torch.where(keep[..., None], p, self.q)
