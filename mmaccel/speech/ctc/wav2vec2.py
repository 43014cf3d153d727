"""User CTC models in the usual layout: a transformers `Wav2Vec2ForCTC` directory (`config.json`, weights,
`vocab.json`, optionally `tokenizer_config.json` and `preprocessor_config.json`).

The interface every CTC model here offers (`CTCModel`): `vocab` (a `CTCVocabulary`), `frame_seconds`,
and `log_probs(audios) -> (log_probs [B, T, V], lengths [B])` for 16 kHz audio, which the decoders
(`ctc_greedy`, `ctc_beam_search`) take as they are. Wav2vec2's blank is its pad token and its word
delimiter `|`; a frame is the product of the feature encoder's strides in samples (320: 20 ms).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from mmaccel.errors import InputError, ModelNotFoundError, check
from mmaccel.speech.audio import SAMPLE_RATE, AudioLike, as_audio
from mmaccel.speech.ctc.vocab import CTCVocabulary


class CTCModel(Protocol):
    vocab: CTCVocabulary
    frame_seconds: float

    def log_probs(self, audios: list[AudioLike]) -> tuple[Tensor, Tensor]: ...


class Wav2Vec2CTC:
    """A `Wav2Vec2ForCTC` and its vocabulary, reading 16 kHz audio."""

    def __init__(self, model, vocab: CTCVocabulary, *, normalize: bool = True):
        self.model, self.vocab, self.normalize = model.eval(), vocab, normalize
        stride = math.prod(model.config.conv_stride)
        self.frame_seconds = stride / SAMPLE_RATE
        check(model.config.vocab_size == len(vocab), f"the model predicts {model.config.vocab_size} labels, its "
              f"vocab.json has {len(vocab)}: they must come from the same checkpoint")

    @classmethod
    def from_pretrained(cls, path: str | Path, *, device: str | torch.device = "cpu") -> Wav2Vec2CTC:
        from transformers import Wav2Vec2ForCTC

        root = Path(path).expanduser()
        if not (root / "config.json").is_file():
            raise ModelNotFoundError(f"no Wav2Vec2ForCTC checkpoint at {root} (config.json missing); pass the directory "
                                     "that save_pretrained wrote")
        if not (root / "vocab.json").is_file():
            raise ModelNotFoundError(f"{root} has no vocab.json: a CTC checkpoint needs its label list")
        try:
            vocab_map = json.loads((root / "vocab.json").read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise InputError(f"{root / 'vocab.json'} is not a JSON token -> id map ({err})") from None
        check(isinstance(vocab_map, dict) and sorted(vocab_map.values()) == list(range(len(vocab_map))),
              f"{root / 'vocab.json'} must map each token to a distinct id 0..n-1")
        tokens = sorted(vocab_map, key=vocab_map.get)
        special = _read_json(root / "tokenizer_config.json")
        blank = vocab_map.get(special.get("pad_token", "<pad>"), 0)
        delimiter = special.get("word_delimiter_token", "|")
        normalize = _read_json(root / "preprocessor_config.json").get("do_normalize", True)
        try:
            model = Wav2Vec2ForCTC.from_pretrained(root).to(device)
        except (OSError, ValueError, RuntimeError) as err:
            raise ModelNotFoundError(f"cannot load the Wav2Vec2ForCTC weights in {root}: {err}") from None
        return cls(model, CTCVocabulary(tokens, blank, delimiter if delimiter in vocab_map else None), normalize=normalize)

    @torch.inference_mode()
    def log_probs(self, audios: list[AudioLike]) -> tuple[Tensor, Tensor]:
        """Per-frame label log-probabilities [B, T, V] of a batch of audio, and each row's frame count [B]."""
        check(isinstance(audios, (list, tuple)) and len(audios) > 0, "give a non-empty list of audio")
        samples = [as_audio(a).samples for a in audios]
        check(all(len(s) >= 400 for s in samples), "each audio must be at least 25 ms long")
        if self.normalize:                                     # wav2vec2's feature extractor: zero mean, unit variance
            samples = [(s - s.mean()) / np.sqrt(s.var() + 1e-7) for s in samples]
        if self.model.config.feat_extract_norm == "group":
            # group norm spans the whole time axis, so padding would change a row: one utterance at a time
            rows = [self._forward([s]) for s in samples]
            T = max(r.shape[1] for r in rows)
            logits = torch.cat([torch.nn.functional.pad(r, (0, 0, 0, T - r.shape[1])) for r in rows])
        else:
            logits = self._forward(samples)
        lengths = self.model._get_feat_extract_output_lengths(torch.tensor([len(s) for s in samples]))
        return logits.float().log_softmax(-1), lengths.long().clamp(max=logits.shape[1]).to(logits.device)

    def _forward(self, samples: list[np.ndarray]) -> Tensor:
        n = max(len(s) for s in samples)
        device = next(self.model.parameters()).device
        batch = torch.zeros(len(samples), n)
        mask = torch.zeros(len(samples), n, dtype=torch.long)
        for i, s in enumerate(samples):
            batch[i, :len(s)] = torch.from_numpy(np.asarray(s, dtype=np.float32))
            mask[i, :len(s)] = 1
        return self.model(batch.to(device), attention_mask=mask.to(device)).logits

def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{path} is not valid JSON ({err})") from None
    check(isinstance(value, dict), f"{path} must hold a JSON object")
    return value
