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
from mmaccel.core.model import DecoderModel
from mmaccel.core.sampling import Sampling, TokenSampler, race
from mmaccel.core.speculative import Generation
from mmaccel.core.stats import DecodeStats, track_peak_memory
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
    sampling with that noise token for token (`LoopConfig(coupled=True)`, same seed)."""
    check(isinstance(max_new_tokens, int) and max_new_tokens >= 1, f"max_new_tokens must be an int >= 1, got {max_new_tokens}")
    check(isinstance(window, int) and not isinstance(window, bool) and window >= 1,
          f"the SJD2 window must be an int >= 1, got {window!r}")
    check(isinstance(steps, int) and not isinstance(steps, bool) and 1 <= steps <= window,
          f"SJD2 denoising steps must be an int in [1, window={window}], got {steps!r}")
    check(isinstance(embeddings, Tensor) and embeddings.dim() == 2, "embeddings must be the [V, D] token-embedding table")
    L, S = window, steps
    stats = DecodeStats()
    device = getattr(model, "device", torch.device("cpu"))
    table = embeddings.detach()
    with torch.inference_mode(), track_peak_memory(stats, device), stats.timed("total"):
        with stats.timed("prefill"):
            # a row may overshoot max_new_tokens by L, and finished rows still feed L + 1 before rolling back
            state = model.prefill(inputs, max_new_tokens + 2 * (L + 1))
            stats.nfe += 1
        B, V = state.logits.shape
        dev = state.logits.device
        check(table.shape[0] == V, f"the embedding table has {table.shape[0]} rows, the model {V} token ids")
        sampler = TokenSampler(seed, B, V, coupled=coupled, device=dev, positions=max_new_tokens + 2 * (L + 1))
        noise_gen = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + 7)

        def draw(probs: Tensor, index: Tensor) -> Tensor:
            """Tokens [B, T] from probs [B, T, V] for generated indices `index` [B, T]."""
            return probs.argmax(-1) if sampling.greedy else sampler.sample(probs, index)

        def fresh_noise(n: int) -> Tensor:
            return torch.randn(B, n, table.shape[1], generator=noise_gen).to(dev, table.dtype)

        pending = draw(sampling.probs(state.logits)[:, None], torch.zeros(B, 1, dtype=torch.long, device=dev))[:, 0]
        out = torch.zeros(B, max_new_tokens + L + 1, dtype=torch.long, device=dev)
        passes = torch.zeros_like(out)
        out[:, 0], passes[:, 0] = pending, stats.nfe
        count = torch.ones(B, dtype=torch.long, device=dev)
        stats.record_accepted([1] * B)
        # the window: x0 estimates, their distributions q, levels, estimate known?, fixed noise
        x0 = torch.zeros(B, L, dtype=torch.long, device=dev)
        q = torch.zeros(B, L, V, device=dev)
        level = initial_levels(L, S).to(dev).expand(B, L).clone()
        known = torch.zeros(B, L, dtype=torch.bool, device=dev)
        eps = fresh_noise(L)
        cols = torch.arange(L + 1, device=dev)
        rows = torch.arange(B, device=dev)

        while bool((count < max_new_tokens).any()):
            done = count >= max_new_tokens
            with stats.timed("verify"):
                t = (level.to(table.dtype) / S)[..., None]
                x = torch.where(known[..., None], noisy_embeddings(table[x0], t, eps, sigma), sigma * eps)
                embeds = torch.cat([table[pending][:, None], x], 1)                  # [B, L + 1, D]
                fed = torch.cat([pending[:, None], x0], 1)
                logits = model.step(state, fed, embeds=embeds)                      # [B, L + 1, V]
                stats.nfe += 1
                probs = sampling.probs(logits)
                clean = clean_prefix(level)
                if sampling.greedy or coupled:          # keep drafts equal to the model's own (coupled) draw
                    own = logits if sampling.greedy else probs / sampler.noise(count[:, None] + cols[None, :])
                    verdict = accept_greedy(x0, None, own)
                    n = torch.minimum(verdict.num_accepted, clean)
                    nxt = own[rows, n].argmax(-1)
                else:
                    one_hot = torch.nn.functional.one_hot(x0, V).to(q.dtype)
                    draft_q = torch.where((level == 0)[..., None], q, one_hot)
                    exps = sampler.exponential((B, L + 1, V))
                    verdict = accept_speculative(x0, draft_q, probs, sampler.uniform((B, L)), exps)
                    n = torch.minimum(verdict.num_accepted, clean)
                    # past the clean drafts there is nothing to verify: the token after them is the bonus
                    bonus = race(probs[rows, clean], exps[rows, clean])
                    nxt = torch.where(verdict.num_accepted >= clean, bonus, verdict.next_token)
            emitted = torch.where(done, 0, n + 1)
            state.rollback(L + 1 - torch.where(done, 0, n + 1))
            # write x0[:, :n] then nxt at count .. count + n
            new = torch.cat([x0, x0[:, :1]], 1).scatter(1, n[:, None], nxt[:, None])       # [B, L + 1]
            place = count[:, None] + cols[None, :]
            write = cols[None, :] < emitted[:, None]
            out.scatter_(1, place.clamp(max=out.shape[1] - 1), torch.where(write, new, out.gather(
                1, place.clamp(max=out.shape[1] - 1))))
            passes.scatter_(1, place.clamp(max=out.shape[1] - 1), torch.where(write, stats.nfe, passes.gather(
                1, place.clamp(max=out.shape[1] - 1))))
            stats.record_accepted(emitted[~done].tolist())
            count = count + emitted
            pending = torch.where(done, pending, nxt)
            # the Jacobi-denoising update: entry i of the new window is old entry i + e, predicted by column i + e
            e = emitted
            src = (cols[None, :L] + e[:, None])                                      # [B, L] old entry index
            col = src.clamp(max=L)
            p_new = probs.gather(1, col[..., None].expand(-1, -1, V))
            estimate = draw(p_new, count[:, None] + cols[None, :L])
            survivor = src < L
            old = src.clamp(max=L - 1)
            moved = ~done[:, None]
            new_level = torch.where(survivor, (level.gather(1, old) - 1).clamp(min=0), S)
            new_eps = torch.where(survivor[..., None], eps.gather(1, old[..., None].expand(-1, -1, eps.shape[-1])),
                                  fresh_noise(L))
            level = torch.where(moved, new_level, level)
            x0 = torch.where(moved, torch.where(src <= L, estimate, 0), x0)
            q = torch.where(moved[..., None], p_new, q)
            known = torch.where(moved, src <= L, known)
            eps = torch.where(moved[..., None], new_eps, eps)

    stats.new_tokens = B * max_new_tokens
    return Generation(out[:, :max_new_tokens].tolist(), stats, passes[:, :max_new_tokens].tolist())
