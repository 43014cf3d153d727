"""SJD2: speculative Jacobi-denoising decoding (Teng et al., NeurIPS 2025) for the image GPT.

SJD keeps a window of guessed tokens after the committed prefix and verifies them with exact
speculative sampling. SJD2 fills the far end of the window with *noise in embedding space* instead of
random tokens and denoises it while decoding; the model, briefly fine-tuned to read noisy inputs
(`mmaccel.image.train.train_sjd2`), predicts the next clean token behind them.

The window here. Every entry has a level l in 0..S (`steps` = S), its input being
x = (1 - t) e(x0) + t sigma eps with t = l / S (`noisy_embeddings`; sigma the spread of the embedding
table, eps fixed per entry, x0 the entry's latest clean-token estimate; level S is pure noise). Levels
rise along the window; the level-0 entries in front are clean token drafts. One pass feeds
[pending token, window] and

- verifies the clean drafts with exact speculative sampling (the SJD rule: each draft was drawn from the
  distribution q recorded with it), then emits the correction, or the bonus token after the last clean
  draft. Only drafts whose whole context is clean are ever verified, so every emitted token is drawn
  from the model's own conditional: SJD2 here is lossless with respect to the AR distribution of the
  model it runs (statistical test in the tests). Run on the fine-tuned model it reproduces that model's
  AR sampling; on an unmodified model it still is lossless, only slower;
- moves every remaining entry one level down: its new x0 is drawn from the pass's prediction for its
  position (the one-position offset of next-token prediction), q is kept for entries that become clean;
- appends fresh pure-noise entries at level S behind the survivors.

With `coupled=True` every draw for image position g (the estimates, hence the drafts, and the emitted
token) uses the exponential noise fixed for g, and a clean draft is kept while it equals the model's own
draw there (the coupled rule of SCD / MC-SJD): the output is plain AR sampling with that noise, token for
token, and estimates that converge stop churning (the draws of a fixed position under nearby
distributions agree), which is what makes long accepted runs likely.

The first window has levels ceil(i S / L) for entries i = 1..L (rising, as in the paper's initial window);
entries without an estimate yet are pure noise whatever their level. What is an approximation of the
paper: its noise schedule and level spacing are not published with code; ours is linear (t = l / S) and
every entry descends one level per pass.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from mmaccel.core.acceptance import accept_greedy, accept_speculative
from mmaccel.core.driver import AcceptedLengths, AllDone, DecodeCall, Emission, Generation
from mmaccel.core.model import DecoderModel
from mmaccel.core.sampling import Sampling, TokenSampler, race
from mmaccel.errors import check


def embedding_scale(model) -> Tensor:
    """sigma: the spread (std) of the model's token-embedding table, the scale of the window's noise."""
    return model.tok_embeddings.weight.detach().float().std()


def noisy_embeddings(clean: Tensor, levels: Tensor, noise: Tensor, sigma: Tensor | float) -> Tensor:
    """x = (1 - t) e + t sigma eps: clean embeddings `clean` at noise levels `levels` (t in [0, 1], broadcast)."""
    return (1 - levels) * clean + levels * sigma * noise


def clean_prefix(level: Tensor) -> Tensor:
    """[B] the leading level-0 entries of each window [B, L]: the drafts whose whole context is clean,
    the only ones that may be verified."""
    return (level == 0).long().cumprod(1).sum(1)


def initial_levels(window: int, steps: int) -> Tensor:
    """Levels [window] of the first window: ceil(i * steps / window) for i = 1..window."""
    return torch.tensor([math.ceil(i * steps / window) for i in range(1, window + 1)], dtype=torch.long)


def sjd2_decode(model: DecoderModel, inputs: Any, *, embeddings: Tensor, sigma: Tensor | float,
                max_new_tokens: int, window: int = 16, steps: int = 4, sampling: Sampling = Sampling(),
                seed: int = 0, coupled: bool = False) -> Generation:
    """Generate `max_new_tokens` per row of `inputs` with an SJD2 window of `window` entries denoised in
    `steps` levels. `model.step` must accept `embeds` (LlamaGenGPT, or CFG around it); `embeddings` [V, D]
    is its token-embedding table and `sigma` the noise scale (`embedding_scale`). `coupled`: every draw
    for image position g (estimates, drafts, the emitted token) uses the noise fixed for g, and drafts are
    kept while they equal the model's own draw (the coupled rule of SCD): the output is then plain AR
    sampling with that noise token for token (`LoopConfig(coupled=True)`, same seed).

    Emission, statistics and the all-done check are the core driver's (`mmaccel.core.driver`); the loop is
    its own because what it feeds (noisy embeddings) and how its window moves are SJD2's."""
    check(isinstance(max_new_tokens, int) and max_new_tokens >= 1, f"max_new_tokens must be an int >= 1, got {max_new_tokens}")
    check(isinstance(window, int) and not isinstance(window, bool) and window >= 1,
          f"the SJD2 window must be an int >= 1, got {window!r}")
    check(isinstance(steps, int) and not isinstance(steps, bool) and 1 <= steps <= window,
          f"SJD2 denoising steps must be an int in [1, window={window}], got {steps!r}")
    check(isinstance(embeddings, Tensor) and embeddings.dim() == 2, "embeddings must be the [V, D] token-embedding table")
    # a row may overshoot max_new_tokens by the window, and finished rows still feed window + 1 before rolling back
    room = max_new_tokens + 2 * (window + 1)
    with DecodeCall(getattr(model, "device", torch.device("cpu"))) as call:
        with call.prefill():
            state = model.prefill(inputs, room)
        win = _Window(state.logits, embeddings.detach(), sigma, window, steps, sampling, seed, coupled, room)
        B, dev = state.logits.shape[0], state.logits.device
        out = Emission(B, max_new_tokens + window + 1, dev)
        out.first(win.pending, call.stats.nfe, max_new_tokens)
        lengths = AcceptedLengths(window + 1, dev)
        lengths.add(torch.ones(B, dtype=torch.long, device=dev), torch.ones(B, dtype=torch.bool, device=dev))
        all_done = AllDone(dev)
        for _ in range(max_new_tokens - 1):      # every pass emits at least one token per unfinished row
            if all_done(out.done):
                break
            active = ~out.done
            with call.target_pass():
                embeds, fed = win.fed()
                logits = model.step(state, fed, embeds=embeds)                      # [B, L + 1, V]
                n, nxt, probs = win.verify(logits, out.count)
            state.rollback(window + 1 - torch.where(active, n + 1, 0))
            out.emit(win.x0, n, nxt, active, call.stats.nfe, max_new_tokens)
            lengths.add(n + 1, active)
            win.advance(probs, torch.where(active, n + 1, 0), out.count, active, nxt)
    return call.result(out, max_new_tokens, lengths)


class _Window:
    """SJD2's window per row: clean-token estimates x0, their distributions q, noise levels, whether an
    estimate is known yet, and the fixed embedding noise of every entry; plus each row's pending token."""

    def __init__(self, logits: Tensor, table: Tensor, sigma: Tensor | float, window: int, steps: int,
                 sampling: Sampling, seed: int, coupled: bool, room: int):
        (B, V), dev = logits.shape, logits.device
        check(table.shape[0] == V, f"the embedding table has {table.shape[0]} rows, the model {V} token ids")
        self.table, self.sigma, self.L, self.S, self.sampling, self.coupled = table, sigma, window, steps, sampling, coupled
        self.sampler = TokenSampler(seed, B, V, coupled=coupled, device=dev, positions=room)
        self.noise_gen = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + 7)
        self.pending = self.draw(sampling.probs(logits)[:, None], torch.zeros(B, 1, dtype=torch.long, device=dev))[:, 0]
        self.x0 = torch.zeros(B, window, dtype=torch.long, device=dev)
        self.q = torch.zeros(B, window, V, device=dev)
        self.level = initial_levels(window, steps).to(dev).expand(B, window).clone()
        self.known = torch.zeros(B, window, dtype=torch.bool, device=dev)
        self.eps = self.fresh_noise(window)
        self.cols = torch.arange(window + 1, device=dev)
        self.rows = torch.arange(B, device=dev)

    def draw(self, probs: Tensor, index: Tensor) -> Tensor:
        """Tokens [B, T] from probs [B, T, V] for generated indices `index` [B, T]."""
        return probs.argmax(-1) if self.sampling.greedy else self.sampler.sample(probs, index)

    def fresh_noise(self, n: int) -> Tensor:
        noise = torch.randn(self.pending.shape[0], n, self.table.shape[1], generator=self.noise_gen)
        return noise.to(self.pending.device, self.table.dtype)

    def fed(self) -> tuple[Tensor, Tensor]:
        """The pass's input: embeddings [B, L + 1, D] of [pending token, window] and the token ids beside them."""
        t = (self.level.to(self.table.dtype) / self.S)[..., None]
        x = torch.where(self.known[..., None], noisy_embeddings(self.table[self.x0], t, self.eps, self.sigma),
                        self.sigma * self.eps)
        return torch.cat([self.table[self.pending][:, None], x], 1), torch.cat([self.pending[:, None], self.x0], 1)

    def verify(self, logits: Tensor, count: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(clean drafts accepted [B], the token after them [B], the pass's probabilities [B, L + 1, V])."""
        probs = self.sampling.probs(logits)
        clean = clean_prefix(self.level)
        if self.sampling.greedy or self.coupled:        # keep drafts equal to the model's own (coupled) draw
            own = logits if self.sampling.greedy else probs / self.sampler.noise(count[:, None] + self.cols[None, :])
            n = torch.minimum(accept_greedy(self.x0, None, own).num_accepted, clean)
            return n, own[self.rows, n].argmax(-1), probs
        V = probs.shape[-1]
        draft_q = torch.where((self.level == 0)[..., None], self.q, torch.nn.functional.one_hot(self.x0, V).to(self.q.dtype))
        exps = self.sampler.exponential((self.x0.shape[0], self.L + 1, V))
        verdict = accept_speculative(self.x0, draft_q, probs, self.sampler.uniform((self.x0.shape[0], self.L)), exps)
        n = torch.minimum(verdict.num_accepted, clean)
        # past the clean drafts there is nothing to verify: the token after them is the bonus
        bonus = race(probs[self.rows, clean], exps[self.rows, clean])
        return n, torch.where(verdict.num_accepted >= clean, bonus, verdict.next_token), probs

    def advance(self, probs: Tensor, emitted: Tensor, count: Tensor, moved: Tensor, nxt: Tensor) -> None:
        """The Jacobi-denoising update of the rows that `moved`: entry i of the new window is old entry
        i + emitted, predicted by column i + emitted, one level lower; fresh noise behind the survivors."""
        L, V = self.L, probs.shape[-1]
        self.pending = torch.where(moved, nxt, self.pending)
        src = self.cols[None, :L] + emitted[:, None]                            # [B, L] old entry index
        p_new = probs.gather(1, src.clamp(max=L)[..., None].expand(-1, -1, V))
        estimate = self.draw(p_new, count[:, None] + self.cols[None, :L])
        survivor, old, moved = src < L, src.clamp(max=L - 1), moved[:, None]
        new_level = torch.where(survivor, (self.level.gather(1, old) - 1).clamp(min=0), self.S)
        new_eps = torch.where(survivor[..., None], self.eps.gather(1, old[..., None].expand(-1, -1, self.eps.shape[-1])),
                              self.fresh_noise(L))
        self.level = torch.where(moved, new_level, self.level)
        self.x0 = torch.where(moved, torch.where(src <= L, estimate, 0), self.x0)
        self.q = torch.where(moved[..., None], p_new, self.q)
        self.known = torch.where(moved, src <= L, self.known)
        self.eps = torch.where(moved[..., None], new_eps, self.eps)
