"""Jacobi decoding: the model drafts for itself from its previous pass over a window of guesses.

One target pass over [pending, w_1..w_L] scores every window position at once. The rule keeps a
prefix of the window; the target's outputs for the positions after it become the next window
(the Jacobi update) and fresh guesses top it up. With the greedy rule this is Jacobi decoding
(Santilli et al. 2023), with exact speculative sampling it is SJD (Teng et al., ICLR 2025: drafts
carry the distribution q they were drawn from, fresh guesses are point masses) and with the
coupled rule and position-fixed noise it is the Gumbel-coupled SJD of SCD, which reproduces plain
AR sampling token for token.

Fresh guesses (the window's tail, which no pass has scored yet) are a free choice that moves speed
only, never the output law: SJD repeats the last token ("repeat"); "above" takes, for a raster image
of rows `stride` tokens wide, the token one row up (a generated token, or the window's own guess one
row back), which image rows share far more often than neighbours along a row.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmaccel.core.proposers import Draft, DraftContext, Proposer
from mmaccel.errors import check

INITS = ("repeat", "random", "above")


class JacobiProposer(Proposer):
    """The previous iteration's outputs as drafts. `mode` is how window tokens are refreshed:
    "greedy" (argmax), "sample" (a fresh draw, q kept for SJD) or "coupled" (draw with the
    position-fixed noise). `init` picks fresh guesses (see the module doc); "above" needs the row
    width `stride`."""

    skips = False       # the window is its own state: every pass iterates it

    def __init__(self, window: int = 8, mode: str = "greedy", init: str = "repeat", stride: int | None = None):
        check(window >= 1, f"Jacobi window must be >= 1, got {window}")
        check(mode in ("greedy", "sample", "coupled"), f"unknown Jacobi mode {mode!r}; use greedy, sample or coupled")
        check(init in INITS, f"unknown Jacobi init {init!r}; use one of {', '.join(INITS)}")
        check(init != "above" or (isinstance(stride, int) and stride >= 1),
              f"Jacobi init 'above' takes the token one row up: it needs the row width (stride >= 1), got {stride!r}")
        self.window, self.mode, self.init, self.stride = window, mode, init, stride

    def _fresh(self, ctx: DraftContext, last: Tensor, n: int) -> Tensor:
        """n fresh guesses per row [B, n]: uniform random tokens, else the last token repeated ("above"
        replaces them in `propose`, once the tokens emitted by the pass are known)."""
        if self.init != "random":
            return last[:, None].expand(-1, n).clone()
        u = ctx.sampler.uniform((last.shape[0], n))
        return (u * ctx.sampler.vocab_size).long().clamp(max=ctx.sampler.vocab_size - 1).to(last.device)

    def _from_above(self, ctx: DraftContext) -> None:
        """Fresh guesses become the token one row (`stride`) up: an emitted token where there is one, else
        the window's own (already updated) guess a row back. Device tensors only: no host read."""
        B, L = self.tokens.shape
        count = ctx.num_generated[:, None]
        up = count + torch.arange(L, device=count.device)[None, :] - self.stride   # entry j is generated index count + j
        emitted = (up >= 0) & (up < count)
        above = ctx.emitted.gather(1, up.clamp(0, ctx.emitted.shape[1] - 1))
        tokens = torch.where(self.fresh & emitted, above, self.tokens)
        for j in range(self.stride, L, self.stride):          # chunks more than a row ahead, in order
            later = slice(j, min(j + self.stride, L))
            width = later.stop - later.start
            take = self.fresh[:, later] & ~emitted[:, later]
            tokens[:, later] = torch.where(take, tokens[:, j - self.stride : j - self.stride + width], tokens[:, later])
        self.tokens = tokens

    def start(self, inputs, room, ctx):
        self.tokens = self._fresh(ctx, ctx.pending, self.window)           # [B, L]
        self.q: Tensor | None = None                                       # [B, L, V] for mode "sample"
        self.fresh = torch.ones_like(self.tokens, dtype=torch.bool)        # point-mass guesses

    def resize(self, window: int, ctx: DraftContext) -> None:
        """From the next pass on the window holds `window` guesses (at most the method's k, which the loop makes room
        for): a narrower one keeps its first guesses, a wider one is topped up after them with fresh guesses. The
        rule verifies whatever the window holds, so a width that changes from pass to pass moves speed only
        (`propose` resizes to the k it is asked for)."""
        check(isinstance(window, int) and window >= 1, f"Jacobi window must be an int >= 1, got {window!r}")
        more = window - self.tokens.shape[1]
        if more < 0:
            self.tokens, self.fresh = self.tokens[:, :window], self.fresh[:, :window]
            self.q = None if self.q is None else self.q[:, :window]
        elif more > 0:
            self.tokens = torch.cat([self.tokens, self._fresh(ctx, self.tokens[:, -1], more)], 1)
            self.fresh = torch.cat([self.fresh, self.fresh.new_ones(self.fresh.shape[0], more)], 1)
            if self.q is not None:          # fresh guesses are point masses: their q is never read
                self.q = torch.cat([self.q, self.q.new_zeros(self.q.shape[0], more, self.q.shape[2])], 1)
        self.window = window

    def propose(self, ctx, k):
        if k != self.window:
            self.resize(k, ctx)
        if self.init == "above":
            self._from_above(ctx)
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
        if ctx.target_choices is not None and (self.mode == "coupled" or ctx.sampling.greedy):
            # the verification already made the target's pick at every column: the argmax, or the draw
            # under the same position-fixed noise (column c is generated index num_generated + c)
            guess, p = ctx.target_choices.gather(1, cols), None
        else:
            p = target_probs.gather(1, cols[..., None].expand(-1, -1, target_probs.shape[-1]))
            if self.mode == "greedy" or ctx.sampling.greedy:
                guess = p.argmax(-1)
            else:
                index = ctx.num_generated[:, None] + cols
                guess = ctx.sampler.sample(p, index)  # fresh noise for "sample", fixed noise for "coupled"
        fill = self._fresh(ctx, next_token, L)
        keep = ctx.active[:, None] if ctx.active is not None else torch.ones_like(usable)
        new_tokens = torch.where(usable, guess, fill)
        self.tokens = torch.where(keep, new_tokens, self.tokens)
        new_fresh = ~usable
        self.fresh = torch.where(keep, new_fresh, self.fresh)
        if self.mode == "sample" and not ctx.sampling.greedy:
            self.q = p if self.q is None else torch.where(keep[..., None], p, self.q)
