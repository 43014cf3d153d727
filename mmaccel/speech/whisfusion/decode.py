"""Parallel multi-step decoding of a `WhisfusionDecoder`, with K diverse candidates per utterance.

Each utterance's canvas starts fully masked. Every step runs the decoder once over all rows (B
utterances x K candidates in one batch), fills the masked positions and re-masks the least confident
of the positions just filled, so that after step s a share cos(pi/2 (s+1)/S) of the canvas is still
masked (MaskGIT's schedule); after the last step nothing is. Positions filled earlier stay fixed.

Diversity: candidate 0 of each utterance takes the arg-max everywhere (the deterministic decode);
candidates 1..K-1 sample their tokens at `temperature` and rank their confidences with Gumbel noise
of the same temperature, so they differ from step 0 on (Whisfusion's own loop fills step 0 by
arg-max in every row, which makes its K candidates identical after the first step).

Selection: `confidence` keeps the candidate whose tokens have the highest mean log-probability
(each token's probability when it was fixed, up to and including the first `<|endoftext|>`);
`rover` votes over the K candidates' normalised words (`rover`), candidates ordered by that
confidence, so the output is normalised text (Whisper's English normaliser). The cost is S decoder
passes over B x K rows, whatever the transcript's length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from mmaccel.errors import check
from mmaccel.speech.whisfusion.model import MASK, WhisfusionDecoder
from mmaccel.speech.whisfusion.rover import rover

SELECTIONS = ("rover", "confidence")


@dataclass
class WhisfusionResult:
    texts: list[str]                    # the selected transcript of each utterance
    candidates: list[list[str]]         # [B][K] each candidate's text
    confidence: list[list[float]]       # [B][K] mean log-probability of each candidate's tokens
    tokens: list[list[int]]             # [B] the most confident candidate's text tokens
    passes: int                         # decoder passes (each over all B x K rows)


def check_settings(candidates: int, steps: int, temperature: float, select: str) -> None:
    check(isinstance(candidates, int) and 1 <= candidates <= 64, f"candidates must be an int in [1, 64], got {candidates!r}")
    check(isinstance(steps, int) and 1 <= steps <= 64, f"steps must be an int in [1, 64], got {steps!r}")
    check(isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0,
          f"temperature must be a positive number, got {temperature!r}")
    check(select in SELECTIONS, f"unknown selection {select!r}; choose from {', '.join(SELECTIONS)}")


def still_masked(length: Tensor, step: int, steps: int) -> Tensor:
    """[R] canvas positions left masked after `step` (0-based) of `steps`, for canvases of `length` [R]."""
    return torch.floor(length.double() * math.cos(math.pi / 2 * (step + 1) / steps)).long().clamp_min(0)


@torch.no_grad()
def whisfusion_decode(model: WhisfusionDecoder, encoder_states: Tensor, seconds: list[float], prompt: list[int],
                      end_of_text: int, decode_text, *, candidates: int = 8, steps: int = 4, temperature: float = 1.0,
                      select: str = "rover", seed: int = 0, normalize=None) -> WhisfusionResult:
    """`encoder_states` [B, S, d] of B windows holding `seconds` of audio each; `decode_text(ids) -> str`
    (the tokenizer's decode, specials skipped); `normalize` (for `rover`) maps a text to the words voted
    on (default: Whisper's English normaliser)."""
    check_settings(candidates, steps, temperature, select)
    B, K, P = encoder_states.shape[0], candidates, len(prompt)
    check(len(seconds) == B, f"seconds needs one length per window ({B}), got {len(seconds)}")
    device = encoder_states.device
    host_lengths = [model.canvas_length(s, P) for s in seconds for _ in range(K)]   # [R], candidates adjacent
    lengths = torch.tensor(host_lengths, device=device)
    R, N = B * K, P + max(host_lengths)
    position = torch.arange(N, device=device)[None]
    canvas = (position >= P) & (position < P + lengths[:, None])                  # [R, N] positions to decode
    start = torch.tensor(prompt + [end_of_text] * (N - P), device=device).expand(R, N)
    tokens = torch.where(canvas, torch.full_like(start, MASK), start)
    padding = position >= P + lengths[:, None]
    states, cross_padding = model.cut_states(encoder_states, seconds)
    cross = [(k.repeat_interleave(K, 0), v.repeat_interleave(K, 0)) for k, v in model.cross_kv(states)]
    cross_padding = cross_padding.repeat_interleave(K, 0)
    sampled = (torch.arange(R, device=device) % K != 0)[:, None]                    # rows 1..K-1 of each utterance
    generator = torch.Generator(device=device).manual_seed(seed)
    ids = model.output_ids(end_of_text)                                           # [V'] ids the read-out covers
    readout = model.decoder.embed_tokens.weight[ids]
    logp_kept = torch.zeros(R, N, device=device)
    for step in range(steps):
        masked = tokens == MASK
        hidden = model.hidden(tokens, cross, padding, cross_padding)[:, P:]
        logp = torch.log_softmax(torch.nn.functional.linear(hidden, readout).float(), -1)   # [R, L, V']
        choice = logp.argmax(-1)                                                     # [R, L]
        if K > 1:                                    # rows 1..K-1 of each utterance sample (fixed shapes)
            probs = torch.softmax(logp.view(B, K, N - P, -1)[:, 1:] / temperature, -1)
            drawn = torch.multinomial(probs.flatten(0, 2), 1, generator=generator).view(B, K - 1, N - P)
            choice = torch.cat([choice.view(B, K, N - P)[:, :1], drawn], 1).view(R, N - P)
        chosen = logp.gather(-1, choice[..., None]).squeeze(-1)                    # [R, L]
        fresh = masked[:, P:]
        rank_key = chosen + torch.where(sampled, temperature * _gumbel((R, N - P), generator, device), 0.0)
        rank_key = torch.where(fresh, rank_key, float("inf"))                       # only fresh ones may be re-masked
        keep_masked = still_masked(lengths, step, steps)
        ranks = rank_key.argsort(1).argsort(1)
        remask = fresh & (ranks < keep_masked[:, None])
        fill = fresh & ~remask
        tokens[:, P:] = torch.where(fill, ids[choice], tokens[:, P:])
        logp_kept[:, P:] = torch.where(fill, chosen, logp_kept[:, P:])
    texts, scores, ids = [], [], []
    canvases, kept = tokens[:, P:].cpu().tolist(), logp_kept[:, P:].cpu()                  # one read-back
    for r, (row, L) in enumerate(zip(canvases, host_lengths)):
        row = row[:L]
        end = row.index(end_of_text) if end_of_text in row else len(row)
        ids.append(row[:end])
        texts.append(decode_text(row[:end]).strip())
        scores.append(float(kept[r, :min(end + 1, L)].mean()))
    by_utt = [list(range(b * K, (b + 1) * K)) for b in range(B)]
    best = [max(rows, key=lambda r: scores[r]) for rows in by_utt]
    if select == "confidence":
        chosen_texts = [texts[r] for r in best]
    else:
        if normalize is None:
            from mmaccel.metrics.wer import normalize
        chosen_texts = [rover([normalize(texts[r]) for r in sorted(rows, key=lambda r: -scores[r])]) for rows in by_utt]
    return WhisfusionResult(chosen_texts, [[texts[r] for r in rows] for rows in by_utt],
                            [[round(scores[r], 4) for r in rows] for rows in by_utt], [ids[r] for r in best], steps)


def _gumbel(shape: tuple[int, ...], generator: torch.Generator, device) -> Tensor:
    return -torch.log(-torch.log(torch.rand(shape, generator=generator, device=device).clamp(1e-20, 1 - 1e-7)))
