"""`CTCPipeline`: audio in, transcripts with word timestamps out, through a CTC model and one of the
decoders of `mmaccel.speech.ctc.beam`, with an optional n-gram LM and boost list.

    pipe = CTCPipeline.from_pretrained("builtin:ctc-base", lm="chars.arpa")
    out = pipe.transcribe(["clip.wav"], "beam", beam=16, boost=["kneser ney"])
    out.transcripts[0].text, out.transcripts[0].words

Models: `WhisperCTC` directories (`ctc.json`, from `python -m mmaccel.speech.ctc.train`), the built-in
one (`builtin:ctc-base`, shipped in `mmaccel/assets/ctc_whisper_base` once trained), and transformers
`Wav2Vec2ForCTC` directories. Audio longer than 30 s is cut into windows (`split_long`: at the
quietest moment before each 30 s mark) that are decoded in the same batch and joined, their word
times shifted to the clip's clock. `exit=(criterion, threshold)` runs a `WhisperCTC` with early exit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mmaccel.errors import ModelNotFoundError, check
from mmaccel.paths import assets_dir
from mmaccel.speech.audio import AudioLike, as_audio, split_long
from mmaccel.speech.ctc.arpa import NGramModel
from mmaccel.speech.ctc.beam import ctc_beam_search, ctc_greedy
from mmaccel.speech.ctc.boosting import phrase_table
from mmaccel.speech.ctc.fusion import FusionTable
from mmaccel.speech.ctc.lm import ngram_table
from mmaccel.speech.ctc.vocab import CTCHypothesis, Word

BUILTIN = {"builtin:ctc-base": "ctc_whisper_base"}
METHODS = ("greedy", "beam")
TRAIN_HINT = "python -m mmaccel.speech.ctc.train --out runs/ctc_whisper_base"


@dataclass
class CTCOutput:
    """Transcripts (one per input), the exit layer of each (early exit; else None), the seconds spent
    in the model and the decoder, and the audio's duration."""

    transcripts: list[CTCHypothesis]
    exit_layers: list[int] | None = None
    seconds: dict = field(default_factory=dict)
    audio_seconds: float = 0.0

    @property
    def rtfx(self) -> float:
        """Seconds of audio per second of compute."""
        return self.audio_seconds / max(1e-9, self.seconds.get("total", 0.0))


class CTCPipeline:
    """A CTC model (`CTCModel`), plus an optional LM (a `FusionTable`, an `NGramModel` or an ARPA path over
    the model's labels) fused with `lm_weight` and an insertion bonus."""

    def __init__(self, model, *, lm: FusionTable | NGramModel | str | Path | None = None, lm_weight: float = 0.5,
                 insertion_bonus: float = 0.0):
        self.model, self.vocab = model, model.vocab
        self.lm = lm if lm is None or isinstance(lm, FusionTable) else ngram_table(lm, self.vocab)
        self.lm_weight, self.insertion_bonus = float(lm_weight), float(insertion_bonus)

    @classmethod
    def from_pretrained(cls, source: str = "builtin:ctc-base", **kwargs) -> CTCPipeline:
        from mmaccel.speech.ctc.wav2vec2 import Wav2Vec2CTC
        from mmaccel.speech.ctc.whisper_ctc import WhisperCTC

        if source.startswith("builtin:"):
            check(source in BUILTIN, f"unknown built-in CTC model {source!r}; choose from {', '.join(BUILTIN)}")
            path = assets_dir() / BUILTIN[source]
            if not (path / "ctc.json").is_file():
                raise ModelNotFoundError(f"{source} is not in this install ({path} missing); train it with `{TRAIN_HINT}`")
        else:
            path = Path(source).expanduser()
        if (path / "ctc.json").is_file():
            return cls(WhisperCTC.load(path), **kwargs)
        if (path / "config.json").is_file():
            return cls(Wav2Vec2CTC.from_pretrained(path), **kwargs)
        raise ModelNotFoundError(f"no CTC model at {path}: expected a WhisperCTC directory (ctc.json) or a "
                                 "Wav2Vec2ForCTC directory (config.json, vocab.json)")

    @torch.inference_mode()
    def transcribe(self, audios: list[AudioLike], method: str = "beam", *, beam: int = 16, threshold: float = 20.0,
                   blank_skip: float | None = 0.999, boost: list[str] | None = None, boost_weight: float = 1.0,
                   exit: tuple[str, float] | None = None) -> CTCOutput:
        """Transcribe `audios` (paths, arrays with rates, `Audio`); `method` "greedy" or "beam"."""
        check(method in METHODS, f"unknown CTC method {method!r}; choose from {', '.join(METHODS)}")
        check(isinstance(audios, (list, tuple)) and len(audios) > 0, "give a non-empty list of audio")
        check(exit is None or hasattr(self.model, "transcribe_early_exit"), "early exit needs a WhisperCTC model")
        t0 = time.perf_counter()
        clips = [as_audio(a) for a in audios]
        windows, owner, offset = [], [], []
        for i, clip in enumerate(clips):
            start = 0.0
            for piece in split_long(clip):
                windows.append(piece)
                owner.append(i)
                offset.append(start)
                start += piece.duration
        layers = None
        if exit is None:
            log_probs, lengths = self.model.log_probs(windows)
        else:
            result = self.model.transcribe_early_exit(windows, *exit)
            log_probs, lengths, layers = result.log_probs, result.lengths, result.layers.tolist()
        t1 = time.perf_counter()
        fusion = [] if self.lm is None else [(self.lm, self.lm_weight)]
        if boost:
            fusion.append((phrase_table(boost, self.vocab), boost_weight))
        step = self.model.frame_seconds
        if method == "greedy":
            check(not fusion, "greedy decoding reads no LM or boost list: use method='beam'")
            pieces = ctc_greedy(log_probs, self.vocab, lengths, frame_seconds=step)
        else:
            pieces = ctc_beam_search(log_probs, self.vocab, lengths, beam=beam, fusion=fusion,
                                     insertion_bonus=self.insertion_bonus, threshold=threshold,
                                     blank_skip=blank_skip, frame_seconds=step)
        transcripts = [_join([p for p, o in zip(pieces, owner) if o == i],
                             [s for s, o in zip(offset, owner) if o == i], step) for i in range(len(clips))]
        t2 = time.perf_counter()
        exit_layers = None if layers is None else [max(layer for layer, o in zip(layers, owner) if o == i)
                                                   for i in range(len(clips))]
        return CTCOutput(transcripts, exit_layers, {"model": t1 - t0, "decode": t2 - t1, "total": t2 - t0},
                         sum(c.duration for c in clips))


def _join(pieces: list[CTCHypothesis], offsets: list[float], frame_seconds: float) -> CTCHypothesis:
    """One clip's windows as one hypothesis: labels and frames in order (frames on the clip's clock),
    words shifted by their window's start, scores added."""
    if len(pieces) == 1:
        return pieces[0]
    tokens, frames, words = [], [], []
    for piece, start in zip(pieces, offsets):
        shift = round(start / frame_seconds)
        tokens += piece.tokens
        frames += [f + shift for f in piece.frames]
        words += [Word(w.text, round(w.start + start, 3), round(w.end + start, 3)) for w in piece.words]
    return CTCHypothesis(tokens, frames, " ".join(w.text for w in words), words, sum(p.score for p in pieces))
