"""The field's CTC beam decoders on the same log-probs, for comparison (`mmaccel bench ctc`):
pyctcdecode (pure Python, kensho-technologies) and torchaudio's `ctc_decoder` (flashlight-text's
lexicon-free beam search, CPU, with KenLM reading the same ARPA file as `ngram_table`).

Both return `CTCHypothesis` like our decoders (pyctcdecode: word timestamps from its word frames;
flashlight: from its token timesteps). Neither runs on a GPU; pyctcdecode's word LM needs the
`kenlm` module (not installed), so it runs here without one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from mmaccel.errors import check
from mmaccel.speech.ctc.vocab import CTCHypothesis, CTCVocabulary, Word


def pyctcdecode_beam(log_probs: Tensor, vocab: CTCVocabulary, lengths: Tensor | None = None, *, beam: int = 16,
                     frame_seconds: float = 0.02) -> list[CTCHypothesis]:
    """pyctcdecode's beam search (no LM), one utterance at a time as its API takes them."""
    from pyctcdecode import build_ctcdecoder

    check(vocab.blank == 0, "pyctcdecode takes the blank as label 0")
    labels = ["" if i == vocab.blank else " " if i == vocab.space else t for i, t in enumerate(vocab.tokens)]
    decoder = build_ctcdecoder(labels)
    lengths = [log_probs.shape[1]] * log_probs.shape[0] if lengths is None else lengths.tolist()
    out = []
    for row, n in zip(log_probs.float().cpu().numpy(), lengths):
        text, _, frames, _, score = decoder.decode_beams(np.ascontiguousarray(row[:n]), beam_width=beam)[0][:5]
        words = [Word(w, round(a * frame_seconds, 3), round(b * frame_seconds, 3)) for w, (a, b) in frames]
        out.append(CTCHypothesis([], [], " ".join(text.split()), words, float(score)))
    return out


def flashlight_beam(log_probs: Tensor, vocab: CTCVocabulary, lengths: Tensor | None = None, *, beam: int = 16,
                    lm: str | Path | None = None, lm_weight: float = 0.5, insertion_bonus: float = 0.0,
                    threshold: float = 20.0, frame_seconds: float = 0.02) -> list[CTCHypothesis]:
    """torchaudio's flashlight lexicon-free decoder; `lm`: an ARPA file over the CTC labels (KenLM)."""
    from torchaudio.models.decoder import ctc_decoder

    check(vocab.delimiter is not None and vocab.space is not None, "flashlight needs a word delimiter token")
    decoder = ctc_decoder(lexicon=None, tokens=vocab.tokens, lm=None if lm is None else str(lm), beam_size=beam,
                          beam_threshold=threshold, lm_weight=lm_weight, word_score=insertion_bonus, sil_score=0.0,
                          blank_token=vocab.tokens[vocab.blank], sil_token=vocab.delimiter, unk_word="<unk>")
    emissions = log_probs.float().cpu().contiguous()
    lengths = None if lengths is None else lengths.to(torch.int32).cpu()
    out = []
    for (best, *_), in zip(decoder(emissions, lengths)):
        tokens = [int(t) for t in best.tokens if int(t) != vocab.blank]
        steps = [int(s) for t, s in zip(best.tokens, best.timesteps) if int(t) != vocab.blank]
        while tokens and tokens[0] == vocab.space:             # flashlight brackets the transcript in silences
            tokens, steps = tokens[1:], steps[1:]
        while tokens and tokens[-1] == vocab.space:
            tokens, steps = tokens[:-1], steps[:-1]
        out.append(vocab.hypothesis(tokens, steps, float(best.score), frame_seconds))
    return out
