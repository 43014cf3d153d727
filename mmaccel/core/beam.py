"""Beam search over any DecoderModel that can reorder its state's rows (`model.select_rows`).

The standard length-normalised search (as in Hugging Face `generate(num_beams=W)` with
`early_stopping=False`): every step extends each of the W running beams by every token, keeps the
best 2W candidates, moves candidates ending in EOS (among the best W) to the finished list with score
`sum(log p) / len ** length_penalty`, and continues the best W others. A row stops when it holds W
finished hypotheses and its best running beam can no longer beat the worst of them. Beams share the
cache machinery of every other method: each row of the state is one beam. It shares the decode driver's
frame and pass counting (`DecodeCall`) but keeps its own loop: its hypotheses are re-ranked and finished on
the host every step, so emission is choosing among beams, not appending accepted tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from mmaccel.core.driver import DecodeCall, Generation
from mmaccel.core.model import DecoderModel
from mmaccel.errors import check


def beam_search(model: DecoderModel, inputs: Any, *, num_beams: int, max_new_tokens: int, eos_token_id: int,
                length_penalty: float = 1.0) -> Generation:
    check(hasattr(model, "select_rows"), f"{type(model).__name__} cannot reorder its rows (select_rows), "
          "so it cannot run beam search")
    check(isinstance(num_beams, int) and num_beams >= 1, f"num_beams must be an int >= 1, got {num_beams!r}")
    check(isinstance(max_new_tokens, int) and max_new_tokens >= 1, f"max_new_tokens must be an int >= 1, got {max_new_tokens}")
    W = num_beams
    device = getattr(model, "device", torch.device("cpu"))
    with DecodeCall(device) as call:
        stats = call.stats
        with call.prefill():
            state = model.prefill(inputs, max_new_tokens + 1)
        B, V = state.logits.shape
        model.select_rows(state, torch.arange(B).repeat_interleave(W))
        logp = state.logits.float().log_softmax(-1).repeat_interleave(W, 0)          # [B*W, V]
        scores = torch.full((B, W), float("-inf"))
        scores[:, 0] = 0.0                                                            # one live beam at the start
        beams: list[list[int]] = [[] for _ in range(B * W)]
        finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
        done = [False] * B
        for length in range(1, max_new_tokens + 1):
            cand = (scores[:, :, None] + logp.cpu().view(B, W, V)).view(B, W * V)
            top_scores, top_ids = cand.topk(2 * W, dim=1)
            origin = torch.arange(B * W).view(B, W).clone()                           # default: keep rows
            next_tokens = torch.full((B, W), eos_token_id, dtype=torch.long)
            new_scores = torch.full((B, W), float("-inf"))
            new_beams = [list(b) for b in beams]
            for b in range(B):
                if done[b]:
                    continue
                kept = 0
                for rank in range(2 * W):
                    s, idx = float(top_scores[b, rank]), int(top_ids[b, rank])
                    if s == float("-inf"):
                        break
                    w, tok = divmod(idx, V)
                    if tok == eos_token_id:
                        if rank < W:
                            finished[b].append((s / length ** length_penalty, beams[b * W + w] + [tok]))
                        continue
                    origin[b, kept] = b * W + w
                    next_tokens[b, kept], new_scores[b, kept] = tok, s
                    new_beams[b * W + kept] = beams[b * W + w] + [tok]
                    kept += 1
                    if kept == W:
                        break
                if len(finished[b]) >= W:
                    finished[b] = sorted(finished[b], key=lambda x: -x[0])[:W]
                    best_running = float(new_scores[b].max()) / length ** length_penalty
                    done[b] = best_running <= finished[b][-1][0]
            beams, scores = new_beams, new_scores
            stats.record_accepted([1] * sum(1 for d in done if not d))
            if all(done) or length == max_new_tokens:
                break
            model.select_rows(state, origin.view(-1))
            with call.target_pass():
                logits = model.step(state, next_tokens.view(-1, 1).to(device))[:, 0]
            logp = logits.float().log_softmax(-1)
        out = []
        for b in range(B):
            pool = finished[b] or [(float(scores[b, w]) / len(beams[b * W + w]) ** length_penalty, beams[b * W + w])
                                   for w in range(W)]
            out.append(max(pool, key=lambda x: x[0])[1])
    stats.new_tokens = sum(len(r) for r in out)
    return Generation(out, stats)
