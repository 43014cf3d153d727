"""Spoken-language identification with Whisper itself, as openai-whisper and faster-whisper do it: the decoder,
given <|startoftranscript|> alone, predicts a language token; its probabilities over the model's language
tokens (every other token masked) name the language of the window's audio."""

from __future__ import annotations

import dataclasses

import torch

from mmaccel.speech.decoder import WhisperDecoderModel
from mmaccel.speech.decoder_audio import EncodedAudio
from mmaccel.speech.whisper_vocab import WhisperTokens


@torch.inference_mode()
def language_probabilities(model: WhisperDecoderModel, audio: EncodedAudio, tokens: WhisperTokens) -> list[dict[str, float]]:
    """Per row of encoded `audio` (its own prompt and timestamp rules aside): language code -> probability, most
    likely first."""
    codes = list(tokens.languages)
    ids = torch.tensor([tokens.languages[c] for c in codes], device=model.device)
    start = torch.full((audio.prompt.shape[0], 1), tokens.start_of_transcript, dtype=torch.long)
    state = model.prefill(dataclasses.replace(audio, prompt=start, rules=None), 1)
    probs = state.logits.float().index_select(-1, ids).softmax(-1)        # [B, languages]
    out = []
    for row in probs.cpu().tolist():
        ranked = sorted(zip(codes, row), key=lambda pair: -pair[1])
        out.append(dict(ranked))
    return out
