"""`CTCPipeline`: audio in, transcripts with word timestamps out, through a CTC model and one of the
methods of `mmaccel.speech.ctc.methods` (greedy, or batched beam search with an optional n-gram LM and boost list).

    pipe = CTCPipeline.from_pretrained("builtin:ctc-base", lm="chars.arpa")
    out = pipe.transcribe(["clip.wav"], "beam", beam=16, boost=["kneser ney"])
    out.texts[0], out.transcripts[0].words, out.stats.time_s

Models: `WhisperCTC` directories (`ctc.json`, from `python -m mmaccel.speech.ctc.train`), the built-in
one (`builtin:ctc-base`, shipped in `mmaccel/assets/ctc_whisper_base` once trained), and transformers
`Wav2Vec2ForCTC` directories. Audio longer than 30 s is cut into windows (`split_long`: at the
quietest moment before each 30 s mark) that are decoded in the same batch and joined, their word
times shifted to the clip's clock. `exit=(criterion, threshold)` runs a `WhisperCTC` with early exit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mmaccel.core.methods import Method, Resources
from mmaccel.core.plugin import MethodPlugin
from mmaccel.core.stats import DecodeStats
from mmaccel.errors import ModelNotFoundError, check
from mmaccel.paths import assets_dir
from mmaccel.speech.audio import AudioLike, as_audio, split_long
from mmaccel.speech.ctc.arpa import NGramModel
from mmaccel.speech.ctc.boosting import phrase_table
from mmaccel.speech.ctc.fusion import FusionTable
from mmaccel.speech.ctc.lm import ngram_table
from mmaccel.speech.ctc.methods import CTC_REGISTRY, Posteriors, build_ctc_method
from mmaccel.speech.ctc.vocab import CTCHypothesis, Word

BUILTIN = {"builtin:ctc-base": "ctc_whisper_base"}
TRAIN_HINT = "python -m mmaccel.speech.ctc.train --out runs/ctc_whisper_base"


@dataclass
class CTCOutput:
    """Transcripts (one per input, with word times), the decode statistics (time_s: model, decode, total; nfe:
    model batches; new_tokens: labels emitted), the method's name, the audio's duration in seconds and the exit
    layer of each input (early exit; else None). Its core fields are `ASROutput`'s: texts, stats, method,
    audio_s, wall_s, rtfx."""

    transcripts: list[CTCHypothesis]
    stats: DecodeStats
    method: str
    audio_s: float = 0.0
    exit_layers: list[int] | None = None

    @property
    def texts(self) -> list[str]:
        """Each transcript's text, in input order."""
        return [t.text for t in self.transcripts]

    @property
    def wall_s(self) -> float:
        """Audio preparation + model + decoder, seconds."""
        return self.stats.time_s.get("total", 0.0)

    @property
    def rtfx(self) -> float:
        """Seconds of audio per second of compute."""
        return self.audio_s / max(1e-9, self.wall_s)

    @property
    def seconds(self) -> dict[str, float]:
        """`stats.time_s` (this output's name for it before the shared contract)."""
        return self.stats.time_s

    @property
    def audio_seconds(self) -> float:
        """`audio_s` (this output's name for it before the shared contract)."""
        return self.audio_s


class CTCPipeline:
    """A CTC model (`CTCModel`), plus an optional LM (a `FusionTable`, an `NGramModel` or an ARPA path over
    the model's labels) fused with `lm_weight` and an insertion bonus."""

    def __init__(self, model, *, lm: FusionTable | NGramModel | str | Path | None = None, lm_weight: float = 0.5,
                 insertion_bonus: float = 0.0):
        self.model, self.vocab = model, model.vocab
        self.lm = lm if lm is None or isinstance(lm, FusionTable) else ngram_table(lm, self.vocab)
        self.lm_weight, self.insertion_bonus = float(lm_weight), float(insertion_bonus)

    @staticmethod
    def methods() -> dict[str, MethodPlugin]:
        """The methods `transcribe` takes: name -> plug-in (parameters, exactness, needs)."""
        return CTC_REGISTRY

    @classmethod
    def from_pretrained(cls, source: str = "builtin:ctc-base", *, device: str | torch.device | None = None,
                        dtype: str | torch.dtype | None = None, **kwargs) -> CTCPipeline:
        """`source`: "builtin:ctc-base", a `WhisperCTC` directory or a `Wav2Vec2ForCTC` directory; `device`: cpu
        (default), cuda, cuda:N or auto; `dtype`: the Whisper encoder's (a `WhisperCTC`: the heads stay float32;
        None keeps the checkpoint's). `kwargs` go to the pipeline (lm, lm_weight, insertion_bonus)."""
        from mmaccel.devices import resolve_device, resolve_dtype
        from mmaccel.speech.ctc.wav2vec2 import Wav2Vec2CTC
        from mmaccel.speech.ctc.whisper_ctc import WhisperCTC

        device = resolve_device(device)
        dtype = resolve_dtype(dtype, device)
        if source.startswith("builtin:"):
            check(source in BUILTIN, f"unknown built-in CTC model {source!r}; choose from {', '.join(BUILTIN)}")
            path = assets_dir() / BUILTIN[source]
            if not (path / "ctc.json").is_file():
                raise ModelNotFoundError(f"{source} is not in this install ({path} missing); train it with `{TRAIN_HINT}`")
        else:
            path = Path(source).expanduser()
        if (path / "ctc.json").is_file():
            model = WhisperCTC.load(path).to(device)
            if dtype is not None:
                model.encoder.to(dtype)
            return cls(model, **kwargs)
        if (path / "config.json").is_file():
            check(dtype is None, "dtype applies to WhisperCTC models; a Wav2Vec2ForCTC runs in its checkpoint's dtype")
            return cls(Wav2Vec2CTC.from_pretrained(path, device=device), **kwargs)
        raise ModelNotFoundError(f"no CTC model at {path}: expected a WhisperCTC directory (ctc.json) or a "
                                 "Wav2Vec2ForCTC directory (config.json, vocab.json)")

    @torch.inference_mode()
    def transcribe(self, audios: list[AudioLike], method: str | Method = "beam", *, batch_size: int | None = None,
                   sample_rate: int | None = None, boost: list[str] | None = None, boost_weight: float = 1.0,
                   exit: tuple[str, float] | None = None, **params: Any) -> CTCOutput:
        """Transcribe `audios` (paths, arrays with `sample_rate` or rates, `Audio`s).

        `method`: a name from `CTCPipeline.methods()` ("greedy", "beam") or a Method; `params` configure it
        (beam, threshold, blank_skip, recombine). `batch_size`: windows per model batch (None: all in one).
        `boost`: phrases fused with `boost_weight` beside the pipeline's LM; `exit=(criterion, threshold)`: a
        `WhisperCTC`'s encoder early exit (`WhisperCTC.transcribe_early_exit`).
        """
        spec = build_ctc_method(method, **params)
        check(isinstance(audios, (list, tuple)) and len(audios) > 0, "give a non-empty list of audio")
        check(batch_size is None or (isinstance(batch_size, int) and batch_size >= 1),
              f"batch_size must be an int >= 1 or None, got {batch_size!r}")
        check(exit is None or hasattr(self.model, "transcribe_early_exit"), "early exit needs a WhisperCTC model")
        fusion = [] if self.lm is None else [(self.lm, self.lm_weight)]
        if boost:
            fusion.append((phrase_table(boost, self.vocab), boost_weight))
        resources = Resources(self.model, extras={"fusion": fusion, "insertion_bonus": self.insertion_bonus})
        spec.check_needs(resources)
        t0 = time.perf_counter()
        clips = [as_audio(a, sample_rate) for a in audios]
        windows, owner, offset = _windows(clips)
        stats = DecodeStats(time_s={"model": time.perf_counter() - t0, "decode": 0.0})
        pieces, layers = [], []
        size = batch_size or len(windows)
        for start in range(0, len(windows), size):
            with stats.timed("model"):
                posteriors, exits = self._posteriors(windows[start:start + size], exit)
            with stats.timed("decode"):
                pieces += spec.runner(resources, posteriors)
            layers += exits or []
            stats.nfe += 1
        with stats.timed("decode"):
            transcripts = [_join([p for p, o in zip(pieces, owner) if o == i],
                                 [s for s, o in zip(offset, owner) if o == i], self.model.frame_seconds)
                           for i in range(len(clips))]
        stats.time_s["total"] = stats.time_s["model"] + stats.time_s["decode"]
        stats.new_tokens = sum(len(p.tokens) for p in pieces)
        exit_layers = None if exit is None else [max(layer for layer, o in zip(layers, owner) if o == i)
                                                 for i in range(len(clips))]
        return CTCOutput(transcripts, stats, spec.name, sum(c.duration for c in clips), exit_layers)

    def _posteriors(self, windows: list, exit: tuple[str, float] | None) -> tuple[Posteriors, list[int] | None]:
        """The model's log-probabilities of `windows` (with early exit: and each window's exit layer)."""
        if exit is None:
            log_probs, lengths = self.model.log_probs(windows)
            return Posteriors(log_probs, lengths, self.model.frame_seconds), None
        result = self.model.transcribe_early_exit(windows, *exit)
        return Posteriors(result.log_probs, result.lengths, self.model.frame_seconds), result.layers.tolist()


def _windows(clips: list) -> tuple[list, list[int], list[float]]:
    """Every clip cut into windows of at most 30 s: the windows, the clip each belongs to, and its start (s)."""
    windows, owner, offset = [], [], []
    for i, clip in enumerate(clips):
        start = 0.0
        for piece in split_long(clip):
            windows.append(piece)
            owner.append(i)
            offset.append(start)
            start += piece.duration
    return windows, owner, offset


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
