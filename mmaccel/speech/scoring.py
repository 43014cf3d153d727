"""What a segment reports besides its text, read from one teacher-forced decoder pass over the tokens a
method produced: each token's log-probability under the decoding rules (suppression, begin-suppression,
timestamp rules: the distribution greedy decoding took its arg-max of), and the probability of
<|nospeech|> at <|startoftranscript|> (before any rule, as openai-whisper reads it).

One pass per batch costs about what a prefill of the transcript does, whichever method decoded it, so
the methods need not carry probabilities through their loops (a verified draft token's probability is
the target's anyway).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from mmaccel.speech.decoder import EncodedAudio, WhisperDecoderModel
from mmaccel.speech.timestamps import rule_logits

ROWS_PER_PRODUCT = 512      # positions projected to the vocabulary at once (51 865 logits each: ~100 MB)


@dataclass
class TokenScores:
    logprobs: list[float]         # one per generated token (end of text included)
    no_speech_prob: float


@torch.inference_mode()
def score_tokens(model: WhisperDecoderModel, inputs: EncodedAudio, tokens: list[list[int]],
                 no_speech: int | None, start: int = 0) -> list[TokenScores]:
    """Each row's `tokens` (generated after the prompt) scored under `model`'s rules for `inputs`; the
    no-speech probability is read at <|startoftranscript|>, position `start` of the prompt (after a text prompt)."""
    B, P = inputs.prompt.shape
    T = max(1, max(len(t) for t in tokens))
    padded = torch.full((B, T), int(inputs.prompt[0, 0]), dtype=torch.long)
    for b, row in enumerate(tokens):
        padded[b, : len(row)] = torch.tensor(row, dtype=torch.long)
    state = model.prefill(inputs, T, run=False)
    seq = torch.cat([inputs.prompt, padded], 1).to(model.device)
    hidden = model._forward(state, seq, None, None, readout=lambda h: h, any_shape=True)      # normalised [B, P + T, d]
    bias = torch.cat([model._begin_bias[None], model.suppression.expand(T, -1)])      # [1 + T, V]
    out = []
    group = max(1, ROWS_PER_PRODUCT // (T + 2))         # rows projected together (logits of all their positions)
    for first in range(0, B, group):
        rows = torch.arange(first, min(B, first + group))
        h = hidden[rows.to(hidden.device)]
        # <|startoftranscript|>'s position (the no-speech probability), then the one before each token,
        # through the model's own projection (an int8 model's logits are its own)
        logits = model._project(torch.cat([h[:, start : start + 1], h[:, P - 1 :]], 1))      # [g, 2 + T, V]
        nsp = logits[:, 0].softmax(-1)[:, no_speech].tolist() if no_speech is not None else [0.0] * len(rows)
        logprobs = rule_logits(state, logits[:, 1:] + bias, rows=rows).log_softmax(-1)
        for i, b in enumerate(rows.tolist()):
            picked = torch.tensor(tokens[b], dtype=torch.long, device=logprobs.device)
            lp = logprobs[i, : len(tokens[b])].gather(1, picked[:, None])[:, 0]
            out.append(TokenScores(lp.tolist(), nsp[i]))
    return out


def compression_ratio(text: str) -> float:
    """len(text) / len(zlib(text)) in bytes: above ~2.4 the text repeats itself (a decoding loop)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0
