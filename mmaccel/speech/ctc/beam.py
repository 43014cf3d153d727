"""Greedy CTC and FlexCTC-style batched beam search (arXiv 2508.07315; reference asr.md section 4).

The beam search is label-synchronous with Viterbi recombination, over a [batch, beam] state held in
tensors: per frame, every hypothesis is extended by every label at once (blank and a repeat of the
frame's previous label emit nothing; any other label emits and adds the weighted scores of the fusion
models, `FusionTable`s, and the insertion bonus), the top `beam` of beam x vocabulary survive,
hypotheses more than `threshold` below the row's best are pruned, and hypotheses with the same
transcript (a 64-bit rolling hash) and the same last frame label are merged, keeping the best score. No
per-hypothesis Python, no host reads inside the frame loop: the loop's length is fixed before it
starts, so the same code runs on CPU and CUDA.

Blank-frame skipping: a frame whose blank probability exceeds `blank_skip` is taken as blank for
every hypothesis without a search step (the frames that are skipped are read once, before the loop);
paths that emit on such frames are given up, which is what torchaudio's CUDA decoder does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from mmaccel.errors import check
from mmaccel.speech.ctc.fusion import FusionTable
from mmaccel.speech.ctc.vocab import CTCHypothesis, CTCVocabulary

RECOMBINE = ("max", "sum")
HASH_BASE = 1_000_003           # rolling hash of a transcript (int64, wrapping): equal hashes = merge


def _check_inputs(log_probs: Tensor, lengths: Tensor | None, vocab: CTCVocabulary) -> Tensor:
    check(isinstance(log_probs, Tensor) and log_probs.dim() == 3 and log_probs.is_floating_point(),
          f"log_probs must be a float tensor [batch, frames, labels], got "
          f"{tuple(log_probs.shape) if isinstance(log_probs, Tensor) else type(log_probs).__name__}")
    B, T, V = log_probs.shape
    check(B > 0 and T > 0, f"log_probs must hold at least one frame of one utterance, got {tuple(log_probs.shape)}")
    check(V == len(vocab), f"log_probs have {V} labels, the vocabulary {len(vocab)}: they must be the same model's")
    check(not bool(torch.isnan(log_probs).any()), "log_probs contain NaN: check the model's output (and its input audio)")
    if lengths is None:
        return torch.full((B,), T, dtype=torch.long, device=log_probs.device)
    lengths = (lengths if isinstance(lengths, Tensor) else torch.tensor(lengths)).to(log_probs.device).long()
    check(lengths.shape == (B,) and bool(((lengths >= 0) & (lengths <= T)).all()),
          f"lengths must be [batch] frame counts in [0, {T}], got {lengths.tolist()}")
    return lengths


def ctc_greedy(log_probs: Tensor, vocab: CTCVocabulary, lengths: Tensor | None = None, *,
               frame_seconds: float = 0.02) -> list[CTCHypothesis]:
    """Best label per frame, repeats merged and blanks removed; the score is the best path's log-probability."""
    lengths = _check_inputs(log_probs, lengths, vocab)
    best, labels = log_probs.float().max(-1)                                           # [B, T]
    T = labels.shape[1]
    inside = torch.arange(T, device=labels.device)[None] < lengths[:, None]
    previous = torch.cat([torch.full_like(labels[:, :1], vocab.blank), labels[:, :-1]], 1)
    emit = inside & (labels != vocab.blank) & (labels != previous)
    scores = (best * inside).sum(1)
    out = []
    for b, (row, mask) in enumerate(zip(labels.cpu(), emit.cpu())):
        frames = mask.nonzero()[:, 0].tolist()
        out.append(vocab.hypothesis(row[frames].tolist(), frames, float(scores[b]), frame_seconds))
    return out


def _frame_plan(log_probs: Tensor, lengths: Tensor, blank: int, blank_skip: float | None):
    """Which frames each row searches: frames [B, J] (their indices, padded), count [B], and per searched
    frame the skipped frames just before it: their blank log-probability sum [B, J] and whether any [B, J];
    the skipped frames after a row's last searched one add `tail` [B]."""
    B, T, _ = log_probs.shape
    inside = torch.arange(T, device=log_probs.device)[None] < lengths[:, None]
    blank_lp = log_probs[..., blank].float()
    skip = inside & (blank_lp > math.log(blank_skip)) if blank_skip is not None else torch.zeros_like(inside)
    keep = inside & ~skip
    count = keep.sum(1)
    J = max(int(count.max()), 1)                                                     # the one host read
    slot = torch.where(keep, keep.cumsum(1) - 1, J)                                 # dropped frames -> column J
    frames = torch.zeros(B, J + 1, dtype=torch.long, device=log_probs.device)
    frames.scatter_(1, slot, torch.arange(T, device=frames.device).expand(B, T).contiguous())
    frames = frames[:, :J]
    skipped_lp = torch.where(skip, blank_lp, 0.0).cumsum(1)
    skipped_n = skip.long().cumsum(1)
    at = frames.clamp(max=T - 1)
    before_lp, before_n = (_since_previous(x.gather(1, at)) for x in (skipped_lp, skipped_n))
    last = frames.gather(1, (count - 1).clamp(min=0)[:, None])[:, 0]
    tail = skipped_lp[:, -1] - torch.where(count > 0, skipped_lp.gather(1, last[:, None])[:, 0], 0.0)
    return frames, count, before_lp, before_n > 0, tail


def _since_previous(x: Tensor) -> Tensor:
    """Per row, each entry of a running sum minus the one before it (the first stays)."""
    return x - torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)


@torch.inference_mode()
def ctc_beam_search(log_probs: Tensor, vocab: CTCVocabulary, lengths: Tensor | None = None, *, beam: int = 16,
                    fusion: Sequence[tuple[FusionTable, float]] = (), insertion_bonus: float = 0.0,
                    threshold: float = 20.0, blank_skip: float | None = 0.999, recombine: str = "max",
                    frame_seconds: float = 0.02) -> list[CTCHypothesis]:
    """Beam search over `log_probs` [B, T, V] (natural log, per frame normalised); `fusion`: (table,
    weight) pairs, e.g. an n-gram LM (`ngram_table`) and a boost list (`phrase_table`).

    `recombine`: how hypotheses with the same transcript and last frame label merge. "max" keeps the
    best alignment's score (Viterbi, as FlexCTC does for CTC); "sum" adds their probabilities
    (log-sum-exp), so a hypothesis scores its transcript over all the alignments the beam kept, as
    prefix beam search does (pyctcdecode); at the end the ones ending in blank and in a label merge too."""
    lengths = _check_inputs(log_probs, lengths, vocab)
    _check_settings(beam, threshold, blank_skip, insertion_bonus, recombine)
    tables = _fusion_tables(fusion, vocab, log_probs.device)

    device, (B, _, V), K = log_probs.device, log_probs.shape, beam
    frames, count, before_lp, before_any, tail = _frame_plan(log_probs, lengths, vocab.blank, blank_skip)
    J = frames.shape[1]
    NEG = float("-inf")
    lp_all, done = _searched_log_probs(log_probs, frames, count, before_lp, vocab.blank)
    forget = before_any | done                                                      # the last label resets to blank
    total = torch.full((B, K), NEG, device=device)
    total[:, 0] = 0.0
    last = torch.full((B, K), vocab.blank, dtype=torch.long, device=device)         # label of the previous frame
    states = [torch.full((B, K), t.start, dtype=torch.long, device=device) for t, _ in tables]
    digest = torch.zeros(B, K, dtype=torch.long, device=device)
    emits_gain = bool(tables) or insertion_bonus != 0.0
    # Without fusion or bonus a label's score is the same for every hypothesis, so only a frame's best K labels
    # can make the top K of beam x labels (any other label has K better ones on the same hypothesis): the
    # search reads those, [B, J, K] sorted, from one top-k over all frames (K x K candidates, not K x V).
    columns = None
    if not emits_gain and K < V:
        lp_all, columns = lp_all.topk(K, dim=-1)
    W = lp_all.shape[-1]
    can_emit = torch.arange(V, device=device) != vocab.blank                        # [V]
    labels_v = torch.arange(V, device=device)
    lower = torch.arange(K, device=device)[:, None] > torch.arange(K, device=device)[None, :]      # k' < k
    blank, none = (torch.tensor(v, device=device) for v in (vocab.blank, -1))    # made once, not per frame
    back_src = torch.empty(J, B, K, dtype=torch.long, device=device)
    back_label = torch.empty(J, B, K, dtype=torch.long, device=device)
    for j in range(J):
        last_j = torch.where(forget[:, j, None], blank, last)                            # [B, K]
        scores = total[..., None] + lp_all[:, j, None, :]                                # [B, K, W]
        if emits_gain:
            gain = torch.full((B, K, V), insertion_bonus, device=device)
            for (table, weight), state in zip(tables, states):
                gain = gain + weight * table.score[state]
            emit = can_emit & (labels_v != last_j[..., None])
            scores = scores + torch.where(emit, gain, 0.0)
        top, flat = scores.view(B, K * W).topk(K, dim=1)                                # [B, K], sorted
        src, label = flat // W, flat % W
        if columns is not None:
            label = columns[:, j].gather(1, label)
        top = top.masked_fill(top < top[:, :1] - threshold, NEG)
        emitted = (label != vocab.blank) & (label != last_j.gather(1, src))
        states = [torch.where(emitted, table.next[before, label], before)
                  for (table, _), before in ((t, s.gather(1, src)) for t, s in zip(tables, states))]
        parent = digest.gather(1, src)
        digest = torch.where(emitted, parent * HASH_BASE + label + 1, parent)
        total = _recombine(top, digest, label, lower, recombine)
        last = label
        back_src[j] = src
        back_label[j] = torch.where(emitted, label, none)
    total = total + tail[:, None]
    if recombine == "sum":                       # one transcript, ending in blank or in its last label: one score
        summed = torch.where(digest[:, :, None] == digest[:, None, :], total[:, None, :], NEG).logsumexp(-1)
        total = torch.where(total > NEG, summed, NEG)
    for (table, weight), state in zip(tables, states):
        total = total + weight * table.final[state]
    return _best_hypotheses(total, back_src, back_label, frames, vocab, frame_seconds)


def _check_settings(beam: int, threshold: float, blank_skip: float | None, insertion_bonus: float,
                    recombine: str) -> None:
    check(isinstance(beam, int) and beam >= 1, f"beam must be an int >= 1, got {beam!r}")
    check(isinstance(threshold, (int, float)) and threshold > 0, f"threshold must be > 0, got {threshold!r}")
    check(blank_skip is None or (isinstance(blank_skip, float) and 0.0 < blank_skip < 1.0),
          f"blank_skip must be a probability in (0, 1) or None, got {blank_skip!r}")
    check(math.isfinite(insertion_bonus), f"insertion_bonus must be finite, got {insertion_bonus!r}")
    check(recombine in RECOMBINE, f"recombine must be one of {', '.join(RECOMBINE)}, got {recombine!r}")


def _fusion_tables(fusion: Sequence[tuple[FusionTable, float]], vocab: CTCVocabulary,
                   device: torch.device) -> list[tuple[FusionTable, float]]:
    """The (table, weight) pairs of `fusion`, checked against the vocabulary and moved to `device`."""
    tables = []
    for table, weight in fusion:
        check(isinstance(table, FusionTable), f"fusion entries are (FusionTable, weight), got {type(table).__name__}")
        check(table.vocab_size == len(vocab), f"{table.name} covers {table.vocab_size} labels, the model {len(vocab)}: "
              "build it for this vocabulary")
        check(isinstance(weight, (int, float)) and math.isfinite(weight), f"{table.name} weight must be finite")
        tables.append((table.to(device), float(weight)))
    return tables


def _searched_log_probs(log_probs: Tensor, frames: Tensor, count: Tensor, before_lp: Tensor,
                        blank: int) -> tuple[Tensor, Tensor]:
    """Each searched frame's log-probs [B, J, V], the skipped blank frames just before it added, and
    `done` [B, J]: the columns past a row's count. Those become a "hold" frame (blank 0, the rest -inf,
    the last label forgotten), which keeps every hypothesis and its score, so no per-frame mask of the
    rows still searching is needed."""
    device, (B, _, V), J = log_probs.device, log_probs.shape, frames.shape[1]
    lp_all = log_probs.gather(1, frames[..., None].expand(B, J, V)).float() + before_lp[..., None]
    done = torch.arange(J, device=device)[None] >= count[:, None]
    hold = torch.full((V,), float("-inf"), device=device)
    hold[blank] = 0.0
    lp_all[done] = hold
    return lp_all, done


def _recombine(top: Tensor, digest: Tensor, label: Tensor, lower: Tensor, recombine: str) -> Tensor:
    """Scores [B, K] after recombination: of equal transcripts (`digest` hashes) with equal last labels only
    the first (best) stays, with its own score ("max", Viterbi) or the group's log-sum-exp ("sum");
    `lower` [K, K] is k' < k."""
    NEG = float("-inf")
    key = digest * HASH_BASE + label
    equal = key[:, :, None] == key[:, None, :]                                     # [B, K, K]
    same = equal & lower & (top > NEG)[:, None, :]
    if recombine == "sum":                       # each group's first takes its sum (relative to the row's best)
        best_k = top[:, :1].clamp(min=-1e30)                                   # a row of -inf stays -inf, not NaN
        top = torch.bmm(equal.to(top.dtype), (top - best_k).exp()[..., None])[..., 0].log() + best_k
    return top.masked_fill(same.any(-1), NEG)


def _best_hypotheses(total: Tensor, back_src: Tensor, back_label: Tensor, frames: Tensor, vocab: CTCVocabulary,
                     frame_seconds: float) -> list[CTCHypothesis]:
    """Each row's best-scoring hypothesis of `total` [B, K], read back through the back pointers."""
    B = total.shape[0]
    best = total.argmax(1)
    path, frames = torch.stack([_backtrack(back_src, back_label, best), frames]).tolist()   # [B, J] each
    scores = total.gather(1, best[:, None])[:, 0].tolist()
    return [vocab.hypothesis([t for t in path[b] if t >= 0], [f for t, f in zip(path[b], frames[b]) if t >= 0],
                             scores[b], frame_seconds) for b in range(B)]


def _backtrack(src: Tensor, label: Tensor, best: Tensor) -> Tensor:
    """The label emitted at each searched frame by hypothesis `best` [B] (-1: none), [B, J], from the back
    pointers src / label [J, B, K]: one gather per frame for the whole batch, on the search's device."""
    J, B, _ = src.shape
    out = torch.empty(B, J, dtype=torch.long, device=src.device)
    k = best[:, None]
    for j in range(J - 1, -1, -1):
        out[:, j] = label[j].gather(1, k)[:, 0]
        k = src[j].gather(1, k)
    return out
