"""Confidence-based early exit for the Whisper decoder (CALM, Schuster et al. 2022): lossy, budgeted.

Every decoding step runs the decoder layer by layer. After each layer k that has a trained exit
head (`mmaccel.speech.heads`), the rows whose head is confident enough — largest softmax
probability over the head's shortlist, Whisper's suppression applied, strictly above `threshold` —
emit the head's arg-max and stop there; the layers above only write their keys/values for those
rows from the exited state (CALM's state propagation), so later tokens still attend to every
position at every layer. Rows that never exit run the full model.

`threshold` is the budget knob: 1.0 never exits (plain greedy, bit-identical; tested), lower
values exit earlier and may change tokens. Each call reports the average exit layer
(`DecodeStats.exit_hist`); the benchmark reports WER and the share of transcripts still identical
to greedy. `calibrate_threshold` turns a tolerated token disagreement δ with greedy, measured on
held-out audio, into a threshold (an empirical calibration, not CALM's statistical guarantee).

The exit decisions are made on the host by design: skipping a row's upper layers is the method's
whole saving, and work can only be left out once the host knows which rows left. On a GPU each step
therefore waits for the device at every layer with an exit head (and for the step's tokens), unlike
the decode loop. A version that never waits would run every layer for every row and keep the exited
rows' states by a mask: CALM's tokens with none of its saving.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmaccel.core.driver import AcceptedLengths, AllDone, DecodeCall, Emission, Generation
from mmaccel.core.readout import project
from mmaccel.core.stats import DecodeStats
from mmaccel.errors import check
from mmaccel.speech.decoder import EncodedAudio, WhisperDecoderModel
from mmaccel.speech.timestamps import rule_logits


def _head_logits(model: WhisperDecoderModel, head: nn.Module, h: Tensor) -> Tensor:
    hidden = head(h)
    projection = getattr(head, "projection", None)
    logits = projection(hidden) if projection is not None else project(hidden, model.decoder.embed_tokens.weight)
    return logits.float() + model.suppression


def calm_decode(model: WhisperDecoderModel, exits: dict[int, nn.Module], inputs: EncodedAudio, *, threshold: float,
                max_new_tokens: int, eos_token_id: int | None = None) -> Generation:
    """Greedy decoding of `inputs` with confident early exits after the layers in `exits`. Emission, the
    statistics and the all-done check are the core driver's; the step is CALM's own (layer by layer)."""
    check(0.0 <= threshold <= 1.0, f"threshold must be in [0, 1], got {threshold!r}")
    check(isinstance(max_new_tokens, int) and max_new_tokens >= 1, f"max_new_tokens must be an int >= 1, got {max_new_tokens}")
    exits = {k: head for k, head in exits.items() if 1 <= k < model.num_layers}
    model = model.eager()            # it runs the layers one by one (an int8 target's compiled pass runs them all)
    with DecodeCall(model.device) as call:
        with call.prefill():
            state = model.prefill(inputs, max_new_tokens + 1)
        token = state.logits.argmax(-1)
        B, dev = token.shape[0], token.device
        out = Emission(B, max_new_tokens, dev, eos_token_id)
        out.first(token, call.stats.nfe, max_new_tokens)
        lengths, none = AcceptedLengths(1, dev), token.new_zeros(B, 0)
        all_done = AllDone(dev)
        for _ in range(max_new_tokens - 1):      # one token per unfinished row and pass
            if all_done(out.done):
                break
            with call.target_pass():
                chosen, exit_at = _step(model, exits, state, token, threshold)
            active = ~out.done
            call.stats.exit_hist.update(exit_at[active.cpu()].tolist())
            out.emit(none, torch.zeros_like(token), chosen, active, call.stats.nfe, max_new_tokens)
            lengths.add(torch.ones_like(token), active)
            token = torch.where(out.done, token, chosen)
    return call.result(out, max_new_tokens, lengths)


def _step(model: WhisperDecoderModel, exits: dict[int, nn.Module], state, token: Tensor,
          threshold: float) -> tuple[Tensor, Tensor]:
    """One token per row: (the tokens [B], the layer each row left at [B] on the host)."""
    B, L = token.shape[0], model.num_layers
    h, step = model.embed(state, token[:, None].to(model.device))
    # finished rows run along, as in the greedy loop: at threshold 1 every matmul has the
    # shapes greedy's has, so the output is bit-identical
    running = torch.arange(B, device=model.device)
    chosen = token.clone()
    exit_at = torch.full((B,), L)
    for i in range(L):
        h = model.layer(i, h, step, rows=None if len(running) == B else running)
        head = exits.get(i + 1)
        if head is None or len(running) == 0:
            continue
        logits = _ruled(state, _head_logits(model, head, h.index_select(0, running)[:, -1]), running)
        confidence, guess = logits.softmax(-1).max(-1)
        leave = confidence > threshold
        chosen[running[leave]] = guess[leave].to(chosen.device)
        exit_at[running[leave].cpu()] = i + 1
        running = running[~leave]
    if len(running):
        last = model.decoder.layer_norm(h.index_select(0, running)[:, -1:])
        if model.argmax_readout is not None:     # the greedy loop's readout, so threshold 1 is greedy
            logits = model.argmax_readout(last)[:, -1]
        else:
            logits = model.readout(state, last)[:, -1] + model.suppression
        chosen[running] = _ruled(state, logits, running).argmax(-1).to(chosen.device)
    return chosen, exit_at


def _ruled(state, logits: Tensor, rows: Tensor) -> Tensor:
    """Next-token `logits` [R, V] of batch rows `rows` under the timestamp rules, if the audio has them."""
    return rule_logits(state, logits[:, None], rows=rows)[:, 0]


def token_disagreement(reference: list[list[int]], tokens: list[list[int]]) -> float:
    """Σ Levenshtein distance / Σ reference length between token sequences (0 = identical)."""
    edits = total = 0
    for ref, hyp in zip(reference, tokens):
        prev = list(range(len(hyp) + 1))
        for i, r in enumerate(ref, 1):
            cur = [i]
            for j, t in enumerate(hyp, 1):
                cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != t)))
            prev = cur
        edits, total = edits + prev[-1], total + len(ref)
    return edits / max(total, 1)


def calibrate_threshold(model: WhisperDecoderModel, exits: dict[int, nn.Module], batches: list[EncodedAudio], *,
                        delta: float, max_new_tokens: int, eos_token_id: int | None = None,
                        candidates: tuple[float, ...] = (0.999, 0.995, 0.99, 0.98, 0.95, 0.9, 0.8, 0.7, 0.6, 0.5)
                        ) -> tuple[float, list[tuple[float, float, float]]]:
    """The lowest candidate threshold whose token disagreement with greedy on `batches` stays <= δ
    (1.0 if none does), and per candidate tried (threshold, disagreement, mean exit layer)."""
    check(0.0 <= delta <= 1.0, f"delta must be in [0, 1], got {delta!r}")
    greedy = [calm_decode(model, exits, x, threshold=1.0, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id).tokens
              for x in batches]
    reference = [row for g in greedy for row in g]
    best, tried = 1.0, []
    for threshold in sorted(candidates, reverse=True):
        runs = [calm_decode(model, exits, x, threshold=threshold, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id)
                for x in batches]
        spent = token_disagreement(reference, [row for r in runs for row in r.tokens])
        tried.append((threshold, spent, sum((r.stats for r in runs), DecodeStats()).mean_exit_layer))
        if spent > delta:
            break
        best = threshold
    return best, tried
