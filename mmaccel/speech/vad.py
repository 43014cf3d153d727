"""Voice activity detection: where an input speaks, by Silero VAD (the `silero-vad` package, which
carries its TorchScript weights; nothing is downloaded).

`speech_regions` finds the speech of a clip as sample ranges; `ASRPipeline.transcribe(vad_filter=True)`
then decodes only those (merged into windows of at most 30 s, `mmaccel.speech.windows`), so long
silences and noise never reach the decoder, where Whisper tends to hallucinate text.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch

from mmaccel.errors import InputError, check
from mmaccel.speech.audio import SAMPLE_RATE, WINDOW_S


@dataclass(frozen=True)
class VadParameters:
    """Silero VAD's options; the defaults are faster-whisper's batched pipeline's (its regions fill
    Whisper windows)."""

    threshold: float = 0.5                # a 32-ms frame is speech when its probability is at least this
    neg_threshold: float | None = None    # ... and speech ends below this (None: threshold - 0.15)
    min_speech_duration_ms: int = 0       # shorter regions are dropped
    max_speech_duration_s: float = WINDOW_S   # longer regions are split (at a pause where there is one)
    min_silence_duration_ms: int = 160    # a region ends after this much silence
    speech_pad_ms: int = 400              # each region is widened by this much on both sides

    def __post_init__(self) -> None:
        check(0.0 < self.threshold < 1.0, f"vad threshold must be in (0, 1), got {self.threshold!r}")
        check(self.neg_threshold is None or 0.0 < self.neg_threshold <= self.threshold,
              f"vad neg_threshold must be in (0, threshold], got {self.neg_threshold!r}")
        check(0.0 < self.max_speech_duration_s <= WINDOW_S,
              f"vad max_speech_duration_s must be in (0, {WINDOW_S:.0f}] (a region must fit a Whisper window), "
              f"got {self.max_speech_duration_s!r}")
        for name in ("min_speech_duration_ms", "min_silence_duration_ms", "speech_pad_ms"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 0, f"vad {name} must be an int >= 0, got {value!r}")

    @classmethod
    def of(cls, value: VadParameters | dict | None) -> VadParameters:
        """`value` as parameters: these, a dict of some of them, or None (the defaults)."""
        if isinstance(value, VadParameters):
            return value
        check(value is None or isinstance(value, dict), f"vad_parameters must be a dict, got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value or {}) - known)
        check(not unknown, f"unknown vad parameter(s) {unknown}; known: {sorted(known)}")
        return cls(**(value or {}))

    def to_dict(self) -> dict:
        return asdict(self)


FRAME = 512          # samples per Silero frame at 16 kHz (32 ms)
CONTEXT = 64         # samples of the frame before that each frame's features also see
BLOCK = 4096         # frames per batch (about 2 minutes of audio)


@functools.cache
def _package():
    """The `silero_vad` package, imported here only: importing it sets torch to one thread, put back after."""
    threads = torch.get_num_threads()
    try:
        import silero_vad
    except ImportError:
        raise InputError("vad_filter needs the silero-vad package (it carries the VAD weights): "
                         "pip install --no-deps silero-vad") from None
    finally:
        torch.set_num_threads(threads)
    return silero_vad


@functools.cache
def silero() -> torch.jit.ScriptModule:
    """The Silero VAD model the `silero-vad` package carries (TorchScript), loaded once."""
    return _package().load_silero_vad(onnx=False)


@functools.cache
def _recurrence() -> torch.nn.LSTM:
    """The model's LSTM cell as an `nn.LSTM` (the same weights and equations) that runs a whole sequence."""
    cell = silero()._model.decoder.rnn
    lstm = torch.nn.LSTM(cell.weight_ih.shape[1], cell.weight_hh.shape[1])
    with torch.no_grad():
        for mine, theirs in (("weight_ih_l0", "weight_ih"), ("weight_hh_l0", "weight_hh"), ("bias_ih_l0", "bias_ih"),
                             ("bias_hh_l0", "bias_hh")):
            getattr(lstm, mine).copy_(getattr(cell, theirs))
    return lstm.eval()


def speech_probabilities(samples: np.ndarray) -> torch.Tensor:
    """Silero's speech probability of each 32-ms frame of 16 kHz `samples` (the last one zero-padded): what the
    model gives frame by frame, its convolutional front end run on a block of frames at once and its LSTM over
    the block's sequence (about 10x faster on a CPU than one call per frame)."""
    model = silero()._model
    frames = -(-len(samples) // FRAME)
    out, state = [], None
    with torch.inference_mode():
        for first in range(0, frames, BLOCK):
            chunk = _padded(samples, first * FRAME, min(first + BLOCK, frames) * FRAME + CONTEXT).unfold(
                0, CONTEXT + FRAME, FRAME)
            features = model.encoder(model.stft(chunk)).squeeze(-1)
            hidden, state = _recurrence()(features, state)
            out.append(model.decoder.decoder(hidden.unsqueeze(-1)).squeeze(1).mean(1))
    return torch.cat(out)


def _padded(samples: np.ndarray, start: int, end: int) -> torch.Tensor:
    """Positions [start, end) of the samples behind CONTEXT zeros and zero-padded at the end (made one block at a
    time: a long input is not copied whole)."""
    block = torch.zeros(end - start)
    a, b = max(start - CONTEXT, 0), min(end - CONTEXT, len(samples))
    if b > a:
        block[a + CONTEXT - start : b + CONTEXT - start] = torch.from_numpy(np.asarray(samples[a:b], dtype=np.float32))
    return block


class _Replay:
    """Stands for the model in `silero_vad.get_speech_timestamps`: the probabilities computed beforehand, one a call."""

    def __init__(self, probs: torch.Tensor):
        self.probs, self.next = probs.tolist(), 0

    def reset_states(self) -> None:
        self.next = 0

    def __call__(self, chunk: torch.Tensor, sampling_rate: int) -> torch.Tensor:
        self.next += 1
        return torch.tensor(self.probs[self.next - 1])


def speech_regions(samples: np.ndarray, params: VadParameters = VadParameters()) -> list[tuple[int, int]]:
    """The speech in 16 kHz mono `samples` as [start, end) sample ranges, in order and disjoint, each at most
    `params.max_speech_duration_s` long: the package's own rules on `speech_probabilities`."""
    probs = speech_probabilities(samples)
    found = _package().get_speech_timestamps(torch.from_numpy(np.ascontiguousarray(samples)), _Replay(probs),
                                             sampling_rate=SAMPLE_RATE, **params.to_dict())
    limit = int(params.max_speech_duration_s * SAMPLE_RATE)
    regions = []
    for r in found:               # the package bounds a region before padding it; keep the bound after
        start, end = int(r["start"]), int(r["end"])
        regions += [(a, min(a + limit, end)) for a in range(start, end, limit)]
    return regions
