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

from mmaccel.core.readout import project
from mmaccel.speech.decoder import EncodedAudio, WhisperDecoderModel
from mmaccel.speech.timestamps import rule_logits


@dataclass
class TokenScores:
    logprobs: list[float]         # one per generated token (end of text included)
    no_speech_prob: float


@torch.inference_mode()
def score_tokens(model: WhisperDecoderModel, inputs: EncodedAudio, tokens: list[list[int]],
                 no_speech: int | None) -> list[TokenScores]:
    """Each row's `tokens` (generated after the prompt) scored under `model`'s rules for `inputs`."""
    B, P = inputs.prompt.shape
    T = max(1, max(len(t) for t in tokens))
    padded = torch.full((B, T), int(inputs.prompt[0, 0]), dtype=torch.long)
    for b, row in enumerate(tokens):
        padded[b, : len(row)] = torch.tensor(row, dtype=torch.long)
    state = model.prefill(inputs, T, run=False)
    seq = torch.cat([inputs.prompt, padded], 1).to(model.device)
    hidden = model._forward(state, seq, None, None, readout=lambda h: h)      # normalised [B, P + T, d]
    weight = model.decoder.embed_tokens.weight
    bias = torch.cat([model._begin_bias[None], model.suppression.expand(T, -1)])      # [1 + T, V]
    out = []
    for b, row in enumerate(tokens):
        logits = project(hidden[b : b + 1, P - 1 :], weight).float() + bias
        logits = rule_logits(state, logits, rows=torch.tensor([b]))
        picked = torch.tensor(row, dtype=torch.long, device=logits.device)
        lp = logits[0, : len(row)].log_softmax(-1).gather(1, picked[:, None])[:, 0]
        nsp = 0.0
        if no_speech is not None:
            nsp = float(project(hidden[b, 0], weight).float().softmax(-1)[no_speech])
        out.append(TokenScores(lp.tolist(), nsp))
    return out


def compression_ratio(text: str) -> float:
    """len(text) / len(zlib(text)) in bytes: above ~2.4 the text repeats itself (a decoding loop)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0
